"""Thread pools sized to the binding: the same CPU-side work per rank with torchrun's
default (OMP_NUM_THREADS=1 for every multi-process job) and with NUMABIND_THREADS=auto,
side by side in one run, printing the ratio.

Each variant starts two ranks under a torchrun-like parent (which writes
OMP_NUM_THREADS=1 the way torch/distributed/run.py does), each running a torch matmul loop
and a numpy op.  The budget is the rank's cores: on a 2-CPU machine it equals torchrun's 1
and the ratio means nothing; run it where a rank's budget is above 1.

Run: python benchmarks/threads.py    (NUMABIND_BENCH_SMALL=1: a short run, for CI)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from _common import SMALL, clean_env, table

WORK = r"""
import json, os, time
import numpy as np
out = {"omp": os.environ.get("OMP_NUM_THREADS"), "cpus": len(os.sched_getaffinity(0))}
a = np.random.rand(%(n)d, %(n)d)
t0 = time.perf_counter()
for _ in range(%(reps)d):
    a @ a
out["numpy"] = time.perf_counter() - t0
try:
    import torch
    out["torch_threads"] = torch.get_num_threads()
    x = torch.rand(%(n)d, %(n)d)
    t0 = time.perf_counter()
    for _ in range(%(reps)d):
        x @ x
    out["torch"] = time.perf_counter() - t0
except ImportError:
    pass
print("RESULT " + json.dumps(out))
"""

AGENT = r"""
import os, subprocess, sys
os.environ["OMP_NUM_THREADS"] = "1"  # torchrun, when it is unset and nproc_per_node > 1
os.environ["TORCHELASTIC_RUN_ID"] = "bench"
procs = [subprocess.Popen([sys.executable, "-c", sys.argv[1]],
         env={**os.environ, "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2"},
         stdout=subprocess.PIPE, text=True) for r in range(2)]
for p in procs:
    print(p.communicate()[0], end="")
"""


def run(threads: str | None, n: int, reps: int) -> list[dict[str, float]]:
    env = clean_env()
    if threads:
        env["NUMABIND_THREADS"] = threads
    p = subprocess.run(
        [sys.executable, "-c", AGENT, WORK % {"n": n, "reps": reps}],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return [json.loads(line[7:]) for line in p.stdout.splitlines() if line.startswith("RESULT ")]


def main() -> int:
    try:
        import numpy  # noqa: F401
    except ImportError:
        print("numpy is not installed: nothing to measure")
        return 0
    n, reps = (256, 3) if SMALL else (1024, 10)
    rounds = 1 if SMALL else 3
    rows = []
    for label, setting in (("torchrun default", None), ("NUMABIND_THREADS=auto", "auto")):
        best: dict[str, float] = {}
        seen: dict[str, object] = {}
        for _ in range(rounds):
            ranks = run(setting, n, reps)
            for k in ("numpy", "torch"):
                if all(k in r for r in ranks):
                    worst = max(r[k] for r in ranks)
                    best[k] = min(best.get(k, worst), worst)
            seen = {"omp": [r["omp"] for r in ranks], "cpus": [r["cpus"] for r in ranks]}
        rows.append(
            [label, str(seen["omp"]), f"{best.get('numpy', 0):.3f}", f"{best.get('torch', 0):.3f}"]
        )
        time.sleep(0.1)
    print(
        f"2 ranks, {n}x{n} matmul x {reps}, slowest rank, best of {rounds} "
        f"({os.cpu_count()} CPUs)\n"
    )
    print(table(["variant", "OMP_NUM_THREADS per rank", "numpy s", "torch s"], rows))
    for i, k in ((2, "numpy"), (3, "torch")):
        a, b = float(rows[0][i]), float(rows[1][i])
        if a and b:
            print(f"{k}: torchrun default / NUMABIND_THREADS=auto = {a / b:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
