"""``numabind check --job``: every rank of a Slurm job, on every node, in one report.

The collector is ``numabind check --all --job-id J``: run on a node, it checks the ranks of
job J started there (by ``SLURM_JOB_ID`` and ``SLURMD_NODENAME`` in each rank's initial
environment, so that another job, or another simulated node sharing this PID namespace,
is never counted) and not of its own step, reading /proc and sysfs only, and prints one
node record (numabind._job.SCHEMA).  ``check --job`` runs that collector once per node of
the job in one ``srun --overlap`` step (beside a busy step: no CPU of the job is needed),
stops at ``--deadline``, and merges: a node with no record is a row that says why.  No
daemon, no SSH: Slurm's own launch, and the same interpreter path on every node.
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

from .. import _job, _sysfs
from .._inspect import COLLECTOR, job_filter, node_record
from .._model import JOB_VARIABLES
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

    from .._inspect import CheckReport

STOP_SECONDS = 2.0  # of --deadline, kept for stopping srun and its step
OUTPUT_CAP = 256 << 20  # bytes read from srun at most (1,000 nodes x 8 ranks is ~10 MiB)


# --- the collector ---------------------------------------------------------------------------


def _from_store(args: argparse.Namespace) -> int:
    """``check --job --store HOST:PORT``: the records a torch.distributed job posted, read
    through numabind's own bounded client of the store (no torch needed)."""
    from .. import _report
    from .._errors import UsageError

    host, _, port = args.store.rpartition(":")
    if not host or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise UsageError(f"numabind check --store: {_sysfs.short(args.store)!r} is not HOST:PORT")
    started = time.monotonic()
    said = f"numabind check --job --store {_sysfs.short(args.store)}"
    wait = min(args.deadline, 60.0)
    why = unreachable(host, int(port), min(wait, 10.0))
    if why is not None:
        write_lines([f"{said}: cannot reach the store ({why})"], stream=sys.stderr)
        return UNREACHABLE
    from .._store import StoreClient, StoreError

    try:
        store = StoreClient(host, int(port), started + wait, _job.RECORD_BYTES)
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
    left = max(args.deadline - (time.monotonic() - started), 1.0)
    store.deadline = time.monotonic() + left
    try:
        report = _report.read_report(store, prefix, int(m.group(3)), None, store.deadline)
    finally:
        store.close()
    if args.json:
        write_json(report.to_dict())
    else:
        write_lines(_job.report_lines(report))
    return _job.exit_status(report)


def _collector(args: argparse.Namespace) -> int:
    from ._check import run_check

    def emit(report: CheckReport) -> None:
        write_json_line(node_record(report, args.job_id))

    return run_check(args, keep=job_filter(args.job_id, os.environ), emit=emit)


# --- Slurm: which nodes, and one collector on each ---------------------------------------------


class SlurmError(Exception):
    """Slurm could not tell or run what was asked (one line for the user)."""


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed here: check --job needs Slurm") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv[:3])} did not answer in {timeout:.0f} s") from None


def job_nodes(job: str, environ: Mapping[str, str], timeout: float = 20) -> list[str]:
    """The job's nodes: those ``scontrol`` lists now, and those it started on (this
    shell's ``SLURM_JOB_NODELIST`` when it runs inside the job): a node that failed
    drops out of Slurm's list but is still a node of the job, to be reported."""
    p = _run(["scontrol", "show", "job", "--oneliner", job], timeout)
    if p.returncode != 0:
        said = (p.stderr or p.stdout).strip().splitlines()
        why = _sysfs.clean_line(said[-1], 300) if said else f"exit status {p.returncode}"
        raise SlurmError(f"no job {job} ({why})")
    text = p.stdout
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
    return names


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


def collect_slurm(
    job: str, nodes: list[str], deadline: float, python: str = sys.executable
) -> tuple[dict[str, _job.NodeRow], list[str]]:
    """Run the collector on ``nodes`` in one ``srun --overlap`` step; the rows of the nodes
    that answered (or whose launch failed, with Slurm's reason) and notes."""
    srun = shutil.which("srun")
    if srun is None:
        raise SlurmError("srun is not installed here: check --job needs Slurm")
    budget = max(deadline - STOP_SECONDS, 1.0)
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
        "--job-name=numabind-check",
        python,
        "-m",
        "numabind",
        "check",
        "--all",
        "--job-id",
        job,
        "--deadline",
        f"{budget:.0f}",
    ]
    # the caller's own step layout (inside an allocation) would contradict the flags above
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAYOUT_VARIABLES)}
    env["NUMABIND"] = "off"  # the collector itself is never bound,
    env[COLLECTOR] = "1"  # nor reported, by itself or by a later collector
    env.pop("PYTHONINSPECT", None)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    timed_out = False
    try:
        out, err = proc.communicate(timeout=max(deadline - STOP_SECONDS, 0.5))
    except subprocess.TimeoutExpired:
        timed_out = True
        _stop(proc)
        out, err = proc.communicate()
    per_task: dict[str, list[bytes]] = {}
    for raw in out[:OUTPUT_CAP].splitlines():
        label = _LABEL.match(raw.decode("utf-8", "replace"))
        if label is not None:
            per_task.setdefault(label.group(1), []).append(label.group(2).encode())
    rows: dict[str, _job.NodeRow] = {}
    for chunks in per_task.values():
        # srun cuts a long line into labelled pieces: the collector writes one line
        row = _job.parse_node(b"".join(chunks), job=job)
        if row.state == "answered" and row.host not in nodes:
            continue  # a record for a node not asked for is not evidence of anything
        if row.host in rows and rows[row.host].state == "answered":
            continue
        rows[row.host] = row
    notes: list[str] = []
    errors = err[:OUTPUT_CAP].decode("utf-8", "replace").splitlines()[:200]
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
    return rows, notes


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


def run_job(args: argparse.Namespace) -> int:
    """``check --job`` (the report) and ``check --all --job-id`` (the collector)."""
    from .._errors import UsageError

    if args.job_id is not None:
        if args.job is not None or args.pid or not args.all:
            raise UsageError("numabind check: --job-id selects among --all; give --all too")
        return _collector(args)
    if args.pid or args.all:
        raise UsageError("numabind check: --job checks a whole job; it takes no --pid/--all")
    if args.store is not None:
        return _from_store(args)
    job = args.job or os.environ.get(JOB_VARIABLES["job"], "")
    if not job:
        raise UsageError(
            "numabind check --job: no job id given and SLURM_JOB_ID is not set; give --job JOBID"
        )
    if not (job.isascii() and re.fullmatch(r"\d{1,10}(_\d{1,10})?", job)):
        raise UsageError(f"numabind check --job: {_sysfs.short(job)!r} is not a Slurm job id")
    python = args.python or sys.executable
    if not os.path.isabs(python) or len(python) > 4096 or "\0" in python:
        raise UsageError(
            f"numabind check --job: --python {_sysfs.short(python)} is not an absolute path "
            "(the nodes' interpreter: they do not share this shell's PATH)"
        )
    started = time.monotonic()
    try:
        nodes = job_nodes(job, os.environ, timeout=min(args.deadline, 20))
        left = max(args.deadline - (time.monotonic() - started), 1.0)
        answered, notes = collect_slurm(job, nodes, left, python)
    except (SlurmError, _job.InvalidRecord) as err:
        write_lines([f"numabind check --job: {err}"], stream=sys.stderr)
        return USAGE
    report = _job.merge(job, nodes, answered, tuple(notes))
    if args.json:
        write_json(report.to_dict())
    else:
        write_lines(_job.report_lines(report))
    return _job.exit_status(report)
