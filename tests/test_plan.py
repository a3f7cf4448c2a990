"""The planner on generated machines (tests/synth.py), read through the sysfs reader."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import synth
from numabind._devices import resolve
from numabind._model import MODE_NAMES as MODES
from numabind._plan import MEMORY_POLICIES, Plan, Request, plan
from numabind._topology import Machine

MakeMachine = Callable[[synth.Spec], Machine]


def plans(
    m: Machine,
    n: int,
    mode: str = "node",
    memory: str = "preferred",
    env: dict[str, str] | None = None,
) -> list[Plan]:
    visible = resolve(m, env or {})
    return [
        plan(
            m,
            Request(
                local_rank=r,
                local_world_size=n,
                rank_source="LOCAL_RANK",
                visible=visible,
                mode=mode,
                memory=memory,
            ),
        )
        for r in range(n)
    ]


def test_dgx_node_mode(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.dgx_h100())
    assert len(m.online_cpus) == 224
    gpus = [a for a in m.all_accelerators if a.vendor == "nvidia"]
    assert len(gpus) == 8, "NVSwitches and the BMC VGA are not GPUs"
    ps = plans(m, 8)
    assert [p.numa_node for p in ps] == [0] * 4 + [1] * 4
    assert ps[0].cpus == m.node(0).cpus and len(ps[0].cpus) == 112
    assert all(p.memory_policy == "preferred" and p.memory_nodes == {p.numa_node} for p in ps)
    assert "GPU 0 (0000:18:00.0) is on node 0" in ps[0].reason
    assert ps[0].device.uuid == synth._uuid(0)


def test_dgx_exclusive_splits_cores_with_siblings(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.dgx_h100())
    ps = plans(m, 8, "exclusive")
    node0 = [p.cpus for p in ps[:4]]
    assert all(len(c) == 28 for c in node0), "56 cores / 4 ranks = 14 cores = 28 threads each"
    assert frozenset().union(*node0) == m.node(0).cpus
    for a in range(4):
        for b in range(a + 1, 4):
            assert not node0[a] & node0[b]
    assert all((c + 112 in ps[0].cpus) for c in ps[0].cpus if c < 112), "SMT siblings stay together"
    assert ps[0].cpus == frozenset(range(0, 14)) | frozenset(range(112, 126))


def test_exclusive_remainder_goes_to_lowest_ranks(synth_machine: MakeMachine) -> None:
    spec = synth.dgx_h100()
    m = synth_machine(spec)
    ps = plans(m, 6, "exclusive", env={"CUDA_VISIBLE_DEVICES": "0,1,2,4,5,6"})
    # node 0 hosts ranks 0,1,2: 56 cores -> 19, 19, 18
    assert [len(p.cpus) // 2 for p in ps[:3]] == [19, 19, 18]


def test_exclusive_with_one_visible_device_falls_back(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.dgx_h100())
    visible = resolve(m, {"CUDA_VISIBLE_DEVICES": "5"})
    p = plan(
        m,
        Request(
            local_rank=1,
            local_world_size=8,
            rank_source="LOCAL_RANK",
            visible=visible,
            mode="exclusive",
        ),
    )
    assert p.bound and p.cpus == m.node(1).cpus
    assert any("using node mode" in n for n in p.notes)


def test_nps4_gpus_on_nodes_3_1_7_5(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.nps4())
    ps = plans(m, 4)
    assert [p.numa_node for p in ps] == [3, 1, 7, 5]
    assert ps[0].cpus == frozenset(range(48, 64))
    sock = plans(m, 4, "socket")
    assert sock[0].cpus == frozenset(range(0, 64)) and sock[2].cpus == frozenset(range(64, 128))
    assert sock[0].memory_policy == "preferred-many" and sock[0].memory_nodes == {0, 1, 2, 3}


def test_core_complex_picks_l3_domains(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.nps4())
    ps = plans(m, 2, "core-complex", env={})
    assert ps[0].cpus == frozenset(range(48, 56)), "one rank on node 3: its first CCX"
    # two ranks on one GPU node share it: each gets its own CCX
    spec = synth.nps4()
    spec.gpus.append(synth.Gpu("0000:02:00.0", 3, device=0x20B0, uuid=synth._uuid(9), minor=9))
    m2 = synth_machine(spec)
    visible = resolve(m2, {"CUDA_VISIBLE_DEVICES": "0,1"})
    a = plan(
        m2,
        Request(
            local_rank=0,
            local_world_size=2,
            rank_source="LOCAL_RANK",
            visible=visible,
            mode="core-complex",
        ),
    )
    b = plan(
        m2,
        Request(
            local_rank=1,
            local_world_size=2,
            rank_source="LOCAL_RANK",
            visible=visible,
            mode="core-complex",
        ),
    )
    assert a.cpus == frozenset(range(48, 56)) and b.cpus == frozenset(range(56, 64))
    assert a.threads == 8 and b.threads == 8, "one CCX each: 8 cores, no SMT"


def test_gb200_memory_only_nodes(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.gb200())
    assert [n.id for n in m.cpu_nodes] == [0, 1]
    ps = plans(m, 4)
    assert [p.numa_node for p in ps] == [0, 0, 1, 1], "GPU memory nodes 2-5 have no CPUs"
    assert all(p.memory_nodes == {p.numa_node} for p in ps), "never a memory-only node"
    assert [a.memory_node for a in m.all_accelerators] == [2, 3, 4, 5]
    sock = plans(m, 4, "socket")
    assert sock[0].cpus == frozenset(range(72)), "socket mode never adds memory-only nodes"


def test_mi300x_processing_accelerator_class(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.mi300x())
    assert [a.vendor for a in m.all_accelerators] == ["amd"] * 8
    ps = plans(m, 8)
    assert [p.numa_node for p in ps] == [0] * 4 + [1] * 4
    ps2 = plans(m, 2, env={"HIP_VISIBLE_DEVICES": "7,0"})
    assert [p.numa_node for p in ps2] == [1, 0]
    ps3 = plans(m, 2, env={"ROCR_VISIBLE_DEVICES": "4,5,6,7", "HIP_VISIBLE_DEVICES": "1"})
    assert ps3[0].device.pci == "0000:95:00.0"


def test_container_sees_two_of_eight(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.container_2_of_8())
    assert len([a for a in m.all_accelerators if a.vendor == "nvidia"]) == 8, (
        "sysfs shows the host's"
    )
    visible = resolve(m, {})
    assert [d.pci for d in visible.devices] == ["0000:3a:00.0", "0000:ab:00.0"]
    ps = plans(m, 2)
    assert [p.numa_node for p in ps] == [0, 1]
    assert ps[0].cpus == frozenset(range(8)) and ps[1].cpus == frozenset(range(56, 64))
    assert "cgroup v2" in m.allowed.source


def test_cgroup_without_cpus_on_gpu_node(synth_machine: MakeMachine) -> None:
    spec = synth.dgx_h100(cgroup_cpus=range(0, 8), filler_pci=0)
    m = synth_machine(spec)
    ps = plans(m, 8)
    assert ps[0].bound and ps[0].cpus == frozenset(range(8))
    assert ps[4].status == "skipped" and ps[4].problem
    assert "56-111,168-223" in ps[4].reason and "0-7" in ps[4].reason


def test_single_node_skips_cheaply_but_splits_exclusive(synth_machine: MakeMachine) -> None:
    spec = synth.Spec(
        nodes=[list(range(16))],
        package_of_node=[0],
        l3=[list(range(8)), list(range(8, 16))],
        gpus=[synth.Gpu("0000:01:00.0", -1), synth.Gpu("0000:02:00.0", -1)],
    )
    m = synth_machine(spec)
    node = plans(m, 2)
    assert all(
        p.status == "skipped" and not p.problem and "one NUMA node" in p.reason for p in node
    )
    excl = plans(m, 2, "exclusive")
    assert excl[0].cpus == frozenset(range(8)) and excl[1].cpus == frozenset(range(8, 16))
    cc = plans(m, 2, "core-complex")
    assert cc[0].cpus == frozenset(range(8)) and cc[1].cpus == frozenset(range(8, 16))


def test_unknown_node_with_narrow_locality(synth_machine: MakeMachine) -> None:
    spec = synth.nps4()
    spec.gpus = [synth.Gpu("0000:01:00.0", -1, local_cpus=list(range(16, 48)))]
    m = synth_machine(spec)
    p = plans(m, 1)[0]
    assert p.bound and p.cpus == frozenset(range(16, 48)) and p.numa_node is None
    assert p.memory_nodes == {1, 2}


def test_unknown_node_whole_machine_is_skipped(synth_machine: MakeMachine) -> None:
    spec = synth.nps4()
    spec.gpus = [synth.Gpu("0000:01:00.0", -1)]
    p = plans(synth_machine(spec), 1)[0]
    assert p.status == "skipped" and "unknown" in p.reason


def test_cpu_only_job_spreads_blockwise(synth_machine: MakeMachine) -> None:
    spec = synth.nps4()
    spec.gpus = []
    m = synth_machine(spec)
    ps = plans(m, 16)
    assert [p.numa_node for p in ps] == [k // 2 for k in range(16)]
    assert (
        plan(
            m,
            Request(
                local_rank=0, local_world_size=1, rank_source="LOCAL_RANK", visible=resolve(m, {})
            ),
        ).status
        == "skipped"
    )


def test_memory_policies(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.nps4())
    for memory in MEMORY_POLICIES:
        p = plans(m, 1, memory=memory)[0]
        assert p.memory_policy == memory
        assert p.memory_nodes == (frozenset() if memory == "none" else {3})
    old = synth.nps4()
    old.kernel = "5.10.0-28-amd64"
    p = plans(synth_machine(old), 1, "socket")[0]
    assert p.memory_policy == "preferred" and p.memory_nodes == {3}, "no PREFERRED_MANY before 5.15"


@pytest.mark.parametrize(
    ("nodes_per_socket", "expected"), [(2, "preferred-many"), (1, "preferred")]
)
def test_socket_mode_prefers_every_node_of_the_socket(
    synth_machine: MakeMachine, nodes_per_socket: int, expected: str
) -> None:
    """Sub-NUMA clustering (SNC2): a socket of two nodes; socket mode's memory is both of
    them, under one policy that prefers them all (preferred over one node otherwise)."""
    count = 2 * nodes_per_socket
    spec = synth.Spec(
        nodes=[list(range(4 * i, 4 * i + 4)) for i in range(count)],
        package_of_node=[i // nodes_per_socket for i in range(count)],
        gpus=[synth.Gpu("0000:01:00.0", 0)],
    )
    (p,) = plans(synth_machine(spec), 1, "socket")
    assert p.memory_policy == expected
    assert p.memory_nodes == frozenset(range(nodes_per_socket))


def test_rank_wraps_modulo_device_count(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.nps4())
    p = plans(m, 6)[5]
    assert p.device_index == 1 and any("modulo" in n for n in p.notes)


def test_plan_never_raises_on_broken_machine(tmp_path: Path) -> None:
    (tmp_path / "sys/devices/system/node/node0").mkdir(parents=True)
    (tmp_path / "sys/devices/system/node/node0/cpulist").write_text("garbage\n")
    m = Machine.from_root(str(tmp_path))
    p = plan(
        m,
        Request(local_rank=0, local_world_size=2, rank_source="LOCAL_RANK", visible=resolve(m, {})),
    )
    assert p.status == "skipped"


def test_bad_mode_and_memory_are_reasons(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.nps4())
    v = resolve(m, {})
    assert (
        "unknown mode"
        in plan(
            m,
            Request(local_rank=0, local_world_size=1, rank_source="x", visible=v, mode="sideways"),
        ).reason
    )
    assert (
        "unknown memory policy"
        in plan(
            m,
            Request(
                local_rank=0,
                local_world_size=1,
                rank_source="x",
                visible=v,
                mode="node",
                memory="everywhere",
            ),
        ).reason
    )


# --- properties -----------------------------------------------------------------------------


@st.composite
def machines(draw: st.DrawFn) -> synth.Spec:
    nnodes = draw(st.integers(1, 4))
    cores = draw(st.integers(1, 6))
    smt = draw(st.sampled_from([1, 2]))
    total = nnodes * cores
    stride = total
    nodes = [
        [c for c in range(n * cores, (n + 1) * cores)]
        + ([c + stride for c in range(n * cores, (n + 1) * cores)] if smt == 2 else [])
        for n in range(nnodes)
    ]
    ngpu = draw(st.integers(0, 4))
    gpus = [
        synth.Gpu(f"0000:{i + 1:02x}:00.0", draw(st.integers(0, nnodes - 1))) for i in range(ngpu)
    ]
    allowed = draw(st.sets(st.sampled_from(sorted(c for n in nodes for c in n)), min_size=1))
    return synth.Spec(
        nodes=nodes,
        package_of_node=[n // 2 for n in range(nnodes)],
        smt=smt,
        smt_stride=stride,
        gpus=gpus,
        cgroup_cpus=sorted(allowed),
        memory_gib=1,
    )


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(spec=machines(), mode=st.sampled_from(MODES), size=st.integers(1, 8))
def test_bound_cpus_lie_in_allowed_set_and_gpu_node(
    tmp_path_factory: pytest.TempPathFactory, spec: synth.Spec, mode: str, size: int
) -> None:
    root = tmp_path_factory.mktemp("m")
    synth.write(spec, str(root))
    m = Machine.from_root(str(root))
    visible = resolve(m, {})
    allowed = frozenset(spec.cgroup_cpus or ())
    for r in range(size):
        p = plan(
            m,
            Request(
                local_rank=r,
                local_world_size=size,
                rank_source="LOCAL_RANK",
                visible=visible,
                mode=mode,
            ),
        )
        several = len(spec.nodes) > 1
        if spec.gpus:
            gpu = spec.gpus[r % len(spec.gpus)]
            gpu_node = set(spec.nodes[gpu.node])
            # the plan must bind exactly when the GPU's node has CPUs this process may use
            # (or, on one node, when the mode splits it between ranks)
            must_bind = bool(gpu_node & allowed) and (
                several or mode in ("exclusive", "core-complex")
            )
            assert p.bound == must_bind, (p.reason, gpu.node, sorted(allowed))
            if p.bound:
                assert p.numa_node == gpu.node, "bound next to the GPU, not elsewhere"
                assert p.device is not None and p.device.pci == gpu.bdf
        else:
            # a CPU-only job spreads block-wise over the nodes with CPUs it may use
            must_bind = size > 1 and (several or mode in ("exclusive", "core-complex"))
            assert p.bound == must_bind, p.reason
            if p.bound:
                usable = [i for i, n in enumerate(spec.nodes) if set(n) & allowed]
                assert p.numa_node == usable[min(r * len(usable) // size, len(usable) - 1)]
        if not p.bound:
            assert p.reason and not p.cpus
            continue
        assert p.cpus and p.cpus <= m.allowed.cpus
        node = m.node(p.numa_node)
        assert node is not None
        if mode != "socket":
            assert p.cpus <= node.cpus
        assert p.memory_nodes <= {n.id for n in m.cpu_nodes}
        assert p.threads is not None and 1 <= p.threads <= len(p.cpus)


@settings(max_examples=60, deadline=None)
@given(cores=st.integers(1, 12), ranks=st.integers(1, 6), smt=st.sampled_from([1, 2]))
def test_exclusive_partitions_the_node(
    tmp_path_factory: pytest.TempPathFactory, cores: int, ranks: int, smt: int
) -> None:
    n0 = list(range(cores)) + ([c + 2 * cores for c in range(cores)] if smt == 2 else [])
    n1 = list(range(cores, 2 * cores)) + (
        [c + 2 * cores for c in range(cores, 2 * cores)] if smt == 2 else []
    )
    gpus = [synth.Gpu(f"0000:{i + 1:02x}:00.0", 0) for i in range(ranks)]
    spec = synth.Spec(
        nodes=[n0, n1],
        package_of_node=[0, 1],
        smt=smt,
        smt_stride=2 * cores,
        gpus=gpus,
        memory_gib=1,
    )
    root = tmp_path_factory.mktemp("x")
    synth.write(spec, str(root))
    m = Machine.from_root(str(root))
    visible = resolve(m, {})
    ps = [
        plan(
            m,
            Request(
                local_rank=r,
                local_world_size=ranks,
                rank_source="LOCAL_RANK",
                visible=visible,
                mode="exclusive",
            ),
        )
        for r in range(ranks)
    ]
    assert all(p.bound for p in ps)
    if cores >= ranks:
        for a in range(ranks):
            for b in range(a + 1, ranks):
                assert not ps[a].cpus & ps[b].cpus
        assert frozenset().union(*(p.cpus for p in ps)) == m.node(0).cpus
        sizes = [len(p.cpus) for p in ps]
        assert max(sizes) - min(sizes) <= smt
    else:
        assert all(p.cpus == m.node(0).cpus for p in ps)
        assert all(any("share" in n for n in p.notes) for p in ps)
