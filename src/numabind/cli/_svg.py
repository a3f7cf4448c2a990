"""``numabind show --svg FILE``: the machine and its ranks as a picture for a ticket (and
``bench --svg``: the measurements as bars).

Written directly as SVG text (no plotting dependency) from the model in
:mod:`numabind.cli._picture`.  Top to bottom: a title, then per package one box per NUMA
node: its header (CPUs, memory; a memory-only node says whose memory it is), its cache
domains as frames around their cores, each core a column of its SMT threads with the CPU
number in each cell and the colour of the set of ranks planned onto it; the accelerators
placed there, and a line per rank; then the ranks not bound, the NUMA distance matrix
with node numbers on both axes, and a legend with a swatch for every colour and mark.

Every text is measured with :func:`text_width` (a conservative width for sans-serif) and
wrapped to fit its box, never cut at a fixed length, and lines are stacked, never
overlaid: the tests parse the SVG back and check that no two texts overlap, every text
fits the canvas and its box, and every rank and device is named.
"""

from __future__ import annotations

from html import escape

from ._picture import DISALLOWED, FREE, RESERVED, Cell, NodeBox, Picture, build, colour, legend

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .._plan import Plan
    from .._topology import Machine

CELL_W, CELL_H, GAP = 22, 13, 2
CORES_PER_ROW = 24
PAD = 12
FONT = 12
CELL_FONT = 7
TITLE_FONT = 15
CHAR_EM = 0.62  # width of one character in em, generous for DejaVu Sans / Helvetica
LINE = 17
WIDTH = 2 * PAD + 2 * 8 + CORES_PER_ROW * (CELL_W + GAP) + 2 * 8 + 2 * PAD
INNER = WIDTH - 4 * PAD  # what text inside a node box may take
SWATCH = 11


def text_width(text: str, size: float = FONT) -> float:
    """A conservative rendered width of ``text`` (the tests measure with this too)."""
    return len(text) * size * CHAR_EM


def fit(text: str, width: float, size: float = FONT) -> str:
    """``text`` shortened with an ellipsis to fit ``width`` (for bar labels only)."""
    if text_width(text, size) <= width:
        return text
    keep = max(int(width / (size * CHAR_EM)) - 1, 1)
    return text[:keep] + "…"


def wrap(text: str, width: float, size: float = FONT) -> list[str]:
    """``text`` in as many lines as it takes to fit ``width`` (a word longer than a line
    is split after a comma where it has one, never cut)."""
    per = max(int(width / (size * CHAR_EM)), 8)
    lines: list[str] = []
    current = ""
    for word in text.split():
        while len(word) > per:
            # a CPU list breaks after a comma, never inside a number ("...,344,3" then
            # "52,360" reads as CPUs 3 and 52); the line in progress takes what fits
            room = per - len(current) - 1 if current else per
            cut = word.rfind(",", 0, room) + 1
            if cut <= 0 and current:
                lines.append(current)
                current = ""
                continue
            if cut <= 0:
                cut = per  # no comma at all: split, never cut
            lines.append(f"{current} {word[:cut]}" if current else word[:cut])
            current = ""
            word = word[cut:]
        cand = f"{current} {word}" if current else word
        if len(cand) <= per:
            current = cand
            continue
        lines.append(current)
        current = word
    if current:
        lines.append(current)
    return lines or [""]


def _dark(fill: str) -> bool:
    """Whether a fill is dark enough for white text."""
    if fill.startswith("hsl("):
        return int(fill.rsplit(",", 1)[1].strip(" %)")) < 55
    r, g, b = (int(fill[i : i + 2], 16) for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b < 140


class _Canvas:
    def __init__(self, width: float) -> None:
        self.width = width
        self.parts: list[str] = []
        self.y: float = PAD

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

    def text(
        self, x: float, y: float, text: str, size: float = FONT, bold: bool = False, **attrs: str
    ) -> None:
        weight = ' font-weight="bold"' if bold else ""
        extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
        self.parts.append(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}"{weight}{extra}>{escape(text)}</text>'
        )

    def lines(
        self, x: float, text: str, width: float, size: float = FONT, bold: bool = False
    ) -> None:
        """``text`` wrapped to ``width``, each line below the last."""
        for line in wrap(text, width, size):
            self.y += LINE if size <= FONT else size + 4
            self.text(x, self.y, line, size, bold)

    def rect(self, x: float, y: float, w: float, h: float, fill: str, **attrs: str) -> None:
        extra = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items() if k != "title")
        title = attrs.get("title")
        body = f"<title>{escape(title)}</title></rect>" if title else "</rect>"
        self.parts.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"{extra}>'
            + body
        )

    def swatch_line(
        self, x: float, fill: str, text: str, width: float, stroke: str = "#333"
    ) -> None:
        """A swatch and its text (wrapped beside it)."""
        self.y += LINE
        self.rect(x, self.y - 10, SWATCH, SWATCH, fill, stroke=stroke)
        lines = wrap(text, width - 16)
        self.text(x + 16, self.y, lines[0])
        for more in lines[1:]:
            self.y += LINE
            self.text(x + 16, self.y, more)


def _cell(c: _Canvas, pic: Picture, cell: Cell, x: float, y: float) -> None:
    found = pic.set_of(cell.ranks) if cell.ranks else None
    fill = found.colour if found is not None else FREE
    stroke = "#999"
    tip = f"CPU {cell.cpu}"
    if found is not None:
        tip += (
            f": rank{'s' if len(cell.ranks) > 1 else ''} {', '.join(map(str, sorted(cell.ranks)))}"
        )
    if cell.reserved and found is None:
        fill = RESERVED
        tip += ": reserved for the system and helpers (NUMABIND_RESERVE)"
    if not cell.allowed:
        fill, stroke = DISALLOWED, "#bbb"
        tip += " (outside the CPUs this process may use)"
    c.rect(x, y, CELL_W, CELL_H, fill, stroke=stroke, title=tip, data_cpu=str(cell.cpu))
    ink = "white" if fill not in (FREE, DISALLOWED) and _dark(fill) else "#222"
    c.text(
        x + CELL_W / 2, y + CELL_H - 3.5, str(cell.cpu), CELL_FONT, fill=ink, text_anchor="middle"
    )


def _groups(c: _Canvas, pic: Picture, box: NodeBox, left: float) -> None:
    for group in box.groups:
        what = (
            f"L3 / CCX: CPUs {_fmt(group.cpus)} ({len(group.cores)} "
            f"core{'' if len(group.cores) == 1 else 's'})"
            if group.known
            else f"{len(group.cores)} cores (cache domains unknown)"
        )
        top = c.y + 6
        c.y = top
        c.lines(left + 6, what, INNER - 12, 10)
        grid_top = c.y + 5
        rows = (len(group.cores) + CORES_PER_ROW - 1) // CORES_PER_ROW
        height = pic.smt * (CELL_H + 1)
        for i, core in enumerate(group.cores):
            x = left + 8 + (i % CORES_PER_ROW) * (CELL_W + GAP)
            y = grid_top + (i // CORES_PER_ROW) * (height + GAP)
            for k, cell in enumerate(core.cells):
                _cell(c, pic, cell, x, y + k * (CELL_H + 1))
        c.y = grid_top + rows * (height + GAP) + 2
        c.rect(left - 4, top, INNER + 8, c.y - top, "none", stroke="#777", rx="4", data_l3="1")


def _fmt(cpus: frozenset[int]) -> str:
    from .._sysfs import format_cpulist

    return format_cpulist(cpus)


def _node(c: _Canvas, pic: Picture, box: NodeBox) -> None:
    left = 2 * PAD - 8
    top = c.y + 4
    c.y = top
    c.parts.append(f'<g data-node="{box.id}">')
    mark = len(c.parts)
    c.lines(2 * PAD, box.header, INNER, FONT, bold=True)
    _groups(c, pic, box, 2 * PAD)
    for g in (*box.gpus, *box.nics):
        found = next((s for s in pic.sets if g.ranks & s.ranks), None)
        c.swatch_line(2 * PAD, found.colour if found else FREE, g.text, INNER)
    for rank, line in box.ranks:
        found = next((s for s in pic.sets if rank in s.ranks), None)
        c.swatch_line(2 * PAD, found.colour if found else FREE, line, INNER)
    c.y += 8
    frame = (
        f'<rect x="{left:.1f}" y="{top:.1f}" width="{INNER + 16:.1f}" '
        f'height="{c.y - top:.1f}" fill="#f7f7f7" stroke="#555" rx="6"></rect>'
    )
    c.parts.insert(mark, frame)
    c.parts.append("</g>")


def _distances(c: _Canvas, pic: Picture) -> None:
    if not pic.distances:
        return
    c.y += LINE + 4
    c.text(PAD, c.y, "NUMA distances (from row to column)", 13, bold=True)
    cols = len(pic.distances[0])
    width = max(text_width(cell) for row in pic.distances for cell in row) + 10
    per_row = max(int((WIDTH - 3 * PAD) // width), 2)
    for start in range(1, cols, per_row - 1):  # wide matrices in column blocks
        for r, row in enumerate(pic.distances):
            c.y += LINE
            cells = [row[0], *row[start : start + per_row - 1]]
            for k, value in enumerate(cells):
                c.text(2 * PAD + k * width, c.y, value, FONT, bold=r == 0 or k == 0)


def _legend(c: _Canvas, pic: Picture) -> None:
    c.y += LINE + 4
    c.text(PAD, c.y, "legend", 13, bold=True)
    for s, line in zip(pic.sets, legend(pic, text=False)):
        c.swatch_line(PAD, s.colour, line, WIDTH - 2 * PAD)
    rest = legend(pic, text=False)[len(pic.sets) :]
    c.swatch_line(PAD, FREE, rest[0], WIDTH - 2 * PAD)
    c.swatch_line(PAD, DISALLOWED, rest[1], WIDTH - 2 * PAD, stroke="#bbb")
    if pic.reserved:
        c.swatch_line(PAD, RESERVED, rest[2], WIDTH - 2 * PAD)
        rest = rest[1:]
    for line in rest[2:]:
        c.lines(PAD, line, WIDTH - 2 * PAD)


def render(
    machine: Machine, plans: list[Plan], mode: str = "node", memory: str = "preferred"
) -> str:
    """The SVG document for ``machine`` and ``plans``."""
    pic = build(machine, plans, mode, memory)
    c = _Canvas(WIDTH)
    c.lines(PAD, pic.title, WIDTH - 2 * PAD, TITLE_FONT, bold=True)
    c.lines(PAD, pic.subtitle, WIDTH - 2 * PAD)
    c.y += 6
    for label, boxes in pic.packages:
        c.y += LINE + 4
        c.text(PAD, c.y, label, 13, bold=True)
        c.y += 4
        for box in boxes:
            _node(c, pic, box)
    for heading, items in (
        ("accelerators whose node is unknown", [g.text for g in pic.unplaced]),
        ("not bound", list(pic.skipped)),
    ):
        if items:
            c.y += LINE + 4
            c.text(PAD, c.y, heading, 13, bold=True)
            for item in items:
                c.swatch_line(2 * PAD, FREE, item, WIDTH - 3 * PAD)
    _distances(c, pic)
    _legend(c, pic)
    return c.document(pic.title)


def _value_label(value: float, trusted: bool) -> str:
    return f"{value:.1f}" + ("" if trusted else " (untrusted)")


def render_bench(report: dict[str, Any]) -> str:
    """``numabind bench --svg``: a bar per place measured from and memory node, for copy
    bandwidth and for latency, and one per pinned-copy row (a GPU alone or all at once,
    each direction, local or remote buffer), each labelled with its value; untrusted ones
    grey."""
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
    gpu = report.get("gpu")
    copies = gpu.get("copies", []) if isinstance(gpu, dict) else []
    # every value label is drawn whole beside its bar: the bars leave room for the longest
    shown_all = [_value_label(r[3], r[4]) for r in rows]
    shown_all += [_value_label(float(g["value"]), bool(g.get("trusted"))) for g in copies]
    value_w = max((text_width(t) for t in shown_all), default=0.0) + 8
    plot_w = width - label_w - 3 * PAD - value_w
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
            c.text(PAD + label_w + w + 6, c.y - 4, _value_label(value, trusted), FONT)
    for v in report.get("verdicts", []):
        if not isinstance(v, dict):
            continue
        c.y += LINE + 4
        for line in wrap(f"from node {v.get('from_node')}: {v.get('verdict')}", width - 2 * PAD):
            c.text(PAD, c.y, line, FONT)
            c.y += LINE
    if copies:
        top = max(float(g["value"]) for g in copies) or 1.0
        c.y += LINE + 8
        c.text(PAD, c.y, "pinned host<->device copies (GB/s)", 13, bold=True)
        for g in sorted(
            copies, key=lambda g: (len(g["devices"]), g["devices"], g["kind"], g["host"])
        ):
            devices = g["devices"]
            who = f"GPU {devices[0]}" if len(devices) == 1 else f"all {len(devices)}"
            value, trusted = float(g["value"]), bool(g.get("trusted"))
            c.y += bar_h + gap
            c.text(PAD, c.y - 4, fit(f"{who} {g['kind']} {g['host']}", label_w, FONT), FONT)
            w = max(plot_w * value / top, 1.0)
            fill = colour(int(g["memory_nodes"][0])) if trusted else DISALLOWED
            tip = f"buffers on node(s) {', '.join(map(str, g['memory_nodes']))}"
            c.rect(PAD + label_w, c.y - bar_h, w, bar_h, fill, stroke="#333", title=tip)
            c.text(PAD + label_w + w + 6, c.y - 4, _value_label(value, trusted), FONT)
    if isinstance(gpu, dict):
        c.y += LINE + 4
        for line in wrap(f"pinned copies: {gpu.get('verdict')}", width - 2 * PAD):
            c.text(PAD, c.y, line, FONT)
            c.y += LINE
    return c.document(title)
