"""Which RDMA adapter each GPU's ranks use: the distance from a GPU to an adapter, which
adapters may be offered at all, and the fair assignment of the offered ones to the GPUs
of a machine.  Pure functions of a :class:`~numabind._topology.Machine` (the planner's
layer); only plans that ask for NICs call them, so a rank that does not never loads this
module.

**Distance** is ``nvidia-smi topo -m``'s vocabulary, from the machine's PCI tree
(:func:`path_class`, the one implementation ``show --matrix`` prints too): PIX (one
PCIe switch), PXB (several bridges, no host bridge), PHB (a host bridge), NODE (host
bridges of one NUMA node), SYS (across NUMA nodes); a ``*`` marks an answer told from the
NUMA nodes alone because the PCI tree was not readable.

**Offered**: an RDMA device on PCI, one unit per port, whose port is ``ACTIVE``, which is
not a member of a bond (its bond is the adapter), and whose rate is at least the minimum
(``NUMABIND_NIC_MIN_RATE``: ``auto`` is half the fastest offered port of the machine, so
a 25 GbE management port never takes the place of a 400 Gb/s rail; a bond's rate is what
its interface reports, as its RDMA port may show one member's).  Everything else is
listed, with why, and never chosen.

**Fair**: computed for every GPU of the machine at once, in PCI order, so every rank
computes the same answer whatever order the ranks start in, and ranks of other jobs on
the same host (other containers, other GPU sets) are counted too.  ``nearest`` gives each
GPU one unit of the best relation it has, as evenly as possible among the GPUs that tie
on the same units (the counts per unit differ by at most one: an optimal balanced
assignment, reached by moving GPUs along cost-reducing paths); an offered unit still idle
then goes, as an extra rail, to a GPU for which it is as near as its own.
``exclusive`` then also never leaves a unit idle while another serves two GPUs: the GPU
that loses the least moves to the idle unit, farther if it must.
"""

from __future__ import annotations

from ._model import NIC_MODES, Accelerator, Nic, NicChoice, NicPort, Record
from ._sysfs import pci_sort_key

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ._topology import Machine

RELATIONS: tuple[str, ...] = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearest first
MIN_RATE_AUTO = "auto"


def path_class(
    a: tuple[str, ...] | None,
    b: tuple[str, ...] | None,
    node_a: int | None,
    node_b: int | None,
) -> str:
    """The class of the path between two devices with bridge paths ``a`` and ``b`` (host
    bridge first) on NUMA nodes ``node_a`` and ``node_b``: the one rule for
    ``show --matrix`` and for the NIC choice."""
    if not a or not b or a[0] != b[0]:
        tree = bool(a and b)
        kind = "SYS" if node_a is None or node_b is None else "NODE" if node_a == node_b else "SYS"
        return kind if tree else kind + "*"
    common = 0
    for x, y in zip(a, b):
        if x != y:
            break
        common += 1
    if common == 1:
        return "PHB"
    return "PIX" if len(a) - common <= 1 and len(b) - common <= 1 else "PXB"


def rank_of(relation: str) -> int:
    """0 for PIX ... 4 for SYS (an unknown word counts as SYS)."""
    word = relation.rstrip("*")
    return RELATIONS.index(word) if word in RELATIONS else len(RELATIONS) - 1


def nic_node(machine: Machine, nic: Nic) -> int | None:
    """The CPU node an adapter sits on: its ``numa_node`` when that node has CPUs, else
    the one node holding its CPU locality, else the machine's only CPU node."""
    nodes = machine.cpu_nodes
    if nic.numa_node is not None and any(n.id == nic.numa_node for n in nodes):
        return nic.numa_node
    if nic.local_cpus:
        inside = [n.id for n in nodes if nic.local_cpus <= n.cpus]
        if len(inside) == 1:
            return inside[0]
    return nodes[0].id if len(nodes) == 1 else None


class Unit(Record):
    """One offerable port: its adapter, the port, and the rate it is judged by."""

    nic: Nic
    port: NicPort
    rate: float | None

    @property
    def key(self) -> tuple[tuple[int, ...], str, int]:
        return (pci_sort_key(self.nic.pci), self.nic.name or "", self.port.number)


class Refused(Record):
    """An adapter (or one port of it) that is listed and never chosen, and why."""

    nic: Nic
    port: int | None
    why: str


def effective_rate(nic: Nic, port: NicPort) -> float | None:
    """What a port is judged by: its rate, or for a bond what the bond's interface reports
    when that is more (an RDMA port of a bond may show one member's speed)."""
    if nic.bond is not None and nic.speed is not None:
        return max(nic.speed, port.rate or 0.0)
    return port.rate if port.rate is not None else nic.speed


def parse_min_rate(text: str) -> float | None:
    """``NUMABIND_NIC_MIN_RATE`` as Gb/s (``auto``: None here, resolved per machine);
    ValueError for anything but auto or a number from 0 to 100000."""
    value = text.strip().lower()
    if value in ("", MIN_RATE_AUTO):
        return None
    if len(value) > 10 or not value.replace(".", "", 1).isdigit():
        raise ValueError(value)
    rate = float(value)
    if not 0 <= rate <= 100_000:
        raise ValueError(value)
    return rate


def offered(machine: Machine, min_rate: str = MIN_RATE_AUTO) -> tuple[list[Unit], list[Refused]]:
    """The units that may be offered to ranks, and what is listed but never chosen."""
    candidates: list[Unit] = []
    refused: list[Refused] = []
    for nic in machine.nics:
        if nic.kind != "rdma" or not nic.name:
            refused.append(
                Refused(nic=nic, port=None, why="no RDMA device (seen by its PCI class)")
            )
            continue
        if nic.member_of is not None:
            refused.append(
                Refused(
                    nic=nic,
                    port=None,
                    why=f"its interface is a member of {nic.member_of}: the bond is the adapter",
                )
            )
            continue
        if not nic.ports:
            refused.append(Refused(nic=nic, port=None, why="no port readable"))
        for p in nic.ports:
            if not p.active:
                state = p.state.lower() if p.state else "in an unknown state"
                refused.append(Refused(nic=nic, port=p.number, why=f"port {p.number} {state}"))
            else:
                candidates.append(Unit(nic=nic, port=p, rate=effective_rate(nic, p)))
    floor = resolve_min_rate(min_rate, candidates)
    units = []
    for u in candidates:
        if floor is not None and u.rate is not None and u.rate < floor:
            refused.append(
                Refused(
                    nic=u.nic,
                    port=u.port.number,
                    why=f"slow: {_gbps(u.rate)} below the minimum {_gbps(floor)}"
                    + (
                        " (half the fastest port)"
                        if min_rate.strip().lower() in ("", "auto")
                        else ""
                    ),
                )
            )
        else:
            units.append(u)
    units.sort(key=lambda u: u.key)
    refused.sort(key=lambda r: (pci_sort_key(r.nic.pci), r.nic.name or "", r.port or 0))
    return units, refused


def resolve_min_rate(setting: str, units: Sequence[Unit]) -> float | None:
    """The minimum rate in Gb/s (None: no minimum): a number as given (0: none); ``auto``
    half the fastest known rate among ``units``."""
    try:
        fixed = parse_min_rate(setting)
    except ValueError:
        fixed = None  # the configuration said so already; judge as auto
    else:
        if setting.strip().lower() not in ("", MIN_RATE_AUTO):
            return fixed or None
    rates = [u.rate for u in units if u.rate is not None]
    return max(rates) / 2 if rates else None


def _gbps(rate: float) -> str:
    return f"{rate:g} Gb/s"


class Assignment(Record):
    """The machine-wide choice: per GPU (PCI address) its units, primary first; the
    offered units; what was refused and why."""

    per_device: dict[str, tuple[NicChoice, ...]]
    units: tuple[Unit, ...]
    refused: tuple[Refused, ...]
    mode: str = "nearest"


def assign(
    machine: Machine,
    devices: Sequence[Accelerator],
    node_of: Callable[[Accelerator], int | None],
    mode: str = "nearest",
    min_rate: str = MIN_RATE_AUTO,
) -> Assignment:
    """The fair assignment of the machine's offered units to ``devices`` (see the module
    docstring); ``node_of`` tells a device's CPU node (the planner's rule)."""
    if mode not in NIC_MODES:
        raise ValueError(f"unknown NIC mode {mode!r}")
    units, refused = offered(machine, min_rate)
    devs = sorted(dict.fromkeys(devices), key=lambda d: pci_sort_key(d.pci))
    if not units or not devs:
        return Assignment(per_device={}, units=tuple(units), refused=tuple(refused), mode=mode)
    paths = {d.pci: machine.pci_path(d.pci) for d in devs}
    nodes = {d.pci: node_of(d) for d in devs}
    u_paths = [machine.pci_path(u.nic.pci) for u in units]
    u_nodes = [nic_node(machine, u.nic) for u in units]
    rel = {
        d.pci: [
            path_class(paths[d.pci], u_paths[j], nodes[d.pci], u_nodes[j])
            for j in range(len(units))
        ]
        for d in devs
    }
    cost = {pci: [rank_of(r) for r in row] for pci, row in rel.items()}
    order = [d.pci for d in devs]
    best = {pci: min(cost[pci]) for pci in order}
    cand = {pci: [j for j, c in enumerate(cost[pci]) if c == best[pci]] for pci in order}
    chosen = _balanced(order, cand, len(units))
    if mode == "exclusive":
        _spread(order, chosen, cost, len(units))
    load = [0] * len(units)
    for j in chosen.values():
        load[j] += 1
    extra: dict[str, list[int]] = {pci: [] for pci in order}
    for j in range(len(units)):
        if load[j]:
            continue
        takers = [pci for pci in order if cost[pci][j] <= cost[pci][chosen[pci]] and j in cand[pci]]
        if takers:
            pci = min(takers, key=lambda p: (len(extra[p]), order.index(p)))
            extra[pci].append(j)
            load[j] += 1
    per_device = {}
    for pci in order:
        picks = [chosen[pci], *extra[pci]]
        per_device[pci] = tuple(
            NicChoice(
                name=units[j].nic.name or "",
                port=units[j].port.number,
                pci=units[j].nic.pci,
                relation=rel[pci][j],
                rate=units[j].rate,
                link_layer=units[j].port.link_layer,
                sharing=load[j],
            )
            for j in picks
        )
    return Assignment(per_device=per_device, units=tuple(units), refused=tuple(refused), mode=mode)


def _balanced(order: list[str], cand: dict[str, list[int]], n: int) -> dict[str, int]:
    """One unit per device among its candidates, balanced: greedy (the most constrained
    device first, the least loaded unit), then cost-reducing paths until none is left
    (an assignment without one is optimal: Harvey et al., semi-matchings, 2003)."""
    load = [0] * n
    chosen: dict[str, int] = {}
    for pci in sorted(order, key=lambda p: (len(cand[p]), order.index(p))):
        j = min(cand[pci], key=lambda u: (load[u], u))
        chosen[pci] = j
        load[j] += 1
    while _shift_once(order, cand, chosen, load):
        pass
    return chosen


def _shift_once(
    order: list[str], cand: dict[str, list[int]], chosen: dict[str, int], load: list[int]
) -> bool:
    """Move devices along one path from a unit with load L to a unit with load L-2 or
    less (each device to another of its candidates); False when there is no such path."""
    for start in sorted(range(len(load)), key=lambda u: (-load[u], u)):
        if load[start] < 2:
            return False
        holders: dict[int, list[str]] = {}
        for pci in order:
            holders.setdefault(chosen[pci], []).append(pci)
        prev: dict[int, tuple[int, str] | None] = {start: None}
        queue = [start]
        target = None
        while queue and target is None:
            u = queue.pop(0)
            for pci in holders.get(u, ()):
                for v in cand[pci]:
                    if v in prev:
                        continue
                    prev[v] = (u, pci)
                    if load[v] <= load[start] - 2:
                        target = v
                        break
                    queue.append(v)
                if target is not None:
                    break
        if target is None:
            continue
        v = target
        step = prev[v]
        while step is not None:
            u, pci = step
            chosen[pci] = v
            v = u
            step = prev[v]
        load[start] -= 1
        load[target] += 1
        return True
    return False


def _spread(order: list[str], chosen: dict[str, int], cost: dict[str, list[int]], n: int) -> None:
    """Exclusive mode: while a unit serves two devices and another serves none, move the
    device that loses the least (the smallest step away from its relation) to an idle
    unit."""
    while True:
        load = [0] * n
        for j in chosen.values():
            load[j] += 1
        idle = [j for j in range(n) if load[j] == 0]
        crowded = [pci for pci in order if load[chosen[pci]] >= 2]
        if not idle or not crowded:
            return
        pci, j = min(
            ((p, v) for p in crowded for v in idle),
            key=lambda pv: (
                cost[pv[0]][pv[1]] - cost[pv[0]][chosen[pv[0]]],
                -load[chosen[pv[0]]],
                order.index(pv[0]),
                pv[1],
            ),
        )
        chosen[pci] = j


def share_of(choices: tuple[NicChoice, ...], position: int, count: int) -> tuple[NicChoice, ...]:
    """A rank's share of its GPU's units when ``count`` ranks drive that GPU and it is the
    ``position``-th: every unit for one rank; else round robin (each rank one unit, or
    one of several, when there are fewer units than ranks)."""
    if count <= 1 or not choices:
        return choices
    if len(choices) >= count:
        return choices[position % count :: count]
    return (choices[position % len(choices)],)


def same_vendor(machine: Machine, device: Accelerator) -> tuple[Accelerator, ...]:
    """Every accelerator of the machine of ``device``'s vendor: the GPUs whose ranks compete
    for the adapters (this job's and any other's on the host), in PCI order."""
    return tuple(a for a in machine.accelerators if a.vendor == device.vendor) or (device,)
