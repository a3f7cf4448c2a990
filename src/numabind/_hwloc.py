"""Load an hwloc XML capture (``lstopo --of xml``) into the same :class:`Machine` model.

There is no sysfs in such a file: a PCI device's locality is its nearest non-I/O ancestor
(a Package or Group) and that object's ``cpuset``/``nodeset``; the process restriction at
capture time is the root object's ``allowed_cpuset``/``allowed_nodeset``.  Bitmaps use
the kernel mask format (32-bit hex words, most significant first).  Not on the startup
path, so ElementTree is fine here.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from ._model import Accelerator, Allowed, CpuInfo, Node
from ._sysfs import parse_cpumask
from ._topology import Machine, Source, classify, normalize_pci, pci_sort_key

_IO_TYPES = {"Bridge", "PCIDev", "OSDev", "Misc"}


class HwlocError(ValueError):
    """The file is not an hwloc topology numabind can read."""


def _mask(obj: ET.Element, attr: str) -> frozenset[int] | None:
    text = obj.get(attr)
    if text is None:
        return None
    return parse_cpumask(text.replace("0x", ""))


class HwlocSource(Source):
    def __init__(self, path: str) -> None:
        self.description = path
        try:
            tree = ET.parse(path)
        except (ET.ParseError, OSError) as err:
            raise HwlocError(f"{path}: not a readable hwloc XML file ({err})") from err
        root = tree.getroot()
        machine = root.find("object")
        if root.tag != "topology" or machine is None:
            raise HwlocError(f"{path}: no <topology><object> root: not an hwloc XML export")
        self._machine = machine
        self._online = _mask(machine, "cpuset") or frozenset()
        self._allowed_cpus = _mask(machine, "allowed_cpuset")
        self._allowed_mems = _mask(machine, "allowed_nodeset")
        self._nodes: dict[int, tuple[frozenset[int], int | None]] = {}
        self._cpu: dict[int, CpuInfo] = {}
        self._accs: list[Accelerator] = []
        self._gpu_mem: dict[str, int] = {}
        self._walk(machine, [])
        self._distances = self._read_distances(root)

    def _walk(self, obj: ET.Element, ancestors: list[ET.Element]) -> None:
        kind = obj.get("type", "")
        chain = [*ancestors, obj]
        if kind == "NUMANode":
            os_index = int(obj.get("os_index", "-1"))
            cpus = _mask(obj, "cpuset") or frozenset()
            mem = obj.get("local_memory")
            infos = {i.get("name"): i.get("value") for i in obj.findall("info")}
            bus = infos.get("PCIBusID")
            if obj.get("subtype") == "GPUMemory" or bus:
                cpus = frozenset()
                if bus:
                    norm = normalize_pci(bus)
                    if norm:
                        self._gpu_mem[norm] = os_index
            self._nodes[os_index] = (cpus, int(mem) if mem else None)
        elif kind == "PU":
            self._add_pu(obj, chain)
        elif kind == "PCIDev":
            self._add_pci(obj, ancestors)
        for child in obj.findall("object"):
            self._walk(child, chain)

    def _add_pu(self, pu: ET.Element, chain: list[ET.Element]) -> None:
        cpu = int(pu.get("os_index", "-1"))
        package = None
        siblings = frozenset({cpu})
        cache: frozenset[int] | None = None
        best = -1
        for anc in chain:
            t = anc.get("type", "")
            if t == "Package":
                package = int(anc.get("os_index", "-1"))
            elif t == "Core":
                siblings = (_mask(anc, "cpuset") or frozenset()) | {cpu}
            elif t.startswith("L") and t.endswith("Cache") and t[1:-5].isdigit():
                level = int(t[1:-5])
                if level > best:
                    best, cache = level, (_mask(anc, "cpuset") or frozenset()) | {cpu}
        self._cpu[cpu] = CpuInfo(cpu, package, siblings, cache)

    def _add_pci(self, obj: ET.Element, ancestors: list[ET.Element]) -> None:
        busid = normalize_pci(obj.get("pci_busid", ""))
        ptype = obj.get("pci_type", "").split()
        if busid is None or len(ptype) < 2:
            return
        try:
            cls = int(ptype[0], 16) << 8
            vendor_id, device_id = (int(x, 16) for x in ptype[1].strip("[]").split(":"))
        except ValueError:
            return
        infos: dict[str, str] = {}
        for osdev in obj.findall("object"):
            if osdev.get("type") == "OSDev":
                for info in osdev.findall("info"):
                    infos.setdefault(info.get("name", ""), info.get("value", ""))
        family = classify(vendor_id, device_id, cls)
        if family is None:
            return
        locality = next((a for a in reversed(ancestors) if a.get("type") not in _IO_TYPES), None)
        cpus = _mask(locality, "cpuset") if locality is not None else None
        nodes = _mask(locality, "nodeset") if locality is not None else None
        numa = next(iter(nodes)) if nodes is not None and len(nodes) == 1 else None
        self._accs.append(
            Accelerator(
                busid,
                family,
                vendor_id,
                device_id,
                cls,
                numa,
                cpus,
                infos.get("NVIDIAUUID"),
                None,
                infos.get("GPUModel"),
                None,
            )
        )

    def _read_distances(self, root: ET.Element) -> dict[int, tuple[tuple[int, int], ...]]:
        out: dict[int, tuple[tuple[int, int], ...]] = {}
        for dist in root.iter("distances2"):
            if dist.get("type") != "NUMANode":
                continue
            idx_el = dist.find("indexes")
            val_el = dist.find("u64values")
            if idx_el is None or val_el is None or not idx_el.text or not val_el.text:
                continue
            ids = [int(x) for x in idx_el.text.split()]
            vals = [int(x) for x in val_el.text.split()]
            if len(vals) != len(ids) * len(ids):
                continue
            for i, a in enumerate(ids):
                out[a] = tuple(zip(ids, vals[i * len(ids) : (i + 1) * len(ids)]))
            break
        return out

    # Source interface
    def online_cpus(self) -> frozenset[int]:
        return self._online

    def node_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._nodes))

    def node(self, node_id: int, online: frozenset[int], all_ids: tuple[int, ...]) -> Node:
        cpus, mem = self._nodes[node_id]
        return Node(node_id, cpus & online, mem, self._distances.get(node_id, ()))

    def cpu_info(self, cpu: int) -> CpuInfo:
        return self._cpu.get(cpu) or CpuInfo(cpu, None, frozenset({cpu}), None)

    def allowed(self, online: frozenset[int]) -> Allowed:
        cpus = self._allowed_cpus if self._allowed_cpus is not None else online
        return Allowed(cpus & online, self._allowed_mems, "hwloc allowed_cpuset/allowed_nodeset")

    def accelerators(self) -> tuple[Accelerator, ...]:
        out = []
        for acc in self._accs:
            mem = self._gpu_mem.get(acc.pci)
            if mem is not None:
                acc = Accelerator(*[*acc._values()[:8], mem, *acc._values()[9:]])
            out.append(acc)
        return tuple(sorted(out, key=lambda a: pci_sort_key(a.pci)))


def load(path: str) -> Machine:
    """A :class:`Machine` from an hwloc XML export."""
    return Machine(HwlocSource(path))


def nvml_osdevs(path: str) -> list[tuple[str, str, str | None]]:
    """The NVML OS devices hwloc recorded: (``nvmlN``, PCI address, UUID), in file order.

    These are real NVML answers (hwloc's NVML backend wrote them), which is what the tests'
    recorded NVML replays."""
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
