"""Safe on a shared machine, round three (issue 32): root never runs another user's code,
and a job report can be neither forged nor blown up.

Each attack that worked on 0.3.0 is played here for real, in the unit stage wherever the
real thing can be built in-process: an unprivileged uid made by the test (``setpriv``),
packages and ``json.py`` planted where the collector starts, a fake ``srun`` that runs it
from a directory the job's owner controls, a venv whose ``.pth`` writes a marker,
processes of another uid claiming a job, oversized, nested and lying records through a
fake store and a fake Ray dashboard, a rank listing 16 buffers over a 30 MiB numa_maps.
What each costs is measured in a child process (time and peak memory) and printed for
the record (``-s``); the assertions are on what is read and what runs, never on time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _numabind_base import MODULES
from support import StandInStore, clean_env, started

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
ATTACKER = 43213
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="plays another uid (root only)"
)


# A child's own peak resident memory, in MiB, on stderr: VmHWM belongs to its address
# space (ru_maxrss would carry the forking pytest's over the exec).
PEAK = (
    "import sys\n"
    "_hwm = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
    "sys.stderr.write('PEAK %d\\n' % (int(_hwm) >> 10))"
)


def measured(argv: list[str], **kw: object) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run ``argv`` (whose code ends with :data:`PEAK`) and return it with its wall time
    and its peak resident memory in MiB."""
    began = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]
    took = time.monotonic() - began
    return p, took, int(p.stderr.rsplit("PEAK ", 1)[1].split()[0])


@pytest.fixture(scope="module")
def readable_src() -> Iterator[Path]:
    """numabind's sources copied where any uid can read them (the checkout may be in a
    folder others cannot enter)."""
    d = Path(tempfile.mkdtemp(prefix="numabind-src-", dir="/var/tmp"))
    d.chmod(0o755)
    shutil.copytree(SRC / "numabind", d / "numabind", ignore=shutil.ignore_patterns("__pycache__"))
    for start in MODULES:  # the start modules it ships
        shutil.copy(SRC / f"{start}.py", d)
    for path in d.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


# --- attack 9: listed host buffers multiplied the cost of checking one process -------------------

BUFFERS_RANK = r"""
import ctypes, os, sys
from numabind._kernel import start_time
from numabind._registry import Entry, register
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
for i in range(int(sys.argv[2])):  # PROT_READ, MAP_PRIVATE: one mapping each
    addr = libc.mmap(None, 4096, 1, 2, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
big = bytearray(8 << 20)
big[::4096] = b"x" * len(big[::4096])
# 16 buffers, each listed over the whole address space: every line of numa_maps is theirs
spans = tuple((4096 * (i + 1), (1 << 47) - 4096 * (i + 1), (0,), "bind") for i in range(16))
entry = Entry(
    pid=os.getpid(), start=start_time(os.getpid()), local_rank=0, cpus=frozenset({0}),
    memory_policy="none", buffers=spans,
)
where, why = register(entry, {"NUMABIND_REGISTRY": sys.argv[3]})
assert where, why
print(os.getpid(), flush=True)
sys.stdin.read()
"""

COUNT_OPENS = r"""
import json, runpy, sys
pid = sys.argv[1]
opened = {}
def audit(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].startswith(f"/proc/{pid}/"):
        opened[args[0]] = opened.get(args[0], 0) + 1
sys.addaudithook(audit)
sys.argv = ["numabind", "check", "--pid", pid, "--json"]
try:
    runpy.run_module("numabind", run_name="__main__")
except SystemExit:
    pass
sys.stderr.write("OPENED " + json.dumps(opened) + "\n")
"""
COUNT_OPENS += PEAK


@pytest.fixture(scope="module")
def buffers_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """A rank whose numa_maps is about 30 MiB (50,000 file mappings with long paths) and
    whose registry entry lists 16 host buffers, each over its whole address space."""
    d = tmp_path_factory.mktemp("maps")
    registry = d / "registry"
    registry.mkdir()
    deep = d
    while len(str(deep)) < 500:
        deep = deep / ("d" * 100)
    deep = deep / ("e" * (620 - len(str(deep))))  # each numa_maps line ~640 bytes
    deep.mkdir(parents=True)
    target = deep / "f"
    target.write_bytes(b"\0" * 4096)
    p = subprocess.Popen(
        [sys.executable, "-c", BUFFERS_RANK, str(target), "50000", str(registry)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    assert p.stdout is not None
    pid = int(p.stdout.readline())
    yield pid, str(registry)
    assert p.stdin is not None
    p.stdin.close()
    p.wait(timeout=60)


def test_sixteen_buffers_read_numa_maps_once(buffers_rank: tuple[int, str]) -> None:
    """0.3.0 rescanned maps and numa_maps for every listed buffer (16 buffers: 9-22x
    slower, 28-36 s).  Each /proc file of the process is now opened a fixed number of
    times, whatever its entry lists, and every buffer is still measured."""
    pid, registry = buffers_rank
    size = sum(len(line) for line in open(f"/proc/{pid}/numa_maps", "rb"))  # noqa: SIM115
    assert 29 << 20 < size < 32 << 20, f"numa_maps is {size >> 20} MiB"
    env = clean_env(NUMABIND_REGISTRY=registry)
    p, took, peak = measured([sys.executable, "-c", COUNT_OPENS, str(pid)], env=env)
    print(f"\ncheck --pid, 16 buffers over a {size >> 20} MiB numa_maps: {took:.1f} s, "
          f"peak {peak} MiB")  # fmt: skip
    opened = json.loads(p.stderr.rsplit("OPENED ", 1)[1].splitlines()[0])
    assert opened[f"/proc/{pid}/numa_maps"] == 1 and opened[f"/proc/{pid}/maps"] == 1, opened
    assert max(opened.values()) <= 4, opened  # status: the registry, the uid, the cpuset
    (proc,) = json.loads(p.stdout)["processes"]
    assert proc["plan_source"] == "registry" and len(proc["host_buffers"]) == 16
    assert all(b["pages"] for b in proc["host_buffers"]), "each buffer measured"


def test_checking_one_process_stops_at_the_deadline(buffers_rank: tuple[int, str]) -> None:
    """The deadline was checked only between processes: a process with a huge numa_maps
    held check --all past it.  Reading its memory now stops there too, and says so."""
    pid, registry = buffers_rank
    from numabind import _kernel

    view = _kernel.memory_view(pid, ((4096, 1 << 40),), time.monotonic() - 1)
    assert view.late and not view.regions
    code = (
        "import sys, time; from numabind.check import _inspect; from numabind._topology import "
        "Machine; m = Machine.from_root('/'); t = time.monotonic(); "
        "r = _inspect.check([int(sys.argv[1])], m, deadline=t + 0.05); "
        "print(time.monotonic() - t); print(r.processes[0].notes if r.processes else r.skipped)"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(pid)],
        capture_output=True,
        text=True,
        env=clean_env(NUMABIND_REGISTRY=registry),
        timeout=120,
    )
    took, notes = p.stdout.splitlines()[:2]
    print(f"\ncheck with a 0.05 s deadline: {float(took):.2f} s")
    assert "read only in part: the deadline passed" in notes, p.stdout + p.stderr


# --- attacks 1 and 4: what the collector runs, and whose processes it counts ---------------------

FAKE_SRUN = r"""#!{python}
# srun as root runs it, with slurmstepd's worst case: it could not enter the caller's
# directory (a login-node-only folder, NFS with root_squash) and fell back to a directory
# the job's owner controls (its /tmp under job_container/tmpfs), whatever --chdir says.
import json, os, subprocess, sys
args = sys.argv[1:]
with open(os.environ["FAKE_SRUN_LOG"], "w") as f:
    json.dump({{"argv": args, "cwd": os.getcwd()}}, f)
i = next(i for i, a in enumerate(args) if not a.startswith("--"))
job = next(a.split("=", 1)[1] for a in args if a.startswith("--jobid="))
fallback = os.environ["FAKE_SRUN_FALLBACK"]
os.chdir(fallback)
env = dict(os.environ, SLURMD_NODENAME="nodea", SLURM_JOB_ID=job, SLURM_STEP_ID="9")
# and the node's environment names the owner's directory too (a TaskProlog, /etc/environment)
env.update(PYTHONPATH=fallback, PYTHONUSERBASE=fallback, PYTHONSTARTUP=fallback + "/json.py")
p = subprocess.run(args[i:], env=env, capture_output=True, text=True)
for line in p.stdout.splitlines():
    print("0: " + line)
for line in p.stderr.splitlines():
    print("0: " + line, file=sys.stderr)
"""

FAKE_SCONTROL = """#!/bin/sh
case "$1" in
    show) echo "JobId=77 JobName=train UserId=owner({uid}) JobState=RUNNING NodeList=nodea" ;;
    listpids) [ -s "$FAKE_LISTPIDS" ] || exit 1
        echo "PID      JOBID    STEPID   LOCALID GLOBALID"; cat "$FAKE_LISTPIDS" ;;
    *) exit 1 ;;
esac
"""

PLANT = "import os; open(os.path.join({marks!r}, '{name}-' + str(os.getuid())), 'w').close()\n"


def plant(where: Path, marks: Path, owner: int) -> None:
    """A numabind package, json.py and the modules a collector imports early, each leaving
    a marker (named with the uid it ran as) when imported; owned by ``owner``."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "numabind").mkdir(exist_ok=True)
    (where / "numabind" / "__init__.py").write_text(PLANT.format(marks=str(marks), name="numabind"))
    for mod in ("json", "socket", "sysconfig", "sitecustomize", "usercustomize", "selectors"):
        (where / f"{mod}.py").write_text(PLANT.format(marks=str(marks), name=mod))
    for path in [where, *where.rglob("*")]:
        os.chown(path, owner, owner)


def as_uid(uid: int, *argv: str) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]


@pytest.fixture
def fake_slurm(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """A node 'nodea' where job 77 of uid ATTACKER runs one rank (a real process of that
    uid), where uid ATTACKER + 1 started 1,025 processes claiming to be ranks of job 77,
    and where srun falls back to ATTACKER's planted /tmp; root's own directory has its
    plants too.  srun and scontrol are fakes on PATH; markers say what ran, as whom."""
    top = Path(tempfile.mkdtemp(prefix="numabind-slurm-", dir="/tmp"))
    top.chmod(0o755)
    marks = top / "marks"
    marks.mkdir()
    marks.chmod(0o1777)
    fallback, cwd = top / "job-tmp", top / "root-cwd"
    plant(fallback, marks, ATTACKER)
    plant(cwd, marks, ATTACKER)  # root in a user's directory (cd ~alice)
    bin_ = top / "bin"
    bin_.mkdir()
    (bin_ / "srun").write_text(FAKE_SRUN.format(python=sys.executable))
    (bin_ / "scontrol").write_text(FAKE_SCONTROL.format(uid=ATTACKER))
    for tool in ("srun", "scontrol"):
        (bin_ / tool).chmod(0o755)
    claim = dict(SLURM_JOB_ID="77", SLURM_STEP_ID="0", SLURMD_NODENAME="nodea", SLURM_LOCALID="0")
    rank = subprocess.Popen(as_uid(ATTACKER, "sleep", "300"), env=clean_env(**claim))
    spam = subprocess.Popen(
        as_uid(ATTACKER + 1, "sh", "-c", "for i in $(seq 1025); do sleep 300 & done; wait"),
        env=clean_env(**claim),
    )
    for _ in range(300):
        out = subprocess.run(["pgrep", "-c", "-u", str(ATTACKER + 1), "sleep"],
                             capture_output=True, text=True).stdout  # fmt: skip
        if out.strip() == "1025":
            break
        time.sleep(0.1)
    try:
        yield {"top": top, "marks": marks, "cwd": cwd, "bin": bin_, "rank": Path(str(rank.pid))}
    finally:
        for p in (rank, spam):
            p.kill()
            p.wait()
        subprocess.run(["pkill", "-KILL", "-u", str(ATTACKER + 1), "-x", "sleep"])
        shutil.rmtree(top, ignore_errors=True)


def check_job_here(
    fake: dict[str, Path], *more: str, **env: str
) -> subprocess.CompletedProcess[str]:
    path = f"{fake['bin']}{os.pathsep}{os.environ['PATH']}"
    full = clean_env(
        PATH=path,
        FAKE_SRUN_LOG=str(fake["top"] / "srun.json"),
        FAKE_SRUN_FALLBACK=str(fake["top"] / "job-tmp"),
        FAKE_LISTPIDS=str(fake["top"] / "listpids"),
        **env,
    )
    # the installed command, as an administrator runs it (python -m would import the
    # caller's own directory: that is the caller's choice, not the collector's)
    command = str(Path(sys.executable).parent / "numabind")
    return subprocess.run(
        [command, "check", "--job", "77", "--json", *more],
        capture_output=True,
        text=True,
        env=full,
        cwd=str(fake["cwd"]),
        timeout=300,
    )


@needs_root
def test_the_collector_runs_no_planted_code_and_counts_only_the_jobs_processes(
    fake_slurm: dict[str, Path],
) -> None:
    """Attack 1: 0.3.0 started the collector as ``python -m numabind`` in root's directory,
    and srun falls back to the job owner's /tmp: a planted numabind/ or json.py ran as
    root on every node.  Attack 4: 1,025 processes of another uid claiming the job made
    the node record INVALID and hid the real rank.  Now the step starts in /, the
    interpreter isolated, numabind from its installation only; membership is the job
    owner's uid here (no Slurm tracking, no job cgroup), so the spam is not counted."""
    began = time.monotonic()
    p = check_job_here(fake_slurm)
    print(f"\ncheck --job beside 1,025 processes of another uid claiming the job: "
          f"{time.monotonic() - began:.1f} s")  # fmt: skip
    assert sorted(os.listdir(fake_slurm["marks"])) == [], "planted code ran"
    assert p.returncode in (0, 1, 3), p.stderr
    report = json.loads(p.stdout)
    (node,) = report["nodes"]
    assert node["state"] == "answered", node
    assert [r["pid"] for r in node["ranks"]] == [int(str(fake_slurm["rank"]))], node["ranks"]
    assert any(f"the job owner's uid {ATTACKER}" in n for n in node["notes"]), node["notes"]
    launched = json.loads((fake_slurm["top"] / "srun.json").read_text())
    argv = launched["argv"]
    assert "--chdir=/" in argv and launched["cwd"] == "/"
    at = argv.index("-c")
    assert argv[:at] and argv[at - 1] == "/bin/sh" and argv[at + 2] == "numabind"
    python = argv[at + 3]  # the node's sh checks it, then runs it
    assert os.path.dirname(python) == os.path.dirname(sys.executable), python
    python_args = argv[at + 4 : at + 8]
    assert python_args == ["-I", "-S", "-B", "-c"], python_args
    assert argv[-2:] == ["--job-uid", str(ATTACKER)]


@needs_root
def test_slurm_process_tracking_decides_membership(fake_slurm: dict[str, Path]) -> None:
    """Where Slurm lists the job's processes (``scontrol listpids``), that list is the
    job: a process the list does not name is not a rank, whatever its uid or claims."""
    rank = int(str(fake_slurm["rank"]))
    (fake_slurm["top"] / "listpids").write_text(f"{rank} 77 0 0 0\n")
    p = check_job_here(fake_slurm)
    (node,) = json.loads(p.stdout)["nodes"]
    assert [r["pid"] for r in node["ranks"]] == [rank]
    assert any("Slurm's process tracking (scontrol listpids)" in n for n in node["notes"])
    (fake_slurm["top"] / "listpids").write_text("1 77 0 0 0\n")  # init: not a rank
    (node,) = json.loads(check_job_here(fake_slurm).stdout)["nodes"]
    assert node["ranks"] == [], "the real rank is not in Slurm's list: not counted"


def _job_cgroup(job: str) -> tuple[Path, Path]:
    """A Slurm-like job cgroup (``slurm_.../uid_0/job_J/step_0``) in the first writable
    hierarchy: (the step's directory, the top one to remove)."""
    tag = f"slurm_numabindtest{os.getpid()}"
    for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
        top = Path(base, tag)
        step = top / "uid_0" / f"job_{job}" / "step_0"
        try:
            step.mkdir(parents=True)
            (step / "cgroup.procs").write_text(f"{os.getpid()}\n")
            (Path(base) / "cgroup.procs").write_text(f"{os.getpid()}\n")
        except OSError:
            for d in (step, step.parent, step.parent.parent, top):
                try:
                    d.rmdir()
                except OSError:
                    pass
            continue
        return step, top
    raise AssertionError("no cgroup hierarchy here lets root make a child and move a process")


@needs_root
def test_the_job_cgroup_decides_membership() -> None:
    """Where the kernel keeps the job's processes in its cgroup, only those are ranks of
    it: a process of the same uid, claiming the same job, outside the cgroup is not."""
    claim = clean_env(
        SLURM_JOB_ID="78", SLURM_STEP_ID="0", SLURMD_NODENAME="nodea", SLURM_LOCALID="0"
    )
    inside = started(["sleep", "120"], env=claim)
    outside = started(["sleep", "120"], env=claim)
    step, top = _job_cgroup("78")
    try:
        (step / "cgroup.procs").write_text(f"{inside.pid}\n")
        p = subprocess.run(
            [sys.executable, "-m", "numabind", "check", "--all", "--job-id", "78",
             "--job-uid", "0", "--deadline", "60"],
            capture_output=True, text=True, timeout=120,
            env=clean_env(SLURMD_NODENAME="nodea", PATH="/usr/bin:/bin"),
        )  # fmt: skip
    finally:
        for child in (inside, outside):
            child.kill()
            child.wait()
        for d in (step, step.parent, step.parent.parent, top):
            d.rmdir()
    record = json.loads(p.stdout)
    assert [r["pid"] for r in record["ranks"]] == [inside.pid], (record, p.stderr)
    assert "the kernel's cgroup of the job (job_78)" in record["notes"][0]


def test_cgroup_paths_name_the_slurm_job_linearly() -> None:
    from numabind.check._inspect import slurm_jobs

    assert slurm_jobs("4:pids:/slurm/uid_1000/job_42/step_0/task_1\n") == {"42"}
    assert slurm_jobs("0::/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0") == {"7"}
    assert slurm_jobs("0::/slurm_nodea/uid_0/job_9/step_extern") == {"9"}
    assert slurm_jobs("0::/user.slice/job_42/x") == set(), "not under Slurm's own cgroup"
    assert slurm_jobs("0::/slurm/job_x1") == set()
    began = time.monotonic()
    assert slurm_jobs("0::" + "/slurm" * 10_000 + "/a" * 20_000) == set()
    assert time.monotonic() - began < 5, "a path of 30,000 components, no backtracking"


def test_the_collector_caps_members_and_says_how_many_were_left(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Caps apply to the job's members: an over-full node reports the first ones it can
    and counts the rest."""
    import argparse

    from numabind.check import _job
    from numabind.check._inspect import Membership
    from numabind.cli import _job as cli_job

    claim = dict(SLURM_JOB_ID="79", SLURM_STEP_ID="0", SLURMD_NODENAME="nodea")
    ranks = [
        started(["sleep", "120"], env=clean_env(**claim, SLURM_LOCALID=str(i))) for i in range(3)
    ]
    try:
        members = Membership(pids=frozenset(r.pid for r in ranks), source="a test's list")
        monkeypatch.setattr("numabind.check._inspect.job_members", lambda *a, **k: members)
        monkeypatch.setattr(_job, "MAX_RANKS", 2)
        monkeypatch.setenv("SLURMD_NODENAME", "nodea")
        args = argparse.Namespace(
            job_id="79", job_uid=None, deadline=60.0, pid=None, all=True, json=False,
            verbose=False, sysroot=None, registry=None,
        )  # fmt: skip
        cli_job._collector(args)
    finally:
        for r in ranks:
            r.kill()
            r.wait()
    record = json.loads(capsys.readouterr().out)
    assert len(record["ranks"]) == 2, record
    assert "1 more rank(s) of the job here not checked (at most 2 per node)" in record["notes"]


# --- attack 3: an interpreter, site directory or package another user can write -----------------

MARKER_PTH = "import os; open({marks!r} + '/pth-' + str(os.getuid()), 'w').close()\n"


@pytest.fixture
def their_venv(readable_src: Path) -> Iterator[dict[str, Path]]:
    """A venv that uid ATTACKER owns, with numabind (a readable copy) and a ``.pth`` file
    that leaves a marker named with the uid that started the interpreter."""
    top = Path(tempfile.mkdtemp(prefix="numabind-venv-", dir="/tmp"))
    top.chmod(0o755)
    marks = top / "marks"
    marks.mkdir()
    marks.chmod(0o1777)
    venv = top / "venv"
    base = runnable_python(ATTACKER)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "numabind-src.pth").write_text(f"{readable_src}\n")
    (site / "zz-marker.pth").write_text(MARKER_PTH.format(marks=str(marks)))
    for path in [venv, *venv.rglob("*")]:
        os.lchown(path, ATTACKER, ATTACKER)
    try:
        yield {"top": top, "marks": marks, "python": venv / "bin" / "python", "site": site}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def runnable_python(uid: int) -> str:
    """An interpreter ``uid`` can execute itself (checked as the probe is run: exec as
    that uid, no wrapper), for a venv of theirs."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            ok = subprocess.run(
                [candidate, "-c", "import sys, venv; assert sys.version_info >= (3, 10)"],
                user=uid, group=uid, extra_groups=[], capture_output=True, cwd="/", timeout=60,
            ).returncode == 0  # fmt: skip
        except OSError:
            ok = False
        if ok:
            return candidate
    raise AssertionError(f"no Python that uid {uid} can execute")


def _doctor(python: Path) -> dict[str, tuple[str, str]]:
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "doctor", "--python", str(python), "--json"],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=180,
    )
    assert "Traceback" not in p.stderr, p.stderr
    return {f["check"]: (f["status"], f["detail"]) for f in json.loads(p.stdout)["findings"]}


@needs_root
def test_doctor_starts_another_users_venv_only_as_that_user(their_venv: dict[str, Path]) -> None:
    """0.3.0's doctor started the interpreter as root: its .pth lines and sitecustomize
    ran as root, and it did not say it ran anything.  It now starts it as its owner and
    says so; one writable by group or others is not started at all."""
    found = _doctor(their_venv["python"])
    assert os.listdir(their_venv["marks"]) == [f"pth-{ATTACKER}"], found
    assert (
        found["python"][0] == "info"
        and f"started as uid {ATTACKER}, its owner" in found["python"][1]
    ), found["python"]
    assert found["numabind"][0] in ("ok", "warn"), found["numabind"]
    os.remove(their_venv["marks"] / f"pth-{ATTACKER}")
    their_venv["site"].chmod(0o777)
    found = _doctor(their_venv["python"])
    assert os.listdir(their_venv["marks"]) == [], "not started at all"
    status, detail = found["python"]
    assert status == "fail" and "not started" in detail and "writable by group or others" in detail


@needs_root
def test_check_job_never_starts_another_users_interpreter_or_numabind(
    their_venv: dict[str, Path], readable_src: Path, tmp_path: Path
) -> None:
    """Here (the interpreter exists on this machine), on the node (its /bin/sh checks it
    before it runs), and inside the interpreter (numabind's package itself): each refuses
    with one line, and nothing of the other user's runs."""
    from numabind.check import _isolated, _job

    python = str(their_venv["python"])
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "check", "--job", "77", "--python", python],
        capture_output=True, text=True, env=clean_env(), timeout=120, cwd="/",
    )  # fmt: skip
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"is owned by uid {ATTACKER}" in p.stderr and "not run on the nodes" in p.stderr
    # on a node: the sh check refuses before the interpreter is executed
    node = subprocess.run(
        ["/bin/sh", "-c", _isolated.NODE_CHECK, "numabind", python, "-c", "pass"],
        capture_output=True, text=True, timeout=60, env=clean_env(SLURMD_NODENAME="nodeq"),
    )  # fmt: skip
    row = _job.parse_node(node.stdout, "nodeq")
    assert row.state == "unreachable" and f"owned by uid {ATTACKER}" in row.reason, node
    # numabind itself, in a folder of theirs, under a root-owned interpreter
    theirs = tmp_path / "theirs"
    shutil.copytree(readable_src, theirs)
    (theirs / "numabind" / "__init__.py").write_text(
        PLANT.format(marks=str(their_venv["marks"]), name="numabind")
    )
    for path in [theirs, *theirs.rglob("*")]:
        os.chown(path, ATTACKER, ATTACKER)
    argv = _isolated.boot_argv(sys.executable, ["--version"], str(theirs), "collector")
    boot = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    row = _job.parse_node(boot.stdout)
    assert row.state == "unreachable" and f"is owned by uid {ATTACKER}" in row.reason, boot
    assert os.listdir(their_venv["marks"]) == [], "nothing of theirs ran"


# --- attacks 5 to 8: records that lie, nest or ask for gigabytes; a store that breaks ------------


def store_rank(r: int, host: str = "hosta", **over: object) -> dict[str, object]:
    d: dict[str, object] = {
        "pid": 1000 + r,
        "rank": r,
        "local_rank": 0,
        "status": "ok",
        "plan": {"cpus": "0-1", "bound": True},
        "threads": [{"cpus": "0-1", "tids": [1000 + r], "names": ["python"]}],
        "memory_policy": "default",
    }
    d.update(over)
    return d


def store_record(*ranks: dict[str, object], host: str = "hosta") -> bytes:
    record = {"schema": "numabind-node/1", "host": host, "facts": {}, "ranks": list(ranks)}
    return json.dumps(record, separators=(",", ":")).encode()


def gigabyte_record() -> bytes:
    """Issue 32's record: 2 MB, 1,024 ranks of 64 thread groups on 16,384 CPUs each."""
    group = {"cpus": "0-16383", "tids": [5], "count": 1}
    rank = store_rank(0, threads=[group] * 64, plan={"cpus": "0-16383", "bound": True})
    return store_record(*([rank] * 1024))


def peak_of(code: str, *args: str) -> tuple[str, float, int]:
    """``code`` run in a fresh interpreter: its output, wall time and peak memory (MiB)."""
    wrapped = f"{code}\n{PEAK}"
    began = time.monotonic()
    p = subprocess.run([sys.executable, "-c", wrapped, *args], capture_output=True, text=True,
                       timeout=600, env=clean_env())  # fmt: skip
    took = time.monotonic() - began
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout, took, int(p.stderr.rsplit("PEAK ", 1)[1])


def test_a_record_that_asked_for_96_gb_stays_its_size(tmp_path: Path) -> None:
    """Attack 5: each "0-16383" became a set of 16,384 ints before the record was known to
    hold one rank; the 2 MB record asked for ~96 GB.  As a node record it now parses in
    the size of its text; as a store record it is refused from its length; a store record
    of two ranks is refused before either is parsed."""
    from numabind.check import _job

    path = tmp_path / "big.json"
    path.write_bytes(gigabyte_record())
    out, took, peak = peak_of(
        "import sys; from numabind.check import _job\n"
        "row = _job.parse_node(open(sys.argv[1], 'rb').read())\n"
        "print(row.state, len(row.ranks), row.ranks[0].cpus.size, row.ranks[0].status)",
        str(path),
    )
    print(f"\n2 MB record of 1,024 x 64 groups on 16,384 CPUs: {took:.1f} s, peak {peak} MiB")
    assert out.split() == ["answered", "1024", "16384", "ok"], out
    assert peak < 400, f"{peak} MiB"
    row = _job.parse_node(path.read_bytes(), max_ranks=1)
    assert row.state == "invalid" and "record over 96 KiB" in row.reason
    two = store_record(store_rank(0), store_rank(1))
    row = _job.parse_node(two, max_ranks=1)
    assert row.state == "invalid" and "a store record holds one rank, this one 2" in row.reason
    listed = store_record(*[store_rank(0)] * 2000)
    assert len(listed) < _job.STORE_RECORD_BYTES * 4
    many = _job.parse_node(store_record(store_rank(0), *[{}] * 30), max_ranks=1)
    assert many.state == "invalid" and "this one 31" in many.reason, "refused before parsing"


def test_a_report_stays_within_its_budget_however_many_records(tmp_path: Path) -> None:
    """Per report: 256 MiB of records, 512 MiB of rows, 100,000 host names in all layouts
    together.  A budget the test makes small runs out, and what is left is one note."""
    from numabind.check import _job

    budget = _job.Budget(nbytes=3 << 20)
    rows = [_job.parse_node(gigabyte_record(), budget=budget) for _ in range(3)]
    assert [r.state for r in rows] == ["answered", "invalid", "invalid"]
    assert "not read: the report's 3 MiB of records are spent" in rows[2].reason
    budget = _job.Budget(memory=1 << 20)
    row = _job.parse_node(gigabyte_record(), budget=budget)
    assert 0 < len(row.ranks) < 1024 and "rank(s) not kept" in row.notes[-1], row.notes


def test_a_thousand_fake_step_layouts_cost_one_host_budget(tmp_path: Path) -> None:
    """Attack 6: each distinct step a rank named expanded its SLURM_STEP_NODELIST (up to
    100,000 hosts; 40 steps took 909 MiB), with no deadline.  Now every layout comes out
    of one budget of host names and the merge ends by the deadline."""
    ranks = [
        store_rank(
            i, step=str(i), job="1", step_nodes=f"n{i}x[00000-99999]", step_tasks="1(x100000)"
        )
        for i in range(1024)
    ]
    path = tmp_path / "steps.json"
    path.write_bytes(store_record(*ranks, host="gpu01"))
    out, took, peak = peak_of(
        "import sys, time; from numabind.check import _job\n"
        "b = _job.Budget(time.monotonic() + 60)\n"
        "row = _job.parse_node(open(sys.argv[1], 'rb').read(), budget=b)\n"
        "r = _job.merge('1', ['gpu01'], {'gpu01': row}, budget=b)\n"
        "print(r.notes[-1])",
        str(path),
    )
    print(f"\n1,024 step layouts of 100,000 hosts each: {took:.1f} s, peak {peak} MiB")
    assert "1023 step layout(s) not read: the report's 100,000 host names" in out, out
    assert peak < 400, f"{peak} MiB"
    from numabind.check import _job

    row = _job.parse_node(path.read_bytes())
    late = _job.merge("1", ["gpu01"], {"gpu01": row}, budget=_job.Budget(time.monotonic() - 1))
    assert late.notes[-1] == "1024 step layout(s) not read: the deadline passed"


@pytest.mark.parametrize("text", ["n" + "[0]" * 10_000, "n" + "[0-1]" * 9, "[" * 5000])
def test_a_deeply_bracketed_hostlist_is_refused_not_a_recursion_error(text: str) -> None:
    """Attack 7: n[0][0]...[0] recursed until RecursionError (root got a traceback, rank 0's
    reporter lost its report).  Expansion is iterative and a name has at most 8 groups."""
    from numabind.check import _job

    with pytest.raises(_job.InvalidRecord):
        _job.expand_hostlist(text)
    assert _job.expand_hostlist("r[1-2]c[1-2]n[1-2]")[-1] == "r2c2n2"
    ranks = [store_rank(0, step_nodes=text[:4000], step_tasks="1", job="1", step="0")]
    row = _job.parse_node(store_record(*ranks, host="gpu01"))
    report = _job.merge("1", ["gpu01"], {"gpu01": row})
    assert report.summary.ranks == 1 and "\n".join(_job.report_lines(report))


def check_store_here(port: int, *more: str) -> tuple[subprocess.CompletedProcess[str], float, int]:
    code = f"import sys; from numabind.cli import main\nstatus = main(sys.argv[1:])\n{PEAK}\n"
    code += "sys.exit(status)"
    argv = [sys.executable, "-c", code, "check", "--store", f"127.0.0.1:{port}", *more]
    began = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=clean_env())
    return p, time.monotonic() - began, int(p.stderr.rsplit("PEAK ", 1)[1])


def test_a_store_that_breaks_once_is_one_line_not_a_million_rows() -> None:
    """Attack 8: numabind/latest claimed 1,048,576 ranks; after one protocol error every
    remaining rank was its own row: 124 MiB printed, 1 GB resident, 39-53 s past a
    30 s deadline.  Now the first answer that leaves the store unreadable ends the
    reading, and the rest is one line."""
    values = {"numabind/latest": b"run/0/1048576"}
    values |= {f"numabind/run/0/{r}": store_record(store_rank(r)) for r in range(3)}
    store = StandInStore(values, break_after=8)
    try:
        p, took, peak = check_store_here(store.port, "--deadline", "30")
    finally:
        store.close()
    print(f"\na store claiming 1,048,576 ranks that breaks after 8 answers: {took:.1f} s, "
          f"peak {peak} MiB, {len(p.stdout)} bytes printed")  # fmt: skip
    assert p.returncode == 3, p.stdout + p.stderr
    assert len(p.stdout) < 8192 and "NOT READ: 1048573 rank(s)" in p.stdout, p.stdout
    assert "1048573 rank(s) not read: the store stopped answering at rank 3" in p.stdout
    assert "store records are self-reported" in p.stdout
    assert peak < 200, f"{peak} MiB"


def test_a_store_claiming_a_million_ranks_ends_at_the_deadline() -> None:
    """The same claim from a store that answers every question honestly ("not posted"):
    the reading ends at --deadline, and the ranks left are counted in one line."""
    store = StandInStore({"numabind/latest": b"run/0/1048576"})
    try:
        p, took, peak = check_store_here(store.port, "--deadline", "4")
    finally:
        store.close()
    print(f"\na store claiming 1,048,576 ranks, none posted, --deadline 4: {took:.1f} s, "
          f"peak {peak} MiB, {len(p.stdout)} bytes printed")  # fmt: skip
    assert p.returncode == 3 and len(p.stdout) < 8192, p.stdout[-2000:]
    assert "rank(s) not read: the deadline passed" in p.stdout, p.stdout
    assert "NOT POSTED: rank 0, 1, 2" in p.stdout and "more (no record" in p.stdout


def test_store_usage_and_a_peer_that_is_not_a_store() -> None:
    """Issue 37, item 12: --store without --job was ignored; 'localhost' was quoted twice;
    a peer that is not a store was '(72)'."""
    import threading

    p = subprocess.run([sys.executable, "-m", "numabind", "check", "--store", "localhost"],
                       capture_output=True, text=True, env=clean_env(), timeout=60)  # fmt: skip
    assert p.returncode == 2, p.stderr
    assert p.stderr == "numabind check --store: 'localhost' is not HOST:PORT\n", "quoted once"
    import socket

    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:  # what a web server says to bytes that are not HTTP
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "numabind", "check", "--store",
             f"127.0.0.1:{server.getsockname()[1]}", "--deadline", "10"],
            capture_output=True, text=True, env=clean_env(), timeout=60,
        )  # fmt: skip
    finally:
        server.close()
    assert p.returncode == 3 and p.stderr.count("\n") == 1, p.stderr
    assert "not a c10d store: it answered 'HTTP/1.1 400 Bad Request..Conte" in p.stderr, p.stderr
    assert p.stderr.rstrip().endswith(": an HTTP server?"), p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "check", "--store", "127.0.0.1:1", "--job", "5"],
        capture_output=True, text=True, env=clean_env(), timeout=60,
    )  # fmt: skip
    assert p.returncode == 2 and "it takes no JOBID" in p.stderr


# --- attack 2: check --ray joined any cluster and unpickled what it sent -------------------------

NODE_A, NODE_B = "a" * 56, "b" * 56


class FakeDashboard:
    """Ray's dashboard as its HTTP API looks (the state API, /api/version, the job API),
    served by the test: honest, or as a hostile or broken one (``mode``).  The job it
    runs 'prints' ``log``; it records what it was asked."""

    def __init__(self, log: str = "", mode: str = "honest") -> None:
        import http.server
        import threading

        self.log, self.mode, self.asked, self.jobs = log, mode, [], {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                outer.asked.append(("GET", self.path))
                outer.answer(self, "GET")

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.asked.append(("POST", self.path, body))
                outer.answer(self, "POST", body)

            def do_DELETE(self) -> None:
                outer.asked.append(("DELETE", self.path))
                outer.send(self, 200, {"deleted": True})

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up on a drip: expected, not worth a trace

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def send(h: Any, status: int, data: Any, raw: bytes | None = None) -> None:
        body = raw if raw is not None else json.dumps(data).encode()
        h.send_response(status)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    @staticmethod
    def listing(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {"result": True, "msg": "", "data": {"result": {"total": len(rows), "result": rows}}}

    def answer(self, h: Any, method: str, body: bytes = b"") -> None:  # noqa: PLR0911
        path = h.path.split("?")[0]
        if self.mode == "huge" and path == "/api/v0/actors":
            h.send_response(200)
            h.send_header("Content-Length", str(1 << 40))
            h.end_headers()
            h.wfile.write(b"[" * 65536)
            return
        if self.mode == "drip" and path == "/api/v0/actors":
            h.send_response(200)
            h.end_headers()
            for _ in range(120):
                h.wfile.write(b" ")
                h.wfile.flush()
                time.sleep(0.5)
            return
        if self.mode == "redirect" and path == "/api/version":
            h.send_response(302)
            h.send_header("Location", "http://127.0.0.1:1/elsewhere")
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        if self.mode == "nested" and path == "/api/v0/nodes":
            return self.send(h, 200, None, b"[" * 200_000 + b"]" * 200_000)
        if self.mode == "pickle" and path == "/api/v0/tasks":
            import pickle

            return self.send(h, 200, None, pickle.dumps(["this is not JSON"]))
        if path == "/api/version":
            return self.send(h, 200, {"version": "4", "ray_version": "2.60.0"})
        if path == "/api/v0/nodes":
            nodes = [
                {"node_id": NODE_A, "node_ip": "10.0.0.1"},
                {"node_id": NODE_B, "node_ip": "10.0.0.2"},
            ]
            return self.send(h, 200, self.listing(nodes))
        if path == "/api/v0/actors":
            actor = {
                "pid": 4242,
                "node_id": NODE_A,
                "state": "ALIVE",
                "required_resources": {"GPU": 1},
            }
            return self.send(h, 200, self.listing([actor]))
        if path == "/api/v0/tasks":
            task = {"worker_pid": 4343, "node_id": NODE_B, "state": "RUNNING",
                    "required_resources": {"GPU": 0.5}}  # fmt: skip
            return self.send(h, 200, self.listing([task]))
        if path == "/api/jobs/" and method == "POST":
            ident = json.loads(body)["submission_id"]
            self.jobs[ident] = json.loads(body)
            return self.send(h, 200, {"submission_id": ident})
        if path.startswith("/api/jobs/") and path.endswith("/logs"):
            return self.send(h, 200, {"logs": self.log})
        if path.startswith("/api/jobs/") and path.endswith("/stop"):
            return self.send(h, 200, {"stopped": True})
        if path.startswith("/api/jobs/"):
            return self.send(h, 200, {"status": "SUCCEEDED", "message": "Job finished."})
        return self.send(h, 404, {"error": "no such page"})

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ray_record(host: str, pid: int) -> str:
    return store_record(store_rank(0, pid=pid), host=host).decode()


def check_ray(
    dash: FakeDashboard | int, *more: str, **env: str
) -> subprocess.CompletedProcess[str]:
    port = dash if isinstance(dash, int) else dash.port
    return subprocess.run(
        [sys.executable, "-m", "numabind", "check", "--ray", f"127.0.0.1:{port}", *more],
        capture_output=True, text=True, timeout=120, env=clean_env(**env), cwd="/",
    )  # fmt: skip


def test_check_ray_reads_the_dashboard_and_runs_nothing_of_the_cluster(tmp_path: Path) -> None:
    """0.3.0 ran ray.init(address="auto") in root's process (joining whatever cluster it
    found), ran its collector in that cluster's workers and unpickled the results.  Now
    Ray is never imported here (a 'ray' on PYTHONPATH that leaves a marker stays
    untouched), the state comes over HTTP as JSON, the checking is a job of the
    cluster's own, and its log's records are parsed as input: a record for a node that
    holds no GPU, or naming another host, or not JSON, is not evidence."""
    fake_ray = tmp_path / "fake" / "ray"
    fake_ray.mkdir(parents=True)
    (fake_ray / "__init__.py").write_text(f"open({str(tmp_path / 'IMPORTED')!r}, 'w').close()\n")
    log = "\n".join([
        "Running entrypoint for job numabind-check-...",
        "numabind-driver uid=43215 ray=2.60.0",
        f"numabind-record {NODE_A} {ray_record('10.0.0.1', 4242)}",
        f"numabind-record {NODE_B} {ray_record('10.0.0.9', 4343)}",  # names another host
        f"numabind-record {'c' * 56} {ray_record('10.0.0.3', 1)}",  # a node holding no GPU
        f"numabind-record {NODE_A} {ray_record('10.0.0.1', 1)}",  # said twice
        "\x80\x04\x95 a pickle: bytes are text here",
    ])  # fmt: skip
    dash = FakeDashboard(log)
    try:
        p = check_ray(dash, "--json", PYTHONPATH=str(tmp_path / "fake"))
    finally:
        dash.close()
    assert not (tmp_path / "IMPORTED").exists(), "ray was imported in the checking process"
    assert p.returncode == 3, p.stdout + p.stderr
    report = json.loads(p.stdout)
    rows = {n["host"]: n for n in report["nodes"]}
    assert sorted(rows) == ["10.0.0.1", "10.0.0.2"], rows
    assert [r["pid"] for r in rows["10.0.0.1"]["ranks"]] == [4242]
    assert rows["10.0.0.2"]["state"] == "invalid" and "10.0.0.9" in rows["10.0.0.2"]["reason"]
    assert any("uid=43215" in n and "the cluster's word" in n for n in report["notes"])
    (job,) = dash.jobs.values()
    assert job["entrypoint"].startswith("python -m numabind.check._raydriver ")
    assert job["entrypoint_num_cpus"] == 0
    assert ("DELETE", f"/api/jobs/{job['submission_id']}") in dash.asked, "the job is removed"


def test_check_ray_never_joins_a_cluster_it_was_not_named() -> None:
    dash = FakeDashboard()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "numabind", "check", "--ray"],
            capture_output=True, text=True, timeout=60, cwd="/",
            env=clean_env(RAY_ADDRESS=f"127.0.0.1:{dash.port}"),
        )  # fmt: skip
    finally:
        dash.close()
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "name the cluster's dashboard" in p.stderr and dash.asked == []


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("huge", "an answer of 1099511627776 bytes (at most"),
        ("drip", "no answer from the dashboard before the deadline"),
        ("redirect", "HTTP 302 for /api/version"),
        ("nested", "/api/v0/nodes did not answer JSON"),
        ("pickle", "/api/v0/tasks did not answer JSON"),
    ],
)
def test_a_hostile_dashboard_is_one_line(mode: str, said: str) -> None:
    dash = FakeDashboard(mode=mode)
    try:
        began = time.monotonic()
        p = check_ray(dash, "--deadline", "3")
        took = time.monotonic() - began
    finally:
        dash.close()
    assert p.returncode == 3 and p.stderr.count("\n") == 1, p.stderr
    assert said in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert took < 30, took  # a hang guard (the drip would last a minute)


@needs_root
def test_slurm_tools_another_user_could_change_are_not_run(fake_slurm: dict[str, Path]) -> None:
    """srun and scontrol run with root's privileges: found on PATH in a folder of another
    user's, they are refused with one line, before anything is started."""
    os.chown(fake_slurm["bin"], ATTACKER, ATTACKER)
    p = check_job_here(fake_slurm)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert f"bin is owned by uid {ATTACKER}: scontrol is not run as uid 0" in p.stderr
    assert not (fake_slurm["top"] / "srun.json").exists()


def test_nested_lying_and_oversized_records_through_a_store_are_rows() -> None:
    """One store holding every kind of bad record at once: each is its own invalid row,
    the honest ones are counted, and the report is one screen with exit status 3."""
    nested = b'{"schema":"numabind-node/1","host":"h","ranks":[' + b"[" * 40_000
    values = {
        "numabind/latest": b"run/0/6",
        "numabind/run/0/0": store_record(store_rank(0)),
        "numabind/run/0/1": store_record(store_rank(1), store_rank(5)),  # two ranks
        "numabind/run/0/2": nested + b"]" * 40_000 + b"]}",  # 40,000 deep, 80 KB
        "numabind/run/0/3": store_record(
            store_rank(3, step_nodes="n" + "[0]" * 1000, step_tasks="1")
        ),
        "numabind/run/0/4": b"x" * (200 << 10),  # over a store record's 96 KiB
        "numabind/run/0/5": store_record(store_rank(4)),  # rank 5's key, rank 4's record
    }
    store = StandInStore(values)
    try:
        p, took, peak = check_store_here(store.port, "--deadline", "20")
    finally:
        store.close()
    print(f"\na store of nested, lying and oversized records: {took:.1f} s, peak {peak} MiB")
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stdout.splitlines()[0].endswith(
        "6 ranks on 2 nodes: 2 ok, 0 warnings, 0 off plan, 0 unreachable, 4 unknown or invalid"
    ), p.stdout
    for said in (
        "a store record holds one rank, this one 2",
        "invalid record: more than 6,144 values",  # the nesting, refused before json.loads
        "not read: a value of 204800 bytes",
        "a record under rank 5's key names rank 4",
    ):
        assert said in p.stdout, (said, p.stdout.splitlines())
