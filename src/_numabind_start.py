"""The startup entry: ``start()`` decides, from the environment alone, whether numabind
has anything to do in this interpreter, and only then imports the numabind package.

The one start path of all three hook forms: the ``.pth`` line (which has already seen a
trigger variable, with the cheapest test Python offers: one dictionary intersection,
compiled at every start of every interpreter), PEP 829's ``_numabind_hook.start`` (Python
3.15+, which has not) and the ``sitecustomize`` form.  ``NUMABIND=0``/``off`` is checked
here, before anything of numabind is imported.  Kept top-level and tiny; it must never
raise.
"""

import os

# numabind._environ.TRIGGER_VARIABLES: the rank variables of numabind._model's table, then
# the framework switches; the .pth line spells the same list (a test keeps the three in step)
TRIGGERS = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
    "SLURM_LOCALID",
    "NUMABIND_TORCH",
    "NUMABIND_RAY",
    "NUMABIND_DEVICES",
)
# the one line a hook that cannot load says (the .pth and sitecustomize carry the same text
# for when this module itself cannot be imported; a test keeps them in step)
FAILED = "numabind: startup hook failed to load (%r); this process runs unbound\n"


def failed(err: BaseException) -> None:
    """Say that the hook could not load, in one write(2) whose errors are ignored."""
    try:
        os.write(2, (FAILED % (err,)).encode("utf-8", "replace"))
    except Exception:
        pass


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
        failed(err)
