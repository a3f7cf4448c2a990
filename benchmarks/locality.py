"""Memory locality of every way to launch a rank, measured in the multi-NUMA VM.

The rank's GPU is on node 1; every process starts on node 0's CPUs (where a launcher or the
scheduler happened to put it), except the numactl trampolines, which are the first thing
the launcher runs (libnuma refuses CPUs outside the mask numactl itself started with).
The same workload everywhere: import torch, allocate and
touch 500 MB, 4 threads that allocate 25 MB each.  Late paths bind after ``import torch``,
as their real counterparts do, before the allocations.  Reported: the share of the
process's private anonymous pages on node 1 at the end (/proc/self/numa_maps).

  none              no binding
  numactl           trampoline: numactl --cpunodebind=1 --membind=1 python ...
  torch-script      PyTorch's script path: numactl --physcpubind=<node 1 CPUs> (CPU only)
  torch-callable    PyTorch's Callable path: its _bind_all_threads_in_current_process_to_
                    logical_cpus(node 1 CPUs) after imports (CPU only)
  accelerate        accelerate-style: os.sched_setaffinity(0, node 1 CPUs) after imports
  numabind-hook     LOCAL_RANK=1: the startup hook
  child_binding     the parent starts the rank inside numabind.child_binding(1)
  numa_bound        @numa_bound after imports, migrating what is already placed
  numa_bound-nomig  the same with migrate=False

Run on the host: python benchmarks/locality.py  (boots the VM: ~60 s per torch import
under emulation, ~12 min in all).  NUMABIND_BENCH_SMALL=1: no torch, 20 MB (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, SMALL, clean_env, table

WORKLOAD = r"""
import os, sys, json, threading
MB = %(mb)d
IMPORT = %(import_torch)r
LATE = %(late)r
if IMPORT:
    import torch
    x = torch.ones(1 << 20)
else:
    import json as _j
NODE1 = %(node1)r
if LATE == "torch-callable":
    if IMPORT:
        from torch.numa.binding import _bind_all_threads_in_current_process_to_logical_cpus as b
        b(logical_cpu_indices=set(NODE1))
    else:
        for t in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(t), NODE1)
elif LATE == "accelerate":
    os.sched_setaffinity(0, NODE1)
elif LATE in ("numa_bound", "numa_bound-nomig"):
    from numabind import numa_bound
    @numa_bound(rank_arg=0, migrate=LATE == "numa_bound")
    def bind(rank):
        pass
    bind(1)
buf = b"\x01" * (MB << 20)
keep = []
def alloc():
    keep.append(b"\x02" * ((MB // 20) << 20))
ts = [threading.Thread(target=alloc) for _ in range(4)]
[t.start() for t in ts]; [t.join() for t in ts]
from numabind._kernel import pages_per_node, private_anon_regions
print("RESULT " + json.dumps(pages_per_node(private_anon_regions())))
"""

PATHS = [
    "none",
    "numactl",
    "torch-script",
    "torch-callable",
    "accelerate",
    "numabind-hook",
    "child_binding",
    "numa_bound",
    "numa_bound-nomig",
]


def node_cpus(node: int) -> list[int]:
    from numabind._sysfs import parse_cpulist

    return sorted(parse_cpulist(Path(f"/sys/devices/system/node/node{node}/cpulist").read_text()))


def run_path(name: str) -> dict[str, object]:
    node0, node1 = node_cpus(0), node_cpus(1)
    code = WORKLOAD % {
        "mb": 20 if SMALL else 500,
        "import_torch": not SMALL,
        "late": name,
        "node1": node1,
    }
    env = clean_env()
    env["NUMABIND"] = "0"
    argv = [sys.executable, "-c", code]
    if name == "numactl":
        argv = ["numactl", "--cpunodebind=1", "--membind=1", *argv]
    elif name == "torch-script":
        argv = ["numactl", f"--physcpubind={','.join(map(str, node1))}", *argv]
    elif name == "numabind-hook":
        env.update(NUMABIND="auto", LOCAL_RANK="1")
    elif name.startswith("numa_bound"):
        env["NUMABIND"] = "auto"

    def start_on_node0() -> None:
        os.sched_setaffinity(0, node0)

    t0 = time.time()
    if name == "child_binding":
        import numabind

        os.sched_setaffinity(0, node0)
        try:
            with numabind.child_binding(1):
                p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        finally:
            os.sched_setaffinity(0, node0 + node1)
    else:
        p = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
            preexec_fn=None if name in ("numactl", "torch-script") else start_on_node0,
        )
    line = next((x for x in p.stdout.splitlines() if x.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        return {"error": p.stderr[-1500:], "seconds": round(time.time() - t0, 1)}
    pages = {int(k): v for k, v in json.loads(line[7:]).items()}
    total = sum(pages.values())
    return {
        "pages": pages,
        "share": pages.get(1, 0) / total if total else 0.0,
        "mb": total * 4 // 1024,
        "seconds": round(time.time() - t0, 1),
    }


def inside() -> int:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0,1")
    rows = []
    results = {}
    for name in PATHS:
        r = run_path(name)
        results[name] = r
        if "error" in r:
            rows.append([name, "error", "-", "-"])
            print(f"{name}: {r['error']}", file=sys.stderr)
        else:
            rows.append(
                [name, f"{r['share']:.1%}", str(r["mb"]), str(r["pages"].get(0, 0) * 4 // 1024)]
            )
    what = (
        "import of a 20 MB workload (no torch)"
        if SMALL
        else "import torch + 500 MB + 4 threads x 25 MB"
    )
    print(
        "share of private anonymous pages on the GPU's node (node 1); "
        f"process started on node 0; {what}\n"
    )
    print(table(["launch path", "on GPU node", "private MB", "MB left on node 0"], rows))
    return 1 if any("error" in r for r in results.values()) else 0


def main() -> int:
    if os.environ.get("NUMABIND_VM") == "1":
        return inside()
    env = dict(
        os.environ,
        NODES="2",
        CPUS="2",
        MEM="1024" if SMALL else "3072",
        DEVICES="0 1",
        SPOOF="10de:2330:030200",
        VM_TIMEOUT="3000",
    )
    return subprocess.run(
        [str(ROOT / "scripts" / "numa-vm"), sys.executable, str(Path(__file__).resolve())],
        env=env,
        cwd=ROOT,
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
