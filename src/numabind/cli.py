"""The ``numabind`` command: ``show``, ``gather``, ``run``, ``check``.

``main(argv) -> int`` returns the exit status: 0 success, 1 a checked process is off its
plan, 2 bad arguments or an unreadable input.  A domain error prints one line on stderr,
never a traceback; JSON goes to stdout, diagnostics to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import __version__, _sysfs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn

    from ._devices import Visible
    from ._plan import Plan
    from ._topology import Machine

OK, OFF_PLAN, USAGE = 0, 1, 2


class UsageError(Exception):
    """Bad arguments or an unreadable input: one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _build_parser() -> argparse.ArgumentParser:
    from ._plan import MEMORY_POLICIES, MODES

    p = _Parser(prog="numabind", description="Bind GPU ranks to their GPU's NUMA node.")
    p.add_argument("--version", action="version", version=f"numabind {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)

    show = sub.add_parser(
        "show", help="the machine, its accelerators and the plan for each local rank"
    )
    show.add_argument("--input", metavar="PATH", help="a capture: directory, tarball or hwloc .xml")
    show.add_argument("--mode", choices=MODES, default=None)
    show.add_argument("--memory", choices=MEMORY_POLICIES, default=None)
    show.add_argument("--nproc", type=int, metavar="N", help="plan local ranks 0..N-1")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    show.add_argument("--svg", metavar="FILE", help="also draw the machine and the ranks as SVG")

    gather = sub.add_parser("gather", help="write a tarball of what numabind reads on this machine")
    gather.add_argument("output", nargs="?", default="numabind-capture.tar.gz")

    run = sub.add_parser("run", help="bind this process for a local rank, then exec a command")
    run.add_argument("--local-rank", type=int, default=None, metavar="N")
    run.add_argument("--mode", choices=MODES, default=None)
    run.add_argument("--memory", choices=MEMORY_POLICIES, default=None)
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

    check = sub.add_parser("check", help="verify a process's binding and memory locality")
    check.add_argument("--pid", type=int, nargs="+", default=None)
    check.add_argument("--all", action="store_true", help="every rank process on this machine")
    check.add_argument("--json", action="store_true")

    sub.add_parser(
        "sitecustomize-path", help="print the PYTHONPATH entry of numabind's sitecustomize"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _build_parser().parse_args(argv)
        if args.command == "show":
            return _show(args)
        if args.command == "gather":
            return _gather(args)
        if args.command == "run":
            return _run(args)
        if args.command == "check":
            from ._check import main as check_main

            return check_main(args)
        if args.command == "sitecustomize-path":
            from ._startup import sitecustomize_dir

            print(sitecustomize_dir())
            return OK
        _build_parser().print_help()
        return USAGE
    except UsageError as err:
        print(str(err), file=sys.stderr)
        return USAGE
    except BrokenPipeError:
        return OK


def console_main() -> None:
    sys.exit(main())


# --- show -------------------------------------------------------------------------------


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


def plans_for(
    machine: Machine,
    environ: dict[str, str] | os._Environ[str],
    nproc: int | None,
    mode: str,
    memory: str,
) -> tuple[Visible, list[Plan], str]:
    """The plan of every local rank 0..N-1 of this machine, as ``show`` prints them."""
    from ._devices import resolve
    from ._plan import Request, plan
    from ._ranks import detect

    info = detect(environ)
    visible = resolve(machine, environ)
    if nproc is not None:
        count, source = nproc, "--nproc"
    elif info.local_world_size is not None:
        count, source = info.local_world_size, info.size_source or "environment"
    else:
        count, source = max(len(visible.devices), 1), "one per visible device"
    plans = [
        plan(
            machine,
            Request(
                r,
                count,
                info.rank_source if nproc is None and info.rank_source else "show",
                visible,
                mode,
                memory,
                None,
                source,
            ),
        )
        for r in range(count)
    ]
    return visible, plans, source


def _show(args: argparse.Namespace) -> int:
    from ._config import config_from_env

    if args.nproc is not None and args.nproc < 1:
        raise UsageError("numabind show: --nproc must be at least 1")
    capture = None
    if args.input:
        from ._capture import CaptureError, open_capture

        try:
            capture = open_capture(args.input)
        except CaptureError as err:
            raise UsageError(f"numabind show: {err}") from err
        machine = capture.machine
        environ: Any = capture.environ if capture.environ is not None else os.environ
    else:
        from ._topology import Machine

        machine = Machine.from_root(os.environ.get("NUMABIND_SYSROOT", "/"))
        environ = os.environ
    try:
        cfg = config_from_env(environ)
    except ValueError as err:
        raise UsageError(f"numabind show: {err}") from err
    mode = args.mode or cfg.mode
    memory = args.memory or cfg.memory
    try:
        visible, plans, source = plans_for(machine, environ, args.nproc, mode, memory)
        if not machine.node_ids and not machine.online_cpus:
            raise UsageError(
                f"numabind show: {machine.description}: no CPUs or NUMA nodes readable"
            )
        data = show_data(machine, visible, plans)
        this = None if args.input else this_process(machine, environ, plans)
        if this is not None:
            data["this_process"] = this
        if args.svg:
            from ._svg import render

            with open(args.svg, "w") as f:
                f.write(render(machine, plans))
        if args.json:
            json.dump(data, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(_show_text(machine, visible, plans, source, mode, memory))
            if this is not None:
                sys.stdout.write(f"\nThis process (pid {os.getpid()}): {this['summary']}\n")
    except OSError as err:
        raise UsageError(f"numabind show: {err}") from err
    finally:
        if capture is not None:
            capture.close()
    return OK


def this_process(machine: Machine, environ: Any, plans: list[Plan]) -> dict[str, Any] | None:
    """When ``show`` itself runs as a rank (``srun numabind show``): what the startup hook did
    to it, or, if the hook did not run, what it would do with the CPU mask found in place."""
    from . import _startup
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
    from ._config import config_from_env

    current = frozenset(os.sched_getaffinity(0))
    existing = assess(current, machine.allowed.cpus, parent_mask(os.getppid()), environ)
    node = machine.node(mine.numa_node) if mine.numa_node is not None else None
    decision = decide(
        existing, mine.cpus, node.cpus if node else None, config_from_env(environ).enable
    )
    verb = "keep it" if decision.cpus == "keep" else f"bind CPUs {_sysfs.format_cpulist(mine.cpus)}"
    summary = (
        f"local rank {info.local_rank} ({info.rank_source}); current CPU mask "
        f"{_sysfs.format_cpulist(current)} ({existing.origin}): numabind would {verb}"
    )
    return {
        "summary": summary,
        "current_cpus": sorted(current),
        "origin": existing.origin,
        "deliberate": existing.deliberate,
        "decision": decision.cpus,
        "message": decision.message,
    }


def show_data(machine: Machine, visible: Visible, plans: list[Plan]) -> dict[str, Any]:
    indices = {d.pci: i for i, d in enumerate(visible.devices)}
    devices = []
    for acc in machine.accelerators:
        devices.append(
            {
                "index": indices.get(acc.pci),
                "pci": acc.pci,
                "vendor": acc.vendor,
                "numa_node": acc.numa_node,
                "memory_node": acc.memory_node,
                "uuid": acc.uuid,
                "name": acc.name,
                "local_cpus": sorted(acc.local_cpus) if acc.local_cpus is not None else None,
                "visible": acc.pci in indices,
            }
        )
    allowed = machine.allowed
    return {
        "machine": machine.description,
        "online_cpus": sorted(machine.online_cpus),
        "allowed": {
            "cpus": sorted(allowed.cpus),
            "mems": sorted(allowed.mems) if allowed.mems is not None else None,
            "source": allowed.source,
        },
        "nodes": [n.to_dict() for n in machine.nodes],
        "devices": devices,
        "visible": {
            "source": visible.source,
            "problem": visible.problem,
            "notes": list(visible.notes),
        },
        "ranks": [p.to_dict() for p in plans],
    }


def _table(rows: list[list[str]], indent: str = "  ") -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths[:-1])] + [r[-1]]
        lines.append(indent + "  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def _show_text(
    machine: Machine, visible: Visible, plans: list[Plan], source: str, mode: str, memory: str
) -> str:
    fmt = _sysfs.format_cpulist
    allowed = machine.allowed
    out = [f"numabind {__version__}: {machine.description}\n\n"]
    out.append(
        f"NUMA nodes (this process may use CPUs {fmt(allowed.cpus) or 'none'}"
        + (f", memory nodes {fmt(allowed.mems)}" if allowed.mems is not None else "")
        + f"; from {allowed.source})\n"
    )
    nodes = machine.nodes
    rows = [["node", "cpus", "memory", "distances"]]
    for n in nodes:
        rows.append(
            [
                str(n.id),
                fmt(n.cpus) if n.cpus else "(memory only)",
                _gib(n.memory_bytes),
                " ".join(str(d) for _, d in n.distances) or "-",
            ]
        )
    out.append(_table(rows))
    out.append(f"\nAccelerators ({visible.source})\n")
    accs = machine.accelerators
    if accs:
        indices = {d.pci: i for i, d in enumerate(visible.devices)}
        rows = [["index", "pci", "vendor", "node", "mem-node", "uuid / model"]]
        for a in accs:
            rows.append(
                [
                    str(indices[a.pci]) if a.pci in indices else "-",
                    a.pci,
                    a.vendor,
                    str(a.numa_node) if a.numa_node is not None else "?",
                    str(a.memory_node) if a.memory_node is not None else "-",
                    " ".join(x for x in (a.uuid, a.name) if x) or "-",
                ]
            )
        out.append(_table(rows))
    else:
        out.append("  none found\n")
    for note in visible.notes:
        out.append(f"  note: {note}\n")
    if visible.problem:
        out.append(f"  problem: {visible.problem}\n")
    out.append(f"\nPlan (mode {mode}, memory {memory}; {len(plans)} local ranks: {source})\n")
    rows = [["rank", "device", "node", "cpus", "memory", "status: reason"]]
    for p in plans:
        mem = p.memory_policy
        if p.memory_nodes and mem not in ("none",):
            mem += " " + fmt(p.memory_nodes)
        rows.append(
            [
                str(p.local_rank),
                str(p.device_index) if p.device_index is not None else "-",
                str(p.numa_node) if p.numa_node is not None else "-",
                fmt(p.cpus) or "-",
                mem if p.bound else "-",
                f"{p.status}: {p.reason}" + "".join(f"; {n}" for n in p.notes),
            ]
        )
    out.append(_table(rows))
    return "".join(out)


# --- gather -----------------------------------------------------------------------------


def _gather(args: argparse.Namespace) -> int:
    from ._capture import gather

    try:
        n = gather(args.output, dict(os.environ), os.environ.get("NUMABIND_SYSROOT", "/"))
    except OSError as err:
        raise UsageError(f"numabind gather: {args.output}: {err.strerror or err}") from err
    print(
        f"numabind: wrote {n} files to {args.output}; "
        f"show it with: numabind show --input {args.output}"
    )
    return OK


# --- run ----------------------------------------------------------------------------------


def _run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("numabind run: no command given (numabind run [options] -- CMD ARGS...)")
    from ._api import apply
    from ._config import config_from_env

    try:
        cfg = config_from_env(os.environ)
    except ValueError as err:
        raise UsageError(f"numabind run: {err}") from err
    from ._apply import BindingError
    from ._ranks import RankInfo, detect
    from ._startup import record_state

    mode, memory = args.mode or cfg.mode, args.memory or cfg.memory
    try:
        binding = apply(args.local_rank, mode=mode, memory=memory, migrate=False, strict=cfg.strict)
    except BindingError as err:
        print(f"numabind run: {err}", file=sys.stderr)
        return OFF_PLAN
    if binding.worth_a_line(cfg.verbose):
        print(f"numabind: {binding}", file=sys.stderr)
    # The command's own startup hook must see this binding as inherited, not plan anew
    # with other settings: hand it the same mode, memory policy and rank.
    os.environ["NUMABIND_MODE"], os.environ["NUMABIND_MEMORY"] = mode, memory
    info = detect(os.environ)
    if args.local_rank is not None and info.local_rank != args.local_rank:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
        info = RankInfo(args.local_rank, info.local_world_size, "LOCAL_RANK")
    record_state(binding, info, mode, memory)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as err:
        print(f"numabind run: cannot run {cmd[0]!r}: {err.strerror}", file=sys.stderr)
        return 127
    return OK  # pragma: no cover - exec does not return
