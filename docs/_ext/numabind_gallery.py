"""Sphinx extension: the gallery of ``docs/reading.rst``, made at every build from the
code itself, so that no picture or listing in the docs can go stale.

For each case it renders ``numabind show --svg`` into ``docs/_gallery/NAME.svg`` and
converts it with ``rsvg-convert`` (librsvg2-bin) to ``NAME.png``, the form the page shows;
it also writes the text forms (``--draw``, ``--matrix``, ``--numactl``, the plan table)
that the page includes.  Without rsvg-convert the page falls back to the SVGs, except
under ``CI=true``, where that is an error: the gallery is part of what CI proves.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
OUT = HERE / "_gallery"
HWLOC = Path("tests") / "data" / "hwloc"  # relative: the titles show what a reader types

# name -> (show arguments, what the caption says)
CASES: dict[str, tuple[list[str], str]] = {
    "dgx-h100": (["--example", "dgx-h100"], "DGX H100: 8 GPUs, 4 per socket, mode node"),
    "dgx-2": (
        ["--input", str(HWLOC / "nvidiaDGX2.xml")],
        "DGX-2 (hwloc export; this capture allows CPUs 0-1 and 24-25 only)",
    ),
    "gb200": (["--example", "gb200"], "GB200 NVL: each GPU's memory is a NUMA node of its own"),
    "mi300x": (["--example", "mi300x"], "MI300X: 8 GPUs of class 0x1200, 4 per socket"),
    "nps4": (["--example", "nps4"], "AMD EPYC in NPS4: 8 nodes, 2 L3 domains each"),
    "exclusive-64": (
        ["--example", "dgx-h100", "--nproc", "64", "--mode", "exclusive"],
        "64 ranks on a DGX H100, mode exclusive: every rank its own cores",
    ),
}
TEXTS: dict[str, list[str]] = {
    "dgx-h100-show.txt": ["--example", "dgx-h100"],
    "dgx-h100-draw.txt": ["--example", "dgx-h100", "--draw"],
    "dgx-h100-matrix.txt": ["--example", "dgx-h100", "--matrix"],
    "dgx-h100-numactl.txt": ["--example", "dgx-h100", "--numactl"],
    "dgx-2-matrix.txt": ["--input", str(HWLOC / "nvidiaDGX2.xml"), "--matrix"],
}


def _show(args: list[str]) -> str:
    """``numabind show ARGS`` in a fresh interpreter with no rank or device variables
    (what a reader typing it would see)."""
    import sys

    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    env["PYTHONPATH"] = str(HERE.parent / "src")
    r = subprocess.run(
        [sys.executable, "-m", "numabind", "show", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=HERE.parent,
        timeout=300,
    )
    if r.returncode != 0:
        raise RuntimeError(f"numabind show {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r.stdout


def figure(image: str, args: list[str], caption: str) -> list[str]:
    """The gallery's figure of one case: its picture and the command that draws it (a
    command a reader can type: ``--svg`` takes the FILE to write)."""
    return [
        f".. figure:: /_gallery/{image}",
        "   :width: 100%",
        f"   :alt: numabind show --svg FILE, {caption}",
        "",
        f"   ``numabind show {' '.join(args)} --svg FILE``: {caption}",
        "",
    ]


def make(app: Any) -> None:
    OUT.mkdir(exist_ok=True)
    rsvg = shutil.which("rsvg-convert")
    if rsvg is None and os.environ.get("CI", "").lower() == "true":
        raise RuntimeError("rsvg-convert (librsvg2-bin) is needed for the gallery under CI")
    rst = [".. This file is written by docs/_ext/numabind_gallery.py at every build.", ""]
    for name, (args, caption) in CASES.items():
        svg = OUT / f"{name}.svg"
        svg.write_text(_show([*args, "--svg", "-"]))
        image = svg
        if rsvg is not None:
            png = OUT / f"{name}.png"
            subprocess.run([rsvg, "-o", str(png), str(svg)], check=True, timeout=120)
            image = png
        rst += figure(image.name, args, caption)
    (OUT / "gallery.rst.inc").write_text("\n".join(rst))
    for name, args in TEXTS.items():
        (OUT / name).write_text(_show(args))


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", make)
    return {"version": "1", "parallel_read_safe": True}
