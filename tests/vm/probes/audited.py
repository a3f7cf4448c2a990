"""Run a script with every file this interpreter opens recorded from its first moment,
the startup hook's reading of the machine included: ``python -S audited.py SCRIPT
ARGS...`` installs an audit hook (PEP 578: ``open`` is raised by ``open()`` and
``os.open`` alike), then processes the site packages as Python would have (the ``.pth``
hook binds the rank there), then runs SCRIPT as ``__main__`` with the list of opened paths
in ``builtins.OPENED`` (recording stops when SCRIPT reads it: ``OPENED_UNTIL``)."""

import builtins
import sys

OPENED: list[str] = []


def _hook(event: str, args: tuple) -> None:  # type: ignore[type-arg]
    if event == "open" and isinstance(args[0], str) and not getattr(builtins, "OPENED_UNTIL", 0):
        OPENED.append(args[0])


sys.addaudithook(_hook)
import site  # noqa: E402

site.main()
import runpy  # noqa: E402

builtins.OPENED = OPENED  # type: ignore[attr-defined]
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
