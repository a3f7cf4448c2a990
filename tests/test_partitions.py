"""AMD GPUs split into compute partitions (MI300X in DPX/QPX/CPX), in a memory-partition
mode (NPS1/NPS4), and GPUs without NUMA affinity: what the runtime numbers, where each
partition's rank goes (issue 36).  The partition topology is AMD's KFD
(/sys/class/kfd/kfd/topology/nodes), read from a real CPX host's copy (tests/data/kfd,
Apache-2.0: see its MANIFEST.md) and from generated machines."""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest

import synth
from numabind._devices import resolve
from numabind._plan import Request, plan
from numabind._sources import SysfsSource
from numabind._topology import Machine
from numabind.capture._examples import MemoryRoot, build, mi300x_cpx
from numabind.cli import main

KFD = Path(__file__).resolve().parent / "data" / "kfd" / "mi300x-cpx" / "topology"
BUSES = ("05", "27", "47", "65", "85", "a7", "c7", "e5")


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def real_cpx(tmp_path: Path) -> str:
    """The generated 8-GPU host with the real host's KFD topology in place of its own."""
    spec = mi300x_cpx()
    spec.kfd = False
    root = synth.write(spec, str(tmp_path / "cpx"))
    shutil.copytree(KFD, Path(root) / "sys/class/kfd/kfd/topology")
    return root


def generated(spec: synth.Spec) -> Machine:
    tree = build(spec)
    return Machine(SysfsSource(MemoryRoot(tree.files, "generated", tree.links)))


def plans(m: Machine, env: dict[str, str] | None = None, mode: str = "node") -> list:  # type: ignore[type-arg]
    visible = resolve(m, env or {})
    n = len(visible.devices)
    return [
        plan(m, Request(local_rank=r, local_world_size=n, visible=visible, mode=mode))
        for r in range(n)
    ]


def test_the_real_cpx_topology_is_read_in_kfd_order(real_cpx: str) -> None:
    """The host's topology lists 63 GPU agents: the last GPU shows 7 of its 8 partitions
    (ROCm SMI's release notes: in CPX mode, a limit of 64 DRM nodes).  The runtime
    numbers what the topology lists, so numabind does too."""
    m = Machine.from_root(real_cpx)
    visible = resolve(m, {})
    devs = visible.devices
    assert len(devs) == 63 and len(m.accelerators) == 8
    per_gpu = [8] * 7 + [7]
    assert [d.pci for d in devs] == [
        f"0000:{b}:00.0" for b, n in zip(BUSES, per_gpu) for _ in range(n)
    ]
    assert [d.partition for d in devs] == [k for n in per_gpu for k in range(n)]
    assert [d.render_minor for d in devs] == list(range(128, 191)), "KFD node order"
    assert [d.partitions for d in devs] == [n for n in per_gpu for _ in range(n)]
    assert {(d.compute_partition, d.memory_partition) for d in devs} == {("CPX", "NPS4")}
    assert visible.source == (
        "all 63 reachable amd devices: 8 GPUs in CPX, split into compute partitions"
    )
    assert len(set(devs)) == 63, "a partition is a device of its own"


def test_visibility_is_resolved_per_partition(real_cpx: str) -> None:
    """ROCR_VISIBLE_DEVICES=5 is GPU 0's partition 5, not the sixth GPU (mpibind#45)."""
    m = Machine.from_root(real_cpx)
    v = resolve(m, {"ROCR_VISIBLE_DEVICES": "5,37"})
    assert [(d.pci, d.partition) for d in v.devices] == [("0000:05:00.0", 5), ("0000:85:00.0", 5)]
    [first, second] = plans(m, {"ROCR_VISIBLE_DEVICES": "5,37"})
    assert first.numa_node == 0 and second.numa_node == 1
    assert first.reason == "AMD GPU 0 (0000:05:00.0 partition 5) is on node 0"
    v = resolve(m, {"ROCR_VISIBLE_DEVICES": "8,9,10,40", "HIP_VISIBLE_DEVICES": "3"})
    assert [(d.pci, d.partition) for d in v.devices] == [("0000:a7:00.0", 0)]
    v = resolve(m, {"ROCR_VISIBLE_DEVICES": "GPU-e3a0b1c2d3e4f500"})
    assert v.devices == () and v.problem is not None
    assert "names all 8 compute partitions of 0000:05:00.0" in v.problem


def test_partitions_of_one_gpu_share_its_node_and_exclusive_splits_it(real_cpx: str) -> None:
    m = Machine.from_root(real_cpx)
    node = plans(m)
    assert {p.cpus for p in node[:32]} == {frozenset(range(96))}
    assert {p.cpus for p in node[32:]} == {frozenset(range(96, 192))}
    assert all(p.memory_nodes == {p.numa_node} for p in node)
    assert {p.threads for p in node[:32]} == {3}, "96 cores over the node's 32 partitions"
    exclusive = plans(m, mode="exclusive")
    sets = [p.cpus for p in exclusive[:32]]
    assert [len(s) for s in sets] == [3] * 32 and len(frozenset().union(*sets)) == 96
    assert exclusive[0].cpus == {0, 1, 2} and exclusive[31].cpus == {93, 94, 95}


def test_a_gpu_in_spx_is_one_device_and_its_topology_is_only_listed() -> None:
    spec = mi300x_cpx(compute="SPX", memory="NPS1")
    m = generated(spec)
    reads: list[str] = []
    original = m.source._read  # type: ignore[attr-defined]

    def counting(path: str) -> str | None:
        reads.append(path)
        return original(path)  # type: ignore[no-any-return]

    m.source._read = counting  # type: ignore[attr-defined]
    devs = resolve(m, {}).devices
    assert len(devs) == 8 and {d.partition for d in devs} == {None}
    assert not [r for r in reads if "/kfd/" in r], "2 CPU + 8 GPU agents: nothing to read"


@pytest.mark.parametrize(("mode", "count"), [("DPX", 2), ("QPX", 4)])
def test_dpx_and_qpx_are_that_many_partitions(mode: str, count: int) -> None:
    devs = resolve(generated(mi300x_cpx(compute=mode, memory="NPS1")), {}).devices
    assert len(devs) == 8 * count and [d.partition for d in devs[:count]] == list(range(count))


def test_a_gpu_without_numa_affinity_is_one_line_and_no_guess() -> None:
    """sysfs numa_node -1 and a locality of the whole machine (amd-smi: AFFINITY NONE;
    its NODE comes from KFD, which numabind does not take for a NUMA node)."""
    m = generated(mi300x_cpx(numa=(-1,) * 8))
    ps = plans(m, {"ROCR_VISIBLE_DEVICES": "3"})
    assert [p.skip for p in ps] == ["unknown-node"]
    assert ps[0].reason == (
        "the NUMA node of AMD GPU 0 (0000:05:00.0 partition 3) is unknown (sysfs numa_node "
        "is -1 and its CPU locality is the whole machine); left unbound rather than guess"
    )
    assert "\n" not in ps[0].reason


def test_show_reports_partitions_and_memory_partition_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, _ = run_main(capsys, "show", "--example", "mi300x-cpx")
    assert rc == 0
    assert "  0-7    0000:05:00.0  amd     0" in out
    assert "(CPX: 8 compute partitions, NPS4)" in out
    data = json.loads(run_main(capsys, "show", "--example", "mi300x-cpx", "--json")[1])
    first = data["devices"][0]
    assert first["indices"] == list(range(8)) and first["partitions"] == 8
    assert (first["compute_partition"], first["memory_partition"]) == ("CPX", "NPS4")
    assert len(data["ranks"]) == 64
    rc, out, _ = run_main(capsys, "show", "--example", "mi300x-cpx", "--matrix")
    assert out.splitlines()[0].split()[:9] == [f"GPU{i}" for i in range(8)] + ["CPU"]


def test_check_names_the_gpu_of_a_partition_s_render_node(
    real_cpx: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from numabind.check import _inspect

    m = Machine.from_root(real_cpx)
    monkeypatch.setattr(_inspect, "_drm_pci", lambda name: "amdgpu_xcp.41")
    assert _inspect._render_pci(m, "amd", "renderD169", 169) == "0000:a7:00.0"
    assert _inspect._render_pci(m, "amd", "renderD999", 999) is None


def test_gather_keeps_the_partition_topology(
    capsys: pytest.CaptureFixture[str],
    real_cpx: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NUMABIND_SYSROOT", real_cpx)
    tar = tmp_path / "cpx.tar.gz"
    assert run_main(capsys, "gather", str(tar))[0] == 0
    monkeypatch.delenv("NUMABIND_SYSROOT")
    with tarfile.open(tar) as t:
        names = t.getnames()
    assert sum(n.endswith("/properties") and "/kfd/" in n for n in names) == 65
    assert any(n.endswith("0000:05:00.0/current_compute_partition") for n in names)
    devs = resolve(Machine.from_capture(str(tar)), {}).devices
    assert len(devs) == 63 and devs[9].pci == "0000:27:00.0" and devs[9].partition == 1
