"""What a rank sees at its first statement; the launcher tests start this as the rank."""

import os

affinity = sorted(os.sched_getaffinity(0))
import json  # noqa: E402
import sys  # noqa: E402

keys = (
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "LOCAL_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "SLURM_LOCALID",
    "SLURM_STEP_ID",
    "NUMABIND_STATE",
)
info = {
    "pid": os.getpid(),
    "affinity": affinity,
    "argv": sys.argv,
    "env": {k: os.environ[k] for k in keys if k in os.environ},
}
# one file per rank (PROBE_DIR): lines that ranks print through a launcher can interleave
if os.environ.get("PROBE_DIR"):
    with open(os.path.join(os.environ["PROBE_DIR"], f"{os.getpid()}.json"), "w") as f:
        json.dump(info, f)
else:
    print("PROBE " + json.dumps(info), flush=True)
