"""Real Ray inside the multi-NUMA VM (2 nodes x 2 CPUs, 2 GiB each, GPU 0 on node 0 and
GPU 1 on node 1, spoofed): actors and tasks with num_gpus=1 are bound when Ray assigns
their GPU (NUMABIND_RAY=1 in the driver's environment: ray.init() starts the local cluster
with it), and 200 MB allocated from the thread Ray runs them on lands on their GPU's node.
A task worker reused with the other GPU rebinds.

Usage (in the guest): python tests/vm/ray_scenarios.py OUT.json
"""

from __future__ import annotations

import inspect
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
    from numabind._kernel import pages_per_node, private_anon_regions

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


def _patient_startup() -> None:
    """Under software emulation the raylet takes longer to register than the 30 s ray.init
    waits (hard-coded in ray/_private/node.py, Ray 2.60): keep asking, up to 10 minutes.
    Only the driver's wait changes; numabind's code paths are Ray's own."""
    from ray._private import services

    original = services.get_node

    def get_node(*args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + float(os.environ.get("RAY_VM_START_WAIT", "600"))
        while True:
            try:
                return original(*args, **kwargs)
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(2)

    services.get_node = get_node

    # The raylet also aborts when its agents (Python processes that import much of Ray)
    # have not written their port files within a fixed wait (Ray 2.60: "Timed out waiting
    # for file .../dashboard_agent_listen_port_*", ~80 s, not configurable), and under
    # emulation the dashboard agent needs ~90 s to import.  So the agents get fixed free
    # ports and their files are written before the raylet starts; the agents rewrite the
    # same values once they listen.
    import socket

    from ray import _raylet
    from ray._private import parameter

    ports = {  # RayParams / start_raylet argument -> the port file's name
        "metrics_agent_port": _raylet.METRICS_AGENT_PORT_NAME,
        "metrics_export_port": _raylet.METRICS_EXPORT_PORT_NAME,
        "dashboard_agent_listen_port": _raylet.DASHBOARD_AGENT_LISTEN_PORT_NAME,
        "runtime_env_agent_port": _raylet.RUNTIME_ENV_AGENT_PORT_NAME,
    }

    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    init = parameter.RayParams.__init__

    def with_ports(self: Any, *args: Any, **kwargs: Any) -> None:
        for key in ports:
            if not kwargs.get(key):
                kwargs[key] = free_port()
        init(self, *args, **kwargs)

    parameter.RayParams.__init__ = with_ports  # type: ignore[method-assign]

    start_raylet = services.start_raylet

    def seeded_start_raylet(*args: Any, **kwargs: Any) -> Any:
        given = inspect.signature(start_raylet).bind(*args, **kwargs).arguments
        for key, name in ports.items():
            if given.get(key):
                _raylet.persist_port(given["session_dir"], given["node_id"], name, given[key])
        return start_raylet(*args, **kwargs)

    services.start_raylet = seeded_start_raylet


def _log_tails(tmp: str) -> dict[str, str]:
    """The last lines of each Ray process's log (evidence when the cluster did not start)."""
    out = {}
    logs = os.path.join(tmp, "session_latest", "logs")
    for name in sorted(os.listdir(logs)) if os.path.isdir(logs) else []:
        if name.endswith((".out", ".err", ".log")):
            with open(os.path.join(logs, name), errors="replace") as f:
                text = f.read()
            # the first lines say why a process died; the last, where it stopped
            tail = text if len(text) <= 3000 else text[:1500] + "\n[...]\n" + text[-1500:]
            # and the error lines (Ray's "[time E pid tid]" / "F": fatal) wherever they are
            errors = [ln for ln in text.splitlines() if " E " in ln[:40] or " F " in ln[:40]]
            tail += "".join(f"\n{ln}" for ln in errors[:20])
            if tail.strip():
                out[name] = tail
    return out


def main() -> int:
    out_path = sys.argv[1]
    results: dict[str, Any] = {"errors": {}}
    tmp = tempfile.mkdtemp(prefix="nbray-", dir="/tmp")
    t0 = time.time()
    try:
        import ray

        _patient_startup()
        ray.init(
            num_gpus=2,
            num_cpus=4,
            include_dashboard=False,
            object_store_memory=80 * 1024 * 1024,
            _temp_dir=tmp,
            log_to_driver=False,
            # the reuse case needs its idle worker kept: no prestarted workers beside it,
            # no killing of idle workers beyond num_cpus (the holders count) after 1 s
            _system_config={
                "prestart_worker_first_driver": False,
                "enable_worker_prestart": False,
                "idle_worker_killing_time_threshold_ms": 3_600_000,
            },
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

        # Ray ends a GPU task's worker after one call unless max_calls says otherwise
        @ray.remote(num_gpus=1, max_calls=0)
        def task() -> dict[str, Any]:
            return report("task")

        @ray.remote(num_gpus=1)
        class Holder:
            def ready(self) -> bool:
                return True

        def hold(name: str) -> Any:
            # its own runtime_env: a dedicated worker, never the pooled task worker
            h = Holder.options(runtime_env={"env_vars": {"NB_HOLD": name}}).remote()
            ray.get(h.ready.remote())
            return h

        actors = [Actor.remote() for _ in range(2)]
        results["actors"] = ray.get([a.where.remote() for a in actors])
        for a in actors:
            ray.kill(a)
        # a task worker reused with the other GPU: hold one GPU, run a task (the other),
        # hold that one once the task gives it back, free the first: the idle worker gets it
        hold_a = hold("a")
        first = ray.get(task.remote())
        hold_b = hold("b")
        ray.kill(hold_a)
        second = ray.get(task.remote())
        ray.kill(hold_b)
        results["tasks"] = [first, second]
        results["seconds"] = round(time.time() - t0, 1)
        ray.shutdown()
    except Exception:
        results["errors"]["ray"] = traceback.format_exc()
        results["ray_logs"] = _log_tails(tmp)
    finally:
        keep = os.environ.get("RAY_VM_KEEP_LOGS")  # debugging: a folder the host can read
        if keep:
            shutil.copytree(os.path.join(tmp, "session_latest", "logs"), keep, dirs_exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
