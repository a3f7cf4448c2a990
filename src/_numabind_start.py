"""The startup entry: ``start()`` decides, from the environment alone, whether numabind
has anything to do in this interpreter, and only then imports the numabind package.

Called by the ``.pth`` line (which has already seen a trigger variable, with the cheapest
test Python offers: one dictionary intersection, compiled at every start of every
interpreter), by PEP 829's ``_numabind_hook.start`` (Python 3.15+, which has not) and by
the ``sitecustomize`` form.  Kept top-level and tiny; it must never raise.
"""

import os

# the rank variables of numabind._ranks.RANK_VARIABLES, then the framework switches; the
# .pth line spells the same list (a test keeps the three in step)
TRIGGERS = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
    "SLURM_LOCALID",
    "NUMABIND_TORCH",
    "NUMABIND_RAY",
)


def start() -> None:
    try:
        env = os.environ
        if env.get("NUMABIND", "").strip().lower() in ("0", "off"):
            return
        if not any(v in env for v in TRIGGERS):
            return
        from numabind import _startup

        _startup.run()
    except Exception as err:
        try:
            line = f"startup hook failed to load ({err!r}); this process runs unbound"
            os.write(2, f"numabind: {line}\n".encode("utf-8", "replace"))
        except Exception:
            pass
