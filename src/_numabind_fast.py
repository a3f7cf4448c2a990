"""The warm start of a rank: plan and bind it from the node's cached machine without
importing numabind (``_numabind_start`` decides first whether there is anything to bind).

Planning a rank with the full pipeline imports about fifteen modules, ~5 ms of a ~12 ms
interpreter start; a ``numactl`` trampoline costs ~1 ms.  Every rank of a node plans from
the same machine, so the machine is read once per node and cached (:mod:`numabind._cache`
writes it), with what a rank needs to plan already derived there by the planner's own
rules (each device's node, each node's cores and priority cores, whether
MPOL_PREFERRED_MANY exists).  With that file this module plans and binds a rank: its
visible devices, the mode's CPUs, the priority roles, the memory policy, the keep/replace
rule for a mask in place, the binding, the registry entry ``numabind check`` reads and the
state children inherit.  It decides only what it can decide exactly as the full path does;
anything else (a mask someone else set, a refused call, a second thread, a visibility list
it does not resolve alone, a cache missing, stale or damaged after the machine was read) it
hands to the full path, undoing first whatever it applied (``tests/test_fast.py`` holds
the two to the same answer).  Where no cache file is there, numabind reads the machine once
for the node (under a lock) and this module plans from what that reading derived.

**Shared with the package, one copy each** (importable before numabind, costing no package
import): the per-user private directories and files of the registry and the cache
(:func:`private_dir`, :func:`write_private`, :func:`read_private`), the cache's key and
file format (:func:`cache_key`, :func:`parse_cache`) and CPU lists (:func:`cpulist`,
:func:`parse_cpulist`).  Only ``os``, ``sys`` and ``stat`` at import (``_ctypes`` once a
memory policy is set, ``atexit`` once an entry is written); every read bounded and
non-blocking; nothing raises out of :func:`bind_rank` but what it did not foresee, after
undoing what it applied.
"""

import os
import stat
import sys

import _numabind_start as start
from _numabind_start import Handover, _registry_base

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

    Env = MutableMapping[str, str]
    # where a rank goes: (node, reason, PCI address, device index, its peers on the node)
    Place = tuple[int, str, str, "int | None", "tuple[int, int] | None"]

_VISIBILITY = start._VISIBILITY
DEFAULT_BASE = start.DEFAULT_BASE
failed = start.failed

# --- CPU lists, bounded ------------------------------------------------------------------------

MAX_CPUS = 16384  # numabind._sysfs.MAX_CPUS (a test keeps them in step)


def cpulist(cpus: "object") -> str:
    """``0-3,8``: the kernel's list form of a set of ints."""
    out: list[str] = []
    start = prev = -2
    for c in sorted(cpus):  # type: ignore[call-overload]
        if c == prev + 1:
            prev = c
            continue
        if start >= 0:
            out.append(f"{start}-{prev}" if prev > start else str(start))
        start = prev = c
    if start >= 0:
        out.append(f"{start}-{prev}" if prev > start else str(start))
    return ",".join(out)


def parse_cpulist(text: str, limit: int = MAX_CPUS) -> "frozenset[int] | None":
    """The kernel's list form back to a set, every number below ``limit``; None when it is
    not one (this module's readers refuse what they cannot parse exactly)."""
    text = text.strip()
    if not text:
        return frozenset()
    if len(text) > 1 << 16:
        return None
    out: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        if not (lo.isascii() and lo.isdigit() and len(lo) < 6):
            return None
        a = int(lo)
        b = a
        if sep:
            if not (hi.isascii() and hi.isdigit() and len(hi) < 6):
                return None
            b = int(hi)
        if b < a or b >= limit:
            return None
        out.update(range(a, b + 1))
    return frozenset(out)


# --- small files, read as numabind._sysfs reads them: bounded, non-blocking, regular only -------

_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


def read_small(path: str, cap: int = 65536, dir_fd: "int | None" = None) -> "bytes | None":
    """At most ``cap`` bytes of a regular file, or None (absent, not regular, unreadable,
    larger than ``cap``)."""
    try:
        fd = os.open(path, _READ, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        parts, size = [], 0
        while size <= cap:  # procfs files report no size: read until the end, bounded
            chunk = os.read(fd, min(cap + 1 - size, 65536))
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        return b"".join(parts) if size <= cap else None
    except OSError:
        return None
    finally:
        os.close(fd)


def _text(path: str, cap: int = 65536) -> "str | None":
    data = read_small(path, cap)
    return None if data is None else data.decode("utf-8", "replace").strip()


# --- private files in shared places (the registry's and the cache's rules) ---------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def base_ok(fd: int, uid: int) -> "str | None":
    """None if a per-user directory may be created in this base, else why not: the base
    must be root's or the user's, and sticky if others may write it."""
    st = os.fstat(fd)
    if st.st_uid not in (0, uid):
        return f"owned by uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        return "writable by others without the sticky bit"
    return None


def private_dir(
    parent_fd: int, name: str, uid: int, create: bool
) -> "tuple[int | None, str | None]":
    """Open (creating with mode 0700 when asked) a directory ``name`` under ``parent_fd``
    that ``uid`` owns and nobody else may write; (fd, None) or (None, why not).  Never
    through a link."""
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


def candidates(
    base: str, environ: "Mapping[str, str]", uid: int, name: str, fallback: str
) -> "list[tuple[str, str, str]]":
    """(parent directory, name, label) where uid's private directory ``name`` may live,
    best first: the shared ``base``, then the user's runtime directory
    ($XDG_RUNTIME_DIR/``fallback`` for this process's own uid, /run/user/UID for others)."""
    out = [(base, name, f"{base.rstrip('/')}/{name}")]
    get = getattr(environ, "get", None)
    xdg = (get("XDG_RUNTIME_DIR", "") if get else "") if uid == os.geteuid() else f"/run/user/{uid}"
    if isinstance(xdg, str) and xdg.startswith("/") and len(xdg) < 4096:
        out.append((xdg, fallback, f"{xdg.rstrip('/')}/{fallback}"))
    return out


def open_user_dir(
    places: "list[tuple[str, str, str]]", base: str, uid: int, create: bool
) -> "tuple[int | None, str | None, list[str]]":
    """The first usable private directory of ``places`` (:func:`candidates`): (fd, its
    path, why the others failed)."""
    why: list[str] = []
    for parent, name, label in places:
        try:
            pfd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as err:
            why.append(f"{parent} cannot be opened ({err.strerror})")
            continue
        try:
            if parent != base:
                st = os.fstat(pfd)  # XDG_RUNTIME_DIR must be uid's own, private
                if st.st_uid != uid or st.st_mode & 0o077:
                    why.append(f"{parent} is not a private directory of uid {uid}")
                    continue
            else:
                bad = base_ok(pfd, uid)
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


def write_private(fd: int, name: str, data: bytes, tag: str) -> "str | None":
    """Write ``data`` as ``name`` in the private directory ``fd``: to a fresh unpredictable
    name with O_CREAT|O_EXCL|O_NOFOLLOW, checked to be a regular file of ours, then renamed
    into place (atomic).  Returns None, or why it was not written."""
    uid = os.geteuid()
    tmp = f".{tag}.{os.getpid()}.{os.urandom(8).hex()}"
    try:
        wfd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
            0o600,
            dir_fd=fd,
        )
    except OSError as err:
        return f"not written ({err.strerror or err})"
    try:
        try:
            st = os.fstat(wfd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid:
                return "could not be created safely"
            view = memoryview(data)
            while view:
                view = view[os.write(wfd, view) :]
        finally:
            os.close(wfd)
        os.rename(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError as err:
        try:
            os.unlink(tmp, dir_fd=fd)
        except OSError:
            pass
        return f"not written ({err.strerror or err})"
    return None


def read_private(
    fd: int, name: str, owners: "tuple[int, ...]", cap: int
) -> "tuple[str | None, bytes, int]":
    """A file of a private directory: (None, its bytes, its owner) or (why it is refused:
    ``special`` for a link, a FIFO or anything not regular, ``foreign`` for a file of
    another owner, ``huge`` for one larger than ``cap``, ``missing``; b"", -1)."""
    try:
        efd = os.open(name, _READ | os.O_NOFOLLOW, dir_fd=fd)
    except OSError as err:  # absent; one's own directory holding a file one may not read;
        # a link (O_NOFOLLOW) or anything else that will not open
        why = "missing" if isinstance(err, FileNotFoundError) else "special"
        return ("foreign" if isinstance(err, PermissionError) else why), b"", -1
    try:
        st = os.fstat(efd)
        if not stat.S_ISREG(st.st_mode):
            return "special", b"", -1
        if st.st_uid not in owners:
            return "foreign", b"", -1
        if st.st_size > cap:
            return "huge", b"", -1
        data = os.read(efd, cap + 1)
        if len(data) > cap:
            return "huge", b"", -1
        return None, data, st.st_uid
    except OSError:
        return "special", b"", -1
    finally:
        os.close(efd)


# --- the cache: its key and its file -----------------------------------------------------------

# the file format: bump FORMAT whenever what is written changes (an old file is then
# stale: read as "another format", never misread)
FORMAT = 1
CACHE_DIR = "numabind-cache-"  # <base>/numabind-cache-UID (the registry's is numabind-UID)
CACHE_FALLBACK = "numabind-cache"  # $XDG_RUNTIME_DIR/numabind-cache
CACHE_CAP = 4 << 20  # bytes: a 8192-CPU machine with every fact is ~1 MiB
CHECK_MODULUS = (1 << 61) - 1


def checksum(data: bytes) -> int:
    """The body as one integer modulo a Mersenne prime: computed in C by ``int``, so that
    a rank checks its whole file in microseconds; it finds truncation and damage (it is not
    a signature: who may write the file is the directory's owner, checked on open)."""
    return int.from_bytes(data, "little") % CHECK_MODULUS


def _code_files() -> "tuple[str, ...]":
    """The files whose code decides what a cache file holds: the two start modules, the
    package's
    ``__init__`` (where the version lives) and the modules that read and derive the
    machine.  Their sizes and times are the key's version part: a new numabind, or an
    edited checkout, writes another file (tests/test_fast.py keeps the list complete).
    The package is found where the import system would find it (the first ``sys.path``
    entry holding it: an editable install keeps it apart from this module), without
    importing it."""
    pkg = ""
    loaded = getattr(sys.modules.get("numabind"), "__file__", None)
    if isinstance(loaded, str):  # numabind is loaded (the isolated collector loads it
        pkg = os.path.dirname(os.path.abspath(loaded))  # from a directory not on sys.path)
    for entry in sys.path if not pkg else ():
        if entry and os.path.isfile(os.path.join(entry, "numabind", "__init__.py")):
            pkg = os.path.join(entry, "numabind")
            break
    names = (
        *("__init__", "_cache", "_plan", "_sources", "_topology", "_devices", "_model"),
        *("capture/_hwloc", "_dra", "_sysfs"),
    )
    here = (os.path.abspath(__file__), os.path.abspath(start.__file__))
    return (*here, *(os.path.join(pkg, f"{n}.py") for n in names if pkg))


def _code_id() -> str:
    out = []
    for path in _code_files():
        try:
            st = os.stat(path)
            out.append(f"{st.st_size}.{st.st_mtime_ns}")
        except OSError:
            out.append("-")
    return ",".join(out)


def cache_key(sysroot: str) -> "tuple[str, list[tuple[str, str]]]":
    """What changes the machine reading, as (key text, the files whose contents the key
    holds).  The file's name is a hash of the key; the key itself is in the file and is
    compared whole.  Not in it: the devices a rank sees (each rank plans from the shared
    machine with its own visibility).  The cpuset's own contents are not known here: the
    file lists the cpuset files it was made with, and :func:`cpuset_holds` reads them."""
    live = sysroot in ("", "/")
    parts: list[tuple[str, str]] = []
    boot = _text("/proc/sys/kernel/random/boot_id", 128) or "?"
    parts.append(("boot", boot))
    parts.append(("kernel", os.uname().release))
    try:
        parts.append(("mnt", os.readlink("/proc/self/ns/mnt")))
    except OSError:
        parts.append(("mnt", "?"))
    parts.append(("uid", str(os.geteuid())))
    if live:
        parts.append(("sysroot", "/"))
        cgroup = _text("/proc/self/cgroup", 65536)
    else:
        try:
            st = os.stat(sysroot)
            ident = f"{st.st_dev}.{st.st_ino}.{st.st_uid}.{st.st_mtime_ns}"
        except OSError:
            ident = "?"
        parts.append(("sysroot", f"{sysroot}|{ident}"))
        cgroup = _text(sysroot.rstrip("/") + "/proc/self/cgroup", 65536)
    parts.append(("cgroup", cgroup if cgroup is not None else "-"))
    parts.append(("version", f"{FORMAT}|{_code_id()}"))
    key = "|".join(f"{k}={v}" for k, v in parts).replace("\n", ";").replace(" ", "_")
    return key, parts


def cache_name(key: str) -> str:
    """The file's name: a hash of the key (the key itself is in the file, compared whole)."""
    return f"machine-{checksum(key.encode('utf-8', 'replace')):016x}"


def cpuset_holds(sysroot: str, files: "list[tuple[str, str]]") -> bool:
    """Whether each cpuset file the cache was made with (path, contents) still says the
    same: the key's cpuset and mems part (the cache knows where its cgroup's files are)."""
    prefix = "" if sysroot in ("", "/") else sysroot.rstrip("/")
    for path, text in files:
        got = _text(prefix + path, 65536)
        if (got if got is not None else "-") != text:
            return False
    return True


def parse_cache(data: bytes, key: str) -> "tuple[dict[str, list[list[str]]] | None, str]":
    """The file's quick facts (``q`` lines: name -> their token lists) and its whole
    text's lines, or (None, why it is refused): another format, another key, truncated,
    damaged."""
    head, sep, body = data.partition(b"\n")
    fields = head.split(b" ")
    if not sep or len(fields) != 4 or fields[0] != b"numabind-machine":
        return None, "not a numabind machine file"
    if fields[1] != str(FORMAT).encode():
        return None, f"format {fields[1].decode('ascii', 'replace')[:8]}, not {FORMAT}"
    if not (fields[2].isdigit() and fields[3].isdigit()):
        return None, "a damaged header"
    if int(fields[2]) != len(body):
        return None, f"truncated ({len(body)} of {int(fields[2])} bytes)"
    if int(fields[3]) != checksum(body):
        return None, "damaged (its checksum does not match)"
    end = body.find(b"\n--\n")  # the quick facts end there; the record is numabind's to read
    try:
        text = body[: end if end >= 0 else len(body)].decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    lines = text.split("\n")
    if not lines or lines[0] != f"key {key}":
        return None, "made for another machine reading (boot, kernel, cgroup, sysroot or version)"
    quick: dict[str, list[list[str]]] = {}
    for line in lines[1:]:
        if line.startswith("q "):
            tokens = line.split(" ")
            quick.setdefault(tokens[1], []).append(tokens[2:])
    return quick, ""


def open_cache_dir(
    env: "Mapping[str, str]", create: bool, base: "str | None" = None
) -> "tuple[int | None, str | None, str]":
    """This user's cache directory under ``base`` (default: the registry's base as this
    module decides it): (fd, its path, "") or (None, None, why not)."""
    base = base or _registry_base(env)
    if base is None:
        return None, None, "NUMABIND_REGISTRY is set for root (the full path decides)"
    uid = os.geteuid()
    places = candidates(base, env, uid, f"{CACHE_DIR}{uid}", CACHE_FALLBACK)
    try:
        fd, label, why = open_user_dir(places, base, uid, create)
    except OSError as err:
        return None, None, f"unusable ({err.strerror or err})"
    if fd is None:
        return None, None, "; ".join(why) or "no usable directory"
    return fd, label, ""


def refusal(bad: str, path: str) -> str:
    """Why a cache file of :func:`read_private`'s answer ``bad`` is not read, in words."""
    return {
        "missing": "no cache yet",
        "special": f"{path} is not a regular file (a link or a device): refused",
        "foreign": f"{path} is another user's: refused",
        "huge": f"{path} is larger than {CACHE_CAP >> 20} MiB: refused",
    }.get(bad, f"{path}: {bad}")


def read_cache(
    env: "Mapping[str, str]", sysroot: str
) -> "tuple[dict[str, list[list[str]]] | None, str, str]":
    """The warm machine of this process: (quick facts, the file's path, "") or (None,
    "", why not).  Refused, silently, when missing, stale, foreign or damaged."""
    key, _ = cache_key(sysroot)
    fd, label, why = open_cache_dir(env, create=False)
    if fd is None:
        return None, "", f"no cache directory ({why})"
    name = cache_name(key)
    try:
        bad, data, _owner = read_private(fd, name, (os.geteuid(),), CACHE_CAP)
    finally:
        os.close(fd)
    path = f"{label}/{name}"
    if bad is not None:
        return None, "", refusal(bad, path)
    quick, why = parse_cache(data, key)
    if quick is None:
        return None, "", f"{path} refused: {why}"
    files = [(t[0], " ".join(t[1:])) for t in quick.get("cpuset-file", [])]
    if not cpuset_holds(sysroot, files):
        return None, "", f"{path} refused: this process's cpuset is not the one it was made in"
    return quick, path, ""


# numabind._model.MEMORY_POLICY_TABLE: the kernel's MPOL codes and how pages are moved
_POLICY_CODE = {
    "default": 0,
    "preferred": 1,
    "bind": 2,
    "interleave": 3,
    "local": 4,
    "preferred-many": 5,
}
_MIGRATE_AS = {
    "preferred": "bind",
    "bind": "bind",
    "interleave": "interleave",
    "local": "bind",
    "preferred-many": "bind",
}
# numabind._kernel.SYSCALLS: get_mempolicy and set_mempolicy by architecture
_SYSCALLS = {"x86_64": (239, 238), "aarch64": (236, 237)}
MAX_NODES = 1024  # numabind._sysfs.MAX_NODES: node masks are this many bits


class _Machine:
    """The quick facts of a cache file, as the fast planner asks for them."""

    def __init__(self, quick: "dict[str, list[list[str]]]") -> None:
        self.q = quick
        self.nodes: dict[int, frozenset[int]] = {}
        for t in quick.get("node", []):
            cpus = parse_cpulist(t[1]) if len(t) == 2 else None
            if cpus is None or not t[0].isdigit():
                raise Handover("a damaged cache line (node)")
            self.nodes[int(t[0])] = cpus
        allowed = quick.get("allowed", [[]])[0]
        if len(allowed) != 2:
            raise Handover("a damaged cache line (allowed)")
        cpus = parse_cpulist(allowed[0])
        self.allowed = cpus if cpus is not None else frozenset()
        self.mems = None if allowed[1] == "-" else parse_cpulist(allowed[1], MAX_NODES)
        self.many = quick.get("many", [["0"]])[0] == ["1"]
        self.devices: dict[str, list[tuple[str, int | None, str, str]]] = {}
        for t in quick.get("dev", []):
            if len(t) != 5:
                raise Handover("a damaged cache line (dev)")
            vendor, pci, node, label, uuid = t
            self.devices.setdefault(vendor, []).append(
                (pci, int(node) if node.isdigit() else None, label.replace("_", " "), uuid)
            )
        self.vendors = quick.get("vendors", [[]])[0]
        # set by the planner: every rank's reserved cores here, and this rank's helpers
        self.reserved: frozenset[int] = frozenset()
        self.helpers: frozenset[int] = frozenset()

    def one(self, name: str, node: int) -> "list[str] | None":
        for t in self.q.get(name, []):
            if t and t[0] == str(node):
                return t[1:]
        return None

    def groups(self, name: str, node: int) -> "list[frozenset[int]]":
        found = self.one(name, node)
        if found is None:
            raise Handover(f"the cache does not hold the {name} of node {node} yet")
        out = []
        for g in found:
            cpus = parse_cpulist(g)
            if not cpus:
                raise Handover(f"a damaged cache line ({name})")
            out.append(cpus)
        return out

    def package_nodes(self, node: int) -> "frozenset[int] | None":
        found = self.one("package", node)
        if found is None:
            raise Handover("the cache does not hold the packages")
        return None if found == ["-"] else parse_cpulist(found[0], MAX_NODES)

    def kinds_distinct(self) -> bool:
        found = self.q.get("kinds")
        if not found:
            raise Handover("the cache does not hold the core kinds yet")
        return found[0] == ["1"]

    def priority(self, node: int) -> "frozenset[int]":
        self.kinds_distinct()
        found = self.one("prio", node)
        return (
            frozenset() if not found or found == ["-"] else (parse_cpulist(found[0]) or frozenset())
        )


def _visible(m: _Machine, env: "Env") -> "tuple[list[tuple[str, int | None, str, str]], str]":
    """The devices this process's runtime numbers 0..n-1, and their source in words."""
    get = env.get
    if get("SLURM_STEP_GPUS") is not None or get("SLURM_JOB_GPUS") is not None:
        raise Handover("SLURM_STEP_GPUS/SLURM_JOB_GPUS")
    named = [v for v in _VISIBILITY if get(v) is not None]
    if not named:
        for vendor in m.vendors:
            devs = m.devices.get(vendor, [])
            if devs:
                return (
                    devs,
                    f"all {len(devs)} reachable {vendor} GPU{'s' if len(devs) != 1 else ''}",
                )
        return [], "no accelerator found"
    if named != ["CUDA_VISIBLE_DEVICES"]:
        raise Handover("a visibility variable the fast path does not resolve")
    devs = m.devices.get("nvidia", [])
    if not devs:
        raise Handover("CUDA_VISIBLE_DEVICES without NVIDIA GPUs")
    text = env["CUDA_VISIBLE_DEVICES"].strip()
    if not text or text.startswith("-"):
        raise Handover("CUDA_VISIBLE_DEVICES hides every GPU")
    tokens = text.split(",", len(devs) + 1)
    if len(tokens) > len(devs):
        raise Handover("CUDA_VISIBLE_DEVICES lists more devices than are reachable")
    out: list[tuple[str, int | None, str, str]] = []
    for raw in tokens:
        token = raw.strip()
        if token.isascii() and token.isdigit() and len(token) <= 6:
            i = int(token)
            if i >= len(devs):
                raise Handover("CUDA_VISIBLE_DEVICES: an index out of range")
            dev = devs[i]
        elif token.upper().startswith("GPU-") and len(token) <= 128:
            want = token.lower()
            found = [d for d in devs if d[3] != "-" and d[3].lower().startswith(want)]
            if len(found) != 1:
                raise Handover("CUDA_VISIBLE_DEVICES: a UUID the cache cannot resolve alone")
            dev = found[0]
        else:
            raise Handover("CUDA_VISIBLE_DEVICES: a token the fast path does not resolve")
        if dev in out:
            raise Handover("CUDA_VISIBLE_DEVICES repeats a device")
        out.append(dev)
    return out, f"CUDA_VISIBLE_DEVICES={text[:120]}"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _peers(
    rank: int,
    size: "int | None",
    devs: "list[tuple[str, int | None, str, str]]",
    nodes: "frozenset[int]",
    one_node: bool,
) -> "tuple[int, int] | None":
    """numabind._plan's _device_peers and peers_on_node: this rank's position among the
    local ranks whose devices are on ``nodes``, and how many there are."""
    if size is None:
        if one_node and len(devs) > 1:
            size = len(devs)
        else:
            return None
    if len(devs) == 1 and size > 1:
        return None
    on_node = frozenset(j for j, d in enumerate(devs) if d[1] in nodes)
    if rank % len(devs) not in on_node or rank >= size:
        return None
    full, rem = divmod(size, len(devs))
    count = full * len(on_node) + sum(1 for j in on_node if j < rem)
    position = (rank // len(devs)) * len(on_node) + sum(1 for j in on_node if j < rank % len(devs))
    return position, count


def _split(cores: "list[frozenset[int]]", position: int, count: int) -> "frozenset[int]":
    each, extra = divmod(len(cores), count)
    start = position * each + min(position, extra)
    take = each + (1 if position < extra else 0)
    return frozenset().union(*cores[start : start + take])


def _within(groups: "list[frozenset[int]]", cpus: "frozenset[int]") -> "list[frozenset[int]]":
    return [g & cpus for g in groups if g & cpus]


def plan(
    m: _Machine, env: "Env", cfg: "dict[str, str]", source: str, rank: int, size: "int | None"
) -> "dict[str, object]":
    """numabind._plan.plan for what the fast path decides: the fields of the plan that the
    binding, its registry entry and its state depend on."""
    mode, priority = cfg["mode"], cfg["priority"]
    cpu_nodes = sorted(n for n, c in m.nodes.items() if c)
    if m.q.get("partitioned"):
        # GPUs split into compute partitions (AMD CPX): one PCI function, several devices
        raise Handover("GPU compute partitions: the planner numbers them")
    if m.q.get("memory-only") != [["-"]]:
        # memory-only nodes (a GH200's GPU memory, HBM, CXL): which of them the rank's
        # memory may spill onto is NUMABIND_SPILL's rule (numabind._plan.spill_mask)
        raise Handover("a memory-only node: where memory may spill is the planner's")
    one_node = len(cpu_nodes) <= 1
    if one_node and mode in ("node", "socket") and (priority == "off" or not m.kinds_distinct()):
        return {"status": "skipped"}
    devs, why = _visible(m, env)
    if not devs and (size is None or size <= 1):
        return {"status": "skipped"}  # no accelerator and no local world size: benign
    if devs:
        node, reason, device, index_of, peers = _device_place(m, cfg, rank, size, devs, one_node)
    else:
        node, reason, device, index_of, peers = _cpu_only(m, cfg, rank, size or 0, why, cpu_nodes)
    cpus, pkg, package_peers = _mode_cpus(m, cfg, node, peers, rank, size, devs, one_node)
    prio: frozenset[int] = frozenset()
    main: frozenset[int] = frozenset()
    if priority != "off":
        cpus, main, prio = _priority(m, cfg, node, pkg, cpus, peers, package_peers, rank)
    if cfg["smt"] == "1":
        cores = m.groups("cores", node)
        for n in sorted(pkg or ()):
            if n != node:
                cores = cores + m.groups("cores", n)
        cpus = frozenset(min(g) for g in _within(cores, cpus))
        main = frozenset(min(g) for g in _within(cores, main))
    memory, policy = _memory(m, cfg["memory"], cpus, node)
    return {
        "status": "bound",
        "local_rank": rank,
        "rank_source": source,
        "local_world_size": size,
        "device": device,
        "device_index": index_of,
        "numa_node": node,
        "cpus": cpus,
        "memory_policy": policy,
        "memory_nodes": memory,
        "mode": mode,
        "reason": reason,
        "priority_cpus": prio,
        "main_cpus": main,
        "helpers": m.helpers,
    }


def _device_place(
    m: _Machine,
    cfg: "dict[str, str]",
    rank: int,
    size: "int | None",
    devs: "list[tuple[str, int | None, str, str]]",
    one_node: bool,
) -> "Place":
    """numabind._plan's _pick_device and _device_place: (node, reason, PCI address, device
    index, the rank's peers on the node)."""
    index_of = 0 if len(devs) == 1 else rank % len(devs)
    device, node, label, _ = devs[index_of]
    if node is None or node not in m.nodes:
        raise Handover("the device's node is not known from files alone")
    peers = None
    if cfg["mode"] != "node" or cfg["priority"] != "off":
        peers = _peers(rank, size, devs, frozenset({node}), one_node)
    return node, f"{label} {index_of} ({device}) is on node {node}", device, index_of, peers


def _cpu_only(
    m: _Machine, cfg: "dict[str, str]", rank: int, size: int, why: str, cpu_nodes: "list[int]"
) -> "Place":
    """numabind._plan's _cpu_only_node: ranks spread block-wise over the allowed nodes."""
    if why != "no accelerator found":
        raise Handover("no device is visible")
    nodes = [n for n in cpu_nodes if m.nodes[n] & m.allowed]
    if not nodes or cfg["mode"] == "socket" or cfg["priority"] != "off":
        raise Handover("a CPU-only job the fast path does not spread")
    index = min(rank * len(nodes) // size, len(nodes) - 1)
    node = nodes[index]
    position = rank - _ceil_div(index * size, len(nodes))
    count = _ceil_div((index + 1) * size, len(nodes)) - _ceil_div(index * size, len(nodes))
    plural = "" if size == 1 else "s"
    reason = (
        f"no accelerator visible ({why}): CPU-only job, {size} local rank{plural} spread "
        f"block-wise over nodes {cpulist(nodes)}: node {node}"
    )
    return node, reason, "", None, (position, count)


def _mode_cpus(
    m: _Machine,
    cfg: "dict[str, str]",
    node: int,
    peers: "tuple[int, int] | None",
    rank: int,
    size: "int | None",
    devs: "list[tuple[str, int | None, str, str]]",
    one_node: bool,
) -> "tuple[frozenset[int], frozenset[int] | None, tuple[int, int] | None]":
    """numabind._plan's modes (node, socket, exclusive), less the reserved cores: (the
    rank's CPUs, its package's nodes in socket mode, its peers on that package)."""
    base = m.nodes[node] & m.allowed
    if not base:
        raise Handover("the cgroup forbids every CPU of the device's node")
    mode = cfg["mode"]
    pkg = m.package_nodes(node) if mode == "socket" else None
    reserved: frozenset[int] = frozenset()
    if cfg["reserve"]:
        reserved, m.helpers = _reserve(m, cfg, node, peers, pkg)
    m.reserved = reserved
    base -= reserved
    if mode == "socket":
        if pkg is None:
            return base, None, None
        if not devs:
            raise Handover("a CPU-only job in socket mode")
        others = (m.nodes.get(n, frozenset()) & m.allowed for n in pkg if n != node)
        cpus = frozenset(base.union(*others)) - reserved
        return cpus, pkg, _peers(rank, size, devs, pkg, one_node)
    if mode == "exclusive":
        # what the planner's exclusive mode cannot do it says in a line: the full path's
        if peers is None:
            raise Handover("exclusive mode without the ranks that share the node")
        cores = _within(m.groups("cores", node), base)
        if len(cores) < peers[1]:
            raise Handover("exclusive mode with fewer cores than ranks")
        return _split(cores, peers[0], peers[1]), None, None
    return base, None, None


def _reserve(
    m: _Machine,
    cfg: "dict[str, str]",
    node: int,
    peers: "tuple[int, int] | None",
    pkg: "frozenset[int] | None",
) -> "tuple[frozenset[int], frozenset[int]]":
    """numabind._plan's _reserve: (the cores NUMABIND_RESERVE keeps out of the compute sets
    on the nodes the mode draws from, this rank's helper set)."""
    count, _, scope = cfg["reserve"].partition("/")
    n = int(count)
    ranks = peers[1] if peers else None
    if scope == "rank" and ranks is None:
        raise Handover("a reservation per rank without the ranks that share the node")
    want = n * ranks if scope == "rank" and ranks else n
    nodes = [node, *sorted((pkg or frozenset()) - {node})] if cfg["mode"] == "socket" else [node]
    out: set[int] = set()
    mine: list[frozenset[int]] = []
    for nid in nodes:
        if not m.nodes.get(nid):
            continue
        cores = m.groups("node-cores", nid)
        usable = [c & m.allowed for c in cores if c & m.allowed]
        need = want - (len(cores) - len(usable))
        if need <= 0:
            continue
        if need >= len(usable):
            raise Handover("a reservation that would leave a node no core")
        if cfg["priority"] != "off":
            fast = m.priority(nid)
            usable = [c for c in usable if c & fast] + [c for c in usable if not c & fast]
        taken = usable[len(usable) - need :]
        if nid == node:
            mine = taken
        for core in taken:
            out |= core
    if not out:
        return frozenset(), frozenset()
    helpers = frozenset(out)
    if scope == "rank" and ranks is not None and peers and mine:
        position = peers[0]
        share = mine[position * n : (position + 1) * n] if len(mine) >= n * ranks else mine
        helpers = frozenset().union(*share)
    return frozenset(out), helpers


def _priority(
    m: _Machine,
    cfg: "dict[str, str]",
    node: int,
    pkg: "frozenset[int] | None",
    cpus: "frozenset[int]",
    peers: "tuple[int, int] | None",
    package_peers: "tuple[int, int] | None",
    rank: int,
) -> "tuple[frozenset[int], frozenset[int], frozenset[int]]":
    """numabind._plan's _priority: (compute set, main-thread CPUs, priority cores)."""
    mode, role = cfg["mode"], cfg["priority"]
    nodes = [node]
    if mode == "socket":
        nodes += sorted((pkg or frozenset()) - {node})
        peers = package_peers if package_peers else peers
    pool: set[int] = set()
    fast: set[int] = set()
    prio_groups: list[frozenset[int]] = []
    for n in nodes:
        pool |= m.nodes.get(n, frozenset()) & m.allowed
        here = m.priority(n)
        fast |= here
        if here:
            prio_groups += m.groups("prio-cores", n)
    prio = frozenset(fast & (pool - m.reserved))
    if not prio:
        return cpus, frozenset(), frozenset()
    cores = sorted(_within(prio_groups, prio), key=min)
    if role == "main":
        if mode == "exclusive":
            own = _within(cores, cpus)
            return cpus, (own[0] if own else frozenset()), prio
        if peers is None:
            return cpus, cores[rank % len(cores)], prio
        return cpus, cores[peers[0] % len(cores)], prio
    if peers is None:
        return prio, frozenset(), prio
    position, count = peers
    if len(cores) < count:
        return cores[position % len(cores)], frozenset(), prio
    return _split(cores, position, count), frozenset(), prio


def _memory(
    m: _Machine, policy: str, cpus: "frozenset[int]", node: int
) -> "tuple[frozenset[int], str]":
    """numabind._plan's _memory: the memory nodes and policy of a rank's CPUs."""
    if policy == "none":
        return frozenset(), "none"
    mem = {n for n, c in m.nodes.items() if c and c & cpus}
    if m.mems is not None and mem - m.mems:
        raise Handover("memory nodes outside this process's cpuset.mems")
    if not mem:
        raise Handover("no memory node holds the rank's CPUs")
    if policy == "preferred" and len(mem) > 1:
        if not m.many:
            raise Handover("a kernel without MPOL_PREFERRED_MANY")
        return frozenset(mem), "preferred-many"
    return frozenset(mem), policy


# --- the fast path: binding what it planned ---------------------------------------------------


class _Calls:
    """get_mempolicy and set_mempolicy through syscall(2), from the ``_ctypes`` C module
    (numabind._kernel's ``_CTypes``, cut to these two calls: the package is not loaded)."""

    def __init__(self) -> None:
        numbers = _SYSCALLS.get(os.uname().machine)
        if numbers is None:
            raise Handover(f"memory-policy calls on {os.uname().machine}")
        self.get_nr, self.set_nr = numbers
        _ctypes: Any = __import__("_ctypes")  # typeshed's stubs do not describe these uses

        def scalar(name: str, code: str) -> "Any":
            return type(name, (_ctypes._SimpleCData,), {"_type_": code})

        c_long, c_ulong, c_int = scalar("c_long", "l"), scalar("c_ulong", "L"), scalar("c_int", "i")
        fn = type(
            "Syscall",
            (_ctypes.CFuncPtr,),
            {"_flags_": _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO, "_restype_": c_long},
        )

        class Handle:
            _handle = _ctypes.dlopen(
                None, getattr(os, "RTLD_LOCAL", 0) | getattr(os, "RTLD_NOW", 2)
            )

        self.ct: Any = _ctypes
        self.c_long: Any = c_long
        self.c_ulong: Any = c_ulong
        self.c_int: Any = c_int
        self.mask_type: Any = type(
            "NodeMask", (_ctypes.Array,), {"_type_": c_ulong, "_length_": MAX_NODES // 64}
        )
        self.syscall: Any = fn(("syscall", Handle()))

    def _call(self, nr: int, *args: "object") -> None:
        self.ct.set_errno(0)
        if int(self.syscall(self.c_long(nr), *args)) < 0:
            err = self.ct.get_errno()
            raise OSError(err, os.strerror(err))

    def get(self) -> "tuple[int, frozenset[int]]":
        mode = self.c_int(0)
        mask = self.mask_type()
        self._call(
            self.get_nr, self.ct.byref(mode), self.ct.byref(mask),
            self.c_ulong(MAX_NODES + 1), None, self.c_ulong(0),
        )  # fmt: skip
        nodes: set[int] = set()
        for w in range(MAX_NODES // 64):
            word, bit = int(mask[w]), 0
            while word:
                if word & 1:
                    nodes.add(w * 64 + bit)
                word >>= 1
                bit += 1
        return int(mode.value) & ~((1 << 15) | (1 << 14)), frozenset(nodes)

    def set(self, code: int, nodes: "frozenset[int]") -> None:
        if code in (0, 4):  # MPOL_DEFAULT, MPOL_LOCAL take no nodes
            self._call(self.set_nr, self.c_int(code), None, self.c_ulong(0))
            return
        mask = self.mask_type()
        for n in nodes:
            if not 0 <= n < MAX_NODES:
                raise OSError(22, f"node {n}")
            mask[n // 64] |= 1 << (n % 64)
        self._call(
            self.set_nr,
            self.c_int(code),
            self.ct.byref(mask),
            self.c_ulong(MAX_NODES + 1),
        )


def _pages_off(target: "frozenset[int]") -> bool:
    """Whether any anonymous pages of this process lie off ``target`` (numa_maps; a
    superset of numabind._kernel's private anonymous regions: when it says yes, the full
    migration looks properly)."""
    data = read_small("/proc/self/numa_maps", 4 << 20)
    if data is None:
        return True
    for line in data.split(b"\n"):
        if b"file=" in line:
            continue
        for field in line.split()[2:]:
            if field[:1] == b"N" and b"=" in field:
                node, _, count = field[1:].partition(b"=")
                if node.isdigit() and int(node) not in target and count not in (b"", b"0"):
                    return True
    return False


def _start_time() -> str:
    """numabind._kernel.start_time of this process: field 22 of /proc/self/stat."""
    data = read_small("/proc/self/stat", 4096)
    fields = data.decode("ascii", "replace").rsplit(")", 1)[-1].split() if data else []
    return fields[19] if len(fields) > 19 else "0"


def _entry(
    p: "dict[str, object]",
    policy: str,
    nodes: "frozenset[int]",
    main_thread: "int | None",
    machine: str,
) -> bytes:
    """numabind._registry.Entry.encode of what was bound (the fields the fast path sets;
    the others are their defaults)."""

    def text(value: "object") -> str:
        if value is None:
            return ""
        if isinstance(value, frozenset):
            return cpulist(value)
        return str(value)

    fields = {
        "pid": os.getpid(),
        "start": _start_time(),
        "local_rank": p["local_rank"],
        "rank_source": p["rank_source"],
        "local_world_size": p["local_world_size"],
        "device": p["device"],
        "device_index": p["device_index"],
        "numa_node": p["numa_node"],
        "cpus": p["cpus"],
        "memory_policy": policy,
        "memory_nodes": nodes or p["memory_nodes"],
        "mode": p["mode"],
        "reason": p["reason"],
        "helpers": p["helpers"],
        "priority_cpus": p["priority_cpus"],
        "main_thread": main_thread,
        "main_cpus": p["main_cpus"] if main_thread is not None else frozenset(),
        "machine": machine,
    }
    return "".join(f"{k}={text(v)}\n" for k, v in fields.items()).encode("utf-8", "replace")


_registered: "dict[str, object]" = {}


def _register(env: "Env", data: bytes) -> "str | None":
    """numabind._registry.register, for the entry the fast path made: (the file written)
    or None; removed at exit (numabind._registry.unregister does the same for its own)."""
    base = _registry_base(env)
    if base is None:
        return None
    uid = os.geteuid()
    places = candidates(base, env, uid, f"numabind-{uid}", "numabind")
    try:
        fd, label, _ = open_user_dir(places, base, uid, create=True)
    except OSError:
        return None
    if fd is None:
        return None
    pid = os.getpid()
    try:
        if write_private(fd, str(pid), data, "entry") is not None:
            return None
    finally:
        os.close(fd)
    import atexit

    _registered.update(label=label, pid=pid)
    atexit.register(_unregister_at_exit)
    return f"{label}/{pid}"


def _unregister_at_exit() -> None:
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


class _Armer:
    """numabind's guards (``numabind._guard.arm``), armed when the first import they watch
    happens rather than at start: until then no numabind module is loaded for them."""

    NAMES = ("torch", "numpy", "torch.distributed.distributed_c10d")

    def __init__(self) -> None:
        self.done = False

    def find_spec(
        self, name: str, path: "Sequence[str] | None" = None, target: "ModuleType | None" = None
    ) -> "ModuleSpec | None":
        if self.done or name not in self.NAMES:
            return None
        self.done = True  # stays in sys.meta_path, answering nothing (removing it while the
        # import system walks the list would skip the next finder)
        try:
            from numabind import _apply, _guard

            _guard.arm(_apply.intended_cpus)
            finder = _guard._finder
            return finder.find_spec(name, path, target) if finder is not None else None
        except Exception as err:
            failed(err)
            return None


def _bind(
    p: "dict[str, object]", m: _Machine, env: "Env", cfg: "dict[str, str]", key: str, origin: str
) -> str:
    """Apply ``p`` as numabind._apply.enter would; '' when done, else why the full path
    must (whatever was applied is put back first)."""
    cpus = p["cpus"]
    assert isinstance(cpus, frozenset)
    current = frozenset(os.sched_getaffinity(0))
    narrower = bool(current) and not m.allowed <= current
    force = cfg["enable"] == "force"
    if narrower and not force and current != cpus:
        return "a CPU mask is already in place (the keep/replace rule decides)"
    try:
        threads = os.listdir("/proc/self/task")
    except OSError:
        threads = []
    if len(threads) != 1:
        return "more than one thread at start"
    done: dict[str, object] = {"previous_cpus": None, "previous_policy": None, "main_thread": None}
    try:
        _apply(p, cpus, current, force, done)
    except (OSError, Handover) as err:
        _undo(done)
        return str(err) if isinstance(err, Handover) else f"a call failed ({err})"
    except BaseException:
        _undo(done)
        raise
    machine = origin
    main_thread = done["main_thread"]
    assert main_thread is None or isinstance(main_thread, int)
    set_nodes = done.get("policy_nodes", frozenset())
    assert isinstance(set_nodes, frozenset)
    policy = str(p["memory_policy"])
    registered = _register(env, _entry(p, policy, set_nodes, main_thread, machine))
    env["NUMABIND_STATE"] = f"{key}#bound"
    if main_thread is None:
        env.pop("NUMABIND_MAIN_CPUS", None)
    if cfg["guard"] == "1":
        sys.meta_path.insert(0, _Armer())
    start.applied = {
        **done,
        "plan": p,
        "current": current,
        "policy": policy if policy != "none" else None,
        "policy_nodes": set_nodes,
        "registered": registered,
        "registered_label": _registered.get("label"),
        "machine": machine,
        # what it planned from, for numabind to plan the same later (os.environ's bytes:
        # a copy without decoding every variable; numabind._apply._replan decodes them)
        "environ": _environ_copy(env),
    }
    return ""


def _environ_copy(env: "Env") -> "dict[str, str] | dict[bytes, bytes]":
    data = getattr(env, "_data", None)
    return data.copy() if isinstance(data, dict) else dict(env)


def _apply(
    p: "dict[str, object]",
    cpus: "frozenset[int]",
    current: "frozenset[int]",
    force: bool,
    done: "dict[str, object]",
) -> None:
    """The kernel calls, in numabind._apply's order (CPUs, the main thread's core, the
    memory policy, the pages), each recorded in ``done`` as it succeeds so that
    :func:`_undo` puts back exactly what was changed."""
    if not (current == cpus or (current <= cpus and not force)):
        os.sched_setaffinity(0, cpus)
        done["previous_cpus"] = current
    main = p["main_cpus"]
    assert isinstance(main, frozenset)
    if main:
        import _thread

        os.sched_setaffinity(0, main)
        done["previous_cpus"] = current
        done["main_thread"] = _thread.get_native_id()
    policy = str(p["memory_policy"])
    nodes = p["memory_nodes"]
    assert isinstance(nodes, frozenset)
    if policy != "none":
        calls = _Calls()
        previous = calls.get()
        set_nodes = frozenset() if policy == "local" else nodes
        calls.set(_POLICY_CODE[policy], set_nodes)
        done.update(calls=calls, previous_policy=previous, policy_nodes=set_nodes)
        if nodes and _pages_off(nodes):
            from numabind._range import migrate_private

            home = p["numa_node"]
            dest = min(nodes, key=lambda n: (n != home, n))
            moved = migrate_private(nodes, _MIGRATE_AS[policy], dest)
            if moved is not None and moved.refused:
                raise Handover("page migration was refused")
    if done["main_thread"] is not None:
        from numabind import _handback

        tid = done["main_thread"]
        assert isinstance(tid, int)
        _handback.pin(tid, main, cpus)
        done["pinned"] = True


def _undo(done: "dict[str, object]") -> None:
    """Put back what the fast path applied before it handed over (pages it moved stay)."""
    if done.get("pinned"):
        handback = sys.modules.get("numabind._handback")
        if handback is not None:
            handback.release()
    cpus = done.get("previous_cpus")
    if isinstance(cpus, frozenset):
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass
    calls, previous = done.get("calls"), done.get("previous_policy")
    if isinstance(calls, _Calls) and isinstance(previous, tuple):
        try:
            calls.set(previous[0], previous[1])
        except OSError:
            pass


def bind_rank(
    env: "Env",
    cfg: "dict[str, str]",
    source: str,
    rank: int,
    size: "int | None",
    key: str,
    sysroot: str,
) -> str:
    """Plan and bind the rank ``_numabind_start.fast`` found: '' when done, else why the
    full path must (whatever was applied is put back first)."""
    try:
        quick, _, _ = read_cache(env, sysroot)
        origin = "cache"
        if quick is None:
            # no usable file: numabind reads the machine once (under the lock, for every
            # rank of the node) and the fast path plans from what it derived
            from numabind._cache import fill, wants

            want = wants(cfg["mode"], cfg["smt"], cfg["priority"], cfg["reserve"])
            quick, _, origin = fill(env, sysroot, want)
        start.machine_origin = origin
        m = _Machine(quick)
        p = plan(m, env, cfg, source, rank, size)
    except Handover as h:
        return str(h)
    if p["status"] == "skipped":
        env["NUMABIND_STATE"] = f"{key}#skipped"
        env.pop("NUMABIND_MAIN_CPUS", None)
        return ""
    return _bind(p, m, env, cfg, key, origin)
