"""Real Ray inside the multi-NUMA VM (2 nodes x 2 CPUs, 2 GiB each, GPU 0 on node 0 and
GPU 1 on node 1, spoofed): actors and tasks with num_gpus=1 are bound when Ray assigns
their GPU (NUMABIND_RAY=1 in the driver's environment: ray.init() starts the local cluster
with it), and 200 MB allocated from the thread Ray runs them on lands on their GPU's node.
A task worker reused with the other GPU rebinds.

Usage (in the guest): python tests/vm/ray_scenarios.py OUT.json
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any


def report(tag: str) -> dict[str, Any]:
    import ray

    from numabind import _kernel
    from numabind._procmaps import pages_per_node, private_anon_regions

    buf = b"\x01" * (200 << 20)
    policy = _kernel.get_mempolicy()
    return {
        "tag": tag,
        "pid": os.getpid(),
        "gpu": ray.get_runtime_context().get_accelerator_ids()["GPU"],
        "affinity": sorted(os.sched_getaffinity(0)),
        "policy": [policy[0], sorted(policy[1])],
        "pages": pages_per_node(private_anon_regions()),
        "touched": len(buf),
    }


def main() -> int:
    out_path = sys.argv[1]
    results: dict[str, Any] = {"errors": {}}
    tmp = tempfile.mkdtemp(prefix="nbray-", dir="/tmp")
    t0 = time.time()
    try:
        import ray

        ray.init(
            num_gpus=2,
            num_cpus=4,
            include_dashboard=False,
            object_store_memory=80 * 1024 * 1024,
            _temp_dir=tmp,
            log_to_driver=False,
        )
        results["init_seconds"] = round(time.time() - t0, 1)

        @ray.remote(num_gpus=1)
        class Actor:
            def __init__(self) -> None:
                self.seen = report("actor init")  # allocated in __init__, on Ray's thread

            def where(self) -> dict[str, Any]:
                return {**self.seen, "later": sorted(os.sched_getaffinity(0))}

            def ready(self) -> bool:
                return True

        @ray.remote(num_gpus=1)
        def task() -> dict[str, Any]:
            return report("task")

        actors = [Actor.remote() for _ in range(2)]
        results["actors"] = ray.get([a.where.remote() for a in actors])
        for a in actors:
            ray.kill(a)
        # a task worker reused with the other GPU: hold GPU 0, run a task (GPU 1), then
        # hold GPU 1, free GPU 0 and run again (the idle worker gets GPU 0)
        hold0 = Actor.remote()
        ray.get(hold0.ready.remote())
        first = ray.get(task.remote())
        hold1 = Actor.remote()
        ray.get(hold1.ready.remote())
        ray.kill(hold0)
        time.sleep(2)
        second = ray.get(task.remote())
        ray.kill(hold1)
        results["tasks"] = [first, second]
        results["seconds"] = round(time.time() - t0, 1)
        ray.shutdown()
    except Exception:
        results["errors"]["ray"] = traceback.format_exc()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
