"""The rule for a CPU binding already in place (docs/how-it-works.md has it as a table)."""

from __future__ import annotations

import pytest

from numabind._apply import assess, decide, launcher_default

ALL = frozenset(range(8))
NODE1 = frozenset(range(4, 8))
PLAN = NODE1


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"OMPI_MCA_orte_bound_at_launch": "1"}, "Open MPI's default core binding"),
        (
            {"OMPI_MCA_orte_bound_at_launch": "1", "OMPI_MCA_hwloc_base_binding_policy": "core"},
            None,
        ),
        (
            {
                "SLURM_STEP_ID": "0",
                "SLURM_CPU_BIND_TYPE": "mask_cpu:",
                "SLURM_CPU_BIND_LIST": "0x1,0x2",
            },
            "Slurm's automatic task/affinity binding",
        ),
        (
            {"SLURM_STEP_ID": "0", "SLURM_CPU_BIND_TYPE": "mask_cpu:", "SLURM_CPU_BIND_LIST": "1"},
            None,
        ),
        (
            {"SLURM_STEP_ID": "0", "SLURM_CPU_BIND_TYPE": "map_cpu:", "SLURM_CPU_BIND_LIST": "1,0"},
            None,
        ),
        ({"SLURM_CPU_BIND_TYPE": "mask_cpu:", "SLURM_CPU_BIND_LIST": "0x1"}, None),  # not a step
        ({}, None),
    ],
)
def test_launcher_defaults(env: dict[str, str], expected: str | None) -> None:
    assert launcher_default(env) == expected


def test_full_mask_is_not_a_binding() -> None:
    e = assess(ALL, ALL, frozenset({0}), {})
    assert not e.narrower and decide(e, PLAN, NODE1, "auto").action == "apply"
    assert decide(e, PLAN, NODE1, "auto").message is None


def test_inherited_mask_is_replaced() -> None:
    e = assess(frozenset({0}), ALL, frozenset({0}), {})  # srun -n1 torchrun: the agent's pin
    assert e.narrower and not e.deliberate and "inherited" in e.origin
    d = decide(e, PLAN, NODE1, "auto")
    assert d.action == "apply" and d.message and "replaced CPU mask 0 (inherited" in d.message
    assert "NUMABIND=respect" in d.message
    assert decide(e, PLAN, NODE1, "respect").action == "keep"


def test_launcher_default_is_replaced_even_inside_node() -> None:
    e = assess(frozenset({4}), ALL, ALL, {"OMPI_MCA_orte_bound_at_launch": "1"})
    assert not e.deliberate
    assert decide(e, PLAN, NODE1, "auto").action == "apply"


def test_deliberate_inside_node_is_kept_with_memory_only_if_default() -> None:
    e = assess(frozenset({5, 6}), ALL, ALL, {})  # numactl --physcpubind=5,6 python ...
    assert e.deliberate
    d = decide(e, PLAN, NODE1, "auto")
    assert d.action == "keep" and d.memory_only_if_default and d.message is None
    assert decide(e, PLAN, NODE1, "force").action == "apply"


def test_respect_keeps_the_mask_and_a_policy_already_set() -> None:
    """NUMABIND=respect: a mask (numactl --physcpubind) is kept, and the memory policy is
    set only where the process has none (numactl --membind is kept too)."""
    e = assess(frozenset({0, 1}), ALL, ALL, {})  # outside the GPU's node, and deliberate
    d = decide(e, PLAN, NODE1, "respect")
    assert d.action == "keep" and d.memory_only_if_default and d.message is None
    pinned = assess(frozenset({4}), ALL, ALL, {"OMPI_MCA_orte_bound_at_launch": "1"})
    d = decide(pinned, PLAN, NODE1, "respect")
    assert d.action == "keep" and d.memory_only_if_default


def test_deliberate_outside_node_is_replaced() -> None:
    e = assess(frozenset({0, 1}), ALL, ALL, {})
    d = decide(e, PLAN, NODE1, "auto")
    assert d.action == "apply" and d.message and "outside the GPU's node" in d.message
    assert decide(e, PLAN, NODE1, "respect").action == "keep"
