"""``numabind show --input`` on hwloc's biggest capture (11,495 members, bzip2), side by side
with what merely reading the tarball costs: decompressing it and iterating its headers
with tarfile, which any reader pays.  numabind indexes the members in memory and reads only
those it asks for, so its cost should be close to that floor (target: under 1 s here).

Run: python benchmarks/captures.py    (NUMABIND_BENCH_SMALL=1: fewer rounds, for CI)
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tarfile
import time

from _common import ROOT, SMALL, clean_env, table

CAPTURE = ROOT / "tests" / "data" / "hwloc" / "40intel64-2g2n4c+pcilocality.tar.bz2"


def headers() -> float:
    t0 = time.perf_counter()
    with tarfile.open(CAPTURE) as tar:
        n = sum(1 for _ in tar)
    assert n == 11_495
    return time.perf_counter() - t0


def show() -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "numabind", "show", "--input", str(CAPTURE)],
        check=True,
        capture_output=True,
        env=clean_env(),
    )
    return time.perf_counter() - t0


def python_start() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import numabind.cli"], check=True, env=clean_env())
    return time.perf_counter() - t0


def main() -> int:
    rounds = 2 if SMALL else 10
    a, b, c = [], [], []
    for _ in range(rounds):
        a.append(headers())
        b.append(show())
        c.append(python_start())
    ha, sb, pc = (statistics.median(x) for x in (a, b, c))
    print(f"{CAPTURE.name}: 11,495 members, median of {rounds} rounds\n")
    print(
        table(
            ["what", "seconds"],
            [
                ["tarfile: decompress + iterate headers (in process)", f"{ha:.3f}"],
                ["interpreter start + import numabind.cli", f"{pc:.3f}"],
                ["numabind show --input (a whole command)", f"{sb:.3f}"],
            ],
        )
    )
    print(f"\nshow / (header iteration + interpreter start): {sb / (ha + pc):.2f}")
    print(f"under 1 s: {'yes' if sb < 1 else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
