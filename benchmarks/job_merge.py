"""The job report's merge at scale: 1,000 nodes x 8 ranks of collector records.

``numabind check --job`` parses one node record per node (input: every field checked,
bounded and cleaned), merges them with the nodes that did not answer, and prints the
table.  This measures that work on generated records shaped like an 8-GPU node's (8
ranks, 40 threads each in 6 CPU-mask groups, one host buffer, one rank in 500 off plan
and 5 nodes that never answer), in one process: wall time of parse + merge + table, and
the peak memory it allocated (tracemalloc, a second pass: tracing slows it down).  The
issue's aim: under 2 s and 100 MB on this machine.  The size of the records is printed
too (what srun carries back).

Run: python benchmarks/job_merge.py    (NUMABIND_BENCH_SMALL=1: 50 nodes, for CI)
"""

from __future__ import annotations

import json
import time
import tracemalloc

from _common import SMALL, table

from numabind.check import _job

RANKS_PER_NODE = 8


def record(n: int) -> bytes:
    ranks = []
    for local in range(RANKS_PER_NODE):
        pid = 10_000 + n * 100 + local * 10
        base = local * 14
        plan = f"{base}-{base + 13}"
        groups = [
            {
                "cpus": plan,
                "tids": list(range(pid, pid + 30)),
                "names": ["python"] * 8,
                "count": 30,
            },
            {"cpus": f"{base}", "tids": [pid + 30], "names": ["pt_data_pin"], "count": 1},
            {"cpus": f"{base + 1}", "tids": [pid + 31], "names": ["pt_nccl_watchdg"], "count": 1},
            {"cpus": f"{base + 2}-{base + 3}", "tids": [pid + 32, pid + 33], "count": 2},
            {
                "cpus": plan,
                "tids": list(range(pid + 34, pid + 38)),
                "names": ["cuda-EvtHandlr"],
                "count": 4,
            },
            {"cpus": plan, "tids": [pid + 38, pid + 39], "names": ["python"], "count": 2},
        ]
        off = (n * RANKS_PER_NODE + local) % 500 == 0
        if off:
            groups[1]["cpus"] = "100-111"
        ranks.append(
            {
                "pid": pid,
                "rank": n * RANKS_PER_NODE + local,
                "local_rank": local,
                "job": "4242",
                "step": "0",
                "step_nodes": "gpu[0000-0999]",
                "step_tasks": f"{RANKS_PER_NODE}(x1000)",
                "status": "off plan" if off else "ok",
                "gpu": {
                    "index": local,
                    "pci": f"0000:{0x18 + local * 16:02x}:00.0",
                    "numa_node": local // 4,
                    "source": "the device file it holds open",
                },
                "plan": {
                    "cpus": plan,
                    "helpers": "",
                    "numa_node": local // 4,
                    "memory_policy": "bind",
                    "memory_nodes": str(local // 4),
                    "bound": True,
                    "source": "registry",
                },
                "threads": groups,
                "memory_policy": "bind",
                "memory_nodes": str(local // 4),
                "locality": 0.998,
                "mems_allowed": "0-1",
                "host_buffers": [{"nbytes": 8 << 30, "nodes": str(local // 4), "locality": 1.0}],
                "problems": ["threads that escaped the plan's CPUs"] if off else [],
                "notes": [],
            }
        )
    return json.dumps(
        {
            "schema": _job.SCHEMA,
            "host": f"gpu{n:04d}",
            "job": "4242",
            "facts": {
                "numa_balancing": False,
                "cpuset_mems": "0-1",
                "mempolicy_permitted": True,
                "kernel": "6.8.0",
            },
            "ranks": ranks,
            "notes": [],
        },
        separators=(",", ":"),
    ).encode()


def merge(records: dict[str, bytes], hosts: list[str]) -> tuple[_job.JobReport, list[str]]:
    rows = {h: _job.parse_node(text, h, "4242") for h, text in records.items()}
    report = _job.merge("4242", hosts, rows)
    return report, _job.report_lines(report)


def main() -> int:
    nodes = 50 if SMALL else 1000
    hosts = [f"gpu{n:04d}" for n in range(nodes)]
    records = {h: record(n) for n, h in enumerate(hosts) if n % 200 != 199}
    size = sum(len(r) for r in records.values())
    times = []
    for _ in range(1 if SMALL else 3):
        t0 = time.perf_counter()
        report, lines = merge(records, hosts)
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    merge(records, hosts)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    s = report.summary
    mib = size / 2**20
    print(f"{nodes} nodes x {RANKS_PER_NODE} ranks: {len(records)} records, {mib:.1f} MiB in all")
    print(lines[0])
    print(f"the table: {len(lines)} lines")
    print(
        table(
            ["measure", "value", "aim"],
            [
                ["parse + merge + table, best of runs", f"{min(times):.2f} s", "< 2 s"],
                ["peak memory allocated (tracemalloc)", f"{peak / 2**20:.1f} MB", "< 100 MB"],
            ],
        )
    )
    assert s.ranks == nodes * RANKS_PER_NODE, s
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
