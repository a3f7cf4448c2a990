"""How fast a placed host buffer is ready: populating with one thread, with the default
threads (one per physical core of the node, bound to it), and what a user does without
numabind (``torch.empty`` or a bytearray, then first touch from the calling thread).

Variants, interleaved round by round (only ratios within one run mean anything):
  one thread      numabind.host_buffer(size, node=0, threads=1)
  default         numabind.host_buffer(size, node=0)   (threads: the node's cores)
  first touch     a buffer of the same size written page by page from this thread
                  (torch.empty(...).fill_(0) where torch is installed, else a bytearray)

Registration with the GPU driver is left out (``register=False``): this measures
populating.  Each is reported as GiB/s and as the paired median ratio to ``first touch``.
On a two-CPU machine the default uses two threads: the ratio shows what parallel populate
buys per core; on a DGX node it is up to 56 threads.

Run: python benchmarks/host_buffer.py [--mib N] [--rounds N]
     (NUMABIND_BENCH_SMALL=1: a small case, for CI)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _common import SMALL, table

import numabind


def _first_touch(nbytes: int) -> float:
    t0 = time.perf_counter()
    try:
        import torch

        t = torch.empty(nbytes, dtype=torch.uint8)
        t.fill_(0)
        del t
    except ImportError:
        b = bytearray(nbytes)  # calloc: the pages are faulted by the write below
        b[::4096] = b"\1" * len(b[::4096])
        del b
    return time.perf_counter() - t0


def _numabind(nbytes: int, threads: int | None) -> float:
    t0 = time.perf_counter()
    buf = numabind.host_buffer(nbytes, node=0, threads=threads, register=False)
    took = time.perf_counter() - t0
    buf.close()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64 if SMALL else 1024)
    ap.add_argument("--rounds", type=int, default=3 if SMALL else 15)
    args = ap.parse_args()
    nbytes = args.mib << 20
    variants = {
        "one thread": lambda: _numabind(nbytes, 1),
        "default": lambda: _numabind(nbytes, None),
        "first touch": lambda: _first_touch(nbytes),
    }
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.rounds):
        names = list(variants)
        for name in names[r % 3 :] + names[: r % 3]:
            times[name].append(variants[name]())
    with numabind.host_buffer(nbytes, node=0, register=False) as probe:
        used = probe.threads
        how = probe.populated
    base = times["first touch"]
    rows = []
    for name, samples in times.items():
        med = statistics.median(samples)
        ratio = statistics.median(b / s for s, b in zip(samples, base))
        rows.append([name, f"{nbytes / med / (1 << 30):.2f}", f"{ratio:.2f}x"])
    print(f"populating {args.mib} MiB on node 0, {args.rounds} interleaved rounds")
    print(f"(default: {used} threads, {how})\n")
    print(table(["variant", "GiB/s", "speed vs first touch (paired median)"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
