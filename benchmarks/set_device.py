"""What numabind.torch's device-selection hook costs after the first call: a second
``torch.cuda.set_device`` with the hook installed, side by side with the same call on
torch's own function, in one process (torch's CPU build refuses the call itself; both
variants pay that alike, so the difference is the hook's).

Run: python benchmarks/set_device.py    (needs torch; NUMABIND_BENCH_SMALL=1: fewer calls)
"""

from __future__ import annotations

import os
import statistics
import sys
import time

from _common import SMALL, table


def timed(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    for _ in range(n):
        try:
            fn(0)
        except Exception:
            pass
    return (time.perf_counter() - t0) / n


def main() -> int:
    try:
        import torch
    except ImportError:
        print("torch is not installed: nothing to measure")
        return 0
    import types

    import numabind.torch

    n = 2_000 if SMALL else 200_000
    rounds = 3 if SMALL else 9
    # 1. the hook alone: torch's CPU build raises in set_device, which would dominate; so
    #    the same wrapper around a function that does nothing, next to that function
    stand_in = types.ModuleType("stand_in")

    def select(device: object) -> None:
        return None

    stand_in.set_device = select  # type: ignore[attr-defined]
    numabind.torch._wrap_selector(stand_in, "set_device", "stand_in.set_device")
    hooked_stand_in = stand_in.set_device  # type: ignore[attr-defined]
    numabind.torch._seen.add(0)  # as after the first call
    # 2. torch's own set_device, hooked and not (both raise on the CPU build)
    original = torch.cuda.set_device
    os.environ["NUMABIND_TORCH_SET_DEVICE"] = "1"
    numabind.torch.install_set_device()
    hooked = torch.cuda.set_device
    rows = []
    for label, plain, wrapped in (
        ("a function that does nothing", select, hooked_stand_in),
        ("torch.cuda.set_device (CPU build: raises)", original, hooked),
    ):
        a, b = [], []
        for _ in range(rounds):
            a.append(timed(plain, n))
            b.append(timed(wrapped, n))
        ma, mb = statistics.median(a) * 1e6, statistics.median(b) * 1e6
        rows.append([label, f"{ma:.3f}", f"{mb:.3f}", f"{mb - ma:+.3f}"])
    print(f"torch {torch.__version__}: {n} later calls x {rounds} rounds, median us per call\n")
    print(table(["selector", "plain", "with numabind's hook", "hook's cost"], rows))
    numabind.torch.uninstall()
    return 0


if __name__ == "__main__":
    sys.exit(main())
