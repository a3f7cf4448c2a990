"""Where a :class:`~numabind._topology.Machine` gets its facts: one method per fact, from
a file tree (:class:`Root`).

:class:`SysfsSource` reads a :class:`~numabind._roots.Root` laid out like ``/`` (the live
system, a directory capture, a tarball); :mod:`numabind.capture._hwloc` provides the same
interface for hwloc XML.  A malformed *optional* fact (a cache domain, a device's
locality) becomes "unknown" plus a line in :attr:`Source.warnings` that names the file
and the value; nothing here raises on bad input.

:func:`read_paths` lists every file this reader may open, as patterns; ``numabind
gather`` writes exactly those, so a capture holds what the reader reads, by construction.

A :class:`Root` answers "read ``/sys/...``" and "list ``/sys/...``" for one machine:
:class:`LiveRoot` is this one (its /sys and /proc are the kernel's own, read as they are,
still bounded); a capture's directory or tarball is read inside itself by
:mod:`numabind._roots` and :mod:`numabind.capture._tarroot`, which only ``show --input`` and
``NUMABIND_SYSROOT`` load.  Every root counts its work in a :class:`~numabind._sysfs.Budget`.

Which CPUs and memory nodes this process may use comes from its cgroup cpuset
(:func:`cpuset`: v2 ``cpuset.cpus.effective``, v1 ``cpuset.effective_cpus``), found through
``/proc/self/mounts`` and ``/proc/self/cgroup``.  ``Cpus_allowed_list`` is *not* this
answer: it is the current affinity, which a launcher or parent may have narrowed, and
planning inside it is the bug this library exists to fix.  Three outcomes are kept apart:
a cpuset read; no cpuset at all (every online CPU); and a cpuset that exists but cannot
be read, which plans on every online CPU *and says so* in ``Allowed.problem``.
"""

from __future__ import annotations

import os

from . import _sysfs
from ._model import (
    BY_KEY,
    BY_PCI,
    KIND_FILES,
    MAX_KIND_VALUE,
    NVIDIA,
    VENDORS,
    Accelerator,
    Allowed,
    CoreKinds,
    CpuInfo,
    KfdNode,
    Nic,
    Node,
    OtherDevice,
    Vendor,
    unhandled,
)
from ._sysfs import normalize_pci, pci_sort_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._dra import DraDevice

SYS_NODE = "/sys/devices/system/node"
SYS_CPU = "/sys/devices/system/cpu"
SYS_PCI = "/sys/bus/pci/devices"
SYS_INFINIBAND = "/sys/class/infiniband"
DRA_ROOT = "/var/run/kubernetes.io/dra-device-attributes"  # numabind._dra.ROOT
SYS_NET = "/sys/class/net"
# what numabind._rdma reads of an RDMA port and of a network interface (gather copies them)
RDMA_PORT_FILES = ("state", "rate", "link_layer", "gid_attrs/ndevs/0")
NETDEV_FILES = ("speed", "operstate", "bonding/slaves", "bonding_slave/state")
NUMA_BALANCING = "/proc/sys/kernel/numa_balancing"
# an active sched_ext scheduler: state says "enabled", root/ops its name (scx_cosmos)
SCHED_EXT_STATE = "/sys/kernel/sched_ext/state"
SCHED_EXT_OPS = "/sys/kernel/sched_ext/root/ops"
# the kernel's memory tiers (Linux 6.1+): memory_tierN/nodelist, a lower N is faster memory
SYS_TIERING = "/sys/devices/virtual/memory_tiering"
# the firmware's (ACPI HMAT) performance of a node from its best initiators, in MB/s
HMAT_BANDWIDTH = "access0/initiators/read_bandwidth"


# --- file trees --------------------------------------------------------------------------------


class Root:
    """One machine's file tree.  ``read`` raises ``OSError`` (``FileNotFoundError`` for an
    absent file, :class:`numabind._sysfs.ReadError` for one refused); ``opt`` returns None
    instead.  ``budget`` counts what reading it has cost (see :class:`_sysfs.Budget`)."""

    description = "?"
    live = False

    def __init__(self) -> None:
        self.budget = _sysfs.Budget(self.description)

    def read(self, path: str, cap: int = _sysfs.READ_CAP) -> str:
        raise NotImplementedError

    def opt(self, path: str, cap: int = _sysfs.READ_CAP) -> str | None:
        try:
            return self.read(path, cap)
        except OSError:
            return None

    def listdir(self, path: str, cap: int = _sysfs.LIST_CAP) -> list[str]:
        raise NotImplementedError

    def isdir(self, path: str) -> bool:
        raise NotImplementedError

    def realpath(self, path: str) -> str | None:
        """Where ``path`` leads, links followed (a PCI device's place in the PCI tree);
        None when it leads nowhere."""
        return None

    def close(self) -> None:
        """Release what the root holds (a tarball's bytes, a directory descriptor)."""


class LiveRoot(Root):
    """This machine.  Its /sys and /proc are the kernel's, so paths are used as they are;
    reads still refuse anything but a regular file and stop at a cap."""

    description = "live system"
    live = True

    def read(self, path: str, cap: int = _sysfs.READ_CAP) -> str:
        data = _sysfs.read_bytes(path, cap)
        self.budget.charge(files=1, nbytes=len(data))
        return data.decode("utf-8", "replace").strip()

    def opt(self, path: str, cap: int = _sysfs.READ_CAP) -> str | None:
        try:
            return self.read(path, cap)
        except OSError:
            return None

    def listdir(self, path: str, cap: int = _sysfs.LIST_CAP) -> list[str]:
        self.budget.charge(files=1)
        return _sysfs.listdir(path, cap)

    def isdir(self, path: str) -> bool:
        return os.path.isdir(path)

    def realpath(self, path: str) -> str | None:
        return os.path.realpath(path) if os.path.exists(path) else None


# --- the facts ---------------------------------------------------------------------------------


def read_paths() -> tuple[str, ...]:
    """Every file the reader opens, as patterns: ``{node}``, ``{cpu}``, ``{index}``,
    ``{bdf}``, ``{driver}``, ``{ibdev}``, ``{port}``, ``{fnetdev}`` (an RDMA device's PCI
    function's interfaces) and ``{netdev}`` are listed directories, ``{cgroup}`` is the
    cpuset directory found.  ``gather`` copies these."""
    return (
        f"{SYS_CPU}/online",
        f"{SYS_CPU}/present",
        f"{SYS_CPU}/possible",
        f"{SYS_NODE}/online",
        f"{SYS_NODE}/possible",
        f"{SYS_NODE}/has_cpu",
        f"{SYS_NODE}/{{node}}/cpulist",
        f"{SYS_NODE}/{{node}}/cpumap",
        f"{SYS_NODE}/{{node}}/meminfo",
        f"{SYS_NODE}/{{node}}/distance",
        f"{SYS_NODE}/{{node}}/{HMAT_BANDWIDTH}",
        f"{SYS_TIERING}/{{tier}}/nodelist",
        f"{SYS_CPU}/modalias",
        f"{SYS_CPU}/{{cpu}}/topology/physical_package_id",
        f"{SYS_CPU}/{{cpu}}/topology/core_cpus_list",
        f"{SYS_CPU}/{{cpu}}/topology/thread_siblings_list",
        f"{SYS_CPU}/{{cpu}}/cache/{{index}}/level",
        f"{SYS_CPU}/{{cpu}}/cache/{{index}}/type",
        f"{SYS_CPU}/{{cpu}}/cache/{{index}}/shared_cpu_list",
        *(f"{SYS_CPU}/{{cpu}}/{k.path}" for k in KIND_FILES),
        f"{SYS_CPU}/{{cpu}}/cache/{{index}}/shared_cpu_map",
        f"{SYS_PCI}/{{bdf}}/vendor",
        f"{SYS_PCI}/{{bdf}}/device",
        f"{SYS_PCI}/{{bdf}}/class",
        f"{SYS_PCI}/{{bdf}}/numa_node",
        f"{SYS_PCI}/{{bdf}}/local_cpulist",
        f"{SYS_PCI}/{{bdf}}/local_cpus",
        *(f"{SYS_INFINIBAND}/{{ibdev}}/ports/{{port}}/{name}" for name in RDMA_PORT_FILES),
        f"{SYS_INFINIBAND}/{{ibdev}}/device/net/{{fnetdev}}/operstate",
        *(f"{SYS_NET}/{{netdev}}/{name}" for name in NETDEV_FILES),
        *(f"{SYS_PCI}/{{bdf}}/{v.uuid_file}" for v in VENDORS if v.uuid_file),
        *(
            f"{v.driver_dir}/{{driver}}/{name}"
            for v in VENDORS
            if v.driver_dir
            for name in (v.driver_info_file, v.driver_numa_file)
            if name
        ),
        *(
            f"{v.partition_topology}/{{partition}}/properties"
            for v in VENDORS
            if v.partition_topology
        ),
        *(f"{SYS_PCI}/{{bdf}}/{name}" for v in VENDORS for name in (v.partition_files or ())),
        f"{DRA_ROOT}/{{kind}}/{{claim}}/{{request}}/{{driver}}-metadata.json",
        "/proc/self/cgroup",
        "/proc/self/cpuset",
        "/proc/self/mounts",
        "/proc/self/status",
        "/proc/sys/kernel/osrelease",
        NUMA_BALANCING,
        SCHED_EXT_STATE,
        SCHED_EXT_OPS,
        *(f"{{cgroup}}/{name}" for name in CPUSET_FILES),
    )


class Source:
    """Where a :class:`Machine` gets its facts.  Every method reads one thing."""

    description = "?"

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.budget = _sysfs.Budget(self.description)
        # the environment a capture recorded with its machine (numabind gather), if any
        self.environ: dict[str, str] | None = None
        # whether the files carry NVLink bandwidths (an hwloc export's NVLinkBandwidth)
        self.nvlink = False

    def warn(self, message: str) -> None:
        if message not in self.warnings and len(self.warnings) < 50:
            self.warnings.append(_sysfs.clean_line(message))

    def online_cpus(self) -> frozenset[int]:
        raise NotImplementedError

    def node_ids(self) -> tuple[int, ...]:
        raise NotImplementedError

    def node(
        self, node_id: int, online: frozenset[int], all_ids: tuple[int, ...], full: bool = True
    ) -> Node:
        """Node ``node_id``: its CPUs, and with ``full`` its memory and distances."""
        raise NotImplementedError

    def cpu_info(self, cpu: int) -> CpuInfo:
        return CpuInfo(
            cpu=cpu,
            package=self.cpu_package(cpu),
            siblings=self.cpu_siblings(cpu),
            cache=self.cpu_cache(cpu),
        )

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

    def core_kinds(self, online: frozenset[int]) -> CoreKinds:
        """How the CPUs differ in speed (:class:`~numabind._model.CoreKinds`); a source
        that cannot tell says one kind."""
        return CoreKinds(levels=((0, online),) if online else ())

    def accelerators(self, detail: bool = False) -> tuple[Accelerator, ...]:
        raise NotImplementedError

    def accelerator(self, bdf: str, detail: bool = False) -> Accelerator | None:
        for acc in self.accelerators(detail):
            if acc.pci == bdf:
                return acc
        return None

    def locate(self, acc: Accelerator) -> Accelerator:
        """``acc`` with where it is read (sources that read everything at once: itself)."""
        return acc

    def pci_path(self, bdf: str) -> tuple[str, ...] | None:
        """The bridges between the host bridge and the device ``bdf``, the host bridge
        first (None when the source does not know the PCI tree)."""
        return None

    def nics(self) -> tuple[Nic, ...]:
        """The RDMA-capable network adapters (``show --matrix``, the NIC choice)."""
        return ()

    def ethernet(self, taken: frozenset[str], bonded: frozenset[str]) -> tuple[Nic, ...]:
        """Network interfaces on PCI functions that carry no RDMA device (``taken``: the
        PCI addresses of those that do; ``bonded``: members of a bond an RDMA device
        carries): listed by ``show``, never chosen."""
        return ()

    def others(self) -> tuple[OtherDevice, ...]:
        """Compute-class PCI functions of vendors numabind does not handle."""
        return ()

    def driver_gpus(self, vendor: str) -> tuple[str, ...] | None:
        """PCI addresses the vendor's driver lists as this process's GPUs, or None when
        the driver publishes no such list (or it is absent)."""
        return None

    def dra_devices(self) -> tuple[DraDevice, ...]:
        """The devices the DRA device metadata (KEP-5304, :mod:`numabind._dra`) lists for
        this container; empty outside a pod that has it."""
        return ()

    def kernel_release(self) -> str | None:
        return None

    def numa_balancing(self) -> int | None:
        return None

    def sched_ext(self) -> str | None:
        """The active sched_ext scheduler's name (``scx_cosmos``; ``an unnamed scheduler`` where
        the name is not a plain word), None when none is active."""
        return None

    def cpu_vendor(self) -> str | None:
        """Who made the CPUs (``intel``, ``amd``, ...; None when the files do not say):
        what a sub-NUMA split is called (Intel SNC, AMD NPS) depends on it."""
        return None

    def partition_nodes(self, vendor: Vendor, expected: int) -> tuple[KfdNode, ...]:
        """The GPU agents of ``vendor``'s partition topology, in its order, when it lists
        more than ``expected`` entries (its GPUs and CPU nodes: then some GPU is split into
        compute partitions); () otherwise, having listed one directory."""
        return ()

    def partition_modes(self, vendor: Vendor, bdf: str) -> tuple[str | None, str | None]:
        """A GPU's compute and memory partition modes (AMD: ``CPX``, ``NPS4``), or None."""
        return None, None

    def close(self) -> None:
        pass


class SysfsSource(Source):
    """Reads a live system or a capture of one (hwloc-gather-topology layout)."""

    def __init__(self, root: Root) -> None:
        super().__init__()
        self.root = root
        self.description = root.description
        self._pci_cache: dict[tuple[str, bool], Accelerator | None] = {}
        self._located: dict[tuple[str, str], Accelerator] = {}
        self._driver_info: dict[str, dict[str, str]] = {}
        self._driver_gpus: dict[str, tuple[str, ...] | None] = {}
        self._cpu_limit: int | None = None
        self._node_limit: int | None = None
        self._tiers: dict[int, int] | None = None
        self._dra: dict[str, DraDevice] | None = None
        # identical lists (every CPU of a core, of an L3, every GPU of a node) are parsed
        # once: what a list costs is charged to the budget only the first time
        self._lists: dict[tuple[str, bool], frozenset[int]] = {}
        self.budget = root.budget

    def _read(self, path: str) -> str | None:
        return self.root.opt(path)

    def _limit(self, path: str, ceiling: int) -> int:
        # On the live system the kernel's own 'possible' mask bounds every number; in a
        # capture that mask is input too, so only the hard ceiling applies there.
        if not self.root.live:
            return ceiling
        text = self._read(path)
        try:
            possible = _sysfs.parse_cpulist(text or "", ceiling)
        except ValueError:
            return ceiling
        return max(possible) + 1 if possible else ceiling

    @property
    def cpu_limit(self) -> int:
        if self._cpu_limit is None:
            self._cpu_limit = self._limit(f"{SYS_CPU}/possible", _sysfs.MAX_CPUS)
        return self._cpu_limit

    @property
    def node_limit(self) -> int:
        if self._node_limit is None:
            self._node_limit = self._limit(f"{SYS_NODE}/possible", _sysfs.MAX_NODES)
        return self._node_limit

    def _parse(self, path: str, text: str, mask: bool) -> frozenset[int] | None:
        key = (text, mask)
        found = self._lists.get(key)
        if found is not None:
            return found
        try:
            parse = _sysfs.parse_cpumask if mask else _sysfs.parse_cpulist
            found = parse(text, self.cpu_limit)
        except ValueError as err:
            self.warn(f"{_sysfs.join(self.description, path)}: {err}; ignored")
            return None
        self.budget.charge(items=len(found) + 1)
        if len(self._lists) < 1 << 16:
            self._lists[key] = found
        return found

    def cpulist(self, path: str, text: str | None = None) -> frozenset[int] | None:
        """A CPU list file, bounded; a malformed one is a warning and None."""
        if text is None:
            text = self._read(path)
        if text is None:
            return None
        return self._parse(path, text, mask=False)

    def cpumask(self, path: str) -> frozenset[int] | None:
        text = self._read(path)
        if text is None:
            return None
        return self._parse(path, text, mask=True)

    # --- CPUs and nodes
    def online_cpus(self) -> frozenset[int]:
        for name in ("online", "present"):
            found = self.cpulist(f"{SYS_CPU}/{name}")
            if found:
                return found
        cpus: set[int] = set()
        for n in self.root.listdir(SYS_CPU):
            digits = n[3:]
            if n.startswith("cpu") and digits.isascii() and digits.isdigit() and len(n) < 9:
                cpus.add(int(digits))
        cpus = {c for c in cpus if c < self.cpu_limit}
        return frozenset(cpus)

    def node_ids(self) -> tuple[int, ...]:
        ids = []
        for n in self.root.listdir(SYS_NODE):
            digits = n[4:]
            if n.startswith("node") and digits.isascii() and digits.isdigit() and len(n) < 9:
                if int(digits) < self.node_limit:
                    ids.append(int(digits))
                else:
                    self.warn(
                        f"{self.description}: {SYS_NODE}/{n} is beyond the ceiling of "
                        f"{self.node_limit} nodes; ignored"
                    )
        return tuple(sorted(ids))

    def node(
        self, node_id: int, online: frozenset[int], all_ids: tuple[int, ...], full: bool = True
    ) -> Node:
        base = f"{SYS_NODE}/node{node_id}"
        cpus = self.cpulist(f"{base}/cpulist")
        if cpus is None:
            cpus = self.cpumask(f"{base}/cpumap") or frozenset()
        if not full:
            return Node(id=node_id, cpus=cpus & online)
        memory = None
        meminfo = self._read(f"{base}/meminfo")
        if meminfo:
            for line in meminfo.splitlines()[:64]:
                if "MemTotal:" in line:
                    fields = line.split()
                    value = _sysfs.parse_int(fields[-2]) if len(fields) >= 2 else None
                    memory = value * 1024 if value is not None and value >= 0 else None
                    break
        distances: tuple[tuple[int, int], ...] = ()
        dist = self._read(f"{base}/distance")
        if dist:
            values = [_sysfs.parse_int(v) for v in dist.split()[: len(all_ids) + 1]]
            if len(values) == len(all_ids) and all(v is not None and v >= 0 for v in values):
                distances = tuple(zip(all_ids, (v for v in values if v is not None)))
        bandwidth = _sysfs.parse_int(self._read(f"{base}/{HMAT_BANDWIDTH}"))
        return Node(
            id=node_id,
            cpus=cpus & online,
            memory_bytes=memory,
            distances=distances,
            tier=self.memory_tiers().get(node_id),
            read_bandwidth=bandwidth if bandwidth is not None and 0 < bandwidth < 1 << 40 else None,
        )

    def memory_tiers(self) -> dict[int, int]:
        """node -> the kernel's memory tier holding it (``memory_tierN/nodelist``), read once;
        empty where the kernel has no memory tiering (before 6.1) or the capture lacks it.
        A node listed by two tiers (a malformed capture) keeps the first, with a warning."""
        if self._tiers is None:
            tiers: dict[int, int] = {}
            for name in self.root.listdir(SYS_TIERING, _sysfs.MAX_NODES):
                digits = name.removeprefix("memory_tier")
                if digits == name or not (digits.isascii() and digits.isdigit()) or len(digits) > 6:
                    continue
                text = self._read(f"{SYS_TIERING}/{name}/nodelist")
                try:
                    nodes = _sysfs.parse_nodelist(text or "")
                except ValueError as err:
                    self.warn(f"{self.description}: {SYS_TIERING}/{name}/nodelist: {err}; ignored")
                    continue
                for n in sorted(nodes):
                    if n in tiers and tiers[n] != int(digits):
                        self.warn(
                            f"{self.description}: node {n} is in memory_tier{tiers[n]} and "
                            f"{name}; the first kept"
                        )
                        continue
                    tiers[n] = int(digits)
            self._tiers = tiers
        return self._tiers

    def cpu_package(self, cpu: int) -> int | None:
        value = _sysfs.parse_int(self._read(f"{SYS_CPU}/cpu{cpu}/topology/physical_package_id"))
        return value if value is not None and 0 <= value < 1 << 20 else None

    def cpu_siblings(self, cpu: int) -> frozenset[int]:
        # core_cpus_list is the current name; thread_siblings_list is the deprecated one.
        for name in ("core_cpus_list", "thread_siblings_list"):
            found = self.cpulist(f"{SYS_CPU}/cpu{cpu}/topology/{name}")
            if found:
                return found | {cpu}
        return frozenset({cpu})

    def cpu_cache(self, cpu: int) -> frozenset[int] | None:
        """The largest cache domain the CPU shares (the highest-level data/unified cache)."""
        base = f"{SYS_CPU}/cpu{cpu}/cache"
        cache: frozenset[int] | None = None
        best = -1
        names = [n for n in self.root.listdir(base, 256) if n.startswith("index")]
        for index in sorted(names, key=lambda n: (len(n), n))[: _sysfs.MAX_CACHE_INDEXES]:
            level = _sysfs.parse_int(self._read(f"{base}/{index}/level"))
            kind = self._read(f"{base}/{index}/type") or ""
            if level is None or kind == "Instruction" or level <= best:
                continue
            shared = self.cpulist(f"{base}/{index}/shared_cpu_list")
            if shared is None:  # older kernels and some captures have only the mask
                shared = self.cpumask(f"{base}/{index}/shared_cpu_map")
            if shared is None:
                continue
            cache, best = shared | {cpu}, level
        return cache

    # --- what this process may use
    def allowed(self, online: frozenset[int]) -> Allowed:
        # the pod's DRA allocation is read with its cpuset, before any plan copies the
        # machine's warnings: where it disagrees with sysfs is said in every plan
        self._dra_devices()
        return cpuset(self.root, online)

    # --- which cores are faster
    def core_kinds(self, online: frozenset[int]) -> CoreKinds:
        """The first of :data:`~numabind._model.KIND_FILES` whose values differ between
        the online CPUs, grouped by value.  A file the first CPU lacks is skipped without
        reading the others' (one open per absent file, not one per CPU); a file some CPUs
        lack or hold garbage in tells nothing (and says so).  Reading these costs one open
        per CPU and file (hwloc#756: ~1 s on a 2x EPYC 7742), so a rank gets them from the
        per-node cache (:mod:`numabind._cache`), never by itself."""
        cpus = sorted(online)
        looked: list[str] = []
        if not cpus:
            return CoreKinds()
        for kind in KIND_FILES:
            first = self._read(f"{SYS_CPU}/cpu{cpus[0]}/{kind.path}")
            if first is None:
                continue
            looked.append(kind.path)
            values: dict[int, int] = {}
            for c in cpus:
                text = first if c == cpus[0] else self._read(f"{SYS_CPU}/cpu{c}/{kind.path}")
                value = _sysfs.parse_int(text)
                if value is None or not 0 <= value < MAX_KIND_VALUE:
                    self.warn(
                        f"{_sysfs.join(self.description, f'{SYS_CPU}/cpu{c}/{kind.path}')}: "
                        f"{_sysfs.short(text or 'absent')} is not a number; "
                        f"{kind.path} not used to tell cores apart"
                    )
                    values = {}
                    break
                values[c] = value
            if len(set(values.values())) > 1:
                return kinds_from(values, kind.path, tuple(looked))
        return CoreKinds(levels=((0, online),), looked=tuple(looked))

    # --- the DRA device metadata of a Kubernetes pod
    def _dra_devices(self) -> dict[str, DraDevice]:
        if self._dra is None:
            from ._dra import read

            devices, problems = read(self.root)
            for line in problems:
                self.warn(line)
            self._dra = {d.pci: d for d in devices}
            for dev in devices:
                self._compare(dev)
        return self._dra

    def dra_devices(self) -> tuple[DraDevice, ...]:
        return tuple(self._dra_devices().values())

    def _compare(self, dev: DraDevice) -> None:
        """Say where the metadata and sysfs disagree, and where the metadata fills in."""
        base = f"{SYS_PCI}/{dev.pci}"
        said = f"the DRA device metadata ({dev.where}, {dev.driver})"
        if not self.root.isdir(base):
            where = f"node {dev.numa_node}" if dev.numa_node is not None else "node not given"
            self.warn(f"{dev.pci}: not in sysfs ({base} is absent or masked); {where} from {said}")
            return
        node = _sysfs.parse_int(self._read(f"{base}/numa_node"))
        if node is not None and not 0 <= node < self.node_limit:
            node = None
        if dev.numa_node is None or dev.numa_node == node:
            return
        if node is None:
            self.warn(
                f"{dev.pci}: sysfs numa_node is -1 (unknown); node {dev.numa_node} from {said}"
            )
        else:
            self.warn(
                f"{dev.pci}: {said} says NUMA node {dev.numa_node}, sysfs numa_node {node}: "
                "numabind follows sysfs (the kernel's own answer)"
            )

    # --- accelerators
    def accelerators(self, detail: bool = False) -> tuple[Accelerator, ...]:
        found: list[Accelerator] = []
        driver = set(self.driver_gpus("nvidia") or ())
        for bdf in self.root.listdir(SYS_PCI, _sysfs.PCI_LIST_CAP):
            if normalize_pci(bdf) != bdf:
                continue  # not a PCI address: nothing the kernel would write here
            acc = self._accelerator(bdf, bdf in driver, detail)
            if acc is not None:
                if len(found) >= _sysfs.MAX_ACCELERATORS:
                    self.warn(
                        f"{self.description}: more than {_sysfs.MAX_ACCELERATORS} accelerators;"
                        " the rest ignored"
                    )
                    break
                found.append(acc)
        have = {a.pci for a in found}
        for dev in self._dra_devices().values():  # sysfs masked: the pod's metadata lists it
            if dev.pci in have or dev.vendor is None or len(found) >= _sysfs.MAX_ACCELERATORS:
                continue
            if not self.root.isdir(f"{SYS_PCI}/{dev.pci}"):
                found.append(
                    Accelerator(
                        pci=dev.pci, vendor=dev.vendor, numa_node=dev.numa_node, read="located"
                    )
                )
        found.sort(key=lambda a: pci_sort_key(a.pci))
        return tuple(found)

    def accelerator(self, bdf: str, detail: bool = False) -> Accelerator | None:
        return self._accelerator(bdf, bdf in (self.driver_gpus("nvidia") or ()), detail)

    def _accelerator(self, bdf: str, driver_listed: bool, detail: bool) -> Accelerator | None:
        """One PCI function as an accelerator, or None; read in three steps, each only
        when asked for: its identity (vendor, device id; the class where the vendor's
        driver does not list it), then where it is (``numa_node``, and the CPU locality
        when ``numa_node`` does not say: :meth:`locate`), then everything (``detail``:
        the class, UUID, the driver's model name, minor number and memory node)."""
        if (bdf, True) in self._pci_cache:
            return self._pci_cache[(bdf, True)]
        acc = self._identity(bdf, driver_listed)
        if acc is None or not detail:
            return acc
        acc = self.locate(acc)
        base = f"{SYS_PCI}/{bdf}"
        vendor = BY_KEY[acc.vendor]
        local = acc.local_cpus
        if local is None:
            local = self.cpulist(f"{base}/local_cpulist")
        if local is None:
            local = self.cpumask(f"{base}/local_cpus")
        pci_class = acc.pci_class
        if pci_class is None:
            pci_class = _sysfs.parse_int(self._read(f"{base}/class"))
        full = self._driver_facts(
            acc.replace(pci_class=pci_class, local_cpus=local, read="all"), vendor, base, bdf
        )
        self._pci_cache[(bdf, True)] = full
        return full

    def _identity(self, bdf: str, driver_listed: bool) -> Accelerator | None:
        if (bdf, False) in self._pci_cache:
            return self._pci_cache[(bdf, False)]
        base = f"{SYS_PCI}/{bdf}"
        pci_class = None
        if driver_listed:
            vendor = NVIDIA  # the NVIDIA driver lists it: whatever sysfs claims
            vendor_id: int | None = NVIDIA.pci_vendor
        else:
            vendor_id = _sysfs.parse_int(self._read(f"{base}/vendor"))
            found_vendor = BY_PCI.get(vendor_id) if vendor_id is not None else None
            if found_vendor is None:
                # one read decides for the hundreds of bridges, NICs and chipset functions
                self._pci_cache[(bdf, False)] = None
                return None
            vendor = found_vendor
        device_id = _sysfs.parse_int(self._read(f"{base}/device"))
        if not driver_listed:
            pci_class = _sysfs.parse_int(self._read(f"{base}/class"))
            if not vendor.is_compute(device_id, pci_class):
                self._pci_cache[(bdf, False)] = None
                return None
        acc = Accelerator(
            pci=bdf,
            vendor=vendor.key,
            vendor_id=vendor_id,
            device_id=device_id,
            pci_class=pci_class,
            read="id",
        )
        self._pci_cache[(bdf, False)] = acc
        return acc

    def locate(self, acc: Accelerator) -> Accelerator:
        """``acc`` with ``numa_node`` read, and its CPU locality where ``numa_node`` does
        not name a node (-1)."""
        if acc.read != "id":
            return acc
        key = (acc.pci, "located")
        found = self._located.get(key)
        if found is not None:
            return found
        base = f"{SYS_PCI}/{acc.pci}"
        numa_node = _sysfs.parse_int(self._read(f"{base}/numa_node"))
        if numa_node is not None and not 0 <= numa_node < self.node_limit:
            numa_node = None  # -1: the firmware does not say
        if numa_node is None:  # a pod's DRA metadata may say (said in the warnings)
            dra = self._dra_devices().get(acc.pci)
            if dra is not None and dra.numa_node is not None and dra.numa_node < self.node_limit:
                numa_node = dra.numa_node
        local = None
        if numa_node is None:
            local = self.cpulist(f"{base}/local_cpulist")
            if local is None:
                local = self.cpumask(f"{base}/local_cpus")
        found = acc.replace(numa_node=numa_node, local_cpus=local, read="located")
        self._located[key] = found
        return found

    def _driver_facts(self, acc: Accelerator, vendor: Vendor, base: str, bdf: str) -> Accelerator:
        uuid = name = None
        minor = memory_node = None
        if vendor.uuid_file:
            uid = self._read(f"{base}/{vendor.uuid_file}")
            if uid and len(uid) <= 32 and all(c in "0123456789abcdefABCDEFx" for c in uid):
                uuid = vendor.uuid_prefix + uid.lower().removeprefix("0x")
        if vendor.driver_dir and vendor.driver_info_file:
            info = self._driver_information(vendor.key, bdf)
            keys = dict(vendor.driver_info_keys)
            uuid = info.get(keys.get("uuid", ""), "") or uuid
            name = info.get(keys.get("name", ""))
            minor = _sysfs.parse_int(info.get(keys.get("minor", "")))
        if vendor.driver_dir and vendor.driver_numa_file:
            status = self._read(f"{vendor.driver_dir}/{bdf}/{vendor.driver_numa_file}")
            for line in (status or "").splitlines()[:16]:
                key, _, value = line.partition(":")
                if key.strip() == vendor.driver_numa_key:
                    memory_node = _sysfs.parse_int(value)
                    if memory_node is not None and not 0 <= memory_node < self.node_limit:
                        memory_node = None
        return acc.replace(
            uuid=_sysfs.clean_line(uuid, 80) if uuid else None,
            memory_node=memory_node,
            name=_sysfs.clean_line(name, 80) if name else None,
            minor=minor,
        )

    def pci_path(self, bdf: str) -> tuple[str, ...] | None:
        real = self.root.realpath(f"{SYS_PCI}/{bdf}")
        if real is None:
            return None
        parts = real.strip("/").split("/")
        hosts = [i for i, p in enumerate(parts) if p.startswith("pci") and ":" in p]
        if not hosts or parts[-1] != bdf:
            return None
        return tuple(parts[hosts[0] : -1])

    def nics(self) -> tuple[Nic, ...]:
        """RDMA devices the kernel names (/sys/class/infiniband: :mod:`numabind._rdma`),
        else PCI functions of class InfiniBand or a Mellanox/NVIDIA network function."""
        from . import _rdma  # only a rank that asks for NICs (or show, check) loads it

        found = _rdma.read(self.root, self.node_limit, self.cpulist, self.warn)
        if found:
            return found
        named: dict[str, str] = {}
        for bdf in self.root.listdir(SYS_PCI, _sysfs.PCI_LIST_CAP):
            if normalize_pci(bdf) != bdf or len(named) >= _sysfs.MAX_ACCELERATORS:
                continue
            cls = _sysfs.parse_int(self._read(f"{SYS_PCI}/{bdf}/class")) or 0
            vendor = _sysfs.parse_int(self._read(f"{SYS_PCI}/{bdf}/vendor"))
            if cls >> 8 == 0x0207 or (cls >> 16 == 0x02 and vendor == 0x15B3):
                named[bdf] = ""
        out = []
        for bdf in sorted(named, key=pci_sort_key):
            node = _sysfs.parse_int(self._read(f"{SYS_PCI}/{bdf}/numa_node"))
            out.append(
                Nic(
                    pci=bdf,
                    numa_node=node if node is not None and 0 <= node < self.node_limit else None,
                    local_cpus=self.cpulist(f"{SYS_PCI}/{bdf}/local_cpulist"),
                    kind="pci",
                )
            )
        return tuple(out)

    def ethernet(self, taken: frozenset[str], bonded: frozenset[str]) -> tuple[Nic, ...]:
        from . import _rdma

        return _rdma.interfaces(self.root, taken | bonded, self.node_limit)

    def others(self) -> tuple[OtherDevice, ...]:
        out: list[OtherDevice] = []
        for bdf in self.root.listdir(SYS_PCI, _sysfs.PCI_LIST_CAP):
            if normalize_pci(bdf) != bdf or len(out) >= _sysfs.MAX_ACCELERATORS:
                continue
            vendor = _sysfs.parse_int(self._read(f"{SYS_PCI}/{bdf}/vendor"))
            if vendor is None or vendor in BY_PCI:
                continue  # one read decides for nearly every function
            cls = _sysfs.parse_int(self._read(f"{SYS_PCI}/{bdf}/class"))
            if vendor is not None and cls is not None and unhandled(vendor, cls):
                node = _sysfs.parse_int(self._read(f"{SYS_PCI}/{bdf}/numa_node"))
                out.append(
                    OtherDevice(
                        pci=bdf,
                        vendor_id=vendor,
                        device_id=_sysfs.parse_int(self._read(f"{SYS_PCI}/{bdf}/device")),
                        pci_class=cls,
                        numa_node=node if node is not None and node >= 0 else None,
                    )
                )
        return tuple(sorted(out, key=lambda d: pci_sort_key(d.pci)))

    def _driver_information(self, vendor: str, bdf: str) -> dict[str, str]:
        if bdf not in self._driver_info:
            from ._model import BY_KEY

            out: dict[str, str] = {}
            v = BY_KEY[vendor]
            text = self._read(f"{v.driver_dir}/{bdf}/{v.driver_info_file}") or ""
            for line in text.splitlines()[:64]:
                key, sep, value = line.partition(":")
                if sep:
                    out[key.strip()] = value.strip()
            self._driver_info[bdf] = out
        return self._driver_info[bdf]

    def driver_gpus(self, vendor: str) -> tuple[str, ...] | None:
        if vendor not in self._driver_gpus:
            from ._model import BY_KEY

            d = BY_KEY[vendor].driver_dir
            found: tuple[str, ...] | None = None
            if d is not None and self.root.isdir(d):
                entries = self.root.listdir(d, _sysfs.PCI_LIST_CAP)
                out = {n for n in (normalize_pci(e) for e in entries) if n is not None}
                if len(out) > _sysfs.MAX_ACCELERATORS:
                    self.warn(
                        f"{self.description}: {d} lists more than {_sysfs.MAX_ACCELERATORS} "
                        "GPUs; the rest ignored"
                    )
                    out = set(sorted(out, key=pci_sort_key)[: _sysfs.MAX_ACCELERATORS])
                found = tuple(sorted(out, key=pci_sort_key)) or None
            self._driver_gpus[vendor] = found
        return self._driver_gpus[vendor]

    def kernel_release(self) -> str | None:
        text = self._read("/proc/sys/kernel/osrelease")
        return _sysfs.clean_line(text, 100) if text else None

    def numa_balancing(self) -> int | None:
        value = _sysfs.parse_int(self._read(NUMA_BALANCING))
        return value if value is not None and 0 <= value < 256 else None

    def sched_ext(self) -> str | None:
        state = self._read(SCHED_EXT_STATE)
        if state is None or state.strip().lower() != "enabled":
            return None
        ops = _sysfs.clean_line(self._read(SCHED_EXT_OPS) or "", 64).strip()
        plain = ops and all(c.isascii() and (c.isalnum() or c in "_-.") for c in ops)
        return ops if plain else "an unnamed scheduler"

    def partition_nodes(self, vendor: Vendor, expected: int) -> tuple[KfdNode, ...]:
        base = vendor.partition_topology
        if base is None:
            return ()
        names = [
            n for n in self.root.listdir(base, MAX_PARTITION_NODES) if n.isascii() and n.isdigit()
        ]
        if len(names) <= expected:
            return ()
        out = []
        for name in sorted(names, key=lambda n: (len(n), n)):
            props: dict[str, int] = {}
            for line in (self._read(f"{base}/{name}/properties") or "").splitlines()[:128]:
                key, _, value = line.partition(" ")
                if key in _KFD_KEYS:
                    number = _sysfs.parse_int(value.strip())
                    if number is not None and number >= 0:
                        props[key] = number
            if not props.get("simd_count") or "location_id" not in props:
                continue  # a CPU agent, or not readable
            loc, domain = props["location_id"], props.get("domain", 0)
            if domain > 0xFFFF:
                continue
            slot = f"{domain:04x}:{(loc >> 8) & 0xFF:02x}:{(loc >> 3) & 0x1F:02x}"
            minor = props.get("drm_render_minor")
            out.append(KfdNode(node=int(name), slot=slot, render_minor=minor or None))
        return tuple(out)

    def partition_modes(self, vendor: Vendor, bdf: str) -> tuple[str | None, str | None]:
        modes: list[str | None] = []
        for name in vendor.partition_files or ():
            text = self._read(f"{SYS_PCI}/{bdf}/{name}")
            word = (text or "").strip().upper()
            modes.append(word if word.isascii() and word.isalnum() and 0 < len(word) <= 8 else None)
        padded = [*modes, None, None]
        return padded[0], padded[1]

    def cpu_vendor(self) -> str | None:
        # x86 writes "cpu:type:x86,venVVVVfam...": the kernel's X86_VENDOR_* number
        text = self._read(f"{SYS_CPU}/modalias") or ""
        head = text.split(":feature:", 1)[0]
        if ",ven" in head:
            code = head.split(",ven", 1)[1][:4]
            return _X86_VENDORS.get(code, f"x86 vendor {_sysfs.short(code, 8)}")
        if head.startswith("cpu:type:aarch64"):
            return "arm"
        # a capture made by hwloc-gather-topology has /proc/cpuinfo instead
        for line in (self.root.opt("/proc/cpuinfo", CPUINFO_CAP) or "").splitlines()[:32]:
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id":
                return _CPUINFO_VENDORS.get(value.strip())
        return None

    def close(self) -> None:
        self.root.close()


def kinds_from(values: dict[int, int], source: str, looked: tuple[str, ...]) -> CoreKinds:
    """CPU -> value, grouped into :class:`CoreKinds` levels (fastest first)."""
    by_value: dict[int, set[int]] = {}
    for cpu, value in values.items():
        by_value.setdefault(value, set()).add(cpu)
    levels = tuple((v, frozenset(by_value[v])) for v in sorted(by_value, reverse=True))
    return CoreKinds(source=source, levels=levels, looked=looked)


# the kernel's X86_VENDOR_* numbers, as /sys/devices/system/cpu/modalias writes them
_X86_VENDORS = {"0000": "intel", "0002": "amd", "0009": "hygon"}
MAX_PARTITION_NODES = 1024  # entries of a partition topology looked at
# the KFD node properties numabind reads: compute units (0: a CPU agent), the PCI
# location (bus << 8 | device << 3 | function, a partition's index in the low bits on
# Linux 6.5+; domain apart) and the render node
_KFD_KEYS = ("simd_count", "location_id", "domain", "drm_render_minor")
CPUINFO_CAP = 4 << 20  # /proc/cpuinfo of a 1,024-CPU machine is ~1.5 MB
_CPUINFO_VENDORS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "hygon"}


# --- what this process may use: its cgroup cpuset ----------------------------------------------


MOUNTS_CAP = 4 << 20  # container hosts can have thousands of mounts

# file names per layout: (effective cpus, cpus, effective mems, mems); "" = none
_V2 = ("cpuset.cpus.effective", "", "cpuset.mems.effective", "")
_V1 = ("cpuset.effective_cpus", "cpuset.cpus", "cpuset.effective_mems", "cpuset.mems")
_V1_NOPREFIX = ("effective_cpus", "cpus", "effective_mems", "mems")
CPUSET_FILES = tuple(dict.fromkeys(n for names in (_V2, _V1, _V1_NOPREFIX) for n in names if n))


def _unescape(field: str) -> str:
    r"""/proc/mounts writes space, tab, newline and backslash as \040 \011 \012 \134."""
    if "\\" not in field:
        return field
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


class _Found(Exception):
    def __init__(self, allowed: Allowed) -> None:
        self.allowed = allowed


def cpuset(root: Root, online: frozenset[int]) -> Allowed:
    """The process's cpuset as an :class:`~numabind._model.Allowed` (see module doc)."""
    mounts = root.opt("/proc/self/mounts", MOUNTS_CAP) or root.opt("/proc/mounts", MOUNTS_CAP)
    v1_mount = v2_mount = None
    v1_names = _V1
    for line in (mounts or "").splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        point, fstype, opts = _unescape(fields[1]), fields[2], fields[3].split(",")
        if fstype == "cgroup2" and v2_mount is None:
            v2_mount = point
        elif (fstype == "cgroup" and "cpuset" in opts) or fstype == "cpuset":
            v1_mount = point
            v1_names = _V1_NOPREFIX if ("noprefix" in opts or fstype == "cpuset") else _V1
    v1_path = v2_path = None
    cgroup = root.opt("/proc/self/cgroup")
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
        v1_path = v2_path = root.opt("/proc/self/cpuset")
    problems: list[str] = []
    try:
        if v1_mount is not None and v1_path is not None:
            _walk(root, online, v1_mount, v1_path, v1_names, "cgroup-v1", problems)
        if v2_mount is not None and v2_path is not None:
            _walk(root, online, v2_mount, v2_path, _V2, "cgroup-v2", problems)
    except _Found as found:
        return found.allowed
    return Allowed(
        cpus=online,
        mems=_mems_allowed(root),
        kind="online",
        problem="; ".join(problems) or None,
    )


def _mems_allowed(root: Root) -> frozenset[int] | None:
    # Mems_allowed_list is the cpuset's own memory nodes (no parent narrows it)
    for line in (root.opt("/proc/self/status") or "").splitlines():
        if line.startswith("Mems_allowed_list:"):
            try:
                return _sysfs.parse_nodelist(line.split(":", 1)[1])
            except ValueError:
                return None
    return None


def _walk(
    root: Root,
    online: frozenset[int],
    mount: str,
    path: str,
    names: tuple[str, str, str, str],
    kind: str,
    problems: list[str],
) -> None:
    """Walk up from the process's cgroup: in v2 a cgroup without the cpuset controller
    has no cpuset files and inherits its parent's; in a cgroup namespace the path from
    /proc/self/cgroup may not exist under the mount, whose root is then ours."""
    path = "/" + path.strip("/")
    before = len(problems)
    candidates: list[str] = []
    for _ in range(256):  # cgroup trees are shallow; a crafted path cannot loop us
        candidates.append(path)
        if path == "/":
            break
        path = path.rsplit("/", 1)[0] or "/"
    for cand in candidates:
        d = mount.rstrip("/") + (cand if cand != "/" else "")
        cpus_text = _read(root, d, names[0], names[1], problems)
        if cpus_text is None:
            if len(problems) > before:
                return  # it exists but cannot be read: say so rather than look above it
            continue
        if not cpus_text:
            continue
        mems_text = _read(root, d, names[2], names[3], problems)
        try:
            cpus = _sysfs.parse_cpulist(cpus_text)
            mems = _sysfs.parse_nodelist(mems_text) if mems_text else None
        except ValueError as err:
            problems.append(f"{kind.replace('-', ' ')} cpuset {d} is unreadable ({err})")
            return
        raise _Found(
            Allowed(
                cpus=cpus & online if online else cpus,
                mems=mems,
                kind=kind,  # type: ignore[arg-type]
                directory=d,
            )
        )


def _read(root: Root, d: str, first: str, second: str, problems: list[str]) -> str | None:
    for name in (first, second):
        if not name:
            continue
        try:
            return root.read(f"{d}/{name}")
        except FileNotFoundError:
            continue
        except OSError as err:
            why = str(err) if isinstance(err, _sysfs.ReadError) else (err.strerror or str(err))
            problems.append(f"cgroup cpuset file {d}/{name} exists but is unreadable ({why})")
            return None
    return None
