"""The machine as numabind sees it: NUMA nodes, CPUs, what this process may use, and the
accelerators on PCI.

A :class:`Machine` is read from a :class:`~numabind._sources.Source` (sysfs of the live
system or of a capture, or an hwloc XML export), from files only: no subprocess, no NVML,
no CUDA.  Every property is read on first use and then kept, so the startup hook pays only
for what its rank's plan touches, and the values never change once seen.
"""

from __future__ import annotations

from ._model import (
    BY_KEY,
    Accelerator,
    Allowed,
    CoreKinds,
    CpuInfo,
    KfdNode,
    Nic,
    Node,
    OtherDevice,
)
from ._sysfs import format_cpulist

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    from ._dra import DraDevice
    from ._sources import Source

_UNSET: Any = object()


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
        self._full_nodes: dict[int, Node] = {}
        self._detailed: dict[str, Accelerator] = {}
        self._nics: tuple[Nic, ...] | None = None
        self._others: tuple[OtherDevice, ...] | None = None
        self._cpu: dict[int, CpuInfo] = {}
        self._package: dict[int, int | None] = {}
        self._siblings: dict[int, frozenset[int]] = {}
        self._cache: dict[int, frozenset[int] | None] = {}
        self._allowed: Allowed | None = None
        self._kinds: CoreKinds | None = None
        self._accelerators: tuple[Accelerator, ...] | None = None
        self._driver_gpus: dict[str, tuple[str, ...] | None] = {}
        self._kernel: str | None = _UNSET
        self._balancing: int | None = _UNSET
        self._classified: tuple[Node, ...] | None = None
        self._partition_nodes: dict[str, dict[str, list[KfdNode]]] = {}
        self._gpu_memory: dict[int, tuple[Accelerator, str]] | None = None
        self._vendor: str | None = _UNSET

    def __repr__(self) -> str:
        """Where the machine was read from, its nodes and CPUs (two small reads), and its
        accelerators once they were listed (listing them reads every PCI function)."""
        parts = [
            repr(self.description),
            f"nodes {format_cpulist(self.node_ids) or '-'}",
            f"CPUs {format_cpulist(self.online_cpus) or '-'}",
        ]
        if self._accelerators is not None:
            parts.append(f"{len(self._accelerators)} accelerators")
        return f"<Machine {', '.join(parts)}>"

    @classmethod
    def from_root(cls, root: str | None = None) -> Machine:
        """The machine under ``root``, a directory laid out like ``/`` (``/`` itself: this
        one), read inside it only.  Without ``root``: this machine as numabind sees it,
        :meth:`here` (``NUMABIND_SYSROOT`` under its rules), as the rest of the Python API
        reads it; an explicit ``"/"`` reads ``/``.  Raises :class:`~numabind.CaptureError`
        when ``root`` is missing, not a directory, or holds no ``sys/`` (a tarball or an
        hwloc XML file: :meth:`from_capture` reads those)."""
        if root is None:
            return cls.here()
        from ._sources import LiveRoot, Root, SysfsSource

        tree: Root
        try:
            if root in ("", "/"):
                tree = LiveRoot()
            else:
                from ._roots import DirRoot  # captures only: a live rank never loads it

                tree = DirRoot(root)
        except OSError as err:
            from ._errors import CaptureError

            what = "not a directory" if isinstance(err, NotADirectoryError) else None
            raise CaptureError(
                f"{root}: {what or err.strerror or err}"
                + ("; Machine.from_capture reads a tarball or an hwloc XML file" if what else "")
            ) from None
        if not tree.live and not tree.isdir("/sys"):
            tree.close()
            from ._errors import CaptureError

            raise CaptureError(f"{root}: no sys/ directory: not a machine laid out like /")
        return cls(SysfsSource(tree))

    @classmethod
    def here(cls) -> Machine:
        """This machine, as every entry point reads it: ``/``, or the directory
        ``NUMABIND_SYSROOT`` names where its rules allow (ignored under ``python -I``/``-E``,
        and for root unless root owns the whole path).  Use it as a context manager:

        .. example: run

        ::

            import numabind

            with numabind.Machine.here() as machine:
                print(machine.cpu_nodes)
        """
        import os

        from ._sysfs import redirect

        raw = os.environ.get("NUMABIND_SYSROOT")
        return cls.from_root(
            redirect("NUMABIND_SYSROOT", raw, "/", own=True, registry=False, notes=[])
        )

    def __enter__(self) -> Machine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def from_capture(cls, path: str) -> Machine:
        """The machine in a capture: a directory laid out like ``/`` (or holding one such
        directory), a tarball of one (``numabind gather``, ``hwloc-gather-topology``) or an
        hwloc XML export, told apart by content.  Raises :class:`~numabind.CaptureError`."""
        from .capture._capture import open_source

        return cls(open_source(path))

    @classmethod
    def from_example(cls, name: str) -> Machine:
        """One of the example machines numabind generates (``dgx-h100``, ``gb200``,
        ``mi300x``, ``nps4``, ...: ``numabind show --example``), read from memory; for
        trying numabind without a GPU server."""
        from ._sources import SysfsSource
        from .capture._examples import example_root

        return cls(SysfsSource(example_root(name)))

    @property
    def recorded_environ(self) -> dict[str, str] | None:
        """The rank and device variables a capture recorded with its machine
        (``numabind gather``), so that a plan shown elsewhere is the plan that process
        would get; None for the live system and captures that recorded none."""
        return self.source.environ

    @property
    def description(self) -> str:
        """Where the machine was read from: "live system", or the capture given."""
        return self.source.description

    @property
    def warnings(self) -> tuple[str, ...]:
        """Malformed facts the reader ignored, one line each, naming file and value."""
        return tuple(self.source.warnings)

    @property
    def online_cpus(self) -> frozenset[int]:
        """Every online CPU of the machine (cgroup restrictions aside: see ``allowed``)."""
        if self._online is None:
            self._online = self.source.online_cpus()
        return self._online

    @property
    def node_ids(self) -> tuple[int, ...]:
        """The NUMA node numbers, sorted (empty on a kernel without NUMA)."""
        if self._node_ids is None:
            self._node_ids = self.source.node_ids()
        return self._node_ids

    def node(self, node_id: int, full: bool = False) -> Node | None:
        """Node ``node_id``, or None when the machine has no such node.  Its CPUs; with
        ``full`` also its memory and distances (the planner needs only the CPUs, and reads
        only those)."""
        store = self._full_nodes if full else self._nodes
        if node_id not in store:
            ids = self.node_ids
            if not ids and node_id == 0:
                # A kernel built without NUMA has no node directory: one node holds all.
                store[0] = Node(id=0, cpus=self.online_cpus)
            elif node_id not in ids:
                return None
            else:
                store[node_id] = self.source.node(node_id, self.online_cpus, ids, full)
        return store[node_id]

    @property
    def nodes(self) -> tuple[Node, ...]:
        """Every NUMA node, memory-only ones included, with memory, distances, memory tier
        and its kind (``numabind._model.NODE_KINDS``: CPU memory, GPU memory,
        high-bandwidth, far, or memory of unknown kind), classified from the machine's
        own files (see ``numabind._topology.classify``)."""
        if self._classified is None:
            ids = self.node_ids or (0,)
            read = tuple(n for n in (self.node(i, full=True) for i in ids) if n is not None)
            gpus = {
                n: f"the memory of {a.pci} ({how})" for n, (a, how) in self.gpu_memory().items()
            }
            kinds = classify(read, gpus)
            self._classified = tuple(
                n.replace(kind=kinds[n.id][0], kind_how=kinds[n.id][1]) for n in read
            )
        return self._classified

    def package_of_node(self, node_id: int) -> int | None:
        """The package node ``node_id`` belongs to: its CPUs' package; for a memory-only node the
        package of the one CPU node nearest to it (Xeon Max's HBM next to its cluster),
        None when no CPU node is nearer than the others (GB200's GPU memory: 80 from
        every node) or the package is unknown."""
        node = self.node(node_id)
        if node is None:
            return None
        if node.cpus:
            return self.package_of(min(node.cpus))
        full = self.node(node_id, full=True)
        dist = dict(full.distances) if full is not None else {}
        near = sorted((dist[c.id], c.id) for c in self.cpu_nodes if c.id in dist)
        if not near or (len(near) > 1 and near[0][0] == near[1][0]):
            return None
        return self.package_of_node(near[0][1])

    def node_kind(self, node_id: int) -> str | None:
        """The kind of node ``node_id`` (a ``numabind._model.NODE_KINDS`` key), None
        when the machine has no such node."""
        return next((n.kind for n in self.nodes if n.id == node_id), None)

    @property
    def memory_only_ids(self) -> frozenset[int]:
        """Nodes without CPUs (GPU memory, HBM, CXL...): read from the nodes' CPU lists
        alone, so the planner pays nothing more for knowing whether there are any."""
        return frozenset(self.node_ids) - {n.id for n in self.cpu_nodes}

    def gpu_memory(self) -> dict[int, tuple[Accelerator, str]]:
        """CPU-less nodes that are a GPU's own memory -> (that GPU, how it was told): the
        driver's memory node (NVIDIA ``numa_status``, hwloc's GPUMemory), or a GPU's PCI
        ``numa_node`` naming a node without CPUs (GB200: NVML reports the same)."""
        if self._gpu_memory is None:
            memory_only = self.memory_only_ids
            out: dict[int, tuple[Accelerator, str]] = {}
            for acc in self.all_accelerators:
                if acc.memory_node is not None and acc.memory_node in memory_only:
                    out.setdefault(acc.memory_node, (acc, "its driver says so"))
            for acc in self.all_accelerators:
                if acc.numa_node is not None and acc.numa_node in memory_only:
                    out.setdefault(acc.numa_node, (acc, "its PCI numa_node"))
            self._gpu_memory = out
        return self._gpu_memory

    @property
    def cpu_nodes(self) -> tuple[Node, ...]:
        """Nodes that have CPUs (memory-only nodes left out), with their CPUs only."""
        ids = self.node_ids or (0,)
        return tuple(n for n in (self.node(i) for i in ids) if n is not None and n.cpus)

    def node_of_cpu(self, cpu: int) -> int | None:
        """The node holding ``cpu``, None when no node lists it."""
        for n in self.cpu_nodes:
            if cpu in n.cpus:
                return n.id
        return None

    def cpu_info(self, cpu: int) -> CpuInfo:
        """Package, SMT siblings and largest cache domain of ``cpu`` at once (each fact
        read once, whichever way it was asked for first)."""
        if cpu not in self._cpu:
            self._cpu[cpu] = CpuInfo(
                cpu=cpu,
                package=self.package_of(cpu),
                siblings=self.siblings_of(cpu),
                cache=self.cache_of(cpu),
            )
        return self._cpu[cpu]

    def package_of(self, cpu: int) -> int | None:
        """The physical package (socket) of ``cpu``, None when unknown."""
        if cpu in self._cpu:
            return self._cpu[cpu].package
        found: int | None = self._fact(self._package, cpu, self.source.cpu_package)
        return found

    def siblings_of(self, cpu: int) -> frozenset[int]:
        """The hardware threads of the core of ``cpu`` (itself included)."""
        if cpu in self._cpu:
            return self._cpu[cpu].siblings
        found: frozenset[int] = self._fact(self._siblings, cpu, self.source.cpu_siblings)
        return found

    def cache_of(self, cpu: int) -> frozenset[int] | None:
        """The CPUs sharing the largest cache of ``cpu`` (its L3 / CCX), None if unknown."""
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
    def smt(self) -> int:
        """Hardware threads per core (from the first online CPU's siblings; 1 if unknown)."""
        online = self.online_cpus
        if not online:
            return 1
        return max(len(self.siblings_of(min(online)) & online), 1)

    @property
    def allowed(self) -> Allowed:
        """The CPUs and memory nodes this process may use (its cgroup cpuset), and where
        that answer came from."""
        if self._allowed is None:
            self._allowed = self.source.allowed(self.online_cpus)
        return self._allowed

    @property
    def core_kinds(self) -> CoreKinds:
        """How the online CPUs differ in speed, and which file said so (a ``CoreKinds``
        record, with the machine's other records below): one kind where nothing tells
        them apart."""
        if self._kinds is None:
            self._kinds = self.source.core_kinds(self.online_cpus)
        return self._kinds

    def priority_cpus(self, node_id: int) -> frozenset[int]:
        """The priority CPUs of node ``node_id``: its fastest kind, when its cores are
        of more than one (empty when they are one kind, or it has no CPUs)."""
        node = self.node(node_id)
        if node is None or not node.cpus:
            return frozenset()
        return self.core_kinds.priority(node.cpus)

    def describe_kinds(self, cpus: frozenset[int]) -> str:
        """One line for ``cpus`` (a node's CPUs): their kinds, fastest first, and the file
        that told them apart, or that nothing did."""
        kinds = self.core_kinds
        found = kinds.kinds(cpus)
        if len(found) <= 1:
            why = (
                f"{kinds.source} is the same on all of them"
                if kinds.source
                else "no file tells them apart (" + (", ".join(kinds.looked) or "none read") + ")"
            )
            return f"one kind: {why}"
        parts = [
            f"{'priority' if i == 0 else 'standard' if len(found) == 2 else f'rank {i + 1}'} "
            f"{format_cpulist(c)} ({hi if hi == lo else f'{lo}-{hi}'})"
            for i, (hi, lo, c) in enumerate(found)
        ]
        return f"{len(found)} kinds by {kinds.source}: " + ", ".join(parts)

    @property
    def accelerators(self) -> tuple[Accelerator, ...]:
        """Every compute accelerator on the host's PCI bus, in PCI order (sysfs is not
        namespaced: a container sees the host's devices here, reachable or not), read
        brief (:meth:`detailed` reads the rest of one)."""
        if self._accelerators is None:
            self._accelerators = self.source.accelerators()
        return self._accelerators

    def accelerator(self, bdf: str) -> Accelerator | None:
        """The accelerator at PCI address ``bdf`` (sysfs form), None if there is none."""
        if self._accelerators is not None:
            for acc in self._accelerators:
                if acc.pci == bdf:
                    return acc
            return None
        return self.source.accelerator(bdf)

    def detailed(self, acc: Accelerator) -> Accelerator:
        """``acc`` with every fact read: its class, UUID, the driver's model name, minor
        number and GPU-memory node, and its CPU locality (a compute partition: its GPU's,
        the partition kept)."""
        if acc.detailed:
            return acc
        if acc.pci not in self._detailed:
            self._detailed[acc.pci] = self.source.accelerator(acc.pci, detail=True) or acc
        return _as_partition(self._detailed[acc.pci], acc)

    @property
    def all_accelerators(self) -> tuple[Accelerator, ...]:
        """Every accelerator, detailed (what ``show`` reports)."""
        return tuple(self.detailed(a) for a in self.accelerators)

    def located(self, acc: Accelerator) -> Accelerator:
        """``acc`` with its ``numa_node`` (and, where that is -1, its CPU locality) read."""
        return _as_partition(self.source.locate(_whole(acc)), acc)

    def with_partitions(self, devs: Sequence[Accelerator]) -> tuple[Accelerator, ...]:
        """``devs`` with each GPU that is split into compute partitions (AMD MI300 in
        DPX/QPX/CPX mode) replaced by its partitions, in the order the runtime numbers
        them (the partition topology's: AMD's KFD, which ROCr enumerates node by node).
        A partition keeps its GPU's PCI address, node and locality.  Reads one directory
        listing when no GPU is split, and the topology's node files only when one is."""
        out: list[Accelerator] = []
        for dev in devs:
            parts = self._partitions(dev)
            out.extend(parts or (dev,))
        return tuple(out)

    def _partitions(self, dev: Accelerator) -> tuple[Accelerator, ...]:
        vendor = BY_KEY.get(dev.vendor)
        if vendor is None or vendor.partition_topology is None or dev.partition is not None:
            return ()
        if vendor.key not in self._partition_nodes:
            own = sum(1 for a in self.accelerators if a.vendor == vendor.key)
            nodes = self.source.partition_nodes(vendor, own + len(self.cpu_nodes))
            slots: dict[str, list[KfdNode]] = {}
            for n in nodes:
                slots.setdefault(n.slot, []).append(n)
            self._partition_nodes[vendor.key] = slots
        found = self._partition_nodes[vendor.key].get(dev.pci.rsplit(".", 1)[0], [])
        if len(found) < 2:
            return ()
        compute, memory = self.source.partition_modes(vendor, dev.pci)
        parts = found[:MAX_PARTITIONS]
        return tuple(
            dev.replace(
                partition=k,
                partitions=len(parts),
                compute_partition=compute,
                memory_partition=memory,
                render_minor=n.render_minor,
            )
            for k, n in enumerate(parts)
        )

    def local_cpus(self, acc: Accelerator) -> frozenset[int] | None:
        """The CPU locality of ``acc`` (read when a short reading left it out)."""
        if acc.local_cpus is not None or acc.detailed:
            return acc.local_cpus
        return self.detailed(acc).local_cpus

    def pci_path(self, bdf: str) -> tuple[str, ...] | None:
        """The bridges between the host bridge and device ``bdf`` (host bridge first), or
        None when the machine's files do not say."""
        return self.source.pci_path(bdf)

    @property
    def nics(self) -> tuple[Nic, ...]:
        """The RDMA-capable network adapters, in PCI order."""
        if self._nics is None:
            self._nics = self.source.nics()
        return self._nics

    @property
    def ethernet(self) -> tuple[Nic, ...]:
        """Network interfaces on PCI functions that carry no RDMA device (``kind``
        ``netdev``): ``show`` and ``doctor`` list them; no transport is told to use one."""
        found: tuple[Nic, ...] | None = self.__dict__.get("_ethernet")
        if found is None:
            bonded = frozenset(m for n in self.nics for m in n.members)
            found = self.source.ethernet(frozenset(n.pci for n in self.nics), bonded)
            self.__dict__["_ethernet"] = found
        return found

    def others(self) -> tuple[OtherDevice, ...]:
        """Compute-class PCI functions of vendors numabind has no row for (``doctor``)."""
        if self._others is None:
            self._others = self.source.others()
        return self._others

    @property
    def dra_devices(self) -> tuple[DraDevice, ...]:
        """The devices a Kubernetes pod's DRA device metadata lists for this container
        (KEP-5304 files under /var/run/kubernetes.io/dra-device-attributes; empty
        elsewhere): PCI address, NUMA node where the driver says one, driver."""
        return self.source.dra_devices()

    def driver_gpus(self, vendor: str) -> tuple[str, ...] | None:
        """PCI addresses the driver of ``vendor`` lists (NVIDIA: /proc/driver/nvidia/gpus,
        only the GPUs mounted into this container), or None when there is no such list."""
        if vendor not in self._driver_gpus:
            self._driver_gpus[vendor] = self.source.driver_gpus(vendor)
        return self._driver_gpus[vendor]

    @property
    def kernel_release(self) -> str | None:
        """The kernel's release string (``uname -r``), None when unreadable."""
        if self._kernel is _UNSET:
            self._kernel = self.source.kernel_release()
        return self._kernel

    def kernel_at_least(self, major: int, minor: int) -> bool | None:
        """Whether the kernel's release is at least version ``major``, ``minor`` (5, 15:
        Linux 5.15 or later); None when the release is unknown or does not parse."""
        release = self.kernel_release
        if not release:
            return None
        head = release.split("-", 1)[0].split(".")
        try:
            return (int(head[0]), int(head[1])) >= (major, minor)
        except (ValueError, IndexError):
            return None

    @property
    def numa_balancing(self) -> bool | None:
        """Whether automatic NUMA balancing is on (bit 0 of kernel.numa_balancing; bit 1 is
        memory tiering), None when unknown."""
        if self._balancing is _UNSET:
            self._balancing = self.source.numa_balancing()
        return None if self._balancing is None else bool(self._balancing & 1)

    @property
    def sched_ext(self) -> str | None:
        """The sched_ext scheduler that places this machine's tasks (``scx_cosmos``), None
        when none is active: read each time (it can be started and stopped at any time),
        never cached."""
        return self.source.sched_ext()

    @property
    def cpu_vendor(self) -> str | None:
        """Who made the CPUs (``intel``, ``amd``, ``arm``...; None when the files do not
        say): Intel calls a split package sub-NUMA clusters (SNC), AMD NUMA nodes per
        socket (NPS)."""
        if self._vendor is _UNSET:
            self._vendor = self.source.cpu_vendor()
        return self._vendor

    def close(self) -> None:
        """Release what the source holds (a capture tarball's bytes)."""
        self.source.close()


MAX_PARTITIONS = 64  # compute partitions of one GPU read (MI300X in CPX has 8)


def _whole(acc: Accelerator) -> Accelerator:
    """The GPU a compute partition belongs to (what the source reads and caches)."""
    if acc.partition is None:
        return acc
    return acc.replace(
        partition=None,
        partitions=None,
        compute_partition=None,
        memory_partition=None,
        render_minor=None,
    )


def _as_partition(found: Accelerator, asked: Accelerator) -> Accelerator:
    """A reading of a GPU (``found``, cached per PCI address) as the compute partition of
    it that was ``asked`` about."""
    if asked.partition is None:
        return found
    return found.replace(
        partition=asked.partition,
        partitions=asked.partitions,
        compute_partition=asked.compute_partition,
        memory_partition=asked.memory_partition,
        render_minor=asked.render_minor,
    )


# how much faster or slower (HMAT read bandwidth) a CPU-less node must be than its nearest
# CPU node to be called high-bandwidth or far memory
BANDWIDTH_RATIO = 2


def classify(nodes: tuple[Node, ...], gpu_memory: dict[int, str]) -> dict[int, tuple[str, str]]:
    """Each node's kind and the fact that told it, first fact that speaks wins:

    1. a node with CPUs is CPU memory;
    2. a GPU's own memory (``gpu_memory``: node -> how that is known);
    3. what the capture says (hwloc's NUMANode subtype, read into ``Node.kind``);
    4. the kernel's memory tier against the CPU nodes' tiers: slower is far memory (CXL
       onlined by dax/kmem lands in memory_tier22 and the like), faster is high-bandwidth;
    5. the firmware's HMAT read bandwidth against the nearest CPU node's: twice as much is
       high-bandwidth, half is far;
    6. the distance table: farther from every CPU node than any two CPU nodes are from
       each other is far memory;
    7. otherwise memory of unknown kind: numabind does not guess.
    """
    cpu = [n for n in nodes if n.cpus]
    cpu_ids = {n.id for n in cpu}
    tiers = sorted({n.tier for n in cpu if n.tier is not None})
    widest = max(
        (d for n in cpu for m, d in n.distances if m in cpu_ids and m != n.id), default=None
    )
    out: dict[int, tuple[str, str]] = {}
    for n in nodes:
        if n.cpus:
            out[n.id] = ("cpu", "it has CPUs")
        elif n.id in gpu_memory:
            out[n.id] = ("gpu", gpu_memory[n.id])
        elif n.kind is not None:
            out[n.id] = (n.kind, n.kind_how or "the capture says so")
        elif n.tier is not None and tiers and n.tier > tiers[-1]:
            out[n.id] = (
                "far",
                f"memory_tier{n.tier}, slower than the CPU nodes' memory_tier{tiers[-1]}",
            )
        elif n.tier is not None and tiers and n.tier < tiers[0]:
            out[n.id] = (
                "hbm",
                f"memory_tier{n.tier}, faster than the CPU nodes' memory_tier{tiers[0]}",
            )
        else:
            out[n.id] = _by_performance(n, cpu, widest)
    return out


def _by_performance(node: Node, cpu: list[Node], widest: int | None) -> tuple[str, str]:
    """Rules 5-7 of :func:`classify` for a CPU-less node."""
    dist = dict(node.distances)
    near = sorted((dist[c.id], c.id, c) for c in cpu if c.id in dist)
    if near and node.read_bandwidth:
        own = near[0][2].read_bandwidth
        if own and node.read_bandwidth >= BANDWIDTH_RATIO * own:
            return (
                "hbm",
                f"HMAT read bandwidth {node.read_bandwidth} MB/s, node {near[0][1]}'s {own}",
            )
        if own and node.read_bandwidth * BANDWIDTH_RATIO <= own:
            return (
                "far",
                f"HMAT read bandwidth {node.read_bandwidth} MB/s, node {near[0][1]}'s {own}",
            )
    if near and widest is not None and near[0][0] > widest:
        return "far", (
            f"distance {near[0][0]} from its nearest CPU node, farther than any two CPU "
            f"nodes ({widest})"
        )
    return "memory", "no CPUs, and nothing says what memory it is"
