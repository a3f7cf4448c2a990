"""Starting numabind in another interpreter without running anyone else's code there.

``check --job`` starts a collector as root on every node of a job, ``doctor`` starts the
interpreter a launcher will use.  Whatever that interpreter would import or execute on
its way to numabind runs with the starter's privileges, so the rule is the one setuid
programs follow (docs/security.rst):

* **Only the installation's own code.**  :func:`boot_argv` starts ``python -I -S -B -c
  BOOT``: no current or script directory on ``sys.path`` (``-I``), no ``PYTHON*``
  variable, no user site, no ``.pth`` file of any site directory (``-S``: ``-I`` alone
  still runs them), nothing written.  :data:`BOOT` then checks (before it imports
  anything but what the interpreter's own start did) that the interpreter, its standard
  library and numabind's package can be changed by nobody but root or the user it runs
  as, and loads ``numabind`` from that one directory without putting it on ``sys.path``:
  ``import json`` finds the standard library's, and nothing else of the site directory
  is importable.  Settings travel as arguments (``-I`` drops the environment's
  redirections on purpose).
* **Checked before it runs.**  :data:`NODE_CHECK` (POSIX ``sh`` and ``stat``, the only
  programs trusted on a node) checks the interpreter path on each node before it is
  executed there; :func:`interpreter_problem` does the same here.
* **Never more privilege than the writer has.**  :func:`writers` says which uids could
  change what would run; a caller runs it as that uid (``doctor``) or refuses with one
  line (``check --job``).

:data:`TRUST` is the rule itself, as source: :data:`BOOT` carries it into the target
interpreter (which has imported nothing of numabind yet), and this module runs the same
text, so there is one copy of it.
"""

from __future__ import annotations

import os
import sys
import time

from .._model import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Any

TREE_CAP = 10_000  # entries of a package tree looked at

# The rule, as source run here and inside BOOT (Python 3.8+, the standard library only).
TRUST = r'''
import os as _os
import stat as _stat


def loose(path, uids, strict=True, tree=False, cap=10000):
    """The first way ``path`` could be changed by a uid outside ``uids``, as
    (path, owner uid, "owned"|"writable"), or None.  Every component of the path, as
    spelled and as resolved, must be owned by one of ``uids`` and not writable by group or
    others; a sticky directory above the last component is allowed (others may not
    rename what is in it), the last component itself is not when ``strict``.  ``tree``:
    every entry below it too (at most ``cap``)."""
    spellings = [_os.path.abspath(path)]
    real = _os.path.realpath(path)
    if real != spellings[0]:
        spellings.append(real)
    for spelled in spellings:
        parts = [p for p in spelled.split("/") if p]
        prefix = ""
        for i, part in enumerate(["", *parts]):
            prefix = prefix.rstrip("/") + "/" + part if part else "/"
            found = _one(prefix, uids, strict and i == len(parts))
            if found is not None:
                return found
    if tree and _os.path.isdir(real):
        seen = 0
        for top, dirs, files in _os.walk(real):
            for name in dirs + files:
                seen += 1
                if seen > cap:
                    return (top, -1, "too many files")
                p = _os.path.join(top, name)
                found = _one(p, uids, True)
                if found is None and _os.path.islink(p):
                    found = loose(p, uids, True, False, cap)
                if found is not None:
                    return found
    return None


def _one(path, uids, strict):
    try:
        st = _os.lstat(path)
    except OSError as err:
        return (path, -1, "unreadable: %s" % (err.strerror,))
    if st.st_uid not in uids:
        return (path, st.st_uid, "owned")
    if _stat.S_ISLNK(st.st_mode):
        return None
    if st.st_mode & (_stat.S_IWGRP | _stat.S_IWOTH):
        if strict or not st.st_mode & _stat.S_ISVTX:
            return (path, st.st_uid, "writable")
    return None


def say(found):
    path, uid, how = found
    if how == "owned":
        return "%s is owned by uid %d" % (path, uid)
    if how == "writable":
        return "%s is writable by group or others" % (path,)
    return "%s: %s" % (path, how)
'''
_rule: dict[str, Any] = {}
exec(compile(TRUST, "numabind.check._isolated.TRUST", "exec"), _rule)  # our own text, once


def loose(
    path: str, uids: Iterable[int], strict: bool = True, tree: bool = False
) -> tuple[str, int, str] | None:
    """See :data:`TRUST`: the first way ``path`` could be changed by a uid outside
    ``uids`` (path, its owner, ``owned`` or ``writable``), or None."""
    found: tuple[str, int, str] | None = _rule["loose"](path, set(uids), strict, tree, TREE_CAP)
    return found


def say(found: tuple[str, int, str]) -> str:
    text: str = _rule["say"](found)
    return text


# Runs in the target interpreter: python -I -S -B -c BOOT MODE ROOT ARGS...  MODE is
# "collector" (a refusal is a node record saying so, for the job report) or "plain" (one
# line on stderr, exit status 126); ROOT is the directory holding the numabind package,
# or "" to find it in that interpreter's own site directory (without running its .pth
# files: their path lines are read as text).
BOOT = (
    r"""
import sys
MODE, ROOT, ARGS = sys.argv[1], sys.argv[2], sys.argv[3:]
"""
    + TRUST
    + r"""

def refuse(why):
    if MODE == "collector":
        import json, socket
        host = _os.environ.get("SLURMD_NODENAME") or socket.gethostname()
        record = {"schema": "numabind-node/1", "host": host, "refused": why}
        sys.stdout.write(json.dumps(record) + "\n")
        sys.exit(0)
    sys.stderr.write("numabind: not run: %s\n" % why)
    sys.exit(126)


def site_dirs():
    # -S: site never ran, so sys.prefix is the base's, and a distribution's default
    # scheme (Debian's posix_local: /usr/local/lib/python3.X/dist-packages) is not the
    # venv's layout: a venv's directories are its own scheme's ("venv", 3.11+; the POSIX
    # prefix layout before), and its base's only with include-system-site-packages
    import sysconfig
    names = sysconfig.get_scheme_names()
    exe = _os.path.abspath(sys.executable)
    venv = _os.path.dirname(_os.path.dirname(exe))
    cfg = _os.path.join(venv, "pyvenv.cfg")
    out = []
    base = True
    if _os.path.isfile(cfg):
        scheme = [n for n in ("venv", "posix_prefix") if n in names][:1]
        paths = sysconfig.get_paths(*scheme, vars={"base": venv, "platbase": venv})
        out += [paths["purelib"], paths["platlib"]]
        base = False
        with open(cfg, "rb") as f:
            for line in f.read(65536).decode("utf-8", "replace").splitlines():
                key, sep, value = line.partition("=")
                if sep and key.strip().lower() == "include-system-site-packages":
                    base = value.strip().lower() == "true"
    if base:
        paths = sysconfig.get_paths()
        out += [paths["purelib"], paths["platlib"]]
        if "deb_system" in names:  # Debian's own packages (apt), /usr/lib/python3/dist-packages
            paths = sysconfig.get_paths("deb_system")
            out += [paths["purelib"], paths["platlib"]]
    return list(dict.fromkeys(out))


def find(uids):
    for site in site_dirs():
        if _os.path.isfile(_os.path.join(site, "numabind", "__init__.py")):
            return site
        try:
            names = sorted(n for n in _os.listdir(site) if n.endswith(".pth"))[:500]
        except OSError:
            continue
        for name in names:
            pth = _os.path.join(site, name)
            try:
                with open(pth, "rb") as f:
                    lines = f.read(65536).decode("utf-8", "replace").splitlines()
            except OSError:
                continue
            for line in lines:
                line = line.strip()
                if not line or line.startswith(("#", "import ", "import\t")):
                    continue
                where = _os.path.join(site, line)
                if _os.path.isfile(_os.path.join(where, "numabind", "__init__.py")):
                    found = loose(pth, uids)
                    if found is not None:
                        refuse(say(found) + ": it names where numabind is")
                    return where
    refuse("numabind is not installed for %s" % (sys.executable,))


uids = {0, _os.geteuid()}
for path in [sys.executable] + [p for p in sys.path if _os.path.exists(p)]:
    found = loose(path, uids)
    if found is not None:
        refuse(say(found) + ": the interpreter is not run with these privileges")
root = ROOT or find(uids)
found = loose(_os.path.join(root, "numabind"), uids, tree=True)
if found is not None:
    refuse(say(found) + ": numabind there is not run with these privileges")
# the startup modules beside the package (numabind imports them), from their source: a
# cached .pyc beside them is not looked at, so only the checked file runs
for top in ("_numabind_base", "_numabind_start"):  # _numabind_base.MODULES
    path = _os.path.join(root, top + ".py")
    found = loose(path, uids)
    if found is not None:
        refuse(say(found) + ": numabind's startup module is not run with these privileges")
    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    module = type(sys)(top)
    module.__file__ = path
    sys.modules[top] = module
    exec(code, module.__dict__)
import importlib.machinery, importlib.util
spec = importlib.machinery.PathFinder.find_spec("numabind", [root])
if spec is None or spec.loader is None:
    refuse("no numabind package in %s" % (root,))
module = importlib.util.module_from_spec(spec)
sys.modules["numabind"] = module
spec.loader.exec_module(module)
from numabind.cli import main
sys.exit(main(ARGS))
"""
)


def install_root() -> str:
    """The directory that holds this numabind package (site-packages, or the checkout's
    ``src`` for an editable install)."""
    here = os.path.abspath(__file__)  # <root>/numabind/check/_isolated.py
    return os.path.dirname(os.path.dirname(os.path.dirname(here)))


def boot_argv(python: str, args: list[str], root: str = "", mode: str = "plain") -> list[str]:
    """``python`` starting numabind's command line ``args`` as described above."""
    return [python, "-I", "-S", "-B", "-c", BOOT, mode, root, *args]


def isolated_env(environ: dict[str, str]) -> dict[str, str]:
    """An environment for such an interpreter: no ``PYTHON*`` variable (``-I`` ignores
    them; a child it starts would not) and no ``NUMABIND_*`` setting but the switch
    that keeps it unbound and the collector's marker."""
    keep = ("NUMABIND", "NUMABIND_COLLECTOR")
    return {
        k: v
        for k, v in environ.items()
        if not k.startswith("PYTHON") and (not k.startswith("NUMABIND") or k in keep)
    }


def interpreter_paths(python: str) -> list[str]:
    """What starting ``python`` executes or reads before any code of its own runs: the
    path as given and resolved, its venv's ``pyvenv.cfg`` (its ``home`` decides where
    the standard library is), and the standard library directories of its base, told
    from the files alone (nothing is run)."""
    real = os.path.realpath(python)
    out = [python, real]
    homes = [os.path.dirname(real)]
    venv = os.path.dirname(os.path.dirname(os.path.abspath(python)))
    cfg = os.path.join(venv, "pyvenv.cfg")
    if os.path.isfile(cfg):
        out.append(cfg)
        try:
            with open(cfg, "rb") as f:
                for line in f.read(65536).decode("utf-8", "replace").splitlines():
                    key, sep, value = line.partition("=")
                    if sep and key.strip() == "home" and value.strip():
                        homes.append(value.strip())
        except OSError:
            pass
    for home in dict.fromkeys(homes):
        out.append(home)
        lib = os.path.join(os.path.dirname(home), "lib")
        if os.path.isdir(lib):
            out.append(lib)
            try:
                names = sorted(n for n in os.listdir(lib) if n.startswith("python3"))[:16]
            except OSError:
                names = []
            out += [os.path.join(lib, n) for n in names]
    return list(dict.fromkeys(out))


def interpreter_problem(python: str, uids: Iterable[int]) -> str | None:
    """Why starting ``python`` would run what a uid outside ``uids`` may change, or None
    (:func:`interpreter_paths`, each by the rule of :data:`TRUST`)."""
    for path in interpreter_paths(python):
        found = loose(path, uids)
        if found is not None:
            return say(found)
    return None


def writers(paths: Iterable[str], uids: Iterable[int]) -> tuple[set[int], list[str]]:
    """Which uids outside ``uids`` own something in ``paths`` (each with its chain), and
    why each path failed; a path writable by group or others, or unreadable, gives uid
    -1 (no single uid to run it as)."""
    owners: set[int] = set()
    why: list[str] = []
    allowed = set(uids)
    for path in paths:
        for _ in range(64):  # each owner in turn: a venv of one user in a folder of another
            found = loose(path, allowed | owners)
            if found is None:
                break
            why.append(say(found))
            if found[2] != "owned":
                owners.add(-1)
                break
            owners.add(found[1])
    return owners, why


# --- running code as another user -----------------------------------------------------------

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SESSION_ROUNDS = 16  # sweeps of /proc for what is left of a probe's session
DRAIN_SECONDS = 1.0  # what a probe's session still writes once its leader has exited


class Ran(Record):
    """What a contained child said: its exit status (None: still running at the
    deadline, killed), stdout and stderr (each up to the cap), and how many processes of
    its session were still alive to be killed once it had answered or timed out."""

    returncode: int | None
    stdout: bytes
    stderr: bytes
    killed: int


def contained_env(home: str | None, numabind: Mapping[str, str]) -> dict[str, str]:
    """The whole environment of code run as another user: a fixed PATH, the C locale, the
    user's own HOME, and the ``NUMABIND*`` settings the caller names (``numabind``);
    nothing else of the caller's (a secret of root's, ``LD_*``, ``PYTHON*``, a
    ``SSH_AUTH_SOCK``, a terminal's name)."""
    env = {"PATH": SAFE_PATH, "LANG": "C", "LC_ALL": "C", "HOME": home or "/"}
    for key, value in numabind.items():
        if not key.startswith("NUMABIND"):
            raise ValueError(f"{key}: only numabind's own settings travel to another user")
        env[key] = value
    return env


def run_contained(
    argv: list[str],
    *,
    env: Mapping[str, str],
    timeout: float,
    cap: int,
    uid: int | None = None,
    gid: int | None = None,
) -> Ran:
    """Run ``argv`` the way every program numabind starts for someone else is run (one
    home for the rule, docs/security.rst): in a session of its own (``setsid`` happens in
    the child before its groups, gid and uid are dropped, so it has no controlling
    terminal: ``/dev/tty`` is ENXIO and no ``TIOCSTI`` reaches the caller's terminal),
    stdin ``/dev/null``, no inherited descriptor, from ``/``, with ``env`` as its whole
    environment (:func:`contained_env` where ``uid`` is another user), as ``uid``/``gid``
    with no supplementary group when given.  Its output is read, up to ``cap`` bytes per
    stream (the rest is read and dropped), until it exits or ``timeout`` passes; then
    every process still in its session (a grandchild it left behind, in its group or in
    another group of the session) is killed, before the leader is reaped, so that the
    session's id names nobody else's process.  OSError where it cannot be started."""
    import selectors
    import signal
    import subprocess

    drop: dict[str, Any] = {}
    if uid is not None:
        drop = {"user": uid, "group": uid if gid is None else gid, "extra_groups": []}
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd="/",
        close_fds=True,
        start_new_session=True,
        **drop,
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    kept = {out: bytearray(), err: bytearray()}
    end = time.monotonic() + timeout
    ended: bool | None = None  # None: running; then whether it had exited (False: killed)
    killed = 0
    with selectors.DefaultSelector() as sel:
        for fd in kept:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            now = time.monotonic()
            if ended is None and (now >= end or _exited(proc.pid)):
                ended = _exited(proc.pid)
                killed = end_session(proc.pid)
                end = now + DRAIN_SECONDS  # what is already in the pipes
            elif ended is not None and now >= end:
                break  # a writer that left the session: not waited for
            for key, _ in sel.select(max(min(end - now, 0.05), 0)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                buf = kept[key.fd]
                buf += chunk[: max(cap - len(buf), 0)]
    while ended is None:  # both pipes closed before it exited
        if _exited(proc.pid) or time.monotonic() >= end:
            ended = _exited(proc.pid)
            killed = end_session(proc.pid)
        else:
            time.sleep(0.02)
    if not ended:
        os.kill(proc.pid, signal.SIGKILL)  # the leader itself, whatever the sweep found
    proc.stdout.close()
    proc.stderr.close()
    code = proc.wait()
    return Ran(
        returncode=code if ended else None,
        stdout=bytes(kept[out]),
        stderr=bytes(kept[err]),
        killed=killed,
    )


def _exited(pid: int) -> bool:
    """Whether child ``pid`` has exited, leaving it unreaped (a zombie keeps its pid, and
    so its session's id, from being given to another process)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def session_members(sid: int) -> list[int]:
    """The live processes (not zombies) of session ``sid``, from ``/proc/PID/stat``."""
    out = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if name.isdigit() and _session_of(int(name)) == sid:
            out.append(int(name))
    return out


def _session_of(pid: int) -> int | None:
    """The session of live process ``pid`` (None: gone, a zombie, or unreadable)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read(4096)
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()
    if len(fields) < 4 or fields[0] in (b"Z", b"X"):
        return None
    return int(fields[3])


def end_session(sid: int) -> int:
    """Kill (SIGKILL) every live process of session ``sid``, its process group and any
    other group in it, sweeping until none is left (one that forks meanwhile is caught
    by the next sweep); how many were killed.  Each is signalled through a pidfd opened
    before its session is read again, so a pid reused meanwhile is never signalled."""
    import errno
    import signal

    seen: set[int] = set()
    for _ in range(SESSION_ROUNDS):
        members = session_members(sid)
        try:
            os.killpg(sid, signal.SIGKILL)
        except OSError:
            pass
        if not members:
            break
        seen.update(members)
        for pid in members:
            try:
                fd = os.pidfd_open(pid)
            except OSError as err:
                if err.errno == errno.ENOSYS and _session_of(pid) == sid:  # Linux < 5.3
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except OSError:
                        pass
                continue
            try:
                if _session_of(pid) == sid:
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
            except OSError:
                pass
            finally:
                os.close(fd)
        time.sleep(0.01)
    return len(seen)


def running_python() -> str:
    """This interpreter (``sys.executable``; ``python3`` on PATH where it is empty)."""
    return sys.executable or "python3"


# Runs on each node before the interpreter does: sh -c NODE_CHECK numabind PYTHON ARGS...
# Only POSIX sh, id, stat, readlink, dirname, sed and tr, which belong to the node's own
# system.  Every component of PYTHON (as given and resolved), its venv's pyvenv.cfg and
# the standard library directories beside its base must be owned by root or the user it
# runs as and not writable by group or others (a sticky directory above excepted); else
# one node record saying why (the report's row), and nothing is run.
NODE_CHECK = r"""
py=$1; shift
me=$(id -u)
host=${SLURMD_NODENAME:-$(hostname 2>/dev/null)}
case $host in ''|*[!A-Za-z0-9._-]*) host=unknown ;; esac
refuse() {
    why=$(printf '%s' "$1" | tr -c 'A-Za-z0-9 ._/+:,()=-' '?')
    printf '{"schema":"numabind-node/1","host":"%s","refused":"%s"}\n' "$host" "$why"
    exit 0
}
look() {  # $1 path, $2 1: it may not be group/other-writable even when sticky
    info=$(stat -c '%u %a %F' -- "$1" 2>/dev/null) || refuse "$1 cannot be examined"
    set -- "$1" "$2" $info
    [ "$3" = 0 ] || [ "$3" = "$me" ] || refuse "$1 is owned by uid $3: not run as uid $me"
    [ "$5" = symbolic ] && return 0
    if [ $(( 0$4 & 022 )) -ne 0 ]; then
        if [ "$2" = 1 ] || [ $(( 0$4 & 01000 )) -eq 0 ]; then
            refuse "$1 is writable by group or others: not run as uid $me"
        fi
    fi
}
walk() {
    p=$1; last=1
    while :; do
        look "$p" $last
        [ "$p" = / ] && return 0
        p=$(dirname -- "$p"); last=0
    done
}
stdlib() {  # the standard library beside a bin directory
    base=$(dirname -- "$1")
    for d in "$base/lib" "$base"/lib/python3*; do
        [ -d "$d" ] && walk "$d"
    done
    return 0
}
case $py in /*) ;; *) refuse "the interpreter $py is not an absolute path" ;; esac
[ -x "$py" ] || refuse "there is no interpreter $py on this node"
walk "$py"
real=$(readlink -f -- "$py") || refuse "$py cannot be resolved"
walk "$real"
stdlib "$(dirname -- "$real")"
venv=$(dirname -- "$(dirname -- "$py")")
if [ -f "$venv/pyvenv.cfg" ]; then
    walk "$venv/pyvenv.cfg"
    home=$(sed -n 's/^home *= *//p' "$venv/pyvenv.cfg" | head -n 1)
    if [ -n "$home" ]; then
        walk "$home"
        stdlib "$home"
    fi
fi
exec "$py" "$@"
"""
