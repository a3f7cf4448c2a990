"""One reading of the machine per node, shared by its ranks: the per-user machine cache.

Every rank of a node reads the same sysfs files for the same answer, and some of them are
slow: the per-CPU frequency files that tell priority cores apart cost ~1 s on a 2x EPYC
7742, serialised across processes (hwloc#756: 32 readers at once took 31.8 s).  So the
first rank of a node that needs the machine reads it, under a lock, and writes what it
read to a per-user file; the other ranks read that file instead.  (What a rank *did* with
it is another file, the answers numabind._replay writes and the warm start replays.)

**What it holds, and for how long it is true.**  Every answer a source gave, method by
method, as numabind._facts's table says: the facts true for the boot and the expensive
ones kept, the witnessed ones kept with their witnesses, the live ones never (the
verifiers, check, doctor and show, never read this cache at all).

**The key** (``_numabind_base.machine_key``): the boot, the kernel release, the mount
namespace (a container's /sys and /proc/driver are its own), the user, the cgroup, the
sysroot and its identity, and the code (numabind's version, its files).  Any change is
another file; any witness that says otherwise, a file read again.

**The rules of the registry apply** (the one copy is in ``_numabind_base``): a per-user
directory ``<base>/numabind-cache-UID`` owned by the user, mode 0700, never opened through
a link; the file written to a fresh name and renamed into place; read only if it is a
regular file of the user's, at most ``CACHE_CAP`` bytes, whose header says this
format, whose length and checksum match, whose key is this process's and whose witnesses
hold.  Anything else is refused and the rank reads sysfs itself, silently (NUMABIND_DEBUG=1
says why).  Ranks that start at once and find no file do not all read: one takes the lock
(``flock`` on ``<file>.lock``: released when its holder dies) and reads; the others wait
at most :data:`WAIT` seconds for its file, then read themselves.  At most
:data:`MAX_FILES` machine files are kept per user (the oldest go first).

``NUMABIND_CACHE=0`` turns it off: the machine is read from sysfs, nothing is written.
"""

from __future__ import annotations

import os
import time

import _numabind_base as base

from . import _sysfs
from ._facts import BY_METHOD, RECORDS, Cached, Recording, witnesses
from ._model import Accelerator, Record
from ._sources import Source
from ._text import Tokens, decode, encode

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._topology import Machine

WAIT = 5.0  # seconds a rank waits for another rank's reading (its lock) before reading itself
MAX_FILES = 32  # machine files kept per user (a cpuset per job step, a boot each)


def _base(environ: Mapping[str, str]) -> str:
    """The base of the per-user directories: the registry's (``NUMABIND_REGISTRY`` under
    numabind's redirect rule, else /dev/shm)."""
    raw = environ.get("NUMABIND_REGISTRY")
    own = environ is os.environ
    return _sysfs.redirect("NUMABIND_REGISTRY", raw, "/dev/shm", own=own, registry=True, notes=[])


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether the cache is used (``NUMABIND_CACHE``: ``_numabind_base.cache_off``)."""
    return not base.cache_off(environ)


def render(head: list[str], memo: dict[str, dict[str, object]], extra: dict[str, object]) -> bytes:
    """The whole file: its head (``_numabind_base.machine_head``: key, witnesses), the
    record (the answers of every fact whose truth lets it be kept), framed."""
    lines = [*head, "--"]
    for method, answers in memo.items():
        for argkey, value in answers.items():
            lines.append(f"m {method} {argkey} {encode(value, RECORDS)}")
    for name, value in extra.items():
        lines.append(f"x {name} {encode(value, RECORDS)}")
    return base.frame("machine", lines)


def parse_record(
    lines: list[str],
) -> tuple[dict[str, dict[str, object]], dict[str, object]]:
    """The record part of a file's lines (:func:`render`'s; the frame, key and witnesses
    already checked): (memo, extras).  ``ValueError`` on anything out of place."""
    memo: dict[str, dict[str, object]] = {}
    extra: dict[str, object] = {}
    seen = False
    for line in lines:
        if line == "--":
            seen = True
            continue
        if not seen or not line:
            continue
        tokens = Tokens(line.split(" "))
        kind, name, arg = tokens.next(), tokens.next(), tokens.next()
        if kind == "m" and name in BY_METHOD:
            memo.setdefault(name, {})[arg] = decode(tokens, RECORDS)
        elif kind == "x":
            tokens.at -= 1  # the value starts where an answer's key would be
            extra[name] = decode(tokens, RECORDS)
        else:
            raise ValueError(f"a line of another kind: {line[:40]!r}")
        if not tokens.done:
            raise ValueError(f"a line longer than its value: {line[:40]!r}")
    if not seen:
        raise ValueError("no record")
    return memo, extra


# --- the file: read, written, locked -------------------------------------------------------------


class Lookup(Record):
    """What looking for this process's cache found: the path and the file's lines, or
    why there is none (``why``, for verbose mode and the registry entry)."""

    path: str = ""
    data: bytes = b""
    why: str = ""
    lines: tuple[str, ...] = ()  # data's, checked


def cache_name(key: str) -> str:
    """The file's name: a hash of the key (the key itself is in the file, compared whole)."""
    return f"machine-{base.checksum(key.encode('utf-8', 'replace')):016x}"


def lookup(environ: Mapping[str, str], sysroot: str) -> Lookup:
    """This process's machine file, validated: frame, key and witnesses
    (``_numabind_base``'s rules, the warm start's too)."""
    key = base.machine_key(sysroot)
    data, path, why = base.read_cache(environ, cache_name(key), _base(environ))
    if data is None:
        return Lookup(path=path, why=why)
    lines, why = base.unframe(data, "machine")
    if lines:
        _, why = base.machine_holds(lines, sysroot, base.WITNESSES_FROM["machine"], key=key)
    if why:
        return Lookup(path=path, why=f"{path} refused: {why}")
    return Lookup(path=path, data=data, lines=tuple(lines))


class _Lock:
    """``flock`` on ``<file>.lock`` in the cache directory: one reader per key at a time.
    Released when closed, and by the kernel when its holder dies."""

    def __init__(self, dir_fd: int, name: str) -> None:
        self.fd: int | None = None
        try:
            fd = os.open(
                f"{name}.lock",
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                0o600,
                dir_fd=dir_fd,
            )
        except OSError:
            return
        import stat

        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            os.close(fd)
            return
        self.fd = fd

    def take(self) -> bool:
        """Take the lock if it is free (never blocks)."""
        if self.fd is None:
            return False
        import fcntl

        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the flock
            self.fd = None


def prune(dir_fd: int, keep: str, prefix: str = "machine-") -> None:
    """At most :data:`MAX_FILES` files of ``prefix`` (and their locks) per user: the
    oldest go."""
    try:
        names = [n for n in os.listdir(dir_fd) if n.startswith(prefix) and "." not in n]
    except OSError:
        return
    if len(names) <= MAX_FILES:
        return
    aged = []
    for n in names[:4096]:
        try:
            aged.append((os.stat(n, dir_fd=dir_fd, follow_symlinks=False).st_mtime_ns, n))
        except OSError:
            continue
    for _, n in sorted(aged)[: max(len(aged) - MAX_FILES, 0)]:
        if n == keep:
            continue
        for victim in (n, f"{n}.lock"):
            try:
                os.unlink(victim, dir_fd=dir_fd)
            except OSError:
                pass


def _for_every_device(machine: Machine) -> None:
    """What a rank asked of its own device (its details, its node) or of its own CPUs
    (their core siblings), asked of every device and allowed CPU before the file is
    written: the node's other ranks ask the same of theirs, and would each read sysfs and
    write the file again (eight ranks, eight rewrites)."""
    memo = machine.source.memo if isinstance(machine.source, Recording) else {}
    detail = any(k.endswith(".1") for k in memo.get("accelerator", {}))
    locate = bool(memo.get("locate"))
    if memo.get("cpu_siblings"):  # the cores of a rank's share (reserve, SMT): every CPU's
        for cpu in sorted(machine.allowed.cpus)[: base.MAX_CPUS]:
            machine.source.cpu_siblings(cpu)
    if not (detail or locate):
        return
    source = machine.source
    # the devices this reading already knows of (the driver's list, read brief), never a
    # scan of the whole PCI bus for them (~1,400 files on a DGX)
    known = {k.rsplit(".", 1)[0] for k in memo.get("accelerator", {})}
    for listed in memo.get("accelerators", {}).values():  # a scan the plan made itself
        if isinstance(listed, tuple):
            known.update(a.pci for a in listed if isinstance(a, Accelerator))
    for bdf in sorted(known)[:256]:  # a bound of its own: the list comes from a file
        if detail:
            source.accelerator(bdf, detail=True)
        if locate:
            acc = source.accelerator(bdf)
            if acc is not None:
                source.locate(acc)


def write(environ: Mapping[str, str], sysroot: str, machine: Machine) -> str | None:
    """Write what ``machine`` (recording) read, with its witnesses; its path, or None
    when this machine cannot be cached (its cpuset unreadable, no usable directory)."""
    source = machine.source
    if not isinstance(source, Recording):
        return None
    _for_every_device(machine)
    key = base.machine_key(sysroot)
    found = witnesses(source, sysroot)
    if found is None:
        return None
    extra: dict[str, object] = {
        "warnings": tuple(source.warnings),
        "description": source.description,
    }
    if source.environ is not None:
        extra["environ"] = tuple(f"{k}={v}" for k, v in sorted(source.environ.items()))
    data = render(base.machine_head(key, found), source.memo, extra)
    if len(data) > base.CACHE_CAP:
        return None
    fd, label, _ = base.open_cache_dir(environ, True, _base(environ))
    if fd is None:
        return None
    name = cache_name(key)
    try:
        if base.write_private(fd, name, data, "machine") is not None:
            return None
        prune(fd, name)
    finally:
        os.close(fd)
    return f"{label}/{name}"


# --- the machine a rank plans from ---------------------------------------------------------------


def _live(sysroot: str) -> Source:
    from ._topology import Machine

    return Machine.from_root(sysroot).source


def from_file(
    data: bytes | tuple[str, ...], sysroot: str, environ: Mapping[str, str] | None = None
) -> Machine:
    """The machine of a cache file (its bytes, or its lines as :func:`lookup` checked them)
    (``ValueError`` when it is out of place); with ``environ``, closing it writes back what
    it had to read."""
    from ._topology import Machine

    lines, why = (list(data), "") if isinstance(data, tuple) else base.unframe(data, "machine")
    if not lines:
        raise ValueError(why)
    memo, extra = parse_record(lines)
    recorded = extra.get("environ")  # the source's own (a capture's recorded variables)
    source_env = dict(e.split("=", 1) for e in recorded) if isinstance(recorded, tuple) else None
    warnings = extra.get("warnings", ())
    description = extra.get("description", "live system")
    keep = None
    if environ is not None:
        process_env = environ  # where this process's cache directory is

        def keep(source: Cached) -> None:
            from ._topology import Machine

            write(process_env, sysroot, Machine(source))

    source = Cached(
        memo,
        str(description),
        lambda: _live(sysroot),
        source_env,
        [str(w) for w in warnings] if isinstance(warnings, tuple) else [],
        keep,
    )
    return Machine(source)


class Opened(Record):
    """The machine a rank plans from, and where it came from (``origin``: ``cache``,
    ``sysfs`` or ``sysfs (cache: why not)``; the registry entry and NUMABIND_DEBUG=1 say it)."""

    machine: Machine
    origin: str
    path: str = ""


def _from(found: Lookup, sysroot: str, environ: Mapping[str, str]) -> Opened | None:
    if not found.data:
        return None
    try:
        return Opened(
            machine=from_file(found.lines, sysroot, environ), origin="cache", path=found.path
        )
    except (ValueError, TypeError, UnicodeDecodeError):
        return None


def origin_of(opened: Opened) -> str:
    """Where the machine a rank planned from came from, said after planning: a file that
    lacked a fact the plan asked (read from sysfs and added) is not "cache" alone."""
    source = opened.machine.source
    if opened.origin != "cache" or not isinstance(source, Cached) or not source.misses:
        return opened.origin
    return f"cache, and sysfs for what it lacked ({', '.join(source.missed[:8])}; added)"


def open_machine(sysroot: str, environ: Mapping[str, str], wait: float = WAIT) -> Opened:
    """The machine under ``sysroot`` for a rank: from this process's cache file when it
    holds; else read, under the lock, and written for the others (a rank that cannot take
    the lock waits at most ``wait`` seconds for the other's file, then reads itself).
    Never raises for a cache problem: the machine is then read."""
    from ._topology import Machine

    if not enabled(environ):
        return Opened(machine=Machine.from_root(sysroot), origin="sysfs (NUMABIND_CACHE=0)")
    found = lookup(environ, sysroot)
    opened = _from(found, sysroot, environ)
    if opened is not None:
        return opened
    why = found.why or f"{found.path} refused: a damaged record"
    key = base.machine_key(sysroot)
    fd, _label, bad = base.open_cache_dir(environ, True, _base(environ))
    if fd is None:
        machine = Machine(Recording(Machine.from_root(sysroot).source))
        return Opened(machine=machine, origin=f"sysfs (cache: {bad})")
    lock: _Lock | None = _Lock(fd, cache_name(key))
    assert lock is not None
    try:
        deadline = time.monotonic() + wait
        while not lock.take():
            opened = _from(lookup(environ, sysroot), sysroot, environ)
            if opened is not None:
                return opened
            if time.monotonic() >= deadline or lock.fd is None:
                why = f"another rank held the lock for {wait:g} s" if lock.fd else why
                machine = Machine(Recording(Machine.from_root(sysroot).source))
                return Opened(machine=machine, origin=f"sysfs (cache: {why})")
            time.sleep(0.002)
        # the rank before us may have written it meanwhile
        opened = _from(lookup(environ, sysroot), sysroot, environ)
        if opened is not None:
            return opened
        writer = _Writer(Machine.from_root(sysroot).source, environ, sysroot, lock)
        lock = None  # the machine's close() writes the file, then lets the lock go
        return Opened(machine=Machine(writer), origin=f"sysfs (cache: {why}; written)")
    finally:
        if lock is not None:
            lock.close()
        os.close(fd)


class _Writer(Recording):
    """The reading of the rank that holds the lock: what planning asked is written for
    the others when the machine is closed, and only then is the lock let go (the others
    wait for the file rather than read the machine themselves)."""

    def __init__(self, inner: Source, environ: Mapping[str, str], sysroot: str, lock: _Lock):
        super().__init__(inner)
        self._where = (environ, sysroot)
        self._lock: _Lock | None = lock

    def close(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            try:
                from ._topology import Machine

                write(self._where[0], self._where[1], Machine(self))
            except Exception:
                pass  # the cache is an optimisation: a failure to write it is nothing
            finally:
                lock.close()
        super().close()


def status(environ: Mapping[str, str], sysroot: str) -> str:
    """One line for ``doctor``: whether this process's cache file still holds, and why not."""
    if not enabled(environ):
        return "off (NUMABIND_CACHE=0): every rank reads sysfs"
    found = lookup(environ, sysroot)
    if found.data:
        return f"{found.path}: valid for this process (key and every witness hold)"
    return found.why


__all__ = [
    "Opened",
    "lookup",
    "open_machine",
    "origin_of",
    "status",
    "write",
]
