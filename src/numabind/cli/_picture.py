"""The picture of a machine and its ranks, as a model both renderers draw: the SVG
(``show --svg``, :mod:`numabind.cli._svg`) and the terminal drawing (``show --draw``).

One model so that the two never disagree: per package, per NUMA node, its cache domains
(L3 / CCX: what ``core-complex`` binds to), their cores with the SMT threads of each, and
for every CPU the *set* of local ranks planned onto it.  A set, not a rank: in node mode
four to eight ranks share every CPU of a node, and a picture that coloured a CPU by one
rank hid the others.  Each distinct set gets a colour (and a letter in the terminal),
listed in the legend, and every rank also has its own line in its node's box, so every
rank is visible in every mode.  Accelerators are drawn in the box of the node the plan
binds them to; a memory-only node (GPU HBM on GH200/GB200) with the GPU it belongs to.
"""

from __future__ import annotations

from .._model import NODE_KINDS, Record
from .._plan import describe_device, device_node
from .._sysfs import format_cpulist

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .._model import Accelerator
    from .._plan import Plan
    from .._topology import Machine

fmt = format_cpulist
# Kelly's 22 colours of maximum contrast, without white and black: 20; more sets than that
# get colours spread by the golden angle (distinct for any number)
PALETTE = (
    "#f3c300", "#875692", "#f38400", "#a1caf1", "#be0032", "#c2b280", "#00a6a6",
    "#008856", "#e68fac", "#0067a5", "#f99379", "#604e97", "#f6a600", "#b3446c",
    "#dcd300", "#882d17", "#8db600", "#654522", "#e25822", "#2b3d26",
)  # fmt: skip
# the rank sets' letters: none of the marks the drawing uses for something else (x: not
# allowed, r: reserved, .: free, *: a core shared by sets, ?: a set beyond these letters)
MARKS = "xr.*?"
SYMBOLS = "".join(
    c
    for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789#$%&+=@^~<>[]{}|/\\!;:"
    if c not in MARKS
)
DISALLOWED = "#d9d9d9"
FREE = "#ffffff"
RESERVED = "#6b6b6b"  # NUMABIND_RESERVE: the system's and the helpers' cores
PRIORITY = "#000000"  # the frame of a priority core (NUMABIND_PRIORITY)


def colour(i: int) -> str:
    """The colour of the i-th rank set: Kelly's palette, then golden-angle hues."""
    if i < len(PALETTE):
        return PALETTE[i]
    hue = (i * 137.508) % 360
    light = 45 if i % 2 else 62
    return f"hsl({hue:.1f},65%,{light}%)"


def symbol(i: int) -> str:
    return SYMBOLS[i] if i < len(SYMBOLS) else "?"


def ranks_text(ranks: frozenset[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {fmt(ranks)}"


class Cell(Record):
    """One CPU: whether this process may use it, and the ranks planned onto it."""

    cpu: int
    allowed: bool
    ranks: frozenset[int]
    reserved: bool = False  # kept out of every compute set (NUMABIND_RESERVE)
    priority: bool = False  # of its node's fastest kind (NUMABIND_PRIORITY's cores)


class Core(Record):
    cells: tuple[Cell, ...]  # its SMT threads, first thread first


class CacheGroup(Record):
    """The cores sharing one last-level cache (an L3, an AMD CCX)."""

    cpus: frozenset[int]
    cores: tuple[Core, ...]
    known: bool  # False: the machine does not say (drawn as one group, labelled so)


class GpuLine(Record):
    text: str
    ranks: frozenset[int]


class NodeBox(Record):
    id: int
    header: str
    groups: tuple[CacheGroup, ...]
    gpus: tuple[GpuLine, ...]
    ranks: tuple[tuple[int, str], ...]  # (rank, its line)
    nics: tuple[GpuLine, ...] = ()  # the RDMA adapters on the node, with the ranks given each


class RankSet(Record):
    """A distinct set of ranks sharing CPUs, with its colour and letter."""

    ranks: frozenset[int]
    colour: str
    symbol: str
    cpus: frozenset[int]


class Picture(Record):
    title: str
    subtitle: str
    packages: tuple[tuple[str, tuple[NodeBox, ...]], ...]
    unplaced: tuple[GpuLine, ...]
    skipped: tuple[str, ...]
    sets: tuple[RankSet, ...]
    distances: tuple[tuple[str, ...], ...]  # rows, the first one the header
    smt: int
    reserved: frozenset[int] = frozenset()  # the plans' helper cores
    priority: frozenset[int] = frozenset()  # every node's priority cores
    kinds_source: str = ""  # the file that told the cores apart
    main: frozenset[int] = frozenset()  # the CPUs the ranks' main threads are pinned to

    def set_of(self, ranks: frozenset[int]) -> RankSet | None:
        return next((s for s in self.sets if s.ranks == ranks), None)


def _device_nodes(machine: Machine, plans: list[Plan]) -> dict[str, int | None]:
    """Where each accelerator is drawn: the node a plan binds it to, else the planner's
    rule for the device (so the picture never disagrees with the plan JSON)."""
    where: dict[str, int | None] = {}
    for p in plans:
        if p.device is not None and p.bound and p.numa_node is not None:
            where.setdefault(p.device.pci, p.numa_node)
    for a in machine.all_accelerators:
        if a.pci not in where:
            where[a.pci] = device_node(machine, a).node
    return where


def _groups(
    machine: Machine,
    cpus: frozenset[int],
    owner: dict[int, set[int]],
    reserved: frozenset[int] = frozenset(),
    priority: frozenset[int] = frozenset(),
) -> tuple[CacheGroup, ...]:
    """The node's cores grouped by cache domain, each core with its SMT threads."""
    allowed = machine.allowed.cpus
    cores: list[tuple[int, ...]] = []
    seen: set[int] = set()
    for c in sorted(cpus):
        if c not in seen:
            sib = tuple(sorted((machine.siblings_of(c) & cpus) | {c}))
            seen.update(sib)
            cores.append(sib)
    by_cache: dict[frozenset[int], list[tuple[int, ...]]] = {}
    for core in cores:
        cache = machine.cache_of(core[0])
        key = (cache & cpus) if cache else frozenset()
        by_cache.setdefault(key, []).append(core)
    out = []
    for key, members in sorted(by_cache.items(), key=lambda kv: min(kv[1][0])):
        out.append(
            CacheGroup(
                cpus=key or frozenset(c for core in members for c in core),
                known=bool(key),
                cores=tuple(
                    Core(
                        cells=tuple(
                            Cell(
                                cpu=c,
                                allowed=c in allowed,
                                ranks=frozenset(owner.get(c, ())),
                                reserved=c in reserved,
                                priority=c in priority,
                            )
                            for c in core
                        )
                    )
                    for core in members
                ),
            )
        )
    return tuple(out)


def _gpu_line(a: Accelerator, index: int | None, ranks: list[int], extra: str = "") -> GpuLine:
    text = describe_device(a, index)
    if a.name:
        text += f" {a.name}"
    text += extra
    text += f": {ranks_text(frozenset(ranks))}" if ranks else ": no rank"
    return GpuLine(text=text, ranks=frozenset(ranks))


def build(machine: Machine, plans: list[Plan], mode: str, memory: str) -> Picture:
    """The picture of ``machine`` with the ranks ``plans`` place on it."""
    owner: dict[int, set[int]] = {}
    for p in plans:
        if p.bound and p.local_rank is not None:
            for cpu in p.cpus:
                owner.setdefault(cpu, set()).add(p.local_rank)
    reserved = frozenset().union(*(p.helpers for p in plans if p.bound))
    priority = frozenset().union(*(machine.priority_cpus(n.id) for n in machine.cpu_nodes))
    where = _device_nodes(machine, plans)
    ranks_by_pci: dict[str, list[int]] = {}
    index_of: dict[str, int | None] = {}
    for p in plans:
        if p.device is not None and p.local_rank is not None:
            ranks_by_pci.setdefault(p.device.pci, []).append(p.local_rank)
            index_of.setdefault(p.device.pci, p.device_index)  # a split GPU: its first
    accs = machine.all_accelerators
    hbm = {a.memory_node: a for a in accs if a.memory_node is not None}
    sets = _rank_sets(owner)
    nics_here = _nic_lines(machine, plans) if any(p.nics for p in plans) else {}
    packages: dict[int | None, list[NodeBox]] = {}
    sizes = {n.id: n.memory_bytes for n in machine.nodes}
    for n in machine.nodes:
        if not n.cpus and n.id in hbm and where.get(hbm[n.id].pci) is not None:
            continue  # drawn with its GPU, in the box of the node the GPU's ranks use
        pkg = machine.package_of_node(n.id)
        gpus = tuple(
            _gpu_line(
                a,
                index_of.get(a.pci),
                ranks_by_pci.get(a.pci, []),
                _hbm_text(a.memory_node, sizes),
            )
            for a in accs
            if where.get(a.pci) == n.id
        )
        kind = NODE_KINDS.get(n.kind or "")
        label = kind.label if kind is not None and n.kind != "memory" else "memory only"
        header = f"node {n.id}: " + (f"CPUs {fmt(n.cpus)}" if n.cpus else label)
        header += f", {_size(n.memory_bytes)}"
        if n.tier is not None:
            header += f", memory tier {n.tier}"
        if not n.cpus and n.id in hbm:
            gpu = hbm[n.id]
            header += f", the memory of {describe_device(gpu, index_of.get(gpu.pci))}"
        lines = tuple(
            (
                p.local_rank or 0,
                f"rank {p.local_rank}: CPUs {fmt(p.cpus)}, memory {p.memory_text()}"
                + (f", main thread on {fmt(p.main_cpus)}" if p.main_cpus else "")
                + "".join(f", NIC {c.label} ({c.relation})" for c in p.nics),
            )
            for p in plans
            if p.bound and p.numa_node == n.id
        )
        packages.setdefault(pkg, []).append(
            NodeBox(
                id=n.id,
                header=header,
                groups=_groups(machine, n.cpus, owner, reserved, priority) if n.cpus else (),
                gpus=gpus,
                ranks=lines,
                nics=nics_here.get(n.id, ()),
            )
        )
    ordered = sorted(packages.items(), key=lambda kv: (kv[0] is None, kv[0] or 0))
    return Picture(
        title=f"numabind: {machine.description}",
        subtitle=f"mode {mode}, memory {memory}{_roles_text(plans)}; {len(plans)} local rank"
        + ("" if len(plans) == 1 else "s"),
        packages=tuple(
            (f"package {k}" if k is not None else "memory-only nodes", tuple(v)) for k, v in ordered
        ),
        unplaced=tuple(
            _gpu_line(a, index_of.get(a.pci), ranks_by_pci.get(a.pci, []), ", node unknown")
            for a in accs
            if where.get(a.pci) is None
        ),
        skipped=tuple(f"rank {p.local_rank}: {p.reason}" for p in plans if not p.bound),
        sets=sets,
        distances=_distances(machine),
        smt=machine.smt,
        reserved=reserved,
        priority=priority,
        kinds_source=machine.core_kinds.source if priority else "",
        main=frozenset().union(*(p.main_cpus for p in plans if p.bound)),
    )


def _nic_lines(machine: Machine, plans: list[Plan]) -> dict[int, tuple[GpuLine, ...]]:
    """Per node, a line for each RDMA adapter on it: the ranks given it, or why it is
    never chosen (drawn only for plans that carry NICs: ``show`` makes those)."""
    from .._nics import nic_node, offered

    units, refused = offered(machine)
    out: dict[int, list[GpuLine]] = {}
    for nic in machine.nics:
        node = nic_node(machine, nic)
        if node is None:
            continue
        ranks = frozenset(
            p.local_rank
            for p in plans
            if p.local_rank is not None
            and any(c.pci == nic.pci and c.name == nic.name for c in p.nics)
        )
        rate = max((u.rate or 0 for u in units if u.nic == nic), default=0)
        text = f"NIC {nic.name or 'network adapter'} ({nic.pci}" + (
            f", {rate:g} Gb/s)" if rate else ")"
        )
        why = next((r.why for r in refused if r.nic == nic), None)
        if ranks:
            text += f": {ranks_text(ranks)}"
        elif why is not None and not any(u.nic == nic for u in units):
            text += f": never chosen ({why})"
        else:
            text += ": no rank"
        out.setdefault(node, []).append(GpuLine(text=text, ranks=ranks))
    return {k: tuple(v) for k, v in out.items()}


def _roles_text(plans: list[Plan]) -> str:
    """``, reserve 2/node, smt 1`` where the plans were made with core roles."""
    out = "".join(f", reserve {r}" for r in sorted({str(p.reserve) for p in plans if p.reserve}))
    out += "".join(f", priority {r}" for r in sorted({p.priority for p in plans}) if r != "off")
    return out + (", smt 1" if any(p.smt == "1" for p in plans) else "")


def _rank_sets(owner: dict[int, set[int]]) -> tuple[RankSet, ...]:
    cpus_of: dict[frozenset[int], set[int]] = {}
    for cpu, ranks in owner.items():
        cpus_of.setdefault(frozenset(ranks), set()).add(cpu)
    ordered = sorted(cpus_of, key=lambda r: (min(r), len(r), sorted(r)))
    return tuple(
        RankSet(ranks=r, colour=colour(i), symbol=symbol(i), cpus=frozenset(cpus_of[r]))
        for i, r in enumerate(ordered)
    )


def _hbm_text(node: int | None, sizes: dict[int, int | None]) -> str:
    """A GPU whose own memory is a NUMA node (GH200/GB200 HBM) says which, and its size."""
    if node is None or node not in sizes:
        return ""
    return f" (its memory: node {node}, {_size(sizes[node])}, no CPUs)"


def _size(n: int | None) -> str:
    if n is None:
        return "memory size unknown"
    if n >= 1 << 40:
        return f"{n / 2**40:.1f} TiB"
    return f"{n / 2**30:.1f} GiB"


def _distances(machine: Machine) -> tuple[tuple[str, ...], ...]:
    nodes = machine.nodes
    if len(nodes) < 2 or not any(n.distances for n in nodes):
        return ()
    rows = [("", *(str(n.id) for n in nodes))]
    for a in nodes:
        rows.append((str(a.id), *(str(a.distance_to(b.id) or "-") for b in nodes)))
    return tuple(rows)


# --- the terminal drawing ---------------------------------------------------------------------

CORES_PER_ROW = 32


def _core_symbol(pic: Picture, core: Core) -> str:
    first = core.cells[0]
    if not first.allowed:
        return "x"
    # the sets planned onto the core's threads; a thread planned for no one (the second
    # thread of a core under NUMABIND_SMT=1) does not make the core a shared one
    kinds = {cell.ranks for cell in core.cells if cell.allowed and cell.ranks}
    if len(kinds) > 1:
        return "*"
    if not kinds:
        return "r" if any(cell.reserved for cell in core.cells) else "."
    found = pic.set_of(next(iter(kinds)))
    return found.symbol if found is not None else "?"


def _priority_symbol(pic: Picture, core: Core) -> str:
    """The mark under a core: ``^`` a priority core, ``@`` one a main thread is pinned to."""
    if not any(cell.priority for cell in core.cells):
        return " "
    return "@" if any(cell.cpu in pic.main for cell in core.cells) else "^"


def draw(pic: Picture) -> list[str]:
    """The picture as text lines: one character per core, its rank set's letter."""
    out = [pic.title, pic.subtitle]
    for label, boxes in pic.packages:
        out += ["", label]
        for box in boxes:
            out.append(f"  {box.header}")
            for group in box.groups:
                what = f"L3 {fmt(group.cpus)}" if group.known else "cache domains unknown"
                n = len(group.cores)
                out.append(f"    {what} ({n} core{'' if n == 1 else 's'})")
                cores = group.cores
                for i in range(0, len(cores), CORES_PER_ROW):
                    row = cores[i : i + CORES_PER_ROW]
                    first = fmt(c.cells[0].cpu for c in row)
                    marks = "".join(_core_symbol(pic, c) for c in row)
                    out.append(f"      {marks}  cores of CPUs {first}")
                    if any(cell.priority for c in row for cell in c.cells):
                        under = "".join(_priority_symbol(pic, c) for c in row)
                        out.append(f"      {under}  priority cores")
            out += [f"    {g.text}" for g in box.gpus]
            out += [f"    {g.text}" for g in box.nics]
            out += [f"    {line}" for _, line in box.ranks]
    if pic.unplaced:
        out += ["", "accelerators whose node is unknown"]
        out += [f"  {g.text}" for g in pic.unplaced]
    if pic.skipped:
        out += ["", "not bound"]
        out += [f"  {s}" for s in pic.skipped]
    if pic.distances:
        out += ["", "NUMA distances"]
        width = max(len(c) for row in pic.distances for c in row) + 2
        out += ["  " + "".join(c.rjust(width) for c in row) for row in pic.distances]
    out += ["", "legend"] + [f"  {line}" for line in legend(pic, text=True)]
    return out


def legend(pic: Picture, text: bool) -> list[str]:
    """What every mark means (the SVG draws the same entries with swatches)."""
    lines = []
    # the text has one character per core, the SVG one cell per CPU (a column per core)
    unit = "core" if text else "CPU"
    for s in pic.sets:
        mark = f"{s.symbol}  " if text else ""
        share = f" share these {unit}s" if len(s.ranks) > 1 else ""
        lines.append(f"{mark}{ranks_text(s.ranks)}{share}: CPUs {fmt(s.cpus)}")
    lines.append(("." + "  " if text else "") + f"a {unit} no rank is planned onto")
    lines.append(("x" + "  " if text else "") + f"a {unit} this process may not use (its cgroup)")
    if pic.reserved:
        lines.append(
            ("r" + "  " if text else "")
            + f"a reserved {unit} (NUMABIND_RESERVE: {fmt(pic.reserved)}): the system's and "
            "the ranks' helpers'"
        )
    if pic.priority:
        lines.append(
            ("^" + "  " if text else "")
            + f"a priority core, its node's fastest kind by {pic.kinds_source} "
            f"({fmt(pic.priority)}): what NUMABIND_PRIORITY uses"
            + (
                f"; {'@  ' if text else ''}a main thread is pinned there ({fmt(pic.main)})"
                if pic.main
                else ""
            )
        )
    if text:
        lines.append("*  a core whose threads are planned for different ranks")
        if len(pic.sets) > len(SYMBOLS):
            lines.append(f"?  a rank set beyond the {len(SYMBOLS)} letters (see each rank's line)")
        lines.append(
            f"each character is one core (its {pic.smt} SMT threads with it)"
            if pic.smt > 1
            else "each character is one core"
        )
    else:
        lines.append(
            f"a column of {pic.smt} cells is one core, its SMT threads"
            if pic.smt > 1
            else "each cell is one core (no SMT)"
        )
        lines.append("a frame groups the cores of one last-level cache (L3 / CCX)")
    return lines
