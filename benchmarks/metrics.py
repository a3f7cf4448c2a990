"""One scrape of the binding exporter on a node of 8 ranks, beside check's JSON.

8 real rank processes (each with 8 threads more, as a training rank's pools start them)
are bound by the startup hook on a generated two-node machine with 8 GPUs (GPU i on node
i % 2: this 2-CPU host can really bind them), registered in a registry of their own.  Then,
interleaved round by round so that the host's noise hits both alike:

  openmetrics   numabind check --pid P1..P8 --format openmetrics   (one scrape)
  json          numabind check --pid P1..P8 --json                 (the same report)

each as the command a textfile-collector timer runs (the interpreter's start included), and
in this process the two writers alone over one report (check's work done once): the
renderer (numabind.check._metrics.render) against ``json.dumps(report.to_dict())``.
Printed: the medians, their ratio, the exposition's size and series count.

Run: python benchmarks/metrics.py [--rounds N]   (NUMABIND_BENCH_SMALL=1: 3 rounds, for CI)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

from _common import SMALL, clean_env, interleaved, median_ms, table

import synth
from numabind._topology import Machine
from numabind.check._inspect import check
from numabind.check._metrics import render

RANKS = 8
CHILD = (
    "import sys, threading\n"
    "stop = threading.Event()\n"
    "for _ in range(8): threading.Thread(target=stop.wait, daemon=True).start()\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)


def start_ranks(root: str, registry: str) -> list[subprocess.Popen[str]]:
    ranks = []
    for i in range(RANKS):
        env = clean_env(
            LOCAL_RANK=str(i),
            LOCAL_WORLD_SIZE=str(RANKS),
            RANK=str(i),
            SLURM_JOB_ID="4242",
            NUMABIND_SYSROOT=root,
            NUMABIND_REGISTRY=registry,
            NUMABIND="force",
            NUMABIND_MEMORY="none",  # this kernel has one node: a policy on node 1 would fail
        )
        ranks.append(
            subprocess.Popen(
                [sys.executable, "-c", CHILD],
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        )
    for r in ranks:
        assert r.stdout is not None and r.stdout.readline().strip() == "ready"
    return ranks


def in_process(root: str, registry: str, pids: list[int], rounds: int) -> dict[str, float]:
    """Median ms of check() itself, and of each writer over its report."""
    machine = Machine.from_root(root)
    try:
        times: dict[str, list[float]] = {"check": [], "render": [], "json": []}
        for _ in range(rounds):
            t0 = time.perf_counter()
            report = check(pids, machine, settings={"NUMABIND_REGISTRY": registry})
            t1 = time.perf_counter()
            render(report)
            t2 = time.perf_counter()
            json.dumps(report.to_dict(), indent=2)
            t3 = time.perf_counter()
            times["check"].append(t1 - t0)
            times["render"].append(t2 - t1)
            times["json"].append(t3 - t2)
    finally:
        machine.close()
    return {k: statistics.median(v) * 1000 for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--rounds", type=int, default=3 if SMALL else 15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="numabind-metrics-") as work:
        root = synth.write(synth.two_nodes(gpus=RANKS), f"{work}/root")
        registry = f"{work}/registry"
        ranks = start_ranks(root, registry)
        try:
            pids = [r.pid for r in ranks]
            env = clean_env(NUMABIND_SYSROOT=root, NUMABIND_REGISTRY=registry)
            base = [sys.executable, "-m", "numabind", "check", "--pid", *map(str, pids)]
            variants = {
                "openmetrics": ([*base, "--format", "openmetrics"], env),
                "json": ([*base, "--json"], env),
            }
            for argv, e in variants.values():  # one untimed run each: both must succeed
                p = subprocess.run(argv, env=e, capture_output=True, text=True, timeout=120)
                if p.returncode != 0:
                    print(p.stdout[-2000:], p.stderr[-2000:], file=sys.stderr)
                    return 1
            p = subprocess.run(variants["openmetrics"][0], env=env, capture_output=True, text=True)
            text = p.stdout
            series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
            times = {k: median_ms(v) for k, v in interleaved(variants, args.rounds).items()}
            inner = in_process(root, registry, pids, max(args.rounds, 5))
        finally:
            for r in ranks:
                r.kill()
                r.wait()
    ratio = times["openmetrics"] / times["json"]
    print(
        f"{RANKS} ranks, {args.rounds} rounds; the exposition: {len(text):,} bytes, {series} series"
    )
    rows = [
        [
            "check --pid (8 ranks) --format openmetrics",
            f"{times['openmetrics']:.0f} ms",
            f"{ratio:.2f}",
        ],
        ["check --pid (8 ranks) --json", f"{times['json']:.0f} ms", "1.00"],
        ["in process: check() of 8 ranks", f"{inner['check']:.1f} ms", ""],
        [
            "in process: render() (OpenMetrics)",
            f"{inner['render']:.2f} ms",
            f"{inner['render'] / inner['json']:.2f}",
        ],
        ["in process: json.dumps(to_dict())", f"{inner['json']:.2f} ms", "1.00"],
    ]
    print(table(["one scrape (median)", "time", "vs json"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
