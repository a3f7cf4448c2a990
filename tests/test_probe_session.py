"""Safe on a shared machine, round four (issue 42): what root starts for another user runs
in a session of its own, with nothing of root's environment, and ends with its session.

``doctor --python`` starts another user's venv as that user (round three), and so runs
that user's ``.pth`` files.  Each attack is played for real, as root against an
unprivileged uid made by the test (no passwd entry, like a fresh account): a ``.pth``
that opens ``/dev/tty`` and pushes a command into root's terminal with ``TIOCSTI`` while
doctor runs under a real pseudo-terminal, one that writes its whole environment to a
file it owns while root has a secret set, and one that leaves sleeping grandchildren
behind (one in the probe's process group, one in a group of its own in the same
session).  The rule they break is numabind.check._isolated.run_contained, tested here
directly too.
"""

from __future__ import annotations

import errno
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import clean_env, readable_src

ATTACKER = 43242
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="plays another uid (root only)"
)

# Each attack is one .pth import line running ``CODE`` (MARKS: a folder the attacker can
# write, where it leaves what it found).
TTY_ATTACK = r"""
import fcntl, termios
try:
    fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
except OSError as err:
    open(MARKS + "/tty-errno-%d" % err.errno, "w").close()
else:
    open(MARKS + "/tty-opened", "w").close()
    for c in b"echo INJECTED-4242\n":
        fcntl.ioctl(fd, termios.TIOCSTI, bytes([c]))
"""
ENV_ATTACK = r"""
import json
with open(MARKS + "/env-%d" % os.getuid(), "w") as f:
    json.dump(dict(os.environ), f)
"""
STAY_ATTACK = r"""
import time
for own_group in (False, True):
    ready, said = os.pipe()  # the probe goes on once the sleeper has left its mark
    if os.fork() == 0:
        os.close(ready)
        if own_group:
            os.setpgid(0, 0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        open(MARKS + "/stayed-%d" % os.getpid(), "w").close()
        os.write(said, b"1")
        os.close(said)
        time.sleep(600)
        os._exit(0)
    os.close(said)
    os.read(ready, 1)
    os.close(ready)
"""


def pth_line(code: str, marks: Path) -> str:
    """``code`` as the one import line of a ``.pth`` file."""
    return f"import os; MARKS = {str(marks)!r}; exec({code!r})\n"


def runnable_python(uid: int) -> str:
    """A base interpreter ``uid`` can execute itself (this one's pyenv tree may be under
    /root, which it cannot enter)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        try:
            ok = subprocess.run(
                [candidate, "-c", "import sys, venv; assert sys.version_info >= (3, 10)"],
                user=uid, group=uid, extra_groups=[], capture_output=True, cwd="/", timeout=60,
            ).returncode == 0  # fmt: skip
        except OSError:
            ok = False
        if ok:
            return candidate
    raise AssertionError(f"no Python that uid {uid} can execute")


@pytest.fixture
def their_venv() -> Iterator[dict[str, Path]]:
    """A venv that uid ATTACKER owns (made from a root-owned base), with numabind (a copy
    any uid can read, by a path ``.pth`` as an editable install has), and a folder it can
    write its findings to."""
    top = Path(tempfile.mkdtemp(prefix="numabind-probe-", dir="/tmp"))
    top.chmod(0o755)
    marks = top / "marks"
    marks.mkdir()
    marks.chmod(0o1777)
    venv = top / "venv"
    base = runnable_python(ATTACKER)
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "numabind-src.pth").write_text(f"{readable_src()}\n")
    try:
        yield {"top": top, "marks": marks, "python": venv / "bin" / "python", "site": site}
    finally:
        for name in os.listdir(marks):
            if name.startswith("stayed-"):
                try:
                    os.kill(int(name.split("-")[1]), signal.SIGKILL)
                except OSError:
                    pass
        shutil.rmtree(top, ignore_errors=True)


def plant(venv: dict[str, Path], code: str) -> None:
    """Put the attack in the venv as a ``.pth`` file and give the venv to ATTACKER."""
    (venv["site"] / "zz-attack.pth").write_text(pth_line(code, venv["marks"]))
    for path in [venv["top"] / "venv", *(venv["top"] / "venv").rglob("*")]:
        os.lchown(path, ATTACKER, ATTACKER)


def doctor_argv(python: Path) -> list[str]:
    return [sys.executable, "-m", "numabind", "doctor", "--python", str(python), "--json"]


def findings(stdout: str) -> dict[str, tuple[str, str]]:
    return {f["check"]: (f["status"], f["detail"]) for f in json.loads(stdout)["findings"]}


# What root's shell does after doctor: it reads the next line typed at its terminal.
SHELL = r"""
import os, select, subprocess, sys
p = subprocess.run(sys.argv[1:], capture_output=True)
sys.stdout.write("DOCTOR-EXIT %d\n" % p.returncode)
sys.stdout.flush()
if select.select([0], [], [], 2.0)[0]:
    sys.stdout.write("SHELL-READ %r\n" % os.read(0, 4096))
else:
    sys.stdout.write("SHELL-READ nothing\n")
sys.stdout.flush()
"""


def under_a_terminal(argv: list[str], env: dict[str, str]) -> bytes:
    """Run ``argv`` as the command of a 'shell' in a new session whose controlling
    terminal is a real pseudo-terminal (as root's login shell is), and return everything
    that terminal showed (its master side) until the shell exited."""
    pid, master = os.forkpty()
    if pid == 0:  # the child: the pty is its controlling terminal and its stdio
        try:
            os.execve(sys.executable, [sys.executable, "-c", SHELL, *argv], env)
        finally:
            os._exit(127)
    seen = b""
    end = time.monotonic() + 240
    try:
        while time.monotonic() < end:
            if select.select([master], [], [], 1.0)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the slave side is closed, the shell is gone
                    break
                if not chunk:
                    break
                seen += chunk
    finally:
        os.close(master)
        os.waitpid(pid, 0)
    return seen


@needs_root
def test_another_users_pth_cannot_reach_roots_terminal(their_venv: dict[str, Path]) -> None:
    """Attack 1 of round four: on a50e42a the probe ran in root's session, so the .pth's
    ``open('/dev/tty')`` gave root's terminal and TIOCSTI typed ``echo INJECTED-4242``
    into it, which root's shell then read.  Now the probe has no controlling terminal:
    ``/dev/tty`` is ENXIO, and nothing reaches the terminal."""
    plant(their_venv, TTY_ATTACK)
    seen = under_a_terminal(doctor_argv(their_venv["python"]), clean_env())
    marks = os.listdir(their_venv["marks"])
    assert marks == [f"tty-errno-{errno.ENXIO}"], (marks, seen)
    assert b"INJECTED" not in seen, seen
    assert b"DOCTOR-EXIT 0" in seen or b"DOCTOR-EXIT 1" in seen, seen  # findings, not usage
    assert b"SHELL-READ nothing" in seen, seen


@needs_root
def test_another_users_pth_sees_none_of_roots_environment(their_venv: dict[str, Path]) -> None:
    """Attack 2: on a50e42a the probe inherited root's whole environment (a secret, a
    PATH with root's own folders first).  It now gets the allow-list alone: a fixed PATH,
    the C locale, its own HOME, and the probe's one trigger."""
    from numabind.check._isolated import SAFE_PATH

    plant(their_venv, ENV_ATTACK)
    env = clean_env(ROOT_SECRET_TOKEN="s3cret-of-root", PATH=f"/root/bin:{os.environ['PATH']}")
    p = subprocess.run(
        doctor_argv(their_venv["python"]), capture_output=True, text=True, env=env, timeout=180
    )
    assert p.returncode in (0, 1), p.stderr
    assert f"started as uid {ATTACKER}, its owner" in findings(p.stdout)["python"][1]
    with open(their_venv["marks"] / f"env-{ATTACKER}") as f:
        seen = json.load(f)
    assert "s3cret-of-root" not in json.dumps(seen)
    assert set(seen) - {"LC_CTYPE"} == {"PATH", "LANG", "LC_ALL", "HOME", "NUMABIND_RAY"}, seen
    assert seen["PATH"] == SAFE_PATH and seen["HOME"] == "/" and seen["LC_ALL"] == "C"


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def _still_alive(pids: list[int], within: float = 10.0) -> list[int]:
    """Those of ``pids`` alive after up to ``within`` s: SIGKILL is delivered at once, but
    a task still exiting, or its parent's reaping, may take a moment on a loaded machine."""
    deadline = time.monotonic() + within
    while (left := [pid for pid in pids if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@needs_root
def test_what_another_users_pth_leaves_behind_ends_with_the_probe(
    their_venv: dict[str, Path],
) -> None:
    """Attack 3: a .pth that forks two sleepers (one in the probe's process group, one in
    a new group of the same session), their output sent elsewhere so the probe's pipes
    close: on a50e42a both ran on after doctor returned.  Now the session is killed once
    the probe answered."""
    plant(their_venv, STAY_ATTACK)
    p = subprocess.run(
        doctor_argv(their_venv["python"]),
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=180,
    )
    assert p.returncode in (0, 1), p.stderr
    assert f"started as uid {ATTACKER}, its owner" in findings(p.stdout)["python"][1]
    stayed = [int(n.split("-")[1]) for n in os.listdir(their_venv["marks"])]
    assert len(stayed) >= 2, stayed  # Debian's python3 may run a venv's .pth twice
    assert _still_alive(stayed) == []


def test_run_contained_ends_the_whole_session_at_its_deadline() -> None:
    """The helper itself, as this user: a child that never answers is stopped at the
    deadline with everything it started, in its group or in another of its session; it
    gets no terminal, stdin is /dev/null and only the environment given."""
    from numabind.check._isolated import contained_env, run_contained

    script = (
        "import os, sys, time\n"
        "try:\n    os.open('/dev/tty', os.O_RDWR)\nexcept OSError as e:\n"
        "    print('tty', e.errno)\n"
        "print('stdin', os.readlink('/proc/self/fd/0'))\n"
        "print('env', sorted(os.environ))\n"
        "print('session', os.getsid(0) == os.getpid(), flush=True)\n"
        "for g in (0, 1):\n"
        "    if os.fork() == 0:\n"
        "        if g: os.setpgid(0, 0)\n"
        "        print('child', os.getpid(), flush=True)\n"
        "        time.sleep(600)\n"
        "print('x' * 100000, file=sys.stderr, flush=True)\n"
        "time.sleep(600)\n"
    )
    began = time.monotonic()
    ran = run_contained(
        [sys.executable, "-S", "-c", script],
        env=contained_env("/nonexistent", {"NUMABIND_RAY": "0"}),
        timeout=5.0,  # room for a loaded machine to start it and fork twice
        cap=4096,
    )
    took = time.monotonic() - began
    lines = ran.stdout.decode().splitlines()
    assert ran.returncode is None and took < 5.0 + 5.0, (ran, took)
    assert lines[:4] == [
        f"tty {errno.ENXIO}",
        "stdin /dev/null",
        "env ['HOME', 'LANG', 'LC_ALL', 'NUMABIND_RAY', 'PATH']",
        "session True",
    ], lines
    assert ran.stderr == b"x" * 4096  # the cap: the rest was read and dropped
    children = [int(line.split()[1]) for line in lines if line.startswith("child ")]
    assert len(children) == 2 and ran.killed == 3, (children, ran.killed)
    assert _still_alive(children) == []


def test_run_contained_returns_once_the_leader_answered() -> None:
    """A child that answers and exits while what it started still holds its stdout (the
    case where ``subprocess.run`` waits for the pipe to close, up to its timeout): the
    answer is read, the holder is killed, and the call returns at once."""
    from numabind.check._isolated import contained_env, run_contained

    began = time.monotonic()
    ran = run_contained(
        ["/bin/sh", "-c", "echo answer; sleep 600 & echo $!"],
        env=contained_env(None, {}),
        timeout=60.0,
        cap=4096,
    )
    took = time.monotonic() - began
    answer, holder = ran.stdout.decode().split()
    assert (answer, ran.returncode, ran.killed) == ("answer", 0, 1), ran
    assert took < 30, took  # at once, never the timeout
    assert _still_alive([int(holder)]) == []


def test_contained_env_carries_only_numabinds_settings() -> None:
    from numabind.check._isolated import SAFE_PATH, contained_env

    assert contained_env(None, {}) == {"PATH": SAFE_PATH, "LANG": "C", "LC_ALL": "C", "HOME": "/"}
    with pytest.raises(ValueError, match="LD_PRELOAD"):
        contained_env("/home/u", {"LD_PRELOAD": "/tmp/x.so"})


# --- also noticed: the isolated collector and a distribution's Python -------------------------

DEBIAN_PYTHON = "/usr/bin/python3"


@pytest.mark.skipif(not os.path.exists(DEBIAN_PYTHON), reason="needs the system's python3")
def test_the_collector_finds_numabind_in_a_system_python_venv(tmp_path: Path) -> None:
    """On a50e42a, ``check --job --python V`` with V a venv made from Debian's or Ubuntu's
    /usr/bin/python3 answered "numabind is not installed" on every node: under ``-S``
    site never ran, sys.prefix stayed /usr, and the default scheme there (Debian's
    posix_local) put the venv's packages under ``V/local/lib/python3.X/dist-packages``.
    The collector now reads the venv's own scheme.  Played as the step runs on a node:
    the node's /bin/sh check, then the isolated interpreter, a root-owned venv with
    numabind by a path ``.pth`` (as an editable install has)."""
    import sysconfig

    from numabind.check import _job
    from numabind.cli._job import Collector, collector_argv

    venv = tmp_path / "venv"
    tmp_path.chmod(0o755)
    subprocess.run([DEBIAN_PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    Path(site, "numabind-src.pth").write_text(f"{readable_src()}\n")
    default = subprocess.run(
        [python, "-I", "-S", "-c", "import sysconfig; print(sysconfig.get_default_scheme())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    print(f"\n{DEBIAN_PYTHON}'s default scheme under -I -S: {default} ({sysconfig.get_platform()})")
    argv = collector_argv("4711", 0, 10, Collector(python=python))
    env = clean_env(SLURMD_NODENAME="nodea", NUMABIND="off")
    p = subprocess.run(argv, capture_output=True, text=True, cwd="/", env=env, timeout=120)
    row = _job.parse_node(p.stdout, "nodea")
    assert row.state == "answered", (row, p.stderr)
    # and include-system-site-packages: the base's own directories, never the venv's "local"
    cfg = venv / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace("= false", "= true"))
    boot = subprocess.run(
        [python, "-I", "-S", "-c", _SITE_DIRS], capture_output=True, text=True, cwd="/", timeout=60
    )
    dirs = json.loads(boot.stdout)
    assert dirs[0] == site and all(not d.startswith(f"{venv}/local") for d in dirs), dirs
    assert any(d.startswith("/usr/") for d in dirs[1:]), dirs


def _site_dirs_source() -> str:
    from numabind.check._isolated import BOOT

    body = BOOT[BOOT.index("def site_dirs():") : BOOT.index("def find(")]
    return f"import os as _os, sys, json\n{body}\nprint(json.dumps(site_dirs()))\n"


_SITE_DIRS = _site_dirs_source()
