"""``numabind show --svg FILE``: the machine drawn as SVG, each rank's CPUs in its colour.

Written directly as SVG text (no plotting dependency).  One band per package; inside it
one box per NUMA node with a grid of its CPUs and, below, the accelerators attached to it.
A CPU is coloured by the lowest local rank planned onto it (a hatched outline marks CPUs
several ranks share); memory-only nodes are drawn without CPUs.
"""

from __future__ import annotations

from html import escape

from ._sysfs import format_cpulist
from ._topology import Machine

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._plan import Plan

PALETTE = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#843c39",
]
CELL, GAP, COLS = 14, 2, 16


def _node_package(machine: Machine, node_id: int) -> int | None:
    node = machine.node(node_id)
    if node is None or not node.cpus:
        return None
    return machine.package_of(min(node.cpus))


def render(machine: Machine, plans: list[Plan]) -> str:
    owner: dict[int, list[int]] = {}
    for p in plans:
        if p.bound and p.local_rank is not None:
            for c in p.cpus:
                owner.setdefault(c, []).append(p.local_rank)
    accs_by_node: dict[int | None, list[str]] = {}
    ranks_by_pci: dict[str, list[int]] = {}
    for p in plans:
        if p.device is not None and p.local_rank is not None:
            ranks_by_pci.setdefault(p.device.pci, []).append(p.local_rank)
    for a in machine.accelerators:
        node = a.numa_node
        if node is None and a.local_cpus:
            node = next((n.id for n in machine.cpu_nodes if a.local_cpus <= n.cpus), None)
        label = a.pci + (
            f"  rank {','.join(map(str, ranks_by_pci[a.pci]))}" if a.pci in ranks_by_pci else ""
        )
        accs_by_node.setdefault(node, []).append(label)
    packages: dict[int | None, list[int]] = {}
    for n in machine.nodes:
        packages.setdefault(_node_package(machine, n.id), []).append(n.id)

    parts: list[str] = []
    y = 40
    width = 60
    for pkg, node_ids in packages.items():
        x = 20
        band_top = y
        band_h = 0
        for nid in node_ids:
            this = machine.node(nid)
            assert this is not None
            cpus = sorted(this.cpus)
            rows = max((len(cpus) + COLS - 1) // COLS, 1) if cpus else 1
            accs = accs_by_node.get(nid, [])
            w = COLS * (CELL + GAP) + 20
            h = 34 + rows * (CELL + GAP) + 16 * len(accs) + 10
            parts.append(
                f'<rect x="{x}" y="{y + 22}" width="{w}" height="{h}" rx="6" '
                'fill="#f7f7f7" stroke="#555"/>'
            )
            owner_gpu = next((a.pci for a in machine.accelerators if a.memory_node == nid), None)
            kind = f"CPUs {format_cpulist(cpus)}" if cpus else "memory only"
            if owner_gpu:
                kind += f" (GPU {owner_gpu})"
            parts.append(
                f'<text x="{x + 8}" y="{y + 40}" font-size="12">node {nid}: {escape(kind)}</text>'
            )
            for i, c in enumerate(cpus):
                cx = x + 10 + (i % COLS) * (CELL + GAP)
                cy = y + 48 + (i // COLS) * (CELL + GAP)
                ranks = owner.get(c, [])
                fill = PALETTE[min(ranks) % len(PALETTE)] if ranks else "#ffffff"
                stroke = "#000" if len(ranks) > 1 else "#999"
                dash = ' stroke-dasharray="2,1"' if len(ranks) > 1 else ""
                title = f"CPU {c}" + (f": rank {', '.join(map(str, ranks))}" if ranks else "")
                parts.append(
                    f'<rect x="{cx}" y="{cy}" width="{CELL}" height="{CELL}" fill="{fill}" '
                    f'stroke="{stroke}"{dash}><title>{escape(title)}</title></rect>'
                )
            ay = y + 48 + rows * (CELL + GAP) + 12
            for label in accs:
                parts.append(
                    f'<text x="{x + 10}" y="{ay}" font-size="11">GPU {escape(label)}</text>'
                )
                ay += 16
            x += w + 12
            band_h = max(band_h, h + 30)
        width = max(width, x + 10)
        label = f"package {pkg}" if pkg is not None else "no package (memory-only nodes)"
        parts.insert(
            0,
            f'<text x="20" y="{band_top + 14}" font-size="13" font-weight="bold">'
            f"{escape(label)}</text>",
        )
        y += band_h + 10
    unplaced = accs_by_node.get(None, [])
    for label in unplaced:
        parts.append(
            f'<text x="20" y="{y + 14}" font-size="11">GPU {escape(label)} (node unknown)</text>'
        )
        y += 16
    legend_y = y + 20
    for i, p in enumerate(pl for pl in plans if pl.local_rank is not None):
        color = (
            PALETTE[p.local_rank % len(PALETTE)]
            if p.bound and p.local_rank is not None
            else "#ffffff"
        )
        lx = 20 + (i % 8) * 140
        ly = legend_y + (i // 8) * 20
        parts.append(
            f'<rect x="{lx}" y="{ly - 11}" width="12" height="12" fill="{color}" stroke="#555"/>'
        )
        text = f"rank {p.local_rank}" + ("" if p.bound else " (not bound)")
        parts.append(f'<text x="{lx + 16}" y="{ly}" font-size="11">{escape(text)}</text>')
    height = legend_y + 20 * ((len(plans) + 7) // 8) + 10
    width = max(width, 20 + min(len(plans), 8) * 140)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif">\n<title>numabind: {escape(machine.description)}</title>\n'
        f'<rect width="100%" height="100%" fill="white"/>\n'
    )
    return head + "\n".join(parts) + "\n</svg>\n"
