"""``check --ray``'s job inside a Ray cluster: the part that runs as the cluster's own user.

``numabind check --ray DASHBOARD`` never joins a cluster itself (numabind.cli._ray): it
reads Ray's state over the dashboard's HTTP API and submits this module as a Ray job
(``python -m numabind.check._raydriver SECONDS``).  Ray's job supervisor starts it as whoever
runs the cluster, in the cluster's environment, so the cluster's code only ever runs with
the cluster's own rights.  It lists the live actors and the running tasks that hold a GPU
(Ray's state API), runs numabind's collector once on each of their nodes as a task pinned
there that asks for no CPU (``num_cpus=0``: a node whose CPUs are all held still answers),
and prints each node record as one line of text on its standard output, which the
dashboard keeps as the job's log: ``numabind-record NODE_ID JSON``.  Nothing it prints is
trusted by the caller, which parses the lines as input (numabind.check._job).

:func:`gpu_holders` is shared with the caller, which runs it on the same rows read over
HTTP to know which nodes should answer.
"""

from __future__ import annotations

import json
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

LIMIT = 10_000  # actors, tasks and nodes listed at most
RECORD = "numabind-record"  # NODE_ID JSON: one node's record
LATE = "numabind-late"  # NODE_ID: its record did not come back before the deadline
DRIVER = "numabind-driver"  # uid=N ray=VERSION: who ran the job
FAILED = "numabind-failed"  # why the job could not collect (one line)


def _gpus(resources: Any) -> float:
    if not isinstance(resources, dict):
        return 0.0
    value = resources.get("GPU", 0)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def _node_id(value: Any) -> str | None:
    if (
        isinstance(value, str)
        and 0 < len(value) <= 64
        and all(c in "0123456789abcdef" for c in value)
    ):
        return value
    return None


def gpu_holders(actors: Iterable[Any], tasks: Iterable[Any]) -> dict[str, list[int]]:
    """The pids holding a GPU per node id: live actors (``pid``) and running tasks
    (``worker_pid``) whose required resources include a GPU; rows as the state API gives
    them (dicts, or its dataclasses), each field checked for its type."""
    holders: dict[str, list[int]] = {}
    for kind, rows in (("pid", actors), ("worker_pid", tasks)):
        for row in rows:
            r = row if isinstance(row, dict) else dict(vars(row))
            pid, node = r.get(kind), _node_id(r.get("node_id"))
            if _gpus(r.get("required_resources")) <= 0 or node is None:
                continue
            if type(pid) is int and 0 < pid < 1 << 22:
                held = holders.setdefault(node, [])
                if pid not in held and len(held) < 1024:
                    held.append(pid)
    return holders


def collect_node(pids: list[int], host: str, seconds: float) -> str:
    """Run on a Ray node: its GPU holders checked (numabind.check._inspect), as a node record
    (JSON text: only text leaves the node)."""
    from .._environ import Config
    from .._topology import Machine
    from . import _inspect, _job

    machine = Machine.from_root(Config.from_env().sysroot)
    try:
        report = _inspect.check(pids, machine, deadline=time.monotonic() + seconds)
    finally:
        machine.close()
    record = _job.node_record(report, None)
    record["host"] = host
    return json.dumps(record, separators=(",", ":"))


def _say(*words: object) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    """The job: list, collect, print; ``argv[0]`` the seconds it may take in all."""
    import logging

    began = time.monotonic()
    try:
        seconds = max(min(float(argv[0]), 3600.0), 1.0) if argv else 60.0
    except ValueError:
        seconds = 60.0
    logging.getLogger("ray").setLevel(logging.ERROR)
    import ray
    from ray.util import state
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    _say(DRIVER, f"uid={os.getuid()}", f"ray={getattr(ray, '__version__', '?')}")
    ray.init(
        address="auto",  # the cluster this job was submitted to (RAY_ADDRESS, set by Ray)
        logging_level=logging.ERROR,
        log_to_driver=False,
        configure_logging=False,
        namespace="numabind-check",
    )
    try:
        alive: list[Any] = [("state", "=", "ALIVE")]
        running: list[Any] = [("state", "=", "RUNNING")]
        actors = state.list_actors(
            filters=alive, detail=True, limit=LIMIT, raise_on_missing_output=False
        )
        tasks = state.list_tasks(
            filters=running, detail=True, limit=LIMIT, raise_on_missing_output=False
        )
        holders = gpu_holders(actors, tasks)
        names: dict[str, str] = {}
        for listed in state.list_nodes(limit=LIMIT, raise_on_missing_output=False):
            n = listed if isinstance(listed, dict) else dict(vars(listed))
            nid = _node_id(n.get("node_id"))
            if nid is not None:
                names[nid] = str(n.get("node_ip") or nid[:12])[:64]
        left = max(seconds - (time.monotonic() - began) - 2.0, 1.0)
        remote = ray.remote(num_cpus=0, max_retries=0)(collect_node)
        refs = {}
        for node, pids in holders.items():
            strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            ref = remote.options(scheduling_strategy=strategy).remote(
                pids, names.get(node, node[:12]), max(left - 2.0, 1.0)
            )
            refs[ref] = node
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=left)
        for ref in ready:
            try:
                text = ray.get(ref, timeout=5)
            except Exception as err:  # the node's task failed: its row says why
                text = json.dumps({"error": f"{type(err).__name__}: {err}"[:300]})
            if isinstance(text, str):
                _say(RECORD, refs[ref], text.replace("\n", " "))
        for ref, node in refs.items():
            if ref not in ready:
                _say(LATE, node)
                ray.cancel(ref, force=True)
    except Exception as err:
        _say(FAILED, f"{type(err).__name__}: {err}".replace("\n", " ")[:300])
        return 1
    finally:
        ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
