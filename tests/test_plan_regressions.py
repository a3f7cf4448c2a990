"""Plans that held on 750233a and broke later (issue 44), on the generated machines and in
a real interpreter: a GH200's one CPU node (a rank whose CPUs stay as they are because
its node holds every allowed CPU still reports those CPUs and its thread budget), and AMD
preferred-core rankings, split at their gap so that a node's ranks share its top group."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

import synth
from numabind._model import Reserve
from numabind._plan import Plan, Request, plan
from numabind._sources import SysfsSource
from numabind._topology import Machine
from numabind.capture._examples import MemoryRoot, build
from numabind.cli import main
from support import clean_env, py

MakeMachine = Callable[[synth.Spec], Machine]


def mem(spec: synth.Spec) -> Machine:
    """A generated machine read from memory."""
    tree = build(spec)
    return Machine(SysfsSource(MemoryRoot(tree.files, "generated", tree.links)))


def ranks(m: Machine, count: int, **over: object) -> list[Plan]:
    """The plans of ``count`` local ranks on ``m`` (devices as sysfs shows them)."""
    from numabind._devices import resolve

    visible = resolve(m, {})
    return [
        plan(m, Request(local_rank=r, local_world_size=count, visible=visible, **over))  # type: ignore[arg-type]
        for r in range(count)
    ]


def show_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    rc = main(["show", *argv, "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    got = json.loads(out)
    assert isinstance(got, dict)
    return got


# --- GH200: one CPU node plus its GPU's memory ---------------------------------------------------


def test_gh200_rank_is_planned_on_its_node_with_a_thread_budget() -> None:
    """The example GH200: rank 0's GPU is on node 0, which holds all 72 CPUs: the plan names
    them and gives the budget (OMP_NUM_THREADS), the memory policy stays off the GPU's node."""
    m = Machine.from_example("gh200")
    [p] = ranks(m, 1)
    assert p.bound and p.numa_node == 0
    assert p.cpus == frozenset(range(72)) and p.threads == 72
    assert p.memory_nodes == {0} and p.placement.kernel_policy == ("bind", {0})
    assert "memory kept off node 1 (no CPUs)" in (p.reason or "")


def test_gh200_reserve_and_one_thread_per_core_apply() -> None:
    """NUMABIND_RESERVE takes its cores off node 0's compute set (the budget follows);
    NUMABIND_SMT=1 keeps one hardware thread per core (a GH200-like node with 2 threads per
    core: Grace has one, so the example alone cannot tell)."""
    m = Machine.from_example("gh200")
    [p] = ranks(m, 1, reserve=Reserve(count=2, scope="node"))
    assert p.cpus == frozenset(range(70)) and p.helpers == {70, 71} and p.threads == 70
    spec = synth.gh200()
    cpus = list(range(144))
    spec = replace(
        spec,
        nodes=[cpus, []],
        smt=2,
        smt_stride=72,
        gpus=[replace(spec.gpus[0], local_cpus=cpus)],
    )
    smt2 = mem(spec)
    [both] = ranks(smt2, 1)
    assert both.cpus == frozenset(cpus) and both.threads == 72, "72 cores, 2 threads each"
    [one] = ranks(smt2, 1, smt="1")
    assert one.cpus == frozenset(range(72)) and one.threads == 72
    [r1] = ranks(smt2, 1, smt="1", reserve=Reserve(count=1, scope="node"))
    assert r1.cpus == frozenset(range(71)) and r1.helpers == {71, 143} and r1.threads == 71


def test_gh200_in_a_narrowed_cpuset_reports_the_cpus_it_may_use() -> None:
    """A cgroup that gives the job half of node 0: the node still holds every allowed CPU,
    and the plan says which they are, with their budget."""
    m = mem(replace(synth.gh200(), cgroup_cpus=range(36)))
    [p] = ranks(m, 1)
    assert p.bound and p.cpus == frozenset(range(36)) and p.threads == 36


def test_gh200_cpu_only_ranks_share_the_node() -> None:
    """No GPU visible, 4 local ranks: each is planned on node 0, a quarter of its budget."""
    from numabind._devices import resolve

    m = Machine.from_example("gh200")
    visible = resolve(m, {"CUDA_VISIBLE_DEVICES": ""})
    plans = [plan(m, Request(local_rank=r, local_world_size=4, visible=visible)) for r in range(4)]
    assert all(p.bound and p.cpus == frozenset(range(72)) for p in plans), plans
    assert [p.threads for p in plans] == [18] * 4


def test_show_gh200_names_the_cpus_and_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    got = show_json(capsys, "--example", "gh200")
    [rank] = got["ranks"]
    assert rank["status"] == "bound"
    assert rank["cpus"] == list(range(72)) and rank["threads"] == 72
    main(["show", "--example", "gh200"])
    table = capsys.readouterr().out.splitlines()
    row = next(line for line in table if line.split()[:3] == ["0", "0", "0"])
    assert row.split()[3:5] == ["0-71", "72"], row


def test_gh200_hook_sets_the_thread_budget(tmp_path: Path) -> None:
    """The startup hook in a real interpreter on the generated GH200: OMP_NUM_THREADS is
    the node's 72 cores (none before the fix: the plan had no budget)."""
    root = synth.write(synth.gh200(), str(tmp_path))
    env = clean_env(
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        NUMABIND_SYSROOT=root,
        NUMABIND="force",
        NUMABIND_THREADS="auto",
    )
    r = py("import os; print(os.environ.get('OMP_NUM_THREADS'))", env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "72", r.stderr


# --- AMD preferred-core rankings: one value per core, split at the gap ---------------------------

PREFCORE = "cpufreq/amd_pstate_prefcore_ranking"


def epyc_prefcore(gap: bool = True) -> synth.Spec:
    """A 2-socket AMD host shaped like the generated B300 (64 cores of 2 threads per
    socket, 4 GPUs on each), whose amd-pstate ranks every core with a value of its own: 8
    cores per package (every 8th) far above the rest (201-236 in steps of 5, against
    137-166), both threads of a core alike.  ``gap=False``: the same order in steps of 5,
    one of 6 after the second core: the widest step, but none stands out.  Illustrative
    values in the driver's layout."""
    spec = synth.dgx_b300()
    ranking: dict[int, int] = {}
    for core in range(128):
        k, top = divmod(core % 64, 8)
        fast = 236 - 5 * k if top == 0 else 166 - core % 30
        value = fast if gap else 400 - 5 * (core % 64) - (core % 64 >= 2)
        ranking[core] = ranking[core + 128] = value
    return replace(spec, vendor="amd", cpu_files={PREFCORE: ranking})


def top_group(node: int) -> frozenset[int]:
    """The oracle: the 8 cores of ``node``'s package that the firmware ranks far above
    the rest, both threads of each."""
    return frozenset(c + t for c in range(64 * node, 64 * node + 64, 8) for t in (0, 128))


def test_a_prefcore_ranking_with_a_gap_makes_the_top_group_the_priority_cores() -> None:
    m = mem(epyc_prefcore())
    assert m.core_kinds.source == PREFCORE
    for node in (0, 1):
        assert m.priority_cpus(node) == top_group(node)
    line = m.describe_kinds(top_group(0) | frozenset(range(1, 8)))
    assert line.startswith(f"2 kinds by {PREFCORE}: priority 0,8,16,24,32,40,48,56,128,")
    assert "(201-236), standard 1-7 (159-165)" in line


def test_four_ranks_of_a_node_get_four_distinct_priority_cores_under_main() -> None:
    m = mem(epyc_prefcore())
    plans = ranks(m, 8, priority="main")
    for node in (0, 1):
        mine = [p for p in plans if p.numa_node == node]
        assert len(mine) == 4
        mains = [p.main_cpus for p in mine]
        assert len(set(mains)) == 4, f"one priority core each: {mains}"
        for p in mine:
            assert len(p.main_cpus) == 2 and p.main_cpus <= top_group(node)
            assert p.priority_cpus == top_group(node)
            assert not any("share" in n for n in p.notes), p.notes


def test_rank_shares_the_top_group_evenly() -> None:
    m = mem(epyc_prefcore())
    plans = ranks(m, 8, priority="rank")
    for node in (0, 1):
        mine = [p for p in plans if p.numa_node == node]
        union = frozenset().union(*(p.cpus for p in mine))
        assert union == top_group(node) and sum(len(p.cpus) for p in mine) == 16
        assert {len(p.cpus) for p in mine} == {4}, "2 cores of 2 threads each"


def test_a_ranking_without_a_gap_or_a_file_that_names_kinds_is_not_split() -> None:
    """A ranking whose widest step does not stand out: the best core alone leads, as
    before (not the cores above that step).  The gapped values in a file that names kinds
    (CPPC highest_perf) stay one kind per value."""
    even = mem(epyc_prefcore(gap=False))
    assert even.priority_cpus(0) == {0, 128}
    spec = epyc_prefcore()
    cppc = mem(replace(spec, cpu_files={"acpi_cppc/highest_perf": spec.cpu_files[PREFCORE]}))
    assert cppc.priority_cpus(0) == {0, 128}
    plans = ranks(even, 8, priority="main")
    assert {p.main_cpus for p in plans if p.numa_node == 0} == {frozenset({0, 128})}


def test_show_on_a_prefcore_host(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = synth.write(epyc_prefcore(), str(tmp_path))
    got = show_json(capsys, "--input", root, "--priority", "main")
    mains = [frozenset(r["main_cpus"]) for r in got["ranks"]]
    assert len(set(mains)) == 8 and all(m <= top_group(0) | top_group(1) for m in mains)
    assert main(["show", "--input", root, "--priority", "main"]) == 0
    text = capsys.readouterr().out
    assert f"cores of node 0: 2 kinds by {PREFCORE}: priority 0,8,16," in text
    assert "share" not in text
