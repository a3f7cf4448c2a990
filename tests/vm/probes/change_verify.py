"""The verifiers of the changes scenario (tests/vm/changes.py), in one fresh interpreter (an
interpreter start costs seconds under emulation): ``numabind show --json`` and
``numabind check --pid PID --json``, through the command line's own entry
(``numabind.cli.main``, what the ``numabind`` script runs), reading the machine as it is now.

With ``--stale FILE`` (a machine file of the cache, copied before the change), the same two
run again with every machine reading replaced by that file's record: what a verifier that
answers from the cache (a50e42a's, issue 44) says.  The host-side tests use it to show that
each change is one such a verifier gets wrong, so that the live answers' agreement with the
kernel is not an accident.  Prints one line, ``{json}``.

Usage: change_verify.py PID [--stale FILE]
"""

import contextlib
import io
import json
import sys
from typing import Any


def _cli(*argv: str) -> dict[str, Any]:
    from numabind.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exit_:
            rc = exit_.code if isinstance(exit_.code, int) else 1
    text = out.getvalue()
    try:
        data = json.loads(text) if text.strip() else None
    except ValueError:
        data = None
    return {"rc": rc, "json": data, "stderr": err.getvalue()[-2000:]}


def _stale(path: str) -> None:
    """Every machine this process reads from now on is the record in ``path``."""
    from numabind import _cache
    from numabind._topology import Machine

    with open(path, "rb") as f:
        data = f.read()
    real = Machine.from_root.__func__  # type: ignore[attr-defined]

    def from_root(cls: type[Machine], root: str = "/") -> Machine:
        return _cache.from_file(data, "/")

    Machine.from_root = classmethod(from_root)  # type: ignore[method-assign,assignment]
    # what the record lacks is read from the machine itself (as a cached rank does)
    _cache._live = lambda sysroot: real(Machine, sysroot).source


def main() -> None:
    pid = sys.argv[1]
    args = sys.argv[2:]
    result: dict[str, Any] = {
        "show": _cli("show", "--json"),
        "check": _cli("check", "--pid", pid, "--json"),
    }
    if "--stale" in args:
        _stale(args[args.index("--stale") + 1])
        result["stale_show"] = _cli("show", "--json")
        result["stale_check"] = _cli("check", "--pid", pid, "--json")
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
