"""A recorded NVML for the tests: replays answers a real NVML gave.

The answers come from hwloc's NVML OS devices (hwloc's NVML backend wrote them while
capturing a real DGX-2: ``nvmlN`` with its PCI address and UUID) or from a recording made
by ``scripts/device-check`` on a real GPU (tests/data/nvml-*.json).  numabind's NVML path
runs against this through the same :class:`numabind._nvml.NvmlBackend` interface as the
real ``pynvml`` one.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

from numabind._nvml import NvmlBackend
from numabind._sysfs import normalize_pci


class RecordedNvml(NvmlBackend):
    """An NVML that replays recorded answers."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._gpus = [dict(g, pci=normalize_pci(str(g["pci"])) or g["pci"]) for g in data["gpus"]]
        self._mig = {k.lower(): v for k, v in dict(data.get("mig", {})).items()}

    def gpus(self) -> list[dict[str, Any]]:
        return [dict(g) for g in self._gpus]

    def mig_parent_pci(self, mig_uuid: str) -> str | None:
        parent = self._mig.get(mig_uuid.lower())
        return normalize_pci(parent) if parent else None


def nvml_osdevs(path: str) -> list[tuple[str, str, str | None]]:
    """The NVML OS devices hwloc recorded: (``nvmlN``, PCI address, UUID), in file order."""
    out: list[tuple[str, str, str | None]] = []
    for pci in ET.parse(path).getroot().iter("object"):
        if pci.get("type") != "PCIDev":
            continue
        for osdev in pci.findall("object"):
            name = osdev.get("name", "")
            if osdev.get("type") == "OSDev" and name.startswith("nvml"):
                uuid = next(
                    (
                        i.get("value")
                        for i in osdev.findall("info")
                        if i.get("name") == "NVIDIAUUID"
                    ),
                    None,
                )
                out.append((name, normalize_pci(pci.get("pci_busid", "")) or "", uuid))
    return out


def recorded_from_hwloc_osdevs(osdevs: Sequence[tuple[str, str, str | None]]) -> RecordedNvml:
    """A replaying NVML from hwloc's NVML OS devices."""
    gpus = [
        {"index": int(name[4:]), "pci": pci, "uuid": uuid, "name": None, "numa_node": None}
        for name, pci, uuid in sorted(osdevs, key=lambda t: int(t[0][4:]))
    ]
    return RecordedNvml({"gpus": gpus})
