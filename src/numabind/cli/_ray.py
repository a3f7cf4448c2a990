"""``numabind check --ray [ADDRESS]``: every Ray actor and task holding a GPU, on every node
of the cluster, in the job report (numabind._job).

Ray's state API (``ray[default]``) lists the live actors and the running tasks, with the
resources they hold, their node and their worker's pid.  For each node holding one with a
GPU, a task pinned to that node (``NodeAffinitySchedulingStrategy``, not soft) that asks
for no CPU (``num_cpus=0``: a node whose CPUs are all held still answers) checks those
pids there (numabind._inspect, /proc and sysfs only) and returns a node record, which is
parsed as input like a Slurm collector's.  ``--deadline`` bounds the wait: a node whose
record did not come back is a row that says so.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from .. import _job, _sysfs
from ._common import UNREACHABLE, USAGE, unreachable, write_json, write_lines

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse

LIMIT = 10_000  # actors, tasks and workers listed at most


def _fields(item: Any) -> dict[str, Any]:
    """A state API row as a dict (it returns dicts or dataclasses, by version)."""
    return item if isinstance(item, dict) else dict(vars(item))


def _gpus(resources: Any) -> float:
    if not isinstance(resources, dict):
        return 0.0
    value = resources.get("GPU", 0)
    return float(value) if isinstance(value, (int, float)) else 0.0


def collect_node(pids: list[int], host: str, deadline: float) -> str:
    """Run on a Ray node: its GPU holders checked, as a node record (JSON text)."""
    from .. import _inspect
    from .._environ import Config
    from .._topology import Machine

    machine = Machine.from_root(Config.from_env().sysroot)
    try:
        report = _inspect.check(pids, machine, deadline=time.monotonic() + deadline)
    finally:
        machine.close()
    record = _inspect.node_record(report, None)
    record["host"] = host
    return json.dumps(record, separators=(",", ":"))


def gpu_holders(state: Any) -> tuple[dict[str, list[int]], dict[str, str]]:
    """pids holding a GPU per node id, and each node's name for the report (its IP)."""
    holders: dict[str, list[int]] = {}
    for actor in state.list_actors(
        filters=[("state", "=", "ALIVE")], detail=True, limit=LIMIT, raise_on_missing_output=False
    ):
        a = _fields(actor)
        pid, node = a.get("pid"), a.get("node_id")
        if _gpus(a.get("required_resources")) > 0 and isinstance(pid, int) and node:
            holders.setdefault(str(node), []).append(pid)
    workers = {}
    tasks = state.list_tasks(
        filters=[("state", "=", "RUNNING")], detail=True, limit=LIMIT, raise_on_missing_output=False
    )
    running = [_fields(t) for t in tasks]
    if any(_gpus(t.get("required_resources")) > 0 for t in running):
        for w in state.list_workers(detail=True, limit=LIMIT, raise_on_missing_output=False):
            wd = _fields(w)
            workers[wd.get("worker_id")] = wd.get("pid")
    for t in running:
        pid = workers.get(t.get("worker_id"))
        node = t.get("node_id")
        held = holders.setdefault(str(node), []) if node else []
        if _gpus(t.get("required_resources")) > 0 and isinstance(pid, int) and pid not in held:
            held.append(pid)
    holders = {n: p for n, p in holders.items() if p}
    names = {}
    for node in state.list_nodes(limit=LIMIT, raise_on_missing_output=False):
        nd = _fields(node)
        names[str(nd.get("node_id"))] = _sysfs.clean_line(str(nd.get("node_ip") or ""), 64)
    return holders, names


def _connect(ray: Any, address: str, deadline: float) -> str:
    """``ray.init`` bounded by ``deadline`` (it has no timeout of its own); why it failed,
    or "" once connected."""
    import logging
    import threading

    # ray.init from a thread that is not the main one warns that it set no SIGTERM handler
    # (this process sets none of its own): Ray's notices are not check's to print
    logging.getLogger("ray").setLevel(logging.ERROR)
    outcome: list[str] = []

    def connect() -> None:
        try:
            ray.init(
                address=address,
                logging_level=40,  # logging.ERROR
                log_to_driver=False,
                configure_logging=False,
                namespace="numabind-check",
            )
            outcome.append("")
        except Exception as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            outcome.append(_sysfs.clean_line(first, 200))

    thread = threading.Thread(target=connect, name="numabind-ray-init", daemon=True)
    thread.start()
    thread.join(deadline)
    return outcome[0] if outcome else f"no answer in {deadline:.0f} s"


def run_ray(args: argparse.Namespace) -> int:
    """``check --ray``: connect, list the GPU holders, check them on their nodes, report."""
    from .._errors import UsageError

    said = "numabind check --ray"
    try:
        import ray
        from ray.util import state
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError:
        raise UsageError(f"{said}: needs ray[default] (its state API) installed here") from None
    started = time.monotonic()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    host, _, port = (args.ray if args.ray != "auto" else "").rpartition(":")
    if host and port.isascii() and port.isdigit() and 0 < int(port) < 65536:
        why = unreachable(host, int(port), min(args.deadline, 10.0))  # Ray retries for minutes
        if why is not None:
            write_lines([f"{said}: cannot connect to {_sysfs.short(args.ray)} ({why})"], sys.stderr)
            return UNREACHABLE
    failed = _connect(ray, args.ray, min(args.deadline, 60.0))
    if failed:
        write_lines([f"{said}: cannot connect ({failed})"], sys.stderr)
        return UNREACHABLE
    try:
        holders, names = gpu_holders(state)
        if not holders:
            write_lines([f"{said}: no actor or task holds a GPU in this cluster"])
            return UNREACHABLE
        left = max(args.deadline - (time.monotonic() - started), 1.0)
        remote = ray.remote(num_cpus=0, max_retries=0)(collect_node)
        refs = {}
        for node, pids in holders.items():
            host = names.get(node) or node[:12]
            strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
            ref = remote.options(scheduling_strategy=strategy).remote(
                pids, host, max(left - 2.0, 1.0)
            )
            refs[ref] = host
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=left)
        rows: dict[str, _job.NodeRow] = {}
        for ref in ready:
            host = refs[ref]
            try:
                rows[host] = _job.parse_node(ray.get(ref, timeout=5), host)
            except Exception as err:
                why = _sysfs.clean_line(f"{type(err).__name__}: {err}".splitlines()[0], 200)
                rows[host] = _job.NodeRow(host=host, state="unreachable", reason=why)
        for ref, host in refs.items():
            if host not in rows:
                rows[host] = _job.NodeRow(
                    host=host,
                    state="unreachable",
                    reason=f"no answer before the deadline ({args.deadline:.0f} s)",
                )
                ray.cancel(ref, force=True)
    finally:
        ray.shutdown()
    report = _job.merge(None, list(refs.values()), rows).replace(title=f"{said}")
    if args.json:
        write_json(report.to_dict())
    else:
        write_lines(_job.report_lines(report))
    return _job.exit_status(report)


__all__ = ["USAGE", "run_ray"]
