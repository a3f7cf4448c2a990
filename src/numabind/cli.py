"""The ``numabind`` command: ``show``, ``gather``, ``run``, ``check``.

``main(argv) -> int`` returns the exit status (the table is in :data:`EPILOG`).  A domain
error prints one line on stderr, never a traceback; JSON goes to stdout, diagnostics to
stderr.  Rendering ``show`` is :mod:`numabind._show`'s job, ``check`` is
:mod:`numabind._check`'s; this module parses and dispatches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from . import __version__
from ._config import sysroot
from ._errors import CaptureError, ConfigError, UsageError
from ._modes import MODE_HELP, MODE_NAMES
from ._plan import MEMORY_HELP, MEMORY_POLICIES
from ._ranks import MAX_LOCAL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn

OK, OFF_PLAN, USAGE, VANISHED = 0, 1, 2, 3
MAX_NPROC = 4096  # --nproc ceiling: more local ranks than any machine has GPUs or nodes

EPILOG = f"""\
modes (--mode, NUMABIND_MODE):
{chr(10).join(f"  {k:13} {v}" for k, v in MODE_HELP.items())}

memory policies (--memory, NUMABIND_MEMORY):
{chr(10).join(f"  {k:13} {v}" for k, v in MEMORY_HELP.items())}

exit status:
  0  success; for check: every process checked is on its plan
  1  check: a process is off its plan; run: strict mode could not bind
  2  usage error: bad arguments, an unreadable or malformed input
  3  check --pid: a process named is gone (or a zombie)
  127 run: the command could not be executed

Environment variables: docs/environment.rst.  numabind is not published on PyPI yet:
install it from a checkout (pip install .).
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _int_in(name: str, lo: int, hi: int) -> Any:
    def parse(text: str) -> int:
        t = text.strip()
        if not (t.isascii() and t.isdigit()) or len(t) > 9 or not lo <= int(t) <= hi:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer from {lo} to {hi}, not {text!r}"
            )
        return int(t)

    parse.__name__ = name
    return parse


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(
        prog="numabind",
        description="Bind each GPU rank to the CPUs and memory of its GPU's NUMA node, and "
        "show or verify the plan.",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    p.add_argument("--version", action="version", version=f"numabind {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    show = sub.add_parser(
        "show",
        help="the machine, its accelerators and the plan for each local rank",
        description="Read this machine (or a capture of another) and print its NUMA nodes, "
        "its accelerators and the plan of local ranks 0..N-1.",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    show.add_argument(
        "--input",
        metavar="PATH",
        help="a capture instead of this machine: a directory laid out like / "
        "(hwloc-gather-topology, numabind gather extracted), a tarball of one, or an hwloc "
        ".xml export",
    )
    show.add_argument("--mode", choices=MODE_NAMES, default=None, help="binding mode (see below)")
    show.add_argument(
        "--memory", choices=MEMORY_POLICIES, default=None, help="memory policy (see below)"
    )
    show.add_argument(
        "--nproc",
        type=_int_in("--nproc", 1, MAX_NPROC),
        metavar="N",
        help=f"plan local ranks 0..N-1 (1..{MAX_NPROC}; default: the environment's local "
        "world size, else one per visible device)",
    )
    show.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    show.add_argument("--svg", metavar="FILE", help="also draw the machine and the ranks as SVG")

    gather = sub.add_parser(
        "gather",
        help="write a tarball of what numabind reads on this machine",
        description="Write a gzip tarball of every file numabind reads here, plus the rank "
        "and device variables of this environment; numabind show --input reads it elsewhere.",
        formatter_class=fmt,
    )
    gather.add_argument(
        "output",
        nargs="?",
        default="numabind-capture.tar.gz",
        help="the file to write (default numabind-capture.tar.gz; - writes to stdout)",
    )

    run = sub.add_parser(
        "run",
        help="bind this process for a local rank, then exec a command",
        description="Bind as the given (or environment's) local rank, then exec the command: "
        "a numactl trampoline that knows the GPU's node.",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    run.add_argument(
        "--local-rank",
        type=_int_in("--local-rank", 0, MAX_LOCAL - 1),
        default=None,
        metavar="N",
        help="the local rank (default: LOCAL_RANK, SLURM_LOCALID, ...)",
    )
    run.add_argument("--mode", choices=MODE_NAMES, default=None, help="binding mode")
    run.add_argument("--memory", choices=MEMORY_POLICIES, default=None, help="memory policy")
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

    check = sub.add_parser(
        "check",
        help="verify a process's binding and memory locality",
        description="Check processes against their plans: every thread's CPUs, the memory "
        "policy and the share of private memory on the plan's nodes.  Without arguments: "
        "this process, if it has a local rank.",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    check.add_argument(
        "--pid",
        type=_int_in("--pid", 1, 1 << 22),
        nargs="+",
        default=None,
        help="the processes to check",
    )
    check.add_argument(
        "--all", action="store_true", help="every rank process on this machine (root: every user's)"
    )
    check.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    check.add_argument(
        "--verbose", action="store_true", help="also count the registry entries ignored"
    )

    bench = sub.add_parser(
        "bench",
        help="measure what remote memory costs here: does binding pay on this machine?",
        description="From the CPUs each rank would be bound to, measure copy bandwidth and "
        "access latency to every NUMA node's memory (placement verified page by page), and "
        "pinned host<->device copies when torch sees a GPU; remote against local, with a "
        "verdict.  Restores this process's binding afterwards.",
        epilog=EPILOG,
        formatter_class=fmt,
    )
    bench.add_argument(
        "--rank", type=_int_in("--rank", 0, MAX_NPROC - 1), help="only this local rank's CPUs"
    )
    bench.add_argument(
        "--node", type=_int_in("--node", 0, 1023), help="from this node's CPUs (any plan aside)"
    )
    bench.add_argument(
        "--size",
        type=_int_in("--size", 4, 4096),
        default=64,
        metavar="MIB",
        help="buffer per node in MiB (default 64; the latency chase spans it: make it larger "
        "than the last-level cache)",
    )
    bench.add_argument(
        "--share",
        type=float,
        default=0.25,
        help="most of each node's free memory to use (default 0.25)",
    )
    bench.add_argument("--quick", action="store_true", help="fewer rounds (tests, slow VMs)")
    bench.add_argument("--mode", choices=MODE_NAMES, default=None, help="binding mode of the plans")
    bench.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    bench.add_argument("--svg", metavar="FILE", help="also draw the results as SVG")

    sub.add_parser(
        "sitecustomize-path",
        help="print the PYTHONPATH entry of numabind's sitecustomize",
        description="The directory to put on PYTHONPATH for the sitecustomize form of the hook.",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if args.command == "show":
            return _show(args)
        if args.command == "gather":
            return _gather(args)
        if args.command == "run":
            return _run(args)
        if args.command == "check":
            from ._check import main as check_main

            return check_main(args)
        if args.command == "bench":
            return _bench(args)
        if args.command == "sitecustomize-path":
            from ._startup import sitecustomize_dir

            print(sitecustomize_dir())
            return OK
        build_parser().print_help()
        return USAGE
    except UsageError as err:
        print(str(err), file=sys.stderr)
        return USAGE
    except BrokenPipeError:
        return OK
    except SystemExit as exit_:  # --help and --version
        return exit_.code if isinstance(exit_.code, int) else OK


def console_main() -> None:
    sys.exit(main())


# --- show -------------------------------------------------------------------------------


def _show(args: argparse.Namespace) -> int:
    from ._config import config_from_env
    from ._show import plans_for, show_data, show_text, this_process

    if args.svg is not None:
        folder = os.path.dirname(os.path.abspath(args.svg))
        if not args.svg or not os.path.isdir(folder):
            raise UsageError(f"numabind show: --svg {args.svg!r}: no such folder {folder!r}")
    if args.input is not None:
        from ._topology import Machine

        try:
            machine = Machine.from_capture(args.input)
        except CaptureError as err:
            raise UsageError(f"numabind show: {err}") from err
        recorded = machine.recorded_environ
        environ: Any = recorded if recorded is not None else os.environ
    else:
        from ._topology import Machine

        machine = Machine.from_root(sysroot(os.environ))
        environ = os.environ
    try:
        try:
            cfg = config_from_env(environ)
        except ConfigError as err:
            raise UsageError(f"numabind show: {err}") from err
        mode = args.mode or cfg.mode
        memory = args.memory or cfg.memory
        if not machine.node_ids and not machine.online_cpus:
            raise UsageError(
                f"numabind show: {machine.description}: no CPUs or NUMA nodes readable"
            )
        visible, plans, source = plans_for(machine, environ, args.nproc, mode, memory)
        data = show_data(machine, visible, plans)
        this = None if args.input else this_process(machine, environ, plans)
        if this is not None:
            data["this_process"] = this
        if args.svg:
            from ._svg import render

            svg = render(machine, plans, mode=mode, memory=memory)
            try:
                with open(args.svg, "w", encoding="utf-8") as f:
                    f.write(svg)
            except OSError as err:
                raise UsageError(f"numabind show: --svg {args.svg}: {err.strerror}") from err
        if args.json:
            json.dump(data, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            sys.stdout.write(show_text(machine, visible, plans, source, mode, memory))
            if this is not None:
                sys.stdout.write(f"\nThis process (pid {os.getpid()}): {this['summary']}\n")
    except (OSError, CaptureError) as err:
        raise UsageError(f"numabind show: {err}") from err
    finally:
        machine.close()
    return OK


# --- bench ------------------------------------------------------------------------------


def _bench(args: argparse.Namespace) -> int:
    from . import _bench as bench
    from ._config import config_from_env
    from ._show import plans_for
    from ._topology import Machine

    if not 0 < args.share <= 0.9:
        raise UsageError("numabind bench: --share must be in (0, 0.9]")
    if args.svg is not None and not os.path.isdir(os.path.dirname(os.path.abspath(args.svg))):
        raise UsageError(f"numabind bench: --svg {args.svg!r}: no such folder")
    try:
        cfg = config_from_env(os.environ)
    except ConfigError as err:
        raise UsageError(f"numabind bench: {err}") from err
    machine = Machine.from_root(sysroot(os.environ))
    try:
        if args.node is not None and machine.node(args.node) is None:
            raise UsageError(f"numabind bench: --node {args.node}: no such node")
        _, plans, _ = plans_for(machine, os.environ, None, args.mode or cfg.mode, cfg.memory)
        if args.rank is not None and not any(p.local_rank == args.rank for p in plans):
            raise UsageError(f"numabind bench: --rank {args.rank}: no such local rank")
        report = bench.run(
            machine,
            plans,
            rank=args.rank,
            node=args.node,
            size=args.size << 20,
            share=args.share,
            quick=args.quick,
        )
    finally:
        machine.close()
    if args.svg:
        from ._svg import render_bench

        with open(args.svg, "w", encoding="utf-8") as f:
            f.write(render_bench(report))
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(bench.text(report))
    return OK


# --- gather -----------------------------------------------------------------------------


def _gather(args: argparse.Namespace) -> int:
    from ._capture import gather

    try:
        n = gather(args.output, dict(os.environ), sysroot(os.environ))
    except OSError as err:
        raise UsageError(f"numabind gather: {args.output}: {err.strerror or err}") from err
    where = "standard output" if args.output == "-" else args.output
    show = "" if args.output == "-" else f"; show it with: numabind show --input {args.output}"
    stream = sys.stderr if args.output == "-" else sys.stdout
    print(f"numabind: wrote {n} files to {where}{show}", file=stream)
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
    from ._output import report
    from ._ranks import RankInfo, detect
    from ._startup import record_state

    try:
        cfg = config_from_env(os.environ)
    except ConfigError as err:
        raise UsageError(f"numabind run: {err}") from err
    from ._errors import BindingError

    mode, memory = args.mode or cfg.mode, args.memory or cfg.memory
    try:
        binding = apply(args.local_rank, mode=mode, memory=memory, migrate=False, strict=cfg.strict)
    except BindingError as err:
        print(f"numabind run: {err}", file=sys.stderr)
        return OFF_PLAN
    report(binding, cfg.verbose)
    if binding.plan.bound and cfg.threads != "off":
        from ._threads import apply_env

        apply_env(binding.plan, cfg.threads, os.environ)
    # The command's own startup hook must see this binding as inherited, not plan anew
    # with other settings: hand it the same mode, memory policy and rank.
    os.environ["NUMABIND_MODE"], os.environ["NUMABIND_MEMORY"] = mode, memory
    info = detect(os.environ)
    if args.local_rank is not None and info.local_rank != args.local_rank:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
        info = RankInfo(
            local_rank=args.local_rank,
            local_world_size=info.local_world_size,
            rank_source="LOCAL_RANK",
        )
    record_state(binding, info, mode, memory)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as err:
        print(f"numabind run: cannot run {cmd[0]!r}: {err.strerror}", file=sys.stderr)
        return 127
    return OK  # pragma: no cover - exec does not return
