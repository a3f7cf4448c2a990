"""Core roles: NUMABIND_RESERVE keeps cores out of every rank's compute set for helpers,
NUMABIND_SMT=1 keeps one hardware thread per core.  Checked against an oracle written
from the documented rule (not from the planner's code) on generated machines and on the
shipped captures of real machines, read through the same reader as a live system."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import synth
from numabind import ConfigError, plan_for
from numabind._devices import resolve
from numabind._environ import Config, parse_reserve
from numabind._model import MODE_NAMES
from numabind._plan import Plan, Request, plan
from numabind._registry import Entry
from numabind._topology import Machine
from numabind.cli._show import plans_for
from support import check_status, clean_env, rank0_env, two_core_nodes, two_cpus

MakeMachine = Callable[[synth.Spec], Machine]
DATA = Path(__file__).parent / "data" / "hwloc"


def _plans(
    m: Machine, size: int, mode: str = "node", reserve: str = "", smt: str = "all"
) -> list[Plan]:
    visible = resolve(m, {})
    return [
        plan(
            m,
            Request(
                local_rank=r,
                local_world_size=size,
                rank_source="LOCAL_RANK",
                visible=visible,
                mode=mode,
                reserve=parse_reserve(reserve),
                smt=smt,
            ),
        )
        for r in range(size)
    ]


def _cores(m: Machine, cpus: frozenset[int]) -> list[frozenset[int]]:
    """The physical cores of ``cpus`` in order, each a set of hardware threads (oracle:
    from the machine's sibling lists, one CPU at a time)."""
    seen: dict[frozenset[int], None] = {}
    for c in sorted(cpus):
        seen.setdefault(frozenset(m.siblings_of(c) | {c}), None)
    return list(seen)


def oracle_reserved(m: Machine, node: int, per_node: int) -> frozenset[int]:
    """The documented rule: ``per_node`` cores of the node, from the end of its core list;
    cores the cgroup leaves out entirely count towards it; a reservation that would leave
    no core is dropped (empty)."""
    found = m.node(node)
    assert found is not None
    allowed = m.allowed.cpus
    cores = _cores(m, found.cpus)
    usable = [c & allowed for c in cores if c & allowed]
    need = per_node - (len(cores) - len(usable))
    if need <= 0 or need >= len(usable):
        return frozenset()
    return frozenset().union(*usable[len(usable) - need :])


# --- the knob ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "canonical"),
    [
        ("2", "2/node"),
        (" 2/NODE ", "2/node"),
        ("1/rank", "1/rank"),
        ("0", ""),
        ("0/rank", ""),
        ("", ""),
        ("off", ""),
        ("none", ""),
    ],
)
def test_reserve_values(raw: str, canonical: str) -> None:
    assert str(parse_reserve(raw)) == canonical
    assert str(Config.from_env({"NUMABIND_RESERVE": raw}).reserve) == canonical
    assert bool(parse_reserve(raw)) == bool(canonical), "no reservation is false"


@pytest.mark.parametrize(
    "raw", ["-1", "2/socket", "x", "1/", "99999", "4097", "1.5", "２", "1/node/rank", "\x1b[2J"]
)
def test_bad_reserve_is_a_binding_error_naming_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError) as err:
        Config.from_env({"NUMABIND_RESERVE": raw})
    text = str(err.value)
    assert text.startswith("NUMABIND_RESERVE=") and "n/rank" in text
    assert "\x1b" not in text and "\n" not in text


def test_smt_values() -> None:
    assert Config.from_env({}).smt == "all"
    assert Config.from_env({"NUMABIND_SMT": "1"}).smt == "1"
    with pytest.raises(ConfigError, match="NUMABIND_SMT='2'"):
        Config.from_env({"NUMABIND_SMT": "2"})


def test_api_arguments_are_checked(dgx_root: str) -> None:
    m = Machine.from_root(dgx_root)
    with pytest.raises(TypeError):
        plan_for(0, machine=m, environ={}, reserve=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        plan_for(0, machine=m, environ={}, reserve="1/core")
    with pytest.raises(ConfigError):
        plan_for(0, machine=m, environ={}, smt=2)
    p = plan_for(0, machine=m, environ={}, local_world_size=8, reserve=2, smt=1)
    assert str(p.reserve) == "2/node" and p.smt == "1"
    # keywords win over the environment; reserve=0 means none even when the variable says 2
    env = {"NUMABIND_RESERVE": "2", "NUMABIND_SMT": "1"}
    assert plan_for(0, machine=m, environ=env).helpers
    assert not plan_for(0, machine=m, environ=env, reserve=0).helpers
    assert plan_for(0, machine=m, environ=env, smt="all").smt == "all"


# --- the plan on a real-sized machine --------------------------------------------------------


def test_dgx_reserve_per_node_takes_the_last_cores_with_siblings(dgx_root: str) -> None:
    m = Machine.from_root(dgx_root)
    base = _plans(m, 8)
    plans = _plans(m, 8, reserve="2/node")
    for p, p0 in zip(plans, base):
        assert p.bound and p0.bound
        node = m.node(p.numa_node or 0)
        assert node is not None
        # node 0: CPUs 0-55 + 112-167; the last two cores are 54,55 and their siblings
        want = (
            frozenset({54, 55, 166, 167}) if p.numa_node == 0 else frozenset({110, 111, 222, 223})
        )
        assert p.helpers == want
        assert p.cpus == p0.cpus - want
        assert p.threads == (len(p.cpus) // 2) // 4  # 54 cores for 4 ranks: 13 each
        assert any("reserved CPUs" in n for n in p.notes)


def test_dgx_reserve_per_rank_gives_each_rank_its_own_helper_core(dgx_root: str) -> None:
    m = Machine.from_root(dgx_root)
    plans = _plans(m, 8, mode="exclusive", reserve="1/rank")
    on0 = [p for p in plans if p.numa_node == 0]
    assert len(on0) == 4
    reserved = frozenset({52, 53, 54, 55, 164, 165, 166, 167})
    helpers = [p.helpers for p in on0]
    assert frozenset().union(*helpers) == reserved
    assert all(len(h) == 2 for h in helpers)  # one core, both threads
    assert len(set(helpers)) == 4  # disjoint: one each
    computes = [p.cpus for p in on0]
    assert sum(len(c) for c in computes) == len(frozenset().union(*computes))
    assert not frozenset().union(*computes) & reserved


def test_dgx_smt1_one_thread_per_core_and_budget(dgx_root: str) -> None:
    m = Machine.from_root(dgx_root)
    for p_all, p1 in zip(_plans(m, 8), _plans(m, 8, smt="1")):
        assert p1.cpus <= p_all.cpus
        assert len(p1.cpus) == len(p_all.cpus) // 2
        assert all(not (m.siblings_of(c) - {c}) & p1.cpus for c in p1.cpus)
        assert p1.threads == p_all.threads == 56 // 4


def test_reservation_that_leaves_no_core_is_dropped_with_one_line(dgx_root: str) -> None:
    m = Machine.from_root(dgx_root)
    for p0, p in zip(_plans(m, 8), _plans(m, 8, reserve="56")):
        assert p.bound and p.cpus == p0.cpus and not p.helpers
        lines = [n for n in p.notes if "no cores reserved" in n]
        assert len(lines) == 1 and "56/node" in lines[0]
    # 14 per rank times 4 ranks on a node is its 56 cores: dropped too
    assert not any(p.helpers for p in _plans(m, 8, reserve="14/rank"))
    assert all(p.helpers for p in _plans(m, 8, reserve="13/rank"))


def test_cores_the_cgroup_leaves_out_count_towards_the_reservation(
    synth_machine: MakeMachine,
) -> None:
    # node 0 = cores 0..3 (no SMT); the cgroup leaves core 3 out: the system already has it
    spec = synth.Spec(
        nodes=[[0, 1, 2, 3], [4, 5, 6, 7]],
        package_of_node=[0, 1],
        gpus=[synth.Gpu("0000:01:00.0", 0), synth.Gpu("0000:02:00.0", 1)],
        cgroup_cpus=[0, 1, 2, 4, 5, 6, 7],
        memory_gib=1,
    )
    m = synth_machine(spec)
    one = _plans(m, 2, reserve="1")
    assert one[0].cpus == frozenset({0, 1, 2}) and not one[0].helpers
    assert one[1].cpus == frozenset({4, 5, 6}) and one[1].helpers == frozenset({7})
    two = _plans(m, 2, reserve="2")
    assert two[0].cpus == frozenset({0, 1}) and two[0].helpers == frozenset({2})


def test_socket_mode_reserves_on_every_node_of_the_package(synth_machine: MakeMachine) -> None:
    spec = synth.Spec(
        nodes=[[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]],
        package_of_node=[0, 0, 1, 1],
        gpus=[synth.Gpu("0000:01:00.0", 0), synth.Gpu("0000:02:00.0", 2)],
        memory_gib=1,
    )
    m = synth_machine(spec)
    p0, p1 = _plans(m, 2, mode="socket", reserve="1")
    assert p0.cpus == frozenset({0, 1, 3, 4}) and p0.helpers == frozenset({2, 5})
    assert p1.cpus == frozenset({6, 7, 9, 10}) and p1.helpers == frozenset({8, 11})


def test_locality_only_device_says_no_reservation(synth_machine: MakeMachine) -> None:
    spec = synth.Spec(
        nodes=[[0, 1], [2, 3], [4, 5]],
        package_of_node=[0, 1, 2],
        gpus=[synth.Gpu("0000:01:00.0", -1, local_cpus=[0, 1, 2, 3])],
        memory_gib=1,
    )
    m = synth_machine(spec)
    (p,) = _plans(m, 1, reserve="1")
    assert p.bound and p.numa_node is None, p.reason  # its CPUs span nodes 0 and 1
    assert p.cpus == frozenset({0, 1, 2, 3})
    assert any("a reservation needs the device's node" in n for n in p.notes)
    assert not p.helpers


# --- every machine, mode, rank count, reservation and SMT level ------------------------------


@st.composite
def machines(draw: st.DrawFn) -> synth.Spec:
    nnodes = draw(st.integers(1, 4))
    cores = draw(st.integers(1, 6))
    smt = draw(st.sampled_from([1, 2]))
    total = nnodes * cores
    nodes = [
        list(range(n * cores, (n + 1) * cores))
        + ([c + total for c in range(n * cores, (n + 1) * cores)] if smt == 2 else [])
        for n in range(nnodes)
    ]
    gpus = [
        synth.Gpu(f"0000:{i + 1:02x}:00.0", draw(st.integers(0, nnodes - 1)))
        for i in range(draw(st.integers(1, 4)))
    ]
    every = sorted(c for n in nodes for c in n)
    allowed = draw(st.one_of(st.just(every), st.sets(st.sampled_from(every), min_size=1)))
    return synth.Spec(
        nodes=nodes,
        package_of_node=[n // 2 for n in range(nnodes)],
        smt=smt,
        smt_stride=total,
        gpus=gpus,
        cgroup_cpus=sorted(allowed),
        memory_gib=1,
    )


def _check_roles(m: Machine, size: int, mode: str, n: int, scope: str, smt: str) -> None:
    reserve = f"{n}/{scope}" if n else ""
    base = _plans(m, size, mode=mode)
    plans = _plans(m, size, mode=mode, reserve=reserve, smt=smt)
    for r, (p0, p) in enumerate(zip(base, plans)):
        assert p.bound == p0.bound, (r, p.reason, p0.reason)
        if not p.bound:
            continue
        assert p.cpus, (r, p.notes)
        assert p.cpus <= m.allowed.cpus
        if p.numa_node is None:
            continue
        nodes = {p.numa_node}
        if mode == "socket":
            home = m.package_of(min(m.node(p.numa_node).cpus))  # type: ignore[union-attr]
            nodes = {x.id for x in m.cpu_nodes if m.package_of(min(x.cpus)) == home}
        # on the GPU's node (its package in socket mode), never on a reserved core
        assert {m.node_of_cpu(c) for c in p.cpus} <= nodes
        # the ranks on this node, as far as a rank can know them: with one visible device
        # per rank it cannot see the others' devices, and counts itself alone
        ndev = len(resolve(m, {}).devices)
        sharers = 1 if ndev == 1 and size > 1 else sum(q.numa_node == p.numa_node for q in plans)
        per_node = n * sharers if scope == "rank" else n
        dropped = any("no cores reserved" in x for x in p.notes)
        if n and scope == "node" and not dropped:
            reserved = frozenset().union(*(oracle_reserved(m, x, per_node) for x in nodes))
            assert not p.cpus & reserved, (r, sorted(p.cpus), sorted(reserved))
            assert p.helpers == reserved
            if mode == "node" and smt == "all":
                assert p.cpus == p0.cpus - reserved
        if n and scope == "rank" and not dropped and mode != "socket":
            reserved = oracle_reserved(m, p.numa_node, per_node)
            assert not p.cpus & reserved
            assert p.helpers <= reserved
        if not n:
            assert not p.helpers
        # SMT level: one hardware thread per core, and the same cores as with all of them
        if smt == "1":
            assert all(not (m.siblings_of(c) - {c}) & p.cpus for c in p.cpus)
        # the budget's documented formula: physical cores over the ranks sharing them
        if mode == "node" and p.threads is not None:
            cores = len(p.cpus) if smt == "1" else len(p.cpus) // max(m.smt, 1)
            assert p.threads == max(1, cores // sharers), (r, p.threads, cores)
    if mode == "exclusive":
        _disjoint(plans)


def _disjoint(plans: list[Plan]) -> None:
    """Exclusive mode: ranks on one node get disjoint compute sets (or, when the node has
    too few cores, the same shared set)."""
    for a in plans:
        for b in plans:
            if a is b or not (a.bound and b.bound) or a.numa_node != b.numa_node:
                continue
            if a.cpus != b.cpus:
                assert not a.cpus & b.cpus


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    spec=machines(),
    mode=st.sampled_from(MODE_NAMES),
    size=st.integers(1, 6),
    n=st.integers(0, 3),
    scope=st.sampled_from(["node", "rank"]),
    smt=st.sampled_from(["all", "1"]),
)
def test_roles_on_generated_machines(
    tmp_path_factory: pytest.TempPathFactory,
    spec: synth.Spec,
    mode: str,
    size: int,
    n: int,
    scope: str,
    smt: str,
) -> None:
    root = tmp_path_factory.mktemp("roles")
    synth.write(spec, str(root))
    _check_roles(Machine.from_root(str(root)), size, mode, n, scope, smt)


CAPTURES = sorted(
    p.name for p in DATA.iterdir() if p.suffix in (".xml", ".bz2") and "console" not in p.name
)


@pytest.mark.parametrize("name", CAPTURES)
def test_roles_on_real_captures(name: str) -> None:
    m = Machine.from_capture(str(DATA / name))
    try:
        for mode in MODE_NAMES:
            for n, scope, smt in ((1, "node", "all"), (2, "node", "1"), (1, "rank", "all")):
                _check_roles(m, 4, mode, n, scope, smt)
        # show plans with the reservation too (the CLI's path)
        _, plans, _ = plans_for(m, {}, 4, "node", "preferred", parse_reserve("1/node"), "1")
        assert all(str(p.reserve) == "1/node" and p.smt == "1" for p in plans)
    finally:
        m.close()


# --- the registry and check --------------------------------------------------------------------

HELPER_RANK = """
import os, sys, threading, time
import numabind
b = numabind._startup.last
ready = threading.Event()
def helper():
    os.sched_setaffinity(0, {1})  # a helper thread on the reserved core
    ready.set()
    time.sleep(600)
threading.Thread(target=helper, daemon=True, name="helper").start()
ready.wait()
print(sorted(b.plan.cpus), sorted(b.plan.helpers), flush=True)
for line in sys.stdin:
    os.sched_setaffinity(0, {int(line)})
    print("done", flush=True)
"""


def test_registry_entry_carries_the_helper_set() -> None:
    e = Entry(pid=123, start="456", cpus=frozenset({0, 1}), helpers=frozenset({6, 7}))
    back = Entry.parse(e.encode())
    assert back is not None and back.helpers == frozenset({6, 7})
    bad = e.encode().replace(b"helpers=6-7", b"helpers=6-x")
    assert Entry.parse(bad) is None


@two_cpus
def test_check_counts_a_helper_thread_on_the_reserved_core_as_on_plan(
    synth_machine: MakeMachine, tmp_path: Path
) -> None:
    """A real rank bound by the startup hook with NUMABIND_RESERVE=1 on a machine whose node
    0 is CPUs 0-1: compute CPU 0, helper CPU 1.  A helper thread on CPU 1 is on plan; the
    main thread there is not."""
    root = two_core_nodes(str(tmp_path / "m"))
    env = rank0_env(root, NUMABIND_REGISTRY=str(tmp_path), NUMABIND_RESERVE="1")
    child = subprocess.Popen(
        [sys.executable, "-c", HELPER_RANK],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().split("] [") == ["[0", "1]\n"]

        def verdict() -> dict[str, object]:
            out = subprocess.run(
                [sys.executable, "-m", "numabind", "check", "--all", "--json"],
                env=clean_env(NUMABIND_SYSROOT=root, NUMABIND_REGISTRY=str(tmp_path)),
                capture_output=True,
                text=True,
                timeout=120,
            )
            records = json.loads(out.stdout)["processes"]
            assert out.returncode == check_status(records), records  # other ranks may be here
            found = {d["pid"]: d for d in records}
            return dict(found[child.pid], exit=check_status([found[child.pid]]))

        first = verdict()
        assert first["ok"] and first["exit"] == 0, first
        assert first["plan"]["helpers"] == [1]  # type: ignore[index]
        child.stdin.write("1\n")  # the main thread onto the helper core: off plan
        child.stdin.flush()
        assert child.stdout.readline().strip() == "done"
        second = verdict()
        assert not second["ok"] and second["exit"] == 1, second
        assert any("left the plan" in p and "OFF PLAN" in p for p in second["problems"])  # type: ignore[attr-defined]
    finally:
        child.kill()
        child.wait()


# --- OpenMP places, helper processes, roles ----------------------------------------------------


def test_omp_places_set_only_where_nothing_is_set() -> None:
    from numabind._threads import apply_places

    env: dict[str, str] = {}
    got = apply_places("cores", env)
    assert env == {"OMP_PLACES": "cores", "OMP_PROC_BIND": "close"}
    assert got.set == (("OMP_PLACES", "cores"), ("OMP_PROC_BIND", "close"))
    for name in ("OMP_PLACES", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY", "KMP_AFFINITY"):
        mine = {name: "0-3"}
        kept = apply_places("threads", mine)
        assert mine == {name: "0-3"} and kept.kept == ((name, "0-3"),) and not kept.set
    assert Config.from_env({}).omp_places == "off"
    with pytest.raises(ConfigError, match="NUMABIND_OMP_PLACES"):
        Config.from_env({"NUMABIND_OMP_PLACES": "sockets"})


def test_registry_keeps_the_openmp_words_and_nothing_else() -> None:
    e = Entry(pid=1, start="2", thread_env=(("OMP_PLACES", "cores"), ("OMP_PROC_BIND", "close")))
    back = Entry.parse(e.encode())
    assert back is not None and dict(back.thread_env)["OMP_PLACES"] == "cores"
    forged = e.encode().replace(b"OMP_PROC_BIND:close", b"OMP_PROC_BIND:spread\x1b[2J")
    assert Entry.parse(forged) is None


def test_worker_cpus_share_spread_reserved() -> None:
    from numabind._plan import worker_cpus

    siblings = {c: frozenset({c, c + 8}) for c in range(8)} | {
        c: frozenset({c - 8, c}) for c in range(8, 16)
    }
    p = Plan(
        local_rank=0,
        status="bound",
        cpus=frozenset({0, 1, 2, 8, 9, 10}),
        helpers=frozenset({3, 11}),
    )
    assert worker_cpus(p, "share", 1, 4, siblings.__getitem__) == (p.cpus, None)
    spread = [worker_cpus(p, "spread", w, 2, siblings.__getitem__)[0] for w in range(2)]
    assert spread == [frozenset({0, 1, 8, 9}), frozenset({2, 10})]  # whole cores, disjoint
    many = [worker_cpus(p, "spread", w, 5, siblings.__getitem__)[0] for w in range(5)]
    assert many[3] == many[0] == frozenset({0, 8}) and many[4] == frozenset({1, 9})
    assert worker_cpus(p, "reserved", 0, 2, siblings.__getitem__) == (p.helpers, None)
    cpus, note = worker_cpus(p.replace(helpers=frozenset()), "reserved", 0, 2, frozenset)
    assert cpus == p.cpus and note is not None and "NUMABIND_RESERVE" in note


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("pt_data_worker", "dataloader worker"),
        ("pt_data_pin", "pin"),
        ("pt_nccl_watchdg", "nccl"),
        ("NCCL Progress", "nccl"),
        ("pt_autograd_0", "torch"),
        ("python3", "other"),
        ("", "other"),
    ],
)
def test_role_of(name: str, role: str) -> None:
    from numabind.check._inspect import role_of

    assert role_of(name) == role


NAMED_RANK = """
import os, sys, threading, time
import numabind

def named(name, cpus):
    ready = threading.Event()
    def run():
        tid = threading.get_native_id()
        with open(f"/proc/self/task/{tid}/comm", "w") as f:
            f.write(name)
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        ready.set()
        time.sleep(600)
    threading.Thread(target=run, daemon=True).start()
    ready.wait()

named("pt_data_pin", None)
named("pt_nccl_watchdg", None)
named("pt_nccl_heartbt", {1})  # off the compute CPU, on the helper core: on plan
pid = os.fork()
if pid == 0:  # a DataLoader worker: its name, on the reserved core
    with open("/proc/self/comm", "w") as f:
        f.write("pt_data_worker")
    os.sched_setaffinity(0, {1})
    print("worker", os.getpid(), flush=True)
    time.sleep(600)
    os._exit(0)
sys.stdin.readline()
"""


@two_cpus
def test_check_groups_threads_and_workers_by_role(tmp_path: Path) -> None:
    root = two_core_nodes(str(tmp_path / "m"))
    env = rank0_env(root, NUMABIND_REGISTRY=str(tmp_path), NUMABIND_RESERVE="1")
    rank = subprocess.Popen(
        [sys.executable, "-c", NAMED_RANK], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    worker = 0
    try:
        assert rank.stdout is not None
        worker = int(rank.stdout.readline().split()[1])
        out = subprocess.run(
            [sys.executable, "-m", "numabind", "check", "--all", "--json"],
            env=clean_env(NUMABIND_SYSROOT=root, NUMABIND_REGISTRY=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        records = json.loads(out.stdout)["processes"]
        assert out.returncode == check_status(records), records  # other ranks may be here
        found = {d["pid"]: d for d in records}
        assert check_status([found[rank.pid], found[worker]]) == 0, found
        roles = {(g["role"], g["kind"]): g for g in found[rank.pid]["roles"]}
        assert roles[("main", "threads")]["cpus"] == [0]
        assert roles[("pin", "threads")]["count"] == 1
        assert roles[("nccl", "threads")]["count"] == 2
        assert roles[("nccl", "threads")]["cpus"] == [0, 1]
        assert roles[("dataloader worker", "processes")]["ids"] == [worker]
        assert roles[("dataloader worker", "processes")]["cpus"] == [1]
        assert all(g["on_plan"] for g in roles.values())
        # the worker inherited the rank's environment: checked as a helper process, on plan
        assert found[worker]["ok"], found[worker]
        text = subprocess.run(
            [sys.executable, "-m", "numabind", "check", "--pid", str(rank.pid)],
            env=clean_env(NUMABIND_SYSROOT=root, NUMABIND_REGISTRY=str(tmp_path)),
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        assert "roles: main (1 thread) 0; " in text and "dataloader worker (1 process) 1" in text
    finally:
        rank.kill()
        rank.wait()
        if worker:
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker, signal.SIGKILL)


def test_the_picture_shows_reserved_cores(dgx_root: str) -> None:
    from numabind.cli._picture import RESERVED, build, draw
    from numabind.cli._svg import render

    m = Machine.from_root(dgx_root)
    _, plans, _ = plans_for(m, {}, 8, "node", "preferred", parse_reserve("2/node"), "all")
    pic = build(m, plans, "node", "preferred")
    assert pic.reserved == frozenset({54, 55, 166, 167, 110, 111, 222, 223})
    text = draw(pic)
    assert "reserve 2/node" in text[1]
    row = next(line for line in text if line.endswith("cores of CPUs 32-55"))
    assert row.split()[0].endswith("rr") and row.split()[0].count("r") == 2
    assert any(line.startswith("  r  a reserved core") for line in text)
    svg = render(m, plans)
    assert svg.count(f'fill="{RESERVED}"') >= 8 + 1  # 8 reserved CPUs and the legend swatch
    # without a reservation: no mark, no legend line
    _, plain, _ = plans_for(m, {}, 8, "node", "preferred")
    assert not any("reserved" in line for line in draw(build(m, plain, "node", "preferred")))


FAKE_OMP_IMPORT = """
import os
os.sched_setaffinity(0, {0})  # what libgomp does to the thread that loads it
"""


@two_cpus
def test_omp_places_puts_the_importing_thread_back(
    synth_machine: MakeMachine, tmp_path: Path
) -> None:
    """The rule without torch: a module on the watch list (a stand-in ``sklearn``) narrows
    the importing thread as libgomp does; with NUMABIND_OMP_PLACES the thread is put back on
    the rank's CPUs, without it the narrowing stays (the oracle)."""
    root = two_core_nodes(str(tmp_path / "m"))
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "sklearn.py").write_text(FAKE_OMP_IMPORT)
    code = "import os, sklearn; print(sorted(os.sched_getaffinity(0)))"

    def after_import(**extra: str) -> str:
        env = rank0_env(root, PYTHONPATH=str(tmp_path / "lib"), **extra)
        r = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    assert after_import(NUMABIND_OMP_PLACES="cores") == "[0, 1]"
    assert after_import() == "[0]"
    # an inherited binding (a spawned child of the rank) keeps its importer too
    state = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ['NUMABIND_STATE'])"],
        env=rank0_env(root, NUMABIND_OMP_PLACES="cores"),
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.strip()
    assert state.endswith("#bound")
    assert after_import(NUMABIND_OMP_PLACES="cores", NUMABIND_STATE=state) == "[0, 1]"
