"""An hwloc XML export of a generated machine (tests/synth.py's Spec), in the shape
``lstopo --of xml`` writes (hwloc 2 by default, hwloc 3's bit-flag OS device types on
request): packages and NUMA nodes with their cpusets, a PU per CPU, and each node's I/O
tree of host bridges, PCI bridges and devices, with an OpenFabrics OS device (its ports'
states, as hwloc records them: no rates) and Network OS devices under each network
function.  The shipped hwloc captures have no RDMA adapter; this is how the tests read
the generated RDMA machines as an hwloc export too."""

from __future__ import annotations

from xml.sax.saxutils import quoteattr

from synth import Adapter, Gpu, Spec


def _mask(cpus: list[int] | set[int] | frozenset[int]) -> str:
    value = 0
    for c in cpus:
        value |= 1 << c
    words = []
    while True:
        words.append(f"0x{value & 0xFFFFFFFF:08x}")
        value >>= 32
        if not value:
            break
    return ",".join(reversed(words))


class _Out:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.gp = 1

    def open(self, kind: str, **attrs: str) -> None:
        self.gp += 1
        text = " ".join(f"{k}={quoteattr(v)}" for k, v in attrs.items())
        self.lines.append(f'<object type="{kind}" gp_index="{self.gp}" {text}>')

    def close(self) -> None:
        self.lines.append("</object>")

    def info(self, name: str, value: str) -> None:
        self.lines.append(f"<info name={quoteattr(name)} value={quoteattr(value)}/>")


def _ports_state(state: str) -> str:
    return state.split(":", 1)[0].strip()


def to_xml(spec: Spec, version: int = 2) -> bytes:
    """The export of ``spec``'s machine."""
    out = _Out()
    all_cpus = sorted(c for n in spec.nodes for c in n)
    nodes = list(range(len(spec.nodes)))
    out.lines.append('<?xml version="1.0" encoding="UTF-8"?>')
    out.lines.append('<!DOCTYPE topology SYSTEM "hwloc2.dtd">')
    out.lines.append(f'<topology version="{version}.0">')
    out.open(
        "Machine",
        os_index="0",
        cpuset=_mask(all_cpus),
        complete_cpuset=_mask(all_cpus),
        allowed_cpuset=_mask(all_cpus),
        nodeset=_mask(nodes),
        allowed_nodeset=_mask(nodes),
    )
    # every device with its node and its bridges, grouped by node and host bridge
    devices: list[tuple[int, tuple[str, ...], Gpu | Adapter]] = []
    for g in spec.gpus:
        devices.append((g.node, g.bridges or (f"pci{g.bdf[:7]}",), g))
    for a in spec.adapters:
        devices.append((a.node, a.bridges or (f"pci{a.bdf[:7]}",), a))
    for pkg in sorted(set(spec.package_of_node)):
        members = [i for i in nodes if spec.package_of_node[i] == pkg and spec.nodes[i]]
        cpus = sorted(c for i in members for c in spec.nodes[i])
        out.open("Package", os_index=str(pkg), cpuset=_mask(cpus), nodeset=_mask(members))
        for i in members:
            out.open("Group", cpuset=_mask(spec.nodes[i]), nodeset=_mask([i]))
            out.open(
                "NUMANode",
                os_index=str(i),
                cpuset=_mask(spec.nodes[i]),
                nodeset=_mask([i]),
                local_memory=str(spec.memory_gib << 30),
            )
            out.close()
            for c in spec.nodes[i]:
                out.open("PU", os_index=str(c), cpuset=_mask([c]), nodeset=_mask([i]))
                out.close()
            _io(out, [d for d in devices if d[0] == i], version)
            out.close()
        out.close()
    _io(out, [d for d in devices if d[0] < 0], version)
    out.close()
    out.lines.append("</topology>")
    return ("\n".join(out.lines) + "\n").encode()


def _io(out: _Out, devices: list[tuple[int, tuple[str, ...], Gpu | Adapter]], version: int) -> None:
    """The bridges and devices below one locality, each bridge opened once."""
    tree: dict[str, object] = {}
    for _, bridges, dev in devices:
        level = tree
        for b in bridges:
            nxt = level.setdefault(b, {})
            assert isinstance(nxt, dict)
            level = nxt
        level.setdefault("", [])
        leaf = level[""]
        assert isinstance(leaf, list)
        leaf.append(dev)
    _emit(out, tree, 0, version)


def _emit(out: _Out, level: dict[str, object], depth: int, version: int) -> None:
    for name, sub in sorted(level.items()):
        if name == "":
            assert isinstance(sub, list)
            for dev in sub:
                _device(out, dev, version)
            continue
        assert isinstance(sub, dict)
        if name.startswith("pci"):
            out.open("Bridge", bridge_type="0-1", depth="0", bridge_pci=f"{name[3:]}:[00-ff]")
        else:
            out.open(
                "Bridge",
                bridge_type="1-1",
                depth=str(depth),
                bridge_pci="0000:[00-ff]",
                pci_busid=name,
                pci_type="0604 [8086:2030] [8086:0000] 04 00",
            )
        _emit(out, sub, depth + 1, version)
        out.close()


def _device(out: _Out, dev: Gpu | Adapter, version: int) -> None:
    cls = dev.pci_class >> 8
    out.open(
        "PCIDev",
        pci_busid=dev.bdf,
        pci_type=f"{cls:04x} [{dev.vendor:04x}:{dev.device:04x}] [0000:0000] 00 00",
    )
    if isinstance(dev, Gpu) and dev.uuid:
        out.open("OSDev", name="nvml0", osdev_type="12" if version >= 3 else "1")
        out.info("NVIDIAUUID", dev.uuid)
        out.close()
    if isinstance(dev, Adapter):
        if dev.name:
            out.open("OSDev", name=dev.name, osdev_type="48" if version >= 3 else "3")
            out.info("NodeGUID", "0000:0000:0000:0001")
            for p in dev.ports:
                out.info(f"Port{p.number}State", _ports_state(p.state))
                out.info(f"Port{p.number}LID", "0x1")
            out.close()
        for n in dev.netdevs:
            out.open("OSDev", name=n, osdev_type="16" if version >= 3 else "2")
            out.info("Address", "00:11:22:33:44:55")
            out.close()
    out.close()
