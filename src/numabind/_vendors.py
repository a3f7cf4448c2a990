"""Everything numabind knows about each accelerator vendor, in one table.

One :class:`Vendor` entry per vendor says how to recognise its compute devices on PCI,
which environment variables select its devices and in what grammar, where its driver
publishes a device's UUID and its GPU-memory NUMA node, and which optional runtime library
can answer what files cannot.  Every other module asks this table; adding a vendor is one
entry here plus its tests.
"""

from __future__ import annotations

from ._model import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal

    Grammar = Literal["cuda", "rocm", "level-zero"]


class Visibility(Record):
    """One variable that selects devices, and how its tokens read.

    Grammars: ``cuda`` (indices, ``GPU-<uuid>`` prefixes, ``MIG-<uuid>`` and the legacy
    ``MIG-GPU-<uuid>/<gi>/<ci>``); ``rocm`` (indices and ``GPU-<unique id>``); ``level-zero``
    (indices and ``<device>.<sub-device>``).  ``applies_after`` names the variable this one
    renumbers (HIP_VISIBLE_DEVICES selects among what ROCR_VISIBLE_DEVICES left)."""

    variable: str
    grammar: Grammar
    applies_after: str | None = None
    fallback_for: str | None = None  # read only when this other variable is unset


class Vendor(Record):
    """One vendor's entry (see the module docstring)."""

    key: str  # "nvidia", "amd", "intel": Accelerator.vendor
    label: str  # how a device is named in messages
    pci_vendor: int
    classes: frozenset[int]  # PCI class >> 8 of its compute devices
    vga_min_device: int | None  # VGA (0x0300) counts only from this device id up
    visibility: tuple[Visibility, ...]
    uuid_file: str | None  # sysfs attribute (under the PCI device) holding its UUID
    uuid_prefix: str  # written before that attribute's value to form the list token
    driver_dir: str | None  # the driver's per-GPU directory (reachable GPUs, UUIDs, memory node)
    runtime: str | None  # optional Python module that answers what files cannot
    hwloc_uuid_key: str | None = None  # the OS device info an hwloc XML export names it by

    def is_compute(self, device_id: int | None, pci_class: int | None) -> bool:
        """Whether a PCI function of this vendor is a compute device.

        A BMC's VGA chip is the trap: an ATI ES1000 (1002:515e) is AMD with a VGA class.
        Every AMD compute GPU since GCN has a device id of 0x6000 or above; the old
        Rage/Radeon display chips that BMCs carry are below it.
        """
        if pci_class is None:
            return False
        cls = pci_class >> 8
        if cls in self.classes:
            return True
        return (
            cls == 0x0300
            and self.vga_min_device is not None
            and (device_id or 0) >= (self.vga_min_device)
        )


NVIDIA = Vendor(
    key="nvidia",
    label="GPU",
    pci_vendor=0x10DE,
    # 0x0300 VGA, 0x0302 3D controller; NVSwitch (0x0680) is a bridge, not a GPU
    classes=frozenset({0x0300, 0x0302}),
    vga_min_device=None,
    visibility=(Visibility(variable="CUDA_VISIBLE_DEVICES", grammar="cuda"),),
    uuid_file=None,  # /proc/driver/nvidia/gpus/<bdf>/information has it
    uuid_prefix="",
    driver_dir="/proc/driver/nvidia/gpus",
    runtime="pynvml",
    hwloc_uuid_key="NVIDIAUUID",
)
AMD = Vendor(
    key="amd",
    label="AMD GPU",
    pci_vendor=0x1002,
    # MI300X reports 0x1200 (processing accelerator), MI100/MI200 0x0380, some 0x0302
    classes=frozenset({0x0302, 0x0380, 0x1200}),
    vga_min_device=0x6000,
    visibility=(
        Visibility(variable="ROCR_VISIBLE_DEVICES", grammar="rocm"),
        Visibility(
            variable="HIP_VISIBLE_DEVICES", grammar="rocm", applies_after="ROCR_VISIBLE_DEVICES"
        ),
        Visibility(
            variable="CUDA_VISIBLE_DEVICES",
            grammar="rocm",
            applies_after="ROCR_VISIBLE_DEVICES",
            fallback_for="HIP_VISIBLE_DEVICES",
        ),
    ),
    # amdgpu's unique_id is the hex id ROCm prints as "GPU-<id>" (rocminfo, rocm-smi)
    uuid_file="unique_id",
    uuid_prefix="GPU-",
    driver_dir=None,
    runtime=None,
    hwloc_uuid_key="AMDUUID",
)
INTEL = Vendor(
    key="intel",
    label="Intel GPU",
    pci_vendor=0x8086,
    # data-center GPUs (Ponte Vecchio, Flex) are 0x0380/0x0302; integrated 0x0300 is not
    classes=frozenset({0x0302, 0x0380, 0x1200}),
    vga_min_device=None,
    visibility=(Visibility(variable="ZE_AFFINITY_MASK", grammar="level-zero"),),
    uuid_file=None,
    uuid_prefix="",
    driver_dir=None,
    runtime=None,
)

VENDORS: tuple[Vendor, ...] = (NVIDIA, AMD, INTEL)  # also the order tried with no variable
BY_KEY = {v.key: v for v in VENDORS}
BY_PCI = {v.pci_vendor: v for v in VENDORS}
HWLOC_UUID_KEYS: tuple[str, ...] = tuple(v.hwloc_uuid_key for v in VENDORS if v.hwloc_uuid_key)
VISIBILITY_VARIABLES: tuple[str, ...] = tuple(
    dict.fromkeys(vis.variable for v in VENDORS for vis in v.visibility)
)


def classify(vendor_id: int | None, device_id: int | None, pci_class: int | None) -> str | None:
    """The vendor key of a PCI function that is a compute accelerator, else None."""
    vendor = BY_PCI.get(vendor_id) if vendor_id is not None else None
    if vendor is None or not vendor.is_compute(device_id, pci_class):
        return None
    return vendor.key


def selecting(environ: dict[str, str] | object) -> Vendor | None:
    """The vendor whose visibility variables the environment sets (first in table order),
    or None.  ``CUDA_VISIBLE_DEVICES`` selects NVIDIA: on ROCm it is read only as HIP's
    fallback, once ROCm was chosen by ROCR/HIP variables."""
    for v in VENDORS:
        for vis in v.visibility:
            if vis.fallback_for is None and vis.variable in environ:  # type: ignore[operator]
                return v
    return None
