"""Scenarios run inside the multi-NUMA VM (scripts/numa-vm); results go to a JSON file.

Booting the VM costs seconds and Python runs ~50x slower inside it, so one boot runs every
scenario of a topology and the host-side tests (tests/test_vm.py) assert on the recorded
results.  Each scenario starts real processes with the installed startup hook, exactly as a
launcher would; the programs they run are the modules in tests/vm/probes (ruff and mypy
see them).  Expected layout: 2 nodes x 2 CPUs, two spoofed NVIDIA GPUs, device 0 on node 0
(0000:21:00.0) and device 1 on node 1 (0000:41:00.0).

Usage (in the guest): python tests/vm/scenarios.py OUT.json [SCENARIO ...]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from steps import run_steps

PY = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
PROBES = os.path.join(HERE, "probes")
SECCOMP = [PY, "-S", os.path.join(os.path.dirname(HERE), "seccomp_eperm.py")]
NUMABIND = os.path.join(os.path.dirname(PY), "numabind")


def node_cpus(node: int) -> list[int]:
    from numabind._sysfs import parse_cpulist

    with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
        return sorted(parse_cpulist(f.read()))


def probe(name: str, *args: object) -> list[str]:
    return [PY, os.path.join(PROBES, f"{name}.py"), *map(str, args)]


def base_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith("NUMABIND") or k == "NUMABIND_VM"
    }


def run(
    argv: list[str] | str,
    env: dict[str, str] | None = None,
    cpus: list[int] | None = None,
    wrap: list[str] | None = None,
    timeout: float = 300,
) -> dict[str, Any]:
    """Start a Python child the way a launcher does, optionally on given CPUs first.
    ``argv`` is a probe's command line, or a short program for ``python -c``."""
    full = base_env()
    full.update(env or {})

    def pre() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    cmd = [PY, "-c", argv] if isinstance(argv, str) else argv
    t0 = time.time()
    proc = subprocess.run(
        [*(wrap or []), *cmd],
        env=full,
        capture_output=True,
        text=True,
        preexec_fn=pre,
        timeout=timeout,
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


def scenario_hook(results: dict[str, Any]) -> None:
    """LOCAL_RANK=k starts on the wrong node; the hook puts it on device k's node."""
    for rank in (0, 1):
        wrong = node_cpus(1 - rank)
        results[f"hook_rank{rank}"] = run(
            probe("rank", 200), {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}, cpus=wrong
        )
        results[f"hook_rank{rank}"]["expect_cpus"] = node_cpus(rank)
    results["hook_verbose"] = run("pass", {"LOCAL_RANK": "1", "NUMABIND_VERBOSE": "1"})
    results["hook_off"] = run(
        probe("rank", 1), {"LOCAL_RANK": "1", "NUMABIND": "0"}, cpus=node_cpus(0)
    )
    results["hook_cvd"] = run(
        probe("rank", 1), {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "1"}, cpus=node_cpus(0)
    )


def scenario_late(results: dict[str, Any]) -> None:
    """@numa_bound in a process that already allocated 200 MB on the wrong node."""
    wrong = ",".join(map(str, node_cpus(0)))
    for migrate in (True, False):
        results[f"late_migrate_{migrate}"] = run(probe("late", 200, 0, wrong, 1, int(migrate)))
    results["late_expect_cpus"] = node_cpus(1)


def scenario_memory(results: dict[str, Any]) -> None:
    """More than node 1 holds: preferred spills to node 0, strict bind refuses it."""
    results["fill_preferred"] = run(probe("fill"), {"LOCAL_RANK": "1"})
    results["fill_bind"] = run(probe("fill"), {"LOCAL_RANK": "1", "NUMABIND_MEMORY": "bind"})
    # interleave across a socket-mode plan is not possible on 1 CPU node/socket; check
    # that the policy requested is the policy the kernel reports
    results["policy_interleave"] = run(
        probe("rank", 8), {"LOCAL_RANK": "1", "NUMABIND_MEMORY": "interleave"}
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
        results["ok_cgroup"] = run(probe("rank", 1), {"LOCAL_RANK": "0"}, wrap=wrap)


def _hold(
    env: dict[str, str], cpus: list[int] | None, wrap: list[str] | None = None
) -> subprocess.Popen[str]:
    def pre() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    p = subprocess.Popen(
        [*(wrap or []), *probe("hold")],
        env={**base_env(), **env},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=pre,  # noqa: PLW1509 - this driver starts no threads
    )
    assert p.stdout is not None
    p.stdout.readline()
    return p


def _check(*argv: str) -> dict[str, Any]:
    p = subprocess.run(
        [NUMABIND, "check", *argv, "--json"], capture_output=True, text=True, env=base_env()
    )
    return {
        "rc": p.returncode,
        "json": json.loads(p.stdout) if p.stdout.strip() else None,
        "stderr": p.stderr[-2000:],
    }


def _release(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=120)


def scenario_check(results: dict[str, Any]) -> None:
    """numabind check on real processes: one on its plan, one left on the wrong node, and a
    numabind.spawn child whose rank exists only in numabind's registry."""
    good = _hold({"LOCAL_RANK": "1"}, node_cpus(0))
    bad = _hold({"LOCAL_RANK": "1", "NUMABIND": "0"}, node_cpus(0))
    marker = f"/tmp/numabind-check-release-{os.getpid()}"
    spawner = subprocess.Popen(
        [
            PY,
            "-c",
            "import numabind, sys\nsys.path.insert(0, 'tests/vm')\nimport check_helpers\n"
            "if __name__ == '__main__':\n"
            f"    numabind.spawn(check_helpers.hold, 1, args=({marker!r},))",
        ],
        env=base_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert spawner.stdout is not None
    spawner.stdout.readline()
    try:
        results["check_good"] = _check("--pid", str(good.pid))
        results["check_bad"] = _check("--pid", str(bad.pid))
        results["check_all"] = _check("--all")
        results["check_missing"] = _check("--pid", "999999")
        text = subprocess.run(
            [NUMABIND, "check", "--pid", str(bad.pid)],
            capture_output=True,
            text=True,
            env=base_env(),
        )
        results["check_bad_text"] = {"rc": text.returncode, "stdout": text.stdout}
        results["check_pids"] = {"good": good.pid, "bad": bad.pid}
        # migrate_pages moves another process's pages (numabind never does this to a rank:
        # as root it would move shared library pages too; here it proves the call)
        from numabind import _kernel
        from numabind._kernel import pages_per_node, private_anon_regions

        before = pages_per_node(private_anon_regions(bad.pid))
        left = _kernel.migrate_pages(bad.pid, {0}, {1})
        after = pages_per_node(private_anon_regions(bad.pid))
        results["migrate_pages"] = {"before": before, "after": after, "not_moved": left}
    finally:
        with open(marker, "w"):
            pass
        assert spawner.stdin is not None
        spawner.stdin.close()
        spawner.wait(timeout=120)
        _release(good, bad)


def scenario_threads(results: dict[str, Any]) -> None:
    """NUMABIND_THREADS=auto: each rank of two gets its node's 2 cores; the user's value
    stays; torchrun's own OMP_NUM_THREADS=1 (its agent's initial environment has none) is
    replaced."""
    for rank in (0, 1):
        results[f"threads_rank{rank}"] = run(
            probe("rank", 1),
            {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2", "NUMABIND_THREADS": "auto"},
        )
    results["threads_user"] = run(
        probe("rank", 1),
        {
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "2",
            "NUMABIND_THREADS": "auto",
            "MKL_NUM_THREADS": "7",
        },
    )
    agent = (
        "import os, subprocess, sys\n"
        "os.environ.update(OMP_NUM_THREADS='1', TORCHELASTIC_RUN_ID='vm')\n"
        f"sys.exit(subprocess.run({probe('rank', 1)!r}, env={{**os.environ, 'LOCAL_RANK': '1', "
        "'LOCAL_WORLD_SIZE': '2'}).returncode)\n"
    )
    results["threads_torchrun"] = run(agent, {"NUMABIND_THREADS": "auto"})


def scenario_seccomp(results: dict[str, Any]) -> None:
    """A container that refuses the memory-policy calls (a real seccomp filter): the rank
    still runs on its node's CPUs, says once what was refused, and the pages it first
    touches there are local anyway; with docker's CAP_SYS_NICE profile only move_pages and
    migrate_pages are refused.  numabind check copes with both."""
    results["seccomp_all"] = run(
        [*SECCOMP, "--", *probe("rank", 200)], {"LOCAL_RANK": "1"}, cpus=node_cpus(0)
    )
    results["seccomp_docker"] = run(
        [*SECCOMP, "--calls", "docker", "--", *probe("rank", 200)],
        {"LOCAL_RANK": "1"},
        cpus=node_cpus(0),
    )
    held = _hold({"LOCAL_RANK": "1"}, node_cpus(0), wrap=[*SECCOMP, "--"])
    try:
        results["seccomp_check"] = _check("--pid", str(held.pid))
    finally:
        _release(held)


def _big_anon(pid: int) -> list[str]:
    """numa_maps lines of a process's anonymous mappings over 4 MB (evidence on failure)."""
    with open(f"/proc/{pid}/numa_maps") as f:
        lines = f.read().splitlines()
    return [
        line
        for line in lines
        if "file=" not in line and int((line.split("anon=")[1:] or ["0"])[0].split()[0]) > 1000
    ]


def scenario_fork(results: dict[str, Any]) -> None:
    """A fork child shares its parent's pages copy-on-write: check reports them apart
    (shared_pages) and does not call the child off plan for them."""
    p = subprocess.Popen(
        probe("fork_child", ",".join(map(str, node_cpus(0)))),
        env=base_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert p.stdout is not None
    line = p.stdout.readline()
    try:
        child = int(line.split()[1])
        results["fork_check"] = _check("--pid", str(child))
        results["fork_child_pid"] = child
        results["fork_parent_alive"] = p.poll() is None
        results["fork_maps"] = {
            who: _big_anon(pid) for who, pid in (("parent", p.pid), ("child", child))
        }
    finally:
        _release(p)


def scenario_bench(results: dict[str, Any]) -> None:
    """numabind bench in a VM: placement verified on both nodes; QEMU does not model
    NUMA latency, so the verdict must be 'no measurable difference'."""
    t0 = time.time()
    p = subprocess.run(
        [NUMABIND, "bench", "--json", "--quick", "--size", "32"],
        capture_output=True,
        text=True,
        env={**base_env(), "LOCAL_WORLD_SIZE": "2"},
        timeout=300,
    )
    results["bench"] = {
        "rc": p.returncode,
        "json": json.loads(p.stdout) if p.returncode == 0 else None,
        "stderr": p.stderr[-3000:],
        "seconds": round(time.time() - t0, 1),
    }


def scenario_host_memory(results: dict[str, Any]) -> None:
    """Host buffers from a process bound to node 0: on node 1 (bind, preferred), over both
    (interleave), per device, a range moved, a request too big refused, and under a
    seccomp filter placed by first touch; measured by the probe's own code."""
    results["host_buffers"] = run(probe("host_buffers", 256))
    results["host_buffers_seccomp"] = run(
        [*SECCOMP, "--", *probe("host_buffers", 128, "--seccomp")]
    )


def scenario_several(results: dict[str, Any]) -> None:
    """One process, several GPUs: a thread per GPU in bind_thread(device=k), each touching
    200 MB there; NUMABIND_DEVICES=all (the union); apply() twice, a second binder, check."""
    results["several_threads"] = run(probe("several_gpus", 200), cpus=node_cpus(0))
    results["several_all"] = run(probe("rank", 1), {"NUMABIND_DEVICES": "all"}, cpus=node_cpus(0))
    results["several_rebinder"] = run(probe("rebinder"), {"LOCAL_RANK": "1"}, cpus=node_cpus(0))
    results["several_expect"] = {"0": node_cpus(0), "1": node_cpus(1)}


NIC_TREE = "/tmp/numabind-nic/class"  # the /sys/class the NIC scenario's ranks see


def _nic_tree() -> dict[str, str]:
    """An InfiniBand tree over real PCI devices of each node: the bridge above each
    spoofed GPU (0000:20:00.0 on node 0, 0000:40:00.0 on node 1) becomes the PCI function
    of an active HDR adapter, mlx5_<node>.  The guest has no RDMA module and soft-RoCE has
    no PCI parent, so the tree is built in a tmpfs and bind-mounted over /sys/class in each
    rank's own mount namespace (:func:`_nic_wrap`), the way the harness spoofs GPU ids."""
    placed = {}
    for item in os.environ.get("NUMABIND_VM_DEVICES", "").split():
        bdf, _, node = item.partition("=")
        real = os.path.realpath(f"/sys/bus/pci/devices/{bdf}")
        parent = os.path.dirname(real)
        name = f"mlx5_{node}"
        base = f"{NIC_TREE}/infiniband/{name}"
        os.makedirs(f"{base}/ports/1", exist_ok=True)
        for f, text in (
            ("state", "4: ACTIVE"),
            ("rate", "200 Gb/sec (4X HDR)"),
            ("link_layer", "InfiniBand"),
        ):
            with open(f"{base}/ports/1/{f}", "w") as out:
                out.write(text + "\n")
        if not os.path.islink(f"{base}/device"):
            os.symlink(parent, f"{base}/device")
        placed[name] = os.path.basename(parent)
    return placed


def _nic_wrap() -> list[str]:
    script = 'mount --bind "$0" /sys/class && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, NIC_TREE]


NIC_ENV = (
    "import json, os; print(json.dumps({k: os.environ.get(k) for k in "
    "('UCX_NET_DEVICES', 'NVSHMEM_HCA_LIST', 'NUMABIND_NIC_SET')}))"
)


def scenario_nic(results: dict[str, Any]) -> None:
    """NUMABIND_NIC=ucx on real nodes: each rank's UCX_NET_DEVICES names its own node's
    adapter, a child rank gets its own and not its parent's, a value the user set is kept
    with one line, a rank that does not ask is told nothing, and check warns on the rank
    started with the far adapter."""
    results["nic_adapters"] = _nic_tree()
    wrap = _nic_wrap()
    ask = {"NUMABIND_NIC": "ucx,nvshmem", "LOCAL_WORLD_SIZE": "2"}
    for rank in (0, 1):
        results[f"nic_rank{rank}"] = run(
            NIC_ENV, {**ask, "LOCAL_RANK": str(rank)}, cpus=node_cpus(1 - rank), wrap=wrap
        )
    child = (
        "import json, os, subprocess, sys\n"
        "kid = subprocess.run([sys.executable, '-c', " + repr(NIC_ENV) + "], "
        "env={**os.environ, 'LOCAL_RANK': '1'}, capture_output=True, text=True)\n"
        "print(json.dumps({'parent': os.environ.get('UCX_NET_DEVICES'), "
        "'child': json.loads(kid.stdout.splitlines()[-1])}))"
    )
    results["nic_child"] = run(child, {**ask, "LOCAL_RANK": "0"}, wrap=wrap)
    results["nic_user"] = run(
        NIC_ENV, {**ask, "LOCAL_RANK": "0", "UCX_NET_DEVICES": "mlx5_1:1"}, wrap=wrap
    )
    results["nic_off"] = run(NIC_ENV, {"LOCAL_RANK": "0"}, wrap=wrap)
    far = _hold({**ask, "LOCAL_RANK": "0", "UCX_NET_DEVICES": "mlx5_1:1"}, None, wrap=wrap)
    near = _hold({**ask, "LOCAL_RANK": "1"}, None, wrap=wrap)
    try:
        for name, proc in (("far", far), ("near", near)):
            p = subprocess.run(
                [*wrap, NUMABIND, "check", "--pid", str(proc.pid), "--json"],
                capture_output=True,
                text=True,
                env=base_env(),
            )
            results[f"nic_check_{name}"] = {
                "rc": p.returncode,
                "json": json.loads(p.stdout) if p.stdout.strip() else None,
                "stderr": p.stderr[-2000:],
            }
        text = subprocess.run(
            [*wrap, NUMABIND, "check", "--pid", str(far.pid)],
            capture_output=True,
            text=True,
            env=base_env(),
        )
        results["nic_check_text"] = text.stdout
    finally:
        _release(far, near)


SCENARIOS: dict[str, Callable[[dict[str, Any]], None]] = {
    "hook": scenario_hook,
    "late": scenario_late,
    "memory": scenario_memory,
    "bad_input": scenario_bad_input,
    "check": scenario_check,
    "threads": scenario_threads,
    "seccomp": scenario_seccomp,
    "fork": scenario_fork,
    "bench": scenario_bench,
    "host_memory": scenario_host_memory,
    "several": scenario_several,
    "nic": scenario_nic,
}


def main() -> int:
    names = sys.argv[2:] or list(SCENARIOS)
    results: dict[str, Any] = {"nodes": int(os.environ.get("NUMABIND_VM_NODES", "0"))}
    return run_steps(sys.argv[1], [(name, SCENARIOS[name]) for name in names], results)


if __name__ == "__main__":
    sys.exit(main())
