"""Functions run in children started by the tests (importable by spawn children).

FIRST is this module's first statement in the child: what the child had before any of its
own imports, which is what "bound from the first instruction" means."""

import os

FIRST = sorted(os.sched_getaffinity(0))


def report(i: int, path: str = "") -> int:
    import json

    line = json.dumps(
        {
            "i": i,
            "first": FIRST,
            "now": sorted(os.sched_getaffinity(0)),
            "local_rank": os.environ.get("LOCAL_RANK"),
            "pid": os.getpid(),
        }
    )
    print("CHILD " + line, flush=True)
    if path:
        with open(f"{path}/{i}.json", "w") as f:
            f.write(line)
    return i


def fail(i: int) -> None:
    if i == 1:
        raise SystemExit(3)


def report_elastic(path: str) -> int:
    """elastic_launch calls fn(*args): the rank is only in the environment."""
    return report(int(os.environ["LOCAL_RANK"]), path)
