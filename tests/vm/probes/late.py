"""Late binding in the VM: a process that already placed 200 MB (argv: MB) on the wrong
node (argv: WRONG_NODE, whose CPUs are WRONG_CPUS "0,1"), with three threads started, is
bound by @numa_bound as local rank RANK, with or without migration (MIGRATE 0/1).  Prints
one JSON line: pages per node before and after, file-backed pages before and after (never
moved), every thread's CPUs, the calling thread's policy, and what the binding reports.
"""

import json
import os
import sys
import threading

from numabind import _kernel, numa_bound
from numabind._kernel import pages_per_node, private_anon_regions


def file_pages() -> dict[int, int]:
    per: dict[int, int] = {}
    with open("/proc/self/numa_maps") as f:
        for line in f:
            if " file=" not in line:
                continue
            for field in line.split():
                if field.startswith("N") and "=" in field and field[1:].split("=")[0].isdigit():
                    n, c = field[1:].split("=")
                    per[int(n)] = per.get(int(n), 0) + int(c)
    return per


def main() -> None:
    mb, wrong, wrong_cpus, rank, migrate = sys.argv[1:6]
    os.sched_setaffinity(0, [int(c) for c in wrong_cpus.split(",")])
    _kernel.set_mempolicy("bind", {int(wrong)})
    buf = b"\x01" * (int(mb) << 20)
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for t in threads:
        t.start()
    _kernel.set_mempolicy("default")
    before = pages_per_node(private_anon_regions())
    files_before = file_pages()

    @numa_bound(rank_arg="rank", migrate=migrate == "1")
    def work(rank: int) -> None:
        return None

    work(rank=int(rank))
    binding = work.binding  # type: ignore[attr-defined]
    after = pages_per_node(private_anon_regions())
    files_after = file_pages()
    affinity = {
        tid: sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")
    }
    policy = _kernel.get_mempolicy()
    stop.set()
    print(
        json.dumps(
            {
                "before": before,
                "after": after,
                "files_before": files_before,
                "files_after": files_after,
                "threads": affinity,
                "policy": [policy[0], sorted(policy[1])],
                "binding": str(binding),
                "moved": binding.pages_moved,
                "failed": binding.pages_failed,
                "not_moved": binding.not_moved,
                "kept": len(buf),
            }
        )
    )


if __name__ == "__main__":
    main()
