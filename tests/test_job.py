"""The job report (numabind check --job): the collector, the records it writes (input to
the merge: forged and garbage ones too), the one table, and a real Slurm job on two
simulated nodes.

The Slurm tests run a cluster of two slurmd, each in its own network namespace with its
own address and its own generated machine (scripts/slurm-nodes), and a 2-node x 2-rank
job whose rank 3 re-pins one named thread off its plan.  They need root (network
namespaces); scripts/test-launchers runs them in CI."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import synth
from numabind.check import _job
from numabind.check._job import InvalidRecord, expand_hostlist, expand_tasks, parse_node
from support import clean_env

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RANK = str(HERE / "launchers" / "job_rank.py")


# --- records as a collector writes them --------------------------------------------------------


def rank(tid: int, rank: int, local: int, cpus: str = "0", **over: Any) -> dict[str, Any]:
    r: dict[str, Any] = {
        "pid": tid,
        "rank": rank,
        "local_rank": local,
        "job": "42",
        "step": "0",
        "step_nodes": "gpu[01-02]",
        "step_tasks": "2(x2)",
        "status": "ok",
        "gpu": {"index": local, "pci": f"0000:1{local}:00.0", "numa_node": local, "source": "x"},
        "plan": {
            "cpus": cpus,
            "helpers": "",
            "numa_node": local,
            "memory_policy": "bind",
            "memory_nodes": str(local),
            "bound": True,
            "source": "registry",
        },
        "threads": [{"cpus": cpus, "tids": [tid, tid + 1], "names": ["python", "pt_main"]}],
        "memory_policy": "bind",
        "memory_nodes": str(local),
        "locality": 1.0,
        "mems_allowed": "0-1",
        "host_buffers": [],
        "problems": [],
        "notes": [],
    }
    r.update(over)
    return r


def node(host: str, ranks: Any, **over: Any) -> str:
    d: dict[str, Any] = {
        "schema": _job.SCHEMA,
        "host": host,
        "job": "42",
        "facts": {
            "numa_balancing": False,
            "cpuset_mems": "0-1",
            "mempolicy_permitted": True,
            "kernel": "6.8",
        },
        "ranks": ranks,
        "notes": [],
    }
    d.update(over)
    return json.dumps(d)


def healthy(host: str, base: int, first: int) -> str:
    return node(host, [rank(base, first, 0, "0-3"), rank(base + 10, first + 1, 1, "4-7")])


# --- hostlists ---------------------------------------------------------------------------------


def test_hostlists_expand_as_slurm_writes_them() -> None:
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert expand_hostlist("a,a,b") == ["a", "b"]
    assert expand_tasks("2(x3),1") == [2, 2, 2, 1]


@pytest.mark.parametrize(
    "bad",
    [
        "gpu[1-99999999]",
        "gpu[3-1]",
        "gpu[1-2",
        "gpu]1[",
        "a b",
        "x[a-b]",
        "n[1-9999][1-9999]",
        "\x1b[2J",
    ],
)
def test_hostlists_that_would_cost_or_lie_are_refused(bad: str) -> None:
    with pytest.raises(InvalidRecord):
        expand_hostlist(bad, limit=10_000)


def test_tasks_lists_are_bounded() -> None:
    with pytest.raises(InvalidRecord):
        expand_tasks("1(x999999)", limit=1000)
    with pytest.raises(InvalidRecord):
        expand_tasks("two")


# --- parsing records (input) -------------------------------------------------------------------


def test_a_collector_record_parses_into_rows() -> None:
    row = parse_node(healthy("gpu01", 100, 0), "gpu01", "42")
    assert row.state == "answered" and [r.rank for r in row.ranks] == [0, 1]
    r = row.ranks[1]
    assert r.plan_cpus == "4-7" and r.cpus == r.plan_cpus and r.plan_cpus.size == 4
    assert r.gpu_pci == "0000:11:00.0" and r.gpu_node == 1 and r.status == "ok"
    assert all(g.on_plan for g in r.threads)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("not json", "not JSON"),
        ("[]", "record is not an object"),
        ('{"schema": "other"}', "schema is not"),
        (node("gpu09", []), "record of host 'gpu09' where 'gpu01' was asked"),
        (node("gpu01", {"a": 1}), "ranks is not a list"),
        (node("gpu01", [], facts={"numa_balancing": "yes"}), "numa_balancing is not true"),
        (node("gpu01\nOK everything", []), "is not a host name"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
    ],
)
def test_a_forged_or_garbage_record_is_an_invalid_row_never_a_crash(text: str, why: str) -> None:
    row = parse_node(text, "gpu01", "42")
    assert row.state == "invalid" and why in row.reason, row.reason
    assert row.host == "gpu01"


@pytest.mark.parametrize(
    ("over", "why"),
    [
        ({"pid": -1}, "pid is not a whole number"),
        ({"pid": True}, "pid is not a whole number"),
        ({"status": "fine"}, "status 'fine' is not one of"),
        ({"locality": 7.5}, "locality is not a share"),
        ({"threads": [{"cpus": "0-99999999", "tids": [1]}]}, "thread cpus"),
        ({"threads": "many"}, "threads is not a list"),
        ({"job": "43"}, "rank of job 43, not 42"),
        ({"host_buffers": [{"nbytes": 1 << 60, "nodes": "0"}]}, "buffer size"),
        ({"plan": {"cpus": 5}}, "plan cpus is not text"),
    ],
)
def test_a_bad_rank_is_an_invalid_rank_row(over: dict[str, Any], why: str) -> None:
    row = parse_node(node("gpu01", [rank(5, 0, 0), rank(6, 1, 1, **over)]), "gpu01", "42")
    assert row.state == "answered"
    good, bad = row.ranks
    assert good.status == "ok" and bad.status == "invalid"
    assert why in bad.problems[0], bad.problems


def test_an_over_full_node_record_still_shows_its_first_ranks() -> None:
    row = parse_node(node("gpu01", [rank(1, 0, 0)] * (_job.MAX_RANKS + 5)), "gpu01", "42")
    assert row.state == "answered" and len(row.ranks) == _job.MAX_RANKS
    assert f"{_job.MAX_RANKS + 5} ranks listed: the first {_job.MAX_RANKS} kept" in row.notes


def test_record_text_is_cleaned_and_capped() -> None:
    evil = "\x1b]0;owned\x07" + "A" * 10_000
    row = parse_node(
        node("gpu01", [rank(5, 0, 0, problems=[evil], notes=["x\ny"] * 1000)]), "gpu01", "42"
    )
    r = row.ranks[0]
    assert r.status == "ok" and len(r.notes) == _job.MAX_NOTES
    assert "\x1b" not in r.problems[0] and len(r.problems[0]) <= _job.TEXT + 40
    assert all("\n" not in n for n in r.notes)


def test_thread_ids_kept_per_rank_are_bounded() -> None:
    groups = [
        {"cpus": str(i % 4), "tids": list(range(1 + i * 5000, 5001 + i * 5000))} for i in range(64)
    ]
    row = parse_node(node("gpu01", [rank(5, 0, 0, threads=groups)]), "gpu01", "42")
    assert sum(len(g.tids) for g in row.ranks[0].threads) <= _job.MAX_TIDS


# --- the merge and the table -------------------------------------------------------------------


def off_plan_node() -> str:
    spin = {"cpus": "0-3", "tids": [311], "names": ["spinner"], "count": 1}
    bad = rank(
        310,
        3,
        1,
        "4-7",
        status="off plan",
        threads=[{"cpus": "4-7", "tids": [310], "names": ["python"]}, spin],
        problems=["threads that escaped the plan's CPUs 4-7: 311"],
    )
    return node("gpu02", [rank(300, 2, 0, "0-3"), bad])


def test_the_report_puts_the_bad_rank_first_and_collapses_identical_nodes() -> None:
    nodes = ["gpu01", "gpu02", "gpu03", "gpu04"]
    answered = {
        "gpu01": parse_node(healthy("gpu01", 100, 0), "gpu01", "42"),
        "gpu02": parse_node(off_plan_node(), "gpu02", "42"),
        "gpu03": parse_node(healthy("gpu03", 500, 4), "gpu03", "42"),
    }
    report = _job.merge("42", nodes, answered)
    lines = _job.report_lines(report)
    text = "\n".join(lines)
    # the layout (gpu[01-02], 2 per node) is only the first step's: gpu04's count is unknown
    assert lines[0] == (
        "numabind check --job 42: 6 ranks on 4 nodes: 5 ok, 0 warnings, 1 off plan, 1 unreachable"
    )
    assert text.index("NOT HEALTHY") < text.index("OFF PLAN") < text.index("\nHEALTHY\n")
    assert "thread 311 'spinner' on CPUs 0-3, plan 4-7" in text
    assert "threads that escaped" not in text, "the named line says it"
    assert "gpu04  UNREACHABLE: no answer" in text
    assert "2 identical nodes: gpu01, gpu03: 4 ranks ok" in text
    assert _job.exit_status(report) == 1
    d = report.to_dict()
    assert d["schema"] == _job.JOB_SCHEMA and d["summary"]["off_plan"] == 1
    assert [n["state"] for n in d["nodes"]] == ["answered", "answered", "answered", "unreachable"]
    json.dumps(d)


def test_unreachable_alone_is_exit_status_3_and_counts_the_ranks_the_layout_expects() -> None:
    answered = {"gpu01": parse_node(healthy("gpu01", 100, 0), "gpu01", "42")}
    report = _job.merge("42", ["gpu01", "gpu02"], answered)
    assert (
        report.summary.text() == "4 ranks on 2 nodes: 2 ok, 0 warnings, 0 off plan, 2 unreachable"
    )
    assert _job.exit_status(report) == 3
    assert "(2 ranks expected)" in "\n".join(_job.report_lines(report))


def test_all_healthy_is_exit_status_0_and_an_invalid_record_3() -> None:
    answered = {
        h: parse_node(healthy(h, 100 * (i + 1), 2 * i), h, "42")
        for i, h in enumerate(["gpu01", "gpu02"])
    }
    assert _job.exit_status(_job.merge("42", ["gpu01", "gpu02"], answered)) == 0
    answered["gpu02"] = parse_node("garbage", "gpu02", "42")
    report = _job.merge("42", ["gpu01", "gpu02"], answered)
    assert _job.exit_status(report) == 3
    assert "gpu02  INVALID: invalid record: not JSON" in "\n".join(_job.report_lines(report))


# --- srun's side of check --job, with a stand-in srun (the unit stage; the launcher stage runs
# the real one) --------------------------------------------------------------------------------


def fake_srun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    """An ``srun`` first on PATH that ignores its arguments and runs ``body`` (Python)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(mode=0o700)
    srun = bin_ / "srun"
    srun.write_text(f"#!{sys.executable}\nimport os, sys, time\n{body}\n")
    srun.chmod(0o700)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    return bin_


@pytest.mark.parametrize("second", ["forged", "garbage"])
def test_a_hosts_answered_record_wins_over_a_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second: str
) -> None:
    """A second task answering for a host that already answered (a forged record listing
    another rank, a task srun started twice, garbage): the first answered record stays
    the host's row; a record for a host not asked for is dropped, and garbage is a row of
    its own."""
    from numabind.cli._job import collect_slurm

    good = healthy("gpu01", 100, 0)
    later = node("gpu01", [rank(900, 0, 0, "0-63")]) if second == "forged" else "{not json"
    lines = [f"0: {good}", f"1: {later}", f"2: {node('elsewhere', [])}"]
    fake_srun(tmp_path, monkeypatch, f"print({chr(10).join(lines)!r})")
    rows, _ = collect_slurm("42", ["gpu01"], 30.0, "/usr/bin/python3", None)
    assert "elsewhere" not in rows, rows
    row = rows["gpu01"]
    assert row.state == "answered" and [r.pid for r in row.ranks] == [100, 110], row
    if second == "garbage":
        assert rows["?"].state == "invalid", rows


def test_the_deadline_holds_when_srun_hangs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An srun that never returns (a node that will not start the step, a hung slurmd):
    collect_slurm returns at its deadline with the node unreachable, and srun's session
    is killed rather than left behind."""
    from numabind.cli._job import collect_slurm

    pidfile = tmp_path / "srun.pid"
    fake_srun(
        tmp_path,
        monkeypatch,
        f"open({str(pidfile)!r}, 'w').write(str(os.getpid()))\ntime.sleep(300)",
    )
    began = time.monotonic()
    rows, _ = collect_slurm("42", ["gpu01", "gpu02"], 4.0, "/usr/bin/python3", None)
    took = time.monotonic() - began
    assert took < 12, f"collect_slurm took {took:.1f} s past a 4 s deadline"
    assert {h: r.state for h, r in rows.items()} == {"gpu01": "unreachable", "gpu02": "unreachable"}
    assert "no answer before the deadline" in rows["gpu01"].reason, rows["gpu01"].reason
    pid = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"srun (pid {pid}) still runs after collect_slurm returned")


# --- the collector on this machine -------------------------------------------------------------


@pytest.fixture
def fake_ranks() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes whose initial environments say: ranks 0 and 1 of job 77 on nodea, a
    rank of job 77 on nodeb (another simulated node in this PID namespace), a rank of
    job 78 on nodea, and a collector of job 77 (never reported)."""
    base = {
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NODELIST": "nodea,nodeb",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    }
    kinds = [
        dict(SLURM_JOB_ID="77", SLURMD_NODENAME="nodea", SLURM_LOCALID="0", SLURM_PROCID="0"),
        dict(SLURM_JOB_ID="77", SLURMD_NODENAME="nodea", SLURM_LOCALID="1", SLURM_PROCID="1"),
        dict(SLURM_JOB_ID="77", SLURMD_NODENAME="nodeb", SLURM_LOCALID="0", SLURM_PROCID="2"),
        dict(SLURM_JOB_ID="78", SLURMD_NODENAME="nodea", SLURM_LOCALID="0", SLURM_PROCID="0"),
        dict(SLURM_JOB_ID="77", SLURMD_NODENAME="nodea", SLURM_LOCALID="0", NUMABIND_COLLECTOR="1"),
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", "import sys, time; print(1, flush=True); time.sleep(60)"],
            env=clean_env(**base, **k),
            stdout=subprocess.PIPE,
        )
        for k in kinds
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline()
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_the_collector_reports_only_its_jobs_ranks_on_its_node(
    fake_ranks: list[subprocess.Popen[bytes]],
) -> None:
    env = clean_env(SLURMD_NODENAME="nodea", SLURM_JOB_ID="77", SLURM_STEP_ID="5")
    uid = str(os.geteuid())  # the job's owner: no Slurm tracking or job cgroup here
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "check", "--all", "--job-id", "77", "--job-uid", uid],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.count("\n") == 1, "one line: srun passes it through whole"
    row = parse_node(p.stdout, "nodea", "77")
    assert row.state == "answered"
    assert sorted(r.pid for r in row.ranks) == sorted(x.pid for x in fake_ranks[:2])
    assert sorted(r.rank for r in row.ranks) == [0, 1]
    assert {r.step_tasks for r in row.ranks} == {"2(x2)"}
    assert all(r.threads and r.threads[0].names == ("python",) for r in row.ranks)
    assert row.facts["mempolicy_permitted"] is True
    assert f"job 77's processes here, as told by the job owner's uid {uid}" in row.notes[0]


def test_the_collector_needs_all_and_check_job_needs_a_job() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "check", "--job-id", "77"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert p.returncode == 2 and "--job-id selects among --all" in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "check", "--job"],
        capture_output=True,
        text=True,
        env={k: v for k, v in clean_env().items() if not k.startswith("SLURM")},
    )
    assert p.returncode == 2 and "no job id given and SLURM_JOB_ID is not set" in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "check", "--job", "1;rm -rf /"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert p.returncode == 2 and "is not a Slurm job id" in p.stderr
    for argv, said in (
        (["--job", "77", "--python", "python3"], "--python 'python3' is not an absolute path"),
        (["--all", "--python", "/usr/bin/python3"], "--python names the interpreter --job runs"),
    ):
        p = subprocess.run(
            [sys.executable, "-m", "numabind", "check", *argv],
            capture_output=True,
            text=True,
            env=clean_env(),
        )
        assert p.returncode == 2 and said in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_the_gpu_is_told_by_the_device_file_a_rank_holds_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A char device's (major, minor) from /proc/PID/fd, mapped through the driver's minor
    numbers (/proc/driver/nvidia/gpus/*/information): /dev/null (1:3), held open by a real
    process, stands in for /dev/nvidia3 through a table row the test adds."""
    from numabind import _topology
    from numabind._model import DEVICE_FILES, DeviceFile
    from numabind.check import _inspect as _check

    assert next(r for r in DEVICE_FILES if r.vendor == "nvidia").major == 195
    spec = synth.Spec(
        nodes=[[0, 1], [2, 3]],
        package_of_node=[0, 1],
        gpus=[synth.Gpu("0000:17:00.0", 0, minor=0), synth.Gpu("0000:9b:00.0", 1, minor=3)],
        memory_gib=1,
    )
    machine = _topology.Machine.from_root(synth.write(spec, str(tmp_path / "m")))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; f = open('/dev/null'); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline()
        assert (1, 3) in _check._kernel.char_devices(holder.pid)
        assert _check.gpu_in_use(holder.pid, machine, None).source == "none"
        row = DeviceFile(vendor="nvidia", major=1, minors=(3, 3), name="null", lookup="minor")
        monkeypatch.setattr(_check, "DEVICE_FILES", (row,))
        seen = _check.gpu_in_use(holder.pid, machine, None)
    finally:
        holder.kill()
        holder.wait()
    assert (seen.pci, seen.index, seen.numa_node) == ("0000:9b:00.0", 1, 1)
    assert seen.source == "the device file it holds open"


# --- a real Slurm job on two simulated nodes ---------------------------------------------------

NODES_SCRIPT = str(ROOT / "scripts" / "slurm-nodes")


def _need_cluster() -> None:
    why = ""
    if os.geteuid() != 0:
        why = "needs root (network namespaces)"
    elif not shutil.which("ip") or not shutil.which("nsenter"):
        why = "needs ip and nsenter"
    if why:
        if os.environ.get("NUMABIND_REQUIRE_LAUNCHERS") == "1":
            pytest.fail(f"the two-node Slurm cluster {why}")
        pytest.skip(f"the two-node Slurm cluster {why}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    _need_cluster()
    where = tmp_path_factory.mktemp("slurm-nodes")
    os.chmod(where, 0o700)
    env = clean_env(NUMABIND_SLURM_NODES_DIR=str(where / "c"))
    start = subprocess.run(
        [NODES_SCRIPT, "start"], capture_output=True, text=True, env=env, timeout=300
    )
    if start.returncode != 0:
        if os.environ.get("NUMABIND_REQUIRE_LAUNCHERS") == "1" or "install" not in start.stderr:
            pytest.fail(f"scripts/slurm-nodes start failed:\n{start.stdout}\n{start.stderr}")
        pytest.skip(f"no Slurm here: {start.stderr.strip()}")
    out = subprocess.run([NODES_SCRIPT, "env"], capture_output=True, text=True, env=env, check=True)
    for item in out.stdout.split()[1:]:
        k, _, v = item.partition("=")
        env[k] = v
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}:/usr/sbin:/sbin"
    for name, bus in (("nodea", 0x17), ("nodeb", 0x3B)):
        spec = synth.Spec(
            nodes=[[0, 1], [2, 3]],
            package_of_node=[0, 1],
            gpus=[
                synth.Gpu(f"0000:{bus:02x}:00.0", 0, minor=0),
                synth.Gpu(f"0000:{bus + 1:02x}:00.0", 0, minor=1),
            ],
            memory_gib=1,
        )
        synth.write(spec, str(where / "c" / "machines" / name))
    try:
        yield env
    finally:
        subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True)
        subprocess.run([NODES_SCRIPT, "stop"], env=env, capture_output=True, timeout=120)


def check_job(
    env: dict[str, str], job: str, *more: str, cwd: str = "/"
) -> subprocess.CompletedProcess[str]:
    """``numabind check --job`` as an administrator runs it (the installed command), with
    NUMABIND_SYSROOT naming the path where each simulated node has its own machine (it
    reaches the collectors as --sysroot)."""
    env = dict(env, NUMABIND_SYSROOT=f"{env['NUMABIND_SLURM_NODES_DIR']}/machine")
    return subprocess.run(
        [str(Path(sys.executable).parent / "numabind"), "check", "--job", job, *more],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=cwd,
    )


@pytest.mark.launchers
def test_check_job_on_a_two_node_slurm_job(  # noqa: PLR0915 (one job, every case)
    cluster: dict[str, str], tmp_path: Path
) -> None:
    env = dict(cluster)
    ready = tmp_path / "ready"
    ready.mkdir()
    job_env = dict(env, NUMABIND_MODE="exclusive", JOB_READY_DIR=str(ready), JOB_OFF_PLAN_RANK="3")
    submit = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--no-kill",
            "--nodes=2",
            "--ntasks-per-node=2",
            f"--output={tmp_path / 'job.out'}",
            "--wrap",
            f"srun {sys.executable} {RANK}",
        ],
        capture_output=True,
        text=True,
        env=job_env,
        timeout=60,
        cwd=str(tmp_path),
    )
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip().split(";")[0]
    for _ in range(600):
        if len(list(ready.glob("rank*.json"))) == 4:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the ranks did not start: {(tmp_path / 'job.out').read_text()}")
    state = cluster["NUMABIND_SLURM_NODES_DIR"]
    # another user's process claims to be a rank of the job on nodea, and root's directory
    # holds a planted numabind/ and json.py (issue 32, attacks 1 and 4)
    claim = clean_env(
        SLURM_JOB_ID=job, SLURM_STEP_ID="0", SLURMD_NODENAME="nodea", SLURM_LOCALID="0"
    )
    intruder = subprocess.Popen(
        ["setpriv", "--reuid=43214", "--regid=43214", "--clear-groups", "sleep", "300"], env=claim
    )
    planted = tmp_path / "planted"
    (planted / "numabind").mkdir(parents=True)
    for name in ("numabind/__init__.py", "json.py", "socket.py"):
        (planted / name).write_text(f"open({str(tmp_path / 'PWNED')!r}, 'w').close()\n")

    # every rank, on both nodes, with each node's own machine: rank 3 off plan, its thread
    # named; the intruder is not counted (Slurm's own list of the job's processes)
    began = time.monotonic()
    p = check_job(env, job, cwd=str(planted))
    print(p.stdout, f"({time.monotonic() - began:.1f} s)")
    intruder.kill()
    intruder.wait()
    assert not (tmp_path / "PWNED").exists(), "planted code ran"
    assert p.returncode == 1, p.stdout + p.stderr
    assert (
        "note: nodea: job " + job + "'s processes here, as told by Slurm's process tracking"
        in p.stdout
    )
    assert not re.search(rf"\b{intruder.pid}\b", p.stdout), p.stdout
    lines = p.stdout.splitlines()
    summary = "4 ranks on 2 nodes: 3 ok, 0 warnings, 1 off plan, 0 unreachable"
    assert lines[0] == f"numabind check --job {job}: {summary}"
    bad = next(line for line in lines if "OFF PLAN" in line)
    assert bad.split()[:3] == ["nodeb", "3", "1"] and "1 0000:3c:00.0  0" in bad, bad
    assert "'spinner' on CPUs 0, plan 1" in p.stdout
    assert "0000:17:00.0" in p.stdout and "0000:18:00.0" in p.stdout, "nodea's machine"
    p = check_job(env, job, "--json")
    assert p.returncode == 1
    d = json.loads(p.stdout)
    assert d["summary"]["ranks"] == 4 and d["summary"]["off_plan"] == 1
    assert sorted(r["rank"] for n in d["nodes"] for r in n["ranks"]) == [0, 1, 2, 3]

    # --python names the nodes' interpreter: one that is not there is each node's row
    p = check_job(env, job, "--python", "/nonexistent/python3", "--deadline", "30")
    print(p.stdout)
    assert p.returncode == 3, p.stdout + p.stderr
    gone = "UNREACHABLE: not run: there is no interpreter /nonexistent/python3 on this node"
    assert f"nodea  {gone}" in p.stdout and f"nodeb  {gone}" in p.stdout, p.stdout

    # a collector that hangs: its node is a row, the report comes at the deadline
    hang = Path(state, "hang-nodea")
    hang.touch()
    try:
        began = time.monotonic()
        p = check_job(env, job, "--deadline", "6")
        took = time.monotonic() - began
    finally:
        hang.unlink()
    print(p.stdout)
    logs = "".join(f.read_text()[-1500:] for f in sorted(Path(state, "log").glob("slurmd-*.log")))
    # a 6 s deadline, plus starting numabind and srun on a loaded machine (not srun's own)
    assert p.returncode == 1 and took < 25, (took, p.stdout, logs)
    assert "nodea  UNREACHABLE: no answer before the deadline" in p.stdout, (p.stdout, logs)
    assert "(2 ranks expected)" in p.stdout

    # a node whose slurmd is stopped: a row that says so, exit status 3
    subprocess.run([NODES_SCRIPT, "stop-node", "nodeb"], env=env, check=True, timeout=60)
    try:
        p = check_job(env, job, "--deadline", "30")
    finally:
        subprocess.run([NODES_SCRIPT, "start-node", "nodeb"], env=env, timeout=120)
    print(p.stdout)
    assert p.returncode == 3, p.stdout + p.stderr
    assert p.stdout.splitlines()[0].endswith(
        "4 ranks on 2 nodes: 2 ok, 0 warnings, 0 off plan, 2 unreachable"
    )
    assert "nodeb  UNREACHABLE: " in p.stdout
    subprocess.run(["scancel", job], env=env, timeout=30)


@pytest.mark.launchers
def test_check_job_of_a_job_that_does_not_exist(cluster: dict[str, str]) -> None:
    p = check_job(cluster, "999999")
    assert p.returncode == 2
    assert p.stderr.startswith("numabind check --job: no job 999999"), p.stderr


def test_check_ray_without_a_cluster_is_one_line() -> None:
    """Where no dashboard answers at the address: one line and exit status 3, whether or
    not ray is installed here (check --ray never imports it)."""
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "check", "--ray", f"127.0.0.1:{_closed_port()}"],
        capture_output=True,
        text=True,
        env=clean_env(RAY_AUTH_MODE="disabled"),
        timeout=120,
    )
    assert p.returncode == 3 and p.stderr.count("\n") == 1, p.stderr
    assert "numabind check --ray 127.0.0.1:" in p.stderr and "cannot connect" in p.stderr


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_rank_that_exits_mid_report_is_a_note_not_a_crash(
    fake_ranks: list[subprocess.Popen[bytes]],
) -> None:
    """The collector lists the ranks, one exits before it is checked: the record still
    comes, with the others, and says one left."""
    from numabind._topology import Machine
    from numabind.check import _inspect

    gone = fake_ranks[1]
    gone.kill()
    gone.wait()
    machine = Machine.from_root("/")
    try:
        report = _inspect.check([fake_ranks[0].pid, gone.pid], machine)
    finally:
        machine.close()
    row = parse_node(json.dumps(_job.node_record(report, "77")), None, "77")
    assert row.state == "answered" and [r.pid for r in row.ranks] == [fake_ranks[0].pid]
    assert "1 rank(s) exited while being checked: left out" in row.notes
