"""``numabind check --format openmetrics``: the binding exporter, read back with the
Prometheus project's own parser (prometheus_client's OpenMetrics parser), on real ranks
the startup hook bound on the generated two-node machine (node 0 = CPU 0, node 1 = CPU 1)
with GPU UUIDs and one RDMA adapter behind GPU 0's switch."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from prometheus_client.parser import text_string_to_metric_families as classic_families

import synth
from numabind import _kernel
from numabind._sysfs import clean_line
from numabind._topology import Machine
from numabind.check import _job
from numabind.check._inspect import check
from numabind.check._metrics import (
    UP_REASONS,
    bound_reasons,
    dcgm_bus_id,
    escape_label,
    render,
    render_job,
)
from support import clean_env, python_for, readable_src, two_cpus

HOSTILE_JOB = 'job "7" \\ x\nnext'  # a quote, a backslash and a newline, from the environment
UUIDS = (synth._uuid(0), synth._uuid(1))


@pytest.fixture(scope="module")
def gpus2(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two nodes, GPU i on node i with a UUID, under a host bridge of its own; mlx5_0 behind
    GPU 0's switch (PIX from GPU 0, SYS from GPU 1)."""
    spec = synth.two_nodes()
    hosts = [("pci0000:00", "0000:00:01.0", "0000:10:00.0"), ("pci0000:80", "0000:80:01.0")]
    spec.gpus = [
        dataclasses.replace(
            g, uuid=UUIDS[i], minor=i, bridges=(*hosts[i], f"0000:{0x11 + i:02x}:00.0")
        )
        for i, g in enumerate(spec.gpus)
    ]
    host = hosts[0]
    spec.adapters = [synth.Adapter("mlx5_0", "0000:20:00.0", 0, bridges=(*host, "0000:11:01.0"))]
    return synth.write(spec, str(tmp_path_factory.mktemp("gpus2")))


def _rank(
    root: str, registry: Path, rank: int, memory: str, job: str = HOSTILE_JOB
) -> subprocess.Popen[str]:
    """A rank the startup hook binds (local rank ``rank`` of 2, global rank 10 + rank)."""
    env = clean_env(
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
        RANK=str(10 + rank),
        SLURM_JOB_ID=job,
        NUMABIND_SYSROOT=root,
        NUMABIND_REGISTRY=str(registry),
        NUMABIND_MEMORY=memory,
        NUMABIND="force",
    )
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def _stop(children: list[subprocess.Popen[str]]) -> None:
    for c in children:
        c.kill()
        c.wait()


def _scrape(
    root: str, registry: Path, *argv: str, **extra: str
) -> tuple[int, dict[str, list[tuple[dict[str, str], float]]]]:
    """``numabind check ARGV --format openmetrics``: its exit status and, parsed by
    prometheus_client, each family's samples as (labels, value)."""
    env = clean_env(NUMABIND_SYSROOT=root, NUMABIND_REGISTRY=str(registry), **extra)
    if "NODE_NAME" not in extra:
        env.pop("NODE_NAME", None)
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "check", *argv, "--format", "openmetrics"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.stdout.endswith("# EOF\n"), (p.stdout[-200:], p.stderr)
    return p.returncode, _parse(p.stdout)


def _parse(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        assert family.type == "gauge", family
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def _of(found: dict[str, list[tuple[dict[str, str], float]]], name: str, pid: int) -> list[Any]:
    return [(labels, v) for labels, v in found.get(name, []) if labels.get("pid") == str(pid)]


def _one(found: dict[str, list[tuple[dict[str, str], float]]], name: str, pid: int) -> float:
    (sample,) = _of(found, name, pid)
    return float(sample[1])


@two_cpus
def test_bound_rank_and_rank_moved_by_taskset(gpus2: str, tmp_path: Path) -> None:
    """Two ranks on their plans: every series parses, on_plan 1, the DCGM join labels
    (Hostname, UUID, pci_bus_id in NVML's form, gpu) and job id, rank, local rank on each;
    the NIC distance class of each GPU's adapter.  Rank 1 moved by ``taskset -p`` to CPU
    0: its series says off plan and names one thread off plan, rank 0's still on plan,
    and the exit status is check's own (1, as with --json)."""
    import socket

    ranks = [_rank(gpus2, tmp_path, 0, "preferred"), _rank(gpus2, tmp_path, 1, "none")]
    try:
        pids = [str(c.pid) for c in ranks]
        status, found = _scrape(gpus2, tmp_path, "--pid", *pids)
        assert status == 0, found
        for i, child in enumerate(ranks):
            assert _one(found, "numabind_rank_on_plan", child.pid) == 1
            assert _one(found, "numabind_rank_threads_off_plan", child.pid) == 0
            ((labels, up),) = _of(found, "numabind_rank_up", child.pid)
            assert up == 1 and labels["reason"] == "checked"
            ((labels, bound),) = _of(found, "numabind_rank_bound", child.pid)
            assert bound == 1 and labels["reason"] == "bound"
            assert labels["Hostname"] == socket.gethostname()
            assert labels["UUID"] == UUIDS[i] and labels["gpu"] == str(i)
            assert labels["pci_bus_id"] == f"00000000:{i + 1:02X}:00.0"
            assert labels["rank"] == str(10 + i) and labels["local_rank"] == str(i)
            assert labels["job_id"] == clean_line(HOSTILE_JOB, 40)  # parsed back exactly
            ((nic, distance),) = _of(found, "numabind_rank_nic_distance", child.pid)
            assert nic["nic"] == "mlx5_0:1"
            assert (nic["relation"], distance) == (("PIX", 0) if i == 0 else ("SYS", 4))
            kinds = {
                lab["kind"]: v for lab, v in _of(found, "numabind_rank_pages_far_bytes", child.pid)
            }
            assert kinds == {"gpu": 0, "far": 0}
            assert not _of(found, "numabind_rank_main_thread_priority_core", child.pid)
        assert _one(found, "numabind_rank_pages_on_plan_ratio", ranks[0].pid) > 0.9
        taskset = shutil.which("taskset")
        assert taskset is not None, "taskset (util-linux) is needed"
        subprocess.run([taskset, "-p", "-c", "0", pids[1]], check=True, capture_output=True)
        status, found = _scrape(gpus2, tmp_path, "--pid", *pids)
        assert status == 1
        assert _one(found, "numabind_rank_on_plan", ranks[1].pid) == 0
        assert _one(found, "numabind_rank_threads_off_plan", ranks[1].pid) == 1
        roles = {
            lab["role"]: v for lab, v in _of(found, "numabind_rank_role_on_plan", ranks[1].pid)
        }
        assert roles["main"] == 0
        assert _one(found, "numabind_rank_on_plan", ranks[0].pid) == 1
        json_status = subprocess.run(
            [sys.executable, "-m", "numabind", "check", "--pid", *pids, "--json"],
            capture_output=True,
            env=clean_env(NUMABIND_SYSROOT=gpus2, NUMABIND_REGISTRY=str(tmp_path)),
            timeout=120,
        ).returncode
        assert json_status == status
        # --all finds them too (and whatever other ranks this host runs: each parses)
        status, found = _scrape(gpus2, tmp_path, "--all")
        assert _one(found, "numabind_rank_on_plan", ranks[1].pid) == 0
        assert status == 1
    finally:
        _stop(ranks)


@two_cpus
@pytest.mark.parametrize(("role", "on"), [("main", 1), ("off", 0)])
def test_main_thread_on_a_priority_core(tmp_path: Path, role: str, on: int) -> None:
    """Node 0 is this host's CPUs 0-1, CPU 1 the faster kind (ACPI CPPC): under
    NUMABIND_PRIORITY=main the rank's main thread is put there (1); with the role off it
    runs on both (0).  Where the node has one kind of core the series is absent."""
    spec = synth.Spec(
        nodes=[[0, 1], [2, 3]], package_of_node=[0, 1], gpus=[synth.Gpu("0000:01:00.0", 0)]
    )
    spec.cpu_files = {"acpi_cppc/highest_perf": {0: 30, 1: 40, 2: 30, 3: 30}}
    root = synth.write(spec, str(tmp_path / "m"))
    registry = tmp_path / "registry"
    env = clean_env(
        LOCAL_RANK="0",
        NUMABIND="force",
        NUMABIND_SYSROOT=root,
        NUMABIND_MEMORY="none",
        NUMABIND_REGISTRY=str(registry),
        NUMABIND_PRIORITY=role,
    )
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        status, found = _scrape(root, registry, "--pid", str(child.pid))
    finally:
        _stop([child])
    assert status == 0, found
    assert _one(found, "numabind_rank_main_thread_priority_core", child.pid) == on


def test_a_dead_pid_is_a_series_not_a_crash(gpus2: str, tmp_path: Path) -> None:
    """A pid that exited (a zombie here) and one that never was: numabind_rank_up 0 with
    reason ``exited``, a parsable exposition, exit status 3 as check's."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while _kernel.process_state(child.pid) != "Z" and time.time() < deadline:
        time.sleep(0.05)
    try:
        status, found = _scrape(gpus2, tmp_path, "--pid", str(child.pid), "999999")
    finally:
        child.wait()
    assert status == 3
    for pid in (child.pid, 999999):
        ((labels, up),) = _of(found, "numabind_rank_up", pid)
        assert up == 0 and labels["reason"] == "exited"
        assert not _of(found, "numabind_rank_on_plan", pid)


def test_hostname_is_dcgm_exporter_s_node_name_where_set(gpus2: str, tmp_path: Path) -> None:
    """dcgm-exporter names a node by ``NODE_NAME`` where set (its Kubernetes DaemonSet),
    else by the host name: so does the exporter, so that ``on (Hostname, UUID)`` joins."""
    _, found = _scrape(gpus2, tmp_path, "--pid", "999999", NODE_NAME="gpu-node-07")
    ((labels, _),) = _of(found, "numabind_rank_up", 999999)
    assert labels["Hostname"] == "gpu-node-07"


def test_a_rank_with_nothing_to_bind_is_on_plan_and_says_why_not_bound(tmp_path: Path) -> None:
    """A rank on a one-node machine: its plan does not bind (nothing to choose), which is
    on plan; numabind_rank_bound 0 with the planner's reason, ``one-node``."""
    root = synth.write(synth.one_node(), str(tmp_path / "one"))
    registry = tmp_path / "registry"
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        env=clean_env(LOCAL_RANK="0", NUMABIND_SYSROOT=root, NUMABIND_REGISTRY=str(registry)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        status, found = _scrape(root, registry, "--pid", str(child.pid))
    finally:
        _stop([child])
    assert status == 0, found
    assert _one(found, "numabind_rank_on_plan", child.pid) == 1
    ((labels, bound),) = _of(found, "numabind_rank_bound", child.pid)
    assert bound == 0 and labels["reason"] == "one-node"
    assert not _of(found, "numabind_rank_threads_off_plan", child.pid)


FOREIGN = 43212  # an unprivileged uid the test plays (setpriv)


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="plays another uid (root only)"
)
def test_another_user_s_rank_is_up_0_unreadable(gpus2: str, tmp_path: Path) -> None:
    """An unprivileged user's scrape of root's rank: its environment and memory maps are
    not that user's to read, so the rank is ``numabind_rank_up 0`` with reason
    ``unreadable`` (and exit status 3), never a traceback or a missing exposition."""
    rank = _rank(gpus2, tmp_path, 0, "preferred")
    try:
        env = clean_env(PYTHONPATH=readable_src())
        env.pop("NODE_NAME", None)
        p = subprocess.run(
            [
                "setpriv",
                f"--reuid={FOREIGN}",
                f"--regid={FOREIGN}",
                "--clear-groups",
                python_for(FOREIGN),
                "-m",
                "numabind",
                "check",
                "--pid",
                str(rank.pid),
                "--format",
                "openmetrics",
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd="/",
            timeout=120,
        )
    finally:
        _stop([rank])
    assert p.returncode == 3 and "Traceback" not in p.stderr, (p.stdout, p.stderr)
    found = _parse(p.stdout)
    ((labels, up),) = _of(found, "numabind_rank_up", rank.pid)
    assert up == 0 and labels["reason"] == "unreadable"
    assert not _of(found, "numabind_rank_on_plan", rank.pid)


def test_a_process_without_a_plan_is_up_0_no_plan(gpus2: str, tmp_path: Path) -> None:
    """A process that is no rank (no local rank, not registered), named by --pid: up 0
    with reason ``no_plan``, no verdict series; exit status 3."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        env=clean_env(),
        stdin=subprocess.PIPE,
    )
    try:
        status, found = _scrape(gpus2, tmp_path, "--pid", str(child.pid))
    finally:
        child.kill()
        child.wait()
    assert status == 3
    ((labels, up),) = _of(found, "numabind_rank_up", child.pid)
    assert up == 0 and labels["reason"] == "no_plan"
    assert set(UP_REASONS) >= {"checked", "no_plan", "exited"} and "bound" in bound_reasons()


@pytest.mark.parametrize(
    "value",
    [
        'a"b',
        "back\\slash",
        "new\nline",
        "ends with a backslash \\",
        '\\"',
        "\\n (a backslash and an n, not a newline)",
        "ünïcödé ✓",
        "",
    ],
)
def test_a_hostile_label_value_is_parsed_back_exactly(
    gpus2: str, tmp_path: Path, value: str
) -> None:
    """A Hostname label holding quote, backslash and newline (and their look-alikes),
    rendered from a real report of a real rank: the Prometheus parser reads back exactly
    the value given, on every series."""
    rank = _rank(gpus2, tmp_path, 0, "preferred")
    try:
        machine = Machine.from_root(gpus2)
        try:
            report = check([rank.pid], machine, settings={"NUMABIND_REGISTRY": str(tmp_path)})
        finally:
            machine.close()
    finally:
        _stop([rank])
    text = render(report, hostname=value)
    assert text.endswith("# EOF\n") and text.count("\n# EOF") == 1
    found = _parse(text)
    hosts = {labels["Hostname"] for samples in found.values() for labels, _ in samples}
    assert hosts == {value}
    # node_exporter's textfile collector reads the classic text format: it parses too
    classic = {s.labels["Hostname"] for f in classic_families(text) for s in f.samples}
    assert classic == {value}
    assert _one(found, "numabind_rank_on_plan", rank.pid) == 1
    job = {labels.get("job_id") for labels, _ in _of(found, "numabind_rank_up", rank.pid)}
    assert job == {clean_line(HOSTILE_JOB, 40)}


@pytest.mark.parametrize(
    ("kernel", "nvml"),
    [("0000:3b:00.0", "00000000:3B:00.0"), ("0001:c1:00.1", "00000001:C1:00.1"), ("", None)],
)
def test_pci_bus_id_is_spelled_as_nvml_and_dcgm_exporter_spell_it(
    kernel: str, nvml: str | None
) -> None:
    """dcgm-exporter's ``pci_bus_id`` is NVML's ``busId``: an 8-digit domain, upper case."""
    assert dcgm_bus_id(kernel) == nvml


def test_escape_label_replaces_what_utf8_cannot_carry() -> None:
    """A lone surrogate (an undecodable byte of /proc text) becomes ``?``: the exposition
    stays UTF-8."""
    assert escape_label("a\udcffb") == "a?b"
    assert escape_label('x"\\\n') == 'x\\"\\\\\\n'


def test_the_job_report_is_exposed_per_node_and_rank(gpus2: str, tmp_path: Path) -> None:
    """``check --job``'s report (node records as the collectors send them, merged): each
    rank's series with its node's Hostname and its GPU's UUID; a node that did not answer
    is numabind_node_up 0; a record that did not parse, numabind_rank_up 0."""
    rank = _rank(gpus2, tmp_path, 0, "preferred")
    try:
        machine = Machine.from_root(gpus2)
        try:
            report = check([rank.pid], machine, settings={"NUMABIND_REGISTRY": str(tmp_path)})
        finally:
            machine.close()
    finally:
        _stop([rank])
    record = _job.node_record(report, None)
    record["host"] = "node-a"
    row = _job.parse_node(json.dumps(record), "node-a")
    bad = dict(record, host="node-c", ranks=[{"pid": "not a number"}])
    bad_row = _job.parse_node(json.dumps(bad), "node-c")
    job = _job.merge(None, ["node-a", "node-b", "node-c"], {"node-a": row, "node-c": bad_row})
    found = _parse(render_job(job))
    nodes = {lab["Hostname"]: (lab["reason"], v) for lab, v in found["numabind_node_up"]}
    assert nodes["node-a"] == ("answered", 1) and nodes["node-b"][1] == 0
    ((labels, on),) = _of(found, "numabind_rank_on_plan", rank.pid)
    assert on == 1 and labels["Hostname"] == "node-a" and labels["UUID"] == UUIDS[0]
    assert labels["pci_bus_id"] == "00000000:01:00.0" and labels["gpu"] == "0"
    assert _one(found, "numabind_rank_threads_off_plan", rank.pid) == 0
    invalid = [lab for lab, v in found["numabind_rank_up"] if lab["reason"] == "invalid_record"]
    assert invalid or nodes["node-c"][1] == 0


def test_one_job_s_ranks_here_as_series(gpus2: str, tmp_path: Path) -> None:
    """``check --all --job-id J --format openmetrics`` (a Slurm epilog's or a per-job
    timer's scrape): the job's rank on this node, by the job owner's uid, and no rank of
    another job."""
    job = str(7_000_000 + os.getpid() % 1_000_000)
    mine = _rank(gpus2, tmp_path, 0, "preferred", job=job)
    other = _rank(gpus2, tmp_path, 1, "none", job=f"{job}9")
    try:
        argv = ("--all", "--job-id", job, "--job-uid", str(os.geteuid()))
        status, found = _scrape(gpus2, tmp_path, *argv)
    finally:
        _stop([mine, other])
    assert status == 0, found
    ((labels, on),) = _of(found, "numabind_rank_on_plan", mine.pid)
    assert on == 1 and labels["job_id"] == job
    assert not _of(found, "numabind_rank_up", other.pid)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (
            ["--all", "--json", "--format", "openmetrics"],
            "--json and --format openmetrics disagree",
        ),
        (["--ray", "127.0.0.1:1", "--format", "openmetrics"], "not --ray"),
        (["--all", "--format", "yaml"], "--format: invalid choice: 'yaml'"),
    ],
)
def test_format_usage_errors_exit_2_with_one_line(argv: list[str], said: str) -> None:
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "check", *argv],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=60,
    )
    assert p.returncode == 2 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr.count("\n") == 1 and said in p.stderr, p.stderr


def test_json_is_unchanged_by_the_format_option(gpus2: str, tmp_path: Path) -> None:
    """``--format json`` is ``--json``: the same document."""
    env = clean_env(NUMABIND_SYSROOT=gpus2, NUMABIND_REGISTRY=str(tmp_path))
    outs = []
    for flag in (["--json"], ["--format", "json"]):
        p = subprocess.run(
            [sys.executable, "-m", "numabind", "check", "--pid", "999999", *flag],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        outs.append((p.returncode, json.loads(p.stdout)["vanished"]))
    assert outs[0] == outs[1] == (3, [999999])
