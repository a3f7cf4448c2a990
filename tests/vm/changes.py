"""The machine changes after the cache was written, on a real kernel (issue 44): one VM boot,
2 CPU nodes (0-1, 2 CPUs each) and CPU-less nodes 2 and 3 (512 MiB each), two spoofed
NVIDIA GPUs, GPU 0 on node 0 (0000:21:00.0) and GPU 1 on node 1 (0000:41:00.0).

For each change, in this order: a rank writes the cache (run twice where the first did not
replay, so that the answer is kept too); the machine file is copied; the change is made;
then the next rank (held: its binding, why it was not replayed, ``_startup.last``),
``numabind show --json`` and ``numabind check --pid <that rank> --json`` run; then the change
is reversed and the three run again.  Each direction also runs show and check once more on
the copied file (what a verifier that answers from the cache says: the control) and records
what the kernel itself says.  The changes:

* ``balancing``: /proc/sys/kernel/numa_balancing switched;
* ``memblock``: a memory block of node 3 offline, then online again;
* ``driver``: the NVIDIA driver's ``numa_status`` files appearing (GPU 1's memory on node 2),
  then going; the driver's /proc/driver/nvidia/gpus tree is a stand-in, bind-mounted over
  /proc/driver in the guest's own mount namespace (every process of the scenario shares it:
  the cache key holds the namespace), before the first rank;
* ``numa_node``: GPU 0's PCI ``numa_node`` rewritten by root (0 -> 1, the kernel allows it:
  a firmware workaround), then back;
* ``removal``: GPU 1 removed from the bus (``remove``), then ``rescan`` (its spoofed ids are
  bind-mounted again, as scripts/numa-vm did at boot);
* ``cpu``: CPU 3 offline, then online;
* ``cpuset``: the scenario's cgroup's cpuset narrowed from 0-3 to 0-2, then widened.

``--dry-run`` makes no change (for a syntax and logic pass on any host).

Usage (in the guest): python tests/vm/changes.py OUT.json [--dry-run] [CHANGE ...]
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from scenarios import base_env, probe
from steps import run_steps, say

WORK = "/tmp/numabind-changes"
DRIVER_TREE = f"{WORK}/driver"  # mounted over /proc/driver
CGROUP = "/sys/fs/cgroup/numabind-changes"
DRY = "--dry-run" in sys.argv


def _devices() -> list[tuple[str, int]]:
    out = []
    for item in os.environ.get("NUMABIND_VM_DEVICES", "").split():
        bdf, _, node = item.partition("=")
        out.append((bdf, int(node)))
    return out


def gpu(i: int) -> str:
    devs = _devices()
    return devs[i][0] if i < len(devs) else f"0000:00:0{i}.0"


def write(path: str, text: str) -> None:
    say(f"{path} <- {text!r}")
    if DRY:
        return
    with open(path, "w") as f:
        f.write(text)


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError as err:
        return f"<{err}>"


def sh(*argv: str) -> None:
    say(" ".join(argv))
    if not DRY:
        subprocess.run(argv, check=True, capture_output=True, text=True)


# --- the processes: a rank, held; the verifiers -----------------------------------------------


def start_rank(
    rank: int, extra: list[str] | None = None
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A rank started the way a launcher does (the hook binds it), held until released."""
    env = dict(base_env(), LOCAL_RANK=str(rank))
    proc = subprocess.Popen(
        [*probe("change_rank", *(extra or []), "--hold")],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    data: dict[str, Any] = json.loads(line) if line.startswith("{") else {"stdout": line}
    return proc, data


def release(proc: subprocess.Popen[str]) -> str:
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
    return proc.stderr.read()[-2000:] if proc.stderr else ""


def warm(rank: int, extra: list[str] | None = None) -> list[dict[str, Any]]:
    """A rank writes the cache (machine file and answer); run again unless it replayed."""
    out = []
    for _ in range(2):
        proc, data = start_rank(rank, extra)
        data["stderr"] = release(proc)
        out.append(data)
        if data.get("handed_over") == "":
            break
    return out


def machine_file() -> bytes | None:
    """The machine file the next rank would read (this process shares its key: user, cgroup,
    mount namespace), before the change; None when there is none that holds.

    First ``show``'s questions are asked through the cache, as a50e42a's ``show`` did (a
    reading from the file, what it lacked read from sysfs and written back): the ranks'
    own reading holds only what planning them asked (node 3's size is not among it), and
    a copy with less would answer the control from sysfs, as it is now."""
    from numabind import _cache
    from numabind.cli._show import plans_for, show_data

    env = base_env()
    opened = _cache.open_machine("/", env)
    try:
        visible, plans, _ = plans_for(opened.machine, env, None, "node", "preferred")
        show_data(opened.machine, visible, plans)
    finally:
        opened.machine.close()  # writes back what the file lacked
    return _cache.lookup(env, "/").data or None


def moment(rank: int, stale: str | None, extra: list[str] | None = None) -> dict[str, Any]:
    """The next rank (held), then show and check on it (and on the copied file)."""
    proc, data = start_rank(rank, extra)
    try:
        argv = probe("change_verify", data.get("pid", 0), *(["--stale", stale] if stale else []))
        t0 = time.time()
        p = subprocess.run(argv, env=base_env(), capture_output=True, text=True, timeout=600)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        verify = json.loads(lines[-1]) if lines else {"rc": p.returncode, "stderr": p.stderr}
        verify["seconds"] = round(time.time() - t0, 1)
    finally:
        data["stderr"] = release(proc)
    return {"rank": data, **verify}


def change(
    results: dict[str, Any],
    name: str,
    rank: int,
    make: Callable[[], None],
    undo: Callable[[], None],
    kernel: Callable[[], Any],
    extra: list[str] | None = None,
) -> None:
    """One change, both ways, into ``results[name]``."""
    os.makedirs(WORK, exist_ok=True)
    r: dict[str, Any] = {"gpus": [gpu(0), gpu(1)]}
    results[name] = r
    r["warm"] = warm(rank, extra)
    r["kernel_before"] = kernel()
    for direction, act in (("after", make), ("back", undo)):
        data = machine_file()
        stale = None
        if data is not None:
            stale = f"{WORK}/{name}-{direction}.machine"
            with open(stale, "wb") as f:
                f.write(data)
        r[f"file_{direction}"] = data is not None
        t0 = time.time()
        act()
        r[f"kernel_{direction}"] = kernel()
        r[direction] = moment(rank, stale, extra)
        r[f"time_{direction}"] = round(time.time() - t0, 1)


# --- the changes --------------------------------------------------------------------------------

BALANCING = "/proc/sys/kernel/numa_balancing"


def balancing(results: dict[str, Any]) -> None:
    was = read(BALANCING) or "0"
    flipped = "0" if was != "0" else "1"
    change(
        results,
        "balancing",
        0,
        lambda: write(BALANCING, flipped),
        lambda: write(BALANCING, was),
        lambda: read(BALANCING),
    )


def _node3_bytes() -> int | None:
    text = read("/sys/devices/system/node/node3/meminfo") or ""
    for line in text.splitlines():
        if "MemTotal:" in line:
            return int(line.split()[-2]) * 1024
    return None


def memblock(results: dict[str, Any]) -> None:
    blocks = sorted(
        glob.glob("/sys/devices/system/node/node3/memory[0-9]*"),
        key=lambda p: -int(p.rsplit("memory", 1)[1]),
    )
    taken: list[str] = []
    tried: dict[str, str] = {}

    def offline() -> None:
        if DRY:
            return
        for block in blocks:  # the last first: the likeliest to hold no unmovable page
            path = os.path.join(os.path.realpath(block), "online")
            try:
                write(path, "0")
            except OSError as err:
                tried[path] = str(err)
                continue
            taken.append(path)
            return
        raise RuntimeError(f"no block of node 3 went offline: {tried}")

    def online() -> None:
        for path in taken:
            write(path, "1")

    def kernel() -> dict[str, Any]:
        return {
            "node3_bytes": _node3_bytes(),
            "block": taken[:1],
            "tried": dict(tried),
            "block_size": read("/sys/devices/system/memory/block_size_bytes"),
        }

    change(results, "memblock", 0, offline, online, kernel)


def _status_path(bdf: str) -> str:
    return f"{DRIVER_TREE}/nvidia/gpus/{bdf}/numa_status"


def driver(results: dict[str, Any]) -> None:
    """The driver's tree (both GPUs, no numa_status yet) is mounted first; then GPU 1's
    numa_status appears (its memory: node 2) and goes.  The rank is GPU 1's, with 16 MiB it
    put on node 2 itself (check counts it as GPU memory only while the driver says so)."""
    for i, bdf in enumerate((gpu(0), gpu(1))):
        os.makedirs(f"{DRIVER_TREE}/nvidia/gpus/{bdf}", exist_ok=True)
        with open(f"{DRIVER_TREE}/nvidia/gpus/{bdf}/information", "w") as f:
            f.write(
                f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 10\n"
                f"GPU UUID: \t GPU-0000000{i}-1111-2222-3333-444444444444\n"
                f"Device Minor: \t {i}\nBus Location: \t {bdf}\n"
            )
    sh("mount", "--bind", DRIVER_TREE, "/proc/driver")
    status = _status_path(gpu(1))

    def appear() -> None:
        say(f"{status} appears")
        with open(status, "w") as f:
            f.write("Node:                          2\nStatus:                        online\n")

    def go() -> None:
        say(f"{status} goes")
        os.unlink(status)

    def kernel() -> dict[str, Any]:
        return {
            "listing": sorted(os.listdir("/proc/driver/nvidia/gpus"))
            if os.path.isdir("/proc/driver/nvidia/gpus")
            else None,
            "numa_status": read(f"/proc/driver/nvidia/gpus/{gpu(1)}/numa_status"),
        }

    try:
        change(results, "driver", 1, appear, go, kernel, ["--by-hand", "2"])
    finally:
        sh("umount", "/proc/driver")


def numa_node(results: dict[str, Any]) -> None:
    path = f"/sys/bus/pci/devices/{gpu(0)}/numa_node"
    was = read(path) or "0"
    change(
        results,
        "numa_node",
        0,
        lambda: write(path, "1"),
        lambda: write(path, was),
        lambda: read(path),
    )


def _spoof(bdf: str) -> None:
    """The spoofed NVIDIA ids over a device's sysfs id files, as scripts/numa-vm's init
    does at boot (the files it made are in /run/spoof/<bdf>)."""
    for name in ("vendor", "device", "class"):
        src = f"/run/spoof/{bdf}/{name}"
        if os.path.exists(src):
            sh("mount", "-o", "bind", src, f"/sys/bus/pci/devices/{bdf}/{name}")


def removal(results: dict[str, Any]) -> None:
    bdf = gpu(1)
    dev = f"/sys/bus/pci/devices/{bdf}"

    def remove() -> None:
        write(f"{dev}/remove", "1")
        for _ in range(100):
            if DRY or not os.path.exists(dev):
                return
            time.sleep(0.1)

    def rescan() -> None:
        write("/sys/bus/pci/rescan", "1")
        for _ in range(200):
            if DRY or os.path.exists(f"{dev}/class"):
                break
            time.sleep(0.1)
        _spoof(bdf)

    def kernel() -> dict[str, Any]:
        return {
            "present": os.path.exists(dev),
            "vendor": read(f"{dev}/vendor") if os.path.exists(dev) else None,
        }

    change(results, "removal", 1, remove, rescan, kernel)


def cpu(results: dict[str, Any]) -> None:
    path = "/sys/devices/system/cpu/cpu3/online"
    change(
        results,
        "cpu",
        1,
        lambda: write(path, "0"),
        lambda: write(path, "1"),
        lambda: read("/sys/devices/system/cpu/online"),
    )


def _enter_cgroup() -> None:
    root = "/sys/fs/cgroup"
    if not os.path.exists(f"{root}/cgroup.controllers"):
        sh("mount", "-t", "cgroup2", "none", root)
    write(f"{root}/cgroup.subtree_control", "+cpuset")
    if not DRY:
        os.makedirs(CGROUP, exist_ok=True)
    write(f"{CGROUP}/cpuset.cpus", "0-3")
    write(f"{CGROUP}/cpuset.mems", "0-3")
    write(f"{CGROUP}/cgroup.procs", str(os.getpid()))  # this driver: its children follow


def cpuset(results: dict[str, Any]) -> None:
    _enter_cgroup()
    path = f"{CGROUP}/cpuset.cpus"
    try:
        change(
            results,
            "cpuset",
            1,
            lambda: write(path, "0-2"),
            lambda: write(path, "0-3"),
            lambda: read(f"{CGROUP}/cpuset.cpus.effective"),
        )
    finally:
        write("/sys/fs/cgroup/cgroup.procs", str(os.getpid()))


CHANGES: dict[str, Callable[[dict[str, Any]], None]] = {
    "balancing": balancing,
    "memblock": memblock,
    "driver": driver,
    "numa_node": numa_node,
    "removal": removal,
    "cpu": cpu,
    "cpuset": cpuset,
}


def main() -> int:
    names = [a for a in sys.argv[2:] if not a.startswith("--")] or list(CHANGES)
    shutil.rmtree(WORK, ignore_errors=True)
    results: dict[str, Any] = {"devices": _devices(), "dry_run": DRY}
    t0 = time.time()
    code = run_steps(sys.argv[1], [(n, CHANGES[n]) for n in names], results, budget=400)
    say(f"changes: {time.time() - t0:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
