"""numabind check's pieces on this machine (the VM tests run it on real multi-node processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from numabind import _kernel, _registry
from numabind._apply import Binding, enter
from numabind._environ import Config
from numabind._model import Accelerator, parse_numa_maps_policy
from numabind._plan import Plan
from numabind._sysfs import parse_nodelist
from support import check_status, clean_env, two_cpus


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
    name, nodes = parse_numa_maps_policy(line.split())
    assert (name, parse_nodelist(nodes)) == expected


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
    path, why = _registry.register(Binding(_plan()).entry(), env)
    me = os.getpid()
    assert why is None and path == f"{tmp_path}/numabind-{os.geteuid()}/{me}"
    d = tmp_path / f"numabind-{os.geteuid()}"
    assert d.stat().st_mode & 0o777 == 0o700, "a private per-user directory"
    assert oct((d / str(me)).stat().st_mode & 0o777) == "0o600"
    entry = _registry.read(me, env)
    assert entry is not None and entry.cpus == {2, 3} and entry.device == "0000:41:00.0"
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


@two_cpus
def test_check_names_pages_left_remote(two: str, tmp_path: Path) -> None:
    """Rank 1's plan puts its memory on node 1, which this kernel does not have: every
    page it has is on node 0, and check says so (not only that the policy differs)."""
    rank = _rank(two, tmp_path, 1, "preferred")
    try:
        status, found = _verdicts(two, tmp_path, [rank])
        problems = found[rank.pid]["problems"]
        assert status == 1
        assert any(p.startswith("pages left remote: 0.0% on node(s) 1") for p in problems), problems  # type: ignore[attr-defined]
    finally:
        rank.kill()
        rank.wait()


def test_a_linked_entry_is_never_followed(tmp_path: Path) -> None:
    """An entry replaced by a link to a valid entry of the same process: the reader opens
    entries with O_NOFOLLOW, so it is ignored as special, not trusted."""
    env = {"NUMABIND_REGISTRY": str(tmp_path)}
    path, why = _registry.register(Binding(_plan()).entry(), env)
    assert path is not None, why
    try:
        real = Path(path)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.write_bytes(real.read_bytes())
        real.unlink()
        real.symlink_to(elsewhere)
        scan = _registry.scan(env, all_users=True)
        assert scan.entries == {} and scan.ignored == {"special": 1}, scan.ignored
        assert _registry.read(os.getpid(), env) is None
    finally:
        _registry.unregister()


def test_unbound_plans_are_not_registered(tmp_path: Path) -> None:
    skipped = Plan(local_rank=0, rank_source="LOCAL_RANK", reason="one node")
    env = {"NUMABIND_REGISTRY": str(tmp_path)}
    b = enter(skipped, None, Config.from_env(env), environ=env, report=False)
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
    while _kernel.process_state(child.pid) != "Z" and time.time() < deadline:
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


RANK_CHILD = """
import sys
print("ready", flush=True)
for line in sys.stdin:
    from numabind import _kernel
    policy, *nodes = line.split()
    _kernel.set_mempolicy(policy, {int(n) for n in nodes})
    print("done", flush=True)
"""


def _rank(two: str, registry: Path, rank: int, memory: str) -> subprocess.Popen[str]:
    """A rank the startup hook binds on the generated two-node machine, registered in
    ``registry``; it sets its own memory policy to each word it reads on stdin."""
    env = clean_env(
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
        NUMABIND_SYSROOT=two,
        NUMABIND_REGISTRY=str(registry),
        NUMABIND_MEMORY=memory,
        NUMABIND="force",
    )
    child = subprocess.Popen(
        [sys.executable, "-c", RANK_CHILD],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def _verdicts(
    two: str, registry: Path, mine: list[subprocess.Popen[str]]
) -> tuple[int, dict[int, dict[str, object]]]:
    """check --all's status for this test's own ranks (other ranks on a shared host are
    judged too; the real status must agree with all the records it printed)."""
    p = run_check("--all", "--json", NUMABIND_SYSROOT=two, NUMABIND_REGISTRY=str(registry))
    data = json.loads(p.stdout)
    assert p.returncode == check_status(data["processes"]), data["processes"]
    found = {d["pid"]: d for d in data["processes"]}
    return check_status([found[c.pid] for c in mine]), found


@two_cpus
def test_check_all_tells_on_plan_from_off_plan(two: str, tmp_path: Path) -> None:
    """Two registered ranks on their plans: exit 0.  One moved off its CPUs, or its memory
    policy changed to default: exit 1, that process named, the other still on plan."""
    ranks = [_rank(two, tmp_path, 0, "preferred"), _rank(two, tmp_path, 1, "none")]
    try:
        status, found = _verdicts(two, tmp_path, ranks)
        assert status == 0, found
        for child in ranks:
            assert found[child.pid]["ok"] and found[child.pid]["status"] == "bound"
        os.sched_setaffinity(ranks[1].pid, {0})  # rank 1's plan is CPU 1
        status, found = _verdicts(two, tmp_path, ranks)
        assert status == 1 and not found[ranks[1].pid]["ok"] and found[ranks[0].pid]["ok"]
        assert any("CPU" in p for p in found[ranks[1].pid]["problems"])  # type: ignore[attr-defined]
        os.sched_setaffinity(ranks[1].pid, {1})
        assert _verdicts(two, tmp_path, ranks)[0] == 0
        assert ranks[0].stdin is not None and ranks[0].stdout is not None
        for line, seen in (("default", "default"), ("bind 0", "bind")):
            ranks[0].stdin.write(line + "\n")  # another policy, or the same nodes bound
            ranks[0].stdin.flush()
            assert ranks[0].stdout.readline().strip() == "done"
            status, found = _verdicts(two, tmp_path, ranks)
            assert status == 1 and not found[ranks[0].pid]["ok"], found[ranks[0].pid]
            policy = found[ranks[0].pid]["memory_policy"]
            assert policy == {"policy": seen, "nodes": [] if seen == "default" else [0]}
            problems = found[ranks[0].pid]["problems"]
            assert any(f"memory policy is {seen}" in p for p in problems), problems  # type: ignore[attr-defined]
    finally:
        for child in ranks:
            child.kill()
            child.wait()


def test_shared_pages_move_pages_cannot_see_are_placed_from_numa_maps() -> None:
    """NUMA balancing unmaps pages for hinting faults and move_pages answers EFAULT for
    them (Linux 6.1, measured in the VM): those must still count as shared, on the nodes
    numa_maps gives their region, not turn into "own pages left remote"."""
    from numabind._kernel import Region
    from numabind.check._inspect import _apportion, _place_shared

    page = 4096
    a = Region(
        start=0x10000000,
        end=0x10000000 + 100 * page,
        name="[anon]",
        page_size=page,
        pages={0: 100},
        mapmax=2,
    )
    b = Region(
        start=0x20000000,
        end=0x20000000 + 50 * page,
        name="[anon]",
        page_size=page,
        pages={0: 10, 1: 40},
        mapmax=2,
    )
    addrs = [a.start + i * page for i in range(100)] + [b.start + i * page for i in range(20)]
    where = [0] * 10 + [-14] * 90 + [1] * 5 + [-14] * 15
    out = _place_shared([b, a], addrs, where)
    # a: 10 seen on node 0 + 90 unseen, all of the region on node 0; b: 5 seen on node 1,
    # 15 unseen split over b's other pages (node 0: 10, node 1: 35) -> 3 and 12
    assert out.nodes == {0: 103, 1: 17} and out.pages == 120
    assert "105 pages placed from numa_maps" in out.how
    whole = _place_shared([a], addrs[:100], [0] * 100)
    assert (whole.nodes, whole.how) == ({0: 100}, "pagemap")
    assert _apportion(7, {0: 10, 1: 10}) in ({0: 4, 1: 3}, {0: 3, 1: 4})
    assert _apportion(9, {0: 2}) == {0: 2}  # never more than numa_maps counts
    assert _apportion(3, {}) == {}


def test_fork_child_shared_pages_found_on_a_real_process() -> None:
    """pagemap's exclusive bit on this machine's kernel: a child's inherited 20 MB buffer is
    reported shared (and where), its own 8 MB is not."""
    from numabind._kernel import pages_per_node, private_anon_regions
    from numabind.check._inspect import _shared

    code = (
        "import os, sys\n"
        "buf = b'\\x01' * (20 << 20)\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    own = b'\\x02' * (8 << 20)\n"
        "    print(os.getpid(), flush=True)\n"
        "    os.read(r, 1)\n"
        "    os._exit(0)\n"
        "sys.stdin.read()\n"
        "os.write(w, b'x')\n"
        "os.waitpid(pid, 0)\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert p.stdout is not None
        child = int(p.stdout.readline())
        regions = private_anon_regions(child)
        shared = _shared(child, regions)
        total = sum(pages_per_node(regions).values())
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=30)
    assert shared.how.startswith("pagemap"), shared
    count = sum(shared.nodes.values())
    assert 5120 <= count < total - 2048, (count, total)  # the buffer, not the child's own
