"""A rank started by a launcher (mpirun, numactl, a parent process): what it was given at
its first statement -- CPU mask and memory policy -- written to a file of its own under
$PROBE_DIR (lines several ranks print through mpirun can interleave)."""

import os

aff = sorted(os.sched_getaffinity(0))

import json  # noqa: E402  (after the first look: nothing may run before it)

from numabind import _kernel  # noqa: E402

pol = _kernel.get_mempolicy()
rank = os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK") or os.environ.get("LOCAL_RANK") or "-"
info = {"rank": rank, "affinity": aff, "policy": [pol[0], sorted(pol[1])]}
with open(os.path.join(os.environ["PROBE_DIR"], f"{os.getpid()}.json"), "w") as f:
    json.dump(info, f)
