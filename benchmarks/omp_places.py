"""OpenMP placement for a rank: its compute throughput, and that of a helper thread it
starts (a DataLoader pin thread, a data-preparation thread), with three settings side by
side in one run, printing the ratios:

* ``unplaced``: NUMABIND_THREADS=auto only (OpenMP's threads float over the rank's CPUs);
* ``OMP_PLACES by hand``: OMP_PLACES=cores OMP_PROC_BIND=close set by the user: libgomp
  pins the main thread to one core at ``import torch``, and the helper thread started
  afterwards inherits that core;
* ``NUMABIND_OMP_PLACES=cores``: the same places, with the main thread (and so the
  helper) put back on the rank's CPUs.

The rank is bound for real: a generated machine whose node 0 is this host's CPUs (node 1
a second, fictitious node so that there is something to choose) gives rank 0 every CPU.
Where the host has fewer than 4 CPUs the placement has nothing to separate and the
script says so instead of printing a ratio.

Run: python benchmarks/omp_places.py    (NUMABIND_BENCH_SMALL=1: a short run, for CI)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from _common import SMALL, clean_env, table

import synth

WORK = r"""
import json, os, threading, time
import torch
n, reps = %(n)d, %(reps)d
x = torch.rand(n, n)
helper = {"ops": 0}
stop = threading.Event()
def spin():  # a helper's CPU work (collation, pinning): pure Python, holds no core of its own
    while not stop.is_set():
        sum(range(2000))
        helper["ops"] += 1
t = threading.Thread(target=spin, daemon=True)
t0 = time.perf_counter()
t.start()
for _ in range(reps):
    x @ x
compute = time.perf_counter() - t0
stop.set(); t.join()
print("RESULT " + json.dumps({"compute_s": compute, "helper_ops_per_s": helper["ops"] / compute,
                              "main": sorted(os.sched_getaffinity(0))}))
"""


def run(root: str, extra: dict[str, str], n: int, reps: int) -> dict[str, float]:
    env = clean_env(
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="2",
        NUMABIND_SYSROOT=root,
        NUMABIND_MEMORY="none",
        NUMABIND="force",
        NUMABIND_THREADS="auto",
        **extra,
    )
    p = subprocess.run(
        [sys.executable, "-c", WORK % {"n": n, "reps": reps}],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[7:])  # type: ignore[no-any-return]


VARIANTS = {
    "unplaced": {},
    "OMP_PLACES by hand": {"OMP_PLACES": "cores", "OMP_PROC_BIND": "close"},
    "NUMABIND_OMP_PLACES=cores": {"NUMABIND_OMP_PLACES": "cores"},
}


def main() -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("torch is not installed: nothing to measure")
        return 0
    cpus = sorted(os.sched_getaffinity(0))
    spec = synth.Spec(
        nodes=[cpus, [max(cpus) + 1 + i for i in range(len(cpus))]],
        package_of_node=[0, 1],
        gpus=[synth.Gpu("0000:01:00.0", 0), synth.Gpu("0000:02:00.0", 1)],
        memory_gib=1,
    )
    n, reps = (128, 5) if SMALL else (1024, 40)
    rounds = 1 if SMALL else 3
    with tempfile.TemporaryDirectory() as tmp:
        root = synth.write(spec, tmp)
        best: dict[str, dict[str, float]] = {}
        mains: dict[str, list[int]] = {}
        for r in range(rounds):
            names = list(VARIANTS)
            for name in names[r % 3 :] + names[: r % 3]:  # rotate: noise hits all alike
                got = run(root, VARIANTS[name], n, reps)
                mains[name] = got["main"]  # type: ignore[assignment]
                old = best.get(name)
                if old is None or got["compute_s"] < old["compute_s"]:
                    best[name] = got
    rows = [
        [
            name,
            ",".join(map(str, mains[name])),
            f"{best[name]['compute_s']:.3f}",
            f"{best[name]['helper_ops_per_s']:.0f}",
        ]
        for name in VARIANTS
    ]
    print(f"rank 0 on CPUs {cpus[0]}-{cpus[-1]}: {n}x{n} matmul x {reps}, best of {rounds}\n")
    print(table(["variant", "main thread CPUs", "compute s", "helper ops/s"], rows))
    if len(cpus) < 4:
        print(
            f"\nthis host has {len(cpus)} CPUs: a rank's OpenMP workers and its helper have "
            "no cores to be kept apart on, so the ratios would mean nothing (run it where a "
            "rank has 4 or more cores)"
        )
        return 0
    base = best["NUMABIND_OMP_PLACES=cores"]
    for name in ("unplaced", "OMP_PLACES by hand"):
        print(
            f"compute: {name} / NUMABIND_OMP_PLACES = "
            f"{best[name]['compute_s'] / base['compute_s']:.2f}x; helper throughput: "
            f"NUMABIND_OMP_PLACES / {name} = "
            f"{base['helper_ops_per_s'] / max(best[name]['helper_ops_per_s'], 1):.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
