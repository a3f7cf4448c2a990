"""One reading of the machine per node, shared by its ranks: the per-user machine cache.

Every rank of a node reads the same sysfs files for the same answer, and some of them are
slow: the per-CPU frequency files that tell priority cores apart cost ~1 s on a 2x EPYC
7742, serialised across processes (hwloc#756: 32 readers at once took 31.8 s).  So the
first rank of a node that needs the machine reads it, under a lock, and writes what it
read to a per-user file; the other ranks read that file instead.

**What it holds.**  The machine, not a rank's plan: every answer a :class:`Source` gave,
method by method (one row of :data:`FACTS` per kind of answer: adding a fact is one row),
and the *quick facts* a rank needs to plan, derived with the planner's own rules
(:func:`derive`: each CPU node's CPUs, each reachable device's node, each node's cores and
priority cores, whether MPOL_PREFERRED_MANY exists), which ``_numabind_start``'s fast path
reads without importing numabind.  Each rank then plans from the shared machine with its
own visibility: the devices a rank sees are not part of the key.

**The key** (``_numabind_start.cache_key``): the boot, the kernel release, the mount
namespace (a container's /sys and /proc/driver are its own), the user, the cgroup (its
path, and the cpuset's cpus and mems files' contents, read again by every rank), the
sysroot and its identity, and the code that wrote the file (numabind's version, its
files).  Any change is another file.

**The rules of the registry apply** (the one copy is in ``_numabind_start``): a per-user
directory ``<base>/numabind-cache-UID`` (``base`` as for the registry) owned by the user,
mode 0700, never opened through a link; the file written to a fresh name and renamed into
place; read only if it is a regular file of the user's, at most :data:`CACHE_CAP` bytes,
whose header says this format, whose length and checksum match and whose key is this
process's.  Anything else is refused and the rank reads sysfs itself, silently (verbose
mode says why).  Ranks that start at once and find no file do not all read: one takes the
lock (``flock`` on ``<file>.lock``: released when its holder dies) and reads; the others
wait at most :data:`WAIT` seconds for its file, then read themselves.  At most
:data:`MAX_FILES` machine files are kept per user (the oldest go first).

``NUMABIND_CACHE=0`` turns it off: the machine is read from sysfs, nothing is written.
"""

from __future__ import annotations

import os
import sys

import _numabind_fast as fast

from . import _sysfs
from ._dra import DraDevice
from ._model import (
    BY_KEY,
    POLICIES,
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
from ._sources import Source

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import TypeVar

    from ._topology import Machine

    T = TypeVar("T")

CACHE_CAP = fast.CACHE_CAP
WAIT = 5.0  # seconds a rank waits for another rank's reading (its lock) before reading itself
MAX_FILES = 32  # machine files kept per user (a cpuset per job step, a boot each)
OFF = ("0", "off", "no", "false")


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
    """One kind of answer a :class:`Source` gives: the method, and how a call's arguments
    name the answer (``argkey``: ``None`` for a method without arguments)."""

    method: str
    argkey: Callable[..., str] | None = None
    records: tuple[type[Record], ...] = ()  # the record classes its answers hold


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


# Every answer the machine layer asks for.  A new fact a branch adds to Source (memory
# tiers, NICs read only when asked) is one row here, and the cache holds it.
FACTS: tuple[Fact, ...] = (
    Fact(method="online_cpus"),
    Fact(method="node_ids"),
    Fact(method="node", argkey=_node_key, records=(Node,)),
    Fact(method="cpu_package", argkey=_cpu_key),
    Fact(method="cpu_siblings", argkey=_cpu_key),
    Fact(method="cpu_cache", argkey=_cpu_key),
    Fact(method="allowed", records=(Allowed,)),
    Fact(method="core_kinds", records=(CoreKinds,)),
    Fact(
        method="accelerators",
        argkey=lambda detail=False: str(int(bool(detail))),
        records=(Accelerator,),
    ),
    Fact(method="accelerator", argkey=_acc_key, records=(Accelerator,)),
    Fact(method="locate", argkey=lambda acc: _escape(acc.pci), records=(Accelerator,)),
    Fact(method="pci_path", argkey=_text_key),
    Fact(method="nics", records=(Nic, NicPort)),
    Fact(method="ethernet", argkey=_sets_key, records=(Nic, NicPort)),
    Fact(method="others", records=(OtherDevice,)),
    Fact(method="driver_gpus", argkey=_text_key),
    Fact(method="dra_devices", records=(DraDevice,)),
    Fact(method="kernel_release"),
    Fact(method="numa_balancing"),
    Fact(method="cpu_vendor"),
    Fact(method="partition_nodes", argkey=_vendor_key, records=(KfdNode,)),
    Fact(method="partition_modes", argkey=_vendor_key),
)
BY_METHOD = {f.method: f for f in FACTS}
_RECORDS: dict[str, type[Record]] = {cls.__name__: cls for f in FACTS for cls in f.records}


# --- values as text ------------------------------------------------------------------------------

_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:/-+,=@")


_SAFE_TEXT = "".join(sorted(_SAFE))


def _escape(text: str) -> str:
    if not text.strip(_SAFE_TEXT):
        return text  # nothing to escape (PCI addresses, CPU lists, names): the common case
    return "".join(
        c if c in _SAFE else "%" + "%".join(f"{b:02x}" for b in c.encode()) for c in text
    )


def _unescape(text: str) -> str:
    if "%" not in text:
        return text
    out = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "%":
            out.append(int(text[i + 1 : i + 3], 16))
            i += 3
        else:
            out += text[i].encode()
            i += 1
    return out.decode("utf-8")


def encode(value: object) -> str:
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
        return " ".join(["(", *(encode(v) for v in value), ")"])
    if isinstance(value, Record) and type(value).__name__ in _RECORDS:
        fields = (encode(getattr(value, n)) for n in value._fields)
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


def decode(tokens: Tokens) -> object:
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
        return tuple(_items(tokens))
    if head == "R":
        cls = _RECORDS.get(rest)
        if cls is None or tokens.next() != "(":
            raise ValueError(f"not a cached record: {rest[:40]!r}")
        values = _items(tokens)
        if len(values) != len(cls._fields):
            raise ValueError(f"{rest}: {len(values)} fields, not {len(cls._fields)}")
        return cls(**dict(zip(cls._fields, values)))
    raise ValueError(f"not a value: {token[:40]!r}")


def _items(tokens: Tokens) -> list[object]:
    """The values up to the closing parenthesis (consumed)."""
    items: list[object] = []
    while tokens.peek() != ")":
        items.append(decode(tokens))
    tokens.next()
    return items


def _set(text: str) -> frozenset[int]:
    found = _SETS.get(text)
    if found is None:
        found = fast.parse_cpulist(text, _sysfs.MAX_CPUS)
        if found is None:
            raise ValueError(f"a bad set {text[:40]!r}")
        if len(_SETS) < 1 << 16:
            _SETS[text] = found  # one object per distinct list, as the live reader keeps
    return found


# the sets decoded so far, by their text: a machine repeats the same lists (every CPU of a
# core, every GPU of a node), and a crafted file repeating a 16,384-CPU list costs one set
_SETS: dict[str, frozenset[int]] = {}


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


# --- the quick facts: what a rank needs to plan, by the planner's own rules --------------------


def wants(mode: str, smt: str, priority: str, reserve: object = "") -> frozenset[str]:
    """The optional quick facts a rank planning in ``mode`` with ``smt``, ``priority`` and
    ``reserve`` needs: ``cores`` (exclusive mode, SMT 1, a reservation, priority roles),
    ``kinds`` (priority roles)."""
    out: set[str] = set()
    if mode == "exclusive" or smt == "1" or priority in ("rank", "main") or reserve:
        out.add("cores")
    if priority in ("rank", "main"):
        out.add("kinds")
    return frozenset(out)


def derive(machine: Machine, want: frozenset[str]) -> list[str]:
    """The ``q`` lines of a cache file (see ``_numabind_start._Machine``), read through
    ``machine`` (a recording one: what they cost is then in the record too)."""
    from ._devices import reachable
    from ._plan import device_node, groups, package_nodes

    fmt = _sysfs.format_cpulist
    lines: list[str] = []
    nodes = machine.cpu_nodes
    machine.smt  # noqa: B018  # every plan asks (the thread budget): in the record, then
    for n in nodes:
        lines.append(f"node {n.id} {fmt(n.cpus)}")
    # memory-only nodes (GPU memory, HBM, CXL): the fast path leaves their spill rule to
    # the planner
    lines.append(f"memory-only {fmt(machine.memory_only_ids) or '-'}")
    allowed = machine.allowed
    mems = "-" if allowed.mems is None else fmt(allowed.mems)
    lines.append(f"allowed {fmt(allowed.cpus)} {mems}")
    many = POLICIES["preferred-many"].min_kernel
    lines.append(f"many {int(bool(many is None or machine.kernel_at_least(*many)))}")
    for n in nodes:
        pkg = package_nodes(machine, n.id)
        lines.append(f"package {n.id} {'-' if pkg is None else fmt(pkg)}")
    # the vendors in the order resolve() tries them with no visibility variable, up to the
    # first with devices (a rank sees that one's; CUDA_VISIBLE_DEVICES names NVIDIA's, the
    # first): an AMD or Intel reading scans every PCI function, which an NVIDIA machine's
    # driver list spares
    tried = []
    for vendor in VENDORS:
        tried.append(vendor.key)
        devs, _ = reachable(machine, vendor, {})
        if devs:
            break
    lines.append("vendors " + " ".join(tried))
    for vendor in VENDORS:
        if vendor.key not in tried:
            continue
        devs, _ = reachable(machine, vendor, {})
        if any(dev.partition is not None for dev in devs):
            lines.append(f"partitioned {vendor.key}")  # the fast path hands these over
        for dev in devs:
            node = device_node(machine, dev).node
            detail = machine.detailed(dev)
            label = BY_KEY[vendor.key].label.replace(" ", "_")
            uuid = _escape(detail.uuid) if detail.uuid else "-"
            lines.append(
                f"dev {vendor.key} {dev.pci} {'-' if node is None else node} {label} {uuid}"
            )
    if "cores" in want or "kinds" in want:
        for n in nodes:
            cores = groups(n.cpus & allowed.cpus, machine.siblings_of)
            lines.append(f"cores {n.id} " + " ".join(fmt(g) for g in cores))
            whole = groups(n.cpus, machine.siblings_of)  # what a reservation counts from
            lines.append(f"node-cores {n.id} " + " ".join(fmt(g) for g in whole))
    if "kinds" in want:
        lines.append(f"kinds {int(machine.core_kinds.distinct)}")
        for n in nodes:
            prio = machine.priority_cpus(n.id)
            lines.append(f"prio {n.id} {fmt(prio) if prio else '-'}")
            if prio:
                lines.append(
                    f"prio-cores {n.id} "
                    + " ".join(fmt(g) for g in groups(prio, machine.siblings_of))
                )
    return [f"q {line}" for line in lines]


def _quick_has(quick: dict[str, list[list[str]]], want: frozenset[str]) -> bool:
    return ("cores" not in want or "cores" in quick) and ("kinds" not in want or "kinds" in quick)


def cpuset_files(source: Source, allowed: Allowed) -> list[tuple[str, str]] | None:
    """The cpuset files the key holds (path, contents), read through ``source``'s root;
    None when the allowed set cannot be keyed (a cpuset that exists but is unreadable)."""
    from ._sources import _V1, _V1_NOPREFIX, _V2, SYS_CPU

    root = getattr(source, "root", None)
    if root is None or allowed.problem:
        return None
    if allowed.kind == "online":
        names = [f"{SYS_CPU}/online"]
    elif allowed.directory is not None and allowed.kind in ("cgroup-v1", "cgroup-v2"):
        tables = (_V2,) if allowed.kind == "cgroup-v2" else (_V1, _V1_NOPREFIX)
        names = [f"{allowed.directory}/{n}" for t in tables for n in t if n]
    else:
        return None
    out = []
    for path in dict.fromkeys(names):
        text = root.opt(path)
        out.append((path, "-" if text is None else text.strip()))
    return out


def render(
    key: str, memo: dict[str, dict[str, object]], quick: list[str], extra: dict[str, object]
) -> bytes:
    """The whole file: header (format, length, checksum), key, quick facts, the record."""
    lines = [f"key {key}", *quick, "--"]
    for method, answers in memo.items():
        for argkey, value in answers.items():
            lines.append(f"m {method} {argkey} {encode(value)}")
    for name, value in extra.items():
        lines.append(f"x {name} {encode(value)}")
    body = ("\n".join(lines) + "\n").encode("utf-8")
    head = f"numabind-machine {fast.FORMAT} {len(body)} {fast.checksum(body)}\n".encode()
    return head + body


def parse_record(
    data: bytes,
) -> tuple[dict[str, dict[str, object]], dict[str, object]]:
    """The record part of a file :func:`render` wrote (its header already checked):
    (memo, extras).  ``ValueError`` on anything out of place."""
    body = data.partition(b"\n")[2].decode("utf-8")
    memo: dict[str, dict[str, object]] = {}
    extra: dict[str, object] = {}
    seen = False
    for line in body.split("\n"):
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
    """What looking for this process's cache found: the path, the quick facts and the
    record, or why there is none (``why``, for verbose mode and the registry entry)."""

    path: str = ""
    quick: dict[str, list[list[str]]] | None = None
    data: bytes = b""
    why: str = ""


def lookup(environ: Mapping[str, str], sysroot: str) -> Lookup:
    """This process's cache file, validated as ``_numabind_start.read_cache`` validates
    it (key, format, length, checksum, cpuset), with its bytes for :func:`parse_record`."""
    key, _ = fast.cache_key(sysroot)
    fd, label, why = fast.open_cache_dir(environ, False, _base(environ))
    if fd is None:
        first = why.split(";", 1)[0]
        if "cannot be opened (No such file" in first:
            return Lookup(why="no cache yet")
        return Lookup(why=f"no cache directory ({why})")
    name = fast.cache_name(key)
    try:
        bad, data, _ = fast.read_private(fd, name, (os.geteuid(),), CACHE_CAP)
    finally:
        os.close(fd)
    path = f"{label}/{name}"
    if bad is not None:
        return Lookup(path=path, why=fast.refusal(bad, path))
    quick, why = fast.parse_cache(data, key)
    if quick is None:
        return Lookup(path=path, why=f"{path} refused: {why}")
    files = [(t[0], " ".join(t[1:])) for t in quick.get("cpuset-file", [])]
    if not fast.cpuset_holds(sysroot, files):
        return Lookup(path=path, why=f"{path} refused: another cpuset")
    return Lookup(path=path, quick=quick, data=data)


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


def _prune(dir_fd: int, keep: str) -> None:
    """At most :data:`MAX_FILES` machine files (and their locks) per user: the oldest go."""
    try:
        names = [n for n in os.listdir(dir_fd) if n.startswith("machine-") and "." not in n]
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


def write(
    environ: Mapping[str, str], sysroot: str, machine: Machine, want: frozenset[str]
) -> tuple[str, bytes, dict[str, list[list[str]]]] | None:
    """Derive the quick facts of ``machine`` (recording), and write the file; returns
    (its path, its bytes, its quick facts), or None when this machine cannot be cached (its
    cpuset unreadable, no usable directory)."""
    source = machine.source
    if not isinstance(source, Recording):
        return None
    key, _ = fast.cache_key(sysroot)
    quick = derive(machine, want)
    inner = source.inner
    files = cpuset_files(inner, machine.allowed)
    if files is None:
        return None
    quick += [f"q cpuset-file {p} {t}" for p, t in files]
    extra: dict[str, object] = {
        "warnings": tuple(source.warnings),
        "description": source.description,
    }
    if source.environ is not None:
        extra["environ"] = tuple(f"{k}={v}" for k, v in sorted(source.environ.items()))
    data = render(key, source.memo, quick, extra)
    if len(data) > CACHE_CAP:
        return None
    fd, label, _ = fast.open_cache_dir(environ, True, _base(environ))
    if fd is None:
        return None
    name = fast.cache_name(key)
    try:
        if fast.write_private(fd, name, data, "machine") is not None:
            return None
        _prune(fd, name)
    finally:
        os.close(fd)
    return f"{label}/{name}", data, quick_facts(quick)


def quick_facts(lines: list[str]) -> dict[str, list[list[str]]]:
    """``q`` lines as the fast path reads them: fact name -> each line's tokens."""
    out: dict[str, list[list[str]]] = {}
    for line in lines:
        tokens = line.split(" ")
        out.setdefault(tokens[1], []).append(tokens[2:])
    return out


# --- the machine a rank plans from ---------------------------------------------------------------


def _live(sysroot: str) -> Source:
    from ._topology import Machine

    return Machine.from_root(sysroot).source


def from_file(
    data: bytes,
    sysroot: str,
    environ: Mapping[str, str] | None = None,
    quick: dict[str, list[list[str]]] | None = None,
) -> Machine:
    """The machine of a cache file's record (``ValueError`` when it is out of place);
    with ``environ``, closing it writes back what it had to read (with the optional quick
    facts the file had: ``quick``)."""
    had = frozenset(n for n in ("cores", "kinds") if quick and n in quick)
    from ._topology import Machine

    memo, extra = parse_record(data)
    recorded = extra.get("environ")  # the source's own (a capture's recorded variables)
    source_env = dict(e.split("=", 1) for e in recorded) if isinstance(recorded, tuple) else None
    warnings = extra.get("warnings", ())
    description = extra.get("description", "live system")
    keep = None
    if environ is not None:
        process_env = environ  # where this process's cache directory is

        def keep(source: Cached) -> None:
            from ._topology import Machine

            write(process_env, sysroot, Machine(source), had)

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
    ``sysfs`` or ``sysfs (cache: why not)``; check and doctor say it)."""

    machine: Machine
    origin: str
    path: str = ""
    # its quick facts, where this opening has them at hand (a file read, a reading written)
    quick: dict[str, list[list[str]]] | None = None


def open_machine(
    sysroot: str,
    environ: Mapping[str, str],
    want: frozenset[str] = frozenset(),
    wait: float = WAIT,
) -> Opened:
    """The machine under ``sysroot`` for a rank: from this process's cache file when it
    holds what ``want`` asks for; else read, under the lock, and written for the others
    (a rank that cannot take the lock waits at most ``wait`` seconds for the other's file,
    then reads itself).  Never raises for a cache problem: the machine is then read."""
    from ._topology import Machine

    if not enabled(environ):
        return Opened(machine=Machine.from_root(sysroot), origin="sysfs (NUMABIND_CACHE=0)")
    found = lookup(environ, sysroot)
    if found.quick is not None and _quick_has(found.quick, want):
        try:
            machine = from_file(found.data, sysroot, environ, found.quick)
            return Opened(machine=machine, origin="cache", path=found.path, quick=found.quick)
        except (ValueError, TypeError, UnicodeDecodeError) as err:
            found = Lookup(why=f"{found.path} refused: a damaged record ({err})")
    elif found.quick is not None:
        found = Lookup(why=f"{found.path} lacks {', '.join(sorted(want))}: read and added")
    return _read_under_lock(sysroot, environ, want, wait, found.why)


def _read_under_lock(
    sysroot: str, environ: Mapping[str, str], want: frozenset[str], wait: float, why: str
) -> Opened:
    from ._topology import Machine

    key, _ = fast.cache_key(sysroot)
    fd, _label, bad = fast.open_cache_dir(environ, True, _base(environ))
    if fd is None:
        machine = Machine(Recording(Machine.from_root(sysroot).source))
        return Opened(machine=machine, origin=f"sysfs (cache: {bad})")
    lock = _Lock(fd, fast.cache_name(key))
    try:
        deadline = _now() + wait
        while not lock.take():
            found = lookup(environ, sysroot)
            if found.quick is not None and _quick_has(found.quick, want):
                try:
                    machine = from_file(found.data, sysroot, environ, found.quick)
                    return Opened(
                        machine=machine, origin="cache", path=found.path, quick=found.quick
                    )
                except (ValueError, TypeError, UnicodeDecodeError):
                    pass
            if _now() >= deadline or lock.fd is None:
                why = f"another rank held the lock for {wait:g} s" if lock.fd else why
                machine = Machine(Recording(Machine.from_root(sysroot).source))
                return Opened(machine=machine, origin=f"sysfs (cache: {why})")
            _sleep(0.002)
        found = lookup(environ, sysroot)  # the rank before us may have written it meanwhile
        if found.quick is not None and _quick_has(found.quick, want):
            try:
                machine = from_file(found.data, sysroot, environ, found.quick)
                return Opened(machine=machine, origin="cache", path=found.path, quick=found.quick)
            except (ValueError, TypeError, UnicodeDecodeError):
                pass
        machine = Machine(Recording(Machine.from_root(sysroot).source))
        written = write(environ, sysroot, machine, want)
        if written is None:
            return Opened(machine=machine, origin=f"sysfs (cache: {why})")
        return Opened(
            machine=machine,
            origin=f"sysfs (cache: {why}; written)",
            path=written[0],
            quick=written[2],
        )
    finally:
        lock.close()
        os.close(fd)


def here(environ: Mapping[str, str] | None = None, want: frozenset[str] = frozenset()) -> Machine:
    """This machine as numabind's commands and API read it (``Machine.here()``: ``/``, or
    NUMABIND_SYSROOT under its rules), through the cache: the slow files (the CPUs' kinds)
    are read once per node, whoever asks first; what a reading adds is written back when
    the machine is closed."""
    env = os.environ if environ is None else environ
    raw = env.get("NUMABIND_SYSROOT")
    sysroot = _sysfs.redirect(
        "NUMABIND_SYSROOT", raw, "/", own=env is os.environ, registry=False, notes=[]
    )
    return open_machine(sysroot, env, want).machine


def fill(
    environ: Mapping[str, str], sysroot: str, want: frozenset[str]
) -> tuple[dict[str, list[list[str]]], str, str]:
    """For the fast path of a rank that found no usable cache: read (or wait for) the
    machine and its file, and hand back (its quick facts, the file's path or "", where the
    machine came from).  Where no file could be written the quick facts are derived in
    memory: the rank still plans from one reading of sysfs."""
    opened = open_machine(sysroot, environ, want)
    try:
        if opened.quick is not None and _quick_has(opened.quick, want):
            return opened.quick, opened.path, opened.origin
        return quick_facts(derive(opened.machine, want)), "", opened.origin
    finally:
        opened.machine.close()


def _now() -> float:
    import time

    return time.monotonic()


def _sleep(seconds: float) -> None:
    import time

    time.sleep(seconds)


def status(environ: Mapping[str, str], sysroot: str) -> str:
    """One line for ``doctor``: where this process's machine would come from."""
    if not enabled(environ):
        return "off (NUMABIND_CACHE=0): every rank reads sysfs"
    found = lookup(environ, sysroot)
    if found.quick is not None:
        return f"{found.path}: valid for this process (boot, kernel, cgroup and cpuset match)"
    return found.why


__all__ = [
    "FACTS",
    "Cached",
    "Fact",
    "Opened",
    "Recording",
    "derive",
    "fill",
    "here",
    "lookup",
    "open_machine",
    "status",
    "write",
]
del sys
