"""PyTorch's Callable launches inside the multi-NUMA VM (2 nodes, GPU 0 on node 0, GPU 1 on
node 1): torch.multiprocessing.spawn and elastic_launch (gloo) started by one parent that
imports torch once (~60 s under emulation), then numabind run under torchrun --no-python.

Usage (in the guest): python tests/vm/torch_scenarios.py OUT.json
"""

import os

# First statement: in a spawn child this module runs again as __mp_main__ *before* the
# child unpickles its target (which imports torch): what the child had from its start.
FIRST_AFFINITY = sorted(os.sched_getaffinity(0))
from numabind import _kernel  # noqa: E402

FIRST_POLICY = _kernel.get_mempolicy()

import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def empty_on_node(results: dict) -> None:  # type: ignore[type-arg]
    """A tensor for an offload pool, made by a thread bound to node 0, placed on node 1
    (done last: it binds this process)."""
    try:
        import torch

        import numabind.torch

        os.sched_setaffinity(0, FIRST_AFFINITY[: len(FIRST_AFFINITY) // 2])  # node 0's CPUs
        _kernel.set_mempolicy("preferred", {0})
        t = numabind.torch.empty_on_node((64, 1 << 20), dtype=torch.uint8, node=1)
        storage = t.untyped_storage()
        start = storage.data_ptr() // 4096 * 4096
        pages: dict[str, int] = {}
        with open("/proc/self/numa_maps") as f:  # read here: not numabind's reader
            for line in f:
                fields = line.split()
                if int(fields[0], 16) == start:
                    for field in fields[2:]:
                        if field.startswith("N") and "=" in field:
                            node, count = field[1:].split("=")
                            pages[node] = int(count)
        results["empty_on_node"] = {"nbytes": storage.nbytes(), "pages": pages}
    except Exception:
        results["errors"]["empty_on_node"] = traceback.format_exc()


def main() -> int:
    out_path = sys.argv[1]
    work = os.path.join(os.path.dirname(os.path.abspath(out_path)), f"torch-{os.getpid()}")
    os.makedirs(work, exist_ok=True)
    results = {"errors": {}, "work": work}

    def save() -> None:
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)

    t0 = time.time()
    import numabind.torch

    numabind.torch.install()
    import torch.multiprocessing as mp
    import torch_children
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    results["import_seconds"] = round(time.time() - t0, 1)
    try:
        t = time.time()
        mp.spawn(torch_children.spawn_fn, args=(work,), nprocs=2)
        results["spawn_seconds"] = round(time.time() - t, 1)
    except Exception:
        results["errors"]["spawn"] = traceback.format_exc()
    save()
    try:
        t = time.time()
        cfg = LaunchConfig(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=2,
            run_id="numabind-vm",
            rdzv_backend="c10d",
            rdzv_endpoint="127.0.0.1:29533",
            max_restarts=0,
            monitor_interval=0.5,
            start_method="spawn",
        )
        results["elastic_return"] = {
            str(k): v for k, v in elastic_launch(cfg, torch_children.elastic_fn)(work).items()
        }
        results["elastic_seconds"] = round(time.time() - t, 1)
    except Exception:
        results["errors"]["elastic"] = traceback.format_exc()
    save()
    for kind in ("spawn", "elastic"):
        for rank in (0, 1):
            path = f"{work}/{kind}-{rank}.json"
            if os.path.exists(path):
                with open(path) as f:
                    results[f"{kind}-{rank}"] = json.load(f)
    # numabind run as the trampoline of torchrun --no-python: bound at the first instruction,
    # and with NUMABIND_THREADS=auto torchrun's own OMP_NUM_THREADS=1 replaced by the budget
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    numabind_cmd = os.path.join(os.path.dirname(sys.executable), "numabind")
    probe = os.path.join(HERE, "probes", "run_rank.py")
    try:
        t = time.time()
        p = subprocess.run(
            [
                torchrun,
                "--nproc-per-node",
                "2",
                "--no-python",
                numabind_cmd,
                "run",
                "--",
                sys.executable,
                probe,
            ],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "NUMABIND_THREADS": "auto"},
        )
        results["torchrun_run"] = {
            "rc": p.returncode,
            "stderr": p.stderr[-3000:],
            "ranks": [json.loads(x[4:]) for x in p.stdout.splitlines() if x.startswith("RUN ")],
            "seconds": round(time.time() - t, 1),
        }
    except Exception:
        results["errors"]["torchrun_run"] = traceback.format_exc()
    save()
    # a process without a rank that picks its GPU with torch.cuda.set_device(1); then one
    # that drives both GPUs (NUMABIND_DEVICES=all), a thread per GPU selecting it
    for name, args, extra in (
        ("set_device", [], {}),
        ("set_device_threads", ["threads"], {"NUMABIND_DEVICES": "all"}),
    ):
        try:
            t = time.time()
            env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCAL_", "NUMABIND"))}
            env.update(NUMABIND_TORCH="1", NUMABIND_VM="1", **extra)
            p = subprocess.run(
                [sys.executable, os.path.join(HERE, "probes", "set_device.py"), *args],
                capture_output=True,
                text=True,
                timeout=600,
                env=env,
            )
            lines = [x for x in p.stdout.splitlines() if x.startswith("{")]
            results[name] = {
                "rc": p.returncode,
                "stderr": p.stderr[-3000:],
                "data": json.loads(lines[-1]) if lines else None,
                "seconds": round(time.time() - t, 1),
            }
        except Exception:
            results["errors"][name] = traceback.format_exc()
        save()
    empty_on_node(results)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
