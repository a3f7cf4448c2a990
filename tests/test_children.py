"""Children that start bound: child_binding, numabind.spawn, numabind.torch.

On this one-node machine a generated two-node machine (node 0 = CPU 0, node 1 = CPU 1,
eight GPUs alternating between them) stands in through NUMABIND_SYSROOT, with memory
policy 'none' (there is no node 1 to put memory on here): what is tested is that each child
starts on its rank's CPUs, which the real kernel enforces.  Memory is proven in the VM.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import numabind
import synth
from numabind import _children
from support import two_cpus

HERE = Path(__file__).resolve().parent
pytestmark = two_cpus


@pytest.fixture
def two_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    root = synth.write(synth.two_nodes(gpus=8), str(tmp_path / "root"))
    monkeypatch.setenv("NUMABIND_SYSROOT", root)
    monkeypatch.setenv("NUMABIND_MEMORY", "none")
    monkeypatch.setenv("NUMABIND", "force")
    for var in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "CUDA_VISIBLE_DEVICES", "NUMABIND_VERBOSE"):
        monkeypatch.delenv(var, raising=False)
    _children._machine = None
    _children._plans.clear()
    yield root
    _children._machine = None
    _children._plans.clear()


def first_affinity() -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout)


def test_child_binding_binds_children_and_restores(two_nodes: str) -> None:
    before = os.sched_getaffinity(0)
    with numabind.child_binding(1) as plan:
        assert plan.bound and plan.cpus == {1}
        assert first_affinity() == [1]
    assert os.sched_getaffinity(0) == before
    with numabind.child_binding(0):
        assert first_affinity() == [0]
    assert first_affinity() == sorted(before)


def test_concurrent_starts_from_threads(two_nodes: str) -> None:
    """8 children started from 4 threads at once, 20 rounds: each on its own rank's CPU."""
    import multiprocessing
    from multiprocessing import resource_tracker

    errors: list[str] = []

    def starter(ranks: list[int]) -> None:
        for rank in ranks:
            with numabind.child_binding(rank, context=multiprocessing.get_context("spawn")):
                p = subprocess.run(
                    [
                        sys.executable,
                        "-S",
                        "-c",
                        "import os; print(sorted(os.sched_getaffinity(0)))",
                    ],
                    capture_output=True,
                    text=True,
                )
            got = json.loads(p.stdout)
            if got != [rank % 2]:
                errors.append(f"rank {rank}: {got}")

    for _ in range(20):
        threads = [threading.Thread(target=starter, args=([2 * t, 2 * t + 1],)) for t in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert errors == []
    tracker = resource_tracker._resource_tracker._pid  # type: ignore[attr-defined]
    assert tracker is not None, "child_binding starts the resource tracker first"
    status = Path(f"/proc/{tracker}/status").read_text()
    mask = status.split("Cpus_allowed_list:")[1].split()[0]
    assert mask == "0-1", "the resource tracker must not catch a rank's binding"


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_spawn_children_start_bound(two_nodes: str, tmp_path: Path, method: str) -> None:
    import children_helpers

    numabind.spawn(children_helpers.report, 4, args=(str(tmp_path),), start_method=method)
    results = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(4)]
    for i, r in enumerate(results):
        assert r["now"] == [i % 2] and r["local_rank"] == str(i)
        if method == "spawn":
            assert r["first"] == [i % 2], "bound before the child's first import"


def test_spawn_forkserver_binds_inside_child(
    two_nodes: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import children_helpers

    _children._said_forkserver = False
    numabind.spawn(children_helpers.report, 2, args=(str(tmp_path),), start_method="forkserver")
    results = [json.loads((tmp_path / f"{i}.json").read_text()) for i in range(2)]
    assert [r["now"] for r in results] == [[0], [1]]
    assert capfd.readouterr().err.count("forkserver start method") == 1


def test_spawn_reports_failures(two_nodes: str) -> None:
    import children_helpers

    with pytest.raises(ChildProcessError, match=r"rank 1 \(exit 3\)"):
        numabind.spawn(children_helpers.fail, 2)


RUN_TORCH = r"""
import json, os, sys
sys.path.insert(0, %(tests)r)
import children_helpers
if __name__ == "__main__":
    import numabind.torch
    if %(install)r:
        numabind.torch.install()
    import torch.multiprocessing as mp
    mp.spawn(children_helpers.report, nprocs=2, args=(%(out)r + "/spawn",))
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=2, run_id="numabind-test",
                       rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
                       monitor_interval=0.1, start_method=%(method)r)
    launch = elastic_launch(cfg, children_helpers.report_elastic)
    print("RESULT", json.dumps(launch(%(out)r + "/elastic")))
"""


@pytest.mark.torch
@pytest.mark.parametrize(
    ("method", "install"), [("spawn", True), ("spawn", False), ("forkserver", True)]
)
def test_torch_spawn_and_elastic_children(
    two_nodes: str, tmp_path: Path, method: str, install: bool
) -> None:
    pytest.importorskip("torch")
    (tmp_path / "spawn").mkdir()
    (tmp_path / "elastic").mkdir()
    script = tmp_path / "run.py"
    script.write_text(
        RUN_TORCH % {"tests": str(HERE), "out": str(tmp_path), "method": method, "install": install}
    )
    env = dict(os.environ)
    if not install:
        env["NUMABIND_TORCH"] = "1"  # the startup hook installs it when torch is imported
    p = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    for kind in ("spawn", "elastic"):
        results = [json.loads((tmp_path / kind / f"{i}.json").read_text()) for i in range(2)]
        assert [r["now"] for r in results] == [[0], [1]], (kind, results)
        if method != "forkserver":
            assert [r["first"] for r in results] == [[0], [1]], (
                f"{kind}: bound before the child's imports"
            )


@pytest.mark.torch
def test_torch_internals_change_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    import importlib

    import numabind.torch as nt

    spawn_mod = importlib.import_module(
        "torch.multiprocessing.spawn"
    )  # the module, not the function

    monkeypatch.setattr(spawn_mod, "_wrap", lambda fn, rank, args, error_file: None)
    with pytest.raises(nt.TorchIntegrationError, match=r"spawn._wrap now takes \['fn', 'rank'"):
        nt.install()
