"""A rank of the Slurm job the job-report tests run (tests/test_job.py): it touches some
memory, names and re-pins one thread off its plan when it is rank ``JOB_OFF_PLAN_RANK``,
reports ready, and waits to be cancelled."""

from __future__ import annotations

import json
import os
import threading
import time


def main() -> None:
    rank = int(os.environ["SLURM_PROCID"])
    memory = bytearray(16 << 20)  # private pages for check to place
    memory[::4096] = b"x" * len(memory[::4096])
    moved = threading.Event()
    if os.environ.get("JOB_OFF_PLAN_RANK") == str(rank):

        def spinner() -> None:
            tid = threading.get_native_id()
            with open(f"/proc/self/task/{tid}/comm", "w") as f:
                f.write("spinner")
            plan = os.sched_getaffinity(0)
            outside = set(range(os.cpu_count() or 1)) - plan
            os.sched_setaffinity(0, outside or plan)  # this thread only
            moved.set()
            time.sleep(3600)

        threading.Thread(target=spinner, daemon=True).start()
        moved.wait(10)
    ready = os.path.join(os.environ["JOB_READY_DIR"], f"rank{rank}.json")
    with open(ready + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "affinity": sorted(os.sched_getaffinity(0))}, f)
    os.rename(ready + ".tmp", ready)
    time.sleep(3600)
    del memory


if __name__ == "__main__":
    main()
