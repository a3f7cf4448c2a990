"""N ranks of one node started at once: what each rank's startup hook costs, cold and warm,
and how often the node's machine files are read.

Every rank of a node reads the same machine for the same answer; some of those files are
slow and serialise across processes (hwloc#756: 32 readers of the CPUs' frequency files at
once took 31.8 s).  numabind reads them once per node: the first rank, under a lock, for
all (numabind._cache).  Here N ranks (N = 1, 8, 64, as the host allows) of a generated DGX
H100 start together, read as ranks read it (the tree bind-mounted over /sys in a private
mount namespace, where root and unshare(1) allow; else NUMABIND_SYSROOT), with
``NUMABIND_PRIORITY=main`` so that the per-CPU kind files are read too:

  cold   no cache: one rank reads the machine, the others wait for its file
  warm   the cache is there: no rank reads the machine
  full   NUMABIND_CACHE=0: every rank reads it (numabind before the cache)
  bare   the same interpreter with no trigger variable, N at once (the baseline)

Reported per N: the median per-rank CPU time over bare (each process's own rusage), the
wall time until the last rank has started, and from a second pass with an audit hook in
every rank, the most times any one machine file (/sys, /proc/driver) was opened across the
N ranks, apart from the files the cache's witnesses name (its cgroup's cpuset, the CPUs
and nodes online, each GPU's node: every rank compares those, by design).

Run: python benchmarks/ranks.py [--ranks 1,8,64] [--rounds N]   (NUMABIND_BENCH_SMALL=1: CI)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import SMALL, clean_env, clear_caches, table

import synth
from support import as_live

COUNT = (
    "import json, sys; opened = []\n"
    "def audit(event, args):\n"
    "    if event in ('open', 'os.listdir', 'os.scandir') and isinstance(args[0], str):\n"
    "        opened.append(args[0])\n"
    "sys.addaudithook(audit)\n"
    "import site; site.main()\n"
    "print(json.dumps(opened))\n"
)


def _machine_file(path: str) -> bool:
    """A file of the machine (not the rank's own /proc/self, not the cache, not the key's
    cpuset files): with a mount namespace, /sys and /proc/driver; with a sysroot, the
    tree's paths (opened relative to it)."""
    if path.startswith(("/proc/self", "/proc/sys/kernel/random", "/dev/shm")):
        return False
    # the kernel's 'possible' masks bound every list a live reader parses: read by any
    # rank that reads one small file itself (a live fact, its own GPU's details)
    if (
        "cgroup" in path
        or path.endswith(("cpu/online", ".lock", "/possible"))
        or "machine-" in path
    ):
        return False
    if "numabind-cache" in path or path.startswith("numabind"):
        return False
    return path.startswith(("/sys", "/proc/driver")) or (
        not path.startswith("/") and path.startswith(("sys", "proc"))
    )


def _start_all(argvs: list[list[str]], envs: list[dict[str, str]]) -> tuple[list[float], float]:
    """Start every process at once; (each one's CPU time, the wall time until all ended)."""
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(a, env=e, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for a, e in zip(argvs, envs)
    ]
    cpu = []
    for p in procs:
        _, status, usage = os.wait4(p.pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise RuntimeError(f"a rank failed: {p.args}")
        cpu.append(usage.ru_utime + usage.ru_stime)
    return cpu, time.perf_counter() - t0


def _counts(python: str, envs: list[dict[str, str]]) -> int:
    """The most times one machine file was opened across all the ranks, started at once."""
    procs = [
        subprocess.Popen(
            [python, "-S", "-c", COUNT], env=e, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        for e in envs
    ]
    seen: dict[str, int] = {}
    opened = [set(json.loads(p.communicate(timeout=300)[0])) for p in procs]
    witnessed = _witnessed()
    for paths in opened:
        for path in paths:
            if _machine_file(path) and not any(path.endswith(w) for w in witnessed):
                seen[path] = seen.get(path, 0) + 1
    return max(seen.values(), default=0)


def _witnessed() -> set[str]:
    """The files the cache's witnesses name (every rank compares them: a handful of small
    files, the price of never trusting a machine that changed), read from this user's
    machine and answers files."""
    import _numabind_base as base

    out: set[str] = set()
    d = Path(f"/dev/shm/numabind-cache-{os.geteuid()}")
    for f in [*d.glob("machine-*"), *d.glob("answers-*")] if d.is_dir() else []:
        if f.suffix == ".lock":
            continue
        for line in f.read_text(errors="replace").split("\n"):
            if line.startswith("w "):
                out.add(base.unescape(line.split(" ")[2]))
    return out


def measure(python: str, ranks: int, rounds: int, env: dict[str, str], marker: str) -> list[str]:
    """One row: N ranks at once, cold, warm, full and bare, ``rounds`` times each."""
    envs = [dict(env, LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(ranks)) for r in range(ranks)]
    argv = [[python, "-c", "pass"]] * ranks
    got: dict[str, list[float]] = {k: [] for k in ("bare", "cold", "warm", "full")}
    walls: dict[str, list[float]] = {k: [] for k in got}
    for _ in range(rounds):
        for kind in ("bare", "cold", "warm", "full"):
            if kind == "cold":
                clear_caches(marker)
            if kind == "bare":
                these = [clean_env()] * ranks
            elif kind == "full":
                these = [dict(e, NUMABIND_CACHE="0") for e in envs]
            else:
                these = envs
            cpu, wall = _start_all(argv, these)
            got[kind].append(statistics.median(cpu))
            walls[kind].append(wall)
    bare = statistics.median(got["bare"])
    clear_caches(marker)
    cold_reads = _counts(python, envs)
    warm_reads = _counts(python, envs)
    full_reads = _counts(python, [dict(e, NUMABIND_CACHE="0") for e in envs])
    row = [str(ranks)]
    for kind in ("cold", "warm", "full"):
        row.append(f"{(statistics.median(got[kind]) - bare) * 1000:+.2f}")
    row.append(f"{bare * 1000:.2f}")
    row += [f"{statistics.median(walls[k]) * 1000:.0f}" for k in ("cold", "warm", "full")]
    row += [str(cold_reads), str(warm_reads), str(full_reads)]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="1,8" if SMALL else "1,8,64")
    ap.add_argument("--rounds", type=int, default=2 if SMALL else 7)
    ap.add_argument("--inside", help=argparse.SUPPRESS)  # the run in the mount namespace
    args = ap.parse_args()
    if args.inside:
        spec = json.loads(Path(args.inside).read_text())
        rows = [
            measure(spec["python"], n, args.rounds, spec["env"], spec["marker"])
            for n in spec["ranks"]
        ]
        Path(spec["out"]).write_text(json.dumps(rows))
        return 0
    counts = [int(n) for n in args.ranks.split(",")]
    with tempfile.TemporaryDirectory(prefix="numabind-ranks-") as tmp_name:
        tmp = Path(tmp_name)
        root = synth.write(synth.dgx_h100(), str(tmp / "dgx"))
        namespace, why_not = as_live(root)
        # every rank sees node 0's GPUs: a rank planned onto node 1 of the generated DGX
        # could not bind on a host whose real CPUs are all node 0's (its calls fail and it
        # is handed to the full path), and would measure this host, not the cache
        env = clean_env(
            NUMABIND="force",
            NUMABIND_PRIORITY="main",
            NUMABIND_MEMORY="none",
            CUDA_VISIBLE_DEVICES="0,1,2,3",
        )
        marker = "sysroot=/|"
        if not namespace:
            env["NUMABIND_SYSROOT"] = root
            marker = f"sysroot={root}|"
        spec = tmp / "spec.json"
        out = tmp / "rows.json"
        what = {"python": sys.executable, "ranks": counts, "env": env, "marker": marker}
        spec.write_text(json.dumps({**what, "out": str(out)}))
        me = [sys.executable, __file__, "--inside", str(spec), "--rounds", str(args.rounds)]
        subprocess.run([*namespace, *me], check=True)
        rows = json.loads(out.read_text())
    how = "mounted over /sys" if namespace else f"as NUMABIND_SYSROOT ({why_not})"
    print(
        f"N ranks of a generated DGX H100 ({how}) started at once, NUMABIND_PRIORITY=main, "
        f"CPU time, median of {args.rounds} rounds ({sys.version.split()[0]})\n"
    )
    header = [
        "N", "cold ms/rank", "warm ms/rank", "full ms/rank", "bare ms", "cold wall ms",
        "warm wall ms", "full wall ms", "max reads of a machine file: cold", "warm", "full",
    ]  # fmt: skip
    print(table(header, rows))
    print(
        "\nms/rank: the median rank's CPU time over a bare interpreter's (N started at once);"
        "\nmax reads: across the N ranks, the most times any one machine file was opened (the"
        "\nfiles the cache's witnesses name, which every rank compares, not counted)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
