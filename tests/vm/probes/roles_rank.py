"""A torchrun worker under NUMABIND_RESERVE: what the hook planned (compute and helper
CPUs) and every thread's mask.  Prints one line, ``ROLE {json}``."""

import os

FIRST_AFFINITY = sorted(os.sched_getaffinity(0))

import json  # noqa: E402
import threading  # noqa: E402

import numabind._startup  # noqa: E402


def main() -> None:
    t = threading.Thread(target=lambda: None)  # a thread started by the rank
    t.start()
    t.join()
    b = numabind._startup.last
    masks = [sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")]
    data = {
        "rank": int(os.environ["LOCAL_RANK"]),
        "first": FIRST_AFFINITY,
        "cpus": sorted(b.plan.cpus) if b else None,
        "helpers": sorted(b.plan.helpers) if b else None,
        "threads": masks,
    }
    print("ROLE " + json.dumps(data), flush=True)


if __name__ == "__main__":
    main()
