"""What ``numabind run`` hands to the command it execs (under torchrun --no-python): the
first statement records the CPU mask and memory policy, and the thread variables it got.
Prints one line, ``RUN {json}``."""

import os

FIRST_AFFINITY = sorted(os.sched_getaffinity(0))
from numabind import _kernel  # noqa: E402

FIRST_POLICY = _kernel.get_mempolicy()

import json  # noqa: E402


def main() -> None:
    data = {
        "rank": os.environ["LOCAL_RANK"],
        "affinity": FIRST_AFFINITY,
        "policy": [FIRST_POLICY[0], sorted(FIRST_POLICY[1])],
        "omp": os.environ.get("OMP_NUM_THREADS"),
    }
    print("RUN " + json.dumps(data), flush=True)


if __name__ == "__main__":
    main()
