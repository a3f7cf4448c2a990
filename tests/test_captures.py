"""Every capture in tests/data/hwloc, read through the library's own readers (tarballs
in memory, as ``show --input`` reads them), with the expected answers from its MANIFEST."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from numabind._devices import Visible, resolve
from numabind._plan import Request, plan
from numabind._sysfs import parse_cpulist
from numabind._topology import Machine


def _tar(path: str) -> Machine:
    return Machine.from_capture(path)


def cl(text: str) -> frozenset[int]:
    return parse_cpulist(text)


def plans(m: Machine, n: int, mode: str = "node", env: dict[str, str] | None = None) -> list:
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
            ),
        )
        for r in range(n)
    ]


# --- XML captures --------------------------------------------------------------------------


def test_dgx2_xml(hwloc_dir: Path) -> None:
    m = Machine.from_capture(str(hwloc_dir / "nvidiaDGX2.xml"))
    assert [n.id for n in m.nodes] == [0, 1]
    assert m.node(0).cpus == cl("0-1") and m.node(1).cpus == cl("24-25")
    gpus = m.all_accelerators
    assert len(gpus) == 16, "12 NVSwitches (class 0680) are not GPUs"
    assert all(g.vendor == "nvidia" and g.uuid and g.uuid.startswith("GPU-") for g in gpus)
    ps = plans(m, 16)
    assert [p.numa_node for p in ps] == [0] * 8 + [1] * 8
    assert all(p.cpus == (cl("0-1") if p.numa_node == 0 else cl("24-25")) for p in ps)
    assert ps[3].device.pci == "0000:3b:00.0" and ps[8].device.pci == "0000:b7:00.0"
    assert all(p.memory_policy == "preferred" and p.memory_nodes == {p.numa_node} for p in ps)


def test_power8_pci_domain_carries_locality(hwloc_dir: Path) -> None:
    m = Machine.from_capture(str(hwloc_dir / "power8gpudistances.xml"))
    ps = plans(m, 4)
    assert [p.device.pci for p in ps] == [
        "0002:01:00.0",
        "0003:01:00.0",
        "000a:01:00.0",
        "000b:01:00.0",
    ]
    assert [p.numa_node for p in ps] == [0, 0, 1, 1]
    assert ps[0].cpus == cl("0-1,8-9,16-17,24-25")
    assert ps[2].cpus == cl("80-81,88-89,96-97,104-105")


def test_even_odd_numbering_and_bmc_vga(hwloc_dir: Path) -> None:
    m = Machine.from_capture(str(hwloc_dir / "24em64t-2n6c2t-pci.xml"))
    assert [a.pci for a in m.all_accelerators] == [
        "0000:06:00.0",
        "0000:11:00.0",
        "0000:14:00.0",
    ], "the ATI ES1000 BMC VGA (1002:515e) is not a compute GPU"
    ps = plans(m, 3)
    assert [p.numa_node for p in ps] == [0, 1, 1]
    assert ps[0].cpus == frozenset(range(0, 24, 2)) and ps[1].cpus == frozenset(range(1, 24, 2))


def test_disallowed_node_is_reported_not_bound_elsewhere(hwloc_dir: Path) -> None:
    m = Machine.from_capture(str(hwloc_dir / "irregulargroups-disallowed.xml"))
    assert m.allowed.cpus == cl("0-15") and m.allowed.mems == cl("0-1")
    gpus = m.all_accelerators
    assert [(g.pci, g.numa_node) for g in gpus] == [("0002:01:00.0", 4), ("0004:01:00.0", 7)]
    for p, cpus in zip(plans(m, 2), ("32-39", "56-63")):
        assert p.status == "skipped" and p.problem and not p.cpus
        assert f"CPUs {cpus}" in p.reason and "0-15" in p.reason


# --- sysfs captures ------------------------------------------------------------------------


def test_power9_gpu_memory_nodes(capture: Callable[[str], str]) -> None:
    m = _tar(capture("nvidiagpunumanodes.tar.bz2"))
    assert [n.id for n in m.nodes] == [0, 8, 250, 251, 252, 253, 254, 255]
    assert [n.id for n in m.cpu_nodes] == [0, 8], "GPU memory nodes have no CPUs"
    # cpulist says 0-87 / 88-175 (an hwloc edit); intersected with online it is right
    assert m.node(0).cpus == cl("0-15") and m.node(8).cpus == cl("88-103")
    assert m.allowed.cpus == cl("0-15"), "cgroup v1 cpuset.effective_cpus 0-87 ∩ online"
    assert m.allowed.kind == "cgroup-v1" and m.allowed.directory.endswith("/jjh")
    gpus = m.all_accelerators
    assert [g.pci for g in gpus] == [
        "0004:05:00.0",
        "0004:06:00.0",
        "0006:00:00.0",
        "0007:00:00.0",
        "0035:04:00.0",
        "0035:05:00.0",
    ]
    assert [g.memory_node for g in gpus] == [255, 254, 253, 252, 251, 250]
    assert all(g.numa_node is None for g in gpus), "no numa_node file: locality from local_cpus"
    ps = plans(m, 6)
    assert [p.numa_node for p in ps[:3]] == [0, 0, 0]
    assert all(p.cpus == cl("0-15") and p.memory_nodes == {0} for p in ps[:3])
    for p in ps[3:]:
        assert p.status == "skipped" and "88-103" in p.reason, p.reason


def test_nec_vector_engines_are_not_gpus(capture: Callable[[str], str]) -> None:
    m = _tar(capture("32intel64-2p8co2t+8ve.tar.bz2"))
    assert m.online_cpus == cl("0-31")
    assert m.node(0).cpus == cl("0-7,16-23") and m.node(1).cpus == cl("8-15,24-31")
    assert m.all_accelerators == (), "class 0x0b40 co-processors are not compute GPUs"
    info = m.cpu_info(0)
    assert info.siblings == {0, 16} and info.package == 0
    assert m.node(0, full=True).distances == ((0, 10), (1, 21))
    assert m.node(0, full=True).memory_bytes and m.node(0, full=True).memory_bytes > 40 * 2**30


def test_unknown_locality_everywhere(capture: Callable[[str], str]) -> None:
    m = _tar(capture("40intel64-2g2n4c+pcilocality.tar.bz2"))
    assert m.node(2).cpus == frozenset(range(2, 40, 4))
    assert m.all_accelerators == (), "the Matrox VGA is not a compute GPU"
    assert "cgroup v1" in m.allowed.source and "torque" in m.allowed.source
    # a device of unknown locality is never given node 0
    from numabind._model import Accelerator
    from numabind._plan import device_node

    vga = Accelerator(pci="0000:01:03.0", vendor="nvidia", local_cpus=m.online_cpus)
    assert device_node(m, vga).node is None
    fake = Visible(devices=(vga,), vendor="nvidia", source="test")
    p = plan(m, Request(local_rank=0, local_world_size=1, rank_source="LOCAL_RANK", visible=fake))
    assert p.status == "skipped" and "unknown" in p.reason


def test_cgroup2_restriction(capture: Callable[[str], str]) -> None:
    m = _tar(capture("32amd64-4s2n4c-cgroup2.tar.bz2"))
    assert len(m.nodes) == 8 and m.online_cpus == cl("0-31")
    assert m.allowed.cpus == cl("0-5") and m.allowed.mems == cl("0-5")
    assert m.allowed.kind == "cgroup-v2" and m.allowed.directory.endswith("step_0")
    ps = plans(m, 8)  # CPU-only job: spread block-wise over the nodes with allowed CPUs
    assert {p.numa_node for p in ps} == {0, 1}
    assert ps[0].cpus == cl("0-3") and ps[7].cpus == cl("4-5")


def test_snc2_round_robin(capture: Callable[[str], str]) -> None:
    m = _tar(capture("memorysidecaches.tar.bz2"))
    assert m.node(0).cpus == frozenset(range(0, 80, 4))
    assert m.node(0, full=True).distance_to(2) == 11 and m.node(0, full=True).distance_to(1) == 21
    ps = plans(m, 4, mode="socket")
    # socket mode takes both SNC halves of the package: nodes 0+2 (even CPUs)
    assert ps[0].cpus == frozenset(range(0, 80, 2))
    assert ps[1].cpus == frozenset(range(1, 80, 2))


def test_kept_console_agrees_with_power9_reading(
    hwloc_dir: Path, capture: Callable[[str], str]
) -> None:
    text = (hwloc_dir / "nvidiagpunumanodes-kept.console").read_text()
    m = _tar(capture("nvidiagpunumanodes.tar.bz2"))
    for g in m.all_accelerators:
        assert f"P#{g.memory_node}" in text and g.pci in text
