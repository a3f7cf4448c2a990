"""Load an hwloc XML capture (``lstopo --of xml``) into the same :class:`Machine` model.

There is no sysfs in such a file: a PCI device's locality is its nearest non-I/O ancestor
(a Package or Group) and that object's ``cpuset``/``nodeset``; the process restriction at
capture time is the root object's ``allowed_cpuset``/``allowed_nodeset``.  Bitmaps use
the kernel mask format (32-bit hex words, most significant first).

The file is input: it is read with a size cap, refused if it declares entities (the
"billion laughs" expansion), and every attribute numabind uses is checked, so a malformed
one (``os_index="abc"``, ``cpuset="0xzz"``, a 5000-digit mask) is one :class:`HwlocError`
naming the object and the value, never a traceback.  Not on the startup path, so
ElementTree is fine here.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from . import _sysfs
from ._errors import CaptureError
from ._model import Accelerator, Allowed, CpuInfo, Node
from ._sources import Source
from ._sysfs import normalize_pci, pci_sort_key
from ._topology import Machine
from ._vendors import classify

XML_CAP = 64 << 20
_IO_TYPES = {"Bridge", "PCIDev", "OSDev", "Misc"}
_MAX_DEPTH = 64


class HwlocError(CaptureError):
    """The file is not an hwloc topology numabind can read."""


def _index(obj: ET.Element, attr: str, path: str, limit: int) -> int:
    raw = obj.get(attr)
    if raw is None:
        raise HwlocError(f"{path}: a {obj.get('type', '?')} object has no {attr}")
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 7 or int(raw) >= limit:
        raise HwlocError(
            f"{path}: {obj.get('type', '?')} {attr}={_sysfs.short(raw)} is not an index "
            f"below {limit}"
        )
    return int(raw)


class HwlocSource(Source):
    def __init__(self, path: str) -> None:
        super().__init__()
        self.description = path
        self._path = path
        try:
            data = _sysfs.read_bytes(path, XML_CAP)
        except OSError as err:
            raise HwlocError(f"{path}: not readable ({err.strerror or err})") from err
        if b"<!ENTITY" in data:
            raise HwlocError(f"{path}: declares XML entities; hwloc exports never do, not read")
        try:
            root = ET.fromstring(data)
        except ET.ParseError as err:
            raise HwlocError(f"{path}: not well-formed XML ({err})") from err
        machine = root.find("object")
        if root.tag != "topology" or machine is None:
            raise HwlocError(f"{path}: no <topology><object> root: not an hwloc XML export")
        self._online = self._mask(machine, "cpuset") or frozenset()
        self._allowed_cpus = self._mask(machine, "allowed_cpuset")
        self._allowed_mems = self._mask(machine, "allowed_nodeset", _sysfs.MAX_NODES)
        self._nodes: dict[int, tuple[frozenset[int], int | None]] = {}
        self._cpu: dict[int, CpuInfo] = {}
        self._accs: list[Accelerator] = []
        self._gpu_mem: dict[str, int] = {}
        self._walk(machine, [])
        self._distances = self._read_distances(root)

    def _mask(
        self, obj: ET.Element | None, attr: str, limit: int = _sysfs.MAX_CPUS
    ) -> frozenset[int] | None:
        if obj is None:
            return None
        text = obj.get(attr)
        if text is None:
            return None
        try:
            return _sysfs.parse_cpumask(text, limit, "node" if limit == _sysfs.MAX_NODES else "CPU")
        except ValueError as err:
            raise HwlocError(f"{self._path}: {obj.get('type', '?')} {attr}: {err}") from err

    def _walk(self, obj: ET.Element, ancestors: list[ET.Element]) -> None:
        if len(ancestors) > _MAX_DEPTH:
            raise HwlocError(f"{self._path}: objects nested deeper than {_MAX_DEPTH}")
        kind = obj.get("type", "")
        chain = [*ancestors, obj]
        if kind == "NUMANode":
            os_index = _index(obj, "os_index", self._path, _sysfs.MAX_NODES)
            cpus = self._mask(obj, "cpuset") or frozenset()
            mem_raw = obj.get("local_memory")
            mem = _sysfs.parse_int(mem_raw) if mem_raw else None
            infos = {i.get("name"): i.get("value") for i in obj.findall("info")}
            bus = infos.get("PCIBusID")
            if obj.get("subtype") == "GPUMemory" or bus:
                cpus = frozenset()
                if bus:
                    norm = normalize_pci(bus)
                    if norm:
                        self._gpu_mem[norm] = os_index
            self._nodes[os_index] = (cpus, mem if mem is not None and mem >= 0 else None)
        elif kind == "PU":
            self._add_pu(obj, chain)
        elif kind == "PCIDev":
            self._add_pci(obj, ancestors)
        for child in obj.findall("object"):
            self._walk(child, chain)

    def _add_pu(self, pu: ET.Element, chain: list[ET.Element]) -> None:
        cpu = _index(pu, "os_index", self._path, _sysfs.MAX_CPUS)
        package = None
        siblings = frozenset({cpu})
        cache: frozenset[int] | None = None
        best = -1
        for anc in chain:
            t = anc.get("type", "")
            if t == "Package":
                raw = anc.get("os_index", "")
                package = int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 7 else None
            elif t == "Core":
                siblings = (self._mask(anc, "cpuset") or frozenset()) | {cpu}
            elif (
                t.startswith("L")
                and t.endswith("Cache")
                and t[1:-5].isascii()  # "L²Cache" passes isdigit(), not int()
                and t[1:-5].isdigit()
            ):
                level = int(t[1:-5])
                if level > best:
                    best, cache = level, (self._mask(anc, "cpuset") or frozenset()) | {cpu}
        self._cpu[cpu] = CpuInfo(cpu=cpu, package=package, siblings=siblings, cache=cache)

    def _add_pci(self, obj: ET.Element, ancestors: list[ET.Element]) -> None:
        busid = normalize_pci(obj.get("pci_busid", ""))
        ptype = obj.get("pci_type", "").split()
        if busid is None or len(ptype) < 2:
            return
        try:
            cls = int(ptype[0], 16) << 8
            vendor_id, device_id = (int(x, 16) for x in ptype[1].strip("[]").split(":"))
        except ValueError:
            self.warn(
                f"{self._path}: PCI device {busid}: pci_type {_sysfs.short(ptype[1])} ignored"
            )
            return
        infos: dict[str, str] = {}
        for osdev in obj.findall("object"):
            if osdev.get("type") == "OSDev":
                for info in osdev.findall("info"):
                    infos.setdefault(info.get("name", ""), info.get("value", ""))
        vendor = classify(vendor_id, device_id, cls)
        if vendor is None:
            return
        locality = next((a for a in reversed(ancestors) if a.get("type") not in _IO_TYPES), None)
        cpus = self._mask(locality, "cpuset") if locality is not None else None
        nodes = self._mask(locality, "nodeset", _sysfs.MAX_NODES) if locality is not None else None
        numa = next(iter(nodes)) if nodes is not None and len(nodes) == 1 else None
        uuid = infos.get("NVIDIAUUID") or infos.get("AMDUUID")
        model = infos.get("GPUModel")
        self._accs.append(
            Accelerator(
                pci=busid,
                vendor=vendor,
                vendor_id=vendor_id,
                device_id=device_id,
                pci_class=cls,
                numa_node=numa,
                local_cpus=cpus,
                uuid=_sysfs.clean_line(uuid, 80) if uuid else None,
                name=_sysfs.clean_line(model, 80) if model else None,
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
            ids = [_sysfs.parse_int(x) for x in idx_el.text.split()[: _sysfs.MAX_NODES]]
            vals = [_sysfs.parse_int(x) for x in val_el.text.split()[: len(ids) ** 2 + 1]]
            if None in ids or None in vals or len(vals) != len(ids) * len(ids):
                self.warn(f"{self._path}: NUMA distance matrix malformed; ignored")
                continue
            for i, a in enumerate(ids):
                assert a is not None
                row = vals[i * len(ids) : (i + 1) * len(ids)]
                out[a] = tuple((b, v) for b, v in zip(ids, row) if b is not None and v is not None)
            break
        return out

    # Source interface
    def online_cpus(self) -> frozenset[int]:
        return self._online

    def node_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._nodes))

    def node(self, node_id: int, online: frozenset[int], all_ids: tuple[int, ...]) -> Node:
        cpus, mem = self._nodes[node_id]
        return Node(
            id=node_id,
            cpus=cpus & online,
            memory_bytes=mem,
            distances=self._distances.get(node_id, ()),
        )

    def cpu_info(self, cpu: int) -> CpuInfo:
        return self._cpu.get(cpu) or CpuInfo(
            cpu=cpu, package=None, siblings=frozenset({cpu}), cache=None
        )

    def allowed(self, online: frozenset[int]) -> Allowed:
        cpus = self._allowed_cpus if self._allowed_cpus is not None else online
        return Allowed(cpus=cpus & online, mems=self._allowed_mems, kind="hwloc")

    def accelerators(self) -> tuple[Accelerator, ...]:
        out = []
        for acc in self._accs:
            mem = self._gpu_mem.get(acc.pci)
            out.append(acc.replace(memory_node=mem) if mem is not None else acc)
        return tuple(sorted(out, key=lambda a: pci_sort_key(a.pci)))


def load(path: str) -> Machine:
    """A :class:`Machine` from an hwloc XML export (raises :class:`HwlocError`)."""
    return Machine(HwlocSource(path))
