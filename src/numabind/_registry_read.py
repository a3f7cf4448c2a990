"""Reading the registry back (``numabind check``, ``check --all``): every entry is input.

Entries are written by :mod:`numabind._registry` (where they live, and why a writer can
never be redirected); this is the other half, kept apart so that a rank's startup path,
which only writes, loads none of it.  An entry is trusted only if its file is a regular
file owned by the uid of the process it describes (or by root), the process is alive with
the recorded start time, and every field parses within bounds; anything else is ignored
and counted, and stale entries are pruned in directories the reader may write.
"""

from __future__ import annotations

import os
import stat

from . import _sysfs
from ._registry import (
    DIR_CAP,
    ENTRY_CAP,
    FIELDS,
    PREFIX,
    base_dir,
    candidates,
    private_dir,
    process_uids,
    start_time,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

_POLICIES = frozenset(
    {"preferred", "preferred-many", "bind", "interleave", "local", "none", "not-permitted"}
)


class Scan:
    """What a reader found: trusted entries by pid, and counts of what it ignored."""

    def __init__(self) -> None:
        self.entries: dict[int, dict[str, str]] = {}
        self.ignored: dict[str, int] = {}
        self.notes: list[str] = []

    def ignore(self, why: str) -> None:
        self.ignored[why] = self.ignored.get(why, 0) + 1


def parse_entry(data: bytes) -> dict[str, str] | None:
    """An entry's fields, each within bounds; None if anything is off."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or key in out:
            return None
        if key in FIELDS:  # fields of a newer numabind are ignored, not fatal
            out[key] = value
    pid = out.get("pid", "")
    if not (pid.isascii() and pid.isdigit()) or len(pid) > 10:
        return None
    for key in ("start", "local_rank", "local_world_size", "device_index", "numa_node", "threads"):
        v = out.get(key, "")
        if v and not (v.isascii() and v.isdigit() and len(v) < 20):
            return None
    try:
        _sysfs.parse_cpulist(out.get("cpus", ""))
        _sysfs.parse_nodelist(out.get("memory_nodes", ""))
    except ValueError:
        return None
    if out.get("memory_policy", "none") not in _POLICIES:
        return None
    return out


def _read_dir(fd: int, owner: int, scan: Scan, prune: bool, want: int | None = None) -> None:
    try:
        names, cut = _sysfs.entries(fd, DIR_CAP)
    except OSError:
        scan.ignore("unreadable directory")
        return
    if cut:
        scan.notes.append(f"more than {DIR_CAP} entries in one directory; the rest ignored")
    for name in names:
        if want is not None and name != str(want):
            continue
        if not (name.isascii() and name.isdigit() and len(name) < 11):
            scan.ignore("temporary" if name.startswith(".") else "special")
            continue
        pid = int(name)
        try:
            efd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd
            )
        except OSError:
            scan.ignore("special")  # a link, a socket, gone
            continue
        try:
            st = os.fstat(efd)
            if not stat.S_ISREG(st.st_mode):
                scan.ignore("special")
                continue
            if st.st_uid not in (owner, 0):
                scan.ignore("foreign")
                continue
            try:
                data = _sysfs.read_fd(efd, name, ENTRY_CAP)
            except OSError:
                scan.ignore("malformed")
                continue
        finally:
            os.close(efd)
        entry = parse_entry(data)
        if entry is None or entry["pid"] != name:
            scan.ignore("malformed")
            if prune and process_uids(pid) is None:
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
            continue
        uids = process_uids(pid)
        if uids is None or start_time(pid) != entry.get("start"):
            scan.ignore("stale")
            if prune:
                try:
                    os.unlink(name, dir_fd=fd)
                except OSError:
                    pass
            continue
        if st.st_uid != 0 and st.st_uid not in uids:
            scan.ignore("foreign")  # uid U may describe only U's own processes
            continue
        scan.entries[pid] = entry


def _registry_uids(environ: Mapping[str, str]) -> list[int]:
    """Every uid with a registry directory (root's audit): names in the base and in
    /run/user, bounded."""
    found: set[int] = {0}
    for name in _sysfs.listdir(base_dir(environ), DIR_CAP):
        rest = name[len(PREFIX) :]
        if name.startswith(PREFIX) and rest.isascii() and rest.isdigit() and len(rest) < 11:
            found.add(int(rest))
    for name in _sysfs.listdir("/run/user", DIR_CAP):
        if name.isascii() and name.isdigit() and len(name) < 11:
            found.add(int(name))
    return sorted(found)


def scan(
    environ: Mapping[str, str] | None = None,
    *,
    all_users: bool = False,
    uids: list[int] | None = None,
    pid: int | None = None,
) -> Scan:
    """Read the registry: every user's directories as root with ``all_users``, the
    given ``uids`` (root only; others read their own), else this user's own; only pid
    ``pid``'s entry when given."""
    env = os.environ if environ is None else environ
    me = os.geteuid()
    out = Scan()
    if me != 0:
        wanted = [me]
    elif uids is not None:
        wanted = sorted(set(uids))
    elif all_users:
        wanted = _registry_uids(env)
    else:
        wanted = [me]
    for uid in wanted:
        for parent, name, label in candidates(env, uid):
            try:
                pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                fd, bad = private_dir(pfd, name, uid, create=False)
            finally:
                os.close(pfd)
            if fd is None:
                if bad and "cannot be opened" not in bad:
                    out.ignore("squatted directory")
                    if uid == me:
                        out.notes.append(
                            f"{label} {bad}: registrations of uid {uid} may be missing"
                        )
                continue
            try:
                _read_dir(fd, uid, out, prune=me in (0, uid), want=pid)
            finally:
                os.close(fd)
    return out


def read(pid: int, environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The trusted registry entry of ``pid``, or None."""
    env = os.environ if environ is None else environ
    uids = process_uids(pid)
    if uids is None:
        return None
    return scan(env, uids=sorted(uids | {0}), pid=pid).entries.get(pid)


def registered_pids(environ: Mapping[str, str] | None = None) -> list[int]:
    """Every pid with a trusted, current entry (stale entries are pruned on the way)."""
    return sorted(scan(environ, all_users=True).entries)
