"""The shared model: immutable records, the machine's records, and the vocabularies
every layer reads, each one table (vendors, memory policies, rank variables).

A leaf: it imports nothing of numabind's.  Adding a vendor, a memory policy or a rank
variable is one row in a table here (plus its tests); every other module, the docs and
``--help`` read the tables.


``dataclasses`` would be the obvious tool, but importing it pulls in ``inspect`` and ``re``
(several milliseconds), and these records are built in every rank process by the startup
hook.  So :class:`Record` does the few things a frozen, slotted, keyword-only dataclass
would, from the class annotations alone: each field is written once, as ``name: type`` or
``name: type = default``, and the metaclass turns that into ``__slots__``, a keyword-only
constructor, equality, hashing, a readable ``repr``, pickling, :meth:`Record.replace` and
a JSON-ready :meth:`Record.to_dict`.  ``dataclass_transform`` (type checkers only) tells
mypy the same, so constructor calls are checked field by field.
"""

from __future__ import annotations

import _numabind_base

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, ClassVar, TypeVar

    from typing_extensions import dataclass_transform

    R = TypeVar("R", bound="Record")
    T = TypeVar("T")
else:

    def dataclass_transform(**_: object) -> object:
        return lambda cls: cls


_set = object.__setattr__


def jsonable(value: object) -> object:
    """Convert a record value for JSON: sets become sorted lists, records become dicts."""
    if isinstance(value, Record):
        return value.to_dict()
    if isinstance(value, (frozenset, set)):
        return sorted(value)
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return value


def _restore(cls: type[R], values: dict[str, Any]) -> R:
    """Unpickle a record (a module-level function, so pickle can name it)."""
    return cls(**values)


class _RecordMeta(type):
    """Turn ``name: type [= default]`` annotations into slots, defaults and field order."""

    def __new__(mcs, name: str, bases: tuple[type, ...], ns: dict[str, Any]) -> _RecordMeta:
        inherited: tuple[str, ...] = ()
        defaults: dict[str, Any] = {}
        for base in bases:
            inherited += getattr(base, "_fields", ())
            defaults.update(getattr(base, "_defaults", {}))
        own = tuple(
            n
            for n, kind in ns.get("__annotations__", {}).items()
            if not n.startswith("_") and not str(kind).startswith("ClassVar")
        )
        for n in own:
            if n in ns:
                defaults[n] = ns.pop(n)
        ns.setdefault("__slots__", own)
        ns["_fields"] = inherited + own
        ns["_defaults"] = defaults
        return super().__new__(mcs, name, bases, ns)

    @property
    def __signature__(cls) -> Any:
        """The keyword-only constructor, field by field (``help()``, ``inspect`` and the
        API docs show it); built when asked, so the startup path never imports inspect."""
        import inspect

        hints: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            hints.update(getattr(klass, "__annotations__", {}))
        defaults = getattr(cls, "_defaults", {})
        return inspect.Signature(
            [
                inspect.Parameter(
                    n,
                    inspect.Parameter.KEYWORD_ONLY,
                    default=defaults.get(n, inspect.Parameter.empty),
                    annotation=hints.get(n, inspect.Parameter.empty),
                )
                for n in getattr(cls, "_fields", ())
            ]
        )


@dataclass_transform(kw_only_default=True, frozen_default=True)
class Record(metaclass=_RecordMeta):
    """Base of the model's value objects: immutable once built, compared by value.

    Construction is keyword-only (the positional form ``Plan`` and ``Request`` accepted
    in 0.2, deprecated there, was removed in 0.3: a field named at the call cannot be
    taken for another when a field is added).
    """

    __slots__ = ()
    _fields: ClassVar[tuple[str, ...]] = ()
    _defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cls = type(self)
        fields = cls._fields
        if args:
            raise TypeError(
                f"{cls.__name__}() takes keyword arguments only (positional arguments were "
                "removed in numabind 0.3)"
            )
        defaults = cls._defaults
        for n in fields:
            if n in kwargs:
                _set(self, n, kwargs.pop(n))
            elif n in defaults:
                _set(self, n, defaults[n])
            else:
                raise TypeError(f"{cls.__name__}() missing required argument {n!r}")
        if kwargs:
            raise TypeError(f"{cls.__name__}() got unexpected arguments {sorted(kwargs)}")

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable")

    def _values(self) -> tuple[Any, ...]:
        return tuple(getattr(self, n) for n in self._fields)

    def replace(self: R, **changes: Any) -> R:
        """A copy with some fields changed (``dataclasses.replace`` for records)."""
        values = {n: getattr(self, n) for n in self._fields}
        unknown = set(changes) - set(values)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no fields {sorted(unknown)}")
        values.update(changes)
        return type(self)(**values)

    def __eq__(self, other: object) -> bool:
        if type(self) is not type(other):
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._values()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (type(self), {n: getattr(self, n) for n in self._fields}))

    def __repr__(self) -> str:
        fields = ", ".join(f"{n}={getattr(self, n)!r}" for n in self._fields)
        return f"{type(self).__name__}({fields})"

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready data (sets as sorted lists)."""
        return {n: jsonable(getattr(self, n)) for n in self._fields}


# --- the machine model -------------------------------------------------------------------------


class Node(Record):
    """One NUMA node.  ``cpus`` are its online CPUs; an empty set means a memory-only node
    (GPU HBM on GH200/GB200/POWER9, CXL memory, Xeon Max HBM in flat mode).

    What memory it is: ``kind`` is a ``NODE_KINDS`` key (None: not classified, as
    :meth:`numabind.Machine.node` reads a node; :attr:`numabind.Machine.nodes` classifies
    every node) and ``kind_how`` the fact that told it; ``tier`` is the kernel's memory
    tier holding it (``/sys/devices/virtual/memory_tiering/memory_tierN``, Linux 6.1+: a
    lower N is faster memory; None where the kernel or the capture has none);
    ``read_bandwidth`` the firmware's (ACPI HMAT) read bandwidth from its nearest CPUs in
    MB/s, where the kernel publishes it."""

    id: int
    cpus: frozenset[int]
    memory_bytes: int | None = None
    distances: tuple[tuple[int, int], ...] = ()
    kind: str | None = None
    tier: int | None = None
    read_bandwidth: int | None = None
    kind_how: str = ""

    @property
    def has_cpus(self) -> bool:
        return bool(self.cpus)

    def distance_to(self, other: int) -> int | None:
        for node, dist in self.distances:
            if node == other:
                return dist
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "cpus": sorted(self.cpus),
            "has_cpus": self.has_cpus,
            "memory_bytes": self.memory_bytes,
            "distances": {str(n): d for n, d in self.distances},
            "kind": self.kind,
            "kind_how": self.kind_how or None,
            "tier": self.tier,
            "read_bandwidth": self.read_bandwidth,
        }


# --- vocabulary: what memory a node holds ------------------------------------------------------


class NodeKind(Record):
    """One kind of NUMA node memory (docs/memory-tiers.rst says how each is told): how
    ``show`` names it, and whether ``check`` notes a rank's pages there that the rank did
    not ask for (``wrong_tier``: a GPU's memory, far memory).  Only ``cpu`` (a node with
    CPUs) is memory a rank's default policy uses."""

    name: str
    label: str
    wrong_tier: bool = False


NODE_KIND_TABLE: tuple[NodeKind, ...] = (
    NodeKind(name="cpu", label="CPU memory"),
    NodeKind(name="gpu", label="GPU memory", wrong_tier=True),
    NodeKind(name="hbm", label="high-bandwidth memory"),
    NodeKind(name="far", label="far memory", wrong_tier=True),
    NodeKind(name="memory", label="memory only, kind unknown"),
)
NODE_KINDS = {k.name: k for k in NODE_KIND_TABLE}


class CpuInfo(Record):
    """Where one CPU sits: its package, its SMT siblings, and the largest cache domain
    it shares (the L3 on x86, the L2 cluster on some Arm parts)."""

    cpu: int
    package: int | None
    siblings: frozenset[int]
    cache: frozenset[int] | None


class Accelerator(Record):
    """A compute accelerator on PCI.

    ``vendor`` is the key of its entry in ``numabind._model.VENDORS``.
    ``numa_node`` is None when the firmware does not say (sysfs ``-1``); ``local_cpus`` is
    the device's CPU locality from ``local_cpulist``/``local_cpus`` (None when unreadable).
    ``memory_node`` is the CPU-less node holding the GPU's own memory, where the driver
    exposes one (POWER9 and Grace systems).  ``uuid`` is the token a visibility list can
    name it by (NVIDIA ``GPU-...``; AMD ``GPU-<unique_id>``).  Unreadable fields are None.

    A reading may stop short (``read``): ``id`` holds the vendor and device id,
    ``located`` adds ``numa_node`` (and the CPU locality when ``numa_node`` is -1);
    :meth:`numabind.Machine.located` and :meth:`~numabind.Machine.detailed` read on.  The
    startup hook of an 8-GPU rank reads where its own GPU is and that GPU's driver files,
    not every GPU's.
    """

    pci: str
    vendor: str
    vendor_id: int | None = None
    device_id: int | None = None
    pci_class: int | None = None
    numa_node: int | None = None
    local_cpus: frozenset[int] | None = None
    uuid: str | None = None
    memory_node: int | None = None
    name: str | None = None
    minor: int | None = None
    # how much was read: "all", or "id"/"located" (Machine.located() and .detailed() read on)
    read: str = "all"
    # one compute partition of a GPU split into several (AMD MI300 in DPX/QPX/CPX): its
    # index among its GPU's partitions (the runtime's order), how many there are, and the
    # modes the GPU is in; a partition has no PCI address of its own (``pci`` is its GPU's)
    partition: int | None = None
    partitions: int | None = None
    compute_partition: str | None = None  # AMD current_compute_partition: SPX, CPX, ...
    memory_partition: str | None = None  # AMD current_memory_partition: NPS1, NPS4
    render_minor: int | None = None  # its DRM render node (/dev/dri/renderD<minor>)

    @property
    def detailed(self) -> bool:
        return self.read == "all"

    def __eq__(self, other: object) -> bool:
        """One device is one PCI function (or one compute partition of it): a brief and a
        detailed reading are equal."""
        if not isinstance(other, Accelerator):
            return NotImplemented
        return (self.pci, self.vendor, self.partition) == (
            other.pci,
            other.vendor,
            other.partition,
        )

    def __hash__(self) -> int:
        return hash((self.pci, self.vendor, self.partition))

    @property
    def where(self) -> str:
        """``0000:05:00.0`` or, for a compute partition, ``0000:05:00.0 partition 3``."""
        return self.pci if self.partition is None else f"{self.pci} partition {self.partition}"

    @property
    def model(self) -> str:
        """What to compare when asking 'are these GPUs the same model?'."""
        return self.name or f"{self.vendor_id or 0:04x}:{self.device_id or 0:04x}"


class KfdNode(Record):
    """One GPU agent of a partition topology (AMD's KFD, ``topology/nodes/<node>``): the
    node's number (the runtime enumerates agents in this order), the PCI address of the
    GPU it is or belongs to, without the function (a compute partition has no address of
    its own: its ``location_id`` is its GPU's with the partition in the function bits),
    and its DRM render node."""

    node: int
    slot: str  # "0000:05:00": its GPU's PCI domain, bus and device
    render_minor: int | None = None


class NicPort(Record):
    """One port of an RDMA adapter (``/sys/class/infiniband/<dev>/ports/<n>``): its state as
    the kernel names it (``ACTIVE``, ``DOWN``, ``INIT``, ``ARMED``), its rate in Gb/s, its
    link layer (``InfiniBand``; ``Ethernet`` for RoCE) and the network interface its RoCE
    addresses belong to.  None where the source does not say (an hwloc export has states
    but no rates)."""

    number: int
    state: str | None = None
    rate: float | None = None
    link_layer: str | None = None
    netdev: str | None = None

    @property
    def active(self) -> bool:
        """The port passes traffic (only ``ACTIVE`` does: ``INIT``/``ARMED`` have no
        subnet manager yet, ``DOWN`` no link)."""
        return self.state == "ACTIVE"


class Nic(Record):
    """A network adapter a rank may use for RDMA (``show --matrix`` places it beside the
    GPUs): its PCI address, its RDMA device name where the kernel or hwloc gives one, and
    its locality.

    ``kind`` says what it is: ``rdma`` (an RDMA device: what transports are told to use),
    ``pci`` (a network function seen by its PCI class only, no RDMA device readable) or
    ``netdev`` (a plain network interface on PCI without RDMA: listed, never chosen).
    ``bond`` names the bond an RDMA device carries (RoCE LAG: ``mlx5_bond_0`` over
    ``bond0``, whose ``members`` are the bonded interfaces); ``member_of`` the bond an
    adapter's own interface is enslaved to (its bond is the adapter; it is never offered
    alone).  ``speed`` is its interface's speed in Gb/s (a bond's: what the bond reports,
    which an RDMA port of a bond may understate)."""

    pci: str
    name: str | None = None
    numa_node: int | None = None
    local_cpus: frozenset[int] | None = None
    kind: str = "rdma"
    ports: tuple[NicPort, ...] = ()
    netdevs: tuple[str, ...] = ()
    bond: str | None = None
    members: tuple[str, ...] = ()
    member_of: str | None = None
    speed: float | None = None


class NicChoice(Record):
    """An RDMA adapter port chosen for a rank (``Plan.nics``, :func:`numabind.nics_for`):
    the device and port as transports name them (``mlx5_0`` port ``1``: UCX's
    ``mlx5_0:1``), its PCI address, its relation to the rank's GPU in ``nvidia-smi topo
    -m`` terms (``PIX``, ``PXB``, ``PHB``, ``NODE``, ``SYS``; a trailing ``*`` when the PCI
    tree was not readable and only the NUMA nodes told), its rate in Gb/s (None:
    unknown), its link layer, and how many of the machine's GPUs were given it."""

    name: str
    port: int
    pci: str
    relation: str
    rate: float | None = None
    link_layer: str | None = None
    sharing: int = 1

    @property
    def label(self) -> str:
        """``mlx5_0:1``: device and port, as UCX and NVSHMEM write them."""
        return f"{self.name}:{self.port}"


# the transports NUMABIND_NIC may name (their variables: numabind._transports.TRANSPORTS)
NIC_TRANSPORTS: tuple[str, ...] = (
    "ucx",
    "nvshmem",
    "nixl",
    "uccl",
    "mooncake",
    "nccl",
    "vllm",
)
# NUMABIND_NIC_MODE: how ranks share the adapters nearest to their GPUs
NIC_MODES: tuple[str, ...] = ("nearest", "exclusive")


# --- vocabulary: core kinds (which cores are faster: NUMABIND_PRIORITY) -------------------------


class KindFile(Record):
    """A per-CPU file that can tell a machine's cores apart by speed, readable by any user
    (``/dev/isst_interface`` and MSRs need root; these do not): its path under
    ``/sys/devices/system/cpu/cpuN/``, and what a difference in it means.  A higher value
    is a faster (more preferred) core in every row.  ``ranked``: the file orders the cores
    (one value per core) rather than naming kinds, so its values are split at the gap that
    stands out (:meth:`CoreKinds.kinds`), not taken one kind per value."""

    path: str
    means: str
    ranked: bool = False


# In the order they are tried: the first file whose values differ between the online CPUs
# decides the machine's kinds (the ones before it said nothing, the ones after are not read).
KIND_FILES: tuple[KindFile, ...] = (
    KindFile(
        path="acpi_cppc/highest_perf",
        means="ACPI CPPC highest performance (ITMT, Turbo Boost Max 3.0, Priority Core Turbo)",
    ),
    KindFile(path="acpi_cppc/nominal_perf", means="ACPI CPPC nominal performance"),
    KindFile(
        path="cpufreq/amd_pstate_prefcore_ranking",
        means="AMD preferred-core ranking (amd-pstate)",
        ranked=True,
    ),
    KindFile(path="cpufreq/amd_pstate_highest_perf", means="AMD highest performance (amd-pstate)"),
    KindFile(
        path="cpufreq/base_frequency",
        means="base frequency (Intel SST-BF high-priority cores run at a higher one)",
    ),
    KindFile(path="cpufreq/cpuinfo_max_freq", means="maximum frequency"),
    KindFile(path="cpu_capacity", means="Arm CPU capacity (big and little cores)"),
)
HWLOC_KINDS = "hwloc cpukinds"  # the source of kinds read from an hwloc XML export
RANKED_FILES = frozenset(k.path for k in KIND_FILES if k.ranked)
# a ranking's values split where the widest step between neighbours is at least this many
# times every other step: a group that stands out (AMD: 8 cores per package far above the
# rest); a ranking without one keeps its first value alone as the priority kind
RANKING_GAP = 2
MAX_KIND_VALUE = 1 << 40  # larger than any frequency in kHz or CPPC performance value


class CoreKinds(Record):
    """How the machine's CPUs differ in speed, and which file said so.

    ``levels`` are (value, CPUs) pairs, fastest first: the distinct values of ``source``
    (a ``KIND_FILES`` path, or ``HWLOC_KINDS``) with the CPUs that have each.  A
    machine whose files do not tell its CPUs apart has one level and no ``source``: one
    kind, said once rather than guessed.  ``looked`` lists what was read to decide, for
    the line that says so."""

    source: str = ""
    levels: tuple[tuple[int, frozenset[int]], ...] = ()
    looked: tuple[str, ...] = ()

    @property
    def distinct(self) -> bool:
        """Whether any file told the CPUs apart."""
        return bool(self.source) and len(self.levels) > 1

    def within(self, cpus: frozenset[int]) -> tuple[tuple[int, frozenset[int]], ...]:
        """The levels that ``cpus`` hold, each cut to ``cpus``, fastest first."""
        return tuple((v, c & cpus) for v, c in self.levels if c & cpus)

    def kinds(self, cpus: frozenset[int]) -> tuple[tuple[int, int, frozenset[int]], ...]:
        """The kinds of core that ``cpus`` (a node's) hold, fastest first, as (highest
        value, lowest value, CPUs): one per level; but a ranking (``KindFile.ranked``: one
        value per core) is an order, not kinds, so where one step between its values
        stands out (``RANKING_GAP`` times every other step) it is split there into two
        kinds, the group above the gap and the rest.  Taken one kind per value, the node's
        priority kind would be its single best core, and all its ranks' main threads
        would share it."""
        found = self.within(cpus)
        plain = tuple((v, v, c) for v, c in found)
        if self.source not in RANKED_FILES or len(found) <= 2:
            return plain
        steps = [found[i][0] - found[i + 1][0] for i in range(len(found) - 1)]
        widest = max(steps)
        cut = steps.index(widest) + 1
        if any(RANKING_GAP * s > widest for i, s in enumerate(steps) if i != cut - 1):
            return plain  # no step stands out: the ranking's first value alone leads
        head, tail = found[:cut], found[cut:]
        return tuple(
            (part[0][0], part[-1][0], frozenset().union(*(c for _, c in part)))
            for part in (head, tail)
        )

    def priority(self, cpus: frozenset[int]) -> frozenset[int]:
        """The priority CPUs among ``cpus`` (a node's): those of the fastest kind that
        ``cpus`` hold (:meth:`kinds`), when ``cpus`` hold more than one; else none (the
        cores of that set are one kind)."""
        found = self.kinds(cpus)
        return found[0][2] if len(found) > 1 else frozenset()


if TYPE_CHECKING:
    from typing import Literal

    AllowedKind = Literal["cgroup-v1", "cgroup-v2", "hwloc", "online"]


class Allowed(Record):
    """The CPUs and memory nodes this process may use, and where that answer came from.

    ``kind`` says which: a cgroup v1 or v2 cpuset (``directory`` is the cgroup directory
    read), an hwloc export's allowed sets, or ``online`` when no cpuset could be read
    (``problem`` then says why when one exists but was unreadable)."""

    cpus: frozenset[int]
    mems: frozenset[int] | None
    kind: AllowedKind
    directory: str | None = None
    problem: str | None = None

    @property
    def source(self) -> str:
        """One human line: where ``cpus`` came from."""
        if self.kind == "cgroup-v1":
            return f"cgroup v1 cpuset {self.directory}"
        if self.kind == "cgroup-v2":
            return f"cgroup v2 {self.directory}"
        if self.kind == "hwloc":
            return "hwloc allowed_cpuset/allowed_nodeset"
        if self.problem:
            return f"all online CPUs ({self.problem})"
        return "all online CPUs (no cgroup cpuset is mounted or enabled)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "cpus": sorted(self.cpus),
            "mems": sorted(self.mems) if self.mems is not None else None,
            "kind": self.kind,
            "directory": self.directory,
            "problem": self.problem,
            "source": self.source,
        }


# --- vocabulary: packages split into several NUMA nodes -----------------------------------------


class SubNuma(Record):
    """What a CPU vendor calls a package split into several NUMA nodes, how its mode is
    written (``{n}``: nodes per package), and the BIOS setting that makes it (``show`` and
    ``doctor`` name them)."""

    vendor: str
    node: str  # one node of a split package
    mode: str
    bios: str
    counts: tuple[int, ...] = ()  # the split sizes the vendor's mode names exist for


SUBNUMA_TABLE: tuple[SubNuma, ...] = (
    SubNuma(
        vendor="intel",
        node="sub-NUMA cluster",
        mode="SNC{n}",
        bios="the BIOS's Sub-NUMA Clustering (SNC) setting (disabled: one node per package)",
        counts=(2, 3, 4, 6),
    ),
    SubNuma(
        vendor="amd",
        node="NUMA node",
        mode="NPS{n}",
        bios="the BIOS's NUMA nodes per socket (NPS) setting (NPS1: one node per socket)",
        counts=(2, 4),
    ),
)
SUBNUMA = {row.vendor: row for row in SUBNUMA_TABLE}
SUBNUMA_OTHER = SubNuma(
    vendor="",
    node="NUMA node",
    mode="",
    bios="the BIOS's setting that splits a package into several NUMA nodes (Intel SNC, AMD NPS)",
)


# --- vocabulary: accelerator vendors -----------------------------------------------------------
# One Vendor row per vendor says how to recognise its compute devices on PCI, which
# environment variables select its devices and in what grammar, where its driver publishes
# a device's UUID and its GPU-memory NUMA node, what an hwloc export calls its UUID, and
# which optional runtime library (and torch device type) answers what files cannot.

if TYPE_CHECKING:
    Grammar = Literal["cuda", "rocm", "level-zero"]


class Visibility(Record):
    """One variable that selects devices, and how its tokens read.

    Grammars: ``cuda`` (indices, ``GPU-<uuid>`` prefixes, ``MIG-<uuid>`` and the legacy
    ``MIG-GPU-<uuid>/<gi>/<ci>``); ``rocm`` (indices and ``GPU-<unique id>``); ``level-zero``
    (indices and ``<device>.<sub-device>``).  A vendor's variables apply in the order of
    its row, each renumbering what the ones before it left (HIP_VISIBLE_DEVICES selects
    among what ROCR_VISIBLE_DEVICES left); ``fallback_for`` names a variable this one is
    read only without (ROCm reads CUDA_VISIBLE_DEVICES only where HIP_VISIBLE_DEVICES is
    unset)."""

    variable: str
    grammar: Grammar
    fallback_for: str | None = None


class HostRegisterApi(Record):
    """How a vendor's driver page-locks host memory and maps it for DMA (``host_buffer(...,
    register=...)``, :mod:`numabind.memory._driver`): the library (first soname that loads), its
    C functions by role, the flag that makes a registration visible to every context,
    and how a device is made current around the call: ``primary-context`` (the CUDA
    driver API: the device's primary context pushed, then popped) or ``current-device``
    (HIP: the caller's device set back after).  ``copies`` are the calls ``numabind
    bench`` times pinned copies with (device memory, a stream, the two asynchronous
    copies, a stream wait): the two vendors' calls have the same shapes, so one code path
    drives both."""

    name: str  # what messages and HostBuffer.registered_with say
    sonames: tuple[str, ...]
    init: str
    register: str
    unregister: str
    error_name: str
    device_by_index: str
    device_by_pci: str
    portable: int
    context: str  # "primary-context" or "current-device"
    functions: tuple[tuple[str, str], ...] = ()  # the context calls, by role
    # the copy calls, by role: alloc(&dptr, n), free(dptr), stream(&s, flags),
    # stream_destroy(s), h2d(dptr, host, n, s), d2h(host, dptr, n, s), sync(s)
    copies: tuple[tuple[str, str], ...] = ()


CUDA_DRIVER = HostRegisterApi(
    name="CUDA driver",
    sonames=("libcuda.so.1",),
    init="cuInit",
    register="cuMemHostRegister_v2",
    unregister="cuMemHostUnregister",
    error_name="cuGetErrorName",
    device_by_index="cuDeviceGet",
    device_by_pci="cuDeviceGetByPCIBusId",
    portable=0x01,  # CU_MEMHOSTREGISTER_PORTABLE
    context="primary-context",
    functions=(
        ("retain", "cuDevicePrimaryCtxRetain"),
        ("release", "cuDevicePrimaryCtxRelease_v2"),
        ("push", "cuCtxPushCurrent_v2"),
        ("pop", "cuCtxPopCurrent_v2"),
    ),
    copies=(
        ("alloc", "cuMemAlloc_v2"),
        ("free", "cuMemFree_v2"),
        ("stream", "cuStreamCreate"),
        ("stream_destroy", "cuStreamDestroy_v2"),
        ("h2d", "cuMemcpyHtoDAsync_v2"),
        ("d2h", "cuMemcpyDtoHAsync_v2"),
        ("sync", "cuStreamSynchronize"),
    ),
)
HIP_RUNTIME = HostRegisterApi(
    name="HIP runtime",
    sonames=("libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"),
    init="hipInit",
    register="hipHostRegister",
    unregister="hipHostUnregister",
    error_name="hipGetErrorName",
    device_by_index="",  # HIP devices are their ordinals
    device_by_pci="hipDeviceGetByPCIBusId",
    portable=0x01,  # hipHostRegisterPortable
    context="current-device",
    functions=(("get", "hipGetDevice"), ("set", "hipSetDevice")),
    copies=(
        ("alloc", "hipMalloc"),
        ("free", "hipFree"),
        ("stream", "hipStreamCreateWithFlags"),
        ("stream_destroy", "hipStreamDestroy"),
        ("h2d", "hipMemcpyHtoDAsync"),
        ("d2h", "hipMemcpyDtoHAsync"),
        ("sync", "hipStreamSynchronize"),
    ),
)


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
    # the driver directory's per-GPU files: "key: value" lines; which key holds what
    driver_info_file: str | None = None
    driver_info_keys: tuple[tuple[str, str], ...] = ()  # (Accelerator field, driver's key)
    driver_numa_file: str | None = None  # the GPU-memory node, as "<key>: <node>" lines
    driver_numa_key: str | None = None
    torch_module: str | None = None  # the torch module whose set_device selects its devices
    host_register: HostRegisterApi | None = None  # how its driver registers host memory
    # the variable that makes the runtime number devices in PCI order, and its value (CUDA
    # numbers the fastest first by default: indices then need not follow PCI order)
    device_order: tuple[str, str] | None = None
    # where the runtime's devices are listed one per compute partition, in its order (AMD:
    # the KFD topology, which ROCr enumerates node by node), and the PCI attributes naming
    # a GPU's compute and memory partition modes
    partition_topology: str | None = None
    partition_files: tuple[str, str] | None = None

    @property
    def numbers_by_minor(self) -> bool:
        """The driver names each device by a minor number (what Slurm's GPU gres list)."""
        return any(field == "minor" for field, _ in self.driver_info_keys)

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
    driver_info_file="information",
    driver_info_keys=(("uuid", "GPU UUID"), ("name", "Model"), ("minor", "Device Minor")),
    driver_numa_file="numa_status",
    driver_numa_key="Node",
    torch_module="torch.cuda",
    host_register=CUDA_DRIVER,
    device_order=("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
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
        Visibility(variable="HIP_VISIBLE_DEVICES", grammar="rocm"),
        Visibility(
            variable="CUDA_VISIBLE_DEVICES", grammar="rocm", fallback_for="HIP_VISIBLE_DEVICES"
        ),
    ),
    # amdgpu's unique_id is the hex id ROCm prints as "GPU-<id>" (rocminfo, rocm-smi)
    uuid_file="unique_id",
    uuid_prefix="GPU-",
    driver_dir=None,
    runtime=None,
    hwloc_uuid_key="AMDUUID",
    torch_module="torch.cuda",  # ROCm builds of torch select HIP devices through torch.cuda
    host_register=HIP_RUNTIME,
    partition_topology="/sys/class/kfd/kfd/topology/nodes",
    partition_files=("current_compute_partition", "current_memory_partition"),
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
    torch_module="torch.xpu",
)

VENDORS: tuple[Vendor, ...] = (NVIDIA, AMD, INTEL)  # also the order tried with no variable
BY_KEY = {v.key: v for v in VENDORS}
BY_PCI = {v.pci_vendor: v for v in VENDORS}
HWLOC_UUID_KEYS: tuple[str, ...] = tuple(v.hwloc_uuid_key for v in VENDORS if v.hwloc_uuid_key)
VISIBILITY_VARIABLES: tuple[str, ...] = tuple(
    dict.fromkeys(vis.variable for v in VENDORS for vis in v.visibility)
)


# PCI classes of compute devices: a function of one of these classes from a vendor that is
# not in VENDORS is an accelerator numabind sees but does not handle (``numabind doctor``
# names it rather than ignore it without a word)
COMPUTE_CLASSES: dict[int, str] = {
    0x0302: "3D controller",
    0x0380: "display controller",
    0x0B40: "co-processor",
    0x1200: "processing accelerator",
}
# what the PCI vendor ids of accelerators numabind does not handle are (for the message)
OTHER_ACCELERATOR_VENDORS: dict[int, str] = {
    0x1BCF: "NEC SX-Aurora Vector Engine",
    0x1DA3: "Habana Gaudi",
    0x1D0F: "AWS Inferentia/Trainium",
    0x1AE0: "Google TPU",
    0x1E52: "Tenstorrent",
    0x1E0F: "Graphcore IPU",
    0x1F0A: "Cerebras",
}


class OtherDevice(Record):
    """A compute-class PCI function of a vendor numabind has no table row for."""

    pci: str
    vendor_id: int
    device_id: int | None
    pci_class: int
    numa_node: int | None = None

    def label(self) -> str:
        known = OTHER_ACCELERATOR_VENDORS.get(self.vendor_id)
        kind = COMPUTE_CLASSES.get(self.pci_class >> 8, f"class {self.pci_class:06x}")
        ids = f"{self.vendor_id:04x}:{self.device_id or 0:04x}"
        return f"{known} ({kind}, {ids})" if known else f"{kind} {ids}"


def unhandled(vendor_id: int | None, pci_class: int | None) -> bool:
    """A compute-class function whose vendor numabind does not know (:data:`VENDORS`)."""
    return (
        vendor_id is not None
        and vendor_id not in BY_PCI
        and pci_class is not None
        and pci_class >> 8 in COMPUTE_CLASSES
    )


def uuid_matches(token: str, uuids: Iterable[tuple[str | None, T]]) -> list[T]:
    """The items whose UUID starts with ``token`` (case-insensitive): the one rule for
    naming a device by UUID, where a prefix is enough only when exactly one item has it
    (callers refuse an ambiguous prefix rather than take the first)."""
    want = token.strip().lower()
    if not want:
        return []
    return [item for uuid, item in uuids if uuid and uuid.lower().startswith(want)]


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


# --- vocabulary: memory policies ---------------------------------------------------------------


class MemoryPolicy(Record):
    """One memory policy: what users write (``NUMABIND_MEMORY``, ``--memory``, the
    registry), the kernel's MPOL code, how ``/proc/PID/numa_maps`` spells it, what it
    means, the first kernel that has it and the policy to use before that, and the policy
    ``mbind(MPOL_MF_MOVE)`` moves a rank's pages with under it."""

    name: str
    code: int | None  # MPOL_*; None: numabind sets no policy
    numa_maps: str | None  # numa_maps' spelling (the word before ':nodes'); None: never shown
    help: str
    user: bool = True  # a value users may ask for (preferred-many is the planner's choice)
    min_kernel: tuple[int, int] | None = None
    fallback: str | None = None
    migrate_as: str | None = None  # None: pages are not moved under it
    task: bool = True  # a task policy the kernel's NUMA balancing does not scan
    # the kernel's fallback for it, once its nodes are full, is any node (GPU memory and far
    # memory included), and MPOL_BIND over the nodes a rank may spill onto, nearest first,
    # has the same first choices: under NUMABIND_SPILL=cpu the kernel gets that instead
    # (Placement.kernel_policy).  interleave falls back anywhere too, and no policy keeps
    # its round-robin while keeping nodes out
    spill_by_bind: bool = False


MEMORY_POLICY_TABLE: tuple[MemoryPolicy, ...] = (
    MemoryPolicy(
        name="preferred",
        spill_by_bind=True,
        code=1,
        numa_maps="prefer",
        help="allocate on the GPU's node, spill to others when it is full (default)",
        migrate_as="bind",
    ),
    MemoryPolicy(
        name="bind",
        code=2,
        numa_maps="bind",
        help="only the GPU's node (MPOL_BIND: an allocation that does not fit fails)",
        migrate_as="bind",
    ),
    MemoryPolicy(
        name="interleave",
        code=3,
        numa_maps="interleave",
        help="spread pages round-robin over the plan's nodes",
        migrate_as="interleave",
    ),
    MemoryPolicy(
        name="local",
        spill_by_bind=True,
        code=4,
        numa_maps="local",
        help="allocate on the node of the CPU that touches the page first",
        migrate_as="bind",
        task=False,
    ),
    MemoryPolicy(
        name="none",
        code=None,
        numa_maps=None,
        help="leave the memory policy alone (CPUs only)",
        task=False,
    ),
    MemoryPolicy(
        name="preferred-many",
        spill_by_bind=True,
        code=5,
        numa_maps="prefer_many",  # written "prefer (many)": see parse_numa_maps_policy
        help="prefer every node of the plan (socket mode; the planner chooses it)",
        user=False,
        min_kernel=(5, 15),
        fallback="preferred",
        migrate_as="bind",
    ),
    MemoryPolicy(
        name="default",
        code=0,
        numa_maps="default",
        help="the kernel's default: the node of the CPU that touches the page first",
        user=False,
        task=False,
    ),
)
POLICIES = {p.name: p for p in MEMORY_POLICY_TABLE}


class Spill(Record):
    """``NUMABIND_SPILL``, parsed once (``_environ.parse_spill``): where a rank's memory
    may go once the nodes of its plan are full.  ``cpu``: the other CPU-memory nodes
    this process may use (nearest first, by the kernel's distance order), and then the
    allocation fails (the default); ``anywhere``: the kernel's own fallback, every node
    including a GPU's memory and far memory; ``nodes``: nodes the user names, which the
    rank may spill onto besides (or, without ``cpu``, instead of) CPU memory.
    ``str()`` is the canonical text (``cpu``, ``any``, ``cpu,4``, ``2-3``)."""

    cpu: bool = True
    anywhere: bool = False
    nodes: frozenset[int] = frozenset()

    def __str__(self) -> str:
        if self.anywhere:
            return "any"
        words = ["cpu"] if self.cpu else []
        if self.nodes:
            words.append(_nodelist(self.nodes))
        return ",".join(words)


def _nodelist(nodes: frozenset[int]) -> str:
    """``0-2,5`` (the kernel's list form; _sysfs has the same, but the model is a leaf)."""
    out: list[str] = []
    run: list[int] = []
    for n in sorted(nodes):
        if run and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [n]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


SPILL_CPU = Spill()
SPILL_ANY = Spill(cpu=False, anywhere=True)
USER_POLICIES: tuple[str, ...] = tuple(p.name for p in MEMORY_POLICY_TABLE if p.user)
POLICY_BY_CODE = {p.code: p for p in MEMORY_POLICY_TABLE if p.code is not None}
POLICY_BY_NUMA_MAPS = {p.numa_maps: p for p in MEMORY_POLICY_TABLE if p.numa_maps}
# what a registry entry may say: a policy a plan sets, or that the calls were refused
NOT_PERMITTED = "not-permitted"
REGISTRY_POLICIES = frozenset(
    {p.name for p in MEMORY_POLICY_TABLE if p.name != "default"} | {NOT_PERMITTED}
)


def parse_numa_maps_policy(fields: list[str]) -> tuple[str, str]:
    """The policy field of a ``/proc/PID/numa_maps`` line (``fields`` split on spaces):
    ``mode[=flags][:nodes]``, the mode in numa_maps' spelling; the kernel writes
    MPOL_PREFERRED_MANY as ``prefer (many)``, with a space, so it spans two fields.
    Returns (numabind's name of the policy, the node list text)."""
    word = fields[1] if len(fields) > 1 else "default"
    if len(fields) > 2 and fields[2].startswith("(many)"):
        word = "prefer_many" + fields[2][len("(many)") :]
    head, _, nodes = word.partition(":")
    spelled = head.split("=", 1)[0]
    found = POLICY_BY_NUMA_MAPS.get(spelled)
    return (found.name if found is not None else spelled), nodes


# --- vocabulary: rank variables ----------------------------------------------------------------


class RankVariable(Record):
    """A variable a launcher sets to a process's local rank, in priority order, with the
    variables that give the local world size, who writes it, and a variable that must be
    present too for it to name a rank (``SLURM_LOCALID`` names a task only inside a job
    step: a batch script has it without ``SLURM_STEP_ID``)."""

    name: str
    sizes: tuple[str, ...]
    launcher: str
    requires: str | None = None


# one row per name of _numabind_base.RANK_NAMES (the names' home: the warm start tests them
# before numabind is loaded), in its order
RANK_VARIABLES: tuple[RankVariable, ...] = tuple(
    RankVariable(name=name, sizes=sizes, launcher=launcher, requires=requires)
    for name, (sizes, launcher, requires) in zip(
        _numabind_base.RANK_NAMES,
        (
            (
                ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"),
                "torchrun, accelerate, DeepSpeed, Ray Train",
                None,
            ),
            (("OMPI_COMM_WORLD_LOCAL_SIZE",), "Open MPI", None),
            (("MPI_LOCALNRANKS",), "MPICH (Hydra)", None),
            (("MV2_COMM_WORLD_LOCAL_SIZE",), "MVAPICH2", None),
            (("PALS_LOCAL_SIZE",), "HPE PALS", None),
            ((), "Slurm srun", "SLURM_STEP_ID"),
        ),
        strict=True,
    )
)
RANK_VARIABLE_NAMES: tuple[str, ...] = tuple(v.name for v in RANK_VARIABLES)
SIZE_VARIABLE_NAMES: tuple[str, ...] = tuple(s for v in RANK_VARIABLES for s in v.sizes)
# a rank's global rank, first found wins (torchrun's RANK before the srun task id of an
# agent that started it)
GLOBAL_RANK_VARIABLES: tuple[str, ...] = (
    "RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "PMIX_RANK",
    "SLURM_PROCID",
)
# who a rank is in a Slurm job (``check --job``): what each variable of its initial
# environment tells
JOB_VARIABLES: dict[str, str] = {
    "host": "SLURMD_NODENAME",
    "job": "SLURM_JOB_ID",
    "step": "SLURM_STEP_ID",
    "step_nodes": "SLURM_STEP_NODELIST",
    "step_tasks": "SLURM_STEP_TASKS_PER_NODE",
    "job_nodes": "SLURM_JOB_NODELIST",
}


# --- vocabulary: device files (which GPU a process holds open) ---------------------------------


class DeviceFile(Record):
    """A character device through which a process uses an accelerator: ``check`` tells a
    rank's GPU from the handles it holds open (``stat`` of /proc/PID/fd), mapping the
    minor number to a PCI address by ``lookup``: ``minor`` (the driver's "Device Minor"
    of each GPU) or ``drm`` (/sys/class/drm/<name>/device names the PCI function)."""

    vendor: str  # a Vendor key
    major: int
    minors: tuple[int, int]  # first and last minor that are GPUs (others: control nodes)
    name: str  # the device's name, ``{n}`` the minor
    lookup: str


DEVICE_FILES: tuple[DeviceFile, ...] = (
    DeviceFile(vendor="nvidia", major=195, minors=(0, 254), name="nvidia{n}", lookup="minor"),
    DeviceFile(vendor="amd", major=226, minors=(128, 255), name="renderD{n}", lookup="drm"),
)


# --- vocabulary: binding modes -----------------------------------------------------------------


class Mode(Record):
    """A binding mode: which of the GPU's node's CPUs a rank gets (the planner holds one
    small function per mode, checked against this table)."""

    name: str
    help: str


MODE_TABLE: tuple[Mode, ...] = (
    Mode(name="node", help="every CPU of the GPU's NUMA node (default)"),
    Mode(name="socket", help="every CPU of the GPU's package (all its NUMA nodes)"),
    Mode(
        name="exclusive",
        help="the GPU's node split into disjoint sets of whole cores, one per rank",
    ),
    Mode(name="core-complex", help="one cache domain (L3 / CCX) of the GPU's node per rank"),
)
MODE_NAMES: tuple[str, ...] = tuple(m.name for m in MODE_TABLE)


# --- vocabulary: core roles (NUMABIND_RESERVE, NUMABIND_SMT) ------------------------------------

# how many hardware threads of each core a rank's compute set holds
SMT_LEVELS: tuple[str, ...] = ("all", "1")
# what the n of NUMABIND_RESERVE=n/<scope> counts: cores per node, or per local rank on it
RESERVE_SCOPES: tuple[str, ...] = ("node", "rank")


class Reserve(Record):
    """NUMABIND_RESERVE, parsed once (``_environ.parse_reserve``): ``count`` physical
    cores kept out of the compute sets per node (``scope="node"``) or per local rank on it
    (``"rank"``), for the system and the ranks' helpers.  A count of 0 reserves nothing and
    is false; ``str()`` is the canonical text (``2/node``; empty for none)."""

    count: int = 0
    scope: str = "node"

    def __bool__(self) -> bool:
        return self.count > 0

    def __str__(self) -> str:
        return f"{self.count}/{self.scope}" if self.count > 0 else ""


NO_RESERVE = Reserve()
# NUMABIND_OMP_PLACES: off, or the OMP_PLACES value numabind sets (with OMP_PROC_BIND=close)
OMP_PLACES_VALUES: tuple[str, ...] = ("off", "cores", "threads")
# what it sets besides OMP_PLACES: the binding OpenMP documents for a pool that fills a
# rank's cores from the first place on
OMP_PROC_BIND = "close"
# the values numabind writes into an affinity variable (the registry accepts only these)
PLACES_WORDS: tuple[str, ...] = (*OMP_PLACES_VALUES[1:], OMP_PROC_BIND)
# what a thread (or helper process) of a rank is, told by the name it gives itself: the
# first row whose word is in the name (case-insensitive) wins; "main" is the process's
# first thread, "other" a name no row knows (OpenMP and BLAS workers have no name of
# their own: they keep the interpreter's)
THREAD_ROLES: tuple[tuple[str, str], ...] = (
    ("dataloader worker", "pt_data_worker"),
    ("pin", "pt_data_pin"),
    ("nccl", "nccl"),
    ("torch", "pt_"),
)
HELPER_PROCESS_ROLES: tuple[str, ...] = ("dataloader worker",)  # may run on reserved cores
# who moves threads off a binding (thread names, variables, sched_ext): numabind._binders;
# NUMABIND_BINDERS: off, or keep (turn off the pinning of the libraries that have a switch)
BINDERS_MODES: tuple[str, ...] = ("off", "keep")


# NUMABIND_PRIORITY: what the priority cores (the node's fastest kind, CoreKinds) are for:
# off; rank (each rank's compute set is its share of them); main (only the thread that
# launches GPU work goes on one, what it starts gets the rank's whole set)
PRIORITY_ROLES: tuple[str, ...] = ("off", "rank", "main")

# NUMABIND_WORKERS: where a rank's DataLoader workers run (numabind.torch)
WORKER_PLACEMENTS: tuple[str, ...] = ("share", "spread", "reserved")
