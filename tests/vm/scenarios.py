"""Scenarios run inside the multi-NUMA VM (scripts/numa-vm); results go to a JSON file.

Booting the VM costs seconds and Python runs ~50x slower inside it, so one boot runs every
scenario of a topology and the host-side tests (tests/test_vm.py) assert on the recorded
results.  Each scenario starts real processes with the installed startup hook, exactly as a
launcher would.  Expected layout: 2 nodes x 2 CPUs, two spoofed NVIDIA GPUs, device 0 on
node 0 (0000:21:00.0) and device 1 on node 1 (0000:41:00.0).

Usage (in the guest): python tests/vm/scenarios.py OUT.json [SCENARIO ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from typing import Any

PY = sys.executable
MB = 1 << 20


def node_cpus(node: int) -> list[int]:
    from numabind._sysfs import parse_cpulist

    with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
        return sorted(parse_cpulist(f.read()))


def run(
    code: str,
    env: dict[str, str] | None = None,
    cpus: list[int] | None = None,
    wrap: list[str] | None = None,
    timeout: float = 300,
) -> dict[str, Any]:
    """Start a Python child the way a launcher does, optionally on given CPUs first."""
    full = {
        k: v for k, v in os.environ.items() if not k.startswith("NUMABIND") or k == "NUMABIND_VM"
    }
    full.update(env or {})

    def pre() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    argv = [*(wrap or []), PY, "-c", code]
    t0 = time.time()
    proc = subprocess.run(
        argv, env=full, capture_output=True, text=True, preexec_fn=pre, timeout=timeout
    )
    out: dict[str, Any] = {
        "rc": proc.returncode,
        "stderr": proc.stderr,
        "seconds": round(time.time() - t0, 1),
    }
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    out["data"] = json.loads(lines[-1]) if lines else None
    out["stdout"] = proc.stdout[-2000:]
    return out


# The probe a rank runs: its very first statement records affinity and memory policy
# (the startup hook ran before it), then it imports, allocates and measures locality.
PROBE = r"""
import os
first_affinity = sorted(os.sched_getaffinity(0))
from numabind import _kernel
first_policy = _kernel.get_mempolicy()
import json, threading
buf = b"\x01" * (%(mb)d << 20)
import ctypes, mmap
m = mmap.mmap(-1, 4 << 20)
m.write(b"\x01" * (4 << 20))
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
where = sorted(set(_kernel.move_pages([addr + i * 4096 for i in range(1024)])))
def worker(out):
    out.append(b"\x02" * (8 << 20))
keep = []
ts = [threading.Thread(target=worker, args=(keep,)) for _ in range(2)]
[t.start() for t in ts]; [t.join() for t in ts]
from numabind._procmaps import pages_per_node, private_anon_regions
print(json.dumps({"affinity": first_affinity, "policy": [first_policy[0], sorted(first_policy[1])],
                  "pages": pages_per_node(private_anon_regions()), "move_pages": where}))
"""


def scenario_hook(results: dict[str, Any]) -> None:
    """LOCAL_RANK=k starts on the wrong node; the hook puts it on device k's node."""
    for rank in (0, 1):
        wrong = node_cpus(1 - rank)
        results[f"hook_rank{rank}"] = run(
            PROBE % {"mb": 200}, {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}, cpus=wrong
        )
        results[f"hook_rank{rank}"]["expect_cpus"] = node_cpus(rank)
    results["hook_verbose"] = run("pass", {"LOCAL_RANK": "1", "NUMABIND_VERBOSE": "1"})
    results["hook_off"] = run(
        PROBE % {"mb": 1}, {"LOCAL_RANK": "1", "NUMABIND": "0"}, cpus=node_cpus(0)
    )
    results["hook_cvd"] = run(
        PROBE % {"mb": 1}, {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "1"}, cpus=node_cpus(0)
    )


LATE = r"""
import os, json, threading
from numabind import _kernel, numa_bound
from numabind._procmaps import pages_per_node, private_anon_regions

def file_pages():
    per = {}
    with open("/proc/self/numa_maps") as f:
        for line in f:
            if " file=" not in line:
                continue
            for field in line.split():
                if field.startswith("N") and "=" in field and field[1:].split("=")[0].isdigit():
                    n, c = field[1:].split("=")
                    per[int(n)] = per.get(int(n), 0) + int(c)
    return per

os.sched_setaffinity(0, %(wrong_cpus)r)
_kernel.set_mempolicy("bind", {%(wrong)d})
buf = b"\x01" * (200 << 20)
stop = threading.Event()
threads = [threading.Thread(target=stop.wait) for _ in range(3)]
[t.start() for t in threads]
_kernel.set_mempolicy("default")
before = pages_per_node(private_anon_regions())
files_before = file_pages()

@numa_bound(rank_arg="rank", migrate=%(migrate)r)
def work(rank):
    return None

work(rank=%(rank)d)
after = pages_per_node(private_anon_regions())
files_after = file_pages()
affinity = {tid: sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}
policy = _kernel.get_mempolicy()
stop.set()
print(json.dumps({"before": before, "after": after, "files_before": files_before,
                  "files_after": files_after, "threads": affinity,
                  "policy": [policy[0], sorted(policy[1])], "binding": str(work.binding),
                  "moved": work.binding.pages_moved}))
"""


def scenario_late(results: dict[str, Any]) -> None:
    """@numa_bound in a process that already allocated 200 MB on the wrong node."""
    for migrate in (True, False):
        code = LATE % {"wrong_cpus": node_cpus(0), "wrong": 0, "rank": 1, "migrate": migrate}
        results[f"late_migrate_{migrate}"] = run(code, {})
    results["late_expect_cpus"] = node_cpus(1)


FILL = r"""
import json
total = 0
with open("/sys/devices/system/node/node1/meminfo") as f:
    for line in f:
        if "MemTotal" in line:
            total = int(line.split()[-2]) * 1024
buf = b"\x01" * (total + (96 << 20))
from numabind._procmaps import pages_per_node, private_anon_regions
print(json.dumps({"pages": pages_per_node(private_anon_regions())}))
"""


def scenario_memory(results: dict[str, Any]) -> None:
    """More than node 1 holds: preferred spills to node 0, strict bind refuses it."""
    results["fill_preferred"] = run(FILL, {"LOCAL_RANK": "1"})
    results["fill_bind"] = run(FILL, {"LOCAL_RANK": "1", "NUMABIND_MEMORY": "bind"})
    # interleave across a socket-mode plan is not possible on 1 CPU node/socket; check
    # that the policy requested is the policy the kernel reports
    results["policy_interleave"] = run(
        PROBE % {"mb": 8}, {"LOCAL_RANK": "1", "NUMABIND_MEMORY": "interleave"}
    )


def _cgroup() -> str | None:
    root = "/sys/fs/cgroup"
    try:
        if not os.path.exists(f"{root}/cgroup.controllers"):
            subprocess.run(["mount", "-t", "cgroup2", "none", root], check=True)
        with open(f"{root}/cgroup.subtree_control", "w") as f:
            f.write("+cpuset")
        os.makedirs(f"{root}/numabind-test", exist_ok=True)
        with open(f"{root}/numabind-test/cpuset.cpus", "w") as f:
            f.write(",".join(map(str, node_cpus(0))))
        with open(f"{root}/numabind-test/cpuset.mems", "w") as f:
            f.write("0")
    except (OSError, subprocess.CalledProcessError) as err:
        return f"cannot set up a cgroup: {err}"
    return None


def scenario_bad_input(results: dict[str, Any]) -> None:
    """Bad input leaves the program running with one line; strict mode exits non-zero."""
    user = "print('USER CODE RAN')"
    cases = {
        "garbled_rank": {"LOCAL_RANK": "zero"},
        "missing_uuid": {
            "LOCAL_RANK": "0",
            "CUDA_VISIBLE_DEVICES": "GPU-00000000-dead-beef-0000-000000000000",
        },
        "bad_index": {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "7"},
        "bad_mode": {"LOCAL_RANK": "0", "NUMABIND_MODE": "sideways"},
    }
    for name, env in cases.items():
        results[f"bad_{name}"] = run(user, env)
        results[f"strict_{name}"] = run(user, {**env, "NUMABIND_STRICT": "1"})
    problem = _cgroup()
    results["cgroup_setup"] = problem
    if problem is None:
        wrap = [
            "sh",
            "-c",
            'echo $$ > /sys/fs/cgroup/numabind-test/cgroup.procs && exec "$@"',
            "sh",
        ]
        results["bad_cgroup"] = run(user, {"LOCAL_RANK": "1"}, wrap=wrap)
        results["strict_cgroup"] = run(user, {"LOCAL_RANK": "1", "NUMABIND_STRICT": "1"}, wrap=wrap)
        results["ok_cgroup"] = run(PROBE % {"mb": 1}, {"LOCAL_RANK": "0"}, wrap=wrap)


HOLD = r"""
import os, sys, time
buf = b"\x01" * (50 << 20)
print("READY", flush=True)
sys.stdin.read()
"""


def scenario_check(results: dict[str, Any]) -> None:
    """numabind check on real processes: one on its plan, one left on the wrong node, and a
    numabind.spawn child whose rank exists only in numabind's registry."""
    numabind_cmd = os.path.join(os.path.dirname(PY), "numabind")
    base = {
        k: v for k, v in os.environ.items() if not k.startswith("NUMABIND") or k == "NUMABIND_VM"
    }

    def hold(env: dict[str, str], cpus: list[int] | None) -> subprocess.Popen[str]:
        def pre() -> None:
            if cpus is not None:
                os.sched_setaffinity(0, cpus)

        p = subprocess.Popen(
            [PY, "-c", HOLD],
            env={**base, **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=pre,  # noqa: PLW1509 - this driver starts no threads
        )
        assert p.stdout is not None
        p.stdout.readline()
        return p

    good = hold({"LOCAL_RANK": "1"}, node_cpus(0))
    bad = hold({"LOCAL_RANK": "1", "NUMABIND": "0"}, node_cpus(0))
    marker = f"/tmp/numabind-check-release-{os.getpid()}"
    spawner = subprocess.Popen(
        [
            PY,
            "-c",
            "import numabind, sys\nsys.path.insert(0, 'tests/vm')\nimport check_helpers\n"
            "if __name__ == '__main__':\n"
            f"    numabind.spawn(check_helpers.hold, 1, args=({marker!r},))",
        ],
        env=base,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert spawner.stdout is not None
    spawner.stdout.readline()
    try:
        for name, argv in {
            "check_good": ["--pid", str(good.pid)],
            "check_bad": ["--pid", str(bad.pid)],
            "check_all": ["--all"],
            "check_missing": ["--pid", "999999"],
        }.items():
            p = subprocess.run(
                [numabind_cmd, "check", *argv, "--json"], capture_output=True, text=True, env=base
            )
            results[name] = {
                "rc": p.returncode,
                "json": json.loads(p.stdout) if p.stdout.strip() else None,
                "stderr": p.stderr[-2000:],
            }
        text = subprocess.run(
            [numabind_cmd, "check", "--pid", str(bad.pid)], capture_output=True, text=True, env=base
        )
        results["check_bad_text"] = {"rc": text.returncode, "stdout": text.stdout}
        results["check_pids"] = {"good": good.pid, "bad": bad.pid}
        # migrate_pages moves another process's pages (numabind never does this to a rank:
        # as root it would move shared library pages too; here it proves the call)
        from numabind import _kernel
        from numabind._procmaps import pages_per_node, private_anon_regions

        before = pages_per_node(private_anon_regions(bad.pid))
        left = _kernel.migrate_pages(bad.pid, {0}, {1})
        after = pages_per_node(private_anon_regions(bad.pid))
        results["migrate_pages"] = {"before": before, "after": after, "not_moved": left}
    finally:
        with open(marker, "w"):
            pass
        for p in (good, bad, spawner):
            assert p.stdin is not None
            p.stdin.close()
            p.wait(timeout=60)


SCENARIOS = {
    "hook": scenario_hook,
    "late": scenario_late,
    "memory": scenario_memory,
    "bad_input": scenario_bad_input,
    "check": scenario_check,
}


def main() -> int:
    out_path = sys.argv[1]
    names = sys.argv[2:] or list(SCENARIOS)
    results: dict[str, Any] = {"nodes": int(os.environ.get("NUMABIND_VM_NODES", "0")), "errors": {}}
    for name in names:
        t0 = time.time()
        try:
            SCENARIOS[name](results)
        except Exception:
            results["errors"][name] = traceback.format_exc()
        results[f"time_{name}"] = round(time.time() - t0, 1)
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
