"""The binding modes: which of a node's CPUs one rank gets.

Each mode is one small function of a :class:`ModeInput` (the machine, the rank's node,
the CPUs of that node this process may use, and the rank's position among the local ranks
on that node) returning the rank's CPUs; :data:`MODES` is the table the planner, the CLI
and the configuration read, so a mode is added in one place.

Who shares a node is computed arithmetically from the local world size (see
:func:`peers_on_node` and :func:`spread_block`), never by looping over the ranks: a
``LOCAL_WORLD_SIZE`` of any size costs what the machine's own sizes cost.
"""

from __future__ import annotations

from ._model import Record
from ._sysfs import format_cpulist as fmt

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ._topology import Machine


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
MODE_NAMES = tuple(MODES)
MODE_HELP = {
    "node": "every CPU of the GPU's NUMA node (default)",
    "socket": "every CPU of the GPU's package (all its NUMA nodes)",
    "exclusive": "the GPU's node split into disjoint sets of whole cores, one per rank",
    "core-complex": "one cache domain (L3 / CCX) of the GPU's node per rank",
}


# --- who shares a node: arithmetic, never a loop over the ranks ----------------------------


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
