"""Processes numabind bound register themselves, so ``numabind check --all`` finds them;
the entry is one typed record (:class:`Entry`), written and read back here.

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
* **Readers that trust nothing**.  Root's ``check --all`` reads every user's directory
  (the admin's audit); a user reads their own.  An entry is trusted only if its file is
  owned by the uid of the process it describes (or by root), the process is alive with
  the recorded start time, and every field parses within bounds.  Anything else is
  ignored and counted (malformed, foreign, stale, special): never a traceback, never a
  hang, never a change of ``check``'s exit status.
* **No pile-up.**  A process removes its entry at exit; readers prune stale ones in
  directories they may write.
"""

from __future__ import annotations

import _thread
import os

import _numabind_base as base

from . import _sysfs
from ._kernel import process_uids, start_time
from ._model import MODE_NAMES, PLACES_WORDS, REGISTRY_POLICIES, Record
from ._sysfs import normalize_pci

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any

    from ._model import NicChoice

DEFAULT_BASE = "/dev/shm"
PREFIX = "numabind-"
ENTRY_CAP = 8192  # bytes of one entry
DIR_CAP = 1 << 16  # entries looked at per directory, directories per base
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_registered: dict[str, object] = {}  # what this process wrote: path, pid
# the host buffers this process made and has not closed, as its entry lists them (written
# by numabind.memory._memory, read by the binding's entry): id -> (address, bytes, nodes, policy)
_held: dict[int, tuple[int, int, tuple[int, ...], str]] = {}
_held_lock = _thread.allocate_lock()


def list_buffer(key: int, item: tuple[int, int, tuple[int, ...], str] | None) -> None:
    """Add a host buffer to what this process's entry lists (``item`` None: remove it)."""
    with _held_lock:
        if item is None:
            _held.pop(key, None)
        else:
            _held[key] = item


def listed_buffers() -> tuple[tuple[int, int, tuple[int, ...], str], ...]:
    """The host buffers this process made and has not closed (for its entry)."""
    with _held_lock:
        return tuple(sorted(_held.values()))


# --- the entry ---------------------------------------------------------------------------------


class Entry(Record):
    """What a bound process registers: its identity (pid and start time), its plan as
    applied (CPUs kept or set, the memory policy the kernel accepted, or
    ``not-permitted``), and the thread settings it was given.  One ``key=value`` line per
    field; :meth:`encode` and :meth:`parse` are the only places the format is spelled,
    and :meth:`parse` trusts nothing (every field within bounds, else no entry)."""

    pid: int
    start: str
    local_rank: int | None = None
    rank_source: str = ""
    local_world_size: int | None = None
    device: str = ""  # the device's PCI address
    device_index: int | None = None
    numa_node: int | None = None
    cpus: frozenset[int] = frozenset()
    memory_policy: str = "none"
    memory_nodes: frozenset[int] = frozenset()
    mode: str = "node"
    reason: str = ""
    threads: int | None = None
    thread_env: tuple[tuple[str, str], ...] = ()  # variables numabind set, with values
    # host buffers the process made (address, bytes, nodes, policy), at most MAX_BUFFERS
    buffers: tuple[tuple[int, int, tuple[int, ...], str], ...] = ()
    # the cores kept for the process's helpers (NUMABIND_RESERVE): check counts a thread
    # there as on plan
    helpers: frozenset[int] = frozenset()
    # the nodes of memory_nodes that are only where its memory may spill (a spill mask,
    # NUMABIND_SPILL=cpu: MPOL_BIND over them too): check measures locality without them
    spill: frozenset[int] = frozenset()
    # a process that drives several devices: each device's plan (PCI address, CPUs,
    # memory policy, its nodes), at most MAX_DEVICE_PLANS, and the threads bound to one
    # of them (numabind.bind_thread: thread id, index into device_plans), at most
    # MAX_THREAD_DEVICES; check judges those threads against their own device's plan
    device_plans: tuple[tuple[str, frozenset[int], str, frozenset[int]], ...] = ()
    thread_devices: tuple[tuple[int, int], ...] = ()
    # NUMABIND_PRIORITY: the priority cores of the rank's node (what its plan drew from),
    # and under "main" the thread put on one and that core's CPUs: check judges it there
    priority_cpus: frozenset[int] = frozenset()
    main_thread: int | None = None
    main_cpus: frozenset[int] = frozenset()
    # where the machine the plan was made from came from: "sysfs", "cache" (the per-node
    # cache, numabind._cache), or "sysfs (cache: <why not>)"; check and doctor say it
    machine: str = ""
    # the RDMA adapter ports planned for it (Plan.nics), at most MAX_NICS, and the NIC
    # variables numabind set (NUMABIND_NIC: the hook sets them after start, so
    # /proc/PID/environ cannot show them)
    nics: tuple[NicChoice, ...] = ()
    nic_env: tuple[tuple[str, str], ...] = ()
    # the CPU mask the process started with, where it was narrower than its cgroup's and
    # not the plan (an exec wrapper's: torchrun --numa-binding and vllm --numa-bind exec
    # through numactl), and what the keep/replace rule did with it: kept or replaced
    # (check names it: numabind._binders, the "mask" row)
    start_mask: frozenset[int] = frozenset()
    start_action: str = ""

    def encode(self) -> bytes:
        lines = []
        for name in self._fields:
            value: Any = getattr(self, name)
            if isinstance(value, frozenset):
                text = _sysfs.format_cpulist(value)
            elif name == "thread_env":
                text = ",".join(f"{k}:{v}" for k, v in value)
            elif name == "buffers":
                text = ";".join(
                    f"{a:x}+{n}@{_sysfs.format_cpulist(nodes)}/{policy}"
                    for a, n, nodes, policy in value[:MAX_BUFFERS]
                )
            elif name == "device_plans":
                fmt = _sysfs.format_cpulist
                text = ";".join(
                    f"{pci}/{fmt(cpus)}/{policy}/{fmt(nodes)}"
                    for pci, cpus, policy, nodes in value[:MAX_DEVICE_PLANS]
                )
            elif name == "thread_devices":
                text = ",".join(f"{tid}:{i}" for tid, i in value[:MAX_THREAD_DEVICES])
            elif name == "nics":
                text = _within(
                    f"{n.label}@{n.pci}/{n.relation}/{'' if n.rate is None else f'{n.rate:g}'}"
                    for n in value[:MAX_NICS]
                )
            elif name == "nic_env":
                text = _within(f"{k}={v}" for k, v in value[:MAX_NIC_ENV])
            else:
                text = "" if value is None else str(value)
            lines.append(f"{name}={_sysfs.clean_line(text, 1000)}\n")
        return "".join(lines).encode("utf-8", "replace")

    @classmethod
    def parse(cls, data: bytes) -> Entry | None:
        """An entry's fields, each within bounds; None if anything is off (fields of a
        newer numabind are ignored, not fatal)."""
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            return None
        raw: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.partition("=")
            if not sep or key in raw:
                return None
            if key in cls._fields:
                raw[key] = value
        if not raw.get("pid") or not raw.get("start"):
            return None  # no identity
        values: dict[str, Any] = {}
        for name in cls._fields:
            try:
                values[name] = _field(name, raw.get(name), cls._defaults.get(name))
            except ValueError:
                return None
        entry = cls(**values)
        return entry if entry._sane() else None

    def _sane(self) -> bool:
        return (
            self.pid <= 1 << 31
            and all(i < len(self.device_plans) for _, i in self.thread_devices)
            and self.memory_policy in REGISTRY_POLICIES
            # numabind writes a PCI address in sysfs spelling, nothing else
            and (not self.device or normalize_pci(self.device) == self.device)
            and self.mode in MODE_NAMES
            and _is_text(self.rank_source, 64)
            and _is_text(self.machine, 200)
            and self.main_cpus <= self.cpus | self.priority_cpus
            and self.start_action in ("", "kept", "replaced")
        )


def _field(name: str, value: str | None, default: Any) -> Any:
    """One field of an entry, parsed and bounded; ``ValueError`` when it is not."""
    if name in ("pid", "start") or name in _NUMBERS:
        if not value:
            return None
        if not (value.isascii() and value.isdigit() and len(value) < 20):
            raise ValueError(name)
        return value if name == "start" else int(value)
    if isinstance(default, frozenset):
        if name in ("memory_nodes", "spill"):
            return _sysfs.parse_nodelist(value or "")
        return _sysfs.parse_cpulist(value or "")
    parser = _STRUCTURED.get(name)
    if parser is not None:
        return parser(value or "")
    return default if value is None else value


def _thread_env(value: str) -> tuple[tuple[str, str], ...]:
    """``NAME:value,...`` of the thread variables numabind sets; ValueError otherwise."""
    if not value:
        return ()
    if value.count(",") >= 16:
        raise ValueError("thread_env")  # more variables than numabind sets
    pairs = []
    for item in value.split(","):
        k, _, v = item.partition(":")
        number = v.isascii() and v.isdigit() and len(v) < 7
        if not (_is_name(k) and (number or v in PLACES_WORDS)):
            raise ValueError("thread_env")
        pairs.append((k, v))
    return tuple(pairs)


MAX_DEVICE_PLANS = 16  # devices of one process listed with their plans
MAX_THREAD_DEVICES = 64  # threads bound to one of them, listed


def _device_plans(value: str) -> tuple[tuple[str, frozenset[int], str, frozenset[int]], ...]:
    """``pci/cpus/policy/nodes;...``, each part bounded; ValueError otherwise."""
    from ._model import REGISTRY_POLICIES

    if not value:
        return ()
    items = value.split(";", MAX_DEVICE_PLANS)
    if len(items) > MAX_DEVICE_PLANS:
        raise ValueError("device_plans")
    out = []
    for item in items:
        parts = item.split("/")
        if (
            len(parts) != 4
            or normalize_pci(parts[0]) != parts[0]
            or parts[2] not in REGISTRY_POLICIES
        ):
            raise ValueError("device_plans")
        out.append(
            (parts[0], _sysfs.parse_cpulist(parts[1]), parts[2], _sysfs.parse_nodelist(parts[3]))
        )
    return tuple(out)


def _thread_devices(value: str) -> tuple[tuple[int, int], ...]:
    """``tid:index,...`` (an index into device_plans), bounded; ValueError otherwise."""
    if not value:
        return ()
    items = value.split(",", MAX_THREAD_DEVICES)
    if len(items) > MAX_THREAD_DEVICES:
        raise ValueError("thread_devices")
    out = []
    for item in items:
        tid, _, index = item.partition(":")
        if not (
            tid.isascii() and tid.isdigit() and len(tid) < 11
            and index.isascii() and index.isdigit() and len(index) < 3
        ):  # fmt: skip
            raise ValueError("thread_devices")
        out.append((int(tid), int(index)))
    return tuple(out)


MAX_BUFFERS = 16  # host buffers listed per entry (check measures each)


def _buffers(value: str) -> tuple[tuple[int, int, tuple[int, ...], str], ...]:
    """``addr+bytes@nodes/policy;...``, each part bounded; ValueError otherwise."""
    from ._model import REGISTRY_POLICIES

    if not value:
        return ()
    items = value.split(";")
    if len(items) > MAX_BUFFERS:
        raise ValueError("buffers")
    out = []
    for item in items:
        head, _, policy = item.partition("/")
        span, _, nodes = head.partition("@")
        addr, _, size = span.partition("+")
        if (
            not (0 < len(addr) <= 16 and all(c in "0123456789abcdef" for c in addr))
            or not (size.isascii() and size.isdigit() and len(size) < 20)
            or (policy not in REGISTRY_POLICIES and policy != "first-touch")
        ):
            raise ValueError("buffers")
        out.append((int(addr, 16), int(size), tuple(sorted(_sysfs.parse_nodelist(nodes))), policy))
    return tuple(out)


def _within(items: Iterator[str], limit: int = 1000) -> str:
    """``;``-joined items, as many whole ones as fit in a line of the entry."""
    out = ""
    for item in items:
        joined = f"{out};{item}" if out else item
        if len(joined) > limit:
            break
        out = joined
    return out


MAX_NICS = 16  # adapter ports listed per entry
MAX_NIC_ENV = 8  # NIC variables listed per entry


def _nics(value: str) -> tuple[NicChoice, ...]:
    """``name:port@pci/relation/rate;...`` (numabind's own spelling), bounded; ValueError
    otherwise."""
    if not value:
        return ()
    from ._model import NicChoice
    from ._nics import RELATIONS
    from ._rdma import clean_name

    items = value.split(";", MAX_NICS)
    if len(items) > MAX_NICS:
        raise ValueError("nics")
    out = []
    for item in items:
        head, _, rest = item.partition("@")
        name, _, port = head.rpartition(":")
        parts = rest.split("/")
        rate = parts[2] if len(parts) == 3 else "x"
        if (
            clean_name(name) != name
            or not (port.isascii() and port.isdigit() and len(port) < 4)
            or len(parts) != 3
            or normalize_pci(parts[0]) != parts[0]
            or parts[1].rstrip("*") not in RELATIONS
            or not (rate == "" or (len(rate) < 10 and rate.replace(".", "", 1).isdigit()))
        ):
            raise ValueError("nics")
        out.append(
            NicChoice(
                name=name,
                port=int(port),
                pci=parts[0],
                relation=parts[1],
                rate=float(rate) if rate else None,
            )
        )
    return tuple(out)


def _nic_env(value: str) -> tuple[tuple[str, str], ...]:
    """``NAME=value;...`` of the NIC variables numabind sets; ValueError otherwise."""
    if not value:
        return ()
    from ._transports import MAX_VALUE, VARIABLES

    items = value.split(";", MAX_NIC_ENV)
    known = {v.name for v in VARIABLES}
    out = []
    for item in items[:MAX_NIC_ENV]:
        k, sep, v = item.partition("=")
        if not sep or k not in known or len(v) > MAX_VALUE or not v.isprintable():
            raise ValueError("nic_env")
        out.append((k, v))
    if len(items) > MAX_NIC_ENV:
        raise ValueError("nic_env")
    return tuple(out)


# the fields with a structure of their own, and the one parser of each
_STRUCTURED: dict[str, Callable[[str], Any]] = {
    "thread_env": _thread_env,
    "buffers": _buffers,
    "device_plans": _device_plans,
    "thread_devices": _thread_devices,
    "nics": _nics,
    "nic_env": _nic_env,
}
_NUMBERS = frozenset(
    {"local_rank", "local_world_size", "device_index", "numa_node", "threads", "main_thread"}
)
_NAME = frozenset("_0123456789")


def _is_text(text: str, limit: int) -> bool:
    """Short printable text (what numabind writes); the rest of an entry's text is escaped
    wherever it is shown."""
    return len(text) <= limit and text.isprintable()


def _is_name(text: str) -> bool:
    return 0 < len(text) < 64 and text.isascii() and all(c.isupper() or c in _NAME for c in text)


def base_dir(environ: Mapping[str, str] | None = None) -> str:
    """The registry's base: ``NUMABIND_REGISTRY`` (under the rules of numabind._environ)
    or /dev/shm."""
    from ._environ import registry_base

    return registry_base(os.environ if environ is None else environ)


# --- directories -------------------------------------------------------------------------------


# The per-user directories and files follow one set of rules, shared with the machine cache
# (numabind._cache): the one copy of that code is in _numabind_base, which the startup
# hook loads before numabind itself.
base_ok = base.base_ok
private_dir = base.private_dir


def candidates(environ: Mapping[str, str], uid: int) -> Iterator[tuple[str, str, str]]:
    """(parent directory, name, label) where uid's registry may live, best first: the
    shared base, then the user's runtime directory ($XDG_RUNTIME_DIR for this process's
    own uid, /run/user/UID for others, as systemd makes it)."""
    yield from base.candidates(base_dir(environ), environ, uid, f"{PREFIX}{uid}", "numabind")


def _open_user_dir(
    environ: Mapping[str, str], uid: int, create: bool
) -> tuple[int | None, str | None, list[str]]:
    """The first usable registry directory of ``uid``: (fd, its path, why others failed)."""
    where = base_dir(environ)
    return base.open_user_dir(list(candidates(environ, uid)), where, uid, create)


# --- writing -----------------------------------------------------------------------------------


def register(
    entry: Entry, environ: Mapping[str, str] | None = None
) -> tuple[str | None, str | None]:
    """Record this process's plan.  Returns (the file written, None) or (None, why it was
    not written); never raises (a read-only or absent /dev/shm must not matter to a rank).
    Which directory is this module's rule; the writing, and the removal at exit, are the
    one applier's (``_numabind_base.register``, which the warm start uses too)."""
    env = os.environ if environ is None else environ
    try:
        fd, label, why = _open_user_dir(env, os.geteuid(), create=True)
    except OSError as err:
        return None, f"registry unusable ({err.strerror or err})"
    if fd is None or label is None:
        return None, "not registered for numabind check: " + "; ".join(why)
    os.close(fd)
    why_not = base.register(label, entry.encode())
    if why_not is not None:
        return None, f"registry entry {why_not}"
    path = f"{label}/{os.getpid()}"
    _registered.update(path=path, pid=os.getpid(), label=label)
    return path, None


def unregister() -> None:
    """Remove this process's entry (at exit, or when its binding is restored)."""
    base.unregister()
    _registered.clear()


# --- reading (check, check --all): every entry is input ----------------------------------------


class Scan:
    """What a reader found: trusted entries by pid, and counts of what it ignored."""

    def __init__(self) -> None:
        self.entries: dict[int, Entry] = {}
        self.ignored: dict[str, int] = {}
        self.notes: list[str] = []

    def ignore(self, why: str) -> None:
        self.ignored[why] = self.ignored.get(why, 0) + 1


def _read_file(fd: int, name: str, owner: int) -> tuple[str | None, bytes, int]:
    """An entry file's bytes and owner, or why it is ignored (a link, a socket, gone, not
    the directory owner's or root's, larger than an entry)."""
    why, data, uid = base.read_private(fd, name, (owner, 0), ENTRY_CAP)
    if why is None:
        return None, data, uid
    return {"huge": "malformed", "missing": "special"}.get(why, why), b"", -1


def _prune(fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=fd)
    except OSError:
        pass


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
        why, data, file_uid = _read_file(fd, name, owner)
        if why is not None:
            scan.ignore(why)
            continue
        entry = Entry.parse(data)
        uids = process_uids(pid)
        if entry is None or entry.pid != pid:
            scan.ignore("malformed")
            if prune and uids is None:
                _prune(fd, name)
        elif uids is None or start_time(pid) != entry.start:
            scan.ignore("stale")
            if prune:
                _prune(fd, name)
        elif file_uid != 0 and file_uid not in uids:
            scan.ignore("foreign")  # uid U may describe only U's own processes
        else:
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


def read(pid: int, environ: Mapping[str, str] | None = None) -> Entry | None:
    """The trusted registry entry of ``pid``, or None."""
    env = os.environ if environ is None else environ
    uids = process_uids(pid)
    if uids is None:
        return None
    return scan(env, uids=sorted(uids | {0}), pid=pid).entries.get(pid)


def registered_pids(environ: Mapping[str, str] | None = None) -> list[int]:
    """Every pid with a trusted, current entry (stale entries are pruned on the way)."""
    return sorted(scan(environ, all_users=True).entries)
