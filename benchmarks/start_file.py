"""What PEP 829's ``.start`` path costs beside the ``.pth`` line, per interpreter start, in
the case that is every interpreter's but a rank's: no trigger variable set.

* ``.pth line``: what ``site`` does with ``_numabind_hook.pth`` before 3.15 (and until 3.18
  where no ``.start`` file matches): ``exec()`` of the line's source, compiled each start;
  one dictionary intersection, nothing imported.
* ``.start entry point``: what PEP 829's loader does from 3.15: ``pkgutil.resolve_name``
  of ``_numabind_start:start`` (which imports the start module and its base from their
  cached bytecode, as each new interpreter must) and the call, which finds no trigger.

Both in one process, interleaved round by round, the start modules removed from
``sys.modules`` before each ``.start`` sample so that every sample pays the import a new
interpreter pays.  Printed side by side with the ratio.

Run: python benchmarks/start_file.py    (NUMABIND_BENCH_SMALL=1: fewer rounds)
"""

from __future__ import annotations

import os
import pkgutil
import statistics
import sys
import time

from _common import ROOT, SMALL, table

MODULES = ("_numabind_start", "_numabind_base")


def _clean_env() -> None:
    """No trigger: the measured case (a rank's start does the same work on both paths).
    The start modules are the installed ones (the checkout's where none is installed),
    imported from their cached bytecode, which pip writes at install: written here once
    if missing, whatever ``PYTHONDONTWRITEBYTECODE`` says."""
    import importlib.util

    if importlib.util.find_spec("_numabind_start") is None:
        sys.path.insert(0, str(ROOT / "src"))
    sys.dont_write_bytecode = False
    import _numabind_base

    for name in (*_numabind_base.TRIGGERS, "NUMABIND"):
        os.environ.pop(name, None)
    pkgutil.resolve_name("_numabind_start:start")  # its bytecode written once
    for name in MODULES:
        sys.modules.pop(name, None)


def pth_once(line: str) -> float:
    t0 = time.perf_counter()
    exec(line, {})  # what site.addpackage does with an import line
    return time.perf_counter() - t0


def start_once(entry: str) -> float:
    for name in MODULES:
        sys.modules.pop(name, None)
    t0 = time.perf_counter()
    pkgutil.resolve_name(entry)()  # what PEP 829's loader does with a .start line
    return time.perf_counter() - t0


def main() -> int:
    _clean_env()
    line = (ROOT / "src" / "_numabind_hook.pth").read_text().strip()
    entry = (ROOT / "src" / "_numabind_hook.start").read_text().strip()
    rounds = 50 if SMALL else 2000
    pth: list[float] = []
    start: list[float] = []
    for i in range(rounds):
        if i % 2:
            pth.append(pth_once(line))
            start.append(start_once(entry))
        else:
            start.append(start_once(entry))
            pth.append(pth_once(line))
    assert not any(m in sys.modules for m in ("numabind",)), "no trigger: numabind not loaded"
    p, s = statistics.median(pth) * 1e6, statistics.median(start) * 1e6
    v = sys.version_info
    where = os.path.dirname(sys.modules["_numabind_start"].__file__ or "?")
    print(f"Python {v.major}.{v.minor}.{v.micro}, {rounds} rounds, no trigger variable set")
    print(f"start modules from {where}\n")
    print(
        table(
            ["path (file)", "what runs", "median per start"],
            [
                [".pth line", "exec of the line: one dict intersection", f"{p:.1f} us"],
                [
                    ".start entry point",
                    "pkgutil.resolve_name + import of the start module + call",
                    f"{s:.1f} us",
                ],
            ],
        )
    )
    print(f"\nratio .start / .pth: {s / p:.1f}x ({s - p:+.1f} us per interpreter start)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
