"""A rank under NUMABIND_RESERVE (under torchrun, or started directly): what the hook
planned (compute and helper CPUs) and every thread's mask; run by probes/audited.py, also
every file its interpreter opened before this script's first statement and where its
machine came from (the per-node cache).  Prints one line, ``ROLE {json}`` (or writes
it to ``$ROLE_DIR/rank-N.json``)."""

import os

FIRST_AFFINITY = sorted(os.sched_getaffinity(0))

import builtins  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

OPENED = list(getattr(builtins, "OPENED", None) or [])
builtins.OPENED_UNTIL = 1  # type: ignore[attr-defined]

import numabind._startup  # noqa: E402
from numabind import _kernel  # noqa: E402


def _key_files() -> list[str]:
    """The files every rank reads again by design: the witnesses of the node's machine
    file (the cpuset, CPUs and nodes online, the GPUs' nodes, ...), as its lines list them."""
    from numabind import _cache

    found = _cache.lookup(os.environ, "/")
    lines = found.data.decode("utf-8", "replace").split("\n")[2:]
    return [line.split(" ")[2] for line in lines if line.startswith("w ")]


def main() -> None:
    t = threading.Thread(target=lambda: None)  # a thread started by the rank
    t.start()
    t.join()
    from numabind import _apply

    b = numabind._startup.last or _apply.adopted()  # planned here, or the replayed answer
    start = sys.modules.get("_numabind_start")
    masks = []
    for tid in os.listdir("/proc/self/task"):
        try:
            masks.append(sorted(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:
            continue  # the thread joined above, still listed while its kernel thread exits
    policy = _kernel.get_mempolicy()
    data = {
        "rank": int(os.environ["LOCAL_RANK"]),
        "first": FIRST_AFFINITY,
        "cpus": sorted(b.plan.cpus) if b else None,
        "helpers": sorted(b.plan.helpers) if b else None,
        "threads": masks,
        "policy": [policy[0], sorted(policy[1])],
        "state": os.environ.get("NUMABIND_STATE"),
        "origin": getattr(start, "machine_origin", None) or (b.machine if b else ""),
        "handed_over": getattr(start, "handed_over", None),
        "opened": OPENED,
        "key_files": _key_files(),
    }
    out = os.environ.get("ROLE_DIR")  # ranks that share a pipe: one file each (a line
    if out:  # longer than the pipe's atomic write would interleave with the others')
        with open(os.path.join(out, f"rank-{data['rank']}.json"), "w") as f:
            json.dump(data, f)
    else:
        print("ROLE " + json.dumps(data), flush=True)


if __name__ == "__main__":
    main()
