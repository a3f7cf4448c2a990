"""numabind check's pieces on this machine (the VM tests run it on real multi-node processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from numabind import _registry
from numabind._apply import Binding
from numabind._bind import bind, entry_of
from numabind._check import parse_policy
from numabind._model import Accelerator
from numabind._plan import Plan
from support import clean_env


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
    dev = Accelerator(pci="0000:41:00.0", vendor="nvidia", numa_node=1)
    return Plan(
        local_rank=1,
        rank_source="LOCAL_RANK",
        local_world_size=2,
        device=dev,
        device_index=1,
        numa_node=1,
        cpus=frozenset({2, 3}),
        memory_nodes=frozenset({1}),
        memory_policy="preferred",
        status="bound",
        reason="GPU 1 is on node 1",
    )


def test_registry_round_trip_and_pruning(tmp_path: Path) -> None:
    env = {"NUMABIND_REGISTRY": str(tmp_path)}
    path, why = _registry.register(entry_of(Binding(_plan())), env)
    me = os.getpid()
    assert why is None and path == f"{tmp_path}/numabind-{os.geteuid()}/{me}"
    d = tmp_path / f"numabind-{os.geteuid()}"
    assert d.stat().st_mode & 0o777 == 0o700, "a private per-user directory"
    assert oct((d / str(me)).stat().st_mode & 0o777) == "0o600"
    entry = _registry.read(me, env)
    assert entry is not None and entry["cpus"] == "2-3" and entry["device"] == "0000:41:00.0"
    assert _registry.registered_pids(env) == [me]
    # a dead or reused pid is stale: pruned on read, and counted
    (d / "999999").write_text("pid=999999\nstart=1\n")
    stale = d / str(os.getppid())
    stale.write_text(f"pid={os.getppid()}\nstart=12\n")  # not its start time: pid reused
    scan = _registry.scan(env, all_users=True)
    assert list(scan.entries) == [me]
    assert not stale.exists() and not (d / "999999").exists()
    assert scan.ignored.get("stale", 0) + scan.ignored.get("malformed", 0) == 2
    _registry.unregister()
    assert not (d / str(me)).exists(), "removed when the binding goes"


def test_unbound_plans_are_not_registered(tmp_path: Path) -> None:
    skipped = Plan(local_rank=0, rank_source="LOCAL_RANK", reason="one node")
    b = bind(skipped, None, environ={"NUMABIND_REGISTRY": str(tmp_path)})
    assert b.registered is None and not (tmp_path / f"numabind-{os.geteuid()}").exists()


def run_check(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = clean_env(**env)
    return subprocess.run(
        [sys.executable, "-m", "numabind", "check", *argv], capture_output=True, text=True, env=e
    )


def test_check_without_a_rank_says_what_to_give() -> None:
    p = run_check("--json")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.count("\n") == 1 and "--pid" in p.stderr and "--all" in p.stderr


def test_check_one_node_rank_is_on_plan() -> None:
    p = run_check("--json", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")
    (proc,) = json.loads(p.stdout)["processes"]
    assert p.returncode == 0 and proc["ok"] and proc["status"] == "skipped"
    assert "one NUMA node" in proc["plan"]["reason"]


def test_check_vanished_pid_exits_3() -> None:
    p = run_check("--pid", "999999")
    assert p.returncode == 3 and "no process 999999" in p.stdout


def test_check_zombie_is_vanished_not_ok() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 30
    while _registry.process_state(child.pid) != "Z" and time.time() < deadline:
        time.sleep(0.05)
    try:
        p = run_check("--pid", str(child.pid), "--json")
        assert p.returncode == 3, p.stdout
        data = json.loads(p.stdout)
        assert data["vanished"] == [child.pid] and not data["ok"]
    finally:
        child.wait()


@pytest.mark.parametrize("argv", [["--pid", "abc"], ["--pid", "-5"], ["--pid", "0"], ["--bogus"]])
def test_check_bad_arguments_exit_2_with_one_line(argv: list[str]) -> None:
    p = run_check(*argv)
    assert p.returncode == 2 and p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert "Traceback" not in p.stderr


def test_check_all_runs() -> None:
    p = run_check("--all", "--json")
    assert p.returncode in (0, 1) and "processes" in json.loads(p.stdout)
