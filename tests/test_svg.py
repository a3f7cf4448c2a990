"""``show --svg``: a picture a person would paste into a ticket, checked on every capture
and generated machine: every rank and GPU appears, ranks sharing a node are all visible, no
two texts overlap and each fits the canvas, the title names machine, mode and memory
policy, skipped ranks carry their reason, disallowed CPUs are grey, at least 16 distinct
colours, and each GPU sits in the node box of the node the plan binds it to."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest

import synth
from numabind._plan import device_node
from numabind._sysfs import format_cpulist
from numabind._topology import Machine
from numabind.cli._picture import DISALLOWED, PALETTE, build, draw
from numabind.cli._show import plans_for
from numabind.cli._svg import render, text_width

NS = "{http://www.w3.org/2000/svg}"
HWLOC = Path(__file__).resolve().parent / "data" / "hwloc"
CAPTURES = sorted(p.name for p in HWLOC.iterdir() if p.suffix in (".xml", ".bz2"))
GENERATED: dict[str, Callable[[], synth.Spec]] = {
    "dgx_h100": synth.dgx_h100,
    "nps4": synth.nps4,
    "gb200": synth.gb200,
    "mi300x": synth.mi300x,
    "container_2_of_8": synth.container_2_of_8,
    "two_nodes": synth.two_nodes,
}


def _machine(name: str, tmp: Path) -> Machine:
    if name in GENERATED:
        return Machine.from_root(synth.write(GENERATED[name](), str(tmp / name)))
    return Machine.from_capture(str(HWLOC / name))


def _texts(root: ET.Element) -> list[tuple[float, float, float, float, str]]:
    out = []
    for t in root.iter(f"{NS}text"):
        size = float(t.get("font-size", "12"))
        x, y = float(t.get("x", "0")), float(t.get("y", "0"))
        text = t.text or ""
        out.append((x, y - size, x + text_width(text, size), y + size * 0.25, text))
    return out


@pytest.mark.parametrize("name", [*GENERATED, *CAPTURES])
@pytest.mark.parametrize("mode", ["node", "exclusive"])
def test_the_picture(tmp_path: Path, name: str, mode: str) -> None:
    m = _machine(name, tmp_path)
    _, plans, _ = plans_for(m, {}, None, mode, "preferred")
    svg = render(m, plans, mode=mode, memory="preferred")
    root = ET.fromstring(svg)
    width, height = float(root.get("width", "0")), float(root.get("height", "0"))
    texts = _texts(root)
    words = [t[4] for t in texts]
    joined = "\n".join(words)
    # a title with the machine, the mode and the memory policy
    assert m.description in joined or m.description[:40] in joined
    assert f"mode {mode}, memory preferred" in joined
    # every text inside the canvas, and no two overlapping
    for x0, y0, x1, y1, text in texts:
        assert x0 >= 0 and x1 <= width + 0.5 and y0 >= 0 and y1 <= height + 0.5, text
    boxes = sorted(texts, key=lambda b: b[1])
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if b[1] >= a[3]:
                break
            overlap = a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]
            assert not overlap, (a[4], b[4])
    # every rank appears: bound ones in their node's box, skipped ones with their reason
    for p in plans:
        if p.bound:
            group = root.find(f".//{NS}g[@data-node='{p.numa_node}']")
            assert group is not None, p.numa_node
            inside = "\n".join(t.text or "" for t in group.iter(f"{NS}text"))
            assert f"rank {p.local_rank}: CPUs" in inside
        else:
            assert f"rank {p.local_rank}: {p.reason[:30]}" in joined.replace("\n", " ")
    # every GPU appears, in the box of the node the plan binds it to (or the planner's node)
    bound_node = {p.device.pci: p.numa_node for p in plans if p.bound and p.device}
    for a in m.all_accelerators:
        node = bound_node.get(a.pci, device_node(m, a).node)
        if node is None:
            assert a.pci in joined
            continue
        group = root.find(f".//{NS}g[@data-node='{node}']")
        assert group is not None
        assert a.pci in "\n".join(t.text or "" for t in group.iter(f"{NS}text")), (a.pci, node)
    # CPUs this process may not use are grey
    outside = m.online_cpus - m.allowed.cpus
    fills = {r.get("fill") for r in root.iter(f"{NS}rect")}
    if outside:
        assert DISALLOWED in fills
    # every CPU of a node with CPUs is drawn, once, with its number; one frame per L3
    cells = [r.get("data-cpu") for r in root.iter(f"{NS}rect") if r.get("data-cpu")]
    assert sorted(int(c) for c in cells) == sorted(c for n in m.cpu_nodes for c in n.cpus)
    assert {str(c) for n in m.cpu_nodes for c in n.cpus} <= set(words)
    domains = {
        (m.cache_of(c) or frozenset()) & n.cpus if m.cache_of(c) else n.cpus
        for n in m.cpu_nodes
        for c in n.cpus
    }
    frames = [r for r in root.iter(f"{NS}rect") if r.get("data-l3")]
    assert len(frames) == len(domains)
    # a colour per set of ranks sharing CPUs, each explained in the legend
    pic = build(m, plans, mode, "preferred")
    assert len({s.colour for s in pic.sets}) == len(pic.sets)
    for s in pic.sets:
        assert s.colour in fills
        assert f"CPUs {format_cpulist(s.cpus)}" in joined.replace("\n", " ")
    # every text inside its node box
    for group in root.iter(f"{NS}g"):
        frame = group.find(f"{NS}rect")
        assert frame is not None
        fx, fw = float(frame.get("x", 0)), float(frame.get("width", 0))
        fy, fh = float(frame.get("y", 0)), float(frame.get("height", 0))
        for t in group.iter(f"{NS}text"):
            x, y, size = float(t.get("x", 0)), float(t.get("y", 0)), float(t.get("font-size", 12))
            w = text_width(t.text or "", size)
            left = x - w / 2 if t.get("text-anchor") == "middle" else x
            assert fx <= left and left + w <= fx + fw + 0.5, t.text
            assert fy <= y - size and y <= fy + fh, t.text
    # the terminal drawing names the same ranks and devices
    text = "\n".join(draw(pic))
    for p in plans:
        assert (f"rank {p.local_rank}: CPUs" if p.bound else f"rank {p.local_rank}: ") in text


def test_gb200_gpus_are_drawn_on_the_grace_nodes(tmp_path: Path) -> None:
    m = _machine("gb200", tmp_path)
    _, plans, _ = plans_for(m, {}, None, "node", "preferred")
    root = ET.fromstring(render(m, plans))
    for node, gpus in ((0, (0, 1)), (1, (2, 3))):
        group = root.find(f".//{NS}g[@data-node='{node}']")
        text = "\n".join(t.text or "" for t in group.iter(f"{NS}text"))  # type: ignore[union-attr]
        for i in gpus:
            assert m.all_accelerators[i].pci in text, "the plan binds it here, not to HBM node 2-5"


def test_sixteen_ranks_sixteen_colours(tmp_path: Path) -> None:
    spec = synth.nps4()
    spec.gpus = []
    m = Machine.from_root(synth.write(spec, str(tmp_path / "m")))
    _, plans, _ = plans_for(m, {}, 16, "exclusive", "preferred")
    root = ET.fromstring(render(m, plans, mode="exclusive"))
    used = {r.get("fill") for r in root.iter(f"{NS}rect")} & set(PALETTE)
    assert len(set(PALETTE)) >= 16 and len(used) >= 16


def test_sixty_four_ranks_sixty_four_colours(tmp_path: Path) -> None:
    m = Machine.from_example("mi300x")
    _, plans, _ = plans_for(m, {}, 64, "exclusive", "preferred")
    pic = build(m, plans, "exclusive", "preferred")
    assert len(pic.sets) == 64 and len({s.colour for s in pic.sets}) == 64
    assert len({s.symbol for s in pic.sets}) == 64


def test_canvas_is_sized_to_content(tmp_path: Path) -> None:
    m = _machine("two_nodes", tmp_path)
    _, plans, _ = plans_for(m, {}, None, "node", "preferred")
    small = ET.fromstring(render(m, plans))
    big_m = _machine("dgx_h100", tmp_path)
    _, big_plans, _ = plans_for(big_m, {}, None, "node", "preferred")
    big = ET.fromstring(render(big_m, big_plans))
    assert float(small.get("height", 0)) < float(big.get("height", 0)) < 3000
    bottom = max(t[3] for t in _texts(small))
    assert float(small.get("height", 0)) - bottom < 40, "no empty band below the content"
