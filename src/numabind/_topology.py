"""The machine as numabind sees it: NUMA nodes, CPUs, what this process may use, and the
accelerators on PCI.

A :class:`Machine` is read from a root directory (``/`` for the live system, or a capture
of another machine laid out the same way), from files only: no subprocess, no NVML, no
CUDA.  Every property is read on first use and then kept, so the startup hook pays only
for what its rank's plan touches, and the values never change once seen.  hwloc XML
captures load into the same class through :mod:`numabind._hwloc`.
"""

from __future__ import annotations

from . import _sysfs
from ._model import Accelerator, Allowed, CpuInfo, Node

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_SYS_NODE = "/sys/devices/system/node"
_SYS_CPU = "/sys/devices/system/cpu"
_SYS_PCI = "/sys/bus/pci/devices"
_PROC_NVIDIA = "/proc/driver/nvidia/gpus"


# --- PCI classification -------------------------------------------------------------

VENDOR_NVIDIA = 0x10DE
VENDOR_AMD = 0x1002
VENDOR_INTEL = 0x8086
VENDORS = {VENDOR_NVIDIA: "nvidia", VENDOR_AMD: "amd", VENDOR_INTEL: "intel"}

# class >> 8: 0x0300 VGA, 0x0302 3D controller, 0x0380 other display, 0x1200 processing
# accelerator.  NVSwitch (0x0680) is a bridge, not a GPU.
_NVIDIA_CLASSES = frozenset({0x0300, 0x0302})
# MI300X reports 0x1200, MI100/MI200 0x0380, some Instinct/Radeon Pro 0x0302.
_AMD_CLASSES = frozenset({0x0302, 0x0380, 0x1200})
# Intel data-center GPUs (Ponte Vecchio, Flex) are 0x0380/0x0302; integrated 0x0300 is not.
_INTEL_CLASSES = frozenset({0x0302, 0x0380, 0x1200})


def classify(vendor_id: int | None, device_id: int | None, pci_class: int | None) -> str | None:
    """Return the accelerator family of a PCI function, or None when it is not a compute GPU.

    A BMC's VGA chip is the trap here: an ATI ES1000 (1002:515e) is AMD with a VGA class.
    Every AMD compute GPU since GCN has a device id of 0x6000 or above; the old Rage/Radeon
    display chips that BMCs carry are below, so AMD VGA functions count only above it.
    """
    if vendor_id is None or pci_class is None:
        return None
    cls = pci_class >> 8
    if vendor_id == VENDOR_NVIDIA:
        return "nvidia" if cls in _NVIDIA_CLASSES else None
    if vendor_id == VENDOR_AMD:
        if cls in _AMD_CLASSES or (cls == 0x0300 and (device_id or 0) >= 0x6000):
            return "amd"
        return None
    if vendor_id == VENDOR_INTEL:
        return "intel" if cls in _INTEL_CLASSES else None
    return None


def normalize_pci(bus_id: str) -> str | None:
    """Normalize a PCI address to sysfs form (``0000:3b:00.0``).

    NVML and nvidia-smi write ``00000000:3B:00.0`` (8-digit domain, upper case); CUDA
    writes ``0000:3B:00.0``.  Returns None when the text is not a PCI address.
    """
    text = bus_id.strip().lower()
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


# --- sources ----------------------------------------------------------------------------


class Source:
    """Where a :class:`Machine` gets its facts.  Every method reads one thing."""

    description = "?"

    def online_cpus(self) -> frozenset[int]:
        raise NotImplementedError

    def node_ids(self) -> tuple[int, ...]:
        raise NotImplementedError

    def node(self, node_id: int, online: frozenset[int], all_ids: tuple[int, ...]) -> Node:
        raise NotImplementedError

    def cpu_info(self, cpu: int) -> CpuInfo:
        return CpuInfo(cpu, self.cpu_package(cpu), self.cpu_siblings(cpu), self.cpu_cache(cpu))

    # One fact at a time, so a mode reads only what it uses (exclusive: siblings; socket:
    # packages; core-complex: cache domains).  Sources that know everything at once
    # override cpu_info and inherit these.
    def cpu_package(self, cpu: int) -> int | None:
        return self.cpu_info(cpu).package

    def cpu_siblings(self, cpu: int) -> frozenset[int]:
        return self.cpu_info(cpu).siblings

    def cpu_cache(self, cpu: int) -> frozenset[int] | None:
        return self.cpu_info(cpu).cache

    def allowed(self, online: frozenset[int]) -> Allowed:
        raise NotImplementedError

    def accelerators(self) -> tuple[Accelerator, ...]:
        raise NotImplementedError

    def accelerator(self, bdf: str) -> Accelerator | None:
        for acc in self.accelerators():
            if acc.pci == bdf:
                return acc
        return None

    def nvidia_driver_gpus(self) -> tuple[str, ...] | None:
        return None

    def kernel_release(self) -> str | None:
        return None


class SysfsSource(Source):
    """Reads a live system (root ``/``) or a capture of one (hwloc-gather-topology layout)."""

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self.description = "live system" if root in ("", "/") else root
        self._pci_cache: dict[str, Accelerator | None] = {}
        self._nvidia_info: dict[str, dict[str, str]] = {}
        self._driver_gpus: tuple[str, ...] | bool | None = False

    def _p(self, path: str) -> str:
        return _sysfs.join(self.root, path)

    def _read(self, path: str) -> str | None:
        return _sysfs.read_opt(self._p(path))

    # CPUs and nodes
    def online_cpus(self) -> frozenset[int]:
        for name in ("online", "present"):
            text = self._read(f"{_SYS_CPU}/{name}")
            if text:
                try:
                    return _sysfs.parse_cpulist(text)
                except ValueError:
                    continue
        cpus = {int(n[3:]) for n in _sysfs.listdir(self._p(_SYS_CPU)) if n[3:].isdigit()}
        return frozenset(cpus)

    def node_ids(self) -> tuple[int, ...]:
        ids = [
            int(n[4:])
            for n in _sysfs.listdir(self._p(_SYS_NODE))
            if n.startswith("node") and n[4:].isdigit()
        ]
        return tuple(sorted(ids))

    def node(self, node_id: int, online: frozenset[int], all_ids: tuple[int, ...]) -> Node:
        base = f"{_SYS_NODE}/node{node_id}"
        cpus: frozenset[int] = frozenset()
        text = self._read(f"{base}/cpulist")
        try:
            if text is not None:
                cpus = _sysfs.parse_cpulist(text)
            else:
                cpus = _sysfs.parse_cpumask(self._read(f"{base}/cpumap") or "")
        except ValueError:
            cpus = frozenset()
        memory = None
        meminfo = self._read(f"{base}/meminfo")
        if meminfo:
            for line in meminfo.splitlines():
                if "MemTotal:" in line:
                    fields = line.split()
                    try:
                        memory = int(fields[-2]) * 1024
                    except (ValueError, IndexError):
                        memory = None
                    break
        distances: tuple[tuple[int, int], ...] = ()
        dist = self._read(f"{base}/distance")
        if dist:
            values = dist.split()
            if len(values) == len(all_ids):
                try:
                    distances = tuple(zip(all_ids, (int(v) for v in values)))
                except ValueError:
                    distances = ()
        return Node(node_id, cpus & online, memory, distances)

    def cpu_package(self, cpu: int) -> int | None:
        return _sysfs.parse_int(self._read(f"{_SYS_CPU}/cpu{cpu}/topology/physical_package_id"))

    def cpu_siblings(self, cpu: int) -> frozenset[int]:
        # core_cpus_list is the current name; thread_siblings_list is the deprecated one.
        for name in ("core_cpus_list", "thread_siblings_list"):
            text = self._read(f"{_SYS_CPU}/cpu{cpu}/topology/{name}")
            if text:
                try:
                    return _sysfs.parse_cpulist(text) | {cpu}
                except ValueError:
                    continue
        return frozenset({cpu})

    def cpu_cache(self, cpu: int) -> frozenset[int] | None:
        """The largest cache domain the CPU shares (the highest-level data/unified cache)."""
        base = f"{_SYS_CPU}/cpu{cpu}/cache"
        cache: frozenset[int] | None = None
        best = -1
        for index in _sysfs.listdir(self._p(base)):
            if not index.startswith("index"):
                continue
            level = _sysfs.parse_int(self._read(f"{base}/{index}/level"))
            kind = self._read(f"{base}/{index}/type") or ""
            if level is None or kind == "Instruction" or level <= best:
                continue
            shared = self._read(f"{base}/{index}/shared_cpu_list")
            if shared is None:
                continue
            try:
                cache = _sysfs.parse_cpulist(shared) | {cpu}
            except ValueError:
                continue
            best = level
        return cache

    # what this process may use
    def allowed(self, online: frozenset[int]) -> Allowed:
        found = self._cgroup_cpuset()
        if found is not None:
            cpus, cg_mems, source = found
            return Allowed(cpus & online if online else cpus, cg_mems, source)
        # No cgroup cpuset readable (none mounted in this mount namespace, or a kernel
        # without cgroups).  Cpus_allowed_list is only the *current affinity*, which a
        # launcher or parent may have narrowed: planning inside it is the bug this library
        # exists to fix (a rank pinned by its agent would stay pinned).  So the plan
        # assumes every online CPU; the kernel still intersects any mask we set with the
        # real cpuset, and apply reports a mask it narrowed.  Mems_allowed_list is the
        # cpuset's own memory nodes (no parent narrows it), so it is used as it is.
        status = self._read("/proc/self/status") or ""
        mems: frozenset[int] | None = None
        current = ""
        for line in status.splitlines():
            if line.startswith("Mems_allowed_list:"):
                try:
                    mems = _sysfs.parse_cpulist(line.split(":", 1)[1])
                except ValueError:
                    mems = None
            elif line.startswith("Cpus_allowed_list:"):
                current = line.split(":", 1)[1].strip()
        note = f"; current affinity {current} not used to narrow the plan" if current else ""
        return Allowed(online, mems, f"all online CPUs (no cgroup cpuset readable{note})")

    def _cgroup_cpuset(self) -> tuple[frozenset[int], frozenset[int] | None, str] | None:
        mounts = self._read("/proc/self/mounts") or self._read("/proc/mounts") or ""
        v1_mount = v2_mount = None
        v1_noprefix = False
        for line in mounts.splitlines():
            fields = line.split()
            if len(fields) < 4:
                continue
            point, fstype, opts = fields[1], fields[2], fields[3].split(",")
            if fstype == "cgroup2" and v2_mount is None:
                v2_mount = point
            elif (fstype == "cgroup" and "cpuset" in opts) or fstype == "cpuset":
                v1_mount = point
                v1_noprefix = "noprefix" in opts or fstype == "cpuset"
        v1_path = v2_path = None
        cgroup = self._read("/proc/self/cgroup")
        if cgroup:
            for line in cgroup.splitlines():
                hier, _, rest = line.partition(":")
                controllers, _, path = rest.partition(":")
                if hier == "0" and controllers == "":
                    v2_path = path
                elif "cpuset" in controllers.split(","):
                    v1_path = path
        else:
            # Old kernels (and some captures) only have /proc/self/cpuset.
            v1_path = v2_path = self._read("/proc/self/cpuset")
        if v1_mount is not None and v1_path is not None:
            names = (
                ("effective_cpus", "cpus", "effective_mems", "mems")
                if v1_noprefix
                else (
                    "cpuset.effective_cpus",
                    "cpuset.cpus",
                    "cpuset.effective_mems",
                    "cpuset.mems",
                )
            )
            got = self._read_cpuset_dir(v1_mount, v1_path, names)
            if got is not None:
                return got[0], got[1], f"cgroup v1 cpuset {got[2]}"
        if v2_mount is not None and v2_path is not None:
            names = ("cpuset.cpus.effective", "", "cpuset.mems.effective", "")
            got = self._read_cpuset_dir(v2_mount, v2_path, names)
            if got is not None:
                return got[0], got[1], f"cgroup v2 {got[2]}"
        return None

    def _read_cpuset_dir(
        self, mount: str, path: str, names: tuple[str, str, str, str]
    ) -> tuple[frozenset[int], frozenset[int] | None, str] | None:
        # Walk up: in cgroup v2 a cgroup without the cpuset controller enabled has no
        # cpuset files and inherits its parent's; in a cgroup namespace the path from
        # /proc/self/cgroup may not exist under the mount, whose root is then ours.
        path = "/" + path.strip("/")
        candidates: list[str] = []
        while True:
            candidates.append(path)
            if path == "/":
                break
            path = path.rsplit("/", 1)[0] or "/"
        for cand in candidates:
            d = mount.rstrip("/") + (cand if cand != "/" else "")
            cpus_text = self._read(f"{d}/{names[0]}")
            if cpus_text is None and names[1]:
                cpus_text = self._read(f"{d}/{names[1]}")
            if cpus_text is None or not cpus_text:
                continue
            mems_text = self._read(f"{d}/{names[2]}")
            if mems_text is None and names[3]:
                mems_text = self._read(f"{d}/{names[3]}")
            try:
                cpus = _sysfs.parse_cpulist(cpus_text)
                mems = _sysfs.parse_cpulist(mems_text) if mems_text else None
            except ValueError:
                continue
            return cpus, mems, d
        return None

    # accelerators
    def accelerators(self) -> tuple[Accelerator, ...]:
        found: list[Accelerator] = []
        driver = set(self.nvidia_driver_gpus() or ())
        for bdf in _sysfs.listdir(self._p(_SYS_PCI)):
            acc = self.accelerator(bdf, force_nvidia=bdf in driver)
            if acc is not None:
                found.append(acc)
        found.sort(key=lambda a: pci_sort_key(a.pci))
        return tuple(found)

    def accelerator(self, bdf: str, force_nvidia: bool = False) -> Accelerator | None:
        if bdf in self._pci_cache:
            return self._pci_cache[bdf]
        base = f"{_SYS_PCI}/{bdf}"
        vendor_id = _sysfs.parse_int(self._read(f"{base}/vendor"))
        if (
            not force_nvidia
            and vendor_id not in VENDORS
            and bdf not in (self.nvidia_driver_gpus() or ())
        ):
            # one read decides for the hundreds of bridges, NICs and chipset functions
            self._pci_cache[bdf] = None
            return None
        pci_class = _sysfs.parse_int(self._read(f"{base}/class"))
        device_id = _sysfs.parse_int(self._read(f"{base}/device"))
        family = classify(vendor_id, device_id, pci_class)
        if force_nvidia or bdf in (self.nvidia_driver_gpus() or ()):
            family = "nvidia"  # the NVIDIA driver lists it: whatever sysfs claims
        if family is None:
            self._pci_cache[bdf] = None
            return None
        numa_node = _sysfs.parse_int(self._read(f"{base}/numa_node"))
        if numa_node is not None and numa_node < 0:
            numa_node = None
        local: frozenset[int] | None = None
        text = self._read(f"{base}/local_cpulist")
        try:
            if text is not None:
                local = _sysfs.parse_cpulist(text)
            else:
                mask = self._read(f"{base}/local_cpus")
                local = _sysfs.parse_cpumask(mask) if mask is not None else None
        except ValueError:
            local = None
        uuid = name = None
        minor = memory_node = None
        if family == "nvidia":
            info = self._nvidia_information(bdf)
            uuid = info.get("GPU UUID")
            name = info.get("Model")
            minor = _sysfs.parse_int(info.get("Device Minor"))
            status = self._read(f"{_PROC_NVIDIA}/{bdf}/numa_status")
            if status:
                for line in status.splitlines():
                    key, _, value = line.partition(":")
                    if key.strip() == "Node":
                        memory_node = _sysfs.parse_int(value)
                        if memory_node is not None and memory_node < 0:
                            memory_node = None
        acc = Accelerator(
            bdf,
            family,
            vendor_id,
            device_id,
            pci_class,
            numa_node,
            local,
            uuid,
            memory_node,
            name,
            minor,
        )
        self._pci_cache[bdf] = acc
        return acc

    def _nvidia_information(self, bdf: str) -> dict[str, str]:
        if bdf not in self._nvidia_info:
            out: dict[str, str] = {}
            text = self._read(f"{_PROC_NVIDIA}/{bdf}/information") or ""
            for line in text.splitlines():
                key, sep, value = line.partition(":")
                if sep:
                    out[key.strip()] = value.strip()
            self._nvidia_info[bdf] = out
        return self._nvidia_info[bdf]

    def nvidia_driver_gpus(self) -> tuple[str, ...] | None:
        if self._driver_gpus is False:
            entries = _sysfs.listdir(self._p(_PROC_NVIDIA))
            out = [n for n in (normalize_pci(e) for e in entries) if n is not None]
            self._driver_gpus = tuple(sorted(out, key=pci_sort_key)) if entries else None
        return self._driver_gpus  # type: ignore[return-value]

    def kernel_release(self) -> str | None:
        return self._read("/proc/sys/kernel/osrelease")


# --- the machine --------------------------------------------------------------------------


class Machine:
    """One machine's NUMA and accelerator layout, read lazily from a :class:`Source`.

    Values are computed on first access and kept: two reads of the same property always
    agree, which is what lets the planner treat a Machine as plain data.
    """

    def __init__(self, source: Source) -> None:
        self.source = source
        self._online: frozenset[int] | None = None
        self._node_ids: tuple[int, ...] | None = None
        self._nodes: dict[int, Node] = {}
        self._cpu: dict[int, CpuInfo] = {}
        self._package: dict[int, int | None] = {}
        self._siblings: dict[int, frozenset[int]] = {}
        self._cache: dict[int, frozenset[int] | None] = {}
        self._allowed: Allowed | None = None
        self._accelerators: tuple[Accelerator, ...] | None = None
        self._driver_gpus: tuple[str, ...] | bool | None = False
        self._kernel: str | bool | None = False

    @classmethod
    def from_root(cls, root: str = "/") -> Machine:
        return cls(SysfsSource(root))

    @property
    def description(self) -> str:
        return self.source.description

    @property
    def online_cpus(self) -> frozenset[int]:
        if self._online is None:
            self._online = self.source.online_cpus()
        return self._online

    @property
    def node_ids(self) -> tuple[int, ...]:
        if self._node_ids is None:
            self._node_ids = self.source.node_ids()
        return self._node_ids

    def node(self, node_id: int) -> Node | None:
        """One node, or None when the machine has no such node."""
        if node_id not in self._nodes:
            ids = self.node_ids
            if not ids and node_id == 0:
                # A kernel built without NUMA has no node directory: one node holds all.
                self._nodes[0] = Node(0, self.online_cpus)
            elif node_id not in ids:
                return None
            else:
                self._nodes[node_id] = self.source.node(node_id, self.online_cpus, ids)
        return self._nodes[node_id]

    @property
    def nodes(self) -> tuple[Node, ...]:
        ids = self.node_ids or (0,)
        return tuple(n for n in (self.node(i) for i in ids) if n is not None)

    @property
    def cpu_nodes(self) -> tuple[Node, ...]:
        """Nodes that have CPUs (memory-only nodes left out)."""
        return tuple(n for n in self.nodes if n.cpus)

    def node_of_cpu(self, cpu: int) -> int | None:
        for n in self.cpu_nodes:
            if cpu in n.cpus:
                return n.id
        return None

    def cpu_info(self, cpu: int) -> CpuInfo:
        if cpu not in self._cpu:
            self._cpu[cpu] = self.source.cpu_info(cpu)
        return self._cpu[cpu]

    def package_of(self, cpu: int) -> int | None:
        if cpu in self._cpu:
            return self._cpu[cpu].package
        found: int | None = self._fact(self._package, cpu, self.source.cpu_package)
        return found

    def siblings_of(self, cpu: int) -> frozenset[int]:
        if cpu in self._cpu:
            return self._cpu[cpu].siblings
        found: frozenset[int] = self._fact(self._siblings, cpu, self.source.cpu_siblings)
        return found

    def cache_of(self, cpu: int) -> frozenset[int] | None:
        if cpu in self._cpu:
            return self._cpu[cpu].cache
        found: frozenset[int] | None = self._fact(self._cache, cpu, self.source.cpu_cache)
        return found

    @staticmethod
    def _fact(store: dict[int, Any], cpu: int, read: Callable[[int], Any]) -> Any:
        if cpu not in store:
            store[cpu] = read(cpu)
        return store[cpu]

    @property
    def allowed(self) -> Allowed:
        if self._allowed is None:
            self._allowed = self.source.allowed(self.online_cpus)
        return self._allowed

    @property
    def accelerators(self) -> tuple[Accelerator, ...]:
        """Every compute accelerator on the host's PCI bus, in PCI order (sysfs is not
        namespaced: a container sees the host's devices here, reachable or not)."""
        if self._accelerators is None:
            self._accelerators = self.source.accelerators()
        return self._accelerators

    def accelerator(self, bdf: str) -> Accelerator | None:
        if self._accelerators is not None:
            for acc in self._accelerators:
                if acc.pci == bdf:
                    return acc
            return None
        return self.source.accelerator(bdf)

    @property
    def nvidia_driver_gpus(self) -> tuple[str, ...] | None:
        """BDFs under /proc/driver/nvidia/gpus (only the GPUs mounted into this container),
        or None when the driver's directory is absent."""
        if self._driver_gpus is False:
            self._driver_gpus = self.source.nvidia_driver_gpus()
        return self._driver_gpus  # type: ignore[return-value]

    @property
    def kernel_release(self) -> str | None:
        if self._kernel is False:
            self._kernel = self.source.kernel_release()
        return self._kernel  # type: ignore[return-value]

    def kernel_at_least(self, major: int, minor: int) -> bool | None:
        release = self.kernel_release
        if not release:
            return None
        head = release.split("-", 1)[0].split(".")
        try:
            return (int(head[0]), int(head[1])) >= (major, minor)
        except (ValueError, IndexError):
            return None
