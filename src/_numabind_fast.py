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
    # a device as the cache lists it: (PCI address, node or None, label, UUID or "-")
    Dev = tuple[str, "int | None", str, str]

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
    try:  # opened first: it is there but the first time, and mkdir's EEXIST costs more
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except FileNotFoundError:
        if not create:
            return None, "cannot be opened (No such file or directory; a link or not a directory)"
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


_CODE_NAMES = (
    *("__init__", "_cache", "_plan", "_sources", "_topology", "_devices", "_model"),
    *("capture/_hwloc", "_dra", "_sysfs"),
)


def _absolute(path: str) -> str:
    return path if path.startswith("/") else os.path.abspath(path)


def _code_files() -> "tuple[str, ...]":
    """The files whose code decides what a cache file holds: the start modules, the
    package's ``__init__`` (where the version lives) and the modules that read and derive
    the machine.  Their sizes and times are the key's version part: a new numabind, or an
    edited checkout, writes another file (tests/test_fast.py keeps the list complete).
    The package is found where the import system would find it (the first ``sys.path``
    entry holding it: an editable install keeps it apart from this module), without
    importing it; plain string joins and one stat per entry (every rank computes this)."""
    pkg = ""
    loaded = getattr(sys.modules.get("numabind"), "__file__", None)
    if isinstance(loaded, str):  # numabind is loaded (the isolated collector loads it
        pkg = _absolute(loaded).rpartition("/")[0]  # from a directory not on sys.path)
    else:
        for entry in sys.path:
            try:
                st = os.stat(f"{entry or '.'}/numabind/__init__.py")
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                pkg = f"{entry}/numabind" if entry else "numabind"
                break
    out = [_absolute(__file__), _absolute(start.__file__ or "")]
    if pkg:
        for n in _CODE_NAMES:
            out.append(f"{pkg}/{n}.py")
    return tuple(out)


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
    # The quick facts of a cache file, as the fast planner asks for them (the role
    # planner, _numabind_roles, reads the per-node facts it needs from ``q`` itself).
    # Plain loops, no comprehensions: each is one more code object every rank loads.

    def __init__(self, quick: "dict[str, list[list[str]]]") -> None:
        self.q = quick
        self.nodes: dict[int, frozenset[int]] = {}
        for t in quick.get("node", ()):
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
        self.devices: dict[str, list[Dev]] = {}
        for t in quick.get("dev", ()):
            if len(t) != 5:
                raise Handover("a damaged cache line (dev)")
            vendor, pci, node, label, uuid = t
            self.devices.setdefault(vendor, []).append(
                (pci, int(node) if node.isdigit() else None, label.replace("_", " "), uuid)
            )
        self.vendors = quick.get("vendors", [[]])[0]
        # set by the role planner: every rank's reserved cores here, and this rank's helpers
        self.reserved: frozenset[int] = frozenset()
        self.helpers: frozenset[int] = frozenset()


def _visible(m: _Machine, env: "Env") -> "tuple[list[Dev], str]":
    # The devices this process's runtime numbers 0..n-1, and their source in words
    # (numabind._devices.resolve, for what it resolves from the cache alone).
    get = env.get
    if get("SLURM_STEP_GPUS") is not None or get("SLURM_JOB_GPUS") is not None:
        raise Handover("SLURM_STEP_GPUS/SLURM_JOB_GPUS")
    named = None
    for v in _VISIBILITY:
        if get(v) is not None:
            if named is not None or v != "CUDA_VISIBLE_DEVICES":
                raise Handover("a visibility variable the fast path does not resolve")
            named = v
    if named is None:
        for vendor in m.vendors:
            devs = m.devices.get(vendor, [])
            if devs:
                s = "s" if len(devs) != 1 else ""
                return devs, f"all {len(devs)} reachable {vendor} GPU{s}"
        return [], "no accelerator found"
    devs = m.devices.get("nvidia", [])
    if not devs:
        raise Handover("CUDA_VISIBLE_DEVICES without NVIDIA GPUs")
    text = env["CUDA_VISIBLE_DEVICES"].strip()
    if not text or text.startswith("-"):
        raise Handover("CUDA_VISIBLE_DEVICES hides every GPU")
    return _listed(devs, text), f"CUDA_VISIBLE_DEVICES={text[:120]}"


def _listed(devs: "list[Dev]", text: str) -> "list[Dev]":
    # CUDA_VISIBLE_DEVICES's indices and unique UUID prefixes, in its order
    tokens = text.split(",", len(devs) + 1)
    if len(tokens) > len(devs):
        raise Handover("CUDA_VISIBLE_DEVICES lists more devices than are reachable")
    out: list[Dev] = []
    for raw in tokens:
        token = raw.strip()
        if token.isascii() and token.isdigit() and len(token) <= 6:
            i = int(token)
            if i >= len(devs):
                raise Handover("CUDA_VISIBLE_DEVICES: an index out of range")
            dev = devs[i]
        elif token.upper().startswith("GPU-") and len(token) <= 128:
            want, found = token.lower(), []
            for d in devs:
                if d[3] != "-" and d[3].lower().startswith(want):
                    found.append(d)
            if len(found) != 1:
                raise Handover("CUDA_VISIBLE_DEVICES: a UUID the cache cannot resolve alone")
            dev = found[0]
        else:
            raise Handover("CUDA_VISIBLE_DEVICES: a token the fast path does not resolve")
        if dev in out:
            raise Handover("CUDA_VISIBLE_DEVICES repeats a device")
        out.append(dev)
    return out


def plan(
    m: _Machine, env: "Env", cfg: "dict[str, str]", source: str, rank: int, size: "int | None"
) -> "dict[str, object]":
    # numabind._plan.plan for what the fast path decides: the fields of the plan that the
    # binding, its registry entry and its state depend on.  A rank in node mode with no
    # role knob, that sees a device, is planned here (the node of its device, that node's
    # allowed CPUs); any other goes to _numabind_roles, imported only then.
    mode, priority = cfg["mode"], cfg["priority"]
    if m.q.get("partitioned"):
        # GPUs split into compute partitions (AMD CPX): one PCI function, several devices
        raise Handover("GPU compute partitions: the planner numbers them")
    if m.q.get("memory-only") != [["-"]]:
        # memory-only nodes (a GH200's GPU memory, HBM, CXL): which of them the rank's
        # memory may spill onto is NUMABIND_SPILL's rule (numabind._plan.spill_mask)
        raise Handover("a memory-only node: where memory may spill is the planner's")
    cpu_nodes = []
    for n in sorted(m.nodes):
        if m.nodes[n]:
            cpu_nodes.append(n)
    one_node = len(cpu_nodes) <= 1
    if one_node and mode in ("node", "socket"):
        if priority == "off":
            return {"status": "skipped"}
        import _numabind_roles

        if not _numabind_roles.kinds_distinct(m):
            return {"status": "skipped"}
    devs, why = _visible(m, env)
    if not devs and (size is None or size <= 1):
        return {"status": "skipped"}  # no accelerator and no local world size: benign
    if mode != "node" or priority != "off" or cfg["reserve"] or cfg["smt"] != "all" or not devs:
        import _numabind_roles

        return _numabind_roles.plan(m, cfg, source, rank, size, devs, why, cpu_nodes, one_node)
    node, reason, device, index_of = place(m, rank, devs)
    cpus = m.nodes[node] & m.allowed
    if not cpus:
        raise Handover("the cgroup forbids every CPU of the device's node")
    return result(m, cfg, source, rank, size, node, reason, device, index_of, cpus, _NONE, _NONE)


_NONE: "frozenset[int]" = frozenset()


def place(m: _Machine, rank: int, devs: "list[Dev]") -> "tuple[int, str, str, int]":
    # numabind._plan's _pick_device and _device_place: (node, reason, PCI address, device
    # index) of the device a rank drives
    index_of = 0 if len(devs) == 1 else rank % len(devs)
    device, node, label, _ = devs[index_of]
    if node is None or node not in m.nodes:
        raise Handover("the device's node is not known from files alone")
    return node, f"{label} {index_of} ({device}) is on node {node}", device, index_of


def result(
    m: _Machine,
    cfg: "dict[str, str]",
    source: str,
    rank: int,
    size: "int | None",
    node: int,
    reason: str,
    device: str,
    index_of: "int | None",
    cpus: "frozenset[int]",
    prio: "frozenset[int]",
    main: "frozenset[int]",
) -> "dict[str, object]":
    # The plan's fields, with the memory nodes and policy of the rank's CPUs
    # (numabind._plan's _memory)
    policy = cfg["memory"]
    mem: set[int] = set()
    if policy == "none":
        memory: frozenset[int] = _NONE
    else:
        for n, c in m.nodes.items():
            if c and not c.isdisjoint(cpus):
                mem.add(n)
        if m.mems is not None and not mem <= m.mems:
            raise Handover("memory nodes outside this process's cpuset.mems")
        if not mem:
            raise Handover("no memory node holds the rank's CPUs")
        if policy == "preferred" and len(mem) > 1:
            if not m.many:
                raise Handover("a kernel without MPOL_PREFERRED_MANY")
            policy = "preferred-many"
        memory = frozenset(mem)
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
        "mode": cfg["mode"],
        "reason": reason,
        "priority_cpus": prio,
        "main_cpus": main,
        "helpers": m.helpers,
    }


# --- the fast path: binding what it planned ---------------------------------------------------


class _Calls:
    # get_mempolicy and set_mempolicy through syscall(2), from the ``_ctypes`` C module
    # (numabind._kernel's ``_CTypes``, cut to these two calls: the package is not loaded).
    # Loading _ctypes is the largest single cost of a warm start (~0.3 ms), so it is cut
    # to the two types the calls need: one unsigned long (every argument is passed as one:
    # syscall(2) reads each as a long), an array of them (word 0 takes get_mempolicy's
    # mode, which lands in its low half on the little-endian machines _SYSCALLS lists; the
    # rest is the node mask), and the function type; syscall(2) returns 0 or -1, which
    # the default int result carries.

    def __init__(self) -> None:
        numbers = _SYSCALLS.get(os.uname().machine)
        if numbers is None:
            raise Handover(f"memory-policy calls on {os.uname().machine}")
        self.get_nr, self.set_nr = numbers
        ct: Any = __import__("_ctypes")  # typeshed's stubs do not describe these uses
        ulong = type("c_ulong", (ct._SimpleCData,), {"_type_": "L"})
        fn = type(
            "Syscall",
            (ct.CFuncPtr,),
            {"_flags_": ct.FUNCFLAG_CDECL | ct.FUNCFLAG_USE_ERRNO},
        )
        # CFuncPtr looks the symbol up in any object's ``_handle``: this one's
        self._handle = ct.dlopen(None, getattr(os, "RTLD_LOCAL", 0) | getattr(os, "RTLD_NOW", 2))
        self.flags = 0  # the mode flags of the policy get() last read (MPOL_F_*)
        self.ct: Any = ct
        self.ulong: Any = ulong
        self.words: Any = type("Words", (ct.Array,), {"_type_": ulong, "_length_": _WORDS + 1})
        self.syscall: Any = fn(("syscall", self))

    def _call(self, *args: "object") -> None:
        self.ct.set_errno(0)
        if int(self.syscall(*args)) < 0:
            err = self.ct.get_errno()
            raise OSError(err, os.strerror(err))

    def get(self) -> "tuple[int, frozenset[int]]":
        u, w = self.ulong, self.words()
        self._call(
            u(self.get_nr), self.ct.byref(w), self.ct.byref(w, 8), u(MAX_NODES + 1), None, u(0)
        )
        nodes: set[int] = set()
        for i in range(_WORDS):
            word, bit = int(w[i + 1]), i * 64
            while word:
                if word & 1:
                    nodes.add(bit)
                word >>= 1
                bit += 1
        mode = int(w[0]) & 0xFFFFFFFF
        self.flags = mode & ~0xFF  # MPOL_F_STATIC_NODES, _RELATIVE_NODES, _NUMA_BALANCING
        return mode & ~((1 << 15) | (1 << 14)), frozenset(nodes)

    def set(self, code: int, nodes: "frozenset[int]") -> None:
        # ``code`` may carry mode flags (a saved policy put back)
        u = self.ulong
        if (code & 0xFF) in (0, 4):  # MPOL_DEFAULT, MPOL_LOCAL take no nodes
            self._call(u(self.set_nr), u(code), None, u(0))
            return
        w = self.words()
        for n in nodes:
            if not 0 <= n < MAX_NODES:
                raise OSError(22, f"node {n}")
            w[n // 64 + 1] |= 1 << (n % 64)
        self._call(u(self.set_nr), u(code), self.ct.byref(w, 8), u(MAX_NODES + 1))


_WORDS = MAX_NODES // 64  # unsigned longs in a node mask


def _pages_off(target: "frozenset[int]") -> bool:
    # Whether any anonymous pages of this process lie off ``target`` (numa_maps; a
    # superset of numabind._kernel's private anonymous regions: when it says yes, the full
    # migration looks properly).  The kernel's walk of every mapping is most of the cost.
    data = read_small("/proc/self/numa_maps", 4 << 20)
    if data is None:
        return True
    for line in data.split(b"\n"):
        if b"file=" in line or b" N" not in line:
            continue
        for field in line.split(b" ")[2:]:
            if field[:1] == b"N":
                node, _, count = field[1:].partition(b"=")
                if node.isdigit() and int(node) not in target and count not in (b"", b"0"):
                    return True
    return False


def started_inside(
    current: "frozenset[int]",
    previous: "tuple[int, frozenset[int]]",
    home: "frozenset[int]",
    nodes: "frozenset[int]",
) -> bool:
    # Whether every page this process has can only be on ``nodes`` already, so that
    # numa_maps need not be read: it has run only on ``current`` since its exec made its
    # memory, one thread, under the policy it inherited.  True when that policy placed
    # pages on nodes of ``nodes`` only (bind, preferred or interleave there), or on the
    # running CPU's node (default, local) and every CPU it may run on is one of
    # ``nodes``' (``home``): a rank its launcher confined to its node (srun --cpu-bind,
    # mpirun --bind-to numa, a pod's single-NUMA cpuset, a bound parent).  What is left
    # out: a node already full at exec (the kernel fell back elsewhere: the move back
    # would find no room either) and a mask narrowed from outside after exec.
    code, where = previous
    if code in (0, 4):
        return bool(current) and current <= home
    return code in (1, 2, 3, 5) and bool(where) and where <= nodes


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
    # numabind._registry.Entry.encode of what was bound (the fields the fast path sets;
    # the others are their defaults)
    fields = (
        ("pid", os.getpid()),
        ("start", _start_time()),
        ("local_rank", p["local_rank"]),
        ("rank_source", p["rank_source"]),
        ("local_world_size", p["local_world_size"]),
        ("device", p["device"]),
        ("device_index", p["device_index"]),
        ("numa_node", p["numa_node"]),
        ("cpus", p["cpus"]),
        ("memory_policy", policy),
        ("memory_nodes", nodes or p["memory_nodes"]),
        ("mode", p["mode"]),
        ("reason", p["reason"]),
        ("helpers", p["helpers"]),
        ("priority_cpus", p["priority_cpus"]),
        ("main_thread", main_thread),
        ("main_cpus", p["main_cpus"] if main_thread is not None else _NONE),
        ("machine", machine),
    )
    out = []
    for k, v in fields:
        if v is None:
            v = ""
        elif isinstance(v, frozenset):
            v = cpulist(v)
        out.append(f"{k}={v}\n")
    return "".join(out).encode("utf-8", "replace")


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
    # Remove the entry _register wrote: its directory opened again as private_dir
    # checks it (not through a link, ours), the entry unlinked in it
    label, pid = _registered.get("label"), _registered.get("pid")
    if not isinstance(label, str) or pid != os.getpid():
        return
    try:
        fd = os.open(label, _DIR_FLAGS)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.unlink(str(pid), dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
        _apply(p, m, cpus, current, force, done)
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
    m: _Machine,
    cpus: "frozenset[int]",
    current: "frozenset[int]",
    force: bool,
    done: "dict[str, object]",
) -> None:
    # The kernel calls, in numabind._apply's order (CPUs, the main thread's core, the
    # memory policy, the pages), each recorded in ``done`` as it succeeds so that _undo
    # puts back exactly what was changed.
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
        # put back (_undo, restore()) with its mode flags: relative or static nodes
        # without them would name other nodes
        saved = (previous[0] | calls.flags, previous[1])
        done.update(calls=calls, previous_policy=saved, policy_nodes=set_nodes)
        home: set[int] = set()
        for n in nodes:
            home |= m.nodes.get(n, _NONE)
        # a policy with mode flags (relative nodes: bit k is the k-th allowed node) does
        # not say where its pages are in node numbers: those are looked at
        said = previous if not calls.flags else (-1, _NONE)
        inside = started_inside(current, said, frozenset(home), nodes)
        if nodes and not inside and _pages_off(nodes):
            from numabind._range import migrate_private

            near = p["numa_node"]
            dest = min(nodes, key=lambda n: (n != near, n))
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
