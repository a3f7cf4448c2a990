"""The ``numabind`` command: ``show``, ``gather``, ``run``, ``check``, ``bench``, ``doctor``
(the parser below is the list; ``numabind --help`` prints it).

``main(argv) -> int`` returns the exit status (the table is :data:`._common.EXITS`).  A
domain error prints one line on stderr, never a traceback; JSON goes to stdout,
diagnostics to stderr; every text line goes through one writer that escapes what is not
printable, and every file through one writer that never follows a link
(:mod:`numabind.cli._common`).  This package parses and dispatches; each command lives in
its own module, and none of it is on the startup hook's path.
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import __version__
from .._environ import KNOBS, MAX_LOCAL, parse_reserve, parse_spill
from .._errors import CaptureError, UsageError
from .._model import (
    MEMORY_POLICY_TABLE,
    MODE_NAMES,
    MODE_TABLE,
    PRIORITY_ROLES,
    SMT_LEVELS,
    USER_POLICIES,
    Reserve,
    Spill,
)
from ._common import NOT_RUN, OFF_PLAN, OK, USAGE, OutputFile, exit_help, write_json, write_lines

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, NoReturn

MAX_NPROC = 4096  # --nproc ceiling: more local ranks than any machine has GPUs or nodes


def _example_names() -> list[str]:
    from ..capture._examples import EXAMPLES

    return list(EXAMPLES)


def _modes_help() -> str:
    return "modes (--mode, NUMABIND_MODE):\n" + "\n".join(
        f"  {m.name:13} {m.help}" for m in MODE_TABLE
    )


def _memory_help() -> str:
    return "memory policies (--memory, NUMABIND_MEMORY):\n" + "\n".join(
        f"  {p.name:13} {p.help}" for p in MEMORY_POLICY_TABLE if p.user
    )


def _environment_help() -> str:
    return "environment variables:\n" + "\n".join(
        f"  {k.name:26} {k.help}" for k in KNOBS if k.kind != "raw"
    )


_FOOTER = (
    "numabind is not published on PyPI yet: install it from a checkout (pip install .).\n"
    "Documentation: the docs/ folder of the checkout (README.md says how to build it)."
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        if "unrecognized arguments" in message or "invalid choice" in message:
            message += _suggestion(self, message)
        raise UsageError(f"{self.prog}: {message}")


def _suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    """``(did you mean --json?)`` for a mistyped option or command."""
    import difflib

    words = [w.strip("'\",()") for w in message.replace(":", " ").split()]
    known: list[str] = []
    for action in parser._actions:
        known.extend(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            known.extend(action.choices)
    for word in words:
        if word.startswith("-") or word.isidentifier():
            close = difflib.get_close_matches(word, known, n=1, cutoff=0.7)
            if close and close[0] != word:
                return f" (did you mean {close[0]}?)"
    return ""


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            chosen: argparse.ArgumentParser = action.choices[command]
            return chosen
    return parser


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


def _reserve(text: str) -> Reserve:
    """``--reserve``: n, n/node or n/rank, as NUMABIND_RESERVE."""
    try:
        return parse_reserve(text, "--reserve")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _spill(text: str) -> Spill:
    """``--spill``: cpu, any or a node list, as NUMABIND_SPILL."""
    try:
        return parse_spill(text, "--spill")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _roles(parser: argparse.ArgumentParser) -> None:
    """``--reserve``, ``--smt`` and ``--priority``: the core roles of NUMABIND_RESERVE /
    NUMABIND_SMT / NUMABIND_PRIORITY."""
    parser.add_argument(
        "--reserve",
        type=_reserve,
        default=None,
        metavar="N[/node|/rank]",
        help="keep N physical cores of each node (or N per local rank on it) out of every "
        "rank's compute set, for the system and helpers (NUMABIND_RESERVE)",
    )
    parser.add_argument(
        "--smt",
        choices=SMT_LEVELS,
        default=None,
        help="all: every hardware thread of a rank's cores; 1: one per core (NUMABIND_SMT)",
    )
    parser.add_argument(
        "--priority",
        choices=PRIORITY_ROLES,
        default=None,
        help="rank: each rank's CPUs are its share of its node's priority cores; main: only "
        "the thread that launches GPU work goes on one (NUMABIND_PRIORITY)",
    )


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 86400:
        raise argparse.ArgumentTypeError(f"--deadline must be seconds in (0, 86400], not {text!r}")
    return value


def _add_check(sub: Any, fmt: type[argparse.HelpFormatter]) -> None:
    """``numabind check``: one process, every rank here, a Slurm job, a store, a Ray
    cluster (its own function: the biggest parser of all)."""
    check = sub.add_parser(
        "check",
        help="verify a process's binding and memory locality",
        description="Check processes against their plans: every thread's CPUs, the memory "
        "policy and the share of private memory on the plan's nodes.  Without arguments: "
        "this process, if it has a local rank.",
        epilog="\n\n".join((exit_help("check"), _FOOTER)),
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
    check.add_argument(
        "--deadline",
        type=_seconds,
        default=60.0,
        metavar="SECONDS",
        help="--all: stop after this long; processes not reached are listed as skipped "
        "(default 60)",
    )
    check.add_argument(
        "--job",
        nargs="?",
        const="",
        default=None,
        metavar="JOBID",
        help="every rank of a Slurm job on every node, in one report (default: "
        "$SLURM_JOB_ID); runs the collector on each node with srun --overlap",
    )
    check.add_argument(
        "--ray",
        nargs="?",
        const="",
        default=None,
        metavar="DASHBOARD",
        help="every Ray actor and task holding a GPU, on every node, in one report, from "
        "the cluster whose dashboard is at HOST:PORT (http://HOST:8265): read over its "
        "HTTP API, checked by a job of the cluster's own; nothing of Ray runs here",
    )
    check.add_argument(
        "--store",
        default=None,
        metavar="HOST:PORT",
        help="read the records a torch.distributed job posted (NUMABIND_REPORT=1) from its "
        "store (MASTER_ADDR:MASTER_PORT), read only",
    )
    check.add_argument(
        "--python",
        default=None,
        metavar="PATH",
        help="with --job: the interpreter that runs the collector on each node (an absolute "
        "path with numabind installed there; default: this one); with --ray: the one the "
        "cluster's job runs (default: python on the cluster's PATH)",
    )
    check.add_argument(
        "--job-id",
        default=None,
        metavar="JOBID",
        help="with --all: only the ranks of this Slurm job on this node (as Slurm or the "
        "kernel tells its processes) and not of this process's own step, printed as one "
        "node record (what --job merges)",
    )
    check.add_argument(
        "--job-uid",
        type=_int_in("--job-uid", 0, (1 << 32) - 2),
        default=None,
        metavar="UID",
        help="with --job-id: the uid the job runs as, where the node has no Slurm process "
        "tracking or job cgroup (check --job passes it)",
    )
    check.add_argument(
        "--sysroot",
        default=None,
        metavar="DIR",
        help="read the machine from DIR (NUMABIND_SYSROOT, as an argument: check --job "
        "passes it to its collectors); for root, only a path root alone can change",
    )
    check.add_argument(
        "--registry",
        default=None,
        metavar="DIR",
        help="the registry's base (NUMABIND_REGISTRY, as an argument), same rule",
    )
    check.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    check.add_argument(
        "--format",
        choices=("text", "json", "openmetrics"),
        default=None,
        help="text (the default), json (as --json) or openmetrics: OpenMetrics text "
        "exposition for Prometheus or node_exporter's textfile collector, one series set per "
        "rank (--all, --pid, --job, --store)",
    )
    check.add_argument(
        "--verbose", action="store_true", help="also count the registry entries ignored"
    )


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter

    def plan_epilog(command: str) -> str:
        return "\n\n".join((_modes_help(), _memory_help(), exit_help(command), _FOOTER))

    p = _Parser(
        prog="numabind",
        description="Bind each GPU rank to the CPUs and memory of its GPU's NUMA node, and "
        "show or verify the plan.",
        epilog="\n\n".join((exit_help(), _environment_help(), _FOOTER)),
        formatter_class=fmt,
    )
    p.add_argument("--version", action="version", version=f"numabind {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")

    show = sub.add_parser(
        "show",
        help="the machine, its accelerators and the plan for each local rank",
        description="Read this machine (or a capture of another) and print its NUMA nodes, "
        "its accelerators and the plan of local ranks 0..N-1.",
        epilog=plan_epilog("show"),
        formatter_class=fmt,
    )
    show.add_argument(
        "--input",
        metavar="PATH",
        help="a capture instead of this machine: a directory laid out like / "
        "(hwloc-gather-topology, numabind gather extracted), a tarball of one, or an hwloc "
        "XML export (told apart by content); - reads a tarball or an export from standard "
        "input",
    )
    show.add_argument(
        "--example",
        metavar="NAME",
        choices=sorted(_example_names()),
        help="an example machine instead of this one: " + ", ".join(sorted(_example_names())),
    )
    show.add_argument("--mode", choices=MODE_NAMES, default=None, help="binding mode (see below)")
    show.add_argument(
        "--memory", choices=USER_POLICIES, default=None, help="memory policy (see below)"
    )
    show.add_argument(
        "--spill",
        type=_spill,
        default=None,
        metavar="cpu|any|NODES",
        help="where memory goes once a rank's nodes are full: cpu (CPU memory only, the "
        "default), any (any node), or cpu,N (NUMABIND_SPILL)",
    )
    _roles(show)
    show.add_argument(
        "--nproc",
        type=_int_in("--nproc", 1, MAX_NPROC),
        metavar="N",
        help=f"plan local ranks 0..N-1 (1..{MAX_NPROC}; default: the environment's local "
        "world size, else one per visible device)",
    )
    show.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    show.add_argument(
        "--svg",
        metavar="FILE",
        help="also draw the machine and the ranks as SVG (- : standard output, instead of "
        "the text)",
    )
    show.add_argument(
        "--matrix",
        action="store_true",
        help="the nvidia-smi topo -m view from the PCI tree: the path between every pair of "
        "GPUs and RDMA NICs, and each one's CPUs and node",
    )
    show.add_argument(
        "--numactl",
        action="store_true",
        help="the numactl (or taskset) command line that gives each rank its binding",
    )
    show.add_argument(
        "--draw",
        action="store_true",
        help="the same picture as text: per node, one character per core, its ranks' letter",
    )
    show.add_argument("--force", action="store_true", help="replace an existing --svg file")

    gather = sub.add_parser(
        "gather",
        help="write a tarball of what numabind reads on this machine (or an example "
        "machine as a folder to try numabind on)",
        description="Write a tarball of every file numabind reads here, plus the rank and "
        "device variables of this environment; numabind show --input reads it elsewhere. "
        "With --example NAME, write that example machine instead, as a folder laid out "
        "like / (NUMABIND_SYSROOT=DIR points numabind at it) or as a tarball.",
        epilog=exit_help("gather"),
        formatter_class=fmt,
    )
    gather.add_argument(
        "output",
        nargs="?",
        default=None,
        help="the file to write (default numabind-capture.tar.gz; - writes to stdout; "
        ".tar is not compressed, .tar.bz2 and .tar.xz as named, anything else gzip); with "
        "--example: a new or empty folder, or a tarball name",
    )
    gather.add_argument(
        "--example",
        metavar="NAME",
        choices=sorted(_example_names()),
        help="write this example machine, not this one: " + ", ".join(sorted(_example_names())),
    )
    gather.add_argument("--force", action="store_true", help="replace an existing output")

    run = sub.add_parser(
        "run",
        help="bind this process for a local rank, then exec a command",
        description="Bind as the given (or environment's) local rank, then exec the command: "
        "a numactl trampoline that knows the GPU's node.",
        epilog=plan_epilog("run"),
        formatter_class=fmt,
    )
    run.add_argument(
        "--local-rank",
        type=_int_in("--local-rank", 0, MAX_LOCAL - 1),
        default=None,
        metavar="N",
        help="the local rank (default: LOCAL_RANK, SLURM_LOCALID, ...)",
    )
    where = run.add_mutually_exclusive_group()
    where.add_argument(
        "--device",
        metavar="D",
        help="bind to this device's node instead: an index among the visible devices, a PCI "
        "address or a UUID",
    )
    where.add_argument(
        "--node",
        type=_int_in("--node", 0, 1023),
        metavar="N",
        help="bind to NUMA node N's CPUs and memory (numactl --cpunodebind=N --preferred=N)",
    )
    where.add_argument(
        "--cpus",
        metavar="LIST",
        help="bind to these CPUs (0-7,16) and the memory of their nodes (numactl --physcpubind)",
    )
    run.add_argument("--mode", choices=MODE_NAMES, default=None, help="binding mode")
    run.add_argument("--memory", choices=USER_POLICIES, default=None, help="memory policy")
    _roles(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD ARGS...")

    _add_check(sub, fmt)
    bench = sub.add_parser(
        "bench",
        help="measure what remote memory costs here: does binding pay on this machine?",
        description="From the CPUs each rank would be bound to, measure copy bandwidth and "
        "access latency to every NUMA node's memory (placement verified page by page), and "
        "pinned host<->device copies through the GPU driver from a registered buffer on each "
        "GPU's node against one on the farthest node, each GPU alone and all at once; remote "
        "against local, with a verdict.  Restores this process's binding afterwards.",
        epilog="\n\n".join((_modes_help(), exit_help("bench"), _FOOTER)),
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
        default=None,
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
    bench.add_argument(
        "--quick",
        action="store_true",
        help="fewer rounds and a 16 MiB buffer (tests, slow VMs); latency then shows the "
        "caches more than memory and is marked so",
    )
    bench.add_argument(
        "--only",
        choices=("memory", "gpu"),
        default=None,
        help="only the memory copies and latency from the ranks' CPUs, or only the pinned "
        "host<->device copies",
    )
    bench.add_argument("--mode", choices=MODE_NAMES, default=None, help="binding mode of the plans")
    bench.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    bench.add_argument(
        "--svg", metavar="FILE", help="also draw the results as SVG (- : standard output)"
    )
    bench.add_argument("--force", action="store_true", help="replace an existing --svg file")

    doctor = sub.add_parser(
        "doctor",
        help="say what would keep a rank from being bound here, before the job runs",
        description="Check that the startup hook is installed and runs for an interpreter "
        "(this one, or the one a launcher will use: --python), that no other .pth file or "
        "sitecustomize gets in its way, which trigger variables are set, whether this "
        "container lets a process set its CPUs and memory policy and move pages, and "
        "which accelerators numabind does not handle.",
        epilog=exit_help("doctor"),
        formatter_class=fmt,
    )
    doctor.add_argument(
        "--python",
        metavar="PATH",
        help="the interpreter to check (default: the one running numabind)",
    )
    doctor.add_argument("--json", action="store_true", help="machine-readable output on stdout")

    sub.add_parser(
        "sitecustomize-path",
        help="print the PYTHONPATH entry of numabind's sitecustomize",
        description="The directory to put on PYTHONPATH for the sitecustomize form of the hook.",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        status = _dispatch(argv)
        sys.stdout.flush()  # a write error surfaces here, inside the handlers below
        return status
    except UsageError as err:
        _say_error(str(err))
        return USAGE
    except CaptureError as err:
        _say_error(f"numabind: {err}")
        return USAGE
    except BrokenPipeError:
        # the reader went away (| head): stop quietly, and keep Python's exit-time flush
        # of the rest from complaining
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return OK
    except OSError as err:
        if err.errno is not None and getattr(err, "filename", None) is None:
            _say_error(f"numabind: cannot write the output: {err.strerror or err}")
            _silence_stdout()
            return USAGE
        raise
    except SystemExit as exit_:  # --help and --version
        return exit_.code if isinstance(exit_.code, int) else OK


def _say_error(line: str) -> None:
    from ._common import write_lines

    try:
        write_lines([line], sys.stderr)
        sys.stderr.flush()
    except OSError:
        pass


def _silence_stdout() -> None:
    """After a failed write (/dev/full), let Python's exit-time flush fail silently."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _cmd_check(args: argparse.Namespace) -> int:
    from .._errors import UsageError

    if args.python is not None and (
        (args.job is None and args.ray is None) or args.store is not None
    ):
        raise UsageError(
            "numabind check: --python names the interpreter --job runs on each node "
            "(or --ray's job in the cluster); not with --store or --all"
        )
    if args.job_uid is not None and args.job_id is None:
        raise UsageError("numabind check: --job-uid goes with --all --job-id JOBID")
    if args.ray is not None and (args.job is not None or args.store is not None):
        raise UsageError("numabind check: --ray, --job and --store are three reports; give one")
    from ._check import output_format

    args.json = output_format(args) == "json"
    if args.format == "openmetrics" and args.ray is not None:
        raise UsageError(
            "numabind check: --format openmetrics writes --all, --pid, --job or --store; not --ray"
        )
    if args.ray is not None:
        from ._ray import run_ray

        return run_ray(args)
    if args.job is not None or args.job_id is not None or args.store is not None:
        from ._job import run_job

        return run_job(args)
    from ._check import run_check

    return run_check(args)


def _dispatch(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # name the subcommand and the option it does not take
        sub = _subparser(parser, args.command)
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "show":
        from ._show import run_show

        return run_show(args)
    if args.command == "gather":
        return _cmd_gather(args)
    if args.command == "run":
        return _cmd_run(args)
    if args.command == "check":
        return _cmd_check(args)
    if args.command == "bench":
        from ._bench import run_bench

        return run_bench(args)
    if args.command == "doctor":
        return _cmd_doctor(args)
    if args.command == "sitecustomize-path":
        from .._startup import sitecustomize_dir

        print(sitecustomize_dir())
        return OK
    build_parser().print_help()
    return USAGE


def console_main() -> None:
    sys.exit(main())


# --- doctor ------------------------------------------------------------------------------------


def _cmd_doctor(args: argparse.Namespace) -> int:
    from .._topology import Machine
    from ._doctor import Finding, doctor, lines

    machine = None
    problem = None
    try:  # where the machine is read from, whatever else the settings say (doctor names those);
        # as it is now, never from the ranks' cache (doctor says whether that still holds)
        machine = Machine.here()
    except (CaptureError, OSError) as err:
        problem = Finding(check="machine", status="fail", detail=f"cannot read it: {err}")
    try:
        found = doctor(args.python, os.environ, machine)
    finally:
        if machine is not None:
            machine.close()
    if problem is not None:
        found.append(problem)
    if args.json:
        write_json({"findings": [f.to_dict() for f in found]})
    else:
        write_lines(lines(found))
    return OFF_PLAN if any(f.status == "fail" for f in found) else OK


# --- gather ------------------------------------------------------------------------------------


def _cmd_gather(args: argparse.Namespace) -> int:
    from .._environ import sysroot
    from ._gather import gather

    if args.example is not None:
        return _gather_example(args)
    output = args.output or "numabind-capture.tar.gz"
    out = OutputFile(output, "output", "gather", args.force).check()
    n = gather(out, dict(os.environ), sysroot(os.environ))
    where = "standard output" if out.stdout else output
    show = "" if out.stdout else f"; show it with: numabind show --input {output}"
    stream = sys.stderr if out.stdout else sys.stdout
    print(f"numabind: wrote {n} files to {where}{show}", file=stream)
    return OK


def _gather_example(args: argparse.Namespace) -> int:
    """``gather --example NAME DIR``: the example as a sysroot folder (or a tarball)."""
    from ..capture._examples import EXAMPLES, build
    from ._playground import is_tarball, sysroot_note, write_tree

    if not args.output or args.output == "-":
        raise UsageError(
            "numabind gather --example: give the folder to write (numabind gather --example "
            f"{args.example} DIR), or a tarball name"
        )
    name, output = args.example, args.output
    if is_tarball(output):
        from ..capture._examples import example_root
        from ._gather import gather

        out = OutputFile(output, "output", "gather", args.force).check()
        n = gather(out, {}, root=example_root(name))
        print(f"numabind: wrote example {name} ({n} files) to {output}; show it with: "
              f"numabind show --input {output}")  # fmt: skip
        return OK
    tree = build(EXAMPLES[name]())
    n = write_tree(output, tree.files, tree.links)
    where = os.path.abspath(output)
    lines = [
        f"numabind: wrote example {name} ({n} files) to {output}; numabind reads it as "
        "this machine with:",
        f"  export NUMABIND_SYSROOT={where}",
        "  numabind show                      # the plan; the knobs (NUMABIND_MODE, ...) apply",
        "  LOCAL_RANK=0 numabind run -- CMD   # bound as rank 0 of that machine would be",
    ]
    note = sysroot_note(where)
    if note:
        lines.append(f"note: {note}")
    write_lines(lines)
    return OK


# --- run ---------------------------------------------------------------------------------------


def _explicit(args: argparse.Namespace, cfg: Any, memory: str) -> Any:
    """``run --device D | --node N | --cpus LIST``: bind exactly as asked (the user chose,
    so the keep/replace rule does not apply).  What was named and cannot be honoured (no
    such device or node, CPUs this machine lacks or this process may not use) is refused
    as numactl refuses it: a wrapper that runs the job elsewhere hides the mistake.  A
    memory-policy call the kernel refuses is what it is for every form of ``run``: the
    CPUs are bound, one line says so and the command runs (``NUMABIND_STRICT=1``: refused).
    Returns None when refused."""
    from .._api import bind
    from .._apply import enter
    from .._errors import BindingError
    from .._plan import explicit
    from .._topology import Machine

    try:
        if args.device is not None:
            spec = args.device.strip()
            device: int | str = int(spec) if spec.isascii() and spec.isdigit() else spec
            binding = bind(
                device=device,
                memory=memory,
                migrate=False,
                threads="env",
                source="--device",
                strict=cfg.strict,
                report=False,
            )
            if not binding.plan.bound:
                binding.restore()
                raise BindingError(f"{binding.plan.summary()}; the command was not run")
            binding.report(cfg.verbose)
            return binding
        machine = Machine.from_root(cfg.sysroot)
        try:
            cpus = _named_cpus(args.cpus, machine) if args.cpus is not None else None
            p = explicit(machine, cpus=cpus, node=args.node, memory=memory, spill=cfg.spill)
            if not p.bound:  # asked for by name: refuse, as numactl does, not run unbound
                raise BindingError(f"{p.rank_source}: {p.reason}; the command was not run")
            return enter(p, None, cfg, migrate=False, threads="env")
        finally:
            machine.close()
    except BindingError as err:
        print(f"numabind run: {err}", file=sys.stderr)
        return None


def _named_cpus(text: str, machine: Any) -> frozenset[int]:
    """``--cpus LIST`` as numactl --physcpubind takes it: a list that does not parse or
    names nothing is a usage error; a CPU this machine does not have, or one this
    process may not use, refuses the whole list (numactl: "<0-7> is invalid")."""
    from .._errors import BindingError
    from .._sysfs import format_cpulist, parse_cpulist

    try:
        cpus = parse_cpulist(text)
    except ValueError as err:
        raise UsageError(f"numabind run: --cpus {text!r}: {err}") from None
    if not cpus:
        raise UsageError(f"numabind run: --cpus {text!r}: names no CPU (give a list: 0-7,16)")
    shown = format_cpulist(cpus)
    online = machine.online_cpus
    missing = cpus - online
    if missing:
        raise BindingError(
            f"--cpus {shown}: {_cpus_text(missing)} not on this machine (it has "
            f"CPUs {format_cpulist(online)}); the command was not run"
        )
    allowed = machine.allowed
    outside = cpus - allowed.cpus
    if outside:
        raise BindingError(
            f"--cpus {shown}: {_cpus_text(outside)} outside the CPUs this process may use "
            f"({format_cpulist(allowed.cpus) or 'none'}, from {allowed.source}); the command "
            "was not run"
        )
    return cpus


def _cpus_text(cpus: frozenset[int]) -> str:
    """``CPU 5 is`` / ``CPUs 2-7 are``."""
    from .._sysfs import format_cpulist

    return f"CPU {min(cpus)} is" if len(cpus) == 1 else f"CPUs {format_cpulist(cpus)} are"


def _cmd_run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise UsageError("numabind run: no command given (numabind run [options] -- CMD ARGS...)")
    from .. import _startup
    from .._api import bind
    from .._environ import Config, RankInfo, detect
    from .._errors import BindingError

    try:
        cfg = Config.from_env()
    except ValueError as err:
        raise UsageError(f"numabind run: {err}") from err
    mode, memory = args.mode or cfg.mode, args.memory or cfg.memory
    reserve = cfg.reserve if args.reserve is None else args.reserve
    smt = args.smt or cfg.smt
    priority = args.priority or cfg.priority
    cfg = cfg.replace(reserve=reserve, smt=smt, priority=priority)
    hooked = _startup.last
    asked = args.device is not None or args.node is not None or args.cpus is not None
    if asked:
        binding = _explicit(args, cfg, memory)
        if binding is None:
            return OFF_PLAN
    elif (
        hooked is not None
        and args.local_rank is None
        and args.reserve is None
        and args.smt is None
        and args.priority is None
        and (mode, memory)
        == (
            cfg.mode,
            cfg.memory,
        )
    ):
        binding = hooked  # the startup hook bound this very process for the same rank
    else:
        try:
            binding = bind(
                args.local_rank,
                mode=mode,
                memory=memory,
                migrate=False,
                strict=cfg.strict,
                threads="env",
                roles=(reserve, smt),
                priority=priority,
            )
        except BindingError as err:
            print(f"numabind run: {err}", file=sys.stderr)
            return OFF_PLAN
    # The command's own startup hook must see this binding as inherited, not plan anew
    # with other settings: hand it the same mode, memory policy and rank.
    os.environ["NUMABIND_MODE"], os.environ["NUMABIND_MEMORY"] = mode, memory
    os.environ["NUMABIND_RESERVE"], os.environ["NUMABIND_SMT"] = str(reserve) or "0", smt
    os.environ["NUMABIND_PRIORITY"] = priority
    info = detect(os.environ)
    if args.local_rank is not None and info.local_rank != args.local_rank:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
        info = RankInfo(
            local_rank=args.local_rank,
            local_world_size=info.local_world_size,
            rank_source="LOCAL_RANK",
        )
    _startup.record_state(binding, info, mode, memory, _startup.roles_key(cfg))
    try:
        os.execvp(cmd[0], cmd)
    except OSError as err:
        print(f"numabind run: cannot run {cmd[0]!r}: {err.strerror}", file=sys.stderr)
        return NOT_RUN
    return OK  # pragma: no cover - exec does not return
