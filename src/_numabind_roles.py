"""The warm start's planner for what the knobs add: socket and exclusive modes, reserved
helper cores (``NUMABIND_RESERVE``), priority cores (``NUMABIND_PRIORITY``), one thread per
core (``NUMABIND_SMT=1``) and CPU-only jobs.

``_numabind_fast`` plans a rank with none of these itself (the default, and the common
case) and imports this module only for a rank that sets one: every line of code the warm
start loads is paid for by every rank of a job, so the default path carries none of the
code it does not run.  Each function here is the fast-path copy of one rule of
``numabind._plan`` (named in its docstring); ``tests/test_fast.py`` holds every plan made
here to the planner's on generated machines and the shipped captures.  Like
``_numabind_fast`` it imports only ``_numabind_start`` and ``_numabind_fast`` and raises
only :class:`~_numabind_start.Handover` (the full path then plans the rank).
"""

import _numabind_fast as fast
from _numabind_start import Handover

TYPE_CHECKING = False
if TYPE_CHECKING:
    from _numabind_fast import Dev, _Machine


def one(m: "_Machine", name: str, node: int) -> "list[str] | None":
    """The tokens of the quick fact ``name`` for ``node`` (None: the cache has no line)."""
    for t in m.q.get(name, []):
        if t and t[0] == str(node):
            return t[1:]
    return None


def groups(m: "_Machine", name: str, node: int) -> "list[frozenset[int]]":
    """A node's cores (``cores``, ``node-cores``, ``prio-cores``) as CPU sets; a cache
    made for a rank that needed none of them holds none: the full path reads them."""
    found = one(m, name, node)
    if found is None:
        raise Handover(f"the cache does not hold the {name} of node {node} yet")
    out = []
    for g in found:
        cpus = fast.parse_cpulist(g)
        if not cpus:
            raise Handover(f"a damaged cache line ({name})")
        out.append(cpus)
    return out


def package_nodes(m: "_Machine", node: int) -> "frozenset[int] | None":
    """The nodes of ``node``'s package (socket mode); None when the machine does not say."""
    found = one(m, "package", node)
    if found is None:
        raise Handover("the cache does not hold the packages")
    return None if found == ["-"] else fast.parse_cpulist(found[0], fast.MAX_NODES)


def kinds_distinct(m: "_Machine") -> bool:
    """Whether the machine's files tell its cores apart (numabind._plan: one kind of core
    means no priority cores, and a one-node machine has then nothing to bind)."""
    found = m.q.get("kinds")
    if not found:
        raise Handover("the cache does not hold the core kinds yet")
    return found[0] == ["1"]


def priority(m: "_Machine", node: int) -> "frozenset[int]":
    """``node``'s priority cores' CPUs (empty where the files do not tell cores apart)."""
    kinds_distinct(m)
    found = one(m, "prio", node)
    return (
        frozenset()
        if not found or found == ["-"]
        else (fast.parse_cpulist(found[0]) or frozenset())
    )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _peers(
    rank: int,
    size: "int | None",
    devs: "list[Dev]",
    nodes: "frozenset[int]",
    one_node: bool,
) -> "tuple[int, int] | None":
    """numabind._plan's _device_peers and peers_on_node: this rank's position among the
    local ranks whose devices are on ``nodes``, and how many there are."""
    if size is None:
        if one_node and len(devs) > 1:
            size = len(devs)
        else:
            return None
    if len(devs) == 1 and size > 1:
        return None
    on_node = frozenset(j for j, d in enumerate(devs) if d[1] in nodes)
    if rank % len(devs) not in on_node or rank >= size:
        return None
    full, rem = divmod(size, len(devs))
    count = full * len(on_node) + sum(1 for j in on_node if j < rem)
    position = (rank // len(devs)) * len(on_node) + sum(1 for j in on_node if j < rank % len(devs))
    return position, count


def _split(cores: "list[frozenset[int]]", position: int, count: int) -> "frozenset[int]":
    """numabind._plan's even split of cores among ``count`` ranks: the first ones get one
    more where they do not divide."""
    each, extra = divmod(len(cores), count)
    start = position * each + min(position, extra)
    take = each + (1 if position < extra else 0)
    return frozenset().union(*cores[start : start + take])


def _within(groups: "list[frozenset[int]]", cpus: "frozenset[int]") -> "list[frozenset[int]]":
    return [g & cpus for g in groups if g & cpus]


def plan(
    m: "_Machine",
    cfg: "dict[str, str]",
    source: str,
    rank: int,
    size: "int | None",
    devs: "list[Dev]",
    why: str,
    cpu_nodes: "list[int]",
    one_node: bool,
) -> "dict[str, object]":
    """numabind._plan.plan for a rank whose knobs ask for more than its node's CPUs (or
    that sees no device): ``_numabind_fast.plan`` has found its devices."""
    priority_role = cfg["priority"]
    index_of: int | None
    if devs:
        node, reason, device, index_of = fast.place(m, rank, devs)
        peers = None
        if cfg["mode"] != "node" or priority_role != "off":
            peers = _peers(rank, size, devs, frozenset({node}), one_node)
    else:
        node, reason, device, index_of, peers = _cpu_only(m, cfg, rank, size or 0, why, cpu_nodes)
    cpus, pkg, package_peers = _mode_cpus(m, cfg, node, peers, rank, size, devs, one_node)
    prio: frozenset[int] = frozenset()
    main: frozenset[int] = frozenset()
    if priority_role != "off":
        cpus, main, prio = _priority(m, cfg, node, pkg, cpus, peers, package_peers, rank)
    if cfg["smt"] == "1":
        cores = groups(m, "cores", node)
        for n in sorted(pkg or ()):
            if n != node:
                cores = cores + groups(m, "cores", n)
        cpus = frozenset(min(g) for g in _within(cores, cpus))
        main = frozenset(min(g) for g in _within(cores, main))
    return fast.result(m, cfg, source, rank, size, node, reason, device, index_of, cpus, prio, main)


def _cpu_only(
    m: "_Machine", cfg: "dict[str, str]", rank: int, size: int, why: str, cpu_nodes: "list[int]"
) -> "tuple[int, str, str, None, tuple[int, int]]":
    """numabind._plan's _cpu_only_node: ranks spread block-wise over the allowed nodes."""
    if why != "no accelerator found":
        raise Handover("no device is visible")
    nodes = [n for n in cpu_nodes if m.nodes[n] & m.allowed]
    if not nodes or cfg["mode"] == "socket" or cfg["priority"] != "off":
        raise Handover("a CPU-only job the fast path does not spread")
    index = min(rank * len(nodes) // size, len(nodes) - 1)
    node = nodes[index]
    position = rank - _ceil_div(index * size, len(nodes))
    count = _ceil_div((index + 1) * size, len(nodes)) - _ceil_div(index * size, len(nodes))
    plural = "" if size == 1 else "s"
    reason = (
        f"no accelerator visible ({why}): CPU-only job, {size} local rank{plural} spread "
        f"block-wise over nodes {fast.cpulist(nodes)}: node {node}"
    )
    return node, reason, "", None, (position, count)


def _mode_cpus(
    m: "_Machine",
    cfg: "dict[str, str]",
    node: int,
    peers: "tuple[int, int] | None",
    rank: int,
    size: "int | None",
    devs: "list[Dev]",
    one_node: bool,
) -> "tuple[frozenset[int], frozenset[int] | None, tuple[int, int] | None]":
    """numabind._plan's modes (node, socket, exclusive), less the reserved cores: (the
    rank's CPUs, its package's nodes in socket mode, its peers on that package)."""
    base = m.nodes[node] & m.allowed
    if not base:
        raise Handover("the cgroup forbids every CPU of the device's node")
    mode = cfg["mode"]
    pkg = package_nodes(m, node) if mode == "socket" else None
    reserved: frozenset[int] = frozenset()
    if cfg["reserve"]:
        reserved, m.helpers = _reserve(m, cfg, node, peers, pkg)
    m.reserved = reserved
    base -= reserved
    if mode == "socket":
        if pkg is None:
            return base, None, None
        if not devs:
            raise Handover("a CPU-only job in socket mode")
        others = (m.nodes.get(n, frozenset()) & m.allowed for n in pkg if n != node)
        cpus = frozenset(base.union(*others)) - reserved
        return cpus, pkg, _peers(rank, size, devs, pkg, one_node)
    if mode == "exclusive":
        # what the planner's exclusive mode cannot do it says in a line: the full path's
        if peers is None:
            raise Handover("exclusive mode without the ranks that share the node")
        cores = _within(groups(m, "cores", node), base)
        if len(cores) < peers[1]:
            raise Handover("exclusive mode with fewer cores than ranks")
        return _split(cores, peers[0], peers[1]), None, None
    return base, None, None


def _reserve(
    m: "_Machine",
    cfg: "dict[str, str]",
    node: int,
    peers: "tuple[int, int] | None",
    pkg: "frozenset[int] | None",
) -> "tuple[frozenset[int], frozenset[int]]":
    """numabind._plan's _reserve: (the cores NUMABIND_RESERVE keeps out of the compute sets
    on the nodes the mode draws from, this rank's helper set)."""
    count, _, scope = cfg["reserve"].partition("/")
    n = int(count)
    ranks = peers[1] if peers else None
    if scope == "rank" and ranks is None:
        raise Handover("a reservation per rank without the ranks that share the node")
    want = n * ranks if scope == "rank" and ranks else n
    nodes = [node, *sorted((pkg or frozenset()) - {node})] if cfg["mode"] == "socket" else [node]
    out: set[int] = set()
    mine: list[frozenset[int]] = []
    for nid in nodes:
        if not m.nodes.get(nid):
            continue
        cores = groups(m, "node-cores", nid)
        usable = [c & m.allowed for c in cores if c & m.allowed]
        need = want - (len(cores) - len(usable))
        if need <= 0:
            continue
        if need >= len(usable):
            raise Handover("a reservation that would leave a node no core")
        if cfg["priority"] != "off":
            quick = priority(m, nid)
            usable = [c for c in usable if c & quick] + [c for c in usable if not c & quick]
        taken = usable[len(usable) - need :]
        if nid == node:
            mine = taken
        for core in taken:
            out |= core
    if not out:
        return frozenset(), frozenset()
    helpers = frozenset(out)
    if scope == "rank" and ranks is not None and peers and mine:
        position = peers[0]
        share = mine[position * n : (position + 1) * n] if len(mine) >= n * ranks else mine
        helpers = frozenset().union(*share)
    return frozenset(out), helpers


def _priority(
    m: "_Machine",
    cfg: "dict[str, str]",
    node: int,
    pkg: "frozenset[int] | None",
    cpus: "frozenset[int]",
    peers: "tuple[int, int] | None",
    package_peers: "tuple[int, int] | None",
    rank: int,
) -> "tuple[frozenset[int], frozenset[int], frozenset[int]]":
    """numabind._plan's _priority: (compute set, main-thread CPUs, priority cores)."""
    mode, role = cfg["mode"], cfg["priority"]
    nodes = [node]
    if mode == "socket":
        nodes += sorted((pkg or frozenset()) - {node})
        peers = package_peers if package_peers else peers
    pool: set[int] = set()
    quick: set[int] = set()
    prio_groups: list[frozenset[int]] = []
    for n in nodes:
        pool |= m.nodes.get(n, frozenset()) & m.allowed
        here = priority(m, n)
        quick |= here
        if here:
            prio_groups += groups(m, "prio-cores", n)
    prio = frozenset(quick & (pool - m.reserved))
    if not prio:
        return cpus, frozenset(), frozenset()
    cores = sorted(_within(prio_groups, prio), key=min)
    if role == "main":
        if mode == "exclusive":
            own = _within(cores, cpus)
            return cpus, (own[0] if own else frozenset()), prio
        if peers is None:
            return cpus, cores[rank % len(cores)], prio
        return cpus, cores[peers[0] % len(cores)], prio
    if peers is None:
        return prio, frozenset(), prio
    position, count = peers
    if len(cores) < count:
        return cores[position % len(cores)], frozenset(), prio
    return _split(cores, position, count), frozenset(), prio
