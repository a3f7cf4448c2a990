"""``numabind show``: the machine, its accelerators and each local rank's plan, as text,
as JSON (the typed :class:`ShowReport`, whose ``to_dict()`` is the documented schema) or
as a picture.
"""

from __future__ import annotations

import os
import sys

from .. import __version__, _sysfs
from .._errors import CaptureError, UsageError
from .._model import (
    NO_RESERVE,
    NODE_KINDS,
    SPILL_CPU,
    Allowed,
    CoreKinds,
    NicPort,
    Node,
    OtherDevice,
    Record,
    Reserve,
    Spill,
)
from .._plan import Plan, Request, device_node, fallback_order, plan, split_of
from ._common import OK, OutputFile, notice_lines, one_stdout, write_json, write_lines

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping
    from typing import Any

    from .._devices import Visible
    from .._model import Accelerator
    from .._topology import Machine

fmt = _sysfs.format_cpulist


def plural(n: int, word: str, plural_form: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural_form or word + 's'}"


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def plans_for(
    machine: Machine,
    environ: Mapping[str, str],
    nproc: int | None,
    mode: str,
    memory: str,
    reserve: Reserve = NO_RESERVE,
    smt: str = "all",
    *,
    priority: str = "off",
    spill: Spill = SPILL_CPU,
    nic_mode: str = "",
    nic_min_rate: str = "auto",
) -> tuple[Visible, list[Plan], str]:
    """The plan of every local rank 0..N-1 of this machine, as ``show`` prints them (with
    each rank's RDMA adapters for a ``nic_mode``: ``show`` asks for them)."""
    from .._devices import resolve
    from .._environ import detect

    info = detect(environ)
    visible = resolve(machine, environ)
    if nproc is not None:
        count, source = nproc, "--nproc"
    elif info.local_world_size is not None:
        count, source = info.local_world_size, info.size_source or "environment"
    elif visible.devices:
        count, source = len(visible.devices), "one per visible device"
    else:
        count, source = 1, "no visible device: one rank"
    rank_source = info.rank_source if nproc is None and info.rank_source else "show"
    plans = [
        plan(
            machine,
            Request(
                local_rank=r,
                local_world_size=count,
                rank_source=rank_source,
                visible=visible,
                mode=mode,
                memory=memory,
                reserve=reserve,
                smt=smt,
                priority=priority,
                spill=spill,
                size_source=source,
                notes=info.notes if r == 0 else (),
                nic_mode=nic_mode,
                nic_min_rate=nic_min_rate,
            ),
        )
        for r in range(count)
    ]
    return visible, plans, source


def this_process(machine: Machine, environ: Any, plans: list[Plan]) -> dict[str, Any] | None:
    """When ``show`` itself runs as a rank (``srun numabind show``): what the startup hook did
    to it, or, if the hook did not run, what it would do with the CPU mask found in place."""
    from .. import _kernel, _startup
    from .._apply import assess, decide
    from .._environ import Config, detect

    binding = _startup.last
    if binding is not None:
        return {"summary": str(binding), "hook": binding.to_dict()}
    info = detect(environ, getattr(sys, "orig_argv", None))
    if not info.is_rank or info.local_rank is None:
        return None
    mine = next((p for p in plans if p.local_rank == info.local_rank), None)
    if mine is None or not mine.bound:
        why = mine.reason if mine is not None else "no plan for this rank"
        return {"summary": f"local rank {info.local_rank} ({info.rank_source}): not bound: {why}"}
    current = frozenset(os.sched_getaffinity(0))
    existing = assess(current, machine.allowed.cpus, _kernel.cpus_allowed(os.getppid()), environ)
    node = machine.node(mine.numa_node) if mine.numa_node is not None else None
    decision = decide(
        existing, mine.cpus, node.cpus if node else None, Config.from_env(environ).enable
    )
    verb = "keep it" if decision.action == "keep" else f"bind CPUs {fmt(mine.cpus)}"
    summary = (
        f"local rank {info.local_rank} ({info.rank_source}); current CPU mask "
        f"{fmt(current)} ({existing.origin}): numabind would {verb}"
    )
    return {
        "summary": summary,
        "current_cpus": sorted(current),
        "origin": existing.origin,
        "deliberate": existing.deliberate,
        "decision": decision.action,
        "message": decision.message,
    }


def spill_line(machine: Machine, plans: list[Plan], told: str = "env") -> str | None:
    """What the ranks' memory does once their nodes are full, where the machine has nodes
    it could spill onto that are not CPU memory.  ``told``: who chose the spill (``env``:
    NUMABIND_SPILL, ``flag``: --spill, ``default``: nobody), so that the line never names
    a setting the user did not give."""
    masked = [p for p in plans if p.bound and p.memory_mask]
    if not masked:
        return None
    kept = frozenset(machine.node_ids) - frozenset().union(*(p.memory_mask for p in masked))
    kinds = {n.id: n.kind for n in machine.nodes}
    what = ", ".join(
        f"{fmt(frozenset(n for n in kept if kinds.get(n) == k))} ({NODE_KINDS[k].label})"
        for k in dict.fromkeys(kinds[n] or "memory" for n in sorted(kept))
        if k in NODE_KINDS
    )
    spill = masked[0].spill
    onto = "the other CPU-memory nodes" if spill.cpu else "no CPU-memory node"
    named = spill.nodes & frozenset().union(*(p.memory_mask for p in masked))
    if named:
        onto += f" and node{'s' if len(named) > 1 else ''} {fmt(named)} (named)"
    never = f"node{'s' if len(kept) > 1 else ''} {what}"
    who = {"flag": f"--spill {spill}", "default": f"spill {spill} (the default)"}
    said = who.get(told, f"NUMABIND_SPILL={spill}")
    return (
        f"{said}: once a rank's nodes are full its memory spills onto {onto}, "
        f"nearest first, and never onto {never}; when those are full too an allocation "
        "fails (the kernel's OOM killer ends the rank).  NUMABIND_SPILL=any lets memory "
        "spill anywhere instead"
    )


def balancing_line(machine: Machine, plans: list[Plan]) -> str | None:
    """What automatic NUMA balancing means for these ranks, when it is on."""
    if not machine.numa_balancing:
        return None
    spared = [p for p in plans if p.bound and p.memory_policy not in ("none", "local")]
    scanned = [p for p in plans if p not in spared]
    text = (
        "automatic NUMA balancing is on (kernel.numa_balancing bit 0): the kernel scans "
        "memory and moves pages to where they are touched, stalling the process meanwhile. "
    )
    if spared and not scanned:
        return text + (
            "These ranks' private memory is under a task memory policy, which it does not "
            "scan; their shared and file pages, and unbound helpers, still are."
        )
    return text + (
        f"{plural(len(scanned), 'rank')} here have no memory policy (NUMABIND_MEMORY=none/"
        "local, or not bound) and are scanned; NUMABIND_MEMORY=preferred spares private memory."
    )


class DeviceRow(Record):
    """One accelerator of the machine as ``show`` reports it."""

    index: int | None  # its number among the visible devices, None when not visible
    pci: str
    vendor: str
    numa_node: int | None  # what sysfs says (None: -1)
    node: int | None  # the CPU node the planner binds its ranks to
    node_inferred: bool
    memory_node: int | None
    uuid: str | None
    name: str | None
    local_cpus: frozenset[int] | None
    visible: bool
    # a GPU split into compute partitions (AMD CPX...): their visible indices, how many
    # there are, and the GPU's compute and memory partition modes
    indices: tuple[int, ...] = ()
    partitions: int | None = None
    compute_partition: str | None = None
    memory_partition: str | None = None


def visible_indices(visible: Visible) -> dict[str, list[int]]:
    """PCI address -> the visible indices of its devices (several: its compute partitions)."""
    out: dict[str, list[int]] = {}
    for i, d in enumerate(visible.devices):
        out.setdefault(d.pci, []).append(i)
    return out


def partition_text(devs: list[Accelerator]) -> str:
    """``CPX: 8 compute partitions, NPS4``: how a GPU is split, from its partitions."""
    first = next((d for d in devs if d.partition is not None), None)
    if first is None:
        return ""
    modes = f"{first.compute_partition}: " if first.compute_partition else ""
    memory = f", {first.memory_partition}" if first.memory_partition else ""
    return f"{modes}{first.partitions} compute partitions{memory}"


class VisibleRow(Record):
    """Which devices the runtime numbers 0..n-1, and why."""

    source: str
    problem: str | None
    notes: tuple[str, ...]


class NicRow(Record):
    """One network adapter of the machine as ``show`` reports it: what it is, its ports,
    which of them may be offered (``offered``: port numbers), the GPUs given it (their PCI
    addresses), and why it is never chosen when it is not (``never``)."""

    name: str | None
    pci: str
    kind: str
    numa_node: int | None
    ports: tuple[NicPort, ...]
    netdevs: tuple[str, ...]
    bond: str | None
    members: tuple[str, ...]
    member_of: str | None
    speed: float | None
    offered: tuple[int, ...]
    given_to: tuple[str, ...]
    never: str | None


def nic_rows(machine: Machine, mode: str = "nearest", min_rate: str = "auto") -> list[NicRow]:
    """Every network adapter: the RDMA ones with the machine-wide choice, then the plain
    interfaces (never chosen)."""
    from .._nics import assign, same_vendor

    gpus = machine.accelerators
    if gpus:
        found = assign(
            machine,
            same_vendor(machine, gpus[0]),
            lambda d: device_node(machine, d).node,
            mode,
            min_rate,
        )
        units, refused, per = found.units, found.refused, found.per_device
    else:
        from .._nics import offered

        units_list, refused_list = offered(machine, min_rate)
        units, refused, per = tuple(units_list), tuple(refused_list), {}
    rows = []
    for n in (*machine.nics, *machine.ethernet):
        ports = tuple(u.port.number for u in units if u.nic == n)
        whys = [r.why for r in refused if r.nic == n]
        given = tuple(
            pci for pci, cs in per.items() if any(c.name == n.name and c.pci == n.pci for c in cs)
        )
        never = None if ports else ("; ".join(whys) or "no RDMA device")
        rows.append(
            NicRow(
                name=n.name,
                pci=n.pci,
                kind=n.kind,
                numa_node=n.numa_node,
                ports=n.ports,
                netdevs=n.netdevs,
                bond=n.bond,
                members=n.members,
                member_of=n.member_of,
                speed=n.speed,
                offered=ports,
                given_to=given,
                never=never,
            )
        )
    return rows


class ShowReport(Record):
    """What ``numabind show --json`` prints (docs/cli.rst documents every key)."""

    machine: str
    online_cpus: frozenset[int]
    smt: int
    allowed: Allowed
    nodes: tuple[Node, ...]
    devices: tuple[DeviceRow, ...]
    visible: VisibleRow
    numa_balancing: bool | None
    warnings: tuple[str, ...]
    ranks: tuple[Plan, ...]
    not_handled: tuple[OtherDevice, ...] = ()
    this_process: dict[str, Any] | None = None
    core_kinds: CoreKinds = CoreKinds()
    notes: tuple[str, ...] = ()  # which of this shell's variables applied, which did not
    nics: tuple[NicRow, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        if self.this_process is None:
            del d["this_process"]
        return d


def show_data(
    machine: Machine, visible: Visible, plans: list[Plan], nics: list[NicRow] | None = None
) -> ShowReport:
    indices = visible_indices(visible)
    parts = machine.with_partitions(machine.accelerators)
    devices = []
    for acc in machine.all_accelerators:
        choice = device_node(machine, acc)
        split = [p for p in parts if p.pci == acc.pci and p.partition is not None]
        devices.append(
            DeviceRow(
                indices=tuple(indices.get(acc.pci, ())),
                partitions=split[0].partitions if split else None,
                compute_partition=split[0].compute_partition if split else None,
                memory_partition=split[0].memory_partition if split else None,
                index=indices[acc.pci][0] if acc.pci in indices else None,
                pci=acc.pci,
                vendor=acc.vendor,
                numa_node=acc.numa_node,
                node=choice.node,
                node_inferred=choice.inferred,
                memory_node=acc.memory_node,
                uuid=acc.uuid,
                name=acc.name,
                local_cpus=acc.local_cpus,
                visible=acc.pci in indices,
            )
        )
    return ShowReport(
        machine=machine.description,
        online_cpus=machine.online_cpus,
        smt=machine.smt,
        allowed=machine.allowed,
        nodes=machine.nodes,
        devices=tuple(devices),
        visible=VisibleRow(source=visible.source, problem=visible.problem, notes=visible.notes),
        numa_balancing=machine.numa_balancing,
        warnings=machine.warnings,
        ranks=tuple(plans),
        not_handled=machine.others(),
        core_kinds=machine.core_kinds,
        nics=tuple(nics or ()),
    )


def node_lines(machine: Machine, plans: list[Plan]) -> list[str]:
    """The nodes table (with each node's kind, and its memory tier where the kernel has
    tiers), what each memory-only node is, and the split packages the ranks are on."""
    nodes = machine.nodes
    tiers = any(n.tier is not None for n in nodes)
    rows = [["node", "cpus", "memory", "kind", *(["tier"] if tiers else []), "distances"]]
    for n in nodes:
        rows.append(
            [
                str(n.id),
                fmt(n.cpus) if n.cpus else "(memory only)",
                _gib(n.memory_bytes),
                kind_cell(machine, n),
                *([str(n.tier) if n.tier is not None else "-"] if tiers else []),
                " ".join(str(d) for _, d in n.distances) or "-",
            ]
        )
    return _table(rows) + tier_lines(machine) + split_lines(machine, plans)


def kind_cell(machine: Machine, n: Node) -> str:
    """What memory a node holds, in a few words (``GPU memory of 0009:01:00.0``)."""
    kind = NODE_KINDS.get(n.kind or "")
    if kind is None:
        return "-"
    if n.kind == "gpu":
        found = machine.gpu_memory().get(n.id)
        return f"{kind.label} of {found[0].pci}" if found else kind.label
    return kind.label


def split_lines(machine: Machine, plans: list[Plan]) -> list[str]:
    """For each node the ranks are planned on that is one of several nodes of its package
    (SNC, NPS): what it is, and where its memory goes once it is full."""
    out = []
    homes = sorted({p.numa_node for p in plans if p.bound and p.numa_node is not None})
    for home in homes:
        split = split_of(machine, home)
        if split is None:
            continue
        others = [n for n in split.nodes if n != home]
        order = fallback_order(machine, home, [n.id for n in machine.cpu_nodes])
        first = list(order[: len(others)])
        where = (
            f"then the package's node{'s' if len(others) > 1 else ''} {fmt(others)}, then "
            "the other package's"
            if sorted(first) == others
            else f"then, by the distance table, nodes {', '.join(map(str, order))} (the "
            "package's own nodes are not all nearer)"
        )
        out.append(
            f"  {split.describe()}: node mode keeps its ranks' CPUs there and puts their "
            f"memory there first, {where}; socket mode spans the package"
        )
    return out


def tier_lines(machine: Machine) -> list[str]:
    """One line per memory-only node: what it is and why numabind says so."""
    out = []
    for n in machine.nodes:
        if n.kind in (None, "cpu") or n.cpus:
            continue
        kind = NODE_KINDS[n.kind]
        out.append(f"  node {n.id}: {kind.label} ({n.kind_how})")
    return out


def _table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths[:-1])] + [r[-1]]
        lines.append((indent + "  ".join(cells)).rstrip())
    return lines


def accelerators_title(machine: Machine, visible: Visible) -> str:
    """What the Accelerators table holds, in counts that match its rows: every accelerator
    on the bus is a row, the visible ones have an index (a GPU's partitions share one row)."""
    accs = machine.all_accelerators
    shown = len(visible_indices(visible))
    if accs and len(accs) != shown:
        return f"{len(accs)} on the PCI bus, {shown} visible and indexed: {visible.source}"
    return visible.source


def show_text(
    machine: Machine,
    visible: Visible,
    plans: list[Plan],
    source: str,
    mode: str,
    memory: str,
    this_machine: bool = True,
    environ: Mapping[str, str] | None = None,
    nics: list[NicRow] | None = None,
    spill_told: str = "env",
    nic_told: str = "",
) -> list[str]:
    """The text report, one line per item (the writer escapes each).  ``this_machine``:
    the machine ``doctor`` would read too (not an example or a capture); ``environ`` the
    environment planned under (where it runs: the fix for a cpuset off the GPU's node)."""
    allowed = machine.allowed
    out = [f"numabind {__version__}: {machine.description}", ""]
    out.append(
        f"NUMA nodes (this process may use CPUs {fmt(allowed.cpus) or 'none'}"
        + (f", memory nodes {fmt(allowed.mems)}" if allowed.mems is not None else "")
        + f"; from {allowed.source})"
    )
    out += node_lines(machine, plans) + kinds_lines(machine)  # the nodes, then their cores
    out += notice_lines("problem", machine.warnings, "  ")
    accs = machine.all_accelerators
    out += ["", f"Accelerators ({accelerators_title(machine, visible)})"]
    inferred = False
    if accs:
        indices = visible_indices(visible)
        rows = [["index", "pci", "vendor", "node", "mem-node", "uuid / model"]]
        parts = machine.with_partitions(accs)
        for a in accs:
            choice = device_node(machine, a)
            node = "?" if choice.node is None else str(choice.node)
            if choice.inferred:
                node += "*"
                inferred = True
            split = partition_text([p for p in parts if p.pci == a.pci])
            rows.append(
                [
                    fmt(indices[a.pci]) if a.pci in indices else "-",
                    a.pci,
                    a.vendor,
                    node,
                    str(a.memory_node) if a.memory_node is not None else "-",
                    " ".join(x for x in (a.uuid, a.name, f"({split})" if split else "") if x)
                    or "-",
                ]
            )
        out += _table(rows)
        if inferred:
            out.append(
                "  * node inferred from the device's local_cpus (sysfs numa_node -1 or a "
                "memory-only node)"
            )
    else:
        out.append("  none found")
    out += notice_lines("note", visible.notes, "  ")
    out += notice_lines("problem", [visible.problem] if visible.problem else [], "  ")
    groups: dict[str, list[str]] = {}
    for d in machine.others():
        groups.setdefault(d.label(), []).append(d.pci)
    for label, where in groups.items():
        more = f" and {len(where) - 4} more" if len(where) > 4 else ""
        more_said = "; numabind doctor says more" if this_machine else ""
        out.append(
            f"  not handled: {len(where)} x {label} at {', '.join(where[:4])}{more} "
            f"(numabind knows no such vendor{more_said})"
        )
    out += nic_lines(visible, nics or [])
    advice = nic_advice(plans, nic_told)
    out += [f"  note: {advice}"] if advice and nics else []
    first = plans[0] if plans else None
    roles = f", reserve {first.reserve}" if first and first.reserve else ""
    roles += ", smt 1" if first and first.smt == "1" else ""
    roles += f", priority {first.priority}" if first and first.priority != "off" else ""
    roles += f", spill {first.spill}" if first and first.bound and first.memory_mask else ""
    out += [
        "",
        f"Plan (mode {mode}, memory {memory}{roles}; {plural(len(plans), 'local rank')}: {source})",
    ]
    helpers = any(p.helpers for p in plans)
    mains = any(p.main_cpus for p in plans)
    with_nics = any(p.nics for p in plans)
    rows = [["rank", "device", "node", "cpus", *(["reserved"] if helpers else [])]]
    rows[0] += [*(["main thread"] if mains else []), "threads", "memory"]
    rows[0] += [*(["nics"] if with_nics else []), "status: reason"]
    for p in plans:
        rows.append(
            [
                str(p.local_rank),
                str(p.device_index) if p.device_index is not None else "-",
                str(p.numa_node) if p.numa_node is not None else "-",
                fmt(p.cpus) or "-",
                *([fmt(p.helpers) or "-"] if helpers else []),
                *([fmt(p.main_cpus) or "-"] if mains else []),
                str(p.threads) if p.threads is not None else "-",
                _memory_cell(p),
                *(
                    [",".join(f"{n.label} {n.relation}" for n in p.nics) or "-"]
                    if with_nics
                    else []
                ),
                # the machine's problems are said once, above: not again in every row
                f"{p.status}: {p.reason}"
                + "".join(f"; {n}" for n in p.notes if n not in machine.warnings),
            ]
        )
    out += _table(rows)
    if any(p.skip == "cgroup" for p in plans):
        from .._advice import cpuset_fix

        fix = cpuset_fix(environ or {}, allowed)
        out += ["", f"note: to bind the ranks skipped for the cgroup: {fix}"]
    line = balancing_line(machine, plans)
    if line:
        out += ["", f"note: {line}"]
    line = spill_line(machine, plans, spill_told)
    if line:
        out += ["", f"note: {line}"]
    return out


def kinds_lines(machine: Machine) -> list[str]:
    """Which cores are faster: one line for a machine whose files do not tell its cores
    apart, else one per node with CPUs (its kinds, fastest first, and the file that told)."""
    kinds = machine.core_kinds
    if not kinds.distinct:
        return [f"  cores: {machine.describe_kinds(machine.online_cpus)}"]
    return [f"  cores of node {n.id}: {machine.describe_kinds(n.cpus)}" for n in machine.cpu_nodes]


def nic_advice(plans: list[Plan], told: str) -> str | None:
    """The line under any list of the ranks' adapters when ``NUMABIND_NIC`` (``told``) is
    unset: the adapters are advice, and no transport is told one."""
    if told or not any(p.nics for p in plans):
        return None
    return (
        "the ranks' adapters are advice: NUMABIND_NIC is unset, so no transport is told "
        "one (NUMABIND_NIC=nccl,ucx,... sets each transport's variable before any import)"
    )


def nic_lines(visible: Visible, rows: list[NicRow]) -> list[str]:
    """The network adapters: each port's state, rate and link layer, the GPUs given it,
    or why it is never chosen."""
    if not rows:
        return []
    index = {d.pci: i for i, d in enumerate(visible.devices)}
    out = ["", "Network adapters (RDMA ports offered to ranks; the rest listed, never chosen)"]
    table = [["name", "pci", "node", "ports", "given to / never chosen"]]
    for r in rows:
        ports = " ".join(
            f"{p.number}:{(p.state or '?').lower()}"
            + (f"/{p.rate:g}G" if p.rate else "")
            + (f"/{_LAYER.get(p.link_layer, p.link_layer)}" if p.link_layer else "")
            for p in r.ports
        )
        if r.bond:
            ports += f" (bond {r.bond}: {', '.join(r.members)}" + (
                f", {r.speed:g}G)" if r.speed else ")"
            )
        if r.given_to:
            gpus = [str(index[g]) if g in index else g for g in r.given_to]
            what = f"GPU{'s' if len(gpus) > 1 else ''} {', '.join(gpus)}"
        elif r.never:
            what = f"never: {r.never}"
        else:
            what = "no GPU (idle)"
        table.append(
            [
                r.name or "-",
                r.pci,
                "-" if r.numa_node is None else str(r.numa_node),
                ports or ("-" if r.kind == "rdma" else r.kind),
                what,
            ]
        )
    return out + _table(table)


_LAYER = {"InfiniBand": "IB", "Ethernet": "RoCE", "Unknown": "?"}


# how numactl spells each memory policy (numactl(8); --preferred-many needs 2.0.16+)
_NUMACTL = {
    "preferred": "--preferred={nodes}",
    "preferred-many": "--preferred-many={nodes}",
    "bind": "--membind={nodes}",
    "interleave": "--interleave={nodes}",
    "local": "--localalloc",
}


def numactl_line(p: Plan) -> str:
    """The numactl command line that gives a rank ``p``'s binding (taskset where the plan
    sets no memory policy), for people who must hard-code a wrapper."""
    cpus = fmt(p.cpus)
    policy, nodes = p.placement.kernel_policy  # a spill mask: --membind over it
    option = _NUMACTL.get(policy)
    if option is None:
        return f"taskset -c {cpus} CMD"
    where = f"--physcpubind={cpus} " if cpus else ""
    return f"numactl {where}{option.format(nodes=fmt(nodes))} -- CMD"


def numactl_lines(plans: list[Plan]) -> list[str]:
    out = [
        "# one line per local rank; numabind run does the same without numactl (numabind run",
        "# --local-rank N -- CMD), and the startup hook without any wrapper",
    ]
    for p in plans:
        if p.bound:
            out.append(f"rank {p.local_rank}: {numactl_line(p)}")
        else:
            out.append(f"rank {p.local_rank}: CMD  # not bound: {p.reason}")
    return out


def _memory_cell(p: Plan) -> str:
    if not p.bound:
        return "-"
    text = p.memory_policy
    if p.memory_nodes and p.memory_policy != "none":
        text = f"{p.memory_policy} {fmt(p.memory_nodes)}"
    if p.memory_mask:  # NUMABIND_SPILL=cpu kept other nodes out: where it may still go
        extra = p.memory_mask - p.memory_nodes
        text += f", then {fmt(extra)}" if extra else ", no spill"
    return text


# the knobs that shape a plan: what show takes from this shell for any machine
PLAN_KNOBS = (
    "NUMABIND_MODE",
    "NUMABIND_MEMORY",
    "NUMABIND_SPILL",
    "NUMABIND_RESERVE",
    "NUMABIND_SMT",
    "NUMABIND_PRIORITY",
    "NUMABIND_NIC",
    "NUMABIND_NIC_MODE",
    "NUMABIND_NIC_MIN_RATE",
)


def _open_machine(args: argparse.Namespace) -> tuple[Any, Any, list[str]]:
    """The machine ``show`` plans for, the environment it is planned under, and the notes
    that say which of this shell's variables were applied and which were not.  The
    planning knobs (:data:`PLAN_KNOBS`) of this shell apply to every machine; an example
    has no rank or device variables of its own (this shell's are not its), a capture
    that recorded some plans with those."""
    from .._topology import Machine

    if args.input is not None and args.example is not None:
        raise UsageError("numabind show: --input and --example are exclusive; give one")
    try:
        if args.example is not None:
            machine = Machine.from_example(args.example)
            environ, notes = _with_knobs({}, "the example")
            left = _rank_variables(os.environ)
            if left:
                notes.append(
                    f"{', '.join(left)} of this shell not applied: an example machine has no "
                    "processes (numabind gather --example NAME DIR, then NUMABIND_SYSROOT=DIR, "
                    "plans with them)"
                )
            if os.environ.get("NUMABIND_SYSROOT"):
                notes.append(
                    "NUMABIND_SYSROOT of this shell not applied: --example plans for the "
                    "example, not for the machine that names"
                )
            return machine, environ, notes
        if args.input is not None:
            machine = Machine.from_capture(args.input)
            recorded = machine.recorded_environ
            if recorded is None:
                return machine, os.environ, []
            environ, notes = _with_knobs(recorded, "the capture")
            return machine, environ, notes
        # the machine as it is now, never the ranks' cache: show is what an admin runs
        # because something changed
        return Machine.here(), os.environ, []
    except (CaptureError, ValueError) as err:
        raise UsageError(f"numabind show: {err}") from err


def _with_knobs(base: Mapping[str, str], what: str) -> tuple[dict[str, str], list[str]]:
    """``base`` with this shell's planning knobs on top, and one note naming them (and
    any value of ``base`` they replace)."""
    environ = dict(base)
    applied = []
    for name in PLAN_KNOBS:
        value = os.environ.get(name)
        if value is None:
            continue
        was = environ.get(name)
        replaced = f" (not {what}'s {was!r})" if was is not None and was != value else ""
        applied.append(f"{name}={_sysfs.clean_line(value, 40)}{replaced}")
        environ[name] = value
    notes = [f"from this shell: {', '.join(applied)}"] if applied else []
    return environ, notes


def _rank_variables(environ: Mapping[str, str]) -> list[str]:
    """The rank, size and device-visibility variables set in ``environ``."""
    from ..capture._capture import RECORDED_VARIABLES

    return [v for v in RECORDED_VARIABLES if v in environ and v not in PLAN_KNOBS]


def _emit(
    args: argparse.Namespace,
    machine: Any,
    visible: Any,
    plans: list[Plan],
    report: ShowReport,
    text: Any,
    nic_told: str = "",
) -> None:
    """Write the one stdout form asked for (``one_stdout`` made sure there is one)."""
    if args.json:
        write_json(report.to_dict())
    elif args.draw:
        from ._picture import build, draw

        advice = nic_advice(plans, nic_told)
        lines = draw(build(machine, plans, args.mode, args.memory))
        write_lines(lines + (["", f"note: {advice}"] if advice else []))
    elif args.numactl:
        write_lines(numactl_lines(plans))
    elif args.matrix:
        from ._matrix import matrix_lines

        # one row per GPU: a GPU's compute partitions share its place in the PCI tree
        gpus = tuple({d.pci: d for d in reversed(visible.devices)}.values())[::-1]
        write_lines(matrix_lines(machine, gpus))
    else:
        write_lines(text())


def run_show(args: argparse.Namespace) -> int:
    """``numabind show``: check the outputs, read the machine, plan, print."""
    from .._environ import Config

    svg = OutputFile(args.svg, "--svg", "show", args.force).check() if args.svg else None
    one_stdout(
        (
            ("--json", args.json),
            ("--svg -", svg is not None and svg.stdout),
            ("--draw", args.draw),
            ("--numactl", args.numactl),
            ("--matrix", args.matrix),
        ),
        "show",
    )
    machine, environ, shell_notes = _open_machine(args)
    try:
        try:
            cfg = Config.from_env(environ)
        except ValueError as err:
            raise UsageError(f"numabind show: {err}") from err
        for warning in cfg.warnings:  # set and not used (a typo, a sysroot refused): said
            write_lines([f"numabind show: {warning}"], sys.stderr)
        args.mode = args.mode or cfg.mode
        args.memory = args.memory or cfg.memory
        args.reserve = cfg.reserve if args.reserve is None else args.reserve
        args.smt = args.smt or cfg.smt
        args.priority = args.priority or cfg.priority
        spill_told = "flag" if args.spill else "env" if environ.get("NUMABIND_SPILL") else "default"
        args.spill = args.spill or cfg.spill
        if not machine.node_ids and not machine.online_cpus:
            raise UsageError(
                f"numabind show: {machine.description}: no CPUs or NUMA nodes readable"
            )
        visible, plans, source = plans_for(
            machine,
            environ,
            args.nproc,
            args.mode,
            args.memory,
            args.reserve,
            args.smt,
            priority=args.priority,
            spill=args.spill,
            nic_mode=cfg.nic_mode,
            nic_min_rate=cfg.nic_min_rate,
        )
        rows = nic_rows(machine, cfg.nic_mode, cfg.nic_min_rate)
        report = show_data(machine, visible, plans, rows).replace(notes=tuple(shell_notes))
        this = None if args.input or args.example else this_process(machine, environ, plans)
        if this is not None:
            report = report.replace(this_process=this)
        if svg is not None:
            from ._svg import render

            svg.write(render(machine, plans, mode=args.mode, memory=args.memory))
            if svg.stdout:
                return OK
            # said on stderr: stdout stays the report (--json included)
            write_lines([f"numabind show: wrote the picture to {args.svg}"], sys.stderr)

        def text() -> list[str]:
            lines = show_text(
                machine,
                visible,
                plans,
                source,
                args.mode,
                args.memory,
                this_machine=args.input is None and args.example is None,
                environ=environ,
                nics=rows,
                spill_told=spill_told,
                nic_told=cfg.nic,
            )
            lines += notice_lines("note", shell_notes) if shell_notes else []
            if this is not None:
                lines += ["", f"This process (pid {os.getpid()}): {this['summary']}"]
            return lines

        _emit(args, machine, visible, plans, report, text, cfg.nic)
    except (OSError, CaptureError) as err:
        if isinstance(err, OSError) and getattr(err, "filename", None) is None:
            raise  # writing the output failed (a closed pipe, a full disk): main says so
        raise UsageError(f"numabind show: {err}") from err
    finally:
        machine.close()
    return OK
