"""Launcher scenarios inside the multi-NUMA VM: bindings that are already in place.

Layout: 2 nodes x 2 CPUs, four spoofed NVIDIA GPUs, devices 0-1 on node 0 and 2-3 on node 1
(PCI order puts both node-0 devices first).  Each rank prints one JSON line: its local rank,
its CPU mask and memory policy at its first statement, and numabind's message, if any.

Usage (in the guest): python tests/vm/launchers.py OUT.json
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

PY = sys.executable
PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probes", "launched.py")


def launch(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 240
) -> dict[str, Any]:
    full = {
        k: v for k, v in os.environ.items() if not k.startswith("NUMABIND") or k == "NUMABIND_VM"
    }
    full.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    full.update(env or {})
    probe_dir = tempfile.mkdtemp(prefix="numabind-probe-")
    full["PROBE_DIR"] = probe_dir
    t0 = time.time()
    p = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=timeout)
    ranks = {}
    for name in os.listdir(probe_dir):
        with open(os.path.join(probe_dir, name)) as f:
            d = json.load(f)
        ranks[d["rank"]] = d
    shutil.rmtree(probe_dir, ignore_errors=True)
    return {
        "rc": p.returncode,
        "ranks": ranks,
        "stderr": p.stderr[-3000:],
        "stdout": p.stdout[-2000:],
        "seconds": round(time.time() - t0, 1),
    }


def main() -> int:
    out_path = sys.argv[1]
    results: dict[str, Any] = {"errors": {}}
    mpirun = shutil.which("mpirun")
    numactl = shutil.which("numactl")
    results["have"] = {"mpirun": bool(mpirun), "numactl": bool(numactl)}
    cases: dict[str, tuple[list[str], dict[str, str]]] = {}
    if mpirun:
        base = [mpirun, "--allow-run-as-root", "--oversubscribe"]
        # -np 2 maps by core: both ranks pinned on node 0, but rank 1's GPU (index 1 of
        # CUDA_VISIBLE_DEVICES=0,2) is on node 1; rank 0's is on node 0.
        cases["mpirun2"] = ([*base, "-np", "2", PY, PROBE], {"CUDA_VISIBLE_DEVICES": "2,0"})
        cases["mpirun2_respect"] = (
            [*base, "-np", "2", PY, PROBE],
            {"CUDA_VISIBLE_DEVICES": "2,0", "NUMABIND": "respect"},
        )
        cases["mpirun2_bindto_core"] = (
            [*base, "-np", "2", "--bind-to", "core", PY, PROBE],
            {"CUDA_VISIBLE_DEVICES": "0,1"},
        )
        # -np 4: round-robin by socket puts ranks 1 and 2 on the wrong socket for GPUs 1, 2
        cases["mpirun4"] = ([*base, "-np", "4", PY, PROBE], {})
    if numactl:
        cases["numactl_inside"] = (
            [numactl, "--physcpubind=3", "--membind=1", PY, PROBE],
            {"LOCAL_RANK": "2"},
        )
        cases["numactl_outside"] = (
            [numactl, "--cpunodebind=0", PY, PROBE],
            {"LOCAL_RANK": "3"},
        )
    cases["inherited"] = (
        [
            "taskset",
            "-c",
            "0",
            PY,
            "-c",
            "import subprocess, sys, os; subprocess.run([sys.executable, sys.argv[1]],"
            " env=dict(os.environ, LOCAL_RANK='3'))",
            PROBE,
        ],
        {},
    )
    for name, (argv, env) in cases.items():
        try:
            results[name] = launch(argv, env)
        except Exception:
            results["errors"][name] = traceback.format_exc()
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
