"""One reading of the machine per node, shared by its ranks: the per-user machine cache.

Every rank of a node reads the same sysfs files for the same answer, and some of them are
slow: the per-CPU frequency files that tell priority cores apart cost ~1 s on a 2x EPYC
7742, serialised across processes (hwloc#756: 32 readers at once took 31.8 s).  So the
first rank of a node that needs the machine reads it, under a lock, and writes what it
read to a per-user file; the other ranks read that file instead.  (What a rank *did* with
it is another file, the answers numabind._replay writes and the warm start replays.)

**What it holds, and for how long it is true.**  Every answer a :class:`Source` gave,
method by method: one row of :data:`FACTS` per kind of answer, and each row says how long
its answer stays true (``truth``), so that a new fact must choose:

* ``boot``: fixed while the machine is up (the topology, the PCI tree, node distances);
* ``witnessed``: changeable while it is up, and cheap to check (CPUs and nodes online, a
  node's size, a device's node, the GPUs present, the driver's per-GPU files, memory tiers,
  RDMA adapters, GPU partitions, the cpuset): the file keeps *witnesses*, (kind, path,
  what it said) for the files behind the answer (:data:`WITNESSES`), and every reader
  compares them before it trusts the file (``_numabind_base.machine_holds``);
* ``live``: cheaper to read than to witness (one sysctl: ``numa_balancing``): never kept,
  read every time;
* ``expensive``: changeable but slow (the frequency files behind core kinds, which an
  SST-PP/TF profile or a partition change moves): kept for the boot for the ranks' sake;
  the verifiers (check, doctor, show) never read this cache at all.

**The key** (``_numabind_base.machine_key``): the boot, the kernel release, the mount
namespace (a container's /sys and /proc/driver are its own), the user, the cgroup, the
sysroot and its identity, and the code (numabind's version, its files).  Any change is
another file; any witness that says otherwise, a file read again.

**The rules of the registry apply** (the one copy is in ``_numabind_base``): a per-user
directory ``<base>/numabind-cache-UID`` owned by the user, mode 0700, never opened through
a link; the file written to a fresh name and renamed into place; read only if it is a
regular file of the user's, at most :data:`CACHE_CAP` bytes, whose header says this
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
import sys

import _numabind_base as base

from . import _sysfs
from ._dra import DraDevice
from ._model import (
    BY_KEY,
    VENDORS,
    Accelerator,
    Allowed,
    CoreKinds,
    KfdNode,
    Nic,
    NicPort,
    Node,
    OtherDevice,
    Record,
)
from ._sources import (
    SYS_CPU,
    SYS_INFINIBAND,
    SYS_NET,
    SYS_NODE,
    SYS_PCI,
    SYS_TIERING,
    Source,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Literal, TypeVar

    from ._plan import Plan
    from ._topology import Machine

    T = TypeVar("T")
    Truth = Literal["boot", "witnessed", "live", "expensive"]

CACHE_CAP = base.CACHE_CAP
WAIT = 5.0  # seconds a rank waits for another rank's reading (its lock) before reading itself
MAX_FILES = 32  # machine files kept per user (a cpuset per job step, a boot each)
OFF = base.CACHE_OFF


def _base(environ: Mapping[str, str]) -> str:
    """The base of the per-user directories: the registry's (``NUMABIND_REGISTRY`` under
    numabind's redirect rule, else /dev/shm)."""
    raw = environ.get("NUMABIND_REGISTRY")
    own = environ is os.environ
    return _sysfs.redirect("NUMABIND_REGISTRY", raw, "/dev/shm", own=own, registry=True, notes=[])


def enabled(environ: Mapping[str, str]) -> bool:
    """Whether the cache is used (``NUMABIND_CACHE``, on unless 0/off/no/false)."""
    return environ.get("NUMABIND_CACHE", "").strip().lower() not in OFF


# --- what is recorded: one row per kind of answer --------------------------------------------


class Fact(Record):
    """One kind of answer a :class:`Source` gives: the method, how a call's arguments
    name the answer (``argkey``: ``None`` for a method without arguments), how long the
    answer stays true (``truth``, see the module docstring; no default: a new fact must
    choose) and, for a witnessed one, the files that witness it (``witness``: from the
    answers given, (kind, path) pairs, ``_numabind_base.witness`` reads them)."""

    method: str
    truth: Truth
    argkey: Callable[..., str] | None = None
    records: tuple[type[Record], ...] = ()  # the record classes its answers hold
    witness: Callable[[dict[str, object]], list[tuple[str, str]]] | None = None


TRUTHS = ("boot", "witnessed", "live", "expensive")


def _node_key(node_id: int, online: object, ids: object, full: bool = True) -> str:
    return f"{node_id}.{int(bool(full))}"


def _cpu_key(cpu: int) -> str:
    return str(cpu)


def _acc_key(bdf: str, detail: bool = False) -> str:
    return f"{bdf}.{int(bool(detail))}"


def _text_key(value: str) -> str:
    return _escape(value)


def _vendor_key(vendor: object, arg: object) -> str:
    return f"{_escape(str(getattr(vendor, 'key', vendor)))}.{_escape(str(arg))}"


def _sets_key(*sets: frozenset[str]) -> str:
    return _escape(repr([sorted(s) for s in sets]))


# --- witnesses: the files behind a changeable answer ---------------------------------------------


def _w_nodes(answers: dict[str, object]) -> list[tuple[str, str]]:
    """A node's CPUs and size (a memory block taken offline changes MemTotal), the memory
    tiers, and the list of nodes itself."""
    out = [("l", SYS_NODE), ("l", SYS_TIERING)]
    for key in answers:
        node = key.partition(".")[0]
        out += [("f", f"{SYS_NODE}/node{node}/cpulist"), ("m", f"{SYS_NODE}/node{node}/meminfo")]
    return out


def _devices_of(answers: dict[str, object]) -> list[Accelerator]:
    found: dict[str, Accelerator] = {}
    for value in answers.values():
        for acc in value if isinstance(value, tuple) else (value,):
            if isinstance(acc, Accelerator):
                found.setdefault(acc.pci, acc)
    return list(found.values())


def _w_devices(answers: dict[str, object]) -> list[tuple[str, str]]:
    """Each GPU's node (root rewrites it: a firmware workaround; a GPU taken off the bus
    takes the file with it), its driver's directory (a GH200's GPU memory node is learned
    when the driver loads: its numa_status file appears) and its partition modes (amd-smi
    switches them): a few files per GPU, read by every warm rank."""
    out = []
    for acc in _devices_of(answers):
        out.append(("f", f"{SYS_PCI}/{acc.pci}/numa_node"))
        vendor = BY_KEY.get(acc.vendor)
        if vendor is None:
            continue
        if vendor.driver_dir:
            out.append(("l", vendor.driver_dir))
            if vendor.driver_numa_file:
                out.append(("f", f"{vendor.driver_dir}/{acc.pci}/{vendor.driver_numa_file}"))
        out += [("f", f"{SYS_PCI}/{acc.pci}/{n}") for n in vendor.partition_files or ()]
    return out


def _w_driver(answers: dict[str, object]) -> list[tuple[str, str]]:
    return [
        ("l", v.driver_dir) for v in VENDORS if v.driver_dir and v.key in map(_unescape, answers)
    ]


def _w_modes(answers: dict[str, object]) -> list[tuple[str, str]]:
    out = []
    for key in answers:  # vendor.bdf
        vendor, _, pci = key.partition(".")
        for v in VENDORS:
            if v.key == _unescape(vendor):
                out += [("f", f"{SYS_PCI}/{_unescape(pci)}/{n}") for n in v.partition_files or ()]
    return out


def _w_file(*paths: str) -> Callable[[dict[str, object]], list[tuple[str, str]]]:
    return lambda answers: [("f", p) for p in paths]


# Every answer the machine layer asks for.  A new fact a branch adds to Source (memory
# tiers, NICs read only when asked) is one row here, and the cache holds it as its truth says.
FACTS: tuple[Fact, ...] = (
    Fact(method="online_cpus", truth="witnessed", witness=_w_file(f"{SYS_CPU}/online")),
    Fact(method="node_ids", truth="witnessed", witness=_w_file(f"{SYS_NODE}/online")),
    Fact(method="node", truth="witnessed", argkey=_node_key, records=(Node,), witness=_w_nodes),
    Fact(method="cpu_package", truth="boot", argkey=_cpu_key),
    Fact(method="cpu_siblings", truth="boot", argkey=_cpu_key),
    Fact(method="cpu_cache", truth="boot", argkey=_cpu_key),
    # the cpuset's files are the key's witnesses (cpuset_files): read by every rank
    Fact(method="allowed", truth="witnessed", records=(Allowed,)),
    Fact(method="core_kinds", truth="expensive", records=(CoreKinds,)),
    Fact(  # a scan of the bus: the devices present are its witness too (a GPU added)
        method="accelerators",
        truth="witnessed",
        argkey=lambda detail=False: str(int(bool(detail))),
        records=(Accelerator,),
        witness=lambda answers: [("l", SYS_PCI), *_w_devices(answers)],
    ),
    Fact(
        method="accelerator",
        truth="witnessed",
        argkey=_acc_key,
        records=(Accelerator,),
        witness=_w_devices,
    ),
    Fact(
        method="locate",
        truth="witnessed",
        argkey=lambda acc: _escape(acc.pci),
        records=(Accelerator,),
        witness=_w_devices,
    ),
    Fact(method="pci_path", truth="boot", argkey=_text_key),
    Fact(
        method="nics",
        truth="witnessed",
        records=(Nic, NicPort),
        witness=lambda answers: [("l", SYS_INFINIBAND)],
    ),
    Fact(
        method="ethernet",
        truth="witnessed",
        argkey=_sets_key,
        records=(Nic, NicPort),
        witness=lambda answers: [("l", SYS_NET)],
    ),
    Fact(method="others", truth="boot", records=(OtherDevice,)),
    Fact(method="driver_gpus", truth="witnessed", argkey=_text_key, witness=_w_driver),
    Fact(method="dra_devices", truth="boot", records=(DraDevice,)),  # the pod's, in its mnt ns
    Fact(method="kernel_release", truth="boot"),
    Fact(method="numa_balancing", truth="live"),
    Fact(method="sched_ext", truth="live"),  # a scheduler starts and stops at any time
    Fact(method="cpu_vendor", truth="boot"),
    Fact(
        method="partition_nodes",
        truth="witnessed",
        argkey=_vendor_key,
        records=(KfdNode,),
        witness=lambda answers: [
            ("l", v.partition_topology) for v in VENDORS if v.partition_topology
        ],
    ),
    Fact(method="partition_modes", truth="witnessed", argkey=_vendor_key, witness=_w_modes),
)
BY_METHOD = {f.method: f for f in FACTS}
_RECORDS: dict[str, type[Record]] = {cls.__name__: cls for f in FACTS for cls in f.records}


# --- values as text ------------------------------------------------------------------------------

_escape: Callable[[str], str] = base.escape
_unescape: Callable[[str], str] = base.unescape


def encode(value: object, records: Mapping[str, type[Record]] | None = None) -> str:
    """A value an answer holds (None, bool, int, float, str, a set of ints, a tuple, a
    record) as space-separated tokens; :func:`decode` reads them back."""
    if value is None:
        return "~"
    if isinstance(value, bool):
        return "T" if value else "F"
    if isinstance(value, int):
        return f"i{value}"
    if isinstance(value, float):
        return f"f{value!r}"
    if isinstance(value, str):
        return "s" + _escape(value)
    if isinstance(value, frozenset):
        return "c" + _sysfs.format_cpulist(value)
    if isinstance(value, (tuple, list)):
        return " ".join(["(", *(encode(v, records) for v in value), ")"])
    if isinstance(value, Record) and type(value).__name__ in (records or _RECORDS):
        fields = (encode(getattr(value, n), records) for n in value._fields)
        return " ".join([f"R{type(value).__name__}", "(", *fields, ")"])
    raise TypeError(f"not cached: {type(value).__name__}")


class Tokens:
    """The tokens of one line, read in order (``ValueError`` past the end)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.at = 0

    def next(self) -> str:
        if self.at >= len(self.tokens):
            raise ValueError("the line ends inside a value")
        self.at += 1
        return self.tokens[self.at - 1]

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    @property
    def done(self) -> bool:
        return self.at >= len(self.tokens)


def decode(tokens: Tokens, records: Mapping[str, type[Record]] | None = None) -> object:
    """The value :func:`encode` wrote (``ValueError`` on anything else)."""
    token = tokens.next()
    head, rest = token[:1], token[1:]
    if token == "~":
        return None
    if token in ("T", "F"):
        return token == "T"
    if head == "i":
        return int(rest)
    if head == "f":
        return float(rest)
    if head == "s":
        return _unescape(rest)
    if head == "c":
        return _set(rest)
    if token == "(":
        return tuple(_items(tokens, records))
    if head == "R":
        cls = (records or _RECORDS).get(rest)
        if cls is None or tokens.next() != "(":
            raise ValueError(f"not a cached record: {rest[:40]!r}")
        values = _items(tokens, records)
        if len(values) != len(cls._fields):
            raise ValueError(f"{rest}: {len(values)} fields, not {len(cls._fields)}")
        return cls(**dict(zip(cls._fields, values)))
    raise ValueError(f"not a value: {token[:40]!r}")


def _items(tokens: Tokens, records: Mapping[str, type[Record]] | None = None) -> list[object]:
    """The values up to the closing parenthesis (consumed)."""
    items: list[object] = []
    while tokens.peek() != ")":
        items.append(decode(tokens, records))
    tokens.next()
    return items


def _set(text: str) -> frozenset[int]:
    found = _SETS.get(text)
    if found is None:
        found = base.parse_cpulist(text, _sysfs.MAX_CPUS)
        if found is None:
            raise ValueError(f"a bad set {text[:40]!r}")
        if len(_SETS) < 1 << 16:
            _SETS[text] = found  # one object per distinct list, as the live reader keeps
    return found


# the sets decoded so far, by their text: a machine repeats the same lists (every CPU of a
# core, every GPU of a node), and a crafted file repeating a 16,384-CPU list costs one set
_SETS: dict[str, frozenset[int]] = {}


def all_records() -> dict[str, type[Record]]:
    """Every record class loaded, by name: what a replayed answer's plan may hold."""
    out: dict[str, type[Record]] = {}
    todo = list(Record.__subclasses__())
    while todo:
        cls = todo.pop()
        out.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return out


def decode_plan(text: str) -> Plan:
    """The plan a replayed answer carries (numabind._replay), as the planner made it
    (``ValueError`` when it is not exactly one)."""
    from ._plan import Plan

    tokens = Tokens(text.split(" "))
    value = decode(tokens, all_records())
    if not isinstance(value, Plan) or not tokens.done:
        raise ValueError("not a plan")
    return value


# --- the sources: one that records, one that answers from the record --------------------------


class Recording(Source):
    """A source that asks ``inner`` and keeps every answer (``memo``: method -> argkey ->
    value), so that what one rank read can be written for the others."""

    def __init__(self, inner: Source, memo: dict[str, dict[str, object]] | None = None) -> None:
        super().__init__()
        self.inner = inner
        self.description = inner.description
        self.budget = inner.budget
        self.environ = inner.environ
        self.memo: dict[str, dict[str, object]] = memo if memo is not None else {}
        self.warnings = inner.warnings  # the same list: what it warns of is kept

    def _ask(self, method: str, key: str, call: Callable[[], T]) -> T:
        answers = self.memo.setdefault(method, {})
        if key not in answers:
            answers[key] = call()
        return answers[key]  # type: ignore[return-value]  # what call() gave, kept

    def locate(self, acc: Accelerator) -> Accelerator:
        if acc.read != "id":
            return acc
        return self._ask("locate", _escape(acc.pci), lambda: self.inner.locate(acc))

    def close(self) -> None:
        self.inner.close()


def _recorded(fact: Fact) -> Callable[..., object]:
    """The :class:`Recording` method of ``fact``: the inner source's answer, kept under
    the method's name and the call's argkey."""
    name, argkey = fact.method, fact.argkey

    def ask(self: Recording, *args: object, **kwargs: object) -> object:
        if fact.truth == "live":  # never kept: the machine's answer, now
            return getattr(self.inner, name)(*args, **kwargs)
        key = argkey(*args, **kwargs) if argkey is not None else "-"
        return self._ask(name, key, lambda: getattr(self.inner, name)(*args, **kwargs))

    ask.__name__ = ask.__qualname__ = name
    ask.__doc__ = f"``{name}`` of the inner source, recorded."
    return ask


for _fact in FACTS:  # one row of FACTS is one recorded method
    if _fact.method not in Recording.__dict__:
        setattr(Recording, _fact.method, _recorded(_fact))


class Cached(Recording):
    """A source that answers from a cache file's record; what it does not hold is asked of
    the machine itself (opened on the first such question), kept, and counted in
    ``misses`` (the rank then writes the file again with it)."""

    def __init__(
        self,
        memo: dict[str, dict[str, object]],
        description: str,
        open_live: Callable[[], Source],
        environ: dict[str, str] | None,
        warnings: list[str],
        keep: Callable[[Cached], None] | None = None,
    ) -> None:
        Source.__init__(self)
        self._keep = keep
        self.memo = memo
        self.description = description
        self.environ = environ
        self.warnings = warnings
        self._open_live = open_live
        self._live: Source | None = None
        self.misses = 0
        self.missed: list[str] = []  # the facts (by method) the file lacked, first asked first

    @property
    def inner(self) -> Source:
        if self._live is None:
            self._live = self._open_live()
            self.budget = self._live.budget
        return self._live

    @inner.setter
    def inner(self, value: Source) -> None:
        self._live = value

    def _ask(self, method: str, key: str, call: Callable[[], T]) -> T:
        answers = self.memo.setdefault(method, {})
        if key not in answers:
            self.misses += 1
            if method not in self.missed:
                self.missed.append(method)
            answers[key] = call()
            for w in self.inner.warnings:
                if w not in self.warnings:
                    self.warnings.append(w)
        return answers[key]  # type: ignore[return-value]  # the file's answer, or call()'s

    def close(self) -> None:
        """Release the machine; where this reading asked it for facts the file did not
        hold, write the file again with them (so the next rank, or show, has them), before
        the machine's files are let go (the key's cpuset files are read again)."""
        if self.misses and self._keep is not None:
            keep, self._keep = self._keep, None
            try:
                keep(self)
            except Exception:
                pass  # the cache is an optimisation: a failure to extend it is nothing
        if self._live is not None:
            self._live.close()


# --- witnesses and the cpuset ------------------------------------------------------------------


def cpuset_files(allowed: Allowed) -> list[tuple[str, str]] | None:
    """The cpuset files behind ``allowed`` (kind ``f``, path), read through ``source``'s
    root; None when the allowed set cannot be witnessed (a cpuset that exists but is
    unreadable)."""
    if allowed.problem:
        return None
    from ._sources import _V1, _V1_NOPREFIX, _V2

    if allowed.kind == "online":
        names = [f"{SYS_CPU}/online"]
    elif allowed.directory is not None and allowed.kind in ("cgroup-v1", "cgroup-v2"):
        tables = (_V2,) if allowed.kind == "cgroup-v2" else (_V1, _V1_NOPREFIX)
        names = [f"{allowed.directory}/{n}" for t in tables for n in t if n]
    else:
        return None
    return [("f", path) for path in dict.fromkeys(names)]


def witnesses(source: Recording, sysroot: str) -> list[tuple[str, str, str]] | None:
    """(kind, path, what it says now) for every witnessed answer ``source`` gave, read
    under ``sysroot``; None when the machine cannot be witnessed (its cpuset unreadable)."""
    allowed = source.memo.get("allowed", {}).get("-")
    if allowed is None:  # a plan that did not ask (one node): the cpuset is witnessed all the same
        allowed = source.allowed(source.online_cpus())
    if not isinstance(allowed, Allowed):
        return None
    files = cpuset_files(allowed)
    if files is None:
        return None
    paths: dict[tuple[str, str], None] = dict.fromkeys(files)
    for fact in FACTS:
        answers = source.memo.get(fact.method)
        if answers and fact.witness is not None:
            paths.update(dict.fromkeys(fact.witness(answers)))
    prefix = base.tree(sysroot)
    return [(kind, path, base.witness(kind, prefix + path)) for kind, path in paths]


def render(
    key: str, memo: dict[str, dict[str, object]], seen: list[str], extra: dict[str, object]
) -> bytes:
    """The whole file: key, witnesses, the record (the answers of every fact whose truth
    lets it be kept), framed (``_numabind_base.frame``)."""
    lines = [f"key {key}", *seen, "--"]
    for method, answers in memo.items():
        for argkey, value in answers.items():
            lines.append(f"m {method} {argkey} {encode(value)}")
    for name, value in extra.items():
        lines.append(f"x {name} {encode(value)}")
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
            memo.setdefault(name, {})[arg] = decode(tokens)
        elif kind == "x":
            tokens.at -= 1  # the value starts where an answer's key would be
            extra[name] = decode(tokens)
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
    name = cache_name(base.machine_key(sysroot))
    data, path, why = base.read_cache(environ, name, _base(environ))
    if data is None:
        return Lookup(path=path, why=why)
    lines, why = base.unframe(data, "machine")
    if lines:
        _, why = base.machine_holds(lines, sysroot, 1)
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
    data = render(key, source.memo, base.witness_lines(found), extra)
    if len(data) > CACHE_CAP:
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
        deadline = _now() + wait
        while not lock.take():
            opened = _from(lookup(environ, sysroot), sysroot, environ)
            if opened is not None:
                return opened
            if _now() >= deadline or lock.fd is None:
                why = f"another rank held the lock for {wait:g} s" if lock.fd else why
                machine = Machine(Recording(Machine.from_root(sysroot).source))
                return Opened(machine=machine, origin=f"sysfs (cache: {why})")
            _sleep(0.002)
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


def _now() -> float:
    import time

    return time.monotonic()


def _sleep(seconds: float) -> None:
    import time

    time.sleep(seconds)


def status(environ: Mapping[str, str], sysroot: str) -> str:
    """One line for ``doctor``: whether this process's cache file still holds, and why not."""
    if not enabled(environ):
        return "off (NUMABIND_CACHE=0): every rank reads sysfs"
    found = lookup(environ, sysroot)
    if found.data:
        return f"{found.path}: valid for this process (key and every witness hold)"
    return found.why


__all__ = [
    "FACTS",
    "Cached",
    "Fact",
    "Opened",
    "Recording",
    "lookup",
    "open_machine",
    "origin_of",
    "status",
    "write",
]
del sys
