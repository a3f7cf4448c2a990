"""``numabind check``: the command over numabind.check._inspect (which checks, and is the
module the job collector and the framework report share): the text lines, the exit
status, the choice of processes.  Exit statuses: numabind.cli._common.EXITS.
"""

from __future__ import annotations

import os
import time

from .._environ import detect
from ..check._inspect import (
    CheckReport,
    ProcessCheck,
    Vanished,
    check,
    check_pid,
    fmt,
    rank_pids,
)
from ._common import OFF_PLAN, OK, UNREACHABLE, USAGE, notice_lines, write_json, write_lines

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Mapping


# --- the report --------------------------------------------------------------------------------


def process_lines(r: ProcessCheck) -> list[str]:
    """A process's verdict line, then its problems and notes, one line each."""
    p = r.plan
    who = f"pid {r.pid}"
    if p is not None and p.local_rank is not None:
        who += f" rank {p.local_rank}"
    if p is not None and p.device_pci:
        who += f" {p.device_pci}"
    if r.status == "bound" and p is not None:
        policy = "not permitted" if p.memory_policy == "not-permitted" else p.memory_policy
        where = (
            f"node {p.numa_node}, CPUs {fmt(p.cpus) or 'unchanged'}, memory {policy} "
            f"{fmt(p.memory_nodes)}"
        ).rstrip()
        if p.spill_nodes:
            where += f" (node {fmt(p.home_nodes)} first, spilling onto {fmt(p.spill_nodes)} only)"
        where += (
            f", {r.locality:.1%} of private pages local"
            if r.locality is not None
            else ", no private pages yet"
        )
    elif p is not None:
        where = f"not bound ({p.reason or r.status})"
    else:
        where = "no plan"
    verdict = "UNKNOWN" if r.status == "unknown" else ("OK" if r.ok else "OFF PLAN")
    lines = [f"{verdict:8} {who}: {where}"]
    if any(kind != "cpu" for kind in r.tiers):
        lines.append("         memory by kind: " + tiers_text(r.tiers))
    if r.nics or r.nic_settings:
        lines.append(f"         nics: {nic_text(r)}")
    lines += [f"         - {problem}" for problem in r.problems]
    lines += [f"         note: {note}" for note in r.notes]
    if len(r.roles) > 1 or any(g.on_plan is False for g in r.roles):
        lines.append("         roles: " + "; ".join(g.text() for g in r.roles))
    return lines


def tiers_text(tiers: dict[str, int]) -> str:
    """``CPU memory 3.2 GiB, GPU memory 1.8 GiB``: a rank's private memory per node kind."""
    from .._model import NODE_KINDS

    out = []
    for name, kind in NODE_KINDS.items():
        size = tiers.get(name, 0)
        if size:
            amount = f"{size / 2**30:.1f} GiB" if size >= 1 << 30 else f"{size / 2**20:.0f} MiB"
            out.append(f"{kind.label} {amount}")
    return ", ".join(out)


def nic_text(r: ProcessCheck) -> str:
    """``mlx5_0:1 (PIX, 400 Gb/s); UCX_NET_DEVICES=mlx5_0:1 (numabind)``: the adapters
    chosen for the rank's GPU and the transport variables it runs with, who set each."""
    chosen = ", ".join(
        f"{n.label} ({n.relation}" + (f", {n.rate:g} Gb/s)" if n.rate else ")") for n in r.nics
    )
    shown = [
        f"{k}={v} ({'numabind' if k in r.nic_set else 'set before numabind'})"
        for k, v in sorted(r.nic_settings.items())
    ]
    return "; ".join([chosen or "no RDMA adapter chosen", *shown])


def output_format(args: argparse.Namespace) -> str:
    """``text``, ``json`` or ``openmetrics``: ``--format``, with ``--json`` its short form
    (both given, they must agree)."""
    from .._errors import UsageError

    chosen = getattr(args, "format", None)
    if getattr(args, "json", False):
        if chosen not in (None, "json"):
            raise UsageError(f"numabind check: --json and --format {chosen} disagree; give one")
        return "json"
    return chosen or "text"


def exit_status(report: CheckReport, named: bool) -> int:
    if any(r.status != "unknown" and not r.ok for r in report.processes):
        return OFF_PLAN
    if (named and report.vanished) or any(r.status == "unknown" for r in report.processes):
        return UNREACHABLE
    return OK


def settings_of(args: argparse.Namespace) -> tuple[str, Mapping[str, str] | None]:
    """Where the machine is read from and where the registry is: ``--sysroot`` and
    ``--registry`` (how an isolated collector is told: numabind.check._isolated) under the rule
    the startup hook applies to ``NUMABIND_SYSROOT`` and ``NUMABIND_REGISTRY`` (for root:
    a path only root can change), else those variables as the hook reads them.  Returns
    (sysroot, the registry's settings for numabind._registry, None: this environment)."""
    from _numabind_base import root_owned_path

    from .._environ import Config
    from .._errors import UsageError
    from .._sysfs import short

    sysroot = getattr(args, "sysroot", None)
    registry = getattr(args, "registry", None)
    for flag, value in (("--sysroot", sysroot), ("--registry", registry)):
        if value is None:
            continue
        why = "not an absolute path" if not value.startswith("/") else None
        if why is None and os.geteuid() == 0:
            why = root_owned_path(value)
        if why is None and not os.path.isdir(value):
            why = "not a directory"
        if why is not None:
            raise UsageError(f"numabind check: {flag} {short(value)}: {why}")
    settings = None if registry is None else {"NUMABIND_REGISTRY": registry}
    return sysroot or Config.from_env().sysroot, settings


def run_check(
    args: argparse.Namespace,
    keep: Callable[[Mapping[str, str]], bool] | None = None,
    emit: Callable[[CheckReport], None] | None = None,
    members: frozenset[int] | None = None,
    cap: Callable[[list[int]], list[int]] | None = None,
) -> int:
    """``numabind check``; ``members`` and ``keep`` narrow ``--all`` (a job's processes,
    and what they claim), ``cap`` bounds how many are checked, ``emit`` writes the report
    instead of the text or JSON (the job collector's node record)."""
    from .._errors import UsageError

    if args.pid and args.all:
        raise UsageError("numabind check: --pid and --all are exclusive; give one")
    sysroot, settings = settings_of(args)
    own_env: Mapping[str, str] | None = None
    scan = None
    named = bool(args.pid)
    if args.pid:
        pids = list(dict.fromkeys(args.pid))
    elif args.all:
        pids, scan = rank_pids(keep, members, settings)
        pids = cap(pids) if cap is not None else pids
    else:
        info = detect(os.environ)
        if info.local_rank is None and info.problem is None:
            raise UsageError(
                "numabind check: this process has no local rank; give --pid PID or --all "
                "(numabind check --help)"
            )
        pids, own_env = [os.getpid()], os.environ
    from .._topology import Machine

    # the machine as it is now, never the ranks' cache: a verifier that reports an earlier
    # reading says OK about a machine that changed (the report says where they differ)
    machine = Machine.from_root(sysroot)
    try:
        deadline = time.monotonic() + args.deadline if args.all else None
        report = check(
            pids,
            machine,
            own_env=own_env,
            deadline=deadline,
            named=named,
            scan=scan,
            verbose=args.verbose,
            settings=settings,
        )
    finally:
        machine.close()
    if emit is not None:
        emit(report)
    elif output_format(args) == "openmetrics":
        from ..check._metrics import render, write

        write(render(report))
    elif args.json:
        write_json(report.to_dict())
    else:
        lines: list[str] = []
        if not report.processes and not report.vanished and not report.skipped:
            lines.append("numabind check: no rank processes found")
        for r in report.processes:
            lines += process_lines(r)
        lines += notice_lines("note", report.notes)
        write_lines(lines)
    return exit_status(report, named)


__all__ = [
    "USAGE",
    "CheckReport",
    "ProcessCheck",
    "Vanished",
    "check",
    "check_pid",
    "run_check",
]
