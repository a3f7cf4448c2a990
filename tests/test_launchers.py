"""Real launchers on this machine: who is a rank, with which size, from which variable.

This machine has one NUMA node, so nothing gets bound; what is tested is detection, as
each rank's NUMABIND_VERBOSE line reports it, under the real torchrun, accelerate, Open MPI,
MPICH and Slurm (a one-node cluster started by scripts/slurm-local).  Launcher processes
(the torchrun agent, the sbatch script) must not be ranks.  scripts/test-launchers installs
the launchers; without them these tests skip, unless NUMABIND_REQUIRE_LAUNCHERS=1 (CI).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from support import clean_env, need

pytestmark = pytest.mark.launchers
HERE = Path(__file__).resolve().parent
PROBE = str(HERE / "launchers" / "probe.py")
BIN = Path(sys.executable).parent
ONE_NODE = "not bound: this machine has one NUMA node with CPUs: nothing to bind"


def env(**extra: str) -> dict[str, str]:
    e = clean_env()
    e.update(NUMABIND_VERBOSE="1", PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **extra)
    if "SLURM_CONF" in os.environ:
        e["SLURM_CONF"] = os.environ["SLURM_CONF"]
    return e


def launch(
    argv: list[str], timeout: float = 180, **extra: str
) -> tuple[list[dict[str, Any]], list[str]]:
    with tempfile.TemporaryDirectory(prefix="numabind-probe-") as probe_dir:
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env(PROBE_DIR=probe_dir, **extra),
            timeout=timeout,
            cwd=HERE,
        )
        assert p.returncode == 0, (
            f"{argv} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
        )
        probes = [json.loads(f.read_text()) for f in sorted(Path(probe_dir).glob("*.json"))]
    # where each rank's machine came from (the node's cache, or sysfs for the rank that
    # wrote it) and why verbose mode went the full path vary with timing: not compared
    lines = sorted(
        _ORIGIN.sub("", line[line.index("numabind: ") :])
        for line in (p.stdout + p.stderr).splitlines()
        if "numabind: " in line
    )
    return probes, lines


_ORIGIN = re.compile(r" \[machine: [^\]]*\]| \[planned by the full path: [^\]]*\]")


def expected(source: str, size_source: str, n: int = 2) -> list[str]:
    return sorted(
        f"numabind: local rank {k} ({source}; {n} local ranks from {size_source}): {ONE_NODE}"
        for k in range(n)
    )


def test_torchrun() -> None:
    torchrun = need("torchrun")
    probes, lines = launch([torchrun, "--nproc-per-node", "2", PROBE])
    assert len(probes) == 2
    assert lines == expected("LOCAL_RANK", "LOCAL_WORLD_SIZE"), (
        "the agent is silent: it has no rank"
    )


def test_accelerate(tmp_path: Path) -> None:
    accelerate = need("accelerate")
    probes, lines = launch(
        [
            accelerate,
            "launch",
            "--multi_gpu",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            PROBE,
        ],
        HF_HOME=str(tmp_path),
    )
    assert len(probes) == 2
    assert lines == expected("LOCAL_RANK", "LOCAL_WORLD_SIZE")


def test_open_mpi() -> None:
    mpirun = need("mpirun")
    probes, lines = launch([mpirun, "--allow-run-as-root", "-np", "2", sys.executable, PROBE])
    assert len(probes) == 2
    assert lines == expected("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")


def test_mpich() -> None:
    mpiexec = need("mpiexec.mpich")
    probes, lines = launch([mpiexec, "-np", "2", sys.executable, PROBE])
    assert len(probes) == 2
    assert lines == expected("MPI_LOCALRANKID", "MPI_LOCALNRANKS")


@pytest.fixture(scope="module")
def slurm() -> None:
    need("srun")
    if "SLURM_CONF" not in os.environ:
        if os.environ.get("NUMABIND_REQUIRE_LAUNCHERS") == "1":
            pytest.fail("SLURM_CONF is not set: scripts/test-launchers starts the local cluster")
        pytest.skip("no local Slurm cluster running (scripts/slurm-local start)")


def test_srun(slurm: None) -> None:
    probes, lines = launch(["srun", "-n2", sys.executable, PROBE])
    assert len(probes) == 2 and sorted(p["affinity"] for p in probes) == [[0], [1]], (
        "task/affinity pins"
    )
    assert lines == expected("SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE")


def test_srun_one_task_torchrun(slurm: None) -> None:
    torchrun = need("torchrun")
    probes, lines = launch(["srun", "-n1", torchrun, "--nproc-per-node", "2", PROBE])
    assert len(probes) == 2
    assert all(p["env"]["SLURM_LOCALID"] == "0" for p in probes), (
        "workers inherit the agent's task id"
    )
    agent = [line for line in lines if "launcher" in line]
    assert agent == [
        "numabind: torchrun is a launcher, not a rank: not bound (its workers bind themselves)"
    ]
    assert sorted(set(lines) - set(agent)) == expected("LOCAL_RANK", "LOCAL_WORLD_SIZE")


def test_sbatch_script_is_not_a_rank(slurm: None, tmp_path: Path) -> None:
    out = tmp_path / "batch.out"
    p = subprocess.run(
        ["sbatch", "--wait", "-n2", "-o", str(out), "--wrap", f"{sys.executable} {PROBE}"],
        capture_output=True,
        text=True,
        env=env(),
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    for _ in range(50):
        if out.exists() and "PROBE" in out.read_text():
            break
        time.sleep(0.1)
    text = out.read_text()
    probe = json.loads(next(line for line in text.splitlines() if line.startswith("PROBE "))[6:])
    assert probe["env"]["SLURM_LOCALID"] == "0" and "SLURM_STEP_ID" not in probe["env"]
    assert "numabind:" not in text, "a batch script is not a task"


def test_deepspeed(tmp_path: Path) -> None:
    deepspeed = need("deepspeed")
    probes, lines = launch([deepspeed, "--num_gpus", "2", PROBE], timeout=300)
    assert len(probes) == 2
    assert lines == expected("LOCAL_RANK", "LOCAL_SIZE")
