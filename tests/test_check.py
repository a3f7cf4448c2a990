"""numabind check's pieces on this machine (the VM tests run it on real multi-node processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numabind import _registry
from numabind._apply import Binding
from numabind._check import parse_policy
from numabind._model import Accelerator
from numabind._plan import Plan


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("7f00 default anon=3 N0=3", ("default", frozenset())),
        ("7f00 prefer:1 heap anon=3 N1=3", ("preferred", frozenset({1}))),
        ("7f00 bind:0-1 anon=3", ("bind", frozenset({0, 1}))),
        ("7f00 bind=static:1 anon=3", ("bind", frozenset({1}))),
        ("7f00 interleave:0,2 anon=3", ("interleave", frozenset({0, 2}))),
        ("7f00 prefer (many):0-1 anon=3", ("preferred-many", frozenset({0, 1}))),
        ("7f00 local anon=3", ("local", frozenset())),
    ],
)
def test_numa_maps_policy_field(line: str, expected: tuple[str, frozenset[int]]) -> None:
    assert parse_policy(line.split()) == expected


def _plan() -> Plan:
    dev = Accelerator("0000:41:00.0", "nvidia", numa_node=1)
    return Plan(
        1,
        "LOCAL_RANK",
        2,
        dev,
        1,
        1,
        frozenset({2, 3}),
        frozenset({1}),
        "preferred",
        "node",
        "bound",
        "GPU 1 is on node 1",
    )


def test_registry_round_trip_and_pruning(tmp_path: Path) -> None:
    path = _registry.register(Binding(_plan()), str(tmp_path))
    assert path == f"{tmp_path}/{os.getpid()}"
    entry = _registry.read(os.getpid(), str(tmp_path))
    assert entry is not None and entry["cpus"] == "2-3" and entry["device"] == "0000:41:00.0"
    assert _registry.registered_pids(str(tmp_path)) == [os.getpid()]
    # a dead or reused pid is stale: pruned on read
    (tmp_path / "999999").write_text("pid=999999\nstart=1\n")
    stale = tmp_path / str(os.getppid())
    stale.write_text(f"pid={os.getppid()}\nstart=not-its-start-time\n")
    assert _registry.registered_pids(str(tmp_path)) == [os.getpid()]
    assert not stale.exists() and not (tmp_path / "999999").exists()


def test_unbound_plans_are_not_registered(tmp_path: Path) -> None:
    skipped = Plan(
        0,
        "LOCAL_RANK",
        1,
        None,
        None,
        None,
        frozenset(),
        frozenset(),
        "none",
        "node",
        "skipped",
        "one node",
    )
    assert _registry.register(Binding(skipped), str(tmp_path)) is None


def run_check(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("NUMABIND", "LOCAL_"))}
    e.update(env)
    return subprocess.run(
        [sys.executable, "-m", "numabind", "check", *argv], capture_output=True, text=True, env=e
    )


def test_check_without_a_rank_says_so() -> None:
    p = run_check("--json")
    assert p.returncode == 1
    (proc,) = json.loads(p.stdout)["processes"]
    assert proc["status"] == "unknown" and "no local rank" in proc["problems"][0]


def test_check_one_node_rank_is_on_plan() -> None:
    p = run_check("--json", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")
    (proc,) = json.loads(p.stdout)["processes"]
    assert p.returncode == 0 and proc["ok"] and proc["status"] == "skipped"
    assert "one NUMA node" in proc["plan"]["reason"]


def test_check_missing_pid_exits_2() -> None:
    p = run_check("--pid", "999999")
    assert p.returncode == 2 and "no process 999999" in p.stdout


def test_check_all_runs() -> None:
    p = run_check("--all", "--json")
    assert p.returncode in (0, 1) and "processes" in json.loads(p.stdout)
