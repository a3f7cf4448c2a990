"""PCI addresses: the one spelling numabind uses (sysfs's ``0000:3b:00.0``) and PCI order.

NVML and nvidia-smi write ``00000000:3B:00.0`` (8-digit domain, upper case), CUDA writes
``0000:3B:00.0``, hwloc ``0000:3b:00.0``; everything is normalised here before it is
compared, so a device is never missed over a spelling.
"""

from __future__ import annotations


def normalize_pci(bus_id: str) -> str | None:
    """Normalize a PCI address to sysfs form (``0000:3b:00.0``); None when the text is not
    a PCI address (or is absurdly long)."""
    text = bus_id.strip().lower()
    if len(text) > 32 or not text.isascii():
        return None
    parts = text.split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3 or "." not in parts[2]:
        return None
    dom, bus, devfn = parts
    dev, _, fn = devfn.partition(".")
    try:
        d, b, v, f = int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        return None
    if not (0 <= d <= 0xFFFFFFFF and 0 <= b <= 0xFF and 0 <= v <= 0x1F and 0 <= f <= 7):
        return None
    return f"{d:04x}:{b:02x}:{v:02x}.{f:x}"


def pci_sort_key(bdf: str) -> tuple[int, ...]:
    """Sort key in PCI bus order (what CUDA_DEVICE_ORDER=PCI_BUS_ID enumerates)."""
    out: list[int] = []
    for part in bdf.replace(".", ":").split(":"):
        try:
            out.append(int(part, 16))
        except ValueError:
            out.append(0)
    return tuple(out)
