"""What ``numabind show`` prints: the machine, its accelerators and each local rank's plan,
as text or as JSON (``show_data``).  Parsing the command line is :mod:`numabind.cli`'s
job; this module only plans and renders.
"""

from __future__ import annotations

import os
import sys

from . import __version__, _sysfs
from ._plan import Plan, Request, device_node, plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ._devices import Visible
    from ._topology import Machine

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
) -> tuple[Visible, list[Plan], str]:
    """The plan of every local rank 0..N-1 of this machine, as ``show`` prints them."""
    from ._devices import resolve
    from ._ranks import detect

    info = detect(environ)
    visible = resolve(machine, environ)
    if nproc is not None:
        count, source = nproc, "--nproc"
    elif info.local_world_size is not None:
        count, source = info.local_world_size, info.size_source or "environment"
    else:
        count, source = max(len(visible.devices), 1), "one per visible device"
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
                size_source=source,
                notes=info.notes if r == 0 else (),
            ),
        )
        for r in range(count)
    ]
    return visible, plans, source


def this_process(machine: Machine, environ: Any, plans: list[Plan]) -> dict[str, Any] | None:
    """When ``show`` itself runs as a rank (``srun numabind show``): what the startup hook did
    to it, or, if the hook did not run, what it would do with the CPU mask found in place."""
    from . import _startup
    from ._config import config_from_env
    from ._existing import assess, decide, parent_mask
    from ._ranks import detect

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
    existing = assess(current, machine.allowed.cpus, parent_mask(os.getppid()), environ)
    node = machine.node(mine.numa_node) if mine.numa_node is not None else None
    decision = decide(
        existing, mine.cpus, node.cpus if node else None, config_from_env(environ).enable
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


def show_data(machine: Machine, visible: Visible, plans: list[Plan]) -> dict[str, Any]:
    indices = {d.pci: i for i, d in enumerate(visible.devices)}
    devices = []
    for acc in machine.accelerators:
        choice = device_node(machine, acc)
        devices.append(
            {
                "index": indices.get(acc.pci),
                "pci": acc.pci,
                "vendor": acc.vendor,
                "numa_node": acc.numa_node,
                "node": choice.node,
                "node_inferred": choice.inferred,
                "memory_node": acc.memory_node,
                "uuid": acc.uuid,
                "name": acc.name,
                "local_cpus": sorted(acc.local_cpus) if acc.local_cpus is not None else None,
                "visible": acc.pci in indices,
            }
        )
    return {
        "machine": machine.description,
        "online_cpus": sorted(machine.online_cpus),
        "smt": machine.smt,
        "allowed": machine.allowed.to_dict(),
        "nodes": [n.to_dict() for n in machine.nodes],
        "devices": devices,
        "visible": {
            "source": visible.source,
            "problem": visible.problem,
            "notes": list(visible.notes),
        },
        "numa_balancing": machine.numa_balancing,
        "warnings": list(machine.warnings),
        "ranks": [p.to_dict() for p in plans],
    }


def _table(rows: list[list[str]], indent: str = "  ") -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths[:-1])] + [r[-1]]
        lines.append((indent + "  ".join(cells)).rstrip())
    return "\n".join(lines) + "\n"


def show_text(
    machine: Machine, visible: Visible, plans: list[Plan], source: str, mode: str, memory: str
) -> str:
    allowed = machine.allowed
    out = [f"numabind {__version__}: {machine.description}\n\n"]
    out.append(
        f"NUMA nodes (this process may use CPUs {fmt(allowed.cpus) or 'none'}"
        + (f", memory nodes {fmt(allowed.mems)}" if allowed.mems is not None else "")
        + f"; from {allowed.source})\n"
    )
    rows = [["node", "cpus", "memory", "distances"]]
    for n in machine.nodes:
        rows.append(
            [
                str(n.id),
                fmt(n.cpus) if n.cpus else "(memory only)",
                _gib(n.memory_bytes),
                " ".join(str(d) for _, d in n.distances) or "-",
            ]
        )
    out.append(_table(rows))
    for warning in machine.warnings:
        out.append(f"  problem: {warning}\n")
    out.append(f"\nAccelerators ({visible.source})\n")
    accs = machine.accelerators
    inferred = False
    if accs:
        indices = {d.pci: i for i, d in enumerate(visible.devices)}
        rows = [["index", "pci", "vendor", "node", "mem-node", "uuid / model"]]
        for a in accs:
            choice = device_node(machine, a)
            node = "?" if choice.node is None else str(choice.node)
            if choice.inferred:
                node += "*"
                inferred = True
            rows.append(
                [
                    str(indices[a.pci]) if a.pci in indices else "-",
                    a.pci,
                    a.vendor,
                    node,
                    str(a.memory_node) if a.memory_node is not None else "-",
                    " ".join(x for x in (a.uuid, a.name) if x) or "-",
                ]
            )
        out.append(_table(rows))
        if inferred:
            out.append(
                "  * node inferred from the device's local_cpus (sysfs numa_node -1 or a "
                "memory-only node)\n"
            )
    else:
        out.append("  none found\n")
    for note in visible.notes:
        out.append(f"  note: {note}\n")
    if visible.problem:
        out.append(f"  problem: {visible.problem}\n")
    out.append(
        f"\nPlan (mode {mode}, memory {memory}; {plural(len(plans), 'local rank')}: {source})\n"
    )
    rows = [["rank", "device", "node", "cpus", "threads", "memory", "status: reason"]]
    for p in plans:
        mem = p.memory_policy
        if p.memory_nodes and mem != "none":
            mem += " " + fmt(p.memory_nodes)
        rows.append(
            [
                str(p.local_rank),
                str(p.device_index) if p.device_index is not None else "-",
                str(p.numa_node) if p.numa_node is not None else "-",
                fmt(p.cpus) or "-",
                str(p.threads) if p.threads is not None else "-",
                mem if p.bound else "-",
                f"{p.status}: {p.reason}" + "".join(f"; {n}" for n in p.notes),
            ]
        )
    out.append(_table(rows))
    line = balancing_line(machine, plans)
    if line:
        out.append(f"\nnote: {line}\n")
    return "".join(out)
