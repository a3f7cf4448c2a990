"""``numabind show --matrix``: the view ``nvidia-smi topo -m`` gives, from the machine's
PCI tree instead of NVML: for every pair of GPUs and NICs the kind of path between them,
and each one's CPU affinity and NUMA node.

The path classes are nvidia-smi's, NVLink aside: sysfs has no file that says which GPUs
NVLink joins, so a pair joined by NVLink or NVSwitch shows its PCIe path here (where
``nvidia-smi`` shows ``NV#``), and the output says so (an hwloc export that carries NVLink
bandwidths is named as such).  GPUs whose own memory is a NUMA node (GH200/GB200) get
nvidia-smi's ``GPU NUMA ID`` column.

====  =====================================================================================
X     the device itself
PIX   through at most one PCIe bridge (both hang off one switch)
PXB   through several PCIe bridges, not the host bridge
PHB   through a PCIe host bridge (the CPU's root complex)
NODE  between host bridges of one NUMA node
SYS   between NUMA nodes (the socket interconnect: UPI, Infinity Fabric)
====  =====================================================================================

The tree comes from where ``/sys/bus/pci/devices/<address>`` leads (live sysfs and
directory or tarball captures that keep the links), or from an hwloc XML export's bridges.
A device whose place is unknown gets NODE or SYS from the nodes alone, marked ``*``.
:func:`numabind._nics.path_class` is the rule, the same one the NIC choice uses.
"""

from __future__ import annotations

from .._nics import path_class
from .._plan import describe_device, device_node
from .._sysfs import format_cpulist

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .._model import Accelerator, Nic
    from .._topology import Machine

LEGEND = (
    "X    = itself",
    "PIX  = through at most one PCIe bridge (one switch)",
    "PXB  = through several PCIe bridges, not the host bridge",
    "PHB  = through a PCIe host bridge (the CPU's root complex)",
    "NODE = between PCIe host bridges of one NUMA node",
    "SYS  = between NUMA nodes (the socket interconnect)",
    "*    = the PCI tree is not in the machine's files: told from the NUMA nodes alone",
)


def _label(kind: str, i: int) -> str:
    return f"{kind}{i}"


NVLINK = (
    "NVLink is not read (no file in sysfs says which GPUs it joins): GPUs joined by NVLink "
    "or NVSwitch show their PCIe path here, where nvidia-smi topo -m shows NV#"
)


def matrix_lines(machine: Machine, visible: tuple[Accelerator, ...]) -> list[str]:
    """The matrix as text lines (the writer escapes each)."""
    gpus = list(visible) or list(machine.accelerators)
    nics: list[Nic] = list(machine.nics)
    if not gpus and not nics:
        return [f"no GPUs or RDMA network adapters found ({machine.description}): no matrix"]
    detailed = [machine.detailed(g) for g in gpus]
    hbm = any(g.memory_node is not None for g in detailed)
    labels = [_label("GPU", i) for i in range(len(gpus))] + [
        _label("NIC", i) for i in range(len(nics))
    ]
    paths = [machine.pci_path(g.pci) for g in gpus] + [machine.pci_path(n.pci) for n in nics]
    nodes: list[int | None] = [device_node(machine, g).node for g in gpus]
    nodes += [n.numa_node for n in nics]
    cpus: list[str] = []
    for g in gpus:
        local = machine.local_cpus(g)
        cpus.append(format_cpulist(local) if local else "-")
    cpus += [format_cpulist(n.local_cpus) if n.local_cpus else "-" for n in nics]
    rows = [["", *labels, "CPU Affinity", "NUMA Affinity", *(["GPU NUMA ID"] if hbm else [])]]
    for i, label in enumerate(labels):
        cells = [
            "X" if i == j else path_class(paths[i], paths[j], nodes[i], nodes[j])
            for j in range(len(labels))
        ]
        row = [label, *cells, cpus[i], "-" if nodes[i] is None else str(nodes[i])]
        if hbm:
            own = detailed[i].memory_node if i < len(detailed) else None
            row.append("N/A" if own is None else str(own))
        rows.append(row)
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    out.append("")
    for i, g in enumerate(detailed):
        out.append(f"GPU{i}: {describe_device(g, i if visible else None)}")
    for i, n in enumerate(nics):
        out.append(f"NIC{i}: {n.name or 'network adapter'} ({n.pci})")
    out += ["", "Legend:", *(f"  {line}" for line in LEGEND)]
    if hbm:
        out.append("  GPU NUMA ID = the NUMA node that is the GPU's own memory (N/A: none)")
    out += ["", f"note: {NVLINK}"]
    if machine.source.nvlink:
        out.append(
            "note: this hwloc export carries NVLink bandwidths (NVLinkBandwidth), which "
            "numabind does not read"
        )
    return out
