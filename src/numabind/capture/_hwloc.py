"""Load an hwloc XML capture (``lstopo --of xml``) into the same :class:`Machine` model.

There is no sysfs in such a file: a PCI device's locality is its nearest non-I/O ancestor
(a Package or Group) and that object's ``cpuset``/``nodeset``; the process restriction at
capture time is the root object's ``allowed_cpuset``/``allowed_nodeset``.  Bitmaps use
the kernel mask format (32-bit hex words, most significant first).

The file is input, and the parser refuses rather than expands:

* only UTF-8 (or ASCII) documents are read: a UTF-16/32 byte-order mark or another
  declared encoding is one line, and expat is told the encoding, so no Python codec
  (``utf-7``, ``rot13``, ``idna``...) ever runs on the input;
* hwloc's own ``<!DOCTYPE topology SYSTEM "hwloc2.dtd">`` is accepted (never fetched),
  but an internal DTD subset, an entity or notation declaration and an external entity
  reference are refused by the parser's own callbacks, not by matching bytes;
* at most :data:`MAX_ELEMENTS` elements, nested at most :data:`MAX_DEPTH` deep, and
  attributes and texts of bounded length; each object's ``cpuset`` is parsed once, and a
  CPU's package, core and cache are handed down the tree as it is walked, so a chain of
  63 nested objects costs each PU one step, not 63 mask parses.

A malformed attribute (``os_index="abc"``, ``cpuset="0xzz"``, a 5000-digit mask) is one
:class:`HwlocError` naming the object and the value, never a traceback.  Not on the
startup path.
"""

from __future__ import annotations

from .. import _sysfs
from .._errors import CaptureError
from .._model import (
    HWLOC_KINDS,
    HWLOC_UUID_KEYS,
    Accelerator,
    Allowed,
    CoreKinds,
    CpuInfo,
    Nic,
    NicPort,
    Node,
    OtherDevice,
    classify,
    unhandled,
)
from .._sources import Source
from .._sysfs import normalize_pci, pci_sort_key

XML_CAP = 64 << 20
MAX_DEPTH = 64
MAX_ELEMENTS = 1 << 20  # hwloc's largest test topology has ~40,000
ATTR_CAP = 1 << 16  # characters of one attribute value (a 16,384-CPU mask is ~5,600)
TEXT_CAP = 1 << 20  # characters of text kept per element (a 1,024-node distance matrix)
_IO_TYPES = {"Bridge", "PCIDev", "OSDev", "Misc"}
_TEXT_TAGS = {"indexes", "u64values"}
_ENCODINGS = {"utf-8", "utf8", "us-ascii", "ascii"}


# hwloc's NUMANode subtypes (memattrs.c, hwloc_memory_tier_kinds) -> numabind's node kinds
_SUBTYPE_KINDS = {"GPUMEMORY": "gpu", "HBM": "hbm", "MCDRAM": "hbm", "NVM": "far"}
# the Package CPUVendor info hwloc writes -> numabind's vendor words (as the sysfs reader's)
_CPU_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "hygon"}


class HwlocError(CaptureError):
    """The file is not an hwloc topology numabind can read."""


class _El:
    """One element, as much of it as numabind reads."""

    __slots__ = ("attrs", "children", "tag", "text")

    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag = tag
        self.attrs = attrs
        self.children: list[_El] = []
        self.text: list[str] = []

    def get(self, name: str, default: str | None = None) -> str | None:
        return self.attrs.get(name, default)

    def findall(self, tag: str) -> list[_El]:
        return [c for c in self.children if c.tag == tag]


def _check_encoding(data: bytes, where: str) -> bytes:
    """The document without a UTF-8 byte-order mark; refuses anything but UTF-8/ASCII."""
    for bom, name in (
        (b"\x00\x00\xfe\xff", "UTF-32"),
        (b"\xff\xfe\x00\x00", "UTF-32"),
        (b"\xfe\xff", "UTF-16"),
        (b"\xff\xfe", "UTF-16"),
    ):
        if data.startswith(bom):
            raise HwlocError(f"{where}: encoded as {name}; hwloc writes UTF-8, not read")
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    if b"\x00" in data[:64]:
        raise HwlocError(f"{where}: not UTF-8 text (NUL bytes); hwloc writes UTF-8, not read")
    if data.startswith(b"<?xml"):
        end = data.find(b"?>", 0, 512)
        decl = data[: end if end > 0 else 512].decode("ascii", "replace")
        _, found, rest = decl.partition("encoding")
        if found:
            value = rest.lstrip(" \t\r\n").removeprefix("=").lstrip(" \t\r\n")
            quote = value[:1]
            if quote in ("'", '"'):
                text = value[1:].split(quote, 1)[0]
            else:
                text = (value.split(None, 1) or [""])[0]
            if text.strip().lower() not in _ENCODINGS:
                raise HwlocError(
                    f"{where}: declares encoding {_sysfs.short(text)}; hwloc writes UTF-8, not read"
                )
    return data


class _Builder:
    """The expat callbacks: build :class:`_El` elements within the caps, and refuse what
    hwloc never writes (see the module docstring)."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.root: list[_El] = []
        self.stack: list[_El] = []
        self.count = 0

    def refuse(self, what: str) -> HwlocError:
        return HwlocError(f"{self.where}: {what}; hwloc exports never do, not read")

    def doctype(self, name: str, system: str | None, public: str | None, internal: int) -> None:
        if internal:
            raise self.refuse("declares an internal DTD subset")

    def entity(self, *_: object) -> None:
        raise self.refuse("declares XML entities")

    def notation(self, *_: object) -> None:
        raise self.refuse("declares XML notations")

    def external(self, *_: object) -> int:
        raise self.refuse("references an external entity")

    def skipped(self, name: str, is_parameter: int) -> None:
        # an entity the document uses but never declares (its DTD is external): expat
        # would skip it silently; hwloc never writes one
        raise self.refuse(f"references the undeclared entity {_sysfs.short(name)}")

    def start(self, tag: str, attrs: dict[str, str]) -> None:
        self.count += 1
        if self.count > MAX_ELEMENTS:
            raise HwlocError(f"{self.where}: more than {MAX_ELEMENTS} elements; not read")
        if len(self.stack) >= MAX_DEPTH:
            raise HwlocError(f"{self.where}: objects nested deeper than {MAX_DEPTH}; not read")
        for value in attrs.values():
            if len(value) > ATTR_CAP:
                raise HwlocError(f"{self.where}: an attribute of {len(value)} characters; not read")
        el = _El(tag, attrs)
        (self.stack[-1].children if self.stack else self.root).append(el)
        self.stack.append(el)

    def end(self, tag: str) -> None:
        self.stack.pop()

    def chars(self, text: str) -> None:
        if self.stack and self.stack[-1].tag in _TEXT_TAGS:
            kept = self.stack[-1].text
            if sum(map(len, kept)) + len(text) > TEXT_CAP:
                raise HwlocError(
                    f"{self.where}: a text of more than {TEXT_CAP} characters; not read"
                )
            kept.append(text)


def parse(data: bytes, where: str) -> _El:
    """Parse an hwloc XML document into :class:`_El` elements, refusing (one
    :class:`HwlocError`) whatever hwloc itself never writes; see the module docstring."""
    from xml.parsers import expat

    data = _check_encoding(data, where)
    b = _Builder(where)
    parser = expat.ParserCreate(encoding="UTF-8")
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = b.doctype
    parser.EntityDeclHandler = b.entity
    parser.UnparsedEntityDeclHandler = b.entity
    parser.NotationDeclHandler = b.notation
    parser.ExternalEntityRefHandler = b.external
    parser.SkippedEntityHandler = b.skipped
    parser.StartElementHandler = b.start
    parser.EndElementHandler = b.end
    parser.CharacterDataHandler = b.chars
    try:
        parser.Parse(data, True)
    except HwlocError:
        raise
    except expat.ExpatError as err:
        raise HwlocError(f"{where}: not well-formed XML ({err})") from None
    except Exception as err:  # nothing a document holds may end in a traceback
        raise HwlocError(f"{where}: not readable XML ({type(err).__name__}: {err})") from None
    if not b.root:
        raise HwlocError(f"{where}: no elements: not an hwloc XML export")
    return b.root[0]


def _index(obj: _El, attr: str, path: str, limit: int) -> int:
    raw = obj.get(attr)
    if raw is None:
        raise HwlocError(f"{path}: a {obj.get('type', '?')} object has no {attr}")
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 7 or int(raw) >= limit:
        raise HwlocError(
            f"{path}: {obj.get('type', '?')} {attr}={_sysfs.short(raw)} is not an index "
            f"below {limit}"
        )
    return int(raw)


class _Context:
    """What an object hands down to the objects inside it: package, core siblings and the
    highest cache level with its CPUs, each computed once where the object is met."""

    __slots__ = ("cache", "level", "package", "siblings")

    def __init__(
        self,
        package: int | None = None,
        siblings: frozenset[int] | None = None,
        level: int = -1,
        cache: frozenset[int] | None = None,
    ) -> None:
        self.package = package
        self.siblings = siblings
        self.level = level
        self.cache = cache


def _bridge_path(ancestors: list[_El]) -> tuple[str, ...]:
    """The bridges above a PCI device, host bridge first: a host bridge is named by the
    buses it spans (it has no PCI address), a PCI bridge by its address."""
    out = []
    for a in ancestors:
        if a.get("type") == "Bridge":
            busid = normalize_pci(a.get("pci_busid") or "")
            out.append(busid or f"host {a.get('bridge_pci') or a.get('gp_index') or '?'}")
    return tuple(out)


def _cache_level(kind: str) -> int | None:
    digits = kind[1:-5]
    if kind.startswith("L") and kind.endswith("Cache") and digits.isascii() and digits.isdigit():
        return int(digits) if len(digits) < 3 else None  # "L²Cache" passes isdigit()
    return None


class HwlocSource(Source):
    def __init__(self, data: bytes, description: str) -> None:
        super().__init__()
        self.description = description
        self._path = description
        self._masks: dict[tuple[str, int], frozenset[int]] = {}
        root = parse(data, description)
        self._v3 = (root.get("version") or "").startswith("3")
        machine = next(iter(root.findall("object")), None)
        if root.tag != "topology" or machine is None:
            raise HwlocError(f"{description}: no <topology><object> root: not an hwloc XML export")
        self._online = self._mask(machine, "cpuset") or frozenset()
        self._allowed_cpus = self._mask(machine, "allowed_cpuset")
        self._allowed_mems = self._mask(machine, "allowed_nodeset", _sysfs.MAX_NODES)
        self._nodes: dict[int, tuple[frozenset[int], int | None]] = {}
        self._cpu: dict[int, CpuInfo] = {}
        self._accs: list[Accelerator] = []
        self._nics: list[Nic] = []
        self._ethernet: list[Nic] = []
        self._others: list[OtherDevice] = []
        self._paths: dict[str, tuple[str, ...]] = {}
        self._gpu_mem: dict[str, int] = {}
        self._kinds: dict[int, tuple[str, str]] = {}
        self._vendor: str | None = None
        self._walk(machine, [], _Context())
        self._shared_cpusets()
        self._distances = self._read_distances(root)
        self._cpu_kinds = self._read_kinds(root)  # CPU -> its kind's rank
        # hwloc 2 records NVLink bandwidths (its NVML backend) as a heterogeneous matrix;
        # show --matrix says it carries them rather than read them
        self.nvlink = any(
            d.get("name") == "NVLinkBandwidth" for d in root.findall("distances2hetero")
        )

    def _mask(
        self, obj: _El | None, attr: str, limit: int = _sysfs.MAX_CPUS
    ) -> frozenset[int] | None:
        """An object's bitmap attribute, parsed once per distinct text (hwloc repeats the
        same masks on every level of a branch)."""
        if obj is None:
            return None
        text = obj.get(attr)
        if text is None:
            return None
        key = (text, limit)
        found = self._masks.get(key)
        if found is None:
            try:
                found = _sysfs.parse_cpumask(
                    text, limit, "node" if limit == _sysfs.MAX_NODES else "CPU"
                )
            except ValueError as err:
                raise HwlocError(f"{self._path}: {obj.get('type', '?')} {attr}: {err}") from err
            self._masks[key] = found
        return found

    def _walk(self, obj: _El, ancestors: list[_El], ctx: _Context) -> None:
        kind = obj.get("type", "") or ""
        if kind == "Package":
            raw = obj.get("os_index", "") or ""
            pkg = int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 7 else None
            ctx = _Context(pkg, ctx.siblings, ctx.level, ctx.cache)
            if self._vendor is None:
                for info in obj.findall("info"):
                    if info.get("name") == "CPUVendor":
                        self._vendor = _CPU_VENDORS.get(info.get("value") or "")
        elif kind == "Core":
            ctx = _Context(
                ctx.package, self._mask(obj, "cpuset") or frozenset(), ctx.level, ctx.cache
            )
        else:
            level = _cache_level(kind)
            if level is not None and level > ctx.level:
                mask = self._mask(obj, "cpuset") or frozenset()
                ctx = _Context(ctx.package, ctx.siblings, level, mask)
        if kind == "NUMANode":
            self._add_node(obj)
        elif kind == "PU":
            cpu = _index(obj, "os_index", self._path, _sysfs.MAX_CPUS)
            self._cpu[cpu] = CpuInfo(
                cpu=cpu,
                package=ctx.package,
                siblings=(ctx.siblings or frozenset()) | {cpu},
                cache=ctx.cache | {cpu} if ctx.cache is not None else None,
            )
        elif kind == "PCIDev":
            self._add_pci(obj, ancestors)
        children = obj.findall("object")
        if children:
            ancestors.append(obj)
            for child in children:
                self._walk(child, ancestors, ctx)
            ancestors.pop()

    def _add_node(self, obj: _El) -> None:
        os_index = _index(obj, "os_index", self._path, _sysfs.MAX_NODES)
        cpus = self._mask(obj, "cpuset") or frozenset()
        mem_raw = obj.get("local_memory")
        mem = _sysfs.parse_int(mem_raw) if mem_raw else None
        infos = {i.get("name"): i.get("value") for i in obj.findall("info")}
        bus = infos.get("PCIBusID")
        subtype = obj.get("subtype") or ""
        if subtype == "GPUMemory" or bus:
            cpus = frozenset()
            norm = normalize_pci(bus) if bus else None
            if norm:
                self._gpu_mem[norm] = os_index
        # hwloc's memory kinds (hwloc 2.10+ NUMANode subtypes, memattrs.c): what the
        # export says a CPU-less node is; DRAM and SPM say nothing numabind acts on
        kind = _SUBTYPE_KINDS.get(subtype.upper()) or (
            "far" if subtype.upper().startswith("CXL-") else None
        )
        if "CXLDevice" in infos and kind is None:
            kind = "far"
        how = f"hwloc subtype {_sysfs.clean_line(subtype, 32)}" if kind and subtype else ""
        if kind and not how:
            how = "hwloc CXLDevice"
        if kind is not None and subtype.upper() != "GPUMEMORY":
            # hwloc gives a memory-only node (HBM, CXL, NVM) the CPUs of the object it is
            # attached to, its locality: those CPUs are the DRAM node's
            cpus = frozenset()
        self._nodes[os_index] = (cpus, mem if mem is not None and mem >= 0 else None)
        if kind is not None:
            self._kinds[os_index] = (kind, how)

    def _shared_cpusets(self) -> None:
        """Nodes an export gives the same CPUs (memory attached to one object, its kind not
        named): the lowest-numbered keeps them, the others are read as memory-only, said
        once each (two nodes owning the same CPUs would make every plan ambiguous)."""
        owner: dict[frozenset[int], int] = {}
        for os_index in sorted(self._nodes):
            cpus, mem = self._nodes[os_index]
            if not cpus:
                continue
            first = owner.setdefault(cpus, os_index)
            if first != os_index:
                self._nodes[os_index] = (frozenset(), mem)
                self.warn(
                    f"{self._path}: NUMA node {os_index} has the same CPUs as node {first} "
                    "and no memory kind: read as memory-only"
                )

    def _add_pci(self, obj: _El, ancestors: list[_El]) -> None:
        busid = normalize_pci(obj.get("pci_busid", "") or "")
        ptype = (obj.get("pci_type", "") or "").split()
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
        if len(self._accs) >= _sysfs.MAX_ACCELERATORS:
            self.warn(
                f"{self._path}: more than {_sysfs.MAX_ACCELERATORS} accelerators; the rest ignored"
            )
            return
        infos: dict[str, str] = {}
        rdma = None
        rdma_infos: dict[str, str] = {}
        ifaces: list[str] = []
        for osdev in obj.findall("object"):
            if osdev.get("type") == "OSDev":
                kind = self._osdev_kind(osdev.get("osdev_type") or "")
                if (
                    kind == "openfabrics" or osdev.get("subtype") == "OpenFabrics"
                ) and rdma is None:
                    rdma = osdev.get("name")
                    rdma_infos = {
                        i.get("name", "") or "": i.get("value", "") or ""
                        for i in osdev.findall("info")[:64]
                    }
                elif kind == "network" and len(ifaces) < 8:  # the function's interfaces
                    ifaces.append(osdev.get("name") or "")
                for info in osdev.findall("info"):
                    infos.setdefault(info.get("name", "") or "", info.get("value", "") or "")
        self._paths[busid] = _bridge_path(ancestors)
        locality = next((a for a in reversed(ancestors) if a.get("type") not in _IO_TYPES), None)
        cpus = self._mask(locality, "cpuset") if locality is not None else None
        nodes = self._mask(locality, "nodeset", _sysfs.MAX_NODES) if locality is not None else None
        numa = next(iter(nodes)) if nodes is not None and len(nodes) == 1 else None
        if cls >> 16 == 0x02 and len(self._nics) < _sysfs.MAX_ACCELERATORS:
            if rdma is not None:
                self._add_rdma(busid, rdma, rdma_infos, ifaces, numa, cpus)
            elif ifaces:
                self._add_ethernet(busid, ifaces, numa)
        vendor = classify(vendor_id, device_id, cls)
        if vendor is None:
            if unhandled(vendor_id, cls) and len(self._others) < _sysfs.MAX_ACCELERATORS:
                self._others.append(
                    OtherDevice(
                        pci=busid,
                        vendor_id=vendor_id,
                        device_id=device_id,
                        pci_class=cls,
                        numa_node=numa,
                    )
                )
            return
        uuid = next((infos[k] for k in HWLOC_UUID_KEYS if infos.get(k)), None)
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

    def _osdev_kind(self, raw: str) -> str | None:
        """``openfabrics`` or ``network`` for an OS device's ``osdev_type``: an enum in
        hwloc 2 exports (3, 2), bit flags in hwloc 3 ones (1 << 5, 1 << 4)."""
        if not (raw.isascii() and raw.isdigit() and len(raw) < 8):
            return None
        value = int(raw)
        if self._v3:
            return "openfabrics" if value & 32 else "network" if value & 16 else None
        return {3: "openfabrics", 2: "network"}.get(value)

    def _add_rdma(
        self,
        busid: str,
        raw: str,
        infos: dict[str, str],
        ifaces: list[str],
        numa: int | None,
        cpus: frozenset[int] | None,
    ) -> None:
        """An OpenFabrics OS device: hwloc records each port's state (``Port1State``: the
        number of the kernel's enum) but neither rate nor link layer."""
        from .._rdma import clean_name, port_state

        name = clean_name(raw)
        if name is None:
            self.warn(
                f"{self._path}: RDMA device {_sysfs.short(raw)!r} is not a name numabind "
                "writes; ignored"
            )
            return
        ports = []
        for key in sorted(infos):
            number = key[4:-5]
            if (
                key.startswith("Port")
                and key.endswith("State")
                and number.isascii()
                and number.isdigit()
                and len(number) < 3
            ):
                ports.append(NicPort(number=int(number), state=port_state(infos[key])))
        netdevs = tuple(n for n in (clean_name(i, 15) for i in ifaces) if n)
        self._nics.append(
            Nic(
                pci=busid,
                name=name,
                numa_node=numa,
                local_cpus=cpus,
                ports=tuple(sorted(ports, key=lambda p: p.number)[:8]),
                netdevs=netdevs,
            )
        )

    def _add_ethernet(self, busid: str, ifaces: list[str], numa: int | None) -> None:
        from .._rdma import clean_name

        for raw in ifaces:
            name = clean_name(raw, 15)
            if name is not None and len(self._ethernet) < _sysfs.MAX_ACCELERATORS:
                self._ethernet.append(
                    Nic(pci=busid, name=name, numa_node=numa, kind="netdev", netdevs=(name,))
                )

    def _read_distances(self, root: _El) -> dict[int, tuple[tuple[int, int], ...]]:
        """The NUMA distance matrix (hwloc 2: ``distances2``, its indexes and values split
        over several elements of ten values each), latencies preferred."""
        found = [d for d in root.findall("distances2") if d.get("type") == "NUMANode"]
        found.sort(key=lambda d: "Latency" not in (d.get("name") or ""))
        out: dict[int, tuple[tuple[int, int], ...]] = {}
        for dist in found:
            idx_text = " ".join("".join(e.text) for e in dist.findall("indexes"))
            val_text = " ".join("".join(e.text) for e in dist.findall("u64values"))
            ids = [_sysfs.parse_int(x) for x in idx_text.split()[: _sysfs.MAX_NODES + 1]]
            vals = [_sysfs.parse_int(x) for x in val_text.split()[: len(ids) ** 2 + 1]]
            if (
                not ids
                or len(ids) > _sysfs.MAX_NODES
                or None in ids
                or None in vals
                or len(vals) != len(ids) * len(ids)
            ):
                self.warn(f"{self._path}: NUMA distance matrix malformed; ignored")
                continue
            for i, a in enumerate(ids):
                assert a is not None
                row = vals[i * len(ids) : (i + 1) * len(ids)]
                out[a] = tuple((b, v) for b, v in zip(ids, row) if b is not None and v is not None)
            break
        return out

    def _read_kinds(self, root: _El) -> dict[int, int]:
        """CPU -> rank of its ``<cpukind>`` (hwloc 2.4+): the kind's
        ``forced_efficiency`` where every kind has one, else its place in the file (hwloc
        writes kinds from the most energy-efficient to the most powerful).  A higher value
        is a faster core, as in :data:`numabind._model.KIND_FILES`."""
        kinds = root.findall("cpukind")[:256]
        found: list[tuple[int | None, frozenset[int]]] = []
        for kind in kinds:
            cpus = self._mask(kind, "cpuset") or frozenset()
            raw = kind.get("forced_efficiency")
            eff = _sysfs.parse_int(raw) if raw is not None else None
            found.append((eff if eff is not None and 0 <= eff < 1 << 31 else None, cpus))
        use_eff = bool(found) and all(e is not None for e, _ in found)
        out: dict[int, int] = {}
        for i, (eff, cpus) in enumerate(found):
            for c in cpus & self._online:
                out.setdefault(c, eff if use_eff and eff is not None else i)
        return out

    # Source interface
    def core_kinds(self, online: frozenset[int]) -> CoreKinds:
        from .._sources import kinds_from

        values = {c: v for c, v in self._cpu_kinds.items() if c in online}
        if len(set(values.values())) > 1:
            return kinds_from(values, HWLOC_KINDS, (HWLOC_KINDS,))
        looked = (HWLOC_KINDS,) if values else ()
        return CoreKinds(levels=((0, online),) if online else (), looked=looked)

    def online_cpus(self) -> frozenset[int]:
        return self._online

    def node_ids(self) -> tuple[int, ...]:
        return tuple(sorted(self._nodes))

    def node(
        self, node_id: int, online: frozenset[int], all_ids: tuple[int, ...], full: bool = True
    ) -> Node:
        cpus, mem = self._nodes[node_id]
        kind, how = self._kinds.get(node_id, (None, ""))
        return Node(
            id=node_id,
            cpus=cpus & online,
            memory_bytes=mem,
            distances=self._distances.get(node_id, ()),
            kind=kind,
            kind_how=how,
        )

    def cpu_vendor(self) -> str | None:
        return self._vendor

    def cpu_info(self, cpu: int) -> CpuInfo:
        return self._cpu.get(cpu) or CpuInfo(
            cpu=cpu, package=None, siblings=frozenset({cpu}), cache=None
        )

    def allowed(self, online: frozenset[int]) -> Allowed:
        cpus = self._allowed_cpus if self._allowed_cpus is not None else online
        return Allowed(cpus=cpus & online, mems=self._allowed_mems, kind="hwloc")

    def pci_path(self, bdf: str) -> tuple[str, ...] | None:
        return self._paths.get(bdf)

    def nics(self) -> tuple[Nic, ...]:
        return tuple(sorted(self._nics, key=lambda n: pci_sort_key(n.pci)))

    def ethernet(self, taken: frozenset[str], bonded: frozenset[str]) -> tuple[Nic, ...]:
        return tuple(
            sorted(
                (n for n in self._ethernet if n.pci not in taken and n.name not in bonded),
                key=lambda n: pci_sort_key(n.pci),
            )
        )

    def others(self) -> tuple[OtherDevice, ...]:
        return tuple(sorted(self._others, key=lambda d: pci_sort_key(d.pci)))

    def accelerators(self, detail: bool = False) -> tuple[Accelerator, ...]:
        out = []
        for acc in self._accs:
            mem = self._gpu_mem.get(acc.pci)
            out.append(acc.replace(memory_node=mem) if mem is not None else acc)
        return tuple(sorted(out, key=lambda a: pci_sort_key(a.pci)))


def load(path: str) -> HwlocSource:
    """The source of an hwloc XML export, compressed or not (raises :class:`HwlocError`)."""
    from ._tarroot import read_file

    try:
        data = read_file(path, XML_CAP)
    except OSError as err:
        raise HwlocError(f"{path}: not readable ({err.strerror or err})") from err
    return HwlocSource(data, path)
