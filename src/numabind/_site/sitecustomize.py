"""numabind's startup hook as a ``sitecustomize`` module, for PYTHONPATH users.

Put the directory printed by ``numabind sitecustomize-path`` on PYTHONPATH.  Python then
imports this file at startup instead of the sitecustomize it would otherwise have found
(Debian and conda ship one), so after running the hook this module finds that one further
down ``sys.path`` and runs it, under the same name.
"""

import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _hook() -> None:
    # under a second name too: the module it chains to takes the name "sitecustomize",
    # and ``numabind doctor`` must still see that this one ran
    sys.modules["_numabind_sitecustomize"] = sys.modules[__name__]
    try:
        from _numabind_start import start  # the same cheap environment check as the .pth
    except ImportError as err:
        sys.stderr.write(
            "numabind: startup hook failed to load (%r); this process runs unbound\n" % (err,)
        )
        return
    start()


_hook()
try:
    _chain()
except Exception as _err:
    sys.stderr.write(f"numabind: could not run the sitecustomize it shadows ({_err!r})\n")
