"""The isolated collector against a *group*-writable interpreter or package tree (issue 44):
a shared conda env or venv that its owner made ``g+w`` for a project group (0o775
directories, 0o664 files; not writable by others) lets any member of that group plant
code that the collector would run as the owner.  Every earlier test made the path 0o777,
which the rule's "others" bit alone refuses; these make it writable by the group only.

Played as root against an unprivileged uid that owns the tree (``setpriv``), in each of
the three places the rule lives: this machine's check of the interpreter
(``interpreter_problem``), the node's ``sh`` check (``NODE_CHECK``) and the interpreter's own
check of itself and of numabind's package (``BOOT``).  Each refusal names the path that is
group-writable; the same tree without the group bit runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from numabind.check import _isolated, _job
from support import clean_env, readable_src

OWNER = 43219  # the job's user, who owns the shared env
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="plays another uid (root only)"
)
pytestmark = needs_root


def as_owner() -> list[str]:
    return ["setpriv", f"--reuid={OWNER}", f"--regid={OWNER}", "--clear-groups"]


def base_python() -> str:
    """A base interpreter for OWNER's venv that OWNER can start and whose every path
    OWNER can examine (the rule stats each one: a Python under root's 0700 home fails it
    for that reason alone)."""
    probe = (
        "import os, sys; assert sys.version_info >= (3, 10); "
        "[os.lstat(p) for p in [os.path.realpath(sys.executable), *sys.path] if os.path.lexists(p)]"
    )
    for candidate in ("/usr/bin/python3", sys.executable):
        run = [*as_owner(), candidate, "-I", "-S", "-c", probe]
        if subprocess.run(run, capture_output=True, cwd="/", timeout=60).returncode == 0:
            return candidate
    raise AssertionError(f"no Python that uid {OWNER} can start and examine")


@pytest.fixture
def shared_env() -> Iterator[dict[str, Path]]:
    """A venv that uid OWNER owns (0o755/0o644: nobody else may write it), whose
    site-packages names a copy of numabind, also OWNER's, by a path ``.pth`` line."""
    top = Path(tempfile.mkdtemp(prefix="numabind-groupw-", dir="/tmp"))
    top.chmod(0o755)
    venv = top / "env"
    subprocess.run(
        [base_python(), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120
    )
    site = next(venv.glob("lib/python3*/site-packages"))
    pkg = top / "pkg"
    shutil.copytree(readable_src(), pkg)
    (site / "numabind-src.pth").write_text(f"{pkg}\n")
    for path in [venv, *venv.rglob("*"), pkg, *pkg.rglob("*")]:
        if not path.is_symlink():
            path.chmod(0o755 if path.is_dir() else 0o644)
        os.lchown(path, OWNER, OWNER)
    try:
        yield {"python": venv / "bin" / "python", "venv": venv, "site": site, "pkg": pkg}
    finally:
        shutil.rmtree(top, ignore_errors=True)


def boot(python: Path) -> _job.NodeRow:
    """The collector's start in ``python``, as OWNER (as ``check --job`` starts it on a
    node), asked only for numabind's version."""
    argv = _isolated.boot_argv(str(python), ["--version"], "", "collector")
    p = subprocess.run(
        [*as_owner(), *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env=_isolated.isolated_env(clean_env(SLURMD_NODENAME="here")),
    )
    assert "Traceback" not in p.stderr, p.stderr
    if p.stdout.startswith("numabind "):
        return _job.NodeRow(host="here", state="answered", reason=p.stdout.strip())
    return _job.parse_node(p.stdout, "here")


def node_check(python: Path) -> _job.NodeRow:
    """The node's ``sh`` check of ``python``, as OWNER."""
    p = subprocess.run(
        [*as_owner(), "/bin/sh", "-c", _isolated.NODE_CHECK, "numabind", str(python), "-c", ""],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
        env=clean_env(SLURMD_NODENAME="here"),
    )
    assert p.returncode == 0, p.stderr
    if not p.stdout:
        return _job.NodeRow(host="here", state="answered", reason="ran")
    return _job.parse_node(p.stdout, "here")


def test_the_shared_env_runs_while_only_its_owner_may_write_it(
    shared_env: dict[str, Path],
) -> None:
    """The control: the same tree without the group bit passes all three checks."""
    python = shared_env["python"]
    assert _isolated.interpreter_problem(str(python), {0, OWNER}) is None
    assert node_check(python).reason == "ran"
    row = boot(python)
    assert row.state == "answered" and row.reason.startswith("numabind "), row


def test_a_group_writable_interpreter_directory_is_refused_everywhere(
    shared_env: dict[str, Path],
) -> None:
    """The env's ``bin`` made 0o775 (a conda env shared with ``chmod -R g+w``): a group
    member could replace the interpreter."""
    python = shared_env["python"]
    bin_dir = python.parent
    bin_dir.chmod(0o775)
    want = f"{bin_dir} is writable by group or others"
    assert _isolated.interpreter_problem(str(python), {0, OWNER}) == want
    row = node_check(python)
    assert row.state == "unreachable" and want in row.reason, row
    row = boot(python)
    assert row.state == "unreachable" and want in row.reason, row
    assert "the interpreter is not run with these privileges" in row.reason


def test_a_group_writable_pyvenv_cfg_is_refused_here_and_on_the_node(
    shared_env: dict[str, Path],
) -> None:
    """``pyvenv.cfg`` 0o664: its ``home`` line says which standard library runs."""
    cfg = shared_env["venv"] / "pyvenv.cfg"
    cfg.chmod(0o664)
    python = shared_env["python"]
    want = f"{cfg} is writable by group or others"
    assert _isolated.interpreter_problem(str(python), {0, OWNER}) == want
    row = node_check(python)
    assert row.state == "unreachable" and want in row.reason, row


@pytest.mark.parametrize(
    ("where", "mode", "why"),
    [
        ("site", 0o775, "it names where numabind is"),
        ("site/numabind-src.pth", 0o664, "it names where numabind is"),
        ("pkg", 0o775, "numabind there is not run with these privileges"),
        ("pkg/numabind/check", 0o775, "numabind there is not run with these privileges"),
        ("pkg/numabind/_plan.py", 0o664, "numabind there is not run with these privileges"),
        ("pkg/_numabind_start.py", 0o664, "numabind's startup module is not run"),
    ],
)
def test_a_group_writable_package_tree_is_refused_by_the_collector(
    shared_env: dict[str, Path], where: str, mode: int, why: str
) -> None:
    """Any part of the way to numabind's code made writable by the group (and not by
    others): the collector refuses before it imports any of it, naming that part."""
    head, _, rest = where.partition("/")
    path = shared_env[head] / rest if rest else shared_env[head]
    path.chmod(mode)
    assert path.stat().st_mode & 0o022 == 0o020, "group-writable, not writable by others"
    row = boot(shared_env["python"])
    assert row.state == "unreachable", row
    assert row.reason.startswith(f"not run: {path} is writable by group or others: {why}"), row
