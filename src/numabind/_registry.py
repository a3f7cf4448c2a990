"""Processes numabind bound register themselves, so ``numabind check --all`` finds them.

/proc/PID/environ holds only a process's *initial* environment: a Callable child whose rank
arrived later (torch.multiprocessing.spawn, elastic_launch) is invisible there.  So every
process numabind binds writes one small file describing its plan.

The registry lives in shared places (``/dev/shm``) and is written by root ranks, so it is
built like setuid code (threat model in docs/security.rst):

* **Per-user directories.**  Entries of uid U go in ``<base>/numabind-U`` (``base`` is
  ``NUMABIND_REGISTRY`` or ``/dev/shm``), a directory U creates with mode 0700.  A writer
  uses it only if ``fstat`` says U owns it and nobody else may write it; a squatted one
  (another owner, a link, a file) is never written into: the writer falls back to
  ``$XDG_RUNTIME_DIR/numabind`` under the same rules, or skips registration, quietly (one
  line in verbose mode; ``check`` says registrations may be missing).  The base itself
  must be owned by root or U, and sticky if others may write it.
* **Writes that cannot be redirected.**  Every open is relative to a directory descriptor,
  with ``O_NOFOLLOW|O_NONBLOCK``; an entry is written to a fresh unpredictable name with
  ``O_CREAT|O_EXCL``, checked with ``fstat`` and renamed into place (atomic).  A planted
  symlink or FIFO is never opened.
* **Readers that trust nothing** (:mod:`numabind._registry_read`, which the startup hook
  never loads).  Root's ``check --all`` reads every user's directory
  (the admin's audit); a user reads their own.  An entry is trusted only if its file is
  owned by the uid of the process it describes (or by root), the process is alive with
  the recorded start time, and every field parses within bounds.  Anything else is
  ignored and counted (malformed, foreign, stale, special): never a traceback, never a
  hang, never a change of ``check``'s exit status.
* **No pile-up.**  A process removes its entry at exit; readers prune stale ones in
  directories they may write.
"""

from __future__ import annotations

import os
import stat

from . import _sysfs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

DEFAULT_BASE = "/dev/shm"
PREFIX = "numabind-"
ENTRY_CAP = 4096  # bytes of one entry
DIR_CAP = 1 << 16  # entries looked at per directory, directories per base
FIELDS = (
    "pid",
    "start",
    "local_rank",
    "rank_source",
    "local_world_size",
    "device",
    "device_index",
    "numa_node",
    "cpus",
    "memory_policy",
    "memory_nodes",
    "mode",
    "reason",
    "threads",
    "thread_env",
)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_registered: dict[str, object] = {}  # what this process wrote: path, pid


def base_dir(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return env.get("NUMABIND_REGISTRY") or DEFAULT_BASE


def start_time(pid: int) -> str | None:
    text = _sysfs.read_opt(f"/proc/{pid}/stat", 4096)
    if text is None:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    fields = text.rsplit(")", 1)[-1].split()
    return fields[19] if len(fields) > 19 else None


def process_uids(pid: int) -> set[int] | None:
    """The real and effective uid of a live process, None if it is gone."""
    text = _sysfs.read_opt(f"/proc/{pid}/status", 16384)
    if text is None:
        return None
    for line in text.splitlines():
        if line.startswith("Uid:"):
            ids = line.split()[1:3]
            return {int(x) for x in ids if x.isdigit()}
    return None


def process_state(pid: int) -> str | None:
    """The one-letter state of a process (``Z`` zombie, ``X`` dead), None if gone."""
    text = _sysfs.read_opt(f"/proc/{pid}/stat", 4096)
    if text is None:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return fields[0] if fields else None


# --- directories -----------------------------------------------------------------------------


def _base_ok(fd: int, uid: int) -> str | None:
    """None if a per-user directory may be created in this base, else why not."""
    st = os.fstat(fd)
    if st.st_uid not in (0, uid):
        return f"owned by uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return "writable by others without the sticky bit"
    return None


def private_dir(parent_fd: int, name: str, uid: int, create: bool) -> tuple[int | None, str | None]:
    """Open (creating with mode 0700 when asked) a directory ``name`` under ``parent_fd``
    that ``uid`` owns and nobody else may write; (fd, None) or (None, why not)."""
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=parent_fd)
        except FileExistsError:
            pass
        except OSError as err:
            return None, f"cannot be created ({err.strerror})"
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError as err:
        return None, f"cannot be opened ({err.strerror}; a link or not a directory)"
    st = os.fstat(fd)
    if st.st_uid != uid:
        os.close(fd)
        return None, f"is owned by uid {st.st_uid}, not {uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        if uid == os.geteuid():
            os.fchmod(fd, 0o700)  # ours, but loosened: tighten it
        else:
            os.close(fd)
            return None, "is writable by others"
    return fd, None


def candidates(environ: Mapping[str, str], uid: int) -> Iterator[tuple[str, str, str]]:
    """(parent directory, name, label) where uid's registry may live, best first: the
    shared base, then the user's runtime directory ($XDG_RUNTIME_DIR for this process's
    own uid, /run/user/UID for others, as systemd makes it)."""
    base = base_dir(environ)
    yield base, f"{PREFIX}{uid}", f"{base.rstrip('/')}/{PREFIX}{uid}"
    xdg = environ.get("XDG_RUNTIME_DIR", "") if uid == os.geteuid() else f"/run/user/{uid}"
    if xdg.startswith("/") and len(xdg) < 4096:
        yield xdg, "numabind", f"{xdg.rstrip('/')}/numabind"


def _open_user_dir(
    environ: Mapping[str, str], uid: int, create: bool
) -> tuple[int | None, str | None, list[str]]:
    """The first usable registry directory of ``uid``: (fd, its path, why others failed)."""
    why: list[str] = []
    for parent, name, label in candidates(environ, uid):
        try:
            pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            why.append(f"{parent} cannot be opened ({err.strerror})")
            continue
        try:
            if parent != base_dir(environ):
                st = os.fstat(pfd)  # XDG_RUNTIME_DIR must be uid's own, private
                if st.st_uid != uid or st.st_mode & 0o077:
                    why.append(f"{parent} is not a private directory of uid {uid}")
                    continue
            else:
                bad = _base_ok(pfd, uid)
                if bad:
                    why.append(f"{parent} is {bad}")
                    continue
            fd, bad = private_dir(pfd, name, uid, create)
            if fd is not None:
                return fd, label, why
            why.append(f"{label} {bad}")
        finally:
            os.close(pfd)
    return None, None, why


# --- writing ---------------------------------------------------------------------------------


def _encode(entry: Mapping[str, str]) -> bytes:
    lines = []
    for k in FIELDS:
        v = _sysfs.clean_line(str(entry.get(k, "")), 1000).replace("=", " ")
        lines.append(f"{k}={v}\n")
    return "".join(lines).encode("utf-8", "replace")


def register(
    entry: Mapping[str, str], environ: Mapping[str, str] | None = None
) -> tuple[str | None, str | None]:
    """Record this process's plan.  Returns (the file written, None) or (None, why it was
    not written); never raises (a read-only or absent /dev/shm must not matter to a rank)."""
    env = os.environ if environ is None else environ
    pid = os.getpid()
    uid = os.geteuid()
    try:
        fd, label, why = _open_user_dir(env, uid, create=True)
    except OSError as err:
        return None, f"registry unusable ({err.strerror or err})"
    if fd is None:
        return None, "not registered for numabind check: " + "; ".join(why)
    try:
        tmp = f".{pid}.{os.urandom(8).hex()}"
        wfd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o600,
            dir_fd=fd,
        )
        try:
            st = os.fstat(wfd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                return None, "registry entry could not be created safely"
            data = _encode(entry)
            while data:
                data = data[os.write(wfd, data) :]
        finally:
            os.close(wfd)
        os.rename(tmp, str(pid), src_dir_fd=fd, dst_dir_fd=fd)
    except OSError as err:
        try:
            os.unlink(tmp, dir_fd=fd)
        except (OSError, UnboundLocalError):
            pass
        return None, f"registry entry not written ({err.strerror or err})"
    finally:
        os.close(fd)
    path = f"{label}/{pid}"
    if not _registered:
        import atexit

        atexit.register(_unregister_at_exit)
    _registered.update(path=path, pid=pid, label=label)
    return path, None


def _unregister_at_exit() -> None:
    # a fork child that exits normally runs its parent's atexit handlers: not its entry
    if _registered.get("pid") == os.getpid():
        unregister()


def unregister() -> None:
    """Remove this process's entry (at exit, or when its binding is restored)."""
    label, pid = _registered.get("label"), _registered.get("pid")
    if not isinstance(label, str) or pid != os.getpid():
        return
    parent, _, name = label.rpartition("/")
    try:
        pfd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        fd, _ = private_dir(pfd, name, os.geteuid(), create=False)
        if fd is not None:
            try:
                os.unlink(str(pid), dir_fd=fd)
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        os.close(pfd)
    _registered.clear()
