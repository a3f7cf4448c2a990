"""Example machines, generated: the GPU servers numabind is for, as sysfs/procfs trees.

``numabind show --example dgx-h100`` and :meth:`numabind.Machine.from_example` read them
from memory (:class:`MemoryRoot`); the tests write the same trees to disk with
:func:`write` and read them back through the live reader's own code.  Everything is
written from a few parameters (:class:`Spec`), in the layout the kernel uses: node and CPU
directories with caches and SMT siblings, PCI functions with their locality, NVIDIA's
driver directory, a cgroup v2 cpuset.

Not on the startup path (``dataclasses`` is fine here).
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .. import _sysfs
from .._sources import Root
from .._sysfs import format_cpulist


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
    model: str = "NVIDIA H100 80GB HBM3"
    # Where it hangs in the PCI tree: host bridge ("pci0000:15") first, then each bridge
    # port; the device's directory then lives under /sys/devices/... and
    # /sys/bus/pci/devices/<bdf> is a link to it, as on a live machine (None: no tree).
    bridges: tuple[str, ...] | None = None
    rdma: str | None = None  # an RDMA adapter's /sys/class/infiniband name (mlx5_0)
    # an AMD GPU's compute partitions (each one KFD node), and the modes amdgpu's
    # current_compute_partition / current_memory_partition say (None: files absent)
    partitions: int = 1
    compute_partition: str | None = None
    memory_partition: str | None = None


@dataclass
class Port:
    """One port of an RDMA adapter, as the files of ``ports/<n>`` spell it."""

    number: int = 1
    state: str = "4: ACTIVE"
    rate: str = "400 Gb/sec (4X NDR)"
    link_layer: str = "InfiniBand"
    netdev: str | None = None  # gid_attrs/ndevs/0: the interface of a RoCE port


@dataclass
class Adapter:
    """A network adapter on PCI: an RDMA device (``name``) with its ports and its PCI
    function's interfaces, or (``name`` empty) a plain network function."""

    name: str
    bdf: str
    node: int
    bridges: tuple[str, ...] | None = None
    ports: list[Port] = field(default_factory=lambda: [Port()])
    netdevs: list[str] = field(default_factory=list)  # the function's device/net/*
    vendor: int = 0x15B3
    device: int = 0x101D
    pci_class: int = 0x020700


@dataclass
class Iface:
    """A network interface of /sys/class/net: its speed (Mb/s), the PCI function it
    belongs to (None: virtual, as a bond), its members when it is a bond, and whether it
    is enslaved to one."""

    name: str
    speed: int | None = 400000
    pci: str | None = None
    slaves: list[str] | None = None
    enslaved: bool = False


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
    # per-CPU files that tell cores apart (numabind._model.KIND_FILES paths): path -> CPU
    # -> value, written under /sys/devices/system/cpu/cpuN/
    cpu_files: dict[str, dict[int, int]] = field(default_factory=dict)
    # the SLIT, when the default rule (10 local, 12 same package, 32 across, 80 to and
    # from a memory-only node) is not the machine's
    distance_matrix: list[list[int]] | None = None
    memory_gib_of: dict[int, int] | None = None  # per-node sizes beyond memory_gib
    tiers: dict[int, int] | None = None  # node -> kernel memory tier (memory_tierN)
    bandwidth: dict[int, int] | None = None  # node -> HMAT read bandwidth (MB/s)
    vendor: str | None = None  # "intel" / "amd": /sys/devices/system/cpu/modalias
    kfd: bool = False  # write AMD's KFD topology: a CPU agent per CPU node, then the GPUs'
    cgroup_path: str = "/job/step"  # the process's cgroup (v2) where cgroup_cpus is set
    files: dict[str, str] = field(default_factory=dict)  # more files: a pod's DRA metadata
    masked_pci: tuple[str, ...] = ()  # devices whose sysfs entry is absent (a masked /sys)
    adapters: list[Adapter] = field(default_factory=list)  # network adapters (numabind._rdma)
    interfaces: list[Iface] = field(default_factory=list)  # /sys/class/net entries


def _mask(cpus: Iterable[int]) -> str:
    """A kernel bitmap (32-bit hex words, most significant first)."""
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


class _Tree:
    """The files of one machine, as path -> text."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.files: dict[str, str] = {}
        self.links: dict[str, str] = {}  # link path -> absolute target
        self.all_cpus = sorted(c for n in spec.nodes for c in n)
        self.online = format_cpulist(self.all_cpus)
        self.node_ids = list(range(len(spec.nodes)))

    def w(self, path: str, text: str) -> None:
        self.files[path] = text + "\n"

    def nodes(self) -> None:
        spec, ids = self.spec, self.node_ids
        self.w("/sys/devices/system/cpu/online", self.online)
        self.w("/sys/devices/system/cpu/present", self.online)
        self.w("/sys/devices/system/node/online", format_cpulist(ids))
        has_cpu = format_cpulist(i for i, n in enumerate(spec.nodes) if n)
        self.w("/sys/devices/system/node/has_cpu", has_cpu)
        for i, cpus in enumerate(spec.nodes):
            base = f"/sys/devices/system/node/node{i}"
            self.w(f"{base}/cpulist", format_cpulist(cpus))
            self.w(f"{base}/cpumap", _mask(cpus))
            gib = (spec.memory_gib_of or {}).get(i, spec.memory_gib)
            self.w(f"{base}/meminfo", f"Node {i} MemTotal:       {gib * 1024 * 1024} kB")
            self.w(f"{base}/distance", " ".join(str(self.distance(i, j)) for j in ids))
            if spec.bandwidth and i in spec.bandwidth:
                self.w(f"{base}/access0/initiators/read_bandwidth", str(spec.bandwidth[i]))
        by_tier: dict[int, list[int]] = {}
        for node, tier in (spec.tiers or {}).items():
            by_tier.setdefault(tier, []).append(node)
        for tier, members in by_tier.items():
            tb = f"/sys/devices/virtual/memory_tiering/memory_tier{tier}"
            self.w(f"{tb}/nodelist", format_cpulist(members))
        if spec.vendor is not None:
            ven = {"intel": "0000", "amd": "0002"}[spec.vendor]
            self.w(
                "/sys/devices/system/cpu/modalias",
                f"cpu:type:x86,ven{ven}fam0006mod008F:feature:,0000",
            )

    def distance(self, i: int, j: int) -> int:
        spec = self.spec
        if spec.distance_matrix is not None:
            return spec.distance_matrix[i][j]
        if i == j:
            return 10
        if not spec.nodes[i] or not spec.nodes[j]:
            return 80
        return 12 if spec.package_of_node[i] == spec.package_of_node[j] else 32

    def cpus(self) -> None:
        spec = self.spec
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
                self.w(f"{base}/topology/physical_package_id", str(spec.package_of_node[i]))
                for path, values in spec.cpu_files.items():
                    if c in values:
                        self.w(f"{base}/{path}", str(values[c]))
                self.w(f"{base}/topology/core_cpus_list", format_cpulist(sib))
                self.w(f"{base}/topology/thread_siblings_list", format_cpulist(sib))
                caches = [
                    (1, "Data", sib),
                    (1, "Instruction", sib),
                    (2, "Unified", sib),
                    (3, "Unified", l3_of.get(c, cpus)),
                ]
                for idx, (level, kind, shared) in enumerate(caches):
                    cb = f"{base}/cache/index{idx}"
                    self.w(f"{cb}/level", str(level))
                    self.w(f"{cb}/type", kind)
                    self.w(f"{cb}/shared_cpu_list", format_cpulist(shared))

    def pci(self) -> None:
        spec = self.spec
        for k in range(spec.filler_pci):
            bdf = f"0000:{(k // 32) % 256:02x}:{k % 32:02x}.{k % 4}"
            base = f"/sys/bus/pci/devices/{bdf}"
            self.w(f"{base}/vendor", "0x8086")
            self.w(f"{base}/device", "0x09a2")
            self.w(f"{base}/class", "0x088000" if k % 3 else "0x060400")
            self.w(f"{base}/numa_node", str(k % max(len(spec.nodes), 1)))
            self.w(f"{base}/local_cpulist", self.online)
        for g in spec.gpus:
            self.gpu(g)

    def gpu(self, g: Gpu) -> None:
        spec = self.spec
        if g.bdf in spec.masked_pci:
            self.driver_files(g)
            return
        base = f"/sys/bus/pci/devices/{g.bdf}"
        if g.bridges:
            real = "/sys/devices/" + "/".join((*g.bridges, g.bdf))
            self.links[base] = real
            base = real
        if g.rdma:
            self.links[f"/sys/class/infiniband/{g.rdma}/device"] = base
            self.port(g.rdma, Port())
        self.w(f"{base}/vendor", f"0x{g.vendor:04x}")
        self.w(f"{base}/device", f"0x{g.device:04x}")
        self.w(f"{base}/class", f"0x{g.pci_class:06x}")
        self.w(f"{base}/numa_node", str(g.node))
        local = g.local_cpus
        if local is None:
            local = spec.nodes[g.node] if g.node >= 0 else self.all_cpus
        self.w(f"{base}/local_cpulist", format_cpulist(local))
        self.w(f"{base}/local_cpus", _mask(local))
        if g.unique_id is not None:
            self.w(f"{base}/unique_id", g.unique_id)
        if g.compute_partition is not None:
            self.w(f"{base}/current_compute_partition", g.compute_partition)
        if g.memory_partition is not None:
            self.w(f"{base}/current_memory_partition", g.memory_partition)
        self.driver_files(g)

    def driver_files(self, g: Gpu) -> None:
        spec = self.spec
        if g.vendor == 0x10DE and g.pci_class >> 16 == 3 and spec.proc_nvidia and g.driver:
            pbase = f"/proc/driver/nvidia/gpus/{g.bdf}"
            self.w(
                f"{pbase}/information",
                f"Model: \t\t {g.model}\nIRQ:   \t\t 123\n"
                f"GPU UUID: \t {g.uuid or 'GPU-unknown'}\n"
                f"Video BIOS: \t 96.00.74.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
                f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {g.bdf}\n"
                f"Device Minor: \t {g.minor}",
            )
            if g.memory_node is not None:
                self.w(f"{pbase}/numa_status", f"Node:      {g.memory_node}\nStatus:    online")

    def kfd(self) -> None:
        """AMD's KFD topology as amdgpu writes it: a CPU agent per node with CPUs, then
        every AMD GPU's agents (one per compute partition), in PCI order; a partition's
        ``location_id`` is its GPU's with the partition's index in the function bits."""
        spec = self.spec
        base = "/sys/class/kfd/kfd/topology/nodes"
        node = 0
        for cpus in spec.nodes:
            if cpus:
                props = f"cpu_cores_count {len(cpus)}\nsimd_count 0\nlocation_id 0\ndomain 0"
                self.w(f"{base}/{node}/properties", props + "\ndrm_render_minor 0")
                node += 1
        minor = 128
        for g in sorted(spec.gpus, key=lambda g: g.bdf):
            if g.vendor != 0x1002:
                continue
            domain, bus, devfn = int(g.bdf[:4], 16), int(g.bdf[5:7], 16), int(g.bdf[8:10], 16) << 3
            unique = int(g.unique_id or "0", 16)
            for k in range(g.partitions):
                loc = (bus << 8) | devfn | (k if g.partitions > 1 else 0)
                self.w(
                    f"{base}/{node}/properties",
                    f"cpu_cores_count 0\nsimd_count {1216 // g.partitions}\nlocation_id {loc}\n"
                    f"domain {domain}\ndrm_render_minor {minor}\nunique_id {unique}",
                )
                node += 1
                minor += 1

    def port(self, name: str, p: Port) -> None:
        base = f"/sys/class/infiniband/{name}/ports/{p.number}"
        self.w(f"{base}/state", p.state)
        self.w(f"{base}/phys_state", "5: LinkUp" if "ACTIVE" in p.state else "3: Disabled")
        self.w(f"{base}/rate", p.rate)
        self.w(f"{base}/link_layer", p.link_layer)
        if p.netdev:
            self.w(f"{base}/gid_attrs/ndevs/0", p.netdev)

    def adapter(self, a: Adapter) -> None:
        """An adapter's PCI function (placed in the PCI tree like a GPU), its RDMA
        device's ports, and its interfaces under the function (device/net/*)."""
        self.gpu(
            Gpu(
                a.bdf,
                a.node,
                vendor=a.vendor,
                device=a.device,
                pci_class=a.pci_class,
                bridges=a.bridges,
            )
        )
        real = self.links.get(f"/sys/bus/pci/devices/{a.bdf}", f"/sys/bus/pci/devices/{a.bdf}")
        if a.name:
            self.links[f"/sys/class/infiniband/{a.name}/device"] = real
            for p in a.ports:
                self.port(a.name, p)
        for n in a.netdevs:
            self.w(f"{real}/net/{n}/operstate", "up")

    def interface(self, i: Iface) -> None:
        base = f"/sys/class/net/{i.name}"
        self.w(f"{base}/operstate", "up")
        self.w(f"{base}/speed", str(i.speed if i.speed is not None else -1))
        if i.pci is not None:
            real = self.links.get(f"/sys/bus/pci/devices/{i.pci}", f"/sys/bus/pci/devices/{i.pci}")
            self.links[f"{base}/device"] = real
        if i.slaves is not None:
            self.w(f"{base}/bonding/slaves", " ".join(i.slaves))
        if i.enslaved:
            self.w(f"{base}/bonding_slave/state", "active")

    def process(self) -> None:
        spec = self.spec
        self.w("/proc/sys/kernel/osrelease", spec.kernel)
        if spec.numa_balancing is not None:
            self.w("/proc/sys/kernel/numa_balancing", str(spec.numa_balancing))
        self.w("/proc/self/mounts", "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0")
        if spec.cgroup_cpus is not None:
            self.w("/proc/self/cgroup", f"0::{spec.cgroup_path}")
            d = f"/sys/fs/cgroup{spec.cgroup_path}"
            self.w(f"{d}/cpuset.cpus.effective", format_cpulist(spec.cgroup_cpus))
            mems = spec.cgroup_mems if spec.cgroup_mems is not None else self.node_ids
            self.w(f"{d}/cpuset.mems.effective", format_cpulist(mems))
        else:
            self.w("/proc/self/cgroup", "0::/")
            self.w("/sys/fs/cgroup/cpuset.cpus.effective", self.online)
            self.w("/sys/fs/cgroup/cpuset.mems.effective", format_cpulist(self.node_ids))
        if spec.environ is not None:
            self.w("/numabind-env.json", json.dumps({"environ": spec.environ}))
        for path, text in spec.files.items():
            self.files[path] = text


def build(spec: Spec) -> _Tree:
    """The machine ``spec`` describes: its files and its links."""
    tree = _Tree(spec)
    tree.nodes()
    tree.cpus()
    tree.pci()
    if spec.kfd:
        tree.kfd()
    for a in spec.adapters:
        tree.adapter(a)
    for i in spec.interfaces:
        tree.interface(i)
    tree.process()
    return tree


def files(spec: Spec) -> dict[str, str]:
    """The machine ``spec`` describes, as path -> file text (links left out)."""
    return build(spec).files


def write(spec: Spec, root: str) -> str:
    """Write the tree for ``spec`` under ``root`` (links as relative symlinks, as sysfs
    has them); returns ``root``."""
    tree = build(spec)
    for path, text in tree.files.items():
        full = root + path
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
    for link, target in tree.links.items():
        full = root + link
        os.makedirs(os.path.dirname(full), exist_ok=True)
        os.symlink(os.path.relpath(target, os.path.dirname(link)), full)
    return root


class MemoryRoot(Root):
    """A generated machine served from memory (``show --example``): nothing on disk.
    Links are one level deep (a device's bus entry to its place in the tree)."""

    def __init__(
        self, tree: dict[str, str], description: str, links: dict[str, str] | None = None
    ) -> None:
        self.description = description
        Root.__init__(self)
        self._files = tree
        self._links = dict(links or {})
        self._dirs: dict[str, set[str]] = {}
        for path in (*tree, *self._links):
            parts = path.strip("/").split("/")
            for i in range(len(parts)):
                self._dirs.setdefault("/" + "/".join(parts[:i]), set()).add(parts[i])

    def _resolve(self, path: str) -> str:
        key = "/" + path.strip("/") if path.strip("/") else "/"
        parts = key.split("/")
        for i in range(len(parts), 1, -1):
            target = self._links.get("/".join(parts[:i]))
            if target is not None:
                return "/".join((target, *parts[i:]))
        return key

    def read(self, path: str, cap: int = _sysfs.READ_CAP) -> str:
        text = self._files.get(self._resolve(path))
        if text is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", f"{self.description}:{path}")
        self.budget.charge(files=1, nbytes=len(text))
        return text[:cap].strip()

    def listdir(self, path: str, cap: int = _sysfs.LIST_CAP) -> list[str]:
        return sorted(self._dirs.get(self._resolve(path), ()))[:cap]

    def isdir(self, path: str) -> bool:
        return self._resolve(path) in self._dirs

    def realpath(self, path: str) -> str | None:
        real = self._resolve(path)
        return real if real in self._dirs or real in self._files else None


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
    gpus, nics = [], []
    for i, b in enumerate(DGX_BDFS):
        # each GPU behind its own PCIe switch, which it shares with one ConnectX-7 (as on
        # the real board): GPU-NIC pairs are PIX, GPUs of a socket NODE, across SYS
        bus = int(b[5:7], 16)
        host = (f"pci0000:{bus - 3:02x}", f"0000:{bus - 3:02x}:01.0", f"0000:{bus - 2:02x}:00.0")
        node = 0 if i < 4 else 1
        gpus.append(
            Gpu(b, node, uuid=_uuid(i), minor=i, bridges=(*host, f"0000:{bus - 1:02x}:00.0"))
        )
        nics.append(
            Gpu(
                f"0000:{bus + 1:02x}:00.0",
                node,
                vendor=0x15B3,
                device=0x1021,
                pci_class=0x020700,
                bridges=(*host, f"0000:{bus - 1:02x}:01.0"),
                rdma=f"mlx5_{i}",
            )
        )
    gpus += [
        Gpu(f"0000:{0xC0 + k:02x}:00.0", 1, device=0x22A3, pci_class=0x068000) for k in range(4)
    ]
    gpus.append(Gpu("0000:03:00.0", 0, vendor=0x1A03, device=0x2000, pci_class=0x030000))
    gpus += nics  # after the GPUs: spec.gpus[:8] are the eight H100s
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


def dgx_a100() -> Spec:
    """DGX A100: 2 AMD EPYC 7742 in NPS4 (8 nodes of 16 cores x 2 threads), 8 A100s in
    pairs on nodes 3, 1, 7, 5, each pair behind one PCIe switch with two ConnectX-6
    (HDR 200 Gb/s InfiniBand): two GPUs and two NICs per switch, each GPU PXB to both
    (the GPUs hang one switch level lower).  The compute NICs are mlx5_0-3 and 6-9; the
    dual-port storage card (RoCE, 200 GbE) in between is mlx5_4/5 on node 2 (as on the real
    box, where a rank-indexed ``mlx5_${LOCAL_RANK}`` lands ranks 4 and 5 on storage)."""
    nodes = [
        list(range(16 * i, 16 * i + 16)) + list(range(128 + 16 * i, 144 + 16 * i)) for i in range(8)
    ]
    gpus: list[Gpu] = []
    adapters: list[Adapter] = []
    names = iter(["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"])
    for pair, (bus, node) in enumerate([(0x07, 3), (0x47, 1), (0x87, 7), (0xB7, 5)]):
        host = (f"pci0000:{bus - 7:02x}", f"0000:{bus - 7:02x}:01.1", f"0000:{bus - 6:02x}:00.0")
        for k in range(2):
            i = 2 * pair + k
            lower = (*host, f"0000:{bus - 5:02x}:0{k}.0", f"0000:{bus - 4 + 2 * k:02x}:00.0")
            gpus.append(
                Gpu(
                    f"0000:{bus + 2 * k:02x}:00.0",
                    node,
                    device=0x20B0,
                    uuid=_uuid(i),
                    minor=i,
                    model="NVIDIA A100-SXM4-40GB",
                    bridges=(*lower, f"0000:{bus - 3 + 2 * k:02x}:00.0"),
                )
            )
            name = next(names)
            adapters.append(
                Adapter(
                    name,
                    f"0000:{bus + 5 + 2 * k:02x}:00.0",
                    node,
                    bridges=(*host, f"0000:{bus - 5:02x}:1{k}.0"),
                    ports=[Port(rate="200 Gb/sec (4X HDR)")],
                    netdevs=[f"ib{i}"],
                    device=0x101B,
                )
            )
    storage = ("pci0000:e0", "0000:e0:03.1", "0000:e1:00.0")
    for k in range(2):
        adapters.append(
            Adapter(
                f"mlx5_{4 + k}",
                f"0000:e2:00.{k}",
                2,
                bridges=storage,
                ports=[
                    Port(
                        rate="200 Gb/sec (4X HDR)",
                        link_layer="Ethernet",
                        netdev=f"enp226s0f{k}np{k}",
                    )
                ],
                netdevs=[f"enp226s0f{k}np{k}"],
                device=0x101D,
            )
        )
    return Spec(
        nodes=nodes,
        package_of_node=[0, 0, 0, 0, 1, 1, 1, 1],
        smt=2,
        smt_stride=128,
        memory_gib=128,
        gpus=gpus,
        adapters=adapters,
        interfaces=[Iface(f"enp226s0f{k}np{k}", 200000, pci=f"0000:e2:00.{k}") for k in range(2)],
    )


def p4d() -> Spec:
    """AWS p4d.24xlarge: 2 Xeon 8275CL (24 cores x 2 threads each), 8 A100s, 4 per socket,
    and 4 EFA adapters (100 Gb/s each): every PCIe switch holds two GPUs and one EFA, so
    two ranks share each adapter.  An ENA interface (eth0) carries IP and no RDMA."""
    n0 = list(range(0, 24)) + list(range(48, 72))
    n1 = list(range(24, 48)) + list(range(72, 96))
    gpus: list[Gpu] = []
    adapters: list[Adapter] = []
    for sw, bus in enumerate([0x10, 0x20, 0x90, 0xA0]):
        node = 0 if sw < 2 else 1
        host = (f"pci0000:{bus:02x}", f"0000:{bus:02x}:00.0", f"0000:{bus + 1:02x}:00.0")
        for k in range(2):
            i = 2 * sw + k
            gpus.append(
                Gpu(
                    f"0000:{bus + 3 + k:02x}:00.0",
                    node,
                    device=0x20B0,
                    uuid=_uuid(i),
                    minor=i,
                    model="NVIDIA A100-SXM4-40GB",
                    bridges=(*host, f"0000:{bus + 2:02x}:0{k}.0"),
                )
            )
        adapters.append(
            Adapter(
                f"rdmap{bus + 5}s0",
                f"0000:{bus + 5:02x}:00.0",
                node,
                bridges=(*host, f"0000:{bus + 2:02x}:02.0"),
                ports=[Port(rate="100 Gb/sec (4X EDR)", link_layer="Unknown")],
                vendor=0x1D0F,
                device=0xEFA1,
                pci_class=0x020000,
            )
        )
    adapters.append(
        Adapter(
            "",
            "0000:00:05.0",
            0,
            bridges=("pci0000:00",),
            ports=[],
            netdevs=["eth0"],
            vendor=0x1D0F,
            device=0xEC20,
            pci_class=0x020000,
        )
    )
    return Spec(
        nodes=[n0, n1],
        package_of_node=[0, 1],
        smt=2,
        smt_stride=48,
        memory_gib=576,
        gpus=gpus,
        adapters=adapters,
        interfaces=[Iface("eth0", 100000, pci="0000:00:05.0")],
    )


def nics_one_socket() -> Spec:
    """A host whose four NDR adapters all sit on socket 0 (each behind the switch of one of
    GPUs 0-3), with GPUs 4-7 on socket 1: those reach every adapter SYS and share them one
    rank each.  Socket 1 also has an adapter whose port is down (mlx5_4, NODE from GPUs
    4-7) and a 25 GbE RoCE port behind GPU 4's own switch (mlx5_5, PIX to it): both
    listed, neither chosen."""
    n0, n1 = list(range(0, 32)), list(range(32, 64))
    gpus: list[Gpu] = []
    adapters: list[Adapter] = []
    for i in range(8):
        bus = 0x18 + 0x20 * i
        node = 0 if i < 4 else 1
        host = (f"pci0000:{bus - 3:02x}", f"0000:{bus - 3:02x}:01.0", f"0000:{bus - 2:02x}:00.0")
        gpus.append(
            Gpu(
                f"0000:{bus:02x}:00.0",
                node,
                uuid=_uuid(i),
                minor=i,
                bridges=(*host, f"0000:{bus - 1:02x}:00.0"),
            )
        )
        if i < 4:
            adapters.append(
                Adapter(
                    f"mlx5_{i}",
                    f"0000:{bus + 1:02x}:00.0",
                    node,
                    bridges=(*host, f"0000:{bus - 1:02x}:01.0"),
                    netdevs=[f"ib{i}"],
                )
            )
        if i == 4:
            adapters.append(
                Adapter(
                    "mlx5_5",
                    f"0000:{bus + 1:02x}:00.0",
                    node,
                    bridges=(*host, f"0000:{bus - 1:02x}:01.0"),
                    ports=[
                        Port(rate="25 Gb/sec (1X EDR)", link_layer="Ethernet", netdev="ens5f0np0")
                    ],
                    netdevs=["ens5f0np0"],
                )
            )
    adapters.append(
        Adapter(
            "mlx5_4",
            "0000:f1:00.0",
            1,
            bridges=("pci0000:f0", "0000:f0:01.0"),
            ports=[Port(state="1: DOWN", rate="10 Gb/sec (4X SDR)")],
            netdevs=["ib4"],
        )
    )
    return Spec(
        nodes=[n0, n1],
        package_of_node=[0, 1],
        memory_gib=512,
        gpus=gpus,
        adapters=adapters,
        interfaces=[Iface("ens5f0np0", 25000, pci=f"0000:{0x18 + 0x80 + 1:02x}:00.0")],
    )


def nps4() -> Spec:
    """2-socket AMD EPYC in NPS4 (8 nodes of 16 cores, 2 CCX of 8 cores each), 4 GPUs whose
    PCI order lands them on nodes 3, 1, 7, 5."""
    nodes = [list(range(16 * i, 16 * i + 16)) for i in range(8)]
    l3 = [list(range(8 * i, 8 * i + 8)) for i in range(16)]
    gpus = [
        Gpu(f"0000:{b:02x}:00.0", n, device=0x20B0, uuid=_uuid(i), minor=i, model="A100")
        for i, (b, n) in enumerate([(0x01, 3), (0x41, 1), (0x81, 7), (0xC1, 5)])
    ]
    return Spec(
        nodes=nodes, package_of_node=[0, 0, 0, 0, 1, 1, 1, 1], l3=l3, gpus=gpus, vendor="amd"
    )


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
            model="NVIDIA GB200",
        )
        for i in range(4)
    ]
    return Spec(nodes=nodes, package_of_node=[0, 1, 0, 0, 1, 1], gpus=gpus)


def gh200() -> Spec:
    """One Grace Hopper superchip in NUMA mode: the Grace CPU's 72 cores and 480 GiB of
    LPDDR5X on node 0, the H100's 96 GiB of HBM3 as the CPU-less node 1, which the GPU
    driver names (``numa_status``); node 0's only fallback is the GPU's memory."""
    nodes: list[list[int]] = [list(range(72)), []]
    gpu = Gpu(
        "0009:01:00.0",
        0,
        device=0x2342,
        uuid=_uuid(0),
        minor=0,
        memory_node=1,
        local_cpus=nodes[0],
        model="NVIDIA GH200 480GB",
    )
    return Spec(
        nodes=nodes,
        package_of_node=[0, 0],
        gpus=[gpu],
        memory_gib_of={0: 480, 1: 96},
        distance_matrix=[[10, 80], [80, 10]],
        kernel="6.8.0-1013-nvidia-64k",
    )


def xeon_max() -> Spec:
    """Two Xeon Max 9480 (56 cores x 2 threads each) in SNC4 and HBM flat mode: 16 nodes.
    Nodes 0-7 are the sub-NUMA clusters (14 cores and 64 GiB of DDR5 each, 0-3 on package
    0), nodes 8-15 their HBM (16 GiB each, no CPUs: node 8 + k belongs to cluster k), as
    ``numactl -H`` shows such a machine.  The firmware's HMAT gives each HBM node about
    three times its cluster's DDR bandwidth; the SLIT puts a cluster's HBM a little farther
    than its DDR, its package's other clusters nearer than the other package.  Six Intel
    Data Center GPU Max 1550 (an Aurora node's layout): on clusters 0-2 and 4-6."""
    ddr = []
    for pkg in range(2):
        for k in range(4):
            first = pkg * 56 + k * 14
            cores = list(range(first, first + 14))
            ddr.append(cores + [c + 112 for c in cores])
    nodes: list[list[int]] = ddr + [[] for _ in range(8)]

    def dist(i: int, j: int) -> int:
        if i == j:
            return 10
        pi, pj = (i % 8) // 4, (j % 8) // 4
        hbm = (i >= 8) + (j >= 8)
        if pi != pj:
            return 21 if hbm == 0 else 23
        if hbm == 1 and i % 8 == j % 8:
            return 13  # a cluster and its own HBM
        return 12 if hbm == 0 else 14

    gpus = [
        Gpu(f"0000:{b:02x}:00.0", n, vendor=0x8086, device=0x0BD5, pci_class=0x038000)
        for b, n in ((0x18, 0), (0x42, 1), (0x6C, 2), (0x9A, 4), (0xC3, 5), (0xEC, 6))
    ]
    return Spec(
        nodes=nodes,
        package_of_node=[0, 0, 0, 0, 1, 1, 1, 1] * 2,
        smt=2,
        smt_stride=112,
        gpus=gpus,
        memory_gib=64,
        memory_gib_of={n: 16 for n in range(8, 16)},
        distance_matrix=[[dist(i, j) for j in range(16)] for i in range(16)],
        bandwidth={n: (76800 if n < 8 else 230400) for n in range(16)},
        vendor="intel",
    )


def snc3() -> Spec:
    """Two Xeon 6 (Granite Rapids, 72 cores x 2 threads each) in SNC3: six nodes of 24
    cores, 0-2 on package 0; eight B200, two each on nodes 0, 1, 3 and 4, none on 2 and 5
    (a B200 host with sub-NUMA clustering: six CPU nodes, GPUs on four)."""
    nodes = []
    for pkg in range(2):
        for k in range(3):
            first = pkg * 72 + k * 24
            cores = list(range(first, first + 24))
            nodes.append(cores + [c + 144 for c in cores])

    def dist(i: int, j: int) -> int:
        return 10 if i == j else (12 if i // 3 == j // 3 else 21)

    gpus = [
        Gpu(f"0000:{b:02x}:00.0", n, device=0x2901, uuid=_uuid(i), minor=i, model="NVIDIA B200")
        for i, (b, n) in enumerate(
            [(0x1A, 0), (0x2A, 0), (0x3A, 1), (0x4A, 1), (0x9A, 3), (0xAA, 3), (0xBA, 4), (0xCA, 4)]
        )
    ]
    return Spec(
        nodes=nodes,
        package_of_node=[0, 0, 0, 1, 1, 1],
        smt=2,
        smt_stride=144,
        gpus=gpus,
        memory_gib=340,
        distance_matrix=[[dist(i, j) for j in range(6)] for i in range(6)],
        vendor="intel",
    )


def cxl() -> Spec:
    """Two AMD EPYC sockets (NPS1, 64 cores each) with a CXL memory expander on each
    (nodes 2 and 3, 256 GiB, onlined by dax/kmem): Linux puts them in memory_tier22 and
    the CPU nodes in memory_tier4.  The SLIT puts each expander nearer its socket (24)
    than the other socket is (32): by distance alone node 0 would spill onto node 2 first.
    Four H100 PCIe, two per socket."""
    nodes: list[list[int]] = [list(range(64)), list(range(64, 128)), [], []]
    matrix = [[10, 32, 24, 40], [32, 10, 40, 24], [24, 40, 10, 44], [40, 24, 44, 10]]
    gpus = [
        Gpu(
            f"0000:{b:02x}:00.0", n, device=0x2331, uuid=_uuid(i), minor=i, model="NVIDIA H100 PCIe"
        )
        for i, (b, n) in enumerate([(0x01, 0), (0x21, 0), (0x81, 1), (0xA1, 1)])
    ]
    return Spec(
        nodes=nodes,
        package_of_node=[0, 1, 0, 1],
        gpus=gpus,
        memory_gib=384,
        memory_gib_of={2: 256, 3: 256},
        distance_matrix=matrix,
        tiers={0: 4, 1: 4, 2: 22, 3: 22},
        vendor="amd",
    )


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


MI300X_BUSES = (0x05, 0x27, 0x47, 0x65, 0x85, 0xA7, 0xC7, 0xE5)


def mi300x_cpx(compute: str = "CPX", memory: str = "NPS4", numa: tuple[int, ...] = ()) -> Spec:
    """8 AMD MI300X in a compute-partition mode (CPX: 8 partitions each, 64 devices to
    ROCm) and memory-partition mode (NPS4: each GPU's HBM in four parts), 4 per socket,
    2 sockets of 96 cores; the GPUs' PCI addresses are those of a real CPX host's KFD
    topology (tests/data/kfd).  ``numa`` overrides the GPUs' sysfs numa_node (-1: no
    affinity, as amd-smi reports some)."""
    parts = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4, "CPX": 8}[compute]
    nodes = [list(range(0, 96)), list(range(96, 192))]
    gpus = []
    for i, bus in enumerate(MI300X_BUSES):
        node = numa[i] if numa else (0 if i < 4 else 1)
        gpus.append(
            Gpu(
                f"0000:{bus:02x}:00.0",
                node,
                vendor=0x1002,
                device=0x74A1,
                pci_class=0x120000,
                unique_id=f"{0xE3A0B1C2D3E4F500 + i:x}",
                partitions=parts,
                compute_partition=compute,
                memory_partition=memory,
            )
        )
    return Spec(nodes=nodes, package_of_node=[0, 1], gpus=gpus, vendor="amd", kfd=True)


def container_2_of_8() -> Spec:
    """A container granted GPUs 2 and 5 of a DGX: sysfs lists all 8, the driver's /proc
    only the two mounted ones; the cgroup allows both sockets' first 8 cores."""
    spec = dgx_h100(filler_pci=20)
    for i, g in enumerate(spec.gpus[:8]):
        g.driver = i in (2, 5)
    spec.cgroup_cpus = list(range(0, 8)) + list(range(56, 64))
    return spec


def two_nodes(gpus: int = 2) -> Spec:
    """The smallest two-node machine a 2-CPU host can really bind to: node 0 = CPU 0,
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


def dgx_b300(priority: int = 8) -> Spec:
    """A DGX B300-like host: 2 sockets x 64 cores x 2 threads (256 CPUs), 8 GPUs, 4 per
    socket, where ``priority`` cores of each socket are Priority Core Turbo cores: ACPI
    CPPC ``highest_perf`` says so (46 against 39 for the rest) and the other files do not
    tell them apart.  Which cores and how many are illustrative (spread over the socket,
    as the firmware spreads them), not read from a B300."""
    n0 = list(range(0, 64)) + list(range(128, 192))
    n1 = list(range(64, 128)) + list(range(192, 256))
    step = 64 // max(priority, 1)
    fast = {s * 64 + k * step for s in (0, 1) for k in range(priority)}
    fast |= {c + 128 for c in fast}  # both hardware threads of a priority core
    perf = {c: 46 if c in fast else 39 for c in range(256)}
    nominal = dict.fromkeys(range(256), 20)
    gpus = [
        Gpu(
            f"0000:{b:02x}:00.0",
            0 if i < 4 else 1,
            device=0x2901,
            uuid=_uuid(i),
            minor=i,
            model="NVIDIA B300 SXM6 AC",
        )
        for i, b in enumerate([0x17, 0x3D, 0x60, 0x70, 0x9A, 0xC0, 0xD8, 0xE8])
    ]
    return Spec(
        nodes=[n0, n1],
        package_of_node=[0, 1],
        smt=2,
        smt_stride=128,
        memory_gib=1024,
        gpus=gpus,
        cpu_files={"acpi_cppc/highest_perf": perf, "acpi_cppc/nominal_perf": nominal},
    )


def sst_bf(high: int = 6) -> Spec:
    """A 2-socket Xeon with Intel SST-BF enabled: ``high`` cores of each 24-core socket
    run at a 2.7 GHz base frequency, the rest at 2.1 GHz (``cpufreq/base_frequency``);
    CPPC is not exposed and the maximum frequency is the same everywhere; 4 GPUs, 2 per
    socket.  Illustrative values, in the kernel's layout."""
    n0, n1 = list(range(0, 24)), list(range(24, 48))
    hp = {s * 24 + k * (24 // high) for s in (0, 1) for k in range(high)}
    base = {c: 2700000 if c in hp else 2100000 for c in range(48)}
    gpus = [
        Gpu(f"0000:{b:02x}:00.0", 0 if i < 2 else 1, uuid=_uuid(i), minor=i)
        for i, b in enumerate([0x1A, 0x3B, 0x86, 0xAF])
    ]
    return Spec(
        nodes=[n0, n1],
        package_of_node=[0, 1],
        gpus=gpus,
        cpu_files={
            "cpufreq/base_frequency": base,
            "cpufreq/cpuinfo_max_freq": dict.fromkeys(range(48), 3900000),
        },
    )


DRA_ROOT = "/var/run/kubernetes.io/dra-device-attributes"
KUBEPODS = "/kubepods.slice/kubepods-pod0d1c.slice/cri-containerd-7e3a.scope"


def dra_metadata(
    driver: str,
    claim: str,
    request: str,
    devices: Sequence[tuple[str, str, int | None]],
    *,
    kind: str = "resourceclaimtemplates",
    versions: Sequence[str] = ("v1alpha1",),
    numa_attribute: str = "numaNode",
) -> tuple[str, str]:
    """One KEP-5304 device metadata file, as a DRA driver writes it into a container:
    (its path, its text).  ``devices`` are (name, PCI address, NUMA node or None); the
    metadata is written once per API version, newest first, as the protocol says."""
    attrs = []
    for name, pci, node in devices:
        a: dict[str, object] = {
            "resource.kubernetes.io/pciBusID": {"string": pci},
            "uuid": {"string": f"GPU-{abs(hash(pci)) % 10**8:08d}-0000-0000-0000-000000000000"},
        }
        if node is not None:
            a[numa_attribute] = {"int": node}
        attrs.append({"driver": driver, "pool": "node-1", "name": name, "attributes": a})
    objects = [
        {
            "kind": "DeviceMetadata",
            "apiVersion": f"metadata.resource.k8s.io/{v}",
            "metadata": {"name": f"{claim}-x7k2", "namespace": "default", "uid": "c7e7b22e",
                         "generation": 1},
            "podClaimName": claim,
            "requests": [{"name": request, "devices": attrs}],
        }
        for v in versions
    ]  # fmt: skip
    path = f"{DRA_ROOT}/{kind}/{claim}/{request}/{driver}-metadata.json"
    return path, "\n".join(json.dumps(o, indent=1) for o in objects) + "\n"


def k8s_pod() -> Spec:
    """A Kubernetes pod on a DGX H100 whose DRA claim got GPUs 4 and 5 (node 1) while the
    kubelet gave it CPUs 0-7 of node 0 (no static CPU manager, no topology alignment): the
    driver's /proc list is not mounted, the DRA device metadata says which GPUs are the
    pod's, and no rank can be bound next to its GPU."""
    spec = dgx_h100(filler_pci=16)
    for g in spec.gpus[:8]:
        g.driver = False
    spec.cgroup_cpus = list(range(0, 8))
    spec.cgroup_path = KUBEPODS
    path, text = dra_metadata(
        "gpu.nvidia.com", "gpus", "gpu", [("gpu-4", DGX_BDFS[4], 1), ("gpu-5", DGX_BDFS[5], 1)]
    )
    spec.files = {path: text}
    return spec


EXAMPLES = {
    "dgx-h100": dgx_h100,
    "dgx-b300": dgx_b300,
    "dgx-a100": dgx_a100,
    "p4d": p4d,
    "nics-one-socket": nics_one_socket,
    "gb200": gb200,
    "gh200": gh200,
    "xeon-max": xeon_max,
    "snc3": snc3,
    "cxl": cxl,
    "mi300x": mi300x,
    "mi300x-cpx": mi300x_cpx,
    "nps4": nps4,
    "container": container_2_of_8,
    "k8s-pod": k8s_pod,
    "two-nodes": two_nodes,
    "one-node": one_node,
}


def example_root(name: str) -> MemoryRoot:
    """The example ``name`` (:data:`EXAMPLES`) as a root in memory."""
    from .._errors import CaptureError

    make = EXAMPLES.get(name)
    if make is None:
        raise CaptureError(f"no example {name!r} (there are: {', '.join(EXAMPLES)})")
    tree = build(make())
    return MemoryRoot(tree.files, f"example {name}", tree.links)
