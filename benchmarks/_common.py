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


def cpu_command(argv: list[str], env: dict[str, str]) -> float:
    """The CPU time (user + system) ``argv`` spends, from its own rusage: what a rank
    costs the machine, which the host's other load does not add to (wall time does)."""
    p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise subprocess.CalledProcessError(p.returncode, argv)
    return usage.ru_utime + usage.ru_stime


def clear_caches(marker: str) -> None:
    """Remove this user's numabind machine and answers files whose key holds ``marker`` (a cold
    start for the variant that asks for one; the others' files stay)."""
    d = Path(f"/dev/shm/numabind-cache-{os.geteuid()}")
    found = [*d.glob("machine-*"), *d.glob("answers-*")] if d.is_dir() else []
    for f in found:
        try:
            if f.suffix != ".lock" and marker in f.read_text(errors="replace").split("\n", 2)[1]:
                f.unlink()
        except (OSError, IndexError):
            pass


def interleaved(
    variants: dict[str, tuple[list[str], dict[str, str]]],
    rounds: int,
    clock: str = "wall",
    cold: dict[str, str] | None = None,
) -> dict[str, list[float]]:
    """Run every variant once per round, in a rotating order, so that machine noise hits all
    of them alike; returns the wall times per variant (``clock="cpu"``: CPU times).
    ``cold`` names variants to start with no machine cache: before each of their runs the
    cache files whose key holds the given marker are removed (untimed)."""
    names = list(variants)
    out: dict[str, list[float]] = {n: [] for n in names}
    measure = cpu_command if clock == "cpu" else time_command
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            argv, env = variants[n]
            if cold and n in cold:
                clear_caches(cold[n])
            out[n].append(measure(argv, env))
    return out


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    return "\n".join([line, sep, *body])


from support import clean_env  # noqa: E402  (tests/ is on sys.path above)

__all__ = [
    "ROOT",
    "SMALL",
    "clean_env",
    "clear_caches",
    "cpu_command",
    "interleaved",
    "median_ms",
    "table",
    "time_command",
]
