"""Which memory a node holds (issue 36): node kinds and memory tiers in the machine model,
read from the live files, captures of every kind and the generated machines; and the
rules that keep a rank's default memory policy on CPU memory."""

from __future__ import annotations

import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

import synth
from numabind._model import NODE_KINDS, Node
from numabind._topology import Machine, classify
from numabind.cli import main

MakeMachine = Callable[[synth.Spec], Machine]


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def mem(spec: synth.Spec) -> Machine:
    """A generated machine read from memory (several in one test)."""
    from numabind._sources import SysfsSource
    from numabind.capture._examples import MemoryRoot, build

    tree = build(spec)
    return Machine(SysfsSource(MemoryRoot(tree.files, "generated", tree.links)))


def kinds(m: Machine) -> dict[int, str | None]:
    return {n.id: n.kind for n in m.nodes}


# --- node kinds ----------------------------------------------------------------------------------


def test_gh200_gpu_memory_is_named_by_the_driver(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.gh200())
    assert kinds(m) == {0: "cpu", 1: "gpu"}
    gpu = m.node(1, full=True)
    assert gpu is not None and gpu.memory_bytes == 96 << 30
    assert "driver" in m.nodes[1].kind_how and m.gpu_memory()[1][0].pci == "0009:01:00.0"


def test_gb200_gpu_memory_nodes(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.gb200())
    assert kinds(m) == {0: "cpu", 1: "cpu", 2: "gpu", 3: "gpu", 4: "gpu", 5: "gpu"}
    assert {n: a.pci for n, (a, _) in m.gpu_memory().items()} == {
        2: "0008:01:00.0",
        3: "0010:01:00.0",
        4: "0018:01:00.0",
        5: "0020:01:00.0",
    }


def test_a_gpu_whose_pci_numa_node_is_a_cpu_less_node_names_its_memory(
    synth_machine: MakeMachine,
) -> None:
    """No driver directory (the VM, a container without /proc/driver/nvidia): the GPU's
    PCI numa_node naming a node without CPUs is what tells GPU memory."""
    spec = synth.Spec(
        nodes=[[0], [1], [], []],
        package_of_node=[0, 1, 0, 1],
        gpus=[synth.Gpu("0000:21:00.0", 0), synth.Gpu("0000:41:00.0", 2, local_cpus=[])],
        distance_matrix=[[10, 30, 20, 40], [30, 10, 30, 40], [20, 30, 10, 40], [40, 40, 40, 10]],
        proc_nvidia=False,
    )
    m = synth_machine(spec)
    assert kinds(m) == {0: "cpu", 1: "cpu", 2: "gpu", 3: "far"}
    assert "numa_node" in m.nodes[2].kind_how
    assert "distance 40" in m.nodes[3].kind_how and "(30)" in m.nodes[3].kind_how


def test_cxl_expanders_are_far_by_their_kernel_memory_tier(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.cxl())
    assert kinds(m) == {0: "cpu", 1: "cpu", 2: "far", 3: "far"}
    assert [n.tier for n in m.nodes] == [4, 4, 22, 22]
    assert "memory_tier22" in m.nodes[2].kind_how, "the tier decides, not the distance (24 < 32)"


def test_xeon_max_hbm_is_told_by_its_hmat_bandwidth(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.xeon_max())
    assert len(m.nodes) == 16
    assert kinds(m) == {n: ("cpu" if n < 8 else "hbm") for n in range(16)}
    assert [n.id for n in m.cpu_nodes] == list(range(8))
    assert m.package_of_node(8) == 0 and m.package_of_node(15) == 1, "HBM next to its cluster"
    assert m.cpu_vendor == "intel"


def test_power9_gpu_memory_nodes_of_the_capture(capture: Callable[[str], str]) -> None:
    from test_captures import _tar

    m = _tar(capture("nvidiagpunumanodes.tar.bz2"))
    assert kinds(m) == {0: "cpu", 8: "cpu", **{n: "gpu" for n in range(250, 256)}}


def test_hwloc_hbm_nodes_share_a_cpuset_and_are_read_memory_only(hwloc_dir: Path) -> None:
    """hwloc attaches an HBM node to the same object as its DRAM node, so the export
    gives both the same cpuset: the HBM node is memory next to those CPUs, not a second
    owner of them."""
    m = Machine.from_capture(str(hwloc_dir / "64intel64-heteromem.xml"))
    assert kinds(m) == {
        0: "cpu",
        1: "cpu",
        2: "cpu",
        3: "cpu",
        4: "hbm",
        5: "hbm",
        6: "hbm",
        7: "hbm",
    }
    assert [n.id for n in m.cpu_nodes] == [0, 1, 2, 3]
    cpus = [n.cpus for n in m.cpu_nodes]
    assert sum(len(c) for c in cpus) == len(frozenset().union(*cpus)) == 64
    assert m.nodes[4].kind_how == "hwloc subtype HBM" and m.cpu_vendor == "intel"


def _hwloc(nodes: str) -> bytes:
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n<topology version="3.0">'
        '<object type="Machine" os_index="0" cpuset="0x3">'
        '<object type="Package" os_index="0" cpuset="0x3">'
        '<info name="CPUVendor" value="AuthenticAMD"/>' + nodes + '<object type="PU" '
        'os_index="0" cpuset="0x1"/><object type="PU" os_index="1" cpuset="0x2"/>'
        "</object></object></topology>\n"
    ).encode()


def test_hwloc_memory_subtypes_and_unnamed_shared_cpusets(tmp_path: Path) -> None:
    nodes = (
        '<object type="NUMANode" os_index="0" cpuset="0x3" local_memory="1000"/>'
        '<object type="NUMANode" os_index="1" cpuset="0x3" subtype="CXL-DRAM" local_memory="9"/>'
        '<object type="NUMANode" os_index="2" cpuset="0x3" subtype="NVM" local_memory="9"/>'
        '<object type="NUMANode" os_index="3" cpuset="0x3" local_memory="9"/>'
    )
    path = tmp_path / "x.xml"
    path.write_bytes(_hwloc(nodes))
    m = Machine.from_capture(str(path))
    assert kinds(m) == {0: "cpu", 1: "far", 2: "far", 3: "memory"}
    assert m.cpu_vendor == "amd"
    assert any("node 3 has the same CPUs as node 0" in w for w in m.warnings)


def test_the_rules_speak_in_order() -> None:
    """GPU memory, then the capture's word, the kernel tier, HMAT, the distance table, and
    otherwise no guess."""
    cpu0 = Node(id=0, cpus=frozenset({0}), tier=4, read_bandwidth=100, distances=((0, 10), (1, 20)))
    cpu1 = Node(id=1, cpus=frozenset({1}), tier=4, read_bandwidth=100, distances=((0, 20), (1, 10)))

    def one(n: Node, gpus: dict[int, str] | None = None) -> tuple[str, str]:
        return classify((cpu0, cpu1, n), gpus or {})[n.id]

    far = ((0, 50), (1, 50), (2, 10))
    assert one(Node(id=2, cpus=frozenset(), tier=22, distances=far), {2: "driver"})[0] == "gpu"
    assert one(Node(id=2, cpus=frozenset(), kind="hbm", tier=22, distances=far))[0] == "hbm"
    assert one(Node(id=2, cpus=frozenset(), tier=22, distances=((0, 12),)))[0] == "far"
    assert one(Node(id=2, cpus=frozenset(), tier=1, distances=far))[0] == "hbm"
    assert one(Node(id=2, cpus=frozenset(), tier=4, read_bandwidth=300, distances=far))[0] == "hbm"
    assert (
        one(Node(id=2, cpus=frozenset(), tier=4, read_bandwidth=40, distances=((0, 12),)))[0]
        == "far"
    )
    assert one(Node(id=2, cpus=frozenset(), tier=4, distances=far))[0] == "far"
    assert one(Node(id=2, cpus=frozenset(), tier=4, distances=((0, 13), (1, 20))))[0] == "memory"
    assert one(Node(id=2, cpus=frozenset()))[0] == "memory"
    assert classify((cpu0,), {})[0] == ("cpu", "it has CPUs")


def test_every_kind_is_in_the_vocabulary(synth_machine: MakeMachine) -> None:
    assert list(NODE_KINDS) == ["cpu", "gpu", "hbm", "far", "memory"]
    assert {k.name for k in NODE_KINDS.values() if k.wrong_tier} == {"gpu", "far"}


# --- memory tiers from the kernel's files --------------------------------------------------------


def test_memory_tiers_are_read_and_bad_files_warn(tmp_path: Path) -> None:
    root = synth.write(synth.cxl(), str(tmp_path / "root"))
    tiering = Path(root) / "sys/devices/virtual/memory_tiering"
    (tiering / "memory_tier9").mkdir()
    (tiering / "memory_tier9" / "nodelist").write_text("0\n")  # node 0 twice
    (tiering / "memory_tier7").mkdir()
    (tiering / "memory_tier7" / "nodelist").write_text("0-zz\n")
    (tiering / "memory_tierX").mkdir()
    m = Machine.from_root(root)
    assert [n.tier for n in m.nodes] == [4, 4, 22, 22]
    assert any("memory_tier7/nodelist" in w for w in m.warnings)
    assert any("node 0 is in memory_tier4 and memory_tier9" in w for w in m.warnings)


def test_a_kernel_without_memory_tiering_leaves_tiers_unknown(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.dgx_h100(filler_pci=0))
    assert [(n.kind, n.tier) for n in m.nodes] == [("cpu", None), ("cpu", None)]


def test_gather_keeps_tiers_bandwidth_and_vendor(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for spec in (synth.cxl(), synth.xeon_max()):
        root = synth.write(spec, str(tmp_path / f"root{len(spec.nodes)}"))
        monkeypatch.setenv("NUMABIND_SYSROOT", root)
        tar = tmp_path / f"cap{len(spec.nodes)}.tar.gz"
        assert run_main(capsys, "gather", str(tar))[0] == 0
        monkeypatch.delenv("NUMABIND_SYSROOT")
        with tarfile.open(tar) as t:
            names = t.getnames()
        assert any(n.endswith("cpu/modalias") for n in names)
        gathered = json.loads(run_main(capsys, "show", "--input", str(tar), "--json")[1])
        direct = json.loads(run_main(capsys, "show", "--input", root, "--json")[1])
        assert gathered["nodes"] == direct["nodes"]
        assert {n["kind"] for n in gathered["nodes"]} == {
            "cpu",
            "far" if len(spec.nodes) == 4 else "hbm",
        }
        if len(spec.nodes) == 4:
            assert any("memory_tiering/memory_tier22/nodelist" in n for n in names)
            assert [n["tier"] for n in gathered["nodes"]] == [4, 4, 22, 22]
        else:
            assert gathered["nodes"][8]["read_bandwidth"] == 230400


# --- show ----------------------------------------------------------------------------------------


def test_show_names_each_node_s_kind_and_tier(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(capsys, "show", "--example", "cxl")
    assert rc == 0
    row = next(line for line in out.splitlines() if line.startswith("  2 "))
    assert "far memory" in row and " 22 " in row
    assert "node 2: far memory (memory_tier22, slower than the CPU nodes' memory_tier4)" in out
    data = json.loads(run_main(capsys, "show", "--example", "gb200", "--json")[1])
    assert [(n["id"], n["kind"]) for n in data["nodes"]][1:3] == [(1, "cpu"), (2, "gpu")]
    assert data["nodes"][2]["kind_how"] == "the memory of 0008:01:00.0 (its driver says so)"
    rc, out, _ = run_main(capsys, "show", "--example", "gb200")
    assert "GPU memory of 0008:01:00.0" in out


def test_the_picture_draws_hbm_with_its_package(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(capsys, "show", "--example", "xeon-max", "--draw")
    assert rc == 0
    package1 = out.split("package 1", 1)[1]
    assert "node 12: high-bandwidth memory, 16.0 GiB" in package1
    assert "node 8: high-bandwidth memory" in out.split("package 1", 1)[0]
    rc, out, _ = run_main(capsys, "show", "--example", "cxl", "--draw")
    assert "node 2: far memory, 256.0 GiB, memory tier 22" in out


# --- sub-NUMA clusters and NPS -------------------------------------------------------------------


def test_split_packages_are_named_by_their_vendor(
    synth_machine: MakeMachine, capture: Callable[[str], str]
) -> None:
    from numabind._plan import split_of

    snc3 = mem(synth.snc3())
    split = split_of(snc3, 2)
    assert (
        split is not None
        and split.describe() == "node 2 is one of 3 sub-NUMA clusters of package 0 (SNC3)"
    )
    assert split_of(snc3, 4).nodes == (3, 4, 5)  # type: ignore[union-attr]
    real = Machine.from_capture(capture("memorysidecaches.tar.bz2"))  # cpuinfo says Intel
    assert (
        split_of(real, 1).describe() == "node 1 is one of 2 sub-NUMA clusters of package 1 (SNC2)"
    )  # type: ignore[union-attr]
    nps4 = mem(synth.nps4())
    assert split_of(nps4, 5).describe() == "node 5 is one of 4 NUMA nodes of package 1 (NPS4)"  # type: ignore[union-attr]
    xmax = mem(synth.xeon_max())
    assert split_of(xmax, 0).nodes == (0, 1, 2, 3), "the HBM nodes are not CPU nodes of it"  # type: ignore[union-attr]
    assert split_of(mem(synth.dgx_h100(filler_pci=0)), 0) is None


def test_memory_falls_back_within_the_package_first(
    synth_machine: MakeMachine, capture: Callable[[str], str]
) -> None:
    """Node mode: the kernel takes the home node's fallback list by distance; on split
    packages the firmware puts the package's other nodes nearer than the other socket."""
    from numabind._plan import fallback_order

    snc3 = mem(synth.snc3())
    assert fallback_order(snc3, 0, range(6)) == (1, 2, 3, 4, 5)
    assert fallback_order(snc3, 4, range(6)) == (3, 5, 0, 1, 2)
    real = Machine.from_capture(capture("memorysidecaches.tar.bz2"))
    assert fallback_order(real, 0, [0, 1, 2, 3]) == (2, 1, 3), "the SNC sibling at 11, then 21"
    xmax = mem(synth.xeon_max())
    assert fallback_order(xmax, 0, range(8)) == (1, 2, 3, 4, 5, 6, 7)
    # by distance alone the package's HBM would come before the other socket's DDR
    assert fallback_order(xmax, 0, range(16)) == (1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15)


def test_socket_mode_memory_covers_the_whole_package(synth_machine: MakeMachine) -> None:
    from test_plan import plans

    m = mem(synth.snc3())
    ps = plans(m, 8, mode="socket")
    assert [p.memory_nodes for p in ps] == [frozenset({0, 1, 2})] * 4 + [frozenset({3, 4, 5})] * 4
    assert all(p.memory_policy == "preferred-many" for p in ps)
    assert all(
        p.cpus
        == m.node(p.numa_node).cpus | m.node(p.numa_node + 1).cpus | m.node(p.numa_node + 2).cpus
        for p in ps[:1]
    )  # type: ignore[union-attr,operator]
    # the cgroup leaves node 2's CPUs out but not its memory: the package's memory still
    spec = synth.snc3()
    spec.cgroup_cpus = [c for n in (0, 1, 3, 4, 5) for c in spec.nodes[n]]
    ps = plans(mem(spec), 8, mode="socket")
    assert ps[0].memory_nodes == {0, 1, 2} and not ps[0].cpus & set(spec.nodes[2])
    spec.cgroup_mems = [0, 1, 3, 4, 5]
    ps = plans(mem(spec), 8, mode="socket")
    assert ps[0].memory_nodes == {0, 1}, "cpuset.mems still rules"
    node = plans(m, 8, mode="node")
    assert [p.memory_nodes for p in node[:2]] == [frozenset({0})] * 2, "node mode: the cluster"


def test_xeon_max_socket_mode_covers_the_package_s_ddr_not_its_hbm(
    synth_machine: MakeMachine,
) -> None:
    from test_plan import plans

    ps = plans(mem(synth.xeon_max()), 6, mode="socket")
    assert [p.memory_nodes for p in ps] == [frozenset({0, 1, 2, 3})] * 3 + [
        frozenset({4, 5, 6, 7})
    ] * 3


def test_show_says_a_gpu_node_is_one_of_several_clusters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, _ = run_main(capsys, "show", "--example", "snc3")
    assert rc == 0
    assert (
        "node 0 is one of 3 sub-NUMA clusters of package 0 (SNC3): node mode keeps its ranks' "
        "CPUs there and puts their memory there first, then the package's nodes 1-2, then "
        "the other package's"
    ) in out
    assert "node 2 is one of" not in out, "no rank is planned there"
    rc, out, _ = run_main(capsys, "show", "--example", "dgx-h100")
    assert "one of" not in out


def test_doctor_names_the_bios_setting_when_a_gpu_node_is_too_small(
    synth_machine: MakeMachine,
) -> None:
    from numabind.cli._doctor import subnuma_findings

    found = subnuma_findings(mem(synth.snc3()), {})
    assert [f.status for f in found] == ["warn", "warn"]
    assert (
        "package 0 is split into 3 sub-NUMA clusters (SNC3): node 0: 12 cores and 170 GiB a rank"
        in found[0].detail
    )
    assert (
        "would give each of its 4 GPU ranks 18 cores and 255 GiB (node 2 has no GPU)"
        in found[0].detail
    )
    assert (
        "Sub-NUMA Clustering (SNC) setting" in found[0].detail
        and "NUMABIND_MODE=socket" in found[0].detail
    )
    nps = subnuma_findings(mem(synth.nps4()), {})
    assert "NPS4" in nps[0].detail and "NUMA nodes per socket (NPS)" in nps[0].detail
    assert "(nodes 0,2 have no GPU)" in nps[0].detail
    assert subnuma_findings(mem(synth.dgx_h100(filler_pci=0)), {}) == []
    spread = synth.snc3()
    spread.gpus = [synth.Gpu(f"0000:{0x10 + i:02x}:00.0", i) for i in range(6)]
    assert subnuma_findings(mem(spread), {}) == [], "one GPU per cluster: its fair share"


# --- policies that never fall through to the wrong tier ------------------------------------------


def _plans(m: Machine, n: int | None = None, **over: object) -> list:  # type: ignore[type-arg]
    from numabind._devices import resolve
    from numabind._plan import Request, plan

    visible = resolve(m, {})
    count = n if n is not None else max(len(visible.devices), 1)
    return [
        plan(m, Request(local_rank=r, local_world_size=count, visible=visible, **over))  # type: ignore[arg-type]
        for r in range(count)
    ]


def _capture(name: str) -> Machine:
    return Machine.from_capture(str(Path(__file__).parent / "data" / "hwloc" / name))


WRONG_TIER_MACHINES: dict[str, tuple[Callable[[], Machine], int | None]] = {
    "gh200": (lambda: mem(synth.gh200()), None),
    "gb200": (lambda: mem(synth.gb200()), None),
    "cxl": (lambda: mem(synth.cxl()), None),
    "xeon-max": (lambda: mem(synth.xeon_max()), None),
    "power9 capture": (lambda: _capture("nvidiagpunumanodes.tar.bz2"), None),
    # no GPU in it: four local ranks of a CPU-only job, spread over the clusters
    "hwloc snc4 hbm": (lambda: _capture("64intel64-heteromem.xml"), 4),
}


@pytest.mark.parametrize("name", sorted(WRONG_TIER_MACHINES))
@pytest.mark.parametrize("mode", ["node", "socket"])
def test_no_default_policy_names_or_reaches_a_node_that_is_not_cpu_memory(
    name: str, mode: str
) -> None:
    """On every machine with GPU memory, HBM or far memory, every rank's default plan puts
    its memory on CPU memory only, and keeps the kernel from falling back elsewhere: the
    kernel gets MPOL_BIND over CPU-memory nodes (its home first: the allocating CPU's
    nearest), since MPOL_PREFERRED would spill anywhere."""
    make, ranks = WRONG_TIER_MACHINES[name]
    m = make()
    ps = [p for p in _plans(m, ranks, mode=mode) if p.bound]
    assert ps, [p.reason for p in _plans(m, ranks, mode=mode)]
    cpu = {n.id for n in m.nodes if n.kind == "cpu"}
    assert {n.id for n in m.nodes} - cpu, "the machine has memory that is not CPU memory"
    usable = frozenset(m.node_ids) & (m.allowed.mems or frozenset(m.node_ids))
    for p in ps:
        assert p.memory_nodes and p.memory_nodes <= cpu, p.summary()
        policy, nodes = p.placement.kernel_policy
        # what the kernel may fall back onto: the bind mask, else what cpuset.mems allows
        reachable = nodes if policy == "bind" else usable
        assert reachable <= cpu and p.memory_nodes <= reachable, p.summary()
        assert str(p.spill) == "cpu"
        assert p.memory_mask == (nodes if usable - cpu else frozenset())


def test_the_mask_is_the_cpu_nodes_this_process_may_use() -> None:
    """cpuset.mems bounds the mask; where it leaves no wrong-tier node the kernel could
    reach (the POWER9 capture's cpuset: effective mems 0), the policy stays preferred."""
    power9 = [p for p in _plans(_capture("nvidiagpunumanodes.tar.bz2")) if p.bound]
    assert power9 and all(p.placement.kernel_policy == ("preferred", {0}) for p in power9)
    spec = synth.gb200()
    spec.cgroup_cpus, spec.cgroup_mems = list(range(144)), [0, 1, 2]
    ps = _plans(mem(spec))
    assert [p.memory_mask for p in ps] == [frozenset({0, 1})] * 4
    assert ps[0].memory_text() == "preferred on node 0, then only node 1"
    spec.cgroup_mems = [0, 2]
    assert _plans(mem(spec))[0].memory_mask == {0}, "node 1's memory is not this process's"


def test_machines_whose_nodes_all_have_cpus_keep_preferred(synth_machine: MakeMachine) -> None:
    """There the kernel's fallback is CPU memory already: the plan is what it was."""
    for spec in (synth.dgx_h100(filler_pci=0), synth.snc3(), synth.nps4()):
        for p in _plans(mem(spec)):
            assert p.memory_mask == frozenset() and p.placement.kernel_policy[0] == "preferred"


def test_cpuset_mems_that_keep_gpu_memory_out_leave_preferred() -> None:
    spec = synth.gb200()
    spec.cgroup_cpus = list(range(144))
    spec.cgroup_mems = [0, 1]
    p = _plans(mem(spec))[0]
    assert p.memory_mask == frozenset() and p.placement.kernel_policy == ("preferred", {0})


def test_spill_any_is_the_kernel_s_fallback_and_named_nodes_join_the_mask() -> None:
    from numabind._environ import parse_spill

    m = mem(synth.gb200())
    p = _plans(m, spill=parse_spill("any"))[0]
    assert p.memory_mask == frozenset() and p.placement.kernel_policy == ("preferred", {0})
    p = _plans(m, spill=parse_spill("cpu,2"))[0]
    assert (
        p.memory_mask == {0, 1, 2} and p.memory_text() == "preferred on node 0, then only nodes 1-2"
    )
    p = _plans(m, spill=parse_spill("2"))[0]
    assert p.memory_mask == {0, 2}, "without cpu: the home node and the named one"
    p = _plans(m, spill=parse_spill("cpu,2-5"))[0]
    assert p.memory_mask == frozenset() and p.placement.kernel_policy[0] == "preferred", (
        "every node named: nothing left to keep out"
    )
    p = _plans(m, spill=parse_spill("cpu,9"))[0]
    assert p.memory_mask == {0, 1}
    assert "NUMABIND_SPILL names node 9, which this machine does not have: left out" in p.notes
    spec = synth.gb200()
    spec.cgroup_cpus, spec.cgroup_mems = list(range(144)), [0, 1, 3]
    p = _plans(mem(spec), spill=parse_spill("cpu,2"))[0]
    assert p.memory_mask == {0, 1} and any(
        "outside this process's cpuset.mems" in n for n in p.notes
    )


def test_policies_that_do_not_spill_by_themselves_get_no_mask() -> None:
    m = mem(synth.gb200())
    for memory, kernel in (("bind", ("bind", {0})), ("interleave", ("interleave", {0}))):
        p = _plans(m, memory=memory)[0]
        assert p.memory_mask == frozenset() and p.placement.kernel_policy == kernel
    p = _plans(m, memory="local")[0]
    assert p.placement.kernel_policy == ("bind", {0, 1}), "local, then the nearest CPU node"
    assert _plans(m, memory="none")[0].placement.kernel_policy == ("none", frozenset())


def test_socket_mode_masks_over_every_cpu_node() -> None:
    p = _plans(mem(synth.xeon_max()), mode="socket")[0]
    assert p.memory_policy == "preferred-many" and p.memory_nodes == {0, 1, 2, 3}
    assert p.placement.kernel_policy == ("bind", frozenset(range(8)))


def test_a_one_cpu_node_machine_with_gpu_memory_binds_its_node() -> None:
    """GH200: node 0 holds every CPU (the plan says so, with its thread budget), and
    node 0's only fallback is the GPU's memory."""
    from numabind._environ import parse_spill
    from numabind._plan import nothing_to_bind

    m = mem(synth.gh200())
    [p] = _plans(m)
    assert p.bound and p.cpus == frozenset(range(72)) and p.threads == 72
    assert p.memory_nodes == {0} and p.placement.kernel_policy == ("bind", {0})
    assert p.summary() == (
        "local rank 0: CPUs 0-71, memory preferred on node 0, no other node: GPU 0 "
        "(0009:01:00.0) is on node 0, the one node with CPUs: memory kept off node 1 (no CPUs)"
    )
    assert not nothing_to_bind(m, "node")
    assert nothing_to_bind(m, "node", "preferred", parse_spill("any"))
    assert nothing_to_bind(m, "node", "none")
    assert nothing_to_bind(m, "node", "bind"), "bind keeps node 0 alone anyway"
    [skip] = _plans(m, spill=parse_spill("any"))
    assert skip.skip == "one-node"
    [named] = _plans(m, spill=parse_spill("cpu,1"))
    assert named.skip == "one-node", "the GPU's memory named: nothing left to keep out"
    assert nothing_to_bind(mem(synth.one_node()), "node")


def test_the_appliers_give_the_kernel_the_mask() -> None:
    """This machine has one node: a mask of node 0 is MPOL_BIND 0 from either applier."""
    from numabind import _kernel
    from numabind._apply import apply_plan
    from numabind._pin import ThreadPin
    from numabind._plan import Placement, Plan

    with ThreadPin(
        Placement(
            memory_policy="preferred", memory_nodes=frozenset({0}), memory_mask=frozenset({0})
        )
    ) as pin:
        assert _kernel.get_mempolicy() == ("bind", frozenset({0}))
        assert pin.policy == ("bind", frozenset({0}))
    assert _kernel.get_mempolicy() != ("bind", frozenset({0}))
    p = Plan(
        local_rank=0,
        numa_node=0,
        memory_policy="preferred",
        memory_nodes=frozenset({0}),
        memory_mask=frozenset({0}),
        status="bound",
    )
    b = apply_plan(p, migrate=False)
    try:
        assert b.policy_applied == "bind" and b.policy_nodes == {0}
        assert _kernel.get_mempolicy() == ("bind", frozenset({0}))
    finally:
        b.restore()


def test_the_registry_entry_says_where_memory_may_only_spill() -> None:
    from numabind._apply import Binding
    from numabind._plan import Plan
    from numabind._registry import Entry

    p = Plan(
        local_rank=0,
        numa_node=0,
        memory_policy="preferred",
        memory_nodes=frozenset({0}),
        memory_mask=frozenset({0, 1}),
        status="bound",
    )
    b = Binding(p)
    b.policy_applied, b.policy_nodes = "bind", frozenset({0, 1})
    entry = b.entry()
    assert entry.memory_policy == "bind" and entry.memory_nodes == {0, 1} and entry.spill == {1}
    back = Entry.parse(entry.encode())
    assert back is not None and back.spill == {1}
    b.policy_applied, b.policy_nodes = "preferred", frozenset({0})  # an older plan: no mask
    assert b.entry().spill == frozenset()


def test_check_judges_locality_on_the_home_node_not_the_spill_mask() -> None:
    from numabind.check._inspect import PlanView, _judge

    p = _plans(mem(synth.gb200()))[0]
    view = PlanView.of_plan(p)
    assert (view.memory_policy, view.memory_nodes, view.spill_nodes) == ("bind", {0, 1}, {1})
    assert view.home_nodes == {0}
    problems: list[str] = []
    notes: list[str] = []
    share = _judge(
        view,
        "its environment",
        1,
        {1: p.cpus},
        ("bind", frozenset({0, 1})),
        {0: 10, 1: 90},
        0.9,
        problems,
        notes,
    )
    assert share == pytest.approx(0.1)
    assert problems == ["pages left remote: 10.0% on node(s) 0, 0 MiB on node 1"]
    problems.clear()
    _judge(
        view,
        "its environment",
        1,
        {1: p.cpus},
        ("preferred", frozenset({0})),
        {0: 10},
        0.9,
        problems,
        notes,
    )
    assert problems == ["memory policy is preferred 0, plan bind 0-1"]
    gh = PlanView.of_plan(_plans(mem(synth.gh200()))[0])
    problems.clear()
    _judge(
        gh,
        "its environment",
        1,
        {1: frozenset({0, 5})},
        ("bind", frozenset({0})),
        {0: 9},
        0.9,
        problems,
        notes,
    )
    assert problems == [], "a plan for memory alone does not judge the CPUs"


def test_numactl_lines_give_the_mask(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(capsys, "show", "--example", "gb200", "--numactl")[1]
    assert "rank 0: numactl --physcpubind=0-71 --membind=0-1 -- CMD" in out
    out = run_main(capsys, "show", "--example", "gb200", "--numactl", "--spill", "any")[1]
    assert "rank 0: numactl --physcpubind=0-71 --preferred=0 -- CMD" in out
    out = run_main(capsys, "show", "--example", "gh200", "--numactl")[1]
    assert "rank 0: numactl --physcpubind=0-71 --membind=0 -- CMD" in out


def test_show_says_what_memory_never_reaches(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_main(capsys, "show", "--example", "cxl")[1]
    assert "preferred 0, then 1" in out
    assert (
        "note: spill cpu (the default): once a rank's nodes are full its memory spills onto the "
        "other CPU-memory nodes, nearest first, and never onto nodes 2-3 (far memory)"
    ) in out
    assert "NUMABIND_SPILL=any lets memory spill anywhere instead" in out
    out = run_main(capsys, "show", "--example", "dgx-h100")[1]
    assert "NUMABIND_SPILL" not in out and "spill" not in out
    rc, _, err = run_main(capsys, "show", "--example", "cxl", "--spill", "nowhere")
    assert rc == 2 and "--spill='nowhere' is not cpu, any" in err


def test_the_spill_knob_binds_and_refuses_a_bad_value() -> None:
    from numabind._environ import Config
    from numabind._errors import ConfigError
    from numabind._startup import roles_key

    assert str(Config.from_env({}).spill) == "cpu"
    cfg = Config.from_env({"NUMABIND_SPILL": " cpu, 4 "})
    assert str(cfg.spill) == "cpu,4" and cfg.spill.nodes == {4}
    assert roles_key(cfg) == "|spill=cpu,4" and roles_key(Config.from_env({})) == ""
    with pytest.raises(ConfigError, match="NUMABIND_SPILL='elsewhere'"):
        Config.from_env({"NUMABIND_SPILL": "elsewhere"})


# --- host buffers follow the same rule -----------------------------------------------------------


def _range_policy(address: int) -> str:
    """The policy numa_maps shows for the mapping at ``address`` (an oracle numabind does
    not write)."""
    for line in Path("/proc/self/numa_maps").read_text().splitlines():
        fields = line.split()
        if int(fields[0], 16) == address:
            return fields[1]
    raise AssertionError(f"no mapping at 0x{address:x}")


def test_a_preferred_host_buffer_spills_onto_cpu_memory_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GH200 (generated; this kernel's node 0 is its node 0) a preferred buffer is
    MPOL_BIND over CPU memory: preferred would spill onto the GPU's memory node.  With
    NUMABIND_SPILL=any it is preferred again."""
    import numabind

    monkeypatch.setenv("NUMABIND_SYSROOT", synth.write(synth.gh200(), str(tmp_path / "gh")))
    with numabind.host_buffer(1 << 20, node=0, policy="preferred", register=False) as buf:
        assert buf.policy == "bind" and buf.nodes == (0,)
        assert _range_policy(buf.address) == "bind:0"
        assert any(
            "spills onto CPU memory only (no other node: MPOL_BIND over 0" in n for n in buf.notes
        )
    with numabind.host_buffer(1 << 20, node=0, policy="bind", register=False) as buf:
        assert buf.policy == "bind" and not any("spills" in n for n in buf.notes)
    monkeypatch.setenv("NUMABIND_SPILL", "any")
    with numabind.host_buffer(1 << 20, node=0, policy="preferred", register=False) as buf:
        assert buf.policy == "preferred" and _range_policy(buf.address) == "prefer:0"


def test_bind_range_preferred_keeps_the_range_on_cpu_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mmap

    import numabind

    monkeypatch.setenv("NUMABIND_SYSROOT", synth.write(synth.gh200(), str(tmp_path / "gh")))
    region = mmap.mmap(-1, 16 * mmap.PAGESIZE)
    try:
        import ctypes

        region.write(b"x" * len(region))
        cell = ctypes.c_char.from_buffer(region)
        address = ctypes.addressof(cell)
        del cell
        done = numabind.bind_range(address, len(region), 0, policy="preferred")
        assert done.policy == "bind" and done.placement.get(0) == 16
        assert any("spills onto CPU memory only" in n for n in done.notes)
        assert _range_policy(address) == "bind:0"
    finally:
        region.close()


def test_a_machine_whose_nodes_all_have_cpus_keeps_preferred_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numabind

    monkeypatch.setenv("NUMABIND_SYSROOT", synth.write(synth.one_node(), str(tmp_path / "one")))
    with numabind.host_buffer(1 << 20, node=0, policy="preferred", register=False) as buf:
        assert buf.policy == "preferred" and _range_policy(buf.address) == "prefer:0"


# --- check: memory per tier, and memory on a node it did not ask for ----------------------------


def test_check_counts_memory_per_kind_and_warns_of_unasked_gpu_or_far_memory() -> None:
    from numabind.check._inspect import PlanView, memory_by_kind, wrong_tier_notes
    from numabind.cli._check import tiers_text

    m = mem(synth.gb200())
    pages = {0: 256 * 1024, 2: 450 * 1024}  # 1 GiB on node 0, 1.8 GiB on GPU 0's memory
    assert memory_by_kind(m, pages) == {"cpu": 1 << 30, "gpu": 450 << 22}
    assert tiers_text(memory_by_kind(m, pages)) == "CPU memory 1.0 GiB, GPU memory 1.8 GiB"
    plan = PlanView.of_plan(_plans(m)[0])
    assert wrong_tier_notes(m, pages, plan.memory_nodes, plan) == [
        "warning: 1.8 GiB of this rank's memory is on node 2, GPU 0's memory (not a node "
        "its plan uses)"
    ]
    assert wrong_tier_notes(m, pages, plan.memory_nodes | {2}, plan) == [], "asked for"
    assert wrong_tier_notes(m, {0: 5, 3: 10}, frozenset(), None) == [
        "warning: 1 MiB of this rank's memory is on node 3, GPU 1's memory (it has no plan)"
    ]
    far = mem(synth.cxl())
    assert wrong_tier_notes(far, {2: 512}, frozenset({0, 1}), plan) == [
        "warning: 2 MiB of this rank's memory is on node 2, far memory (not a node its plan uses)"
    ]
    hbm = mem(synth.xeon_max())
    assert wrong_tier_notes(hbm, {8: 512}, frozenset({0}), plan) == [], "HBM is not a wrong tier"
    assert memory_by_kind(hbm, {0: 1, 8: 1}) == {"cpu": 4096, "hbm": 4096}


def test_check_reports_this_process_per_kind(synth_machine: MakeMachine) -> None:
    """A rank checked live: its pages are on this kernel's node 0, CPU memory."""
    import os

    from numabind.check._inspect import check_pid

    r = check_pid(os.getpid(), synth_machine(synth.gb200()), environ={"LOCAL_RANK": "0"})
    assert set(r.tiers) == {"cpu"} and r.tiers["cpu"] > 0
    assert r.to_dict()["tiers"] == r.tiers
    assert not any("warning:" in n and "GPU" in n for n in r.notes)


def test_an_interleaved_gpu_rank_is_noted_by_check_and_doctor() -> None:
    from numabind.check._inspect import PlanView, _interleave_notes
    from numabind.cli._doctor import interleave_finding

    gpu = PlanView(
        device_pci="0000:18:00.0", memory_policy="preferred", memory_nodes=frozenset({0})
    )
    [note] = _interleave_notes(("interleave", frozenset({0, 1, 2, 3})), gpu)
    assert "interleaves over nodes 0-3: pinned staging buffers" in note
    assert _interleave_notes(("interleave", frozenset({0})), gpu) == []
    assert _interleave_notes(("interleave", frozenset({0, 1})), PlanView()) == [], "no GPU"
    found = interleave_finding("interleave", frozenset({0, 1}))
    assert found is not None and found.status == "warn" and "nodes 0-1" in found.detail
    assert "NUMABIND=respect" in found.detail and "numabind.host_buffer" in found.detail
    assert interleave_finding("preferred", frozenset({0})) is None


def test_the_pin_thread_takes_the_rank_s_policy_under_a_blanket_interleave() -> None:
    from numabind.torch import staging_policy_needed

    p = _plans(mem(synth.gb200()))[0]
    assert staging_policy_needed(("interleave", frozenset({0, 1, 2, 3, 4, 5})), p)
    assert not staging_policy_needed(("interleave", frozenset({0})), p)
    assert not staging_policy_needed(("bind", frozenset({0, 1})), p)
    assert not staging_policy_needed(
        ("interleave", frozenset({0, 1})), p.replace(memory_policy="interleave")
    ), "interleave is what the rank asked for"
