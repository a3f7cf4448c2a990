"""What the startup hook and the numabind package share, in one leaf module that imports
nothing but ``os``, ``sys`` and ``stat`` (``_ctypes`` once a memory policy is set).

The warm start (``_numabind_start``) replays an answer the package's planner made, before
the package is loaded; the package writes those answers and binds late.  Both need the
same rules, and a rule must have one home, so it is here and both import it:

* the trigger vocabulary: the rank variables (:data:`RANK_NAMES`, the package's
  ``_model.RANK_VARIABLES`` is built on them) and the framework switches; the ``.pth``
  line is this list rendered (a test renders it and compares);
* bounded, non-blocking reads (:func:`read_small`), CPU lists, and the rules of private
  files in shared places (the registry's and the cache's): never through a link, only a
  directory the user owns, written to a fresh name and renamed (:func:`write_private`);
* the redirect rule's ownership test for root (:func:`root_owned_path`);
* the cache's key (:func:`machine_key`), its witnesses (:func:`witness`) and its
  checksum; the escaping of text in its files;
* the one applier of the process-wide system calls: the syscall numbers
  (:data:`SYSCALL_NUMBERS`, the package's ``_kernel.SYSCALLS`` takes them), the cheap
  ``_ctypes`` pieces (:class:`CTypes`) and the memory-policy calls (:class:`Calls`), the
  registry entry and its removal at exit (:func:`register`);
* what the warm start applied to this process (:data:`applied`), for the package to adopt.
"""

import os
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

# --- vocabulary: what makes the hook look further ----------------------------------------------

# the local-rank variables, in the order numabind reads them (numabind._model.RANK_VARIABLES
# adds each one's size variables and launcher, row by row, to these names)
RANK_NAMES = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "PALS_LOCAL_RANKID",
    "SLURM_LOCALID",
)
# requests to hook a framework's own process starts (numabind._environ reads them)
SWITCHES = ("NUMABIND_TORCH", "NUMABIND_RAY", "NUMABIND_DEVICES")
TRIGGERS = RANK_NAMES + SWITCHES
# the modules numabind ships beside its package (the wheel, the isolated collector and
# the tests' readable copies list them from here)
MODULES = ("_numabind_base", "_numabind_start")
# the one line a hook that cannot load says (sitecustomize and the .pth carry the same
# text for when this module cannot be imported; a test keeps them in step)
FAILED = "numabind: startup hook failed to load (%r); this process runs unbound\n"
# the one vocabulary of numabind's boolean settings (numabind._environ takes it)
FLAG_TRUE = ("1", "true", "yes", "on")
FLAG_FALSE = ("0", "false", "no", "off", "")
DEFAULT_BASE = "/dev/shm"  # the base of the per-user registry and cache directories
MAX_CPUS = 16384  # no CPU number at or above this is read (numabind._sysfs takes it)
MAX_NODES = 1024  # node masks are this many bits (CONFIG_NODES_SHIFT <= 10)

# what descriptor 2 was at start (numabind._output compares against it before it writes)
stderr_at_start: "tuple[int, int] | None" = None
# what the full path read that no answer records (another process's environment, NVML):
# a process that did is planned again the next time rather than replayed (numabind._replay)
unseen: "list[str]" = []
# what the warm start applied to this process, for numabind to adopt when imported later
# (numabind._apply makes a Binding of it); None when it applied nothing
applied: "dict[str, Any] | None" = None


def pth_line() -> str:
    """The ``_numabind_hook.pth`` line: one dictionary test of :data:`TRIGGERS`, then the
    start module (src/_numabind_hook.pth is this text; a test compares)."""
    names = " ".join(TRIGGERS)
    failed = FAILED.replace("\n", "\\\\n")
    return (
        f"import os;os.environ._data.keys().isdisjoint(b'{names}'.split())or exec(\"try:\\n"
        " import _numabind_start as m\\nexcept Exception as e:\\n import sys;"
        f"sys.stderr.write('{failed}'%(e,))\\nelse:m.start()\")\n"
    )


def failed(err: BaseException) -> None:
    """Say that the hook could not load, in one write(2) whose errors are ignored."""
    try:
        os.write(2, (FAILED % (err,)).encode("utf-8", "replace"))
    except Exception:
        pass


# --- small files, bounded, non-blocking, regular only -------------------------------------------

# how every input file is opened (numabind._sysfs takes it): never blocking (a FIFO), never
# a controlling terminal
OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
_READ = OPEN_FLAGS
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
LIST_CAP = 1 << 16  # entries listed from one directory (numabind._sysfs takes it)


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


def entries(where: "str | int", cap: int = LIST_CAP) -> "tuple[list[str], bool]":
    """A directory's entry names (a path or an open descriptor), at most ``cap`` of them,
    and whether the cap was reached; raises ``OSError``.  The one bounded directory walk:
    a directory of a million entries costs ``cap``, never more."""
    out: list[str] = []
    with os.scandir(where) as it:
        for entry in it:
            out.append(entry.name)
            if len(out) >= cap:
                return out, True
    return out, False


def text(path: str, cap: int = 65536) -> "str | None":
    data = read_small(path, cap)
    return None if data is None else data.decode("utf-8", "replace").strip()


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
    not exactly one."""
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
        a = b = int(lo)
        if sep:
            if not (hi.isascii() and hi.isdigit() and len(hi) < 6):
                return None
            b = int(hi)
        if b < a or b >= limit:
            return None
        out.update(range(a, b + 1))
    return frozenset(out)


_SAFE = "+,-./0123456789:=@ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
_HEX = "0123456789abcdef"


def escape(value: str) -> str:
    """``value`` as one token of a cache file: every byte outside :data:`_SAFE` as %XX, of
    its UTF-8 with surrogates passed (a command line, a variable or a file name that is
    not UTF-8 holds them, as Python decodes such bytes: its token is still its own)."""
    if not value.strip(_SAFE):
        return value  # nothing to escape (PCI addresses, CPU lists, names): the common case
    if not _ESCAPES:  # made on first use (most processes never escape anything), whole
        # before it is seen: a thread that finds it finds all of it
        _ESCAPES.append({i: f"%{i:02x}" for i in range(256) if chr(i) not in _SAFE})
    return value.encode("utf-8", "surrogatepass").decode("latin-1").translate(_ESCAPES[0])
    # (translate: in C, and a long command line is compared by every warm rank)


_ESCAPES: "list[dict[int, str]]" = []


def unescape(token: str) -> str:
    """The text :func:`escape` made (``ValueError`` on a token it could not have made)."""
    if "%" not in token:
        return token
    out = bytearray()
    i = 0
    while i < len(token):
        if token[i] == "%":
            pair = token[i + 1 : i + 3]
            if len(pair) != 2 or pair[0] not in _HEX or pair[1] not in _HEX:
                raise ValueError(f"a bad escape in {token[:40]!r}")
            out.append(int(pair, 16))
            i += 3
        else:
            out += token[i].encode()
            i += 1
    return out.decode("utf-8", "surrogatepass")


# --- private files in shared places (the registry's and the cache's rules) ---------------------


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


def root_owned_path(path: str) -> "str | None":
    """None when every directory on ``path`` (as written and as resolved) is owned by
    root and not writable by group or others (sticky directories excepted), else why."""
    if not path.startswith("/"):
        return "not an absolute path"
    real = os.path.realpath(path)
    for spelled in dict.fromkeys((os.path.abspath(path), real)):
        parts = [p for p in spelled.split("/") if p]
        prefix = ""
        for part in ["", *parts]:
            prefix = f"{prefix}/{part}" if part else "/"
            try:
                st = os.lstat(prefix)
            except OSError as err:
                return f"{prefix} cannot be examined ({err.strerror})"
            if st.st_uid != 0:
                return f"{prefix} is owned by uid {st.st_uid}"
            if stat.S_ISLNK(st.st_mode):
                continue  # its target is checked as the resolved spelling
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
                return f"{prefix} is writable by group or others"
    return None


# --- the cache: its directory, key, witnesses and checksum --------------------------------------

FORMAT = 4  # bump whenever what a cache file holds changes: an old file is then refused
MAX_ANSWERS = 64  # answers kept per answers file (numabind._replay keeps to it; more: damaged)
CACHE_DIR = "numabind-cache-"  # <base>/numabind-cache-UID (the registry's is numabind-UID)
CACHE_FALLBACK = "numabind-cache"  # $XDG_RUNTIME_DIR/numabind-cache
CACHE_CAP = 4 << 20  # bytes: a 8192-CPU machine with every fact is ~1 MiB
_MODULUS = (1 << 61) - 1


def cache_off(environ: "Mapping[str, str]") -> bool:
    """Whether ``NUMABIND_CACHE`` turns the cache off: set to a false value (the empty one
    too), as the settings read it (a value that is no boolean at all is warned of there and
    taken as the default, on; a process that warned keeps no answer).  The warm start, the
    full path and ``doctor`` all ask this."""
    raw = environ.get("NUMABIND_CACHE")
    return raw is not None and raw.strip().lower() in FLAG_FALSE


def no_replay(environ: "Mapping[str, str]") -> "str | None":
    """Why this process's answer is neither replayed nor kept (None: it may be): the cache
    turned off, or a registry base of the user's choosing (where the cache directory is
    then is the full path's rule, ``numabind._cache``)."""
    if cache_off(environ):
        return "NUMABIND_CACHE=0"
    if environ.get("NUMABIND_REGISTRY"):
        return "NUMABIND_REGISTRY is set (where the cache is is the full path's rule)"
    return None


def checksum(data: bytes) -> int:
    """The body as one integer modulo a Mersenne prime: computed in C by ``int``, so that
    a rank checks its whole file in microseconds; it finds truncation and damage (it is not
    a signature: who may write the file is the directory's owner, checked on open)."""
    return int.from_bytes(data, "little") % _MODULUS


def open_cache_dir(
    environ: "Mapping[str, str]", create: bool, base: str = DEFAULT_BASE
) -> "tuple[int | None, str | None, str]":
    """This user's cache directory under ``base``: (fd, its path, "") or (None, None, why)."""
    uid = os.geteuid()
    places = candidates(base, environ, uid, f"{CACHE_DIR}{uid}", CACHE_FALLBACK)
    try:
        fd, label, why = open_user_dir(places, base, uid, create)
    except OSError as err:
        return None, None, f"unusable ({err.strerror or err})"
    if fd is None:
        return None, None, "; ".join(why) or "no usable directory"
    return fd, label, ""


NO_CACHE = "no cache yet"  # read_cache's why for a file (or its directory) not made yet


def refusal(bad: str, path: str) -> str:
    """Why a file of :func:`read_private`'s answer ``bad`` is not read, in words."""
    return {
        "missing": NO_CACHE,
        "special": f"{path} is not a regular file (a link or a device): refused",
        "foreign": f"{path} is another user's: refused",
        "huge": f"{path} is larger than {CACHE_CAP >> 20} MiB: refused",
    }.get(bad, f"{path}: {bad}")


def read_cache(
    environ: "Mapping[str, str]", name: str, base: str = DEFAULT_BASE
) -> "tuple[bytes | None, str, str]":
    """A file of this user's cache directory: (its bytes, its path, "") or (None, its path
    or "", why not), by the rules of private files (ours, regular, not a link, capped)."""
    fd, label, why = open_cache_dir(environ, False, base)
    if fd is None:
        if "(No such file" in why.split(";", 1)[0]:
            return None, "", NO_CACHE
        return None, "", f"no cache directory ({why})"
    try:
        bad, data, _ = read_private(fd, name, (os.geteuid(),), CACHE_CAP)
    finally:
        os.close(fd)
    path = f"{label}/{name}"
    return (data, path, "") if bad is None else (None, path, refusal(bad, path))


def frame(kind: str, lines: "list[str]") -> bytes:
    """A cache file of ``kind`` (``machine``, ``answers``): a header that says the format,
    the body's length and checksum, then the lines."""
    body = ("\n".join(lines) + "\n").encode("utf-8")
    return f"numabind-{kind} {FORMAT} {len(body)} {checksum(body)}\n".encode() + body


def unframe(data: bytes, kind: str) -> "tuple[list[str], str]":
    """The lines of a file :func:`frame` wrote, or ([], why not): another kind or format,
    truncated, damaged."""
    head, sep, body = data.partition(b"\n")
    fields = head.split(b" ")
    if not sep or len(fields) != 4 or fields[0] != f"numabind-{kind}".encode():
        return [], f"not a numabind {kind} file"
    if fields[1] != str(FORMAT).encode():
        return [], f"format {fields[1].decode('ascii', 'replace')[:8]}, not {FORMAT}"
    if not all(f.isdigit() and len(f) < 24 for f in fields[2:]):
        return [], "a damaged header"
    if int(fields[2]) != len(body):
        return [], f"truncated ({len(body)} of {int(fields[2])} bytes)"
    if int(fields[3]) != checksum(body):
        return [], "damaged (its checksum does not match)"
    try:
        return body.decode("utf-8").split("\n", 1 << 20), ""
    except UnicodeDecodeError:
        return [], "not UTF-8"


def answers_name(raw_sysroot: "str | None") -> str:
    """The answers file of a NUMABIND_SYSROOT value (unset: ""): numabind._replay writes
    it, the warm start reads it."""
    return f"answers-{checksum((raw_sysroot or '').encode('utf-8', 'replace')):016x}"


def _code_id() -> str:
    """Which numabind this is: the size and time of the two top-level modules and of the
    package's ``__init__`` (where the version lives), and the times of the package's
    directories, which change whenever a module is added, removed or replaced by a new
    file (an install, an upgrade, an editor that saves by renaming).  Not a module edited
    in place: ``NUMABIND_CACHE=0`` (or touching the directory) covers that in a checkout.
    The package is found where it is loaded (the isolated collector loads it from outside
    sys.path) or where the import system would find it; a few stats in all."""
    pkg = ""
    loaded = getattr(sys.modules.get("numabind"), "__file__", None)
    if isinstance(loaded, str):
        pkg = os.path.dirname(os.path.abspath(loaded))
    else:
        for entry in sys.path:
            if os.path.isfile(f"{entry or '.'}/numabind/__init__.py"):
                pkg = os.path.abspath(f"{entry or '.'}/numabind")
                break
    here = os.path.dirname(os.path.abspath(__file__))
    files = [f"{here}/_numabind_base.py", f"{here}/_numabind_start.py"]
    if pkg:
        files += [f"{pkg}/__init__.py", pkg, f"{pkg}/capture", f"{pkg}/check"]
    out = []
    for path in files:
        try:
            st = os.stat(path)
            out.append(f"{st.st_size}.{st.st_mtime_ns}")
        except OSError:
            out.append("-")
    return ",".join(out)


def machine_key(sysroot: str) -> str:
    """What decides a reading of the machine and every answer made from it, apart from
    what the witnesses check: the boot, the kernel release, the mount namespace (a
    container's /sys is its own), the user, the cgroup, the sysroot's identity, and the
    code.  One line of text without spaces, compared whole."""
    live = sysroot in ("", "/")
    cgroup = text(tree(sysroot) + "/proc/self/cgroup")
    try:
        mnt = os.readlink("/proc/self/ns/mnt")
    except OSError:
        mnt = "?"
    if live:
        where = "/"
    else:
        try:
            st = os.stat(sysroot)
            where = f"{escape(sysroot)}|{st.st_dev}.{st.st_ino}.{st.st_uid}.{st.st_mtime_ns}"
        except OSError:
            where = f"{escape(sysroot)}|?"  # escaped: a path that is not UTF-8 is one too
    parts = (
        f"boot={text('/proc/sys/kernel/random/boot_id', 128) or '?'}",
        f"kernel={os.uname().release}",
        f"mnt={mnt}",
        f"uid={os.geteuid()}",
        f"sysroot={where}",
        f"cgroup={'-' if cgroup is None else cgroup}",
        f"version={FORMAT}|{_code_id()}",
    )
    return "|".join(parts).replace("\n", ";").replace(" ", "_")


# Witness kinds: what of a file or directory is compared (numabind._facts says which files,
# per fact; every rank compares them before it trusts a cached answer)
WITNESS_KINDS = ("f", "l", "m")
WITNESS_CAP = 16384  # bytes of a witnessed file


def witness(kind: str, path: str) -> str:
    """What ``path`` says now, as a witness of ``kind`` records it: ``=`` and, for ``f``,
    the file's contents, for ``l`` a directory's sorted names, for ``m`` a meminfo's
    MemTotal line; ``-`` for one that is absent or unreadable (no contents can be taken
    for that); ``+`` for one too large to witness (more than :data:`WITNESS_CAP` bytes or
    :data:`LIST_CAP` names: a reading with such a witness is not kept, and a file that
    says it is refused).  A file is read in one read(2): every warm rank reads them all,
    and sysfs gives an attribute whole in one (a FIFO or a device cannot block,
    O_NONBLOCK; it merely reads as changed, and the rank plans)."""
    try:
        fd = os.open(path, _DIR_FLAGS if kind == "l" else _READ)
    except (OSError, ValueError):  # ValueError: a path no file system can name (a NUL, a
        # surrogate no encoding takes)
        return "-"
    try:
        if kind == "l":
            names, _ = entries(fd, LIST_CAP + 1)
            return "+" if len(names) > LIST_CAP else "=" + ",".join(sorted(names))
        got = os.read(fd, WITNESS_CAP + 1)
    except OSError:
        return "-"
    finally:
        os.close(fd)
    if len(got) > WITNESS_CAP:
        return "+"
    if kind == "m":
        at = got.find(b"MemTotal:")
        if at < 0:
            return "=?"  # there, but no MemTotal (a file that is absent says "-")
        got = got[at + 9 :].split(b"\n", 1)[0]
    return "=" + got.decode("utf-8", "replace").strip()


def tree(sysroot: str) -> str:
    """The prefix of every path read under ``sysroot`` ("" for the live system)."""
    return "" if sysroot in ("", "/") else sysroot.rstrip("/")


# An answers file's answers after its head: "a", its inputs, "=", its outputs, ".".  The
# kinds of line (numabind._replay writes them, the warm start reads them and hands over on
# a kind it does not know; a test holds both to these tables)
ANSWER_INPUTS = ("argv", "mask", "i", "absent", "policy")
ANSWER_OUTPUTS = ("cpus", "mempolicy", "pages", "plan", "binding", "env", "entry", "guard")
# where each kind of cache file's witnesses start (machine_head, answers_head)
WITNESSES_FROM = {"machine": 1, "answers": 2}


def _witness_lines(found: "list[tuple[str, str, str]]") -> "list[str]":
    return [f"w {k} {escape(p)} {escape(v)}" for k, p, v in found]


def machine_head(key: str, found: "list[tuple[str, str, str]]") -> "list[str]":
    """The first lines of a machine file: its key (:func:`machine_key`, which the writer
    has made already), then the witnesses (kind, path, what it said) of what it holds."""
    return [f"key {key}", *_witness_lines(found)]


def answers_head(
    key: str, sysroot: str, raw: "str | None", found: "list[tuple[str, str, str]]"
) -> "list[str]":
    """The first lines of an answers file: its key, the sysroot its witnesses are read
    under and the NUMABIND_SYSROOT value it answers (``~``: unset), then the witnesses."""
    value = "~" if raw is None else escape(raw)  # "~" itself is escaped: %7e
    return [
        f"key {key}",
        f"sysroot {escape(sysroot)} {value}",
        *_witness_lines(found),
    ]


def answers_sysroot(lines: "list[str]", raw: "str | None") -> "tuple[str | None, str]":
    """The sysroot an answers file's witnesses are read under, where it answers this
    NUMABIND_SYSROOT value (``raw``); else (None, why not)."""
    parts = lines[1].split(" ") if len(lines) > 1 else []
    if len(parts) != 3 or parts[0] != "sysroot":
        return None, "a damaged answers file"
    if parts[2] != ("~" if raw is None else escape(raw)):
        return None, "another NUMABIND_SYSROOT"
    try:
        return unescape(parts[1]), ""
    except ValueError:
        return None, "a damaged answers file"


def machine_holds(
    lines: "list[str]",
    sysroot: str,
    i: int,
    seen: "list[tuple[str, str, str]] | None" = None,
    key: "str | None" = None,
) -> "tuple[int, str]":
    """Whether a cache file's machine part holds for this process: its key (line 0) is this
    process's (``key``, where the caller made it already) and each witness line from ``i``
    on says what its file says now under ``sysroot``.  (The index after the witnesses, "")
    or (it, why not); ``seen`` gets the witnesses (kind, path, what it says) that held."""
    if lines[0] != f"key {key or machine_key(sysroot)}":
        return i, "made for another machine reading (boot, kernel, cgroup, sysroot or code)"
    prefix = tree(sysroot)
    while i < len(lines) and lines[i][:2] == "w ":
        parts = lines[i].split(" ")
        if len(parts) != 4 or parts[1] not in WITNESS_KINDS:
            return i, "a damaged witness"
        _, kind, path, said = parts
        try:  # most need no unescaping: not even the call
            path, said = (unescape(path) if "%" in path else path), unescape(said)
        except ValueError:
            return i, "a damaged witness"
        if said == "+" or witness(kind, prefix + path) != said:
            return i, f"the machine changed since it was read ({path} says otherwise)"
        if seen is not None:
            seen.append((kind, path, said))
        i += 1
    return i, ""


# --- the kernel calls that bind the process -----------------------------------------------------

# Linux's own numbers, per architecture (numabind._kernel.SYSCALLS adds each call's
# arguments and errno meanings to these)
SYSCALL_NUMBERS: "dict[str, dict[str, int]]" = {
    "mbind": {"x86_64": 237, "aarch64": 235},
    "set_mempolicy": {"x86_64": 238, "aarch64": 237},
    "get_mempolicy": {"x86_64": 239, "aarch64": 236},
    "migrate_pages": {"x86_64": 256, "aarch64": 238},
    "move_pages": {"x86_64": 279, "aarch64": 239},
    "set_mempolicy_home_node": {"x86_64": 450, "aarch64": 450},
    "madvise": {"x86_64": 28, "aarch64": 233},
    "sched_setaffinity": {"x86_64": 203, "aarch64": 122},
}


class CTypes:
    """The few ctypes pieces numabind's calls need, built on the ``_ctypes`` C module.

    ``import ctypes`` costs ~2 ms (its package sets up dozens of types and imports
    struct); ``_ctypes`` is what ctypes itself is made of, so these scalar, array and
    function-pointer types behave exactly like ctypes' own (numabind._kernel falls back
    to the ctypes package if anything about them is unexpected)."""

    def __init__(self) -> None:
        ct: Any = __import__("_ctypes")  # typeshed's stubs do not describe these uses

        def scalar(name: str, code: str) -> "Any":
            return type(name, (ct._SimpleCData,), {"_type_": code})

        self.c_long, self.c_ulong = scalar("c_long", "l"), scalar("c_ulong", "L")
        self.c_int, self.c_uint = scalar("c_int", "i"), scalar("c_uint", "I")
        self.c_void_p = scalar("c_void_p", "P")
        fn: Any = type(
            "Syscall",
            (ct.CFuncPtr,),
            {"_flags_": ct.FUNCFLAG_CDECL | ct.FUNCFLAG_USE_ERRNO, "_restype_": self.c_long},
        )

        class Handle:  # CFuncPtr looks the symbol up in any object's ``_handle``
            _handle = ct.dlopen(None, getattr(os, "RTLD_LOCAL", 0) | getattr(os, "RTLD_NOW", 2))

        self.byref = ct.byref
        self.get_errno, self.set_errno = ct.get_errno, ct.set_errno
        self._array_base = ct.Array
        self._arrays: dict[tuple[Any, int], Any] = {}
        self.syscall = fn(("syscall", Handle()))

    def array(self, kind: "Any", length: int) -> "Any":
        key = (kind, length)
        if key not in self._arrays:
            self._arrays[key] = type(
                f"{kind.__name__}_Array_{length}",
                (self._array_base,),
                {"_type_": kind, "_length_": length},
            )
        return self._arrays[key]


_WORDS = MAX_NODES // 64  # unsigned longs in a node mask


class Calls:
    """get_mempolicy and set_mempolicy as the kernel takes them: a mode (its flags
    included) and a node set, no names (which mode is which is the package's table; a
    replayed answer carries the number its planner chose)."""

    def __init__(self) -> None:
        machine = os.uname().machine
        self.get_nr = SYSCALL_NUMBERS["get_mempolicy"].get(machine)
        self.set_nr = SYSCALL_NUMBERS["set_mempolicy"].get(machine)
        if self.get_nr is None or self.set_nr is None:
            raise OSError(38, f"memory-policy calls on {machine}")
        self.ct = CTypes()
        self.words: Any = self.ct.array(self.ct.c_ulong, _WORDS)

    def _call(self, *args: "object") -> None:
        self.ct.set_errno(0)
        if int(self.ct.syscall(*args)) < 0:
            err = self.ct.get_errno()
            raise OSError(err, os.strerror(err))

    def get(self) -> "tuple[int, frozenset[int]]":
        """(the mode with its flags, the node set) of the calling thread's policy."""
        u, mode, w = self.ct.c_ulong, self.ct.c_int(0), self.words()
        self._call(u(self.get_nr), self.ct.byref(mode), w, u(MAX_NODES + 1), None, u(0))
        nodes: set[int] = set()
        for i in range(_WORDS):
            word, bit = int(w[i]), i * 64
            while word:
                if word & 1:
                    nodes.add(bit)
                word >>= 1
                bit += 1
        return int(mode.value), frozenset(nodes)

    def set(self, mode: int, nodes: "frozenset[int]") -> None:
        """Set the calling thread's policy (no nodes: a null mask, as MPOL_DEFAULT and
        MPOL_LOCAL take)."""
        u = self.ct.c_ulong
        if not nodes:
            self._call(u(self.set_nr), self.ct.c_int(mode), None, u(0))
            return
        w = self.words()
        for n in nodes:
            if not 0 <= n < MAX_NODES:
                raise OSError(22, f"node {n}")
            w[n // 64] |= 1 << (n % 64)
        self._call(u(self.set_nr), self.ct.c_int(mode), w, u(MAX_NODES + 1))


# --- the registry entry ------------------------------------------------------------------------

_registered: "dict[str, object]" = {}  # label and pid of the entry this process wrote


def register(label: str, data: bytes) -> "str | None":
    """Write this process's entry into its private registry directory ``label`` (a
    directory of the user's, opened as :func:`private_dir` checks it) and remove it at exit;
    None, or why it was not written."""
    parent, _, name = label.rpartition("/")
    try:
        pfd = os.open(parent or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as err:
        return f"{parent} cannot be opened ({err.strerror})"
    try:
        fd, bad = private_dir(pfd, name, os.geteuid(), create=True)
    finally:
        os.close(pfd)
    if fd is None:
        return f"{label} {bad}"
    pid = os.getpid()
    try:
        why = write_private(fd, str(pid), data, "entry")
    finally:
        os.close(fd)
    if why is not None:
        return why
    if not _registered:
        import atexit

        atexit.register(_unregister_at_exit)
    _registered.update(label=label, pid=pid)
    return None


def unregister() -> None:
    """Remove the entry :func:`register` wrote: its directory opened again as
    :func:`private_dir` checks it (not through a link, ours), the entry unlinked in it."""
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
    _registered.clear()


def _unregister_at_exit() -> None:
    # a fork child that exits normally runs its parent's atexit handlers: not its entry
    if _registered.get("pid") == os.getpid():
        unregister()


def start_time() -> str:
    """Field 22 of /proc/self/stat: with the pid, what names this process in the registry."""
    data = read_small("/proc/self/stat", 4096)
    fields = data.decode("ascii", "replace").rsplit(")", 1)[-1].split() if data else []
    return fields[19] if len(fields) > 19 else "0"


def intended_cpus() -> "frozenset[int] | None":
    """The CPUs this process is meant to run on, for the guards: numabind's latest binding
    where the package is loaded, else what the warm start applied."""
    apply = sys.modules.get("numabind._apply")
    if apply is not None:
        return apply.intended_cpus()  # type: ignore[no-any-return]
    cpus = applied.get("cpus") if applied else None
    return cpus if isinstance(cpus, frozenset) else None
