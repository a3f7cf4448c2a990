"""Memory tiers on a real kernel (issue 36): one VM boot, 2 CPU nodes (1 GiB each) and two
CPU-less memory nodes of 512 MiB, node 2 the memory of a spoofed NVIDIA GPU (its PCI
numa_node is node 2, as a GB200's GPU's is) and node 3 far (distance 40 from every
node).  The SLIT puts node 2 nearer node 0 (20) than node 1 is (30), so a full node 0
spills onto the GPU's memory first under the kernel's own fallback.  A rank bound to
GPU 0 (node 0) fills more than node 0 holds, under the default (NUMABIND_SPILL=cpu), any,
and cpu,2; the probe measures where its pages are with its own code (numa_maps,
move_pages in query mode).  Then a rank that puts pages on node 2 by hand is checked,
and a process-wide interleave is shown not to reach a host buffer.

Usage (in the guest): python tests/vm/tiers.py OUT.json
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scenarios import PY, base_env, probe, run
from steps import run_steps

FILL_MIB = 1280  # more than node 0 holds (1 GiB), less than nodes 0 and 1 together


def topology(results: dict[str, Any]) -> None:
    """What numabind reads on this kernel: kinds, tiers, the plan of LOCAL_RANK=0."""
    from numabind._devices import resolve
    from numabind._plan import Request, plan
    from numabind._topology import Machine

    m = Machine.from_root("/")
    results["nodes_read"] = [
        {"id": n.id, "kind": n.kind, "how": n.kind_how, "tier": n.tier, "bytes": n.memory_bytes}
        for n in m.nodes
    ]
    results["distances"] = {str(n.id): dict(n.distances) for n in m.nodes}
    visible = resolve(m, {})
    p = plan(m, Request(local_rank=0, visible=visible))
    results["plan"] = {
        "summary": p.summary(),
        "kernel_policy": [p.placement.kernel_policy[0], sorted(p.placement.kernel_policy[1])],
        "memory_nodes": sorted(p.memory_nodes),
    }
    with open("/proc/sys/vm/zone_reclaim_mode") as f:
        results["zone_reclaim_mode"] = f.read().strip()


def fills(results: dict[str, Any]) -> None:
    for name, spill in (("default", None), ("any", "any"), ("named", "cpu,2")):
        env = {"LOCAL_RANK": "0"}
        if spill is not None:
            env["NUMABIND_SPILL"] = spill
        results[f"fill_{name}"] = run(probe("tier_fill", FILL_MIB), env)


def by_hand(results: dict[str, Any]) -> None:
    """A bound rank puts 64 MiB on node 2 (GPU memory) itself and asks numabind for a
    buffer on node 3 by name; numabind check, run meanwhile, warns of node 2 only."""
    env = dict(base_env(), LOCAL_RANK="0")
    proc = subprocess.Popen(
        [*probe("tier_fill", 64, "--by-hand", 2, "--buffer", 3, "--hold")],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    results["by_hand"] = json.loads(line) if line.startswith("{") else {"stdout": line}
    t0 = time.time()
    check = subprocess.run(
        [PY, "-m", "numabind", "check", "--pid", str(proc.pid), "--json"],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    results["check"] = {
        "rc": check.returncode,
        "json": json.loads(check.stdout) if check.stdout.startswith("{") else None,
        "stderr": check.stderr[-2000:],
        "seconds": round(time.time() - t0, 1),
    }
    text = subprocess.run(
        [PY, "-m", "numabind", "check", "--pid", str(proc.pid)],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    results["check_text"] = text.stdout[-4000:]
    proc.stdin.write("\n")
    proc.stdin.close()
    proc.wait(timeout=120)
    results["by_hand_rc"] = proc.returncode


def interleave(results: dict[str, Any]) -> None:
    results["interleave"] = run(probe("tier_fill", 16, "--interleave-all"), {"LOCAL_RANK": "0"})


def main() -> int:
    steps = [(step.__name__, step) for step in (topology, fills, by_hand, interleave)]
    return run_steps(sys.argv[1], steps, {})


if __name__ == "__main__":
    sys.exit(main())
