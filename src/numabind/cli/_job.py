"""``numabind check --job``: every rank of a Slurm job, on every node, in one report.

The collector is ``numabind check --all --job-id J``: run on a node, it checks the ranks of
job J there, reading /proc and sysfs only, and prints one node record
(numabind.check._job.SCHEMA).  Which processes are job J's is the kernel's or Slurm's word, not
theirs (numabind.check._inspect.job_members: ``scontrol listpids``, the job's cgroup, else the
job owner's uid); what they claim (``SLURM_JOB_ID``, ``SLURMD_NODENAME``, not this
collector's own step) only narrows that.  ``check --job`` runs the collector once per node
of the job in one ``srun --overlap`` step (beside a busy step: no CPU of the job is
needed), stops at ``--deadline``, and merges: a node with no record is a row that says
why.  No daemon, no SSH: Slurm's own launch.

The collector runs as the caller (root, for an audit) on every node, so nothing on its
way may be another user's (numabind.check._isolated): the step starts in ``/``
(``--chdir=/``), the node's ``/bin/sh`` checks the interpreter before it runs, and the
interpreter starts isolated (``-I -S -B``) with numabind loaded from its installation
alone; the collector's settings (``--sysroot``, ``--registry``, ``--job-uid``) travel as
arguments.  An interpreter or a numabind that another user could change is refused, here
or on the node, with one line.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping

from .. import _sysfs
from .._model import JOB_VARIABLES, Record
from ..check import _job
from ..check._inspect import COLLECTOR, job_filter
from ..check._isolated import (
    NODE_CHECK,
    boot_argv,
    install_root,
    interpreter_problem,
    isolated_env,
    loose,
    running_python,
    say,
)
from ..check._job import node_record
from ._common import (
    UNREACHABLE,
    USAGE,
    unreachable,
    write_json,
    write_json_line,
    write_lines,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

    from ..check._inspect import CheckReport

STOP_SECONDS = 2.0  # of --deadline, kept for stopping srun and its step
OUTPUT_CAP = 256 << 20  # bytes read from srun at most (1,000 nodes x 8 ranks is ~10 MiB)


# --- the collector ---------------------------------------------------------------------------


def _from_store(args: argparse.Namespace) -> int:
    """``check --store HOST:PORT``: the records a torch.distributed job posted, read
    through numabind's own bounded client of the store (no torch needed)."""
    from .._errors import UsageError
    from ..check import _report

    host, _, port = args.store.rpartition(":")
    if not host or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise UsageError(f"numabind check --store: {_sysfs.short(args.store)} is not HOST:PORT")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:29500
    started = time.monotonic()
    said = f"numabind check --store {_sysfs.clean_line(args.store, 80)}"
    wait = min(args.deadline, 60.0)
    why = unreachable(host, int(port), min(wait, 10.0))
    if why is not None:
        write_lines([f"{said}: cannot reach the store ({why})"], stream=sys.stderr)
        return UNREACHABLE
    from ..check._store import StoreClient, StoreError

    try:
        store = StoreClient(host, int(port), started + wait, _job.STORE_RECORD_BYTES)
        if not store.check([_report.LATEST]):
            write_lines(
                [
                    f"{said}: no numabind records in this store (was the job run with "
                    "NUMABIND_REPORT=1?)"
                ],
                stream=sys.stderr,
            )
            return UNREACHABLE
        latest = store.get(_report.LATEST)[:200].decode("ascii", "replace")
    except StoreError as err:
        write_lines([f"{said}: cannot read the store ({_sysfs.clean_line(str(err), 200)})"],
                    stream=sys.stderr)  # fmt: skip
        return UNREACHABLE
    m = re.fullmatch(r"([A-Za-z0-9_.-]{1,64})/(\d{1,6})/(\d{1,7})", latest)
    if m is None or not 0 < int(m.group(3)) <= _report.MAX_WORLD:
        write_lines([f"{said}: its numabind/latest key is malformed"], stream=sys.stderr)
        return UNREACHABLE
    prefix = f"{_report.PREFIX}/{m.group(1)}/{m.group(2)}"
    store.deadline = started + args.deadline
    budget = _job.Budget(store.deadline)
    try:
        report = _report.read_report(store, prefix, int(m.group(3)), None, budget=budget)
    finally:
        store.close()
    _write_report(args, report)
    return _job.exit_status(report)


def _write_report(args: argparse.Namespace, report: _job.JobReport) -> None:
    """The job report as ``--format`` asks: the table, JSON, or OpenMetrics text."""
    from ._check import output_format

    fmt = output_format(args)
    if fmt == "openmetrics":
        from ..check._metrics import render_job, write

        write(render_job(report))
    elif fmt == "json":
        write_json(report.to_dict())
    else:
        write_lines(_job.report_lines(report))


def _collector(args: argparse.Namespace) -> int:
    """``check --all --job-id J``: the job's processes as the kernel or Slurm says, each a
    rank only if it also claims to be one of J's on this node, written as the node record
    ``check --job`` merges (or, ``--format openmetrics``, as series); at most
    :data:`numabind.check._job.MAX_RANKS` checked (the rest counted in a note)."""
    from ..check._inspect import job_members
    from ._check import output_format, run_check

    members = job_members(args.job_id, args.job_uid, timeout=min(args.deadline / 4, 10.0))
    notes = [f"job {args.job_id}'s processes here, as told by {members.source}"]

    def emit(report: CheckReport) -> None:
        if output_format(args) == "openmetrics":  # the job's ranks here, for a textfile
            from ..check._metrics import render, write

            write(render(report))
        else:
            write_json_line(node_record(report, args.job_id, tuple(notes)))

    def cap(pids: list[int]) -> list[int]:
        if len(pids) > _job.MAX_RANKS:
            notes.append(
                f"{len(pids) - _job.MAX_RANKS} more rank(s) of the job here not checked "
                f"(at most {_job.MAX_RANKS} per node)"
            )
        return pids[: _job.MAX_RANKS]

    keep = job_filter(args.job_id, os.environ)
    return run_check(args, keep=keep, emit=emit, members=members.pids, cap=cap)


# --- Slurm: which nodes, and one collector on each ---------------------------------------------


class SlurmError(Exception):
    """Slurm could not tell or run what was asked (one line for the user)."""


def slurm_tool(name: str) -> str:
    """The path of Slurm's ``name`` on PATH, refused (SlurmError) when another user could
    change it: it is run with the caller's privileges."""
    path = shutil.which(name)
    if path is None:
        raise SlurmError(f"{name} is not installed here: check --job needs Slurm")
    found = loose(path, {0, os.geteuid()})
    if found is not None:
        raise SlurmError(f"{say(found)}: {name} is not run as uid {os.geteuid()}")
    return path


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    argv = [slurm_tool(argv[0]), *argv[1:]]
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, cwd="/"
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed here: check --job needs Slurm") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv[:3])} did not answer in {timeout:.0f} s") from None


class JobInfo(Record):
    """What ``scontrol show job`` says of a job: its nodes and the uid it runs as."""

    nodes: tuple[str, ...]
    uid: int | None


def job_nodes(job: str, environ: Mapping[str, str], timeout: float = 20) -> JobInfo:
    """The job's nodes: those ``scontrol`` lists now, and those it started on (this
    shell's ``SLURM_JOB_NODELIST`` when it runs inside the job): a node that failed
    drops out of Slurm's list but is still a node of the job, to be reported; and its
    owner's uid (``UserId=name(uid)``), which the collectors use where the node has no
    process tracking of its own."""
    p = _run(["scontrol", "show", "job", "--oneliner", job], timeout)
    if p.returncode != 0:
        said = (p.stderr or p.stdout).strip().splitlines()
        why = _sysfs.clean_line(said[-1], 300) if said else f"exit status {p.returncode}"
        raise SlurmError(f"no job {job} ({why})")
    text = p.stdout[:OUTPUT_CAP]
    state = re.search(r"\bJobState=(\S+)", text)
    if state is not None and state.group(1) not in ("RUNNING", "SUSPENDED", "COMPLETING"):
        raise SlurmError(f"job {job} is {state.group(1)}, not running: there are no ranks to check")
    m = re.search(r"\bNodeList=(\S+)", text)
    listed = m.group(1) if m is not None and m.group(1) != "(null)" else ""
    names = _job.expand_hostlist(listed) if listed else []
    if environ.get(JOB_VARIABLES["job"]) == job and environ.get(JOB_VARIABLES["job_nodes"]):
        for name in _job.expand_hostlist(environ[JOB_VARIABLES["job_nodes"]]):
            if name not in names:
                names.append(name)
    if not names:
        raise SlurmError(f"job {job} has no nodes yet")
    owner = re.search(r"\bUserId=[^(\s]*\((\d{1,10})\)", text)
    return JobInfo(nodes=tuple(names), uid=int(owner.group(1)) if owner else None)


_LAYOUT_VARIABLES = (
    "SLURM_CPU_BIND",
    "SLURM_NTASKS",
    "SLURM_TASKS_PER_NODE",
    "SLURM_NPROCS",
    "SLURM_NNODES",
    "SLURM_JOB_NUM_NODES",
    "SLURM_NODELIST",
    "SLURM_DISTRIBUTION",
)
_LABEL = re.compile(r"^\s*(\d{1,7}): (.*)$")
_FAILED = re.compile(r"failed on node (\S+?):? (.*)$")


class Collector(Record):
    """How the collector is started on the nodes: the interpreter's path there, where
    numabind is installed beside it ("": found by that interpreter in its own site
    directory), and the settings it is given as arguments."""

    python: str
    root: str = ""
    settings: tuple[str, ...] = ()


def collector_argv(job: str, uid: int | None, budget: float, c: Collector) -> list[str]:
    """The step's command: the node's ``/bin/sh`` checks the interpreter (numabind.
    _isolated.NODE_CHECK), which then starts isolated on the collector."""
    args = ["check", "--all", "--job-id", job, "--deadline", f"{budget:.0f}", *c.settings]
    if uid is not None:
        args += ["--job-uid", str(uid)]
    return [
        "/bin/sh",
        "-c",
        NODE_CHECK,
        "numabind",
        *boot_argv(c.python, args, c.root, "collector"),
    ]


def collect_slurm(
    job: str,
    nodes: list[str],
    deadline: float,
    collector: Collector | str = "",
    uid: int | None = None,
    budget: _job.Budget | None = None,
) -> tuple[dict[str, _job.NodeRow], list[str]]:
    """Run the collector on ``nodes`` in one ``srun --overlap`` step (from ``/``); the rows
    of the nodes that answered (or whose launch failed, with Slurm's reason; or that
    refused to run it) and notes."""
    srun = slurm_tool("srun")
    if isinstance(collector, str):
        collector = Collector(python=collector or sys.executable, root=install_root())
    left = max(deadline - STOP_SECONDS, 1.0)
    argv = [
        srun,
        f"--jobid={job}",
        "--overlap",
        f"--nodes={len(nodes)}",
        f"--ntasks={len(nodes)}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(nodes)}",
        "--no-kill",
        "--kill-on-bad-exit=0",
        "--label",
        "--cpu-bind=none",
        "--chdir=/",
        "--job-name=numabind-check",
        *collector_argv(job, uid, left, collector),
    ]
    # the caller's own step layout (inside an allocation) would contradict the flags above
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAYOUT_VARIABLES)}
    env = isolated_env(env)
    env["NUMABIND"] = "off"  # the collector itself is never bound,
    env[COLLECTOR] = "1"  # nor reported, by itself or by a later collector
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd="/",
        start_new_session=True,
    )
    out, err, timed_out = _communicate(proc, max(deadline - STOP_SECONDS, 0.5))
    per_task: dict[str, list[bytes]] = {}
    for raw in out.splitlines():
        label = _LABEL.match(raw.decode("utf-8", "replace"))
        if label is not None:
            per_task.setdefault(label.group(1), []).append(label.group(2).encode())
    rows: dict[str, _job.NodeRow] = {}
    budget = budget if budget is not None else _job.Budget(time.monotonic() + deadline)
    for chunks in per_task.values():
        # srun cuts a long line into labelled pieces: the collector writes one line
        row = _job.parse_node(b"".join(chunks), job=job, budget=budget)
        if row.state != "invalid" and row.host not in nodes:
            continue  # a record for a node not asked for is not evidence of anything
        if row.host in rows and rows[row.host].state == "answered":
            continue
        rows[row.host] = row
    notes: list[str] = []
    errors = err.decode("utf-8", "replace").splitlines()[:200]
    for line in errors:
        m = _FAILED.search(line)
        if m is not None and m.group(1) in nodes and m.group(1) not in rows:
            rows[m.group(1)] = _job.NodeRow(
                host=m.group(1), state="unreachable", reason=_sysfs.clean_line(m.group(2), 200)
            )
    last = _sysfs.clean_line(errors[-1], 200) if errors else ""
    for n in nodes:
        if n not in rows:
            why = f"no answer before the deadline ({deadline:.0f} s)" if timed_out else "no record"
            if last and not timed_out:
                why += f" (srun: {last.removeprefix('srun: ')})"
            rows[n] = _job.NodeRow(host=n, state="unreachable", reason=why)
    if len(out) >= OUTPUT_CAP:
        notes.append(f"the collectors' output was cut at {OUTPUT_CAP >> 20} MiB")
    return rows, notes


def _communicate(proc: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bytes, bool]:
    """srun's stdout and stderr, each kept up to :data:`OUTPUT_CAP` (the rest is read and
    dropped, so srun never blocks on a full pipe), until both close; past ``timeout`` srun
    and its step are stopped and what they still write in :data:`STOP_SECONDS` is read.
    Returns (stdout, stderr, whether it was stopped)."""
    import selectors

    assert proc.stdout is not None and proc.stderr is not None
    kept = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    end = time.monotonic() + timeout
    stopped = False
    with selectors.DefaultSelector() as sel:
        for fd in kept:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = end - time.monotonic()
            if left <= 0:
                if stopped:
                    break
                _stop(proc)
                stopped, end = True, time.monotonic() + STOP_SECONDS
                continue
            for key, _ in sel.select(min(left, 1.0)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = kept[key.fd]
                buf += chunk[: max(OUTPUT_CAP - len(buf), 0)]
    try:
        proc.wait(timeout=STOP_SECONDS)
    except subprocess.TimeoutExpired:
        _stop(proc)
    return bytes(kept[proc.stdout.fileno()]), bytes(kept[proc.stderr.fileno()]), stopped


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop srun and its step: SIGINT twice is srun's 'cancel the step', then SIGKILL."""
    for sig, wait in ((signal.SIGINT, 0.3), (signal.SIGINT, 1.0), (signal.SIGKILL, 1.0)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def settings_arguments(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The caller's redirections (``NUMABIND_SYSROOT``, ``NUMABIND_REGISTRY``), as the
    collector's arguments: it starts isolated, so it reads no setting from its
    environment; each node applies the same rule to them as its startup hook would."""
    out: list[str] = []
    for var, flag in (("NUMABIND_SYSROOT", "--sysroot"), ("NUMABIND_REGISTRY", "--registry")):
        value = environ.get(var, "").strip()
        if value and not sys.flags.ignore_environment:
            out += [flag, value]
    return tuple(out)


def _collector_for(args: argparse.Namespace) -> Collector:
    """The interpreter the nodes run, checked here first where it exists here: this one
    (with this numabind) by default, or ``--python PATH`` (which finds its own)."""
    from .._errors import UsageError

    said = "numabind check --job"
    uids = {0, os.geteuid()}
    python = args.python or running_python()
    if not os.path.isabs(python) or len(python) > 4096 or "\0" in python:
        raise UsageError(
            f"{said}: --python {_sysfs.short(python)} is not an absolute path "
            "(the nodes' interpreter: they do not share this shell's PATH)"
        )
    root = "" if args.python else install_root()
    if os.path.exists(python):
        why = interpreter_problem(python, uids)
        if why is not None:
            raise UsageError(f"{said}: {why}: the collector is not run on the nodes as uid "
                             f"{os.geteuid()} (see docs/security.rst)")  # fmt: skip
    if root:
        found = loose(os.path.join(root, "numabind"), uids, tree=True)
        if found is not None:
            raise UsageError(f"{said}: {say(found)}: this numabind is not run on the nodes "
                             f"as uid {os.geteuid()}")  # fmt: skip
    return Collector(python=python, root=root, settings=settings_arguments(os.environ))


def run_job(args: argparse.Namespace) -> int:
    """``check --job`` (the report), ``check --all --job-id`` (the collector) and
    ``check --store`` (a torch.distributed job's report from its store)."""
    from .._errors import UsageError

    if args.job_id is not None:
        if args.job is not None or args.pid or not args.all or args.store is not None:
            raise UsageError("numabind check: --job-id selects among --all; give --all too")
        return _collector(args)
    if args.store is not None:
        if args.pid or args.all or args.job:
            raise UsageError(
                "numabind check --store reads the job whose records are in that store: "
                "it takes no JOBID, --pid or --all"
            )
        return _from_store(args)
    if args.pid or args.all:
        raise UsageError("numabind check: --job checks a whole job; it takes no --pid/--all")
    job = args.job or os.environ.get(JOB_VARIABLES["job"], "")
    if not job:
        raise UsageError(
            "numabind check --job: no job id given and SLURM_JOB_ID is not set; give --job JOBID"
        )
    if not (job.isascii() and re.fullmatch(r"\d{1,10}(_\d{1,10})?", job)):
        raise UsageError(f"numabind check --job: {_sysfs.short(job)} is not a Slurm job id")
    collector = _collector_for(args)
    started = time.monotonic()
    budget = _job.Budget(started + args.deadline)
    try:
        info = job_nodes(job, os.environ, timeout=min(args.deadline, 20))
        left = max(args.deadline - (time.monotonic() - started), 1.0)
        nodes = list(info.nodes)
        answered, notes = collect_slurm(job, nodes, left, collector, info.uid, budget)
    except (SlurmError, _job.InvalidRecord) as err:
        write_lines([f"numabind check --job: {err}"], stream=sys.stderr)
        return USAGE
    report = _job.merge(job, nodes, answered, tuple(notes), budget=budget)
    _write_report(args, report)
    return _job.exit_status(report)
