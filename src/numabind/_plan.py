"""The plan: which CPUs and memory nodes one local rank should use, and why.

:func:`plan` is a pure function of a :class:`~numabind._topology.Machine` (read lazily,
but a value once read) and a :class:`Request` (rank and visible devices, already resolved
from the environment).  It reads no environment and makes no system call, it never raises,
and every decision is a structured field (``Plan.skip``, ``NodeChoice.how``) from which
the one line in ``Plan.reason`` is derived; code decides on the fields, never on the text.

The binding modes are one small function each (:data:`MODES`, named by the vocabulary in
:data:`numabind._model.MODE_TABLE`).  Who shares a node is computed arithmetically from the
local world size (:func:`peers_on_node`, :func:`spread_block`), never by looping over the
ranks: a ``LOCAL_WORLD_SIZE`` of any size costs what the machine's own sizes cost.
"""

from __future__ import annotations

from . import _sysfs
from ._model import (
    BY_KEY,
    MODE_NAMES,
    NO_RESERVE,
    POLICIES,
    PRIORITY_ROLES,
    RESERVE_SCOPES,
    SMT_LEVELS,
    SPILL_ANY,
    SPILL_CPU,
    SUBNUMA,
    SUBNUMA_OTHER,
    USER_POLICIES,
    Accelerator,
    NicChoice,
    Record,
    Reserve,
    Spill,
    SubNuma,
)

# The planner turns an exception it did not foresee into a skip with the reason: a
# capture nobody anticipated must not break a process.  The tests set this (conftest.py)
# so that a bug in the planner fails them instead of hiding behind that skip.
RAISE = False

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any, Literal

    from ._devices import Visible
    from ._environ import Config, RankInfo
    from ._topology import Machine

    SkipKind = Literal[
        "one-node",  # nothing to bind: one NUMA node with CPUs
        "no-accelerator",  # no device and no local world size to spread a CPU-only job
        "bad-input",  # a garbled variable, an unknown device, a bad mode
        "cgroup",  # the cpuset forbids every CPU of the device's node
        "unknown-node",  # the device's node cannot be told
        "machine",  # the machine data is unusable
    ]
    NodeHow = Literal[
        "numa_node",
        "local_cpus_inside",
        "local_cpus_match",
        "local_cpus_span",
        "one-node",
        "unknown",
    ]

# the words of SkipKind, at run time: why a plan does not bind (the exporter's ``reason``)
SKIP_KINDS: tuple[SkipKind, ...] = (
    "one-node",
    "no-accelerator",
    "bad-input",
    "cgroup",
    "unknown-node",
    "machine",
)
MEMORY_POLICIES = USER_POLICIES
fmt = _sysfs.format_cpulist


class Request(Record):
    """What to plan for: a local rank, the devices its runtime sees, and how to bind."""

    local_rank: int | None
    local_world_size: int | None = None
    rank_source: str | None = None
    visible: Visible | None = None
    mode: str = "node"
    memory: str = "preferred"
    problem: str | None = None
    size_source: str | None = None
    notes: tuple[str, ...] = ()
    device: Accelerator | None = None  # chosen by an argument (apply(device=...)), not by rank
    # compute the thread budget (in node mode the only use of the other devices' nodes):
    # the startup hook asks for it only with NUMABIND_THREADS set, and reads their files
    # only then
    budget: bool = True
    reserve: Reserve = NO_RESERVE  # NUMABIND_RESERVE, parsed
    smt: str = "all"  # NUMABIND_SMT: "all" or "1" (one hardware thread per core)
    spill: Spill = SPILL_CPU  # NUMABIND_SPILL: where memory goes once the plan's nodes are full
    # a process that drives several devices (apply(devices=...), NUMABIND_DEVICES): their
    # union is planned (see plan_devices); empty: one device, picked by rank or argument
    devices: tuple[Accelerator, ...] = ()
    # NUMABIND_PRIORITY: "off", "rank" (the compute set is the rank's share of its node's
    # priority cores) or "main" (only the calling thread goes on one)
    priority: str = "off"
    # the RDMA adapters for the device's ranks (numabind._nics): "" plans none (the
    # startup hook asks only with NUMABIND_NIC set, and reads no adapter otherwise),
    # else NUMABIND_NIC_MODE's word; nic_min_rate is NUMABIND_NIC_MIN_RATE
    nic_mode: str = ""
    nic_min_rate: str = "auto"


def request_for(
    info: RankInfo,
    visible: Visible | None,
    mode: str,
    memory: str,
    *,
    reserve: Reserve = NO_RESERVE,
    smt: str = "all",
    priority: str = "off",
    spill: Spill = SPILL_CPU,
    nic_mode: str = "",
    nic_min_rate: str = "auto",
) -> Request:
    """The request for a rank found in an environment (:func:`numabind._environ.detect`)."""
    return Request(
        reserve=reserve,
        smt=smt,
        priority=priority,
        spill=spill,
        nic_mode=nic_mode,
        nic_min_rate=nic_min_rate,
        local_rank=info.local_rank,
        local_world_size=info.local_world_size,
        rank_source=info.rank_source,
        visible=visible,
        mode=mode,
        memory=memory,
        problem=info.problem,
        size_source=info.size_source,
        notes=info.notes,
    )


def request_from(
    info: RankInfo, visible: Visible | None, cfg: Config, *, nic: bool | None = None
) -> Request:
    """The request the NUMABIND_* knobs (``cfg``) make for a rank: the one place each
    planning knob goes from the configuration into a request, for the startup hook,
    ``check``'s plan of a rank that did not register and the adoption of a fast-path
    binding (a new knob is one line here).  ``nic``: plan its RDMA adapters (default:
    when NUMABIND_NIC asks)."""
    return request_for(
        info,
        visible,
        cfg.mode,
        cfg.memory,
        reserve=cfg.reserve,
        smt=cfg.smt,
        priority=cfg.priority,
        spill=cfg.spill,
        nic_mode=cfg.nic_mode if (bool(cfg.nic) if nic is None else nic) else "",
        nic_min_rate=cfg.nic_min_rate,
    )


def with_devices(
    request: Request,
    machine: Machine,
    specs: str | tuple[int | str, ...],
    source: str,
) -> Request:
    """``request`` for a process that asks to drive several devices (``specs``: ``all`` or
    what :func:`numabind._devices.find_devices` takes; ``source`` names who asked, for the
    plan's line): the devices found, or the problem that refuses them all."""
    from ._devices import Visible, find_devices

    visible = request.visible or Visible(devices=(), vendor=None, source="no device resolved")
    devices, why = find_devices(specs, visible, machine)
    if why is not None:
        return request.replace(problem=f"{source}: {why}")
    return request.replace(devices=devices, rank_source=source)


class NodeChoice(Record):
    """The CPU-bearing NUMA node next to a device, and how it was told.

    ``node`` None with ``locality`` set: the device's CPUs span several nodes and bind it
    to those CPUs.  ``inferred`` marks an answer read from the device's CPU locality
    rather than its ``numa_node`` (shown as such by ``numabind show``)."""

    node: int | None
    locality: frozenset[int] | None
    how: NodeHow

    @property
    def inferred(self) -> bool:
        return self.how.startswith("local_cpus")

    def describe(self) -> str:
        if self.how == "numa_node":
            return f"sysfs numa_node {self.node}"
        if self.how == "local_cpus_inside":
            return f"its local CPUs lie in node {self.node}"
        if self.how == "local_cpus_match":
            return f"its local CPUs match node {self.node}"
        if self.how == "local_cpus_span":
            return f"its local CPUs {fmt(self.locality or ())} span several nodes"
        if self.how == "one-node":
            return "the machine has one node with CPUs"
        return "unknown"


def device_node(machine: Machine, dev: Accelerator) -> NodeChoice:
    """Where a device is: the one rule, used by the planner, ``show`` and the SVG.

    ``numa_node`` from sysfs is the answer when it names a node with CPUs.  When it is
    unknown (-1) or names a memory-only node (GH200/GB200 report the GPU's memory node),
    the device's CPU locality decides: equal to, or inside, one node's CPUs identifies that
    node.  A locality narrower than the machine but spanning several nodes is returned as
    CPUs alone.  Distances are never used: on POWER9 every GPU memory node is at the same
    distance from every CPU node.
    """
    cpu_nodes = machine.cpu_nodes
    dev = machine.located(dev)
    if dev.numa_node is not None:
        n = machine.node(dev.numa_node)
        if n is not None and n.cpus:
            return NodeChoice(node=n.id, locality=None, how="numa_node")
    local = machine.local_cpus(dev)
    if local is not None:
        local = local & machine.online_cpus
    if local:
        inside = [n for n in cpu_nodes if local <= n.cpus]
        if len(inside) == 1:
            return NodeChoice(node=inside[0].id, locality=None, how="local_cpus_inside")
        if local != machine.online_cpus:
            covering = [n for n in cpu_nodes if n.cpus and n.cpus <= local]
            if len(covering) == 1:
                return NodeChoice(node=covering[0].id, locality=None, how="local_cpus_match")
            return NodeChoice(node=None, locality=local, how="local_cpus_span")
    if len(cpu_nodes) == 1:
        return NodeChoice(node=cpu_nodes[0].id, locality=None, how="one-node")
    return NodeChoice(node=None, locality=None, how="unknown")


def describe_device(dev: Accelerator, index: int | None) -> str:
    label = BY_KEY[dev.vendor].label if dev.vendor in BY_KEY else dev.vendor
    where = f"{dev.where}" if index is None else f"{index} ({dev.where})"
    return f"{label} {where}"


def nothing_to_bind(
    machine: Machine,
    mode: str,
    memory: str = "preferred",
    spill: Spill = SPILL_CPU,
    priority: str = "off",
) -> bool:
    """The one-node shortcut: with one node that has CPUs, node and socket modes have
    nothing to choose, so the startup hook need not even look at devices; unless
    NUMABIND_PRIORITY asks for the node's faster cores and its cores are of more than one
    kind (a one-socket workstation with Turbo Boost Max 3.0 has them).  Memory may still
    have something to keep out: a GH200's one CPU node falls back onto its GPU's memory
    node, and ``NUMABIND_SPILL=cpu`` keeps it off (:func:`spill_mask`)."""
    if len(machine.cpu_nodes) > 1 or mode not in ("node", "socket"):
        return False
    if priority != "off" and machine.core_kinds.distinct:
        return False
    found = POLICIES.get(memory)
    if found is None or not found.spill_by_bind or not machine.memory_only_ids:
        return True  # (the node list alone says there is no memory-only node: no more read)
    home = frozenset(n.id for n in machine.cpu_nodes)
    return not spill_mask(machine, home, memory, spill)[0]


def spill_mask(
    machine: Machine, nodes: frozenset[int], policy: str, spill: Spill
) -> tuple[frozenset[int], list[str]]:
    """The nodes a memory ``policy`` over ``nodes`` may use under ``spill``
    (``NUMABIND_SPILL``), when the kernel must be told (see
    :attr:`Placement.kernel_policy`), and notes about nodes the setting named that
    cannot be used.  Empty when the kernel's own fallback already stays inside them: the
    policy does not spill by itself (bind, interleave), ``spill`` is ``any``, or every node
    this process may use is one the rank may spill onto (a machine whose nodes all have
    CPUs: there ``preferred`` already spills onto CPU memory only, and the plan is
    unchanged).  The one place this is decided: the planner, several devices' union and
    host buffers ask it."""
    notes: list[str] = []
    if spill.anywhere or policy not in POLICIES or not POLICIES[policy].spill_by_bind:
        return frozenset(), notes
    ids = frozenset(machine.node_ids)
    allowed = machine.allowed.mems
    usable = ids & allowed if allowed is not None else ids
    mask = set(nodes)
    if spill.cpu:
        mask |= {n.id for n in machine.cpu_nodes}
    named = spill.nodes
    if named - ids:
        notes.append(
            f"NUMABIND_SPILL names node{'s' if len(named - ids) > 1 else ''} "
            f"{fmt(named - ids)}, which this machine does not have: left out"
        )
    if (named & ids) - usable:
        notes.append(
            f"NUMABIND_SPILL names node {fmt((named & ids) - usable)}, outside this process's "
            "cpuset.mems: left out"
        )
    mask |= named & usable
    mask &= usable
    if not mask or usable <= mask:
        return frozenset(), notes
    return frozenset(mask), notes


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


class Placement(Record):
    """*What* to place, kept apart from *where* it is applied: the part of a plan that the
    appliers read.  One placement is applied to the whole process
    (``numabind._apply.enter``), to the calling thread for a while
    (``numabind._pin.ThreadPin``, :func:`numabind.bind_thread`), or to a range of memory
    (``numabind._range``, :func:`numabind.host_buffer`), and each applier reads only
    these fields, so that a new decision (which NIC, which cores, which memory tier) is
    one field here and one reader in the applier that owns its subject.

    ``cpus`` is the compute set; ``helpers`` the cores kept for helper threads and
    processes (``NUMABIND_RESERVE``); ``memory_policy`` over ``memory_nodes`` with
    ``home`` the node it prefers first (where a kernel without MPOL_PREFERRED_MANY
    prefers, and where leftover pages are moved); ``threads`` the thread budget.  An
    empty ``cpus`` leaves the CPUs alone; ``memory_policy="none"`` the memory policy."""

    cpus: frozenset[int] = frozenset()
    helpers: frozenset[int] = frozenset()
    memory_policy: str = "none"
    memory_nodes: frozenset[int] = frozenset()
    home: int | None = None
    threads: int | None = None
    # NUMABIND_PRIORITY=main: the calling thread's CPUs (one priority core), where they
    # differ from the compute set; threads and children it starts get ``cpus`` back
    main_cpus: frozenset[int] = frozenset()
    # the only nodes the kernel may put this memory on (NUMABIND_SPILL=cpu: the plan's
    # nodes and the CPU-memory nodes it may spill onto); empty: the kernel's own fallback
    memory_mask: frozenset[int] = frozenset()
    # the RDMA adapter ports for the process's device(s) (numabind._nics): the process
    # applier tells the transports NUMABIND_NIC names (numabind._transports)
    nics: tuple[NicChoice, ...] = ()

    @property
    def sets_memory(self) -> bool:
        """Whether applying it sets a memory policy."""
        return self.memory_policy != "none"

    @property
    def kernel_policy(self) -> tuple[str, frozenset[int]]:
        """The policy and nodes the kernel is given: ``memory_policy`` over
        ``memory_nodes``, or, with a ``memory_mask``, MPOL_BIND over the mask.  The kernel
        takes a bind mask's nodes nearest first from the allocating CPU, so memory still
        lands on ``memory_nodes`` first (the rank's CPUs are there) and spills onto the
        rest of the mask, never elsewhere; ``preferred`` would spill anywhere."""
        found = POLICIES.get(self.memory_policy)
        if self.memory_mask and found is not None and found.spill_by_bind:
            return "bind", self.memory_mask
        return self.memory_policy, self.memory_nodes

    def describe(self) -> str:
        """``CPUs 0-3, memory preferred on node 0``."""
        mem = memory_text(self.memory_policy, self.memory_nodes, self.memory_mask)
        return f"CPUs {fmt(self.cpus) or 'unchanged'}, memory {mem}"


def memory_text(policy: str, nodes: frozenset[int], mask: frozenset[int] = frozenset()) -> str:
    """``preferred on node 1``: a memory policy and its nodes, as every summary says it;
    with a spill mask, where it may go next (``preferred on node 1, then only node 0``)."""
    text = policy
    if nodes and policy not in ("none", "local"):
        text = f"{policy} on node{'s' if len(nodes) > 1 else ''} " + fmt(nodes)
    found = POLICIES.get(policy)
    if mask and found is not None and found.spill_by_bind:
        extra = mask - nodes
        if extra:
            text += f", then only node{'s' if len(extra) > 1 else ''} {fmt(extra)}"
        else:
            text += ", no other node"
    return text


class Plan(Record):
    """One rank's binding.  ``status`` is ``bound`` (apply it) or ``skipped`` (leave the
    process as it is); ``skip`` says which kind of skip, ``reason`` says why in one line,
    ``problem`` is that line when the skip is worth a warning (bad input, a machine that
    forbids the plan) and None for a benign one (one NUMA node, no accelerator).  ``notes``
    carry the smaller things a user should know.  ``threads`` is the thread budget of a
    bound rank: its physical cores divided by the local ranks planned onto the same CPUs.
    ``cpus`` is the rank's *compute* set; ``helpers`` the cores kept for its helpers
    (``NUMABIND_RESERVE``: the reserved cores of its node, or its own share of them under
    ``n/rank``), where ``check`` counts a thread as on plan too.
    """

    local_rank: int | None
    rank_source: str | None = None
    local_world_size: int | None = None
    device: Accelerator | None = None
    device_index: int | None = None
    numa_node: int | None = None
    cpus: frozenset[int] = frozenset()
    memory_nodes: frozenset[int] = frozenset()
    memory_policy: str = "none"
    mode: str = "node"
    status: str = "skipped"
    reason: str = ""
    notes: tuple[str, ...] = ()
    problem: str | None = None
    size_source: str | None = None
    skip: SkipKind | None = None
    node_how: NodeHow | None = None
    threads: int | None = None
    helpers: frozenset[int] = frozenset()
    reserve: Reserve = NO_RESERVE
    smt: str = "all"
    # NUMABIND_SPILL as planned, and what it made of it: the only nodes the kernel may put
    # this rank's memory on (empty: the kernel's own fallback; see Placement.kernel_policy)
    spill: Spill = SPILL_ANY
    memory_mask: frozenset[int] = frozenset()
    # the notes that say something asked for (a reservation, a mode, the memory policy)
    # was not done: the entry points print them whether or not NUMABIND_VERBOSE is set
    unmet: tuple[str, ...] = ()
    # a process bound to several devices (``apply(devices=...)``, NUMABIND_DEVICES): one
    # plan per device, each what the rank driving that device alone would get; the fields
    # above are their union
    per_device: tuple[Plan, ...] = ()
    # NUMABIND_PRIORITY: the role asked for ("off", "rank", "main"), the priority cores of
    # the CPUs the rank's mode draws from (what show and check mark), and under "main" the
    # CPUs of the one priority core the calling thread runs on
    priority: str = "off"
    priority_cpus: frozenset[int] = frozenset()
    main_cpus: frozenset[int] = frozenset()
    # the RDMA adapter ports for this rank's GPU, primary first (Request.nic_mode): the
    # nearest, shared fairly over the machine's GPUs (numabind._nics)
    nics: tuple[NicChoice, ...] = ()

    @property
    def bound(self) -> bool:
        """The plan binds (``status == "bound"``)."""
        return self.status == "bound"

    @property
    def placement(self) -> Placement:
        """What this plan places (for a plan that skips: its NICs only, which do not
        depend on binding CPUs: a one-node machine still has a nearest adapter)."""
        if not self.bound:
            return Placement(nics=self.nics)
        return Placement(
            nics=self.nics,
            cpus=self.cpus,
            helpers=self.helpers,
            memory_policy=self.memory_policy,
            memory_nodes=self.memory_nodes,
            home=self.numa_node,
            threads=self.threads,
            main_cpus=self.main_cpus,
            memory_mask=self.memory_mask,
        )

    def for_device(self, device: Accelerator) -> Plan | None:
        """The plan of ``device`` in a process bound to several devices (None: not one of
        them)."""
        for p in self.per_device:
            if p.device == device:
                return p
        return None

    def to_dict(self) -> dict[str, Any]:
        d = self.device
        return {
            "local_rank": self.local_rank,
            "rank_source": self.rank_source,
            "local_world_size": self.local_world_size,
            "size_source": self.size_source,
            "device_index": self.device_index,
            "device_pci": d.pci if d else None,
            "numa_node": self.numa_node,
            "node_how": self.node_how,
            "cpus": sorted(self.cpus),
            "memory_nodes": sorted(self.memory_nodes),
            "memory_policy": self.memory_policy if self.bound else None,  # none applied
            "mode": self.mode,
            "status": self.status,
            "skip": self.skip,
            "reason": self.reason,
            "notes": list(self.notes),
            "problem": self.problem,
            "threads": self.threads,
            "helpers": sorted(self.helpers),
            "reserve": str(self.reserve),
            "smt": self.smt,
            "spill": str(self.spill),
            "memory_mask": sorted(self.memory_mask),
            "per_device": [p.to_dict() for p in self.per_device],
            "priority": self.priority,
            "priority_cpus": sorted(self.priority_cpus),
            "main_cpus": sorted(self.main_cpus),
            "nics": [n.to_dict() for n in self.nics],
        }

    def who(self) -> str:
        """``local rank 3 (LOCAL_RANK; 8 local ranks from LOCAL_WORLD_SIZE)``, or for a
        device named by an argument, ``device 4 (0000:9b:00.0; argument)``, or for a
        process that drives several, ``devices 0, 3 (NUMABIND_DEVICES)``."""
        if self.per_device:
            shown = ", ".join(
                str(p.device_index if p.device_index is not None else p.device.pci)
                for p in self.per_device
                if p.device is not None
            )
            return f"devices {shown} ({self.rank_source or 'argument'})"
        if self.rank_source == PER_DEVICE and self.device is not None:
            index = "" if self.device_index is None else f"{self.device_index} "
            return f"device {index}({self.device.pci}; its share of a multi-device process)"
        if self.local_rank is None and self.device is not None and self.rank_source:
            index = "" if self.device_index is None else f"{self.device_index} "
            return f"device {index}({self.device.pci}; {self.rank_source})"
        named = self.rank_source or ""
        if self.local_rank is None and named.startswith(("--", "device argument")):
            return named  # numabind run --node N / --cpus LIST, a device not found
        who = "no local rank" if self.local_rank is None else f"local rank {self.local_rank}"
        if self.rank_source:
            who += f" ({self.rank_source}"
            if self.local_world_size is not None:
                who += f"; {_plural(self.local_world_size, 'local rank')}"
                if self.size_source:
                    who += f" from {self.size_source}"
            who += ")"
        return who

    def memory_text(self) -> str:
        """``preferred on node 1``: the memory part of the one-line summary."""
        return memory_text(self.memory_policy, self.memory_nodes, self.memory_mask)

    def summary(self) -> str:
        """One line: what this rank gets, or why it gets nothing."""
        if not self.bound:
            return f"{self.who()}: not bound: {self.reason}"
        cpus = fmt(self.cpus) or "unchanged"
        return f"{self.who()}: CPUs {cpus}, memory {self.memory_text()}: {self.reason}"


def plan(machine: Machine, request: Request) -> Plan:
    """Plan one rank's binding: ``request`` (its rank, visible devices, mode and memory
    policy) on ``machine``; for a request naming several ``devices``, their union (each
    device's share what the rank driving it alone would get: ``Plan.per_device``).  Pure
    and never raises (an odd machine is a skip with its reason)."""
    if request.devices:
        return _with_nics(machine, request, plan_devices(machine, request))
    try:
        return _with_nics(machine, request, _Planner(machine, request).run())
    except Exception as err:  # a capture we did not foresee must not break a process
        if RAISE:
            raise
        return _Planner(machine, request).skipped(
            "machine",
            f"numabind could not plan on this machine ({type(err).__name__}: "
            f"{_sysfs.clean_line(str(err), 200)})",
        )


def _with_nics(machine: Machine, request: Request, p: Plan) -> Plan:
    """``p`` with the adapters of its device's ranks (``Request.nic_mode``): the GPU's share
    of the machine-wide fair assignment, split among the local ranks that drive the same
    GPU; a process bound to several devices takes the union of theirs.  A failure here is
    a note, never a change to the CPU and memory plan."""
    if not request.nic_mode:
        return p
    if p.per_device:
        union = tuple(dict.fromkeys(n for sub in p.per_device for n in sub.nics))
        return p.replace(nics=union)
    if p.device is None:
        return p
    try:
        from ._nics import assign, same_vendor, share_of

        found = assign(
            machine,
            same_vendor(machine, p.device),
            lambda d: device_node(machine, d).node,
            request.nic_mode,
            request.nic_min_rate,
        )
    except Exception as err:
        if RAISE:
            raise
        why = f"{type(err).__name__}: {_sysfs.clean_line(str(err), 200)}"
        return p.replace(notes=(*p.notes, f"RDMA adapters not chosen ({why})"))
    mine = found.per_device.get(p.device.pci, ())
    notes = list(p.notes)
    if not found.units:
        if machine.nics:
            why = "; ".join(f"{r.nic.name or r.nic.pci}: {r.why}" for r in found.refused[:4])
            notes.append(f"no RDMA adapter may be offered ({why})")
        return p.replace(notes=tuple(notes))
    size, index = p.local_world_size, p.device_index
    visible = request.visible.devices if request.visible is not None else ()
    if size and visible and index is not None and p.local_rank is not None and size > 1:
        n = len(visible)
        count = size // n + (1 if index < size % n else 0)
        mine = share_of(mine, p.local_rank // n, count)
    if mine and mine[0].relation.rstrip("*") == "SYS":
        notes.append(
            f"no RDMA adapter is nearer than SYS to {describe_device(p.device, index)}: "
            f"{mine[0].label} is across the socket interconnect"
        )
    return p.replace(nics=mine, notes=tuple(notes))


PER_DEVICE = "per-device"  # the rank source of one device's share of a multi-device plan


def plan_devices(machine: Machine, request: Request) -> Plan:
    """The plan of a process that drives several devices (``request.devices``).

    Device k's share is exactly what the rank driving k alone would get in a job with one
    rank per visible device (its index among them as the local rank, their count as the
    local world size): its node in node mode, its package in socket mode, its disjoint
    share of its node's cores in exclusive mode, its cache domain in core-complex mode,
    each less the cores ``NUMABIND_RESERVE`` keeps and one thread per core under
    ``NUMABIND_SMT=1``.  Those plans are ``per_device`` (what a thread bound to k gets:
    :func:`numabind.bind_thread`); the process gets their union: the CPUs and helper
    cores of all, and memory under the asked policy over all their nodes (``preferred``
    over several nodes is MPOL_PREFERRED_MANY), so that each of its threads and children
    can take its own device's share.  A device whose own plan skips is left out, with a
    note; when every one skips, the process skips with the first reason."""
    visible = request.visible.devices if request.visible is not None else ()
    subs: list[Plan] = []
    for dev in dict.fromkeys(request.devices):
        index = visible.index(dev) if dev in visible else None
        subs.append(
            plan(
                machine,
                request.replace(
                    devices=(),
                    device=dev,
                    local_rank=index,
                    local_world_size=len(visible) if index is not None else None,
                    rank_source=PER_DEVICE,
                    size_source="visible devices",
                ),
            )
        )
    bound = [p for p in subs if p.bound]
    planner = _Planner(machine, request.replace(devices=()))
    if not bound:
        first = subs[0]
        return planner.skipped(first.skip or "bad-input", first.reason).replace(
            per_device=tuple(subs)
        )
    notes = list(dict.fromkeys(n for p in bound for n in p.notes))
    for p in subs:
        if not p.bound and p.device is not None:
            notes.append(f"{describe_device(p.device, p.device_index)} left out: {p.reason}")
    cpus = frozenset().union(*(p.cpus for p in bound))
    nodes = frozenset().union(*(p.memory_nodes for p in bound))
    home = bound[0].numa_node
    policy = request.memory
    if policy == "preferred" and len(nodes) > 1:
        policy, nodes, note = preferred_over(machine, nodes, home)
        if note:
            notes.append(note)
    elif policy == "none" or not nodes:
        policy, nodes = "none", frozenset()
    mask, spilled = spill_mask(machine, nodes, policy, request.spill)
    notes.extend(n for n in spilled if n not in notes)
    budgets = [p.threads for p in bound if p.threads is not None]
    where = ", ".join(
        f"{p.device_index if p.device_index is not None else p.device.pci if p.device else '?'}"
        f" (node {p.numa_node if p.numa_node is not None else '?'})"
        for p in bound
    )
    return Plan(
        local_rank=request.local_rank,
        rank_source=request.rank_source,
        local_world_size=request.local_world_size,
        size_source=request.size_source,
        numa_node=home,
        cpus=cpus,
        memory_nodes=nodes,
        memory_policy=policy,
        mode=request.mode,
        status="bound",
        reason=f"devices {where}: the union of their plans",
        notes=tuple(notes),
        threads=sum(budgets) if budgets else None,
        helpers=frozenset().union(*(p.helpers for p in bound)),
        reserve=request.reserve,
        smt=request.smt,
        spill=request.spill,
        memory_mask=mask,
        per_device=tuple(subs),
    )


def preferred_over(
    machine: Machine, nodes: frozenset[int], home: int | None
) -> tuple[str, frozenset[int], str | None]:
    """``preferred`` over several nodes: MPOL_PREFERRED_MANY where the kernel has it
    (5.15+), else the home node alone, with the note that says so.  The one place this
    choice is made (the planner, host buffers and the union of several devices ask it);
    a kernel that refuses it anyway falls back at run time in
    :func:`numabind._kernel.set_policy`."""
    many = POLICIES["preferred-many"]
    if many.min_kernel is None or machine.kernel_at_least(*many.min_kernel):
        return many.name, nodes, None
    first = home if home in nodes else min(nodes)
    return (
        "preferred",
        frozenset({first}),
        f"kernel before 5.15 has no MPOL_PREFERRED_MANY: preferring node {first}",
    )


class _Place(Record):
    """Where a rank goes: its node (None: only the device's CPU ``locality`` is known),
    the line that says why, its position among the ranks on that node (and how many), and
    how many ranks share its package (socket mode)."""

    node: int | None
    what: str
    locality: frozenset[int] | None = None
    peers: tuple[int, int] | None = None
    package: int | None = None
    package_peers: tuple[int, int] | None = None  # (position, count) on the package


class _Skip(Exception):
    def __init__(self, kind: SkipKind, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind


_BENIGN = ("one-node", "no-accelerator")


class _Planner:
    def __init__(self, machine: Machine, request: Request) -> None:
        self.m = machine
        self.r = request
        self.notes: list[str] = list(request.notes)
        if request.visible:
            self.notes.extend(request.visible.notes)
        self.device: Accelerator | None = None
        self.index: int | None = None
        self.node: int | None = None
        self.how: NodeHow | None = None
        self.helpers: frozenset[int] = frozenset()
        self.reserved: frozenset[int] = frozenset()  # every rank's reserved cores here
        self.unmet: list[str] = []  # the notes that say what was asked and not done

    def _not_done(self, note: str) -> None:
        self.notes.append(note)
        self.unmet.append(note)

    def _plan(self, **fields: Any) -> Plan:
        """A plan of this request: who the rank is, its device, node and knobs, and the
        notes so far, with ``fields`` (the one place a Planner makes a Plan)."""
        r = self.r
        return Plan(
            local_rank=r.local_rank,
            rank_source=r.rank_source,
            local_world_size=r.local_world_size,
            size_source=r.size_source,
            device=self.device,
            device_index=self.index,
            numa_node=self.node,
            node_how=self.how,
            mode=r.mode,
            reserve=r.reserve,
            smt=r.smt,
            notes=tuple(self.notes),
            **fields,
        )

    def skipped(self, kind: SkipKind, reason: str) -> Plan:
        return self._plan(
            priority=self.r.priority,
            status="skipped",
            reason=reason,
            problem=None if kind in _BENIGN else reason,
            skip=kind,
        )

    def run(self) -> Plan:
        try:
            return self._run()
        except _Skip as s:
            return self.skipped(s.kind, str(s))

    def _machine_notes(self) -> None:
        allowed = self.m.allowed
        if allowed.problem:
            self.notes.append(f"{allowed.problem}: planned on every online CPU")
        self.notes.extend(self.m.warnings)

    # --- which device, which node
    def _run(self) -> Plan:
        r = self.r
        devs = self._check_request()
        one_node = len(self.m.cpu_nodes) <= 1 and r.mode in ("node", "socket")
        if one_node and not (r.priority != "off" and self.m.core_kinds.distinct):
            if r.device is not None or (devs and (r.local_rank is not None or len(devs) == 1)):
                self.device, self.index = self._pick_device(devs)
            if nothing_to_bind(self.m, r.mode, r.memory, r.spill, r.priority):
                raise _Skip(
                    "one-node",
                    "this machine has one NUMA node with CPUs"
                    + (" and its cores are one kind" if r.priority != "off" else "")
                    + ": nothing to bind",
                )
            return self._memory_only()
        self._machine_notes()
        if not devs and r.device is None:
            where = self._cpu_only_node(r.visible)
        else:
            where = self._device_place(devs)
        self.node = where.node
        cpus, sharers = self._cpus(where)
        prio: frozenset[int] = frozenset()
        main: frozenset[int] = frozenset()
        if r.priority != "off":
            cpus, main, prio, sharers = self._priority(where, cpus, sharers)
        cores = len(cpus) // max(self.m.smt, 1)
        if r.smt == "1":
            cpus = one_per_core(self.m, cpus)
            main = one_per_core(self.m, main)
            cores = len(cpus)
        mem_nodes, policy = self._memory(cpus, where.node)
        mask = self._mask(mem_nodes, policy)
        return self._plan(
            cpus=frozenset(cpus),
            memory_nodes=mem_nodes,
            memory_policy=policy,
            status="bound",
            reason=where.what,
            threads=max(1, cores // max(sharers or 1, 1)) if r.budget else None,
            helpers=self.helpers,
            priority=r.priority,
            priority_cpus=prio,
            main_cpus=main,
            spill=r.spill,
            memory_mask=mask,
            unmet=tuple(self.unmet),
        )

    def _memory_only(self) -> Plan:
        """One node with CPUs and memory-only nodes besides (a GH200: node 0 and its GPU's
        memory): the CPUs have nothing to choose and are left as they are; the memory
        policy keeps the rank's memory on CPU memory (see :func:`spill_mask`)."""
        r = self.r
        self._machine_notes()
        node = self.m.cpu_nodes[0]
        self.node, self.how = node.id, "one-node"
        mem_nodes, policy = self._memory(node.cpus, node.id)
        mask = self._mask(mem_nodes, policy)
        kept = frozenset(self.m.node_ids) - mask
        what = (
            f"{describe_device(self.device, self.index)} is on node {node.id}"
            if self.device is not None
            else f"node {node.id}"
        )
        return self._plan(
            memory_nodes=mem_nodes,
            memory_policy=policy,
            status="bound",
            reason=f"{what}, the one node with CPUs: CPUs left as they are, memory kept off "
            f"node{'s' if len(kept) > 1 else ''} {fmt(kept)} (no CPUs)",
            spill=r.spill,
            memory_mask=mask,
            unmet=tuple(self.unmet),
        )

    def _mask(self, nodes: frozenset[int], policy: str) -> frozenset[int]:
        mask, notes = spill_mask(self.m, nodes, policy, self.r.spill)
        self.notes.extend(n for n in notes if n not in self.notes)
        return mask

    def _check_request(self) -> tuple[Accelerator, ...]:
        """Skip on bad input; the visible devices otherwise."""
        r = self.r
        if r.mode not in MODES:
            raise _Skip(
                "bad-input", f"unknown mode {r.mode!r} (use one of {', '.join(MODE_NAMES)})"
            )
        if r.memory not in MEMORY_POLICIES:
            raise _Skip(
                "bad-input",
                f"unknown memory policy {r.memory!r} (use one of {', '.join(MEMORY_POLICIES)})",
            )
        if r.smt not in SMT_LEVELS:
            raise _Skip(
                "bad-input", f"unknown SMT level {r.smt!r} (use one of {', '.join(SMT_LEVELS)})"
            )
        if r.priority not in PRIORITY_ROLES:
            raise _Skip(
                "bad-input",
                f"unknown priority role {r.priority!r} (use one of {', '.join(PRIORITY_ROLES)})",
            )
        if not isinstance(r.reserve, Reserve) or r.reserve.scope not in RESERVE_SCOPES:
            raise _Skip("bad-input", f"unknown reservation {r.reserve!r} (use n, n/node or n/rank)")
        if r.problem:
            raise _Skip("bad-input", r.problem)
        visible = r.visible
        if visible is not None and visible.problem:
            raise _Skip("bad-input", visible.problem)
        devs = visible.devices if visible is not None else ()
        if r.device is not None and r.device not in devs:
            self.notes.append(f"{r.device.pci} is not among the devices this process sees")
        return devs

    def _device_place(self, devs: tuple[Accelerator, ...]) -> _Place:
        """Where the rank's device is: its node (or only its CPU locality), and the ranks
        that share the node (and package) with it."""
        r = self.r
        dev, index = self._pick_device(devs)
        dev = self.m.detailed(dev)  # the chosen device's driver facts, not every GPU's
        self.device, self.index = dev, index
        choice = device_node(self.m, dev)
        node_id, self.how = choice.node, choice.how
        if node_id is None and choice.locality is None:
            raise _Skip(
                "unknown-node",
                f"the NUMA node of {describe_device(dev, index)} is unknown (sysfs numa_node "
                "is -1 and its CPU locality is the whole machine); left unbound rather "
                "than guess",
            )
        if node_id is None:
            what = f"{describe_device(dev, index)}: {choice.describe()}"
            return _Place(node=None, what=what, locality=choice.locality)
        peers = package = package_peers = None
        if r.mode != "node" or r.budget or r.priority != "off":
            peers = self._device_peers(frozenset({node_id}), devs)
        if r.mode == "socket":
            pkg_nodes = package_nodes(self.m, node_id)
            if pkg_nodes is not None:
                package_peers = self._device_peers(pkg_nodes, devs)
                package = package_peers[1] if package_peers else None
        what = f"{describe_device(dev, index)} is on node {node_id}"
        return _Place(
            node=node_id, what=what, peers=peers, package=package, package_peers=package_peers
        )

    def _cpus(self, where: _Place) -> tuple[frozenset[int], int | None]:
        """The rank's CPUs (the mode's share of the node this process may use) and how
        many ranks get exactly those."""
        allowed = self.m.allowed.cpus
        if where.node is None:
            assert where.locality is not None
            cpus = where.locality & allowed
            if not cpus:
                raise _Skip(
                    "cgroup", f"{where.what}, but this process may use only CPUs {fmt(allowed)}"
                )
            self.notes.append("node unknown: bound to the device's CPU locality instead")
            if self.r.reserve:
                self._not_done("no cores reserved: a reservation needs the device's node")
            return cpus, None
        node = self.m.node(where.node)
        assert node is not None
        base = node.cpus & allowed
        if not base:
            raise _Skip(
                "cgroup",
                f"{where.what}, whose CPUs {fmt(node.cpus)} are all outside the CPUs this "
                f"process may use ({fmt(allowed) or 'none'}, from {self.m.allowed.source}); "
                "not bound elsewhere",
            )
        peers = where.peers
        reserved = self._reserve(where, allowed) if self.r.reserve else frozenset()
        self.reserved = reserved
        before = len(self.notes)
        found = MODES[self.r.mode](
            ModeInput(
                machine=self.m,
                node_id=where.node,
                base=base - reserved,
                allowed=allowed - reserved,
                position=peers[0] if peers else None,
                count=peers[1] if peers else None,
                package_count=where.package,
            ),
            self.notes,
        )
        self.unmet.extend(self.notes[before:])  # a mode's notes say what it could not do
        return found

    def _priority(
        self, where: _Place, cpus: frozenset[int], sharers: int | None
    ) -> tuple[frozenset[int], frozenset[int], frozenset[int], int | None]:
        """NUMABIND_PRIORITY: (compute set, main-thread CPUs, priority cores of the pool,
        ranks sharing the compute set).  The pool is what the mode draws from (the rank's
        node; in socket mode its package's nodes), less reserved cores.  ``rank``: the
        rank's fair share of the pool's priority cores, whole cores split as exclusive
        mode splits a node; ``main``: one priority core for the calling thread only, the
        compute set unchanged.  Fewer priority cores than ranks: they are shared, and
        said so."""
        prio, where_text, peers = self._priority_pool(where)
        if not prio:
            return cpus, frozenset(), frozenset(), sharers
        if self.r.priority == "main":
            return cpus, self._main_core(prio, cpus, peers, where_text), prio, sharers
        share, sharers = self._rank_share(prio, peers, where_text)
        return share, frozenset(), prio, sharers

    def _priority_pool(self, where: _Place) -> tuple[frozenset[int], str, tuple[int, int] | None]:
        """(the priority cores the rank's mode draws from, where they are in words, the
        rank's (position, count) among the ranks drawing from them)."""
        r = self.r
        label = f"NUMABIND_PRIORITY={r.priority}"
        if where.node is None:
            self.notes.append(f"{label}: the device's node is unknown; no priority cores")
            return frozenset(), "", None
        nodes = [where.node]
        peers = where.peers
        if r.mode == "socket":
            nodes += sorted((package_nodes(self.m, where.node) or set()) - {where.node})
            peers = where.package_peers if where.package_peers else peers
        allowed = self.m.allowed.cpus
        pool: set[int] = set()
        fast: set[int] = set()
        for nid in nodes:
            node = self.m.node(nid)
            if node is not None:
                pool |= node.cpus & allowed
                fast |= self.m.priority_cpus(nid)
        pool -= self.reserved  # every rank's reserved cores, not only this rank's share
        where_text = f"node{'s' if len(nodes) > 1 else ''} {fmt(nodes)}"
        prio = frozenset(fast & pool)
        if not prio:
            self.notes.append(
                f"{label}: no priority cores on {where_text} "
                f"({self.m.describe_kinds(frozenset(pool))}); the mode's CPUs are kept"
            )
        return prio, where_text, peers

    def _main_core(
        self,
        prio: frozenset[int],
        cpus: frozenset[int],
        peers: tuple[int, int] | None,
        where_text: str,
    ) -> frozenset[int]:
        """The one priority core of the calling thread under ``main``: by the rank's
        position among the ranks on the pool (by its local rank where that is unknown); in
        exclusive and core-complex modes the first of the rank's own set."""
        r = self.r
        label = f"NUMABIND_PRIORITY={r.priority}"
        if r.mode in ("exclusive", "core-complex"):
            own = groups(prio & cpus, self.m.siblings_of)
            if not own:
                self.notes.append(
                    f"{label}: none of the priority cores of {where_text} ({fmt(prio)}) is in "
                    f"this rank's {r.mode} share; the main thread is not pinned"
                )
                return frozenset()
            return own[0]
        cores = groups(prio, self.m.siblings_of)
        if peers is None:
            core = cores[(r.local_rank or 0) % len(cores)]
            self.notes.append(
                f"{label}: which local ranks share {where_text} is unknown; the main thread "
                f"takes priority core {fmt(core)} by its local rank"
            )
            return core
        position, count = peers
        if len(cores) < count:
            self.notes.append(
                f"{label}: {where_text} has {_plural(len(cores), 'priority core')} for "
                f"{count} ranks: their main threads share them"
            )
        return cores[position % len(cores)]

    def _rank_share(
        self, prio: frozenset[int], peers: tuple[int, int] | None, where_text: str
    ) -> tuple[frozenset[int], int | None]:
        """The rank's fair share of ``prio`` under ``rank`` (whole cores, split as
        exclusive mode splits a node), and how many ranks get exactly those CPUs."""
        label = f"NUMABIND_PRIORITY={self.r.priority}"
        cores = groups(prio, self.m.siblings_of)
        if peers is None:
            self.notes.append(
                f"{label}: which local ranks share {where_text} is unknown; this rank may use "
                f"all {len(cores)} of its priority cores ({fmt(prio)})"
            )
            return prio, None
        position, count = peers
        if len(cores) < count:
            core = cores[position % len(cores)]
            self.notes.append(
                f"{label}: {where_text} has {_plural(len(cores), 'priority core')} for "
                f"{count} ranks: they share them (this rank: {fmt(core)})"
            )
            return core, _ceil_div(count - position % len(cores), len(cores))
        each, extra = divmod(len(cores), count)
        start = position * each + min(position, extra)
        take = each + (1 if position < extra else 0)
        return frozenset().union(*cores[start : start + take]), 1

    def _reserve(self, where: _Place, allowed: frozenset[int]) -> frozenset[int]:
        """The CPUs ``NUMABIND_RESERVE`` keeps out of the compute sets on the nodes this
        rank's mode draws from (its node; in socket mode its package's), and this rank's
        helper set (``self.helpers``).  Cores the cgroup already leaves out of a node count
        towards its reservation; the rest are taken from the end of the node's core list.
        A reservation that would leave a node no core is dropped, with one note."""
        assert where.node is not None
        n, scope = self.r.reserve.count, self.r.reserve.scope  # checked with the request
        label = f"{n}/{scope}"
        ranks = where.peers[1] if where.peers else None
        if scope == "rank" and ranks is None:
            self._not_done(
                f"{label}: the number of local ranks on node {where.node} is "
                "unknown; reserved for one"
            )
        want = n * (ranks or 1) if scope == "rank" else n
        scope_nodes = [where.node]
        if self.r.mode == "socket":
            scope_nodes += sorted((package_nodes(self.m, where.node) or set()) - {where.node})
        out: set[int] = set()
        mine: list[frozenset[int]] = []
        for nid in scope_nodes:
            node = self.m.node(nid)
            if node is None or not node.cpus:
                continue
            cores = groups(node.cpus, self.m.siblings_of)
            usable = [c & allowed for c in cores if c & allowed]
            need = want - (len(cores) - len(usable))  # the cgroup's own reservation
            if need <= 0:
                continue
            if need >= len(usable):
                self._not_done(
                    f"no cores reserved: {label} would leave node {nid} "
                    f"({len(usable)} usable cores) no core to compute on"
                )
                return frozenset()
            if self.r.priority != "off":
                # the reservation (taken from the end) comes from the standard cores
                # first: the priority ones are what NUMABIND_PRIORITY asked compute to have
                fast = self.m.priority_cpus(nid)
                usable = [c for c in usable if c & fast] + [c for c in usable if not c & fast]
            taken = usable[len(usable) - need :]
            if nid == where.node:
                mine = taken
            for core in taken:
                out |= core
        if not out:
            return frozenset()
        self.helpers = frozenset(out)
        if scope == "rank" and ranks is not None and where.peers and mine:
            position = where.peers[0]
            share = mine[position * n : (position + 1) * n] if len(mine) >= n * ranks else mine
            self.helpers = frozenset().union(*share)
        self.notes.append(f"reserved CPUs {fmt(out)} ({label}): not for compute")
        return frozenset(out)

    def _pick_device(self, devs: tuple[Accelerator, ...]) -> tuple[Accelerator, int | None]:
        r = self.r
        if r.device is not None:  # named by an argument: its index if the runtime sees it
            return r.device, (devs.index(r.device) if r.device in devs else None)
        if len(devs) == 1:
            return devs[0], 0
        if r.local_rank is None:
            nodes = {device_node(self.m, d).node for d in devs}
            if len(nodes) == 1 and None not in nodes:
                return devs[0], 0
            raise _Skip(
                "bad-input",
                f"{len(devs)} GPUs are visible, on nodes "
                f"{sorted(n for n in nodes if n is not None)}"
                " (or unknown), and no local rank picks one",
            )
        index = r.local_rank % len(devs)
        if r.local_rank >= len(devs):
            self.notes.append(
                f"local rank {r.local_rank} >= {len(devs)} visible devices: using device "
                f"{index} (rank modulo device count)"
            )
        return devs[index], index

    def _cpu_nodes_allowed(self) -> list[int]:
        allowed = self.m.allowed.cpus
        return [n.id for n in self.m.cpu_nodes if n.cpus & allowed]

    def _cpu_only_node(self, visible: Visible | None) -> _Place:
        r = self.r
        why = visible.source if visible is not None else "no accelerator visible"
        size = r.local_world_size
        if r.local_rank is None or size is None or size <= 1:
            raise _Skip(
                "no-accelerator",
                f"no accelerator is visible ({why}) and no local world size > 1 to spread a "
                "CPU-only job",
            )
        nodes = self._cpu_nodes_allowed()
        if not nodes:
            raise _Skip("cgroup", "no node has CPUs this process may use")
        index, position, count = spread_block(r.local_rank, size, len(nodes))
        node = nodes[index]
        package = package_peers = None
        if r.mode == "socket":
            pkg_nodes = package_nodes(self.m, node)
            if pkg_nodes is not None:
                before = [i for i, n in enumerate(nodes) if n in pkg_nodes and i < index]
                package = sum(
                    block_count(i, size, len(nodes)) for i, n in enumerate(nodes) if n in pkg_nodes
                )
                ahead = sum(block_count(i, size, len(nodes)) for i in before)
                package_peers = (ahead + position, package)
        return _Place(
            package_peers=package_peers,
            node=node,
            what=f"no accelerator visible ({why}): CPU-only job, "
            f"{_plural(size, 'local rank')} spread block-wise over nodes {fmt(nodes)}: node {node}",
            peers=(position, count),
            package=package,
        )

    def _device_peers(
        self, nodes: frozenset[int], devs: tuple[Accelerator, ...]
    ) -> tuple[int, int] | None:
        """(this rank's position among the local ranks whose devices are on ``nodes``, how
        many there are), or None when that cannot be known here."""
        r = self.r
        size = r.local_world_size
        if r.local_rank is None:
            return None
        if size is None:
            if len(self.m.cpu_nodes) == 1 and len(devs) > 1:
                size = len(devs)  # one node: every visible device's rank shares it
            else:
                return None
        if len(devs) == 1 and size > 1:
            return None  # one device per rank: the others' devices are not visible here
        on_node = frozenset(j for j, d in enumerate(devs) if device_node(self.m, d).node in nodes)
        if r.local_rank % len(devs) not in on_node or r.local_rank >= size:
            return None
        return peers_on_node(r.local_rank, size, len(devs), on_node)

    # --- memory
    def _memory(self, cpus: frozenset[int], node_id: int | None) -> tuple[frozenset[int], str]:
        policy = self.r.memory
        if policy == "none":
            return frozenset(), "none"
        mem = {n.id for n in self.m.cpu_nodes if n.cpus & cpus}
        if self.r.mode == "socket" and node_id is not None:
            # every CPU node of the package, those whose CPUs the cgroup leaves out too
            mem |= package_nodes(self.m, node_id) or set()
        allowed_mems = self.m.allowed.mems
        if allowed_mems is not None and mem - allowed_mems:
            dropped = mem - allowed_mems
            mem &= allowed_mems
            self.notes.append(f"memory nodes {fmt(dropped)} are outside this process's cpuset.mems")
        if not mem:
            self._not_done("no memory node this process may use holds its CPUs: memory left alone")
            return frozenset(), "none"
        if policy == "preferred" and len(mem) > 1:
            policy, nodes, note = preferred_over(self.m, frozenset(mem), node_id)
            if note:
                self.notes.append(note)
            return nodes, policy
        return frozenset(mem), policy


# --- the modes: which of a node's CPUs one rank gets -------------------------------------------


class ModeInput(Record):
    """What a mode decides from.  ``position``/``count`` place the rank among the local
    ranks on its node, ``package_count`` counts those on its package's nodes; each is None
    when unknown (no local world size, one device visible per rank)."""

    machine: Machine
    node_id: int
    base: frozenset[int]  # the node's CPUs this process may use
    allowed: frozenset[int]
    position: int | None
    count: int | None
    package_count: int | None = None


# A mode returns (the rank's CPUs, how many local ranks get exactly those CPUs or None
# when unknown): the second number divides the thread budget.
ModeResult = tuple[frozenset[int], "int | None"]


def package_nodes(machine: Machine, node_id: int) -> frozenset[int] | None:
    """The CPU nodes in the same package as ``node_id`` (None: package unknown)."""
    node = machine.node(node_id)
    if node is None or not node.cpus:
        return None
    pkg = machine.package_of(min(node.cpus))
    if pkg is None:
        return None
    return frozenset(n.id for n in machine.cpu_nodes if machine.package_of(min(n.cpus)) == pkg)


class Split(Record):
    """Node ``node`` is one of several CPU nodes of one package (Intel sub-NUMA
    clustering, AMD NPS): ``nodes`` are the package's CPU nodes, ``vendor`` says what the
    split is called (:data:`numabind._model.SUBNUMA_TABLE`)."""

    node: int
    package: int
    nodes: tuple[int, ...]
    vendor: str | None = None

    @property
    def row(self) -> SubNuma:
        return SUBNUMA.get(self.vendor or "", SUBNUMA_OTHER)

    @property
    def setting(self) -> str | None:
        """``SNC3``, ``NPS4``: the mode's name, where the vendor's mode has this size."""
        row = self.row
        n = len(self.nodes)
        return row.mode.format(n=n) if row.mode and n in row.counts else None

    def describe(self) -> str:
        """``node 2 is one of 3 sub-NUMA clusters of package 0 (SNC3)``."""
        setting = self.setting
        return (
            f"node {self.node} is one of {len(self.nodes)} {self.row.node}s of package "
            f"{self.package}" + (f" ({setting})" if setting else "")
        )


def split_of(machine: Machine, node_id: int) -> Split | None:
    """The split package node ``node_id`` belongs to, None when its package has one CPU
    node (or its package is unknown)."""
    nodes = package_nodes(machine, node_id)
    if nodes is None or len(nodes) < 2:
        return None
    node = machine.node(node_id)
    assert node is not None and node.cpus  # package_nodes found its package
    package = machine.package_of(min(node.cpus))
    assert package is not None
    return Split(
        node=node_id, package=package, nodes=tuple(sorted(nodes)), vendor=machine.cpu_vendor
    )


def fallback_order(machine: Machine, home: int, nodes: Iterable[int]) -> tuple[int, ...]:
    """``nodes`` (``home`` left out) in the order the kernel takes them once ``home`` is
    full: its distance table from ``home``, then node number, as the kernel builds a
    node's fallback list.  On a split package the package's other nodes come first where
    the firmware says they are nearer (Intel reports 12 against 21 across sockets)."""
    full = machine.node(home, full=True)
    dist = dict(full.distances) if full is not None else {}
    others = [n for n in set(nodes) if n != home]
    return tuple(sorted(others, key=lambda n: (dist.get(n, 1 << 16), n)))


def one_per_core(machine: Machine, cpus: frozenset[int]) -> frozenset[int]:
    """``NUMABIND_SMT=1``: the first hardware thread of each core in ``cpus``."""
    return frozenset(min(g) for g in groups(cpus, machine.siblings_of))


def _node(m: ModeInput, notes: list[str]) -> ModeResult:
    return m.base, m.count


def _socket(m: ModeInput, notes: list[str]) -> ModeResult:
    machine = m.machine
    nodes = package_nodes(machine, m.node_id)
    if nodes is None:
        notes.append("package of the node's CPUs unknown: socket mode used the node")
        return m.base, m.count
    out = set(m.base)
    for n in machine.cpu_nodes:
        if n.id in nodes and n.id != m.node_id:
            out |= n.cpus & m.allowed
    return frozenset(out), m.package_count


def groups(
    base: frozenset[int], shared_with: Callable[[int], frozenset[int]]
) -> list[frozenset[int]]:
    """Partition ``base`` by a per-CPU sharing relation (SMT siblings, cache domain),
    asking once per group rather than once per CPU: the startup hook reads these from
    sysfs, one file per question."""
    out: list[frozenset[int]] = []
    seen: set[int] = set()
    for c in sorted(base):
        if c in seen:
            continue
        group = (shared_with(c) & base) | {c}
        seen |= group
        out.append(frozenset(group))
    return sorted(out, key=min)


def _peers_unknown(mode: str, m: ModeInput, notes: list[str]) -> ModeResult:
    notes.append(
        f"{mode} mode needs to know which local ranks share node {m.node_id} (the local "
        "world size and each rank's device); using node mode"
    )
    return m.base, None


def _exclusive(m: ModeInput, notes: list[str]) -> ModeResult:
    if m.position is None or m.count is None:
        return _peers_unknown("exclusive", m, notes)
    cores = groups(m.base, m.machine.siblings_of)
    if len(cores) < m.count:
        notes.append(
            f"node {m.node_id} has {len(cores)} physical cores for {m.count} ranks: they "
            "share the node's CPUs"
        )
        return m.base, m.count
    each, extra = divmod(len(cores), m.count)
    start = m.position * each + min(m.position, extra)
    take = each + (1 if m.position < extra else 0)
    out: set[int] = set()
    for g in cores[start : start + take]:
        out |= g
    return frozenset(out), 1


def _core_complex(m: ModeInput, notes: list[str]) -> ModeResult:
    if m.position is None or m.count is None:
        return _peers_unknown("core-complex", m, notes)
    machine = m.machine
    if machine.cache_of(min(m.base)) is None:
        notes.append("cache domains unknown: core-complex mode used the node")
        return m.base, m.count
    domains = groups(m.base, lambda c: machine.cache_of(c) or frozenset({c}))
    ordered = sorted(domains, key=lambda s: (-len(s), min(s)))
    slot = m.position % len(ordered)
    if m.count > len(ordered):
        notes.append(
            f"node {m.node_id} has {len(ordered)} cache domains for {m.count} ranks: "
            f"domain {fmt(ordered[slot])} is shared"
        )
    return ordered[slot], _ceil_div(m.count - slot, len(ordered))


MODES: dict[str, Callable[[ModeInput, list[str]], ModeResult]] = {
    "node": _node,
    "socket": _socket,
    "exclusive": _exclusive,
    "core-complex": _core_complex,
}
# the vocabulary (names, help) is numabind._model.MODE_TABLE; every name has its function
assert tuple(MODES) == MODE_NAMES, (tuple(MODES), MODE_NAMES)


# --- who shares a node: arithmetic, never a loop over the ranks --------------------------------


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def block_count(index: int, size: int, nodes: int) -> int:
    """How many of ``size`` ranks spread block-wise over ``nodes`` land on node ``index``:
    rank k goes to node k * nodes // size, so node i holds ranks
    [ceil(i * size / nodes), ceil((i + 1) * size / nodes))."""
    return _ceil_div((index + 1) * size, nodes) - _ceil_div(index * size, nodes)


def spread_block(rank: int, size: int, nodes: int) -> tuple[int, int, int]:
    """CPU-only jobs: ``size`` local ranks spread block-wise over ``nodes`` nodes.
    Returns (this rank's node index, its position on that node, ranks on that node)."""
    index = min(rank * nodes // size, nodes - 1)
    return index, rank - _ceil_div(index * size, nodes), block_count(index, size, nodes)


def peers_on_node(rank: int, size: int, devices: int, on_node: frozenset[int]) -> tuple[int, int]:
    """Rank ``k`` uses visible device ``k % devices``; ``on_node`` are the device indices on
    this rank's node.  Returns (this rank's position among the ranks on the node, how many
    ranks there are): the same as listing them, in O(devices)."""
    full, rem = divmod(size, devices)
    count = full * len(on_node) + sum(1 for j in on_node if j < rem)
    position = (rank // devices) * len(on_node) + sum(1 for j in on_node if j < rank % devices)
    return position, count


# --- a binding asked for explicitly --------------------------------------------------------------


def explicit(
    machine: Machine,
    *,
    cpus: frozenset[int] | None = None,
    node: int | None = None,
    memory: str = "preferred",
    spill: Spill = SPILL_CPU,
) -> Plan:
    """The plan of ``numabind run --node N`` or ``--cpus LIST`` (numactl's habits): those
    CPUs (of the node, as far as this process may use them) and the memory of their
    nodes under ``memory``, spilling as ``spill`` (``NUMABIND_SPILL``) says.  Never
    raises: a node without CPUs or CPUs outside the cgroup are a skip with the reason."""
    allowed = machine.allowed.cpus
    source = f"--node {node}" if node is not None else f"--cpus {fmt(cpus or ())}"
    planner = _Planner(
        machine, Request(local_rank=None, rank_source=source, memory=memory, spill=spill)
    )
    if node is not None:
        found = machine.node(node)
        if found is None or not found.cpus:
            why = "no such node" if found is None else "a node without CPUs (memory only)"
            return planner.skipped("bad-input", f"node {node}: {why}")
        cpus = found.cpus
    wanted = frozenset(cpus or ())
    chosen = wanted & allowed
    if not chosen:
        return planner.skipped(
            "cgroup", f"CPUs {fmt(wanted)} are all outside the CPUs this process may use"
        )
    if chosen != wanted:
        planner.notes.append(f"CPUs {fmt(wanted - chosen)} are outside the cgroup: left out")
    home = node if node is not None else machine.node_of_cpu(min(chosen))
    mem_nodes, policy = planner._memory(chosen, home)
    mask = planner._mask(mem_nodes, policy)
    return Plan(
        local_rank=None,
        rank_source=source,
        numa_node=home,
        cpus=chosen,
        memory_nodes=mem_nodes,
        memory_policy=policy,
        status="bound",
        reason=f"asked for: CPUs {fmt(chosen)}" + (f" of node {node}" if node is not None else ""),
        notes=tuple(planner.notes),
        spill=spill,
        memory_mask=mask,
        unmet=tuple(planner.unmet),
    )


# --- a rank's helper processes -------------------------------------------------------------------


def worker_cpus(
    p: Plan,
    placement: str,
    worker: int,
    workers: int,
    siblings_of: Callable[[int], frozenset[int]],
) -> tuple[frozenset[int], str | None]:
    """Where helper process ``worker`` of ``workers`` (a DataLoader worker) of a rank bound
    to ``p`` runs, under ``NUMABIND_WORKERS``: ``share`` the rank's compute CPUs; ``spread``
    one disjoint set of whole cores of them each (split as exclusive mode splits a node;
    with more workers than cores, core ``worker % cores``); ``reserved`` the rank's helper
    cores (``NUMABIND_RESERVE``), or its compute CPUs with a note when it has none.  Never
    another rank's cores: every answer lies in the rank's own sets."""
    if placement == "reserved":
        if p.helpers:
            return p.helpers, None
        return p.cpus, "NUMABIND_WORKERS=reserved without reserved cores (NUMABIND_RESERVE)"
    if placement != "spread" or workers <= 1 or not p.cpus:
        return p.cpus, None
    cores = groups(p.cpus, siblings_of)
    if workers > len(cores):
        return cores[worker % len(cores)], None
    each, extra = divmod(len(cores), workers)
    start = worker * each + min(worker, extra)
    take = each + (1 if worker < extra else 0)
    return frozenset().union(*cores[start : start + take]), None
