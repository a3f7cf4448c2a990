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
print(
    "PROBE "
    + json.dumps(
        {
            "pid": os.getpid(),
            "affinity": affinity,
            "argv": sys.argv,
            "env": {k: os.environ[k] for k in keys if k in os.environ},
        }
    ),
    flush=True,
)
