"""PEP 829 startup entry (``_numabind_hook.start``, Python 3.15+).

Kept tiny and top-level: it repeats the .pth line's environment check so that a process
without a local rank never imports the numabind package.
"""

import os

_TRIGGERS = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
    "SLURM_LOCALID",
    "NUMABIND_TORCH",
)


def start() -> None:
    env = os.environ
    if env.get("NUMABIND", "").strip().lower() in ("0", "off"):
        return
    if not any(v in env for v in _TRIGGERS):
        return
    try:
        from numabind import _startup

        _startup.run()
    except Exception as err:
        import sys

        sys.stderr.write(
            f"numabind: startup hook failed to load ({err!r}); this process runs unbound\n"
        )
