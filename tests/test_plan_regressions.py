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
