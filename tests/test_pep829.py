"""Ready for the next Pythons (issue 45): PEP 829 (accepted 2026-04-24) runs ``<name>.start``
entry points from 3.15, and from 3.18 ignores ``import`` lines in ``.pth`` files.

* ``src/_numabind_hook.start`` names an entry point in the ``module:function`` form that
  PEP 829's loader resolves with ``pkgutil.resolve_name`` and calls with no arguments; on
  every supported Python (3.10-3.13 here, in the unit stage) it resolves to the start
  module's ``start`` and binds exactly as the ``.pth`` line does.
* ``docs/security.rst`` shows the ``.pth`` line byte for byte: compared with the file.
* What the hook may do (docs/security.rst): no network, no subprocess, no write outside
  the user's own directories; an audit hook watches a real rank's start, both paths.
* The cost of the ``.start`` path beside the ``.pth`` line's: benchmarks/start_file.py,
  run here in its small mode."""

from __future__ import annotations

import json
import os
import pkgutil
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from support import clean_env, two_cpus

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
START = SRC / "_numabind_hook.start"
PTH = SRC / "_numabind_hook.pth"
# PEP 829's entry point syntax: pkg.mod:callable, the callable required (the "colon form"
# of pkgutil.resolve_name, W(.W)*:W(.W)*, which 3.15's strict mode alone accepts)
ENTRY = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def _entry_points() -> list[str]:
    """The lines of the ``.start`` file PEP 829 reads as entry points (blank lines and
    ``#`` comments skipped, as its loader skips them)."""
    text = START.read_text(encoding="utf-8-sig")
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_start_file_names_one_entry_point_in_the_colon_form() -> None:
    (line,) = _entry_points()
    assert ENTRY.match(line), f"{line!r} is not pkg.mod:callable"
    assert START.read_bytes().decode("ascii") == line + "\n", "ASCII, one line, nothing else"


def test_it_resolves_as_pep_829s_loader_resolves_it_to_the_start_function() -> None:
    """``pkgutil.resolve_name`` (in strict mode where this Python has one) gives the very
    function the ``.pth`` line calls, a callable taking no arguments."""
    import inspect

    import _numabind_start

    (line,) = _entry_points()
    kwargs = (
        {"strict": True} if "strict" in inspect.signature(pkgutil.resolve_name).parameters else {}
    )
    fn = pkgutil.resolve_name(line, **kwargs)
    assert fn is _numabind_start.start
    assert all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in inspect.signature(fn).parameters.values()
    ), "PEP 829 calls it with no arguments"
    assert "m.start()" in PTH.read_text(), "the .pth line calls the same function"


LOADER = """
import os, pkgutil, sys
sys.path.insert(0, {src!r})
for line in open({start!r}, encoding="utf-8-sig").read().splitlines():
    if line.strip() and not line.startswith("#"):
        pkgutil.resolve_name(line.strip())()
print(sorted(os.sched_getaffinity(0)), "numabind" in sys.modules)
"""


@two_cpus
@pytest.mark.parametrize("rank", ["0", "1", None])
def test_the_start_path_binds_as_the_pth_path_does(two: str, rank: str | None) -> None:
    """A fresh interpreter without site (``-S``: no ``.pth`` runs) calling the ``.start``
    entry point as PEP 829's loader does: a rank of the two-node machine ends on its
    node's CPU, the same as with the ``.pth`` line; a process with no trigger loads
    nothing of numabind's."""
    ranks = {"LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": "2"} if rank else {}
    env = clean_env(NUMABIND_SYSROOT=two, NUMABIND="force", **ranks)
    code = LOADER.format(src=str(SRC), start=str(START))
    via_start = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    via_pth = subprocess.run(
        [sys.executable, "-c", "import os, sys; print(sorted(os.sched_getaffinity(0)), "
         "'numabind' in sys.modules)"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert via_start.returncode == 0 and via_pth.returncode == 0, via_start.stderr
    assert via_start.stdout == via_pth.stdout, (via_start.stdout, via_pth.stdout)
    if rank:
        assert via_start.stdout.startswith(f"[{rank}]"), via_start.stdout
    else:
        assert via_start.stdout.strip() == f"{sorted(os.sched_getaffinity(0))} False"
        assert via_start.stderr == ""


def _rst_literal(section: str) -> str:
    """The literal block that follows ``::`` in ``section`` of docs/security.rst."""
    text = (ROOT / "docs" / "security.rst").read_text()
    body = text.split(section, 1)[1]
    block = body.split("::\n\n", 1)[1]
    lines = []
    for ln in block.splitlines():
        if ln and not ln.startswith("    "):
            break
        lines.append(ln[4:])
    return "\n".join(lines).strip("\n") + "\n"


def test_security_page_shows_the_pth_line_byte_for_byte() -> None:
    shown = _rst_literal("The startup line, byte for byte")
    assert shown.encode() == PTH.read_bytes()


AUDIT = """
import json, os, sys
seen = []
WATCH = ("socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.fork",
         "os.spawn", "urllib.", "http.", "ftplib.", "smtplib.", "webbrowser.")
def hook(event, args):
    if event.startswith(WATCH):
        seen.append(("call", event, repr(args)[:120]))
    elif event == "open":
        path, mode, flags = args
        writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        if writes and isinstance(path, (str, bytes)):
            seen.append(("write", event, os.fsdecode(path)))
    elif event in ("os.rename", "os.remove", "os.mkdir", "os.rmdir", "os.symlink", "os.link",
                   "os.chmod", "os.chown", "os.truncate", "shutil.rmtree"):
        seen.append(("write", event, os.fsdecode(args[0]) if isinstance(args[0], (str, bytes))
                     else repr(args[0])))
sys.addaudithook(hook)
import site
site.main()
print(json.dumps(seen))
"""


@two_cpus
def test_the_hook_calls_no_network_no_subprocess_and_writes_only_the_users_own(
    two: str, tmp_path: Path
) -> None:
    """A real rank's start, watched by an audit hook installed before site runs the
    ``.pth`` line, cold (the full path) and warm (the replay): no socket, no subprocess, no
    exec; every file it writes, renames or removes is in the user's own directories
    (``numabind-<uid>`` and ``numabind-cache-<uid>`` under the registry base: names
    relative to those directories' descriptors, absolute paths inside them)."""
    uid = os.geteuid()
    registry = tmp_path / "registry"
    registry.mkdir()
    env = clean_env(
        LOCAL_RANK="1",
        LOCAL_WORLD_SIZE="2",
        NUMABIND_SYSROOT=two,
        NUMABIND_REGISTRY=str(registry),
        PYTHONDONTWRITEBYTECODE="1",  # the interpreter's own .pyc writes are not the hook's
    )
    own = (f"{registry}/numabind-{uid}/", f"{registry}/numabind-cache-{uid}/")
    names = {f"numabind-{uid}", f"numabind-cache-{uid}"}
    wrote: set[str] = set()
    for attempt in ("cold", "warm"):
        r = subprocess.run(
            [sys.executable, "-S", "-c", AUDIT], capture_output=True, text=True, env=env,
            timeout=120,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        seen = json.loads(r.stdout)
        calls = [s for s in seen if s[0] == "call"]
        assert calls == [], (attempt, calls)
        for _, event, path in (s for s in seen if s[0] == "write"):
            if path.startswith("/"):
                assert path.startswith(own), (attempt, event, path)
            else:  # relative to a directory's descriptor: a user's own directory made
                # under its base, or a plain name inside one (never a path that climbs)
                assert path in names or ("/" not in path and path not in ("", ".", "..")), (
                    attempt,
                    event,
                    path,
                )
        wrote.update(p for _, _, p in seen if not p.startswith("/"))
    for d in own:  # what it made: the directories, mode 0700, and files only inside them
        assert not os.path.exists(d) or stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    assert set(os.listdir(registry)) <= names, os.listdir(registry)
    assert wrote, "the cold start wrote its cache: the watch saw writes"


def test_the_start_file_benchmark_prints_both_paths_and_a_ratio() -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "start_file.py")],
        capture_output=True,
        text=True,
        env=clean_env(NUMABIND_BENCH_SMALL="1"),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert ".pth line" in out and ".start entry point" in out, out
    m = re.search(r"ratio \.start / \.pth: ([0-9.]+)x", out)
    assert m and float(m.group(1)) > 0, out
