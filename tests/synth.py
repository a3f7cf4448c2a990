"""Generate sysfs/procfs trees of machines the hwloc captures lack.

Everything is written by code from a few parameters, in the layout the live kernel uses,
and then read through the same :class:`numabind._topology.SysfsSource` as a real system.
Used by the tests and by benchmarks/ (a DGX-sized machine for the startup budget).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from numabind._sysfs import format_cpulist


@dataclass
class Gpu:
    bdf: str
    node: int  # what sysfs numa_node says (-1: unknown)
    vendor: int = 0x10DE
    device: int = 0x2330
    pci_class: int = 0x030200
    local_cpus: Sequence[int] | None = None
    uuid: str | None = None
    minor: int | None = None
    memory_node: int | None = None
    driver: bool = True  # listed under /proc/driver/nvidia/gpus
    unique_id: str | None = None  # amdgpu's sysfs unique_id (hex)


@dataclass
class Spec:
    nodes: list[list[int]]  # CPUs of each node (empty: memory-only node)
    package_of_node: list[int]
    smt: int = 1  # threads per core: siblings are cpu, cpu+stride, ...
    smt_stride: int = 0
    l3: list[list[int]] = field(default_factory=list)  # cache domains (default: per node)
    memory_gib: int = 256
    gpus: list[Gpu] = field(default_factory=list)
    filler_pci: int = 0  # other PCI functions (bridges, NICs, ...)
    cgroup_cpus: Iterable[int] | None = None
    cgroup_mems: Iterable[int] | None = None
    proc_nvidia: bool = True
    environ: dict[str, str] | None = None
    kernel: str = "6.8.0-generic"
    numa_balancing: int | None = None  # /proc/sys/kernel/numa_balancing (None: absent)


def _w(root: str, path: str, text: str) -> None:
    full = root + path
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w") as f:
        f.write(text + "\n")


def _mask(cpus: Iterable[int]) -> str:
    cpus = sorted(cpus)
    top = (max(cpus) // 32 + 1) if cpus else 1
    words = []
    for w in range(top):
        v = 0
        for c in cpus:
            if w * 32 <= c < (w + 1) * 32:
                v |= 1 << (c - w * 32)
        words.append(f"{v:08x}")
    return ",".join(reversed(words))


def write(spec: Spec, root: str) -> str:
    """Write the tree for ``spec`` under ``root``; returns ``root``."""
    all_cpus = sorted(c for n in spec.nodes for c in n)
    online = format_cpulist(all_cpus)
    _w(root, "/sys/devices/system/cpu/online", online)
    _w(root, "/sys/devices/system/cpu/present", online)
    node_ids = list(range(len(spec.nodes)))
    _w(root, "/sys/devices/system/node/online", format_cpulist(node_ids))
    _w(
        root,
        "/sys/devices/system/node/has_cpu",
        format_cpulist(i for i, n in enumerate(spec.nodes) if n),
    )
    pkgs = {i: spec.package_of_node[i] for i in node_ids}
    for i, cpus in enumerate(spec.nodes):
        base = f"/sys/devices/system/node/node{i}"
        _w(root, f"{base}/cpulist", format_cpulist(cpus))
        _w(root, f"{base}/cpumap", _mask(cpus))
        _w(root, f"{base}/meminfo", f"Node {i} MemTotal:       {spec.memory_gib * 1024 * 1024} kB")
        dists = []
        for j in node_ids:
            if i == j:
                dists.append(10)
            elif not spec.nodes[i] or not spec.nodes[j]:
                dists.append(80)
            else:
                dists.append(12 if pkgs[i] == pkgs[j] else 32)
        _w(root, f"{base}/distance", " ".join(map(str, dists)))
    l3 = spec.l3 or [n for n in spec.nodes if n]
    l3_of = {c: dom for dom in l3 for c in dom}
    for i, cpus in enumerate(spec.nodes):
        for c in cpus:
            base = f"/sys/devices/system/cpu/cpu{c}"
            if spec.smt > 1:
                first = c % spec.smt_stride if c >= spec.smt_stride else c
                sib = [first + k * spec.smt_stride for k in range(spec.smt)]
            else:
                sib = [c]
            _w(root, f"{base}/topology/physical_package_id", str(pkgs[i]))
            _w(root, f"{base}/topology/core_cpus_list", format_cpulist(sib))
            _w(root, f"{base}/topology/thread_siblings_list", format_cpulist(sib))
            for idx, (level, kind, shared) in enumerate(
                [
                    (1, "Data", sib),
                    (1, "Instruction", sib),
                    (2, "Unified", sib),
                    (3, "Unified", l3_of.get(c, cpus)),
                ]
            ):
                cb = f"{base}/cache/index{idx}"
                _w(root, f"{cb}/level", str(level))
                _w(root, f"{cb}/type", kind)
                _w(root, f"{cb}/shared_cpu_list", format_cpulist(shared))
    for k in range(spec.filler_pci):
        bdf = f"0000:{(k // 32) % 256:02x}:{k % 32:02x}.{k % 4}"
        base = f"/sys/bus/pci/devices/{bdf}"
        _w(root, f"{base}/vendor", "0x8086")
        _w(root, f"{base}/device", "0x09a2")
        _w(root, f"{base}/class", "0x088000" if k % 3 else "0x060400")
        _w(root, f"{base}/numa_node", str(k % max(len(spec.nodes), 1)))
        _w(root, f"{base}/local_cpulist", online)
    for g in spec.gpus:
        base = f"/sys/bus/pci/devices/{g.bdf}"
        _w(root, f"{base}/vendor", f"0x{g.vendor:04x}")
        _w(root, f"{base}/device", f"0x{g.device:04x}")
        _w(root, f"{base}/class", f"0x{g.pci_class:06x}")
        _w(root, f"{base}/numa_node", str(g.node))
        local = g.local_cpus
        if local is None:
            local = spec.nodes[g.node] if g.node >= 0 else all_cpus
        _w(root, f"{base}/local_cpulist", format_cpulist(local))
        _w(root, f"{base}/local_cpus", _mask(local))
        if g.unique_id is not None:
            _w(root, f"{base}/unique_id", g.unique_id)
        if g.vendor == 0x10DE and g.pci_class >> 16 == 3 and spec.proc_nvidia and g.driver:
            pbase = f"/proc/driver/nvidia/gpus/{g.bdf}"
            _w(
                root,
                f"{pbase}/information",
                f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 123\n"
                f"GPU UUID: \t {g.uuid or 'GPU-unknown'}\n"
                f"Video BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
                f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {g.bdf}\n"
                f"Device Minor: \t {g.minor}",
            )
            if g.memory_node is not None:
                _w(root, f"{pbase}/numa_status", f"Node:      {g.memory_node}\nStatus:    online")
    _w(root, "/proc/sys/kernel/osrelease", spec.kernel)
    if spec.numa_balancing is not None:
        _w(root, "/proc/sys/kernel/numa_balancing", str(spec.numa_balancing))
    if spec.cgroup_cpus is not None:
        _w(root, "/proc/self/cgroup", "0::/job/step")
        _w(root, "/proc/self/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0")
        d = "/sys/fs/cgroup/job/step"
        _w(root, f"{d}/cpuset.cpus.effective", format_cpulist(spec.cgroup_cpus))
        mems = spec.cgroup_mems if spec.cgroup_mems is not None else range(len(spec.nodes))
        _w(root, f"{d}/cpuset.mems.effective", format_cpulist(mems))
    else:
        _w(root, "/proc/self/cgroup", "0::/")
        _w(root, "/proc/self/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0")
        _w(root, "/sys/fs/cgroup/cpuset.cpus.effective", online)
        _w(root, "/sys/fs/cgroup/cpuset.mems.effective", format_cpulist(node_ids))
    if spec.environ is not None:
        _w(root, "/numabind-env.json", json.dumps({"environ": spec.environ}))
    return root


# --- the machines ------------------------------------------------------------------------


def _uuid(i: int) -> str:
    return f"GPU-{i:08x}-1111-2222-3333-{i:012x}"


DGX_BDFS = [
    "0000:18:00.0",
    "0000:2a:00.0",
    "0000:3a:00.0",
    "0000:5d:00.0",
    "0000:9a:00.0",
    "0000:ab:00.0",
    "0000:ba:00.0",
    "0000:db:00.0",
]


def dgx_h100(**over: object) -> Spec:
    """DGX/HGX H100: 2 sockets x 56 cores x 2 threads (224 CPUs), 8 GPUs, 4 per socket,
    4 NVSwitches, an ASPEED BMC VGA, ~400 PCI functions in all."""
    n0 = list(range(0, 56)) + list(range(112, 168))
    n1 = list(range(56, 112)) + list(range(168, 224))
    gpus = [Gpu(b, 0 if i < 4 else 1, uuid=_uuid(i), minor=i) for i, b in enumerate(DGX_BDFS)]
    gpus += [
        Gpu(f"0000:{0xC0 + k:02x}:00.0", 1, device=0x22A3, pci_class=0x068000) for k in range(4)
    ]
    gpus.append(Gpu("0000:03:00.0", 0, vendor=0x1A03, device=0x2000, pci_class=0x030000))
    spec = Spec(
        nodes=[n0, n1],
        package_of_node=[0, 1],
        smt=2,
        smt_stride=112,
        memory_gib=1024,
        gpus=gpus,
        filler_pci=387,
    )
    for k, v in over.items():
        setattr(spec, k, v)
    return spec


def nps4() -> Spec:
    """2-socket AMD EPYC in NPS4 (8 nodes of 16 cores, 2 CCX of 8 cores each), 4 GPUs whose
    PCI order lands them on nodes 3, 1, 7, 5."""
    nodes = [list(range(16 * i, 16 * i + 16)) for i in range(8)]
    l3 = [list(range(8 * i, 8 * i + 8)) for i in range(16)]
    gpus = [
        Gpu(f"0000:{b:02x}:00.0", n, device=0x20B0, uuid=_uuid(i), minor=i)
        for i, (b, n) in enumerate([(0x01, 3), (0x41, 1), (0x81, 7), (0xC1, 5)])
    ]
    return Spec(nodes=nodes, package_of_node=[0, 0, 0, 0, 1, 1, 1, 1], l3=l3, gpus=gpus)


def gb200() -> Spec:
    """2 Grace CPUs (nodes 0, 1; 72 cores each) and 4 Blackwell GPUs whose memory shows as
    CPU-less nodes 2-5; each GPU's PCI numa_node names its memory node, as NVML does."""
    nodes = [list(range(0, 72)), list(range(72, 144)), [], [], [], []]
    gpus = [
        Gpu(
            f"{(i + 1) * 8:04x}:01:00.0",
            2 + i,
            device=0x2941,
            uuid=_uuid(i),
            minor=i,
            memory_node=2 + i,
            local_cpus=nodes[i // 2],
        )
        for i in range(4)
    ]
    return Spec(nodes=nodes, package_of_node=[0, 1, 0, 0, 1, 1], gpus=gpus)


def mi300x() -> Spec:
    """8 AMD MI300X (class 0x1200, processing accelerator), 4 per socket, 2 sockets."""
    n0, n1 = list(range(0, 96)), list(range(96, 192))
    gpus = [
        Gpu(
            f"0000:{b:02x}:00.0",
            0 if i < 4 else 1,
            vendor=0x1002,
            device=0x74A1,
            pci_class=0x120000,
        )
        for i, b in enumerate([0x05, 0x15, 0x65, 0x75, 0x85, 0x95, 0xE5, 0xF5])
    ]
    return Spec(nodes=[n0, n1], package_of_node=[0, 1], gpus=gpus)


def container_2_of_8() -> Spec:
    """A container granted GPUs 2 and 5 of a DGX: sysfs lists all 8, the driver's /proc
    only the two mounted ones; the cgroup allows both sockets' first 8 cores."""
    spec = dgx_h100(filler_pci=20)
    for i, g in enumerate(spec.gpus[:8]):
        g.driver = i in (2, 5)
    spec.cgroup_cpus = list(range(0, 8)) + list(range(56, 64))
    return spec


def two_nodes(gpus: int = 2) -> Spec:
    """The smallest two-node machine this 2-CPU host can really bind to: node 0 = CPU 0,
    node 1 = CPU 1, GPUs alternating between them (GPU i on node i % 2)."""
    return Spec(
        nodes=[[0], [1]],
        package_of_node=[0, 1],
        memory_gib=1,
        gpus=[Gpu(f"0000:{i + 1:02x}:00.0", i % 2) for i in range(gpus)],
    )


def one_node() -> Spec:
    """A workstation or a one-GPU cloud VM: one node holding CPUs 0-1 and one GPU, where
    a rank has nothing to bind."""
    return Spec(nodes=[[0, 1]], package_of_node=[0], gpus=[Gpu("0000:01:00.0", 0)])
