"""A torch.distributed worker of the job-report tests (tests/test_report.py): gloo on the
CPU.  It writes its pid and generation to REPORT_DIR, then either relies on
NUMABIND_REPORT=1 (the hook posts after init_process_group) or, with REPORT_API=1, calls
numabind.report() itself unless it is rank REPORT_SKIP_RANK; with REPORT_CRASH_RANK it
exits with an error in the first generation (an elastic restart)."""

from __future__ import annotations

import json
import os
import time

import torch.distributed as dist


def main() -> None:
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if os.environ.get("REPORT_CRASH_RANK"):
        # gloo's keys of each generation under their own prefix: on the agent's store this
        # torch build's gloo can read a dead peer's address after a restart (seen without
        # numabind too); numabind's keys are in the store under it
        from datetime import timedelta

        base = dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=60),
        )
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"attempt-{restart}", base),
            rank=int(os.environ["RANK"]),
            world_size=int(os.environ["WORLD_SIZE"]),
        )
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    out = os.path.join(os.environ["REPORT_DIR"], f"worker-{restart}-{rank}.json")
    with open(out, "w") as f:
        store = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
        json.dump({"pid": os.getpid(), "rank": rank, "restart": restart, "store": store}, f)
    if os.environ.get("REPORT_API") == "1" and str(rank) != os.environ.get("REPORT_SKIP_RANK"):
        import numabind

        thread = numabind.report(wait=float(os.environ.get("REPORT_WAIT", "5")))
        if thread is not None:
            thread.join()
    if restart == "0" and str(rank) == os.environ.get("REPORT_CRASH_RANK"):
        time.sleep(1)
        os._exit(3)
    time.sleep(float(os.environ.get("HOLD", "4")))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
