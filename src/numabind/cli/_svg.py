"""``numabind show --svg FILE``: the machine and its ranks as a picture for a ticket.

Written directly as SVG text (no plotting dependency).  Top to bottom: a title (machine,
mode, memory policy), then one box per NUMA node, grouped by package, each with a grid of
its CPUs (coloured by the rank planned onto them, greyed where this process may not run),
the accelerators the plan places there (the planner's own node rule,
:func:`numabind._plan.device_node`, or the node a plan binds the device to), and a line per
rank on that node; then the ranks that were not bound, with their reason.

Every text is measured with :func:`text_width` (a conservative width for sans-serif) and
shortened or wrapped to fit its box, and lines are stacked, never overlaid: the tests parse
the SVG back and check that no two texts overlap and every text fits the canvas.
"""

from __future__ import annotations

from html import escape

from .._plan import describe_device, device_node
from .._sysfs import format_cpulist

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .._model import Accelerator
    from .._plan import Plan
    from .._topology import Machine

# Kelly's 22 colours of maximum contrast, without white and black: 20 distinct colours
PALETTE = (
    "#f3c300", "#875692", "#f38400", "#a1caf1", "#be0032", "#c2b280", "#00a6a6",
    "#008856", "#e68fac", "#0067a5", "#f99379", "#604e97", "#f6a600", "#b3446c",
    "#dcd300", "#882d17", "#8db600", "#654522", "#e25822", "#2b3d26",
)  # fmt: skip
DISALLOWED = "#d9d9d9"
FREE = "#ffffff"
CELL, GAP, COLS = 12, 2, 32
PAD = 12
FONT = 12
TITLE_FONT = 15
CHAR_EM = 0.62  # width of one character in em, generous for DejaVu Sans / Helvetica
LINE = 17


def text_width(text: str, size: float = FONT) -> float:
    """A conservative rendered width of ``text`` (the tests measure with this too)."""
    return len(text) * size * CHAR_EM


def fit(text: str, width: float, size: float = FONT) -> str:
    """``text`` shortened with an ellipsis to fit ``width``."""
    if text_width(text, size) <= width:
        return text
    keep = max(int(width / (size * CHAR_EM)) - 1, 1)
    return text[:keep] + "…"


def wrap(text: str, width: float, size: float = FONT, max_lines: int = 4) -> list[str]:
    """``text`` in lines that fit ``width`` (the last one shortened if there are more)."""
    per = max(int(width / (size * CHAR_EM)), 8)
    lines: list[str] = []
    current = ""
    for word in text.split():
        cand = f"{current} {word}" if current else word
        if len(cand) <= per:
            current = cand
            continue
        if current:
            lines.append(current)
        current = word if len(word) <= per else word[: per - 1] + "…"
    if current:
        lines.append(current)
    if len(lines) > max_lines:
        lines = [*lines[: max_lines - 1], fit(" ".join(lines[max_lines - 1 :]), width, size)]
    return lines or [""]


def colour(rank: int) -> str:
    return PALETTE[rank % len(PALETTE)]


class _Canvas:
    def __init__(self, width: float) -> None:
        self.width = width
        self.parts: list[str] = []
        self.y = PAD

    def document(self, title: str) -> str:
        """The whole picture: as tall as what was drawn, on white, titled for viewers."""
        width, height = self.width, self.y + PAD
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
            f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="DejaVu Sans, Helvetica, Arial, '
            f'sans-serif">\n<title>{escape(title)}</title>\n'
            '<rect width="100%" height="100%" fill="white"/>\n'
        )
        return head + "\n".join(self.parts) + "\n</svg>\n"

    def text(self, x: float, y: float, text: str, size: float = FONT, bold: bool = False) -> None:
        weight = ' font-weight="bold"' if bold else ""
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}"{weight}>{escape(text)}</text>'
        )

    def rect(self, x: float, y: float, w: float, h: float, fill: str, **attrs: str) -> None:
        extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items() if k != "title")
        title = attrs.get("title")
        body = f"<title>{escape(title)}</title></rect>" if title else "</rect>"
        self.parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"{extra}>'
            + body
        )


def _device_nodes(machine: Machine, plans: list[Plan]) -> dict[str, int | None]:
    """Where each accelerator is drawn: the node a plan binds it to, else the planner's
    rule for the device (so the picture never disagrees with the plan JSON)."""
    where: dict[str, int | None] = {}
    for p in plans:
        if p.device is not None and p.bound and p.numa_node is not None:
            where.setdefault(p.device.pci, p.numa_node)
    for a in machine.all_accelerators:
        if a.pci not in where:
            where[a.pci] = device_node(machine, a).node
    return where


def render(
    machine: Machine, plans: list[Plan], mode: str = "node", memory: str = "preferred"
) -> str:
    """The SVG document for ``machine`` and ``plans``."""
    grid_w = COLS * (CELL + GAP) - GAP
    inner = max(grid_w, 560)
    width = inner + 4 * PAD
    c = _Canvas(width)
    title = f"numabind: {machine.description}"
    for line in wrap(title, inner + 2 * PAD, TITLE_FONT, 2):
        c.y += TITLE_FONT + 4
        c.text(PAD, c.y, line, TITLE_FONT, bold=True)
    c.y += LINE
    c.text(
        PAD,
        c.y,
        fit(
            f"mode {mode}, memory {memory}; {len(plans)} local rank"
            f"{'' if len(plans) == 1 else 's'}",
            inner + 2 * PAD,
        ),
    )
    c.y += 10

    allowed = machine.allowed.cpus
    owner: dict[int, list[int]] = {}
    for p in plans:
        if p.bound and p.local_rank is not None:
            for cpu in p.cpus:
                owner.setdefault(cpu, []).append(p.local_rank)
    dev_node = _device_nodes(machine, plans)
    ranks_by_pci: dict[str, list[int]] = {}
    for p in plans:
        if p.device is not None and p.local_rank is not None:
            ranks_by_pci.setdefault(p.device.pci, []).append(p.local_rank)
    index_of = {p.device.pci: p.device_index for p in plans if p.device is not None}

    def device_label(a: Accelerator) -> str:
        ranks = ranks_by_pci.get(a.pci)
        text = describe_device(a, index_of.get(a.pci))
        if a.name:
            text += f" {a.name}"
        if ranks:
            text += f": rank{'s' if len(ranks) > 1 else ''} {format_cpulist(ranks)}"
        return text

    packages: dict[int | None, list[int]] = {}
    for n in machine.nodes:
        pkg = machine.package_of(min(n.cpus)) if n.cpus else None
        packages.setdefault(pkg, []).append(n.id)
    for pkg, node_ids in sorted(packages.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        c.y += LINE + 4
        label = f"package {pkg}" if pkg is not None else "memory-only nodes (no CPUs)"
        c.text(PAD, c.y, label, 13, bold=True)
        c.y += 6
        for nid in node_ids:
            node = machine.node(nid)
            assert node is not None
            cpus = sorted(node.cpus)
            rows = (len(cpus) + COLS - 1) // COLS
            accs = [a for a in machine.all_accelerators if dev_node.get(a.pci) == nid]
            mem_of = [a for a in machine.all_accelerators if a.memory_node == nid]
            on_node = [p for p in plans if p.bound and p.numa_node == nid]
            top = c.y + 4
            y = top + LINE
            kind = f"CPUs {format_cpulist(cpus)}" if cpus else "memory only"
            if mem_of:
                kind += " (memory of " + ", ".join(a.pci for a in mem_of) + ")"
            texts: list[tuple[float, str, bool]] = [(y, fit(f"node {nid}: {kind}", inner), True)]
            cells_top = y + 6
            y = cells_top + rows * (CELL + GAP) + (4 if rows else 0)
            for a in accs:
                y += LINE
                texts.append((y, fit(device_label(a), inner), False))
            rank_lines: list[tuple[float, Plan]] = []
            for p in on_node:
                y += LINE
                rank_lines.append((y, p))
            height = y - top + 8
            c.parts.append(f'<g data-node="{nid}">')
            c.rect(2 * PAD - 8, top, inner + 16, height, "#f7f7f7", stroke="#555", rx="6")
            for ty, text, bold in texts:
                c.text(2 * PAD, ty, text, FONT, bold=bold)
            for i, cpu in enumerate(cpus):
                cx = 2 * PAD + (i % COLS) * (CELL + GAP)
                cy = cells_top + (i // COLS) * (CELL + GAP)
                ranks = owner.get(cpu, [])
                fill = colour(min(ranks)) if ranks else FREE
                stroke = "#999"
                if cpu not in allowed:
                    fill, stroke = DISALLOWED, "#bbb"
                tip = f"CPU {cpu}" + (f": rank {', '.join(map(str, ranks))}" if ranks else "")
                if cpu not in allowed:
                    tip += " (outside the CPUs this process may use)"
                c.rect(cx, cy, CELL, CELL, fill, stroke=stroke, title=tip)
                if len(ranks) > 1 and cpu in allowed:  # shared: the next rank's colour inside
                    c.rect(cx + 3, cy + 3, CELL - 6, CELL - 6, colour(sorted(ranks)[1]))
            for ry, p in rank_lines:
                c.rect(2 * PAD, ry - 10, 11, 11, colour(p.local_rank or 0), stroke="#333")
                text = (
                    f"rank {p.local_rank}: CPUs {format_cpulist(p.cpus)}, memory {p.memory_text()}"
                )
                sharing = sorted(
                    q.local_rank
                    for q in on_node
                    if q is not p and q.local_rank is not None and q.cpus & p.cpus
                )
                if sharing:
                    many = "s" if len(sharing) > 1 else ""
                    text += f"; shares CPUs with rank{many} {format_cpulist(sharing)}"
                c.text(2 * PAD + 16, ry, fit(text, inner - 16), FONT)
            c.parts.append("</g>")
            c.y = top + height
    unplaced = [a for a in machine.all_accelerators if dev_node.get(a.pci) is None]
    if unplaced:
        c.y += LINE + 4
        c.text(PAD, c.y, "accelerators whose node is unknown", 13, bold=True)
        for a in unplaced:
            c.y += LINE
            c.text(2 * PAD, c.y, fit(device_label(a), inner), FONT)
    skipped = [p for p in plans if not p.bound]
    if skipped:
        c.y += LINE + 4
        c.text(PAD, c.y, "not bound", 13, bold=True)
        for p in skipped:
            lines = wrap(f"rank {p.local_rank}: {p.reason}", inner - 16)
            c.y += LINE
            c.rect(2 * PAD, c.y - 10, 11, 11, FREE, stroke="#333")
            c.text(2 * PAD + 16, c.y, lines[0], FONT)
            for more in lines[1:]:
                c.y += LINE
                c.text(2 * PAD + 16, c.y, more, FONT)
    c.y += LINE
    c.rect(PAD, c.y - 10, 11, 11, DISALLOWED, stroke="#bbb")
    c.text(PAD + 16, c.y, "CPU outside this process's allowed set", FONT)
    return c.document(title)


def render_bench(report: dict[str, Any]) -> str:
    """``numabind bench --svg``: a bar per place measured from and memory node, for copy
    bandwidth and for latency, each labelled with its value; untrusted ones grey."""
    rows: list[tuple[str, Any, int, float, bool, str]] = []
    for m in report.get("measurements", []):
        if isinstance(m, dict) and m.get("kind") in ("copy", "latency"):
            rows.append(
                (
                    str(m["kind"]),
                    m.get("from_node"),
                    int(m["memory_node"]),
                    float(m["value"]),
                    bool(m.get("trusted")),
                    f"{m['pages_verified_on_node']} of its pages verified on the node",
                )
            )
    width = 760.0
    bar_h, gap = 16, 6
    label_w = 150.0
    plot_w = width - label_w - 3 * PAD - 90
    c = _Canvas(width)
    title = f"numabind bench: {report.get('machine')}"
    c.y += TITLE_FONT + 4
    c.text(PAD, c.y, fit(title, width - 2 * PAD, TITLE_FONT), TITLE_FONT, bold=True)
    for kind, unit, name in (("copy", "GB/s", "copy bandwidth"), ("latency", "ns", "latency")):
        mine = sorted((r for r in rows if r[0] == kind), key=lambda r: (str(r[1]), r[2]))
        top = max((r[3] for r in mine), default=1.0) or 1.0
        c.y += LINE + 8
        c.text(PAD, c.y, f"{name} ({unit})", 13, bold=True)
        for _, place, node, value, trusted, tip in mine:
            c.y += bar_h + gap
            c.text(PAD, c.y - 4, fit(f"node {place} -> node {node}", label_w, FONT), FONT)
            w = max(plot_w * value / top, 1.0)
            fill = colour(node) if trusted else DISALLOWED
            c.rect(PAD + label_w, c.y - bar_h, w, bar_h, fill, stroke="#333", title=tip)
            shown = f"{value:.1f}" + ("" if trusted else " (untrusted)")
            c.text(PAD + label_w + w + 6, c.y - 4, fit(shown, 88, FONT), FONT)
    for v in report.get("verdicts", []):
        if not isinstance(v, dict):
            continue
        c.y += LINE + 4
        for line in wrap(f"from node {v.get('from_node')}: {v.get('verdict')}", width - 2 * PAD):
            c.text(PAD, c.y, line, FONT)
            c.y += LINE
    return c.document(title)
