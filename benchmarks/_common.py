"""Shared helpers for the benchmark scripts: medians, interleaved runs, markdown tables."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the machine generator lives with the tests

SMALL = os.environ.get("NUMABIND_BENCH_SMALL") == "1"


def median_ms(samples: Sequence[float]) -> float:
    return statistics.median(samples) * 1000


def time_command(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def interleaved(
    variants: dict[str, tuple[list[str], dict[str, str]]], rounds: int
) -> dict[str, list[float]]:
    """Run every variant once per round, in a rotating order, so that machine noise hits all
    of them alike; returns the wall times per variant."""
    names = list(variants)
    out: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            argv, env = variants[n]
            out[n].append(time_command(argv, env))
    return out


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join([line, sep, *body])


from support import clean_env  # noqa: E402  (tests/ is on sys.path above)

__all__ = ["ROOT", "SMALL", "clean_env", "interleaved", "median_ms", "table", "time_command"]
