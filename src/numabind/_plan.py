"""The plan: which CPUs and memory nodes one local rank should use, and why.

:func:`plan` is a pure function of a :class:`~numabind._topology.Machine` (read lazily,
but a value once read) and a :class:`Request` (rank and visible devices, already resolved
from the environment).  It reads no environment and makes no system call, it never raises,
and every decision lands in ``Plan.reason`` as one line a person can act on.
"""

from __future__ import annotations

from . import _sysfs
from ._model import Accelerator, Record, _set

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ._devices import Visible
    from ._ranks import RankInfo
    from ._topology import Machine

MODES = ("node", "socket", "exclusive", "core-complex")
MEMORY_POLICIES = ("preferred", "bind", "interleave", "local", "none")


class Request(Record):
    """What to plan for: a local rank, the devices its runtime sees, and how to bind."""

    __slots__ = (
        "local_rank",
        "local_world_size",
        "rank_source",
        "visible",
        "mode",
        "memory",
        "problem",
        "size_source",
    )
    local_rank: int | None
    local_world_size: int | None
    rank_source: str | None
    visible: Visible | None
    mode: str
    memory: str
    problem: str | None
    size_source: str | None

    def __init__(
        self,
        local_rank: int | None,
        local_world_size: int | None = None,
        rank_source: str | None = None,
        visible: Visible | None = None,
        mode: str = "node",
        memory: str = "preferred",
        problem: str | None = None,
        size_source: str | None = None,
    ) -> None:
        _set(self, "local_rank", local_rank)
        _set(self, "local_world_size", local_world_size)
        _set(self, "rank_source", rank_source)
        _set(self, "visible", visible)
        _set(self, "mode", mode)
        _set(self, "memory", memory)
        _set(self, "problem", problem)
        _set(self, "size_source", size_source)


def request_for(info: RankInfo, visible: Visible | None, mode: str, memory: str) -> Request:
    """The request for a rank found in an environment (:func:`numabind._ranks.detect`)."""
    return Request(
        info.local_rank,
        info.local_world_size,
        info.rank_source,
        visible,
        mode,
        memory,
        info.problem,
        info.size_source,
    )


class Plan(Record):
    """One rank's binding.  ``status`` is ``bound`` (apply it) or ``skipped`` (leave the
    process as it is); ``reason`` says why in one line; ``notes`` carry the smaller things
    a user should know (a rank wrapped modulo the device count, a fallback mode)."""

    __slots__ = (
        "local_rank",
        "rank_source",
        "local_world_size",
        "device",
        "device_index",
        "numa_node",
        "cpus",
        "memory_nodes",
        "memory_policy",
        "mode",
        "status",
        "reason",
        "notes",
        "problem",
        "size_source",
    )
    local_rank: int | None
    rank_source: str | None
    local_world_size: int | None
    device: Accelerator | None
    device_index: int | None
    numa_node: int | None
    cpus: frozenset[int]
    memory_nodes: frozenset[int]
    memory_policy: str
    mode: str
    status: str
    reason: str
    notes: tuple[str, ...]
    problem: bool
    size_source: str | None

    def __init__(
        self,
        local_rank: int | None,
        rank_source: str | None,
        local_world_size: int | None,
        device: Accelerator | None,
        device_index: int | None,
        numa_node: int | None,
        cpus: frozenset[int],
        memory_nodes: frozenset[int],
        memory_policy: str,
        mode: str,
        status: str,
        reason: str,
        notes: tuple[str, ...] = (),
        problem: bool = False,
        size_source: str | None = None,
    ) -> None:
        _set(self, "local_rank", local_rank)
        _set(self, "rank_source", rank_source)
        _set(self, "local_world_size", local_world_size)
        _set(self, "device", device)
        _set(self, "device_index", device_index)
        _set(self, "numa_node", numa_node)
        _set(self, "cpus", cpus)
        _set(self, "memory_nodes", memory_nodes)
        _set(self, "memory_policy", memory_policy)
        _set(self, "mode", mode)
        _set(self, "status", status)
        _set(self, "reason", reason)
        _set(self, "notes", notes)
        _set(self, "problem", problem)
        _set(self, "size_source", size_source)

    @property
    def bound(self) -> bool:
        return self.status == "bound"

    def to_dict(self) -> dict[str, object]:
        d = self.device
        return {
            "local_rank": self.local_rank,
            "rank_source": self.rank_source,
            "local_world_size": self.local_world_size,
            "device_index": self.device_index,
            "device_pci": d.pci if d else None,
            "numa_node": self.numa_node,
            "cpus": sorted(self.cpus),
            "memory_nodes": sorted(self.memory_nodes),
            "memory_policy": self.memory_policy,
            "mode": self.mode,
            "status": self.status,
            "reason": self.reason,
            "notes": list(self.notes),
            "problem": self.problem,
            "size_source": self.size_source,
        }

    def summary(self) -> str:
        """One line: what this rank gets, or why it gets nothing."""
        who = "no local rank" if self.local_rank is None else f"local rank {self.local_rank}"
        if self.rank_source:
            who += f" ({self.rank_source}"
            if self.local_world_size is not None:
                who += f"; {self.local_world_size} local ranks"
                if self.size_source:
                    who += f" from {self.size_source}"
            who += ")"
        if not self.bound:
            return f"{who}: not bound: {self.reason}"
        mem = self.memory_policy
        if self.memory_nodes and mem not in ("none", "local"):
            mem += f" on node{'s' if len(self.memory_nodes) > 1 else ''} " + _sysfs.format_cpulist(
                self.memory_nodes
            )
        return f"{who}: CPUs {_sysfs.format_cpulist(self.cpus)}, memory {mem}: {self.reason}"


fmt = _sysfs.format_cpulist


class _Skip(Exception):
    """A skip.  ``problem`` marks one caused by bad input or a machine that forbids the
    plan (worth a warning), as opposed to a benign one (one NUMA node, no accelerator)."""

    def __init__(self, reason: str, problem: bool = True) -> None:
        super().__init__(reason)
        self.problem = problem


def _describe(dev: Accelerator, index: int | None) -> str:
    label = f"{dev.vendor.upper() if dev.vendor != 'nvidia' else 'GPU'}"
    where = f"{dev.pci}" if index is None else f"{index} ({dev.pci})"
    return f"{label} {where}"


def device_node(
    machine: Machine, dev: Accelerator
) -> tuple[int | None, frozenset[int] | None, str]:
    """The CPU-bearing NUMA node next to a device: (node, narrower CPU locality, how known).

    ``numa_node`` from sysfs is the answer when it names a node with CPUs.  When it is
    unknown (-1) or names a memory-only node, the device's CPU locality decides: equal to,
    or inside, one node's CPUs identifies that node.  A locality narrower than the machine
    but spanning several nodes is returned as CPUs alone.  Distances are never used: on
    POWER9 every GPU memory node is at the same distance from every CPU node.
    """
    cpu_nodes = machine.cpu_nodes
    if dev.numa_node is not None:
        n = machine.node(dev.numa_node)
        if n is not None and n.cpus:
            return n.id, None, f"sysfs numa_node {n.id}"
    local = dev.local_cpus
    if local is not None:
        local = local & machine.online_cpus
    if local:
        inside = [n for n in cpu_nodes if local <= n.cpus]
        if len(inside) == 1:
            return inside[0].id, None, f"its local CPUs {fmt(local)} lie in node {inside[0].id}"
        if local != machine.online_cpus:
            covering = [n for n in cpu_nodes if n.cpus and n.cpus <= local]
            if len(covering) == 1:
                return covering[0].id, None, f"its local CPUs match node {covering[0].id}"
            return None, local, f"its local CPUs {fmt(local)} span several nodes"
    if len(cpu_nodes) == 1:
        return cpu_nodes[0].id, None, "the machine has one node with CPUs"
    return None, None, "unknown"


def plan(machine: Machine, request: Request) -> Plan:
    """Plan one rank's binding on ``machine``.  Never raises (an odd machine is a skip)."""
    try:
        return _Planner(machine, request).run()
    except Exception as err:  # a capture we did not foresee must not break a process
        return _skipped(
            request, f"numabind could not plan on this machine ({type(err).__name__}: {err})"
        )


def _skipped(
    request: Request,
    reason: str,
    device: Accelerator | None = None,
    index: int | None = None,
    node: int | None = None,
    notes: tuple[str, ...] = (),
    problem: bool = True,
) -> Plan:
    return Plan(
        request.local_rank,
        request.rank_source,
        request.local_world_size,
        device,
        index,
        node,
        frozenset(),
        frozenset(),
        "none",
        request.mode,
        "skipped",
        reason,
        notes,
        problem,
        request.size_source,
    )


class _Planner:
    def __init__(self, machine: Machine, request: Request) -> None:
        self.m = machine
        self.r = request
        self.notes: list[str] = list(request.visible.notes) if request.visible else []
        self.device: Accelerator | None = None
        self.index: int | None = None
        self.node: int | None = None

    def run(self) -> Plan:
        try:
            return self._run()
        except _Skip as s:
            return _skipped(
                self.r, str(s), self.device, self.index, self.node, tuple(self.notes), s.problem
            )

    # --- which device, which node
    def _run(self) -> Plan:
        r = self.r
        if r.mode not in MODES:
            raise _Skip(f"unknown mode {r.mode!r} (use one of {', '.join(MODES)})")
        if r.memory not in MEMORY_POLICIES:
            raise _Skip(
                f"unknown memory policy {r.memory!r} (use one of {', '.join(MEMORY_POLICIES)})"
            )
        if r.problem:
            raise _Skip(r.problem)
        visible = r.visible
        if visible is not None and visible.problem:
            raise _Skip(visible.problem)
        devs = visible.devices if visible is not None else ()
        allowed = self.m.allowed.cpus
        what: str
        node_id: int | None
        locality: frozenset[int] | None = None
        one_node = len(self.m.cpu_nodes) <= 1 and r.mode in ("node", "socket")
        if one_node:
            if devs and (r.local_rank is not None or len(devs) == 1):
                self.device, self.index = self._pick_device(devs)
            raise _Skip("this machine has one NUMA node with CPUs: nothing to bind", problem=False)
        if not devs:
            node_id, what = self._cpu_only_node(visible)
        else:
            dev, index = self._pick_device(devs)
            self.device, self.index = dev, index
            node_id, locality, how = device_node(self.m, dev)
            if node_id is None and locality is None:
                raise _Skip(
                    f"the NUMA node of {_describe(dev, index)} is unknown (sysfs numa_node is -1 "
                    "and its CPU locality is the whole machine); left unbound rather than guess"
                )
            what = (
                f"{_describe(dev, index)} is on node {node_id}"
                if node_id is not None
                else (f"{_describe(dev, index)}: {how}")
            )
        self.node = node_id
        if node_id is None:
            assert locality is not None
            base = locality & allowed
            if not base:
                raise _Skip(f"{what}, but this process may use only CPUs {fmt(allowed)}")
            cpus = base
            self.notes.append("node unknown: bound to the device's CPU locality instead")
        else:
            node = self.m.node(node_id)
            assert node is not None
            base = node.cpus & allowed
            if not base:
                raise _Skip(
                    f"{what}, whose CPUs {fmt(node.cpus)} are all outside the CPUs this process "
                    f"may use ({fmt(allowed) or 'none'}, from {self.m.allowed.source}); "
                    "not bound elsewhere"
                )
            cpus = self._mode_cpus(node_id, base, devs)
        mem_nodes, policy = self._memory(cpus, node_id)
        return Plan(
            r.local_rank,
            r.rank_source,
            r.local_world_size,
            self.device,
            self.index,
            node_id,
            frozenset(cpus),
            mem_nodes,
            policy,
            r.mode,
            "bound",
            what,
            tuple(self.notes),
            False,
            r.size_source,
        )

    def _pick_device(self, devs: tuple[Accelerator, ...]) -> tuple[Accelerator, int]:
        r = self.r
        if len(devs) == 1:
            return devs[0], 0
        if r.local_rank is None:
            nodes = {device_node(self.m, d)[0] for d in devs}
            if len(nodes) == 1 and None not in nodes:
                return devs[0], 0
            raise _Skip(
                f"{len(devs)} GPUs are visible, on nodes "
                f"{sorted(n for n in nodes if n is not None)}"
                " (or unknown), and no local rank picks one"
            )
        index = r.local_rank % len(devs)
        if r.local_rank >= len(devs):
            self.notes.append(
                f"local rank {r.local_rank} >= {len(devs)} visible devices: using device "
                f"{index} (rank modulo device count)"
            )
        return devs[index], index

    def _cpu_only_node(self, visible: Visible | None) -> tuple[int, str]:
        r = self.r
        why = visible.source if visible is not None else "no accelerator visible"
        size = r.local_world_size
        if r.local_rank is None or size is None or size <= 1:
            raise _Skip(
                f"no accelerator is visible ({why}) and no local world size > 1 to spread a "
                "CPU-only job",
                problem=False,
            )
        allowed = self.m.allowed.cpus
        nodes = [n for n in self.m.cpu_nodes if n.cpus & allowed]
        if not nodes:
            raise _Skip("no node has CPUs this process may use")
        k = min(r.local_rank * len(nodes) // size, len(nodes) - 1)
        node = nodes[k]
        return node.id, (
            f"no accelerator visible ({why}): CPU-only job, {size} local ranks spread "
            f"block-wise over nodes {fmt(n.id for n in nodes)}: node {node.id}"
        )

    # --- modes
    def _mode_cpus(
        self, node_id: int, base: frozenset[int], devs: tuple[Accelerator, ...]
    ) -> frozenset[int]:
        mode = self.r.mode
        if mode == "node":
            return base
        if mode == "socket":
            return self._socket(node_id, base)
        peers = self._node_peers(node_id, devs)
        if peers is None:
            self.notes.append(
                f"{mode} mode needs to know which local ranks share node {node_id} (the local "
                "world size and each rank's device); using node mode"
            )
            return base
        position, count = peers
        if mode == "exclusive":
            return self._exclusive(node_id, base, position, count)
        return self._core_complex(node_id, base, position)

    def _socket(self, node_id: int, base: frozenset[int]) -> frozenset[int]:
        node = self.m.node(node_id)
        assert node is not None
        pkg = self.m.package_of(min(node.cpus))
        if pkg is None:
            self.notes.append("package of the node's CPUs unknown: socket mode used the node")
            return base
        out = set(base)
        for n in self.m.cpu_nodes:
            if n.id != node_id and self.m.package_of(min(n.cpus)) == pkg:
                out |= n.cpus & self.m.allowed.cpus
        return frozenset(out)

    def _node_peers(self, node_id: int, devs: tuple[Accelerator, ...]) -> tuple[int, int] | None:
        """(this rank's position among the local ranks on its node, how many there are)."""
        r = self.r
        size = r.local_world_size
        if r.local_rank is None:
            return None
        if not devs:
            if size is None:
                return None
            nodes = [n for n in self.m.cpu_nodes if n.cpus & self.m.allowed.cpus]
            same = [
                k
                for k in range(size)
                if nodes[min(k * len(nodes) // size, len(nodes) - 1)].id == node_id
            ]
            return same.index(r.local_rank), len(same)
        if size is None:
            if len(self.m.cpu_nodes) == 1 and len(devs) > 1:
                size = len(devs)  # one node: every visible device's rank shares it
            else:
                return None
        if len(devs) == 1 and size > 1:
            return None  # one device per rank: the others' devices are not visible here
        same = [k for k in range(size) if device_node(self.m, devs[k % len(devs)])[0] == node_id]
        if r.local_rank not in same:
            return None
        return same.index(r.local_rank), len(same)

    def _exclusive(
        self, node_id: int, base: frozenset[int], position: int, count: int
    ) -> frozenset[int]:
        groups = self._groups(base, self.m.siblings_of)
        if len(groups) < count:
            self.notes.append(
                f"node {node_id} has {len(groups)} physical cores for {count} ranks: they share "
                "the node's CPUs"
            )
            return base
        each, extra = divmod(len(groups), count)
        start = position * each + min(position, extra)
        take = each + (1 if position < extra else 0)
        out: set[int] = set()
        for g in groups[start : start + take]:
            out |= g
        return frozenset(out)

    def _core_complex(self, node_id: int, base: frozenset[int], position: int) -> frozenset[int]:
        if self.m.cache_of(min(base)) is None:
            self.notes.append("cache domains unknown: core-complex mode used the node")
            return base
        domains = self._groups(base, lambda c: self.m.cache_of(c) or frozenset({c}))
        ordered = sorted(domains, key=lambda s: (-len(s), min(s)))
        return ordered[position % len(ordered)]

    @staticmethod
    def _groups(
        base: frozenset[int], shared_with: Callable[[int], frozenset[int]]
    ) -> list[frozenset[int]]:
        """Partition ``base`` by a per-CPU sharing relation (SMT siblings, cache domain),
        asking once per group rather than once per CPU: the startup hook reads these from
        sysfs, one file per question."""
        groups: list[frozenset[int]] = []
        seen: set[int] = set()
        for c in sorted(base):
            if c in seen:
                continue
            group = (shared_with(c) & base) | {c}
            seen |= group
            groups.append(frozenset(group))
        return sorted(groups, key=min)

    # --- memory
    def _memory(self, cpus: frozenset[int], node_id: int | None) -> tuple[frozenset[int], str]:
        policy = self.r.memory
        if policy == "none":
            return frozenset(), "none"
        nodes = {self.m.node_of_cpu(c) for c in cpus}
        mem = {n for n in nodes if n is not None}
        allowed_mems = self.m.allowed.mems
        if allowed_mems is not None and mem - allowed_mems:
            dropped = mem - allowed_mems
            mem &= allowed_mems
            self.notes.append(f"memory nodes {fmt(dropped)} are outside this process's cpuset.mems")
        if not mem:
            self.notes.append(
                "no memory node this process may use holds its CPUs: memory left alone"
            )
            return frozenset(), "none"
        if policy == "preferred" and len(mem) > 1:
            if self.m.kernel_at_least(5, 15):
                return frozenset(mem), "preferred-many"
            first = node_id if node_id in mem else min(mem)
            self.notes.append(
                f"kernel before 5.15 has no MPOL_PREFERRED_MANY: preferring node {first}"
            )
            return frozenset({first}), "preferred"
        return frozenset(mem), policy
