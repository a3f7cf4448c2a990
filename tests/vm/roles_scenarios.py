"""Core roles in the multi-NUMA VM (2 nodes x 2 CPUs: node 0 = CPUs 0-1, node 1 = 2-3;
GPUs 0-1 on node 0, 2-3 on node 1), with real torch 2.13:

* torchrun with 4 workers (2 per node), exclusive mode and NUMABIND_RESERVE=1/node: no
  rank on its node's reserved (last) core; the four, the node's first ranks, read the
  machine once in all (every file each opens is recorded), and each is bound as it is
  without the cache;
* four plain ranks at once, twice (no machine file, then the file there), planned by the
  warm start: the same, and the second four read no machine file at all;
* a DataLoader rank (NUMABIND_WORKERS=spread, NUMABIND_OMP_PLACES=cores): the main
  thread, a thread and a forked child keep the rank's CPUs after ``import torch``, the two
  workers get disjoint cores of the rank's node, and ``check --all`` passes rank and workers;
* NUMABIND_OMP_PLACES sets OMP_PLACES/OMP_PROC_BIND, and keeps a user's OMP_PLACES;
* a host buffer on node 1 registered with the stand-in libcuda.so.1 (built on the host
  into STANDIN_DIR), then ``fork()``: the child does not map it (MADV_DONTFORK), the
  parent's pages stay on node 1; with ``dontfork=False`` the child maps it;
* ``numabind bench --only gpu`` through the same stand-in: a registered buffer on each
  GPU's node against one on the other node, each GPU alone and all four at once.

Usage (in the guest): python tests/vm/roles_scenarios.py OUT.json
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from steps import run_steps

HERE = os.path.dirname(os.path.abspath(__file__))
ENV_OFF = ("LOCAL_", "NUMABIND", "OMP_")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_OFF)}
    env.update(extra)
    return env


RANK = [sys.executable, "-S", os.path.join(HERE, "probes", "audited.py"),
        os.path.join(HERE, "probes", "roles_rank.py")]  # fmt: skip


def _clear_cache() -> None:
    """No machine file yet: the next ranks are the node's first."""
    shutil.rmtree(f"/dev/shm/numabind-cache-{os.geteuid()}", ignore_errors=True)


def _roles(out: str) -> list:  # type: ignore[type-arg]
    return [json.loads(x[5:]) for x in out.splitlines() if x.startswith("ROLE ")]


def _without_cache(knobs: dict[str, str], ranks: int) -> list:  # type: ignore[type-arg]
    """Each rank again, alone and with NUMABIND_CACHE=0: the binding the cache must give."""
    out = []
    for rank in range(ranks):
        env = _env(**knobs, LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(ranks), NUMABIND_CACHE="0")
        p = subprocess.run(RANK, capture_output=True, text=True, timeout=300, env=env)
        out += _roles(p.stdout) or [{"rank": rank, "rc": p.returncode, "stderr": p.stderr[-2000:]}]
    return out


def torchrun_reserve(results: dict) -> None:  # type: ignore[type-arg]
    """Four torchrun workers, the node's first ranks (no machine file yet): exclusive mode
    and a reservation, each audited from its first moment (probes/audited.py); then each
    rank alone without the cache."""
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    knobs = {"NUMABIND_RESERVE": "1/node", "NUMABIND_MODE": "exclusive"}
    _clear_cache()
    out = tempfile.mkdtemp()
    t = time.time()
    p = subprocess.run(
        [torchrun, "--nproc-per-node", "4", "--no-python", *RANK],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(**knobs, ROLE_DIR=out),
    )
    ranks = []
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name)) as f:
            ranks.append(json.load(f))
    results["torchrun"] = {
        "rc": p.returncode,
        "stderr": p.stderr[-3000:],
        "ranks": ranks,
        "seconds": round(time.time() - t, 1),
        "no_cache": _without_cache(knobs, 4),
    }


def cache_ranks(results: dict) -> None:  # type: ignore[type-arg]
    """Four plain ranks started at once (node mode, one core reserved per node), twice:
    the node's first ranks (they keep their answers), then the same four again (each
    replays its own); then each alone without the cache."""
    knobs = {"NUMABIND_RESERVE": "1/node"}
    _clear_cache()
    out: dict = {}  # type: ignore[type-arg]
    for phase in ("cold", "warm"):
        procs = [
            subprocess.Popen(
                RANK,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_env(**knobs, LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="4"),
            )
            for r in range(4)
        ]
        ranks, errs = [], []
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=300)
            ranks += _roles(stdout)
            errs.append(stderr[-1000:])
        out[phase] = {"ranks": ranks, "stderr": errs}
    out["no_cache"] = _without_cache(knobs, 4)
    results["cache_ranks"] = out


def loader(results: dict) -> None:  # type: ignore[type-arg]
    t = time.time()
    p = subprocess.run(
        [sys.executable, os.path.join(HERE, "probes", "roles_loader.py")],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(
            LOCAL_RANK="1",
            LOCAL_WORLD_SIZE="4",
            NUMABIND_TORCH="1",
            NUMABIND_WORKERS="spread",
            NUMABIND_OMP_PLACES="cores",
            NUMABIND_MEMORY="none",
        ),
    )
    lines = [x[7:] for x in p.stdout.splitlines() if x.startswith("LOADER ")]
    results["loader"] = {
        "rc": p.returncode,
        "stderr": p.stderr[-3000:],
        "data": json.loads(lines[-1]) if lines else None,
        "seconds": round(time.time() - t, 1),
    }


def places(results: dict) -> None:  # type: ignore[type-arg]
    code = (
        "import os, json; "
        "print(json.dumps([os.environ.get('OMP_PLACES'), os.environ.get('OMP_PROC_BIND')]))"
    )
    out = {}
    for name, extra in (("ours", {}), ("users", {"OMP_PLACES": "threads"})):
        p = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=300,
            env=_env(LOCAL_RANK="0", LOCAL_WORLD_SIZE="4", NUMABIND_OMP_PLACES="cores", **extra),
        )
        out[name] = json.loads(p.stdout) if p.returncode == 0 else p.stderr[-2000:]
    results["places"] = out


REGISTER = """
import ctypes, json, os, numabind
lib = ctypes.CDLL("libcuda.so.1")
out = {}
for dontfork in (True, False):
    buf = numabind.host_buffer(64 << 20, node=1, dontfork=dontfork)
    before = buf.placement()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        with open("/proc/self/maps") as f:
            seen = any(int(l.split("-")[0], 16) == buf.address for l in f)
        os.write(w, json.dumps(seen).encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child = json.loads(os.read(r, 100))
    after = buf.placement()
    out[str(dontfork)] = {
        "registered": buf.registered, "child_maps": child,
        "before": {str(k): v for k, v in before.items()},
        "after": {str(k): v for k, v in after.items()},
    }
    buf.close()
out["live"] = lib.standin_registered()
print("REGISTER " + json.dumps(out))
"""


def register(results: dict) -> None:  # type: ignore[type-arg]
    p = subprocess.run(
        [sys.executable, "-c", REGISTER],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(LD_LIBRARY_PATH=os.environ.get("STANDIN_DIR", "/nonexistent")),
    )
    lines = [x[9:] for x in p.stdout.splitlines() if x.startswith("REGISTER ")]
    results["register"] = {
        "rc": p.returncode,
        "stderr": p.stderr[-3000:],
        "data": json.loads(lines[-1]) if lines else None,
    }


def bench_gpu(results: dict) -> None:  # type: ignore[type-arg]
    """numabind bench's pinned copies through the stand-in libcuda: each GPU's registered
    buffer on its node and on the other node, each GPU alone and all four at once (each
    copy held 20 ms by the stand-in so that copies issued together overlap)."""
    exit_file = "/tmp/standin-bench.txt"
    t = time.time()
    argv = ["bench", "--only", "gpu", "--json", "--quick", "--size", "8"]
    p = subprocess.run(
        [sys.executable, "-m", "numabind", *argv],
        capture_output=True,
        text=True,
        timeout=900,
        env=_env(
            LD_LIBRARY_PATH=os.environ.get("STANDIN_DIR", "/nonexistent"),
            STANDIN_EXIT=exit_file,
            STANDIN_COPY_US="20000",
        ),
    )
    exit_line = ""
    if os.path.exists(exit_file):
        with open(exit_file) as f:
            exit_line = f.readline().strip()
    results["bench_gpu"] = {
        "rc": p.returncode,
        "stderr": p.stderr[-3000:],
        "json": json.loads(p.stdout) if p.returncode == 0 else None,
        "standin": dict(item.split("=") for item in exit_line.split()),
        "seconds": round(time.time() - t, 1),
    }


def main() -> int:
    steps = (("places", places), ("register", register), ("bench_gpu", bench_gpu),
             ("torchrun", torchrun_reserve), ("cache_ranks", cache_ranks),
             ("loader", loader))  # fmt: skip
    # torch under emulation: the budget is its runs' own limit
    return run_steps(sys.argv[1], steps, {}, budget=900)


if __name__ == "__main__":
    sys.exit(main())
