"""The kernel interface: the system calls numabind makes (one table), and what /proc says
about a process (one home for every /proc file numabind reads).

**System calls.**  glibc does not export the memory-policy calls, and libnuma is missing
from many images, so they go through ``syscall(2)`` by number, from the already-loaded
libc (never ``ctypes.util.find_library``: ~20 ms, and it may spawn ``ldconfig``).  Every
call numabind makes or a container may refuse is a row of :data:`SYSCALLS`: its number
per architecture, its argument types, and what each errno means *for that call*; the
kernel layer, the error messages and the seccomp test filter all read that table.  The
ctypes machinery is built on first use, only by a process that actually binds, from the
``_ctypes`` C module rather than the ctypes package (see :class:`_CTypes`).

Scope matters here: CPU affinity and memory policy both belong to one *thread*.  A
policy set here governs the calling thread and the threads and processes it creates
afterwards (kept across ``execve``); it cannot be set for another thread of the process.

**/proc.**  A process's initial environment, its status, stat, threads, command line,
memory maps and numa_maps are read here and nowhere else, each bounded: maps and numa_maps
are parsed as a stream with a per-process cap on bytes and lines (a process with 65,000
mappings of 4,000-character paths costs the cap, not 516 MiB), and only *private
anonymous* memory (heap, anonymous mmaps, thread stacks) is ever measured or moved: file
pages and shared mappings are used by every rank of the machine.
"""

from __future__ import annotations

import errno
import os
import time

import _numabind_base as base

from . import _sysfs
from ._model import POLICIES, POLICY_BY_CODE, Record, parse_numa_maps_policy
from ._sysfs import MAX_NODES, Lines, format_cpulist, node_counts  # numa_maps' reader

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from ._errors import KernelError

# --- the system calls, one table ---------------------------------------------------------------


class Syscall(Record):
    """One system call: its number on each architecture (Linux's own tables), its
    arguments as ctypes kinds (``l`` long, ``L`` unsigned long, ``i`` int, ``I`` unsigned
    int, ``P`` pointer), and what each errno means for it, said so a user can act."""

    name: str
    numbers: tuple[tuple[str, int], ...]
    args: tuple[str, ...]
    meanings: tuple[tuple[int, str], ...]
    policy: bool = True  # a memory-policy call (what a container's seccomp profile refuses)

    def number(self, machine: str) -> int | None:
        return dict(self.numbers).get(machine)

    def meaning(self, err: int) -> str:
        return dict(self.meanings).get(err) or os.strerror(err)


_POLICY_MEANINGS = (
    (
        errno.EPERM,
        "not permitted: a seccomp filter or container policy forbids memory-policy calls "
        "(docker: --cap-add SYS_NICE restores set_mempolicy and mbind)",
    ),
    (
        errno.EINVAL,
        "invalid: a node is offline, memory-less, or outside this process's cpuset.mems",
    ),
    (errno.ENOSYS, "not implemented: this kernel was built without NUMA support"),
    (errno.ENOMEM, "out of memory in the kernel"),
    (errno.EFAULT, "bad address"),
)


def _numbers(name: str) -> tuple[tuple[str, int], ...]:
    return tuple(base.SYSCALL_NUMBERS[name].items())


SYSCALLS: tuple[Syscall, ...] = (
    Syscall(
        name="mbind",
        numbers=_numbers("mbind"),
        args=("P", "L", "i", "P", "L", "I"),
        meanings=_POLICY_MEANINGS,
    ),
    Syscall(
        name="set_mempolicy",
        numbers=_numbers("set_mempolicy"),
        args=("i", "P", "L"),
        meanings=_POLICY_MEANINGS,
    ),
    Syscall(
        name="get_mempolicy",
        numbers=_numbers("get_mempolicy"),
        args=("P", "P", "L", "P", "L"),
        meanings=_POLICY_MEANINGS,
    ),
    Syscall(
        name="migrate_pages",
        numbers=_numbers("migrate_pages"),
        args=("i", "L", "P", "P"),
        meanings=_POLICY_MEANINGS,
    ),
    Syscall(
        name="move_pages",
        numbers=_numbers("move_pages"),
        args=("i", "L", "P", "P", "P", "i"),
        meanings=_POLICY_MEANINGS,
    ),
    Syscall(
        name="set_mempolicy_home_node",  # not called; docker's profile refuses it too
        numbers=_numbers("set_mempolicy_home_node"),
        args=("L", "L", "L", "L"),
        meanings=_POLICY_MEANINGS,
    ),
    Syscall(
        name="madvise",  # MADV_POPULATE_WRITE: host buffers are populated without the GIL
        numbers=_numbers("madvise"),
        args=("P", "L", "i"),
        meanings=(
            (errno.EINVAL, "invalid: this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)"),
            (errno.ENOMEM, "out of memory: the node or the cgroup could not hold the pages"),
            (errno.EFAULT, "bad address, or the pages could not be populated"),
            (133, "a page is poisoned (hardware memory error)"),  # EHWPOISON
            (errno.EPERM, "not permitted"),
        ),
        policy=False,
    ),
    Syscall(
        name="sched_setaffinity",  # called through os.sched_setaffinity
        numbers=_numbers("sched_setaffinity"),
        args=("i", "L", "P"),
        meanings=(
            (
                errno.EINVAL,
                "invalid: none of these CPUs is online and allowed by this process's cgroup cpuset",
            ),
            (errno.EPERM, "not permitted: the thread belongs to another user"),
            (errno.ESRCH, "no such thread (it exited)"),
        ),
        policy=False,
    ),
)
BY_NAME = {s.name: s for s in SYSCALLS}
POLICY_CALLS: tuple[str, ...] = tuple(s.name for s in SYSCALLS if s.policy)

# What a page's status from move_pages means (the errno, positive), said so a user can act:
# the one table of why a page is not where it was asked to be
PAGE_STATUS: dict[int, str] = {
    errno.ENOENT: "not present",
    errno.EFAULT: "not mapped, or a zero or special page",
    errno.EACCES: "shared with another process",
    errno.EBUSY: "busy (pinned for DMA, locked or under I/O)",
    errno.ENOMEM: "no memory on the target node",
    errno.EIO: "could not be written back (not migratable)",
    errno.EINVAL: "cannot move (a special page)",
}

MPOL_F_STATIC_NODES = 1 << 15
MPOL_F_RELATIVE_NODES = 1 << 14
MPOL_F_NUMA_BALANCING = 1 << 13
# the mode flags get_mempolicy reports with a policy (numactl's "=" static and "+" relative
# nodes, and NUMA balancing): a policy put back must have them, or it means other nodes
MODE_FLAGS = MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES | MPOL_F_NUMA_BALANCING
MPOL_MF_STRICT, MPOL_MF_MOVE, MPOL_MF_MOVE_ALL = 1, 2, 4
# Node masks are passed as arrays of unsigned longs; MAX_NODES (1024) covers every kernel
# configuration shipped (CONFIG_NODES_SHIFT <= 10).
_WORD_BITS = 64
_WORDS = MAX_NODES // _WORD_BITS


def error(call: str, err: int, asked: str) -> KernelError:
    """The exception for a failed call, saying what its errno means for that call."""
    # numabind._errors is imported only when a call fails: the hook's path stays short
    from ._errors import KernelError

    found = BY_NAME.get(call)
    meaning = found.meaning(err) if found is not None else os.strerror(err)
    return KernelError(call, err, asked, meaning)


# the cheap ctypes pieces: the one copy is the startup applier's (numabind falls back to
# the ctypes package below if anything about them is unexpected)
_CTypes = base.CTypes


class _CTypesPackage:
    """The same pieces from the ctypes package (the fallback)."""

    def __init__(self) -> None:
        import ctypes

        self.c_long, self.c_ulong, self.c_int = ctypes.c_long, ctypes.c_ulong, ctypes.c_int
        self.c_uint, self.c_void_p = ctypes.c_uint, ctypes.c_void_p
        self.byref = ctypes.byref
        self.get_errno, self.set_errno = ctypes.get_errno, ctypes.set_errno
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        self.syscall = libc.syscall

    def array(self, kind: Any, length: int) -> Any:
        return kind * length


class _Libc:
    _instance: _Libc | None = None

    def __init__(self) -> None:
        machine = os.uname().machine
        numbers = {s.name: s.number(machine) for s in SYSCALLS}
        if any(n is None for n in numbers.values()):
            raise error(
                "syscall", errno.ENOSYS, f"memory-policy calls on {machine} are not supported"
            )
        self.numbers: dict[str, int] = {k: v for k, v in numbers.items() if v is not None}
        ct: Any
        try:
            ct = _CTypes()
            ct.set_errno(0)
            # a harmless call proves the function pointer works: get_mempolicy(NULL...)
            nr = ct.c_long(self.numbers["get_mempolicy"])
            res = ct.syscall(nr, None, None, ct.c_ulong(0), None, ct.c_ulong(0))
            if int(res) < 0 and ct.get_errno() == 0:
                raise OSError("syscall returned -1 without errno")
        except Exception:
            ct = _CTypesPackage()
        self.ctypes = ct

    @classmethod
    def get(cls) -> _Libc:
        if cls._instance is None:
            cls._instance = _Libc()
        return cls._instance

    def call(self, name: str, asked: str, *values: Any) -> int:
        """Call ``name`` with ``values`` converted as its row of :data:`SYSCALLS` says
        (``i``/``I`` int, ``l``/``L`` long, ``P`` a pointer: an address, a ctypes
        reference or None): the table is the one place a call's signature is spelled."""
        ct = self.ctypes
        kinds = BY_NAME[name].args
        if len(values) != len(kinds):
            raise TypeError(f"{name} takes {len(kinds)} arguments, not {len(values)}")
        args = [self._arg(kind, value) for kind, value in zip(kinds, values)]
        ct.set_errno(0)
        res = int(ct.syscall(ct.c_long(self.numbers[name]), *args))
        if res < 0:
            raise error(name, ct.get_errno(), asked)
        return res

    def _arg(self, kind: str, value: Any) -> Any:
        ct = self.ctypes
        if kind == "P":
            return ct.c_void_p(value) if isinstance(value, int) else value
        return {"i": ct.c_int, "I": ct.c_uint, "l": ct.c_long, "L": ct.c_ulong}[kind](value)

    def mask(self, nodes: Iterable[int]) -> Any:
        arr = self.ctypes.array(self.ctypes.c_ulong, _WORDS)()
        for n in nodes:
            if not 0 <= n < MAX_NODES:
                raise error("nodemask", errno.EINVAL, f"node {n}")
            arr[n // _WORD_BITS] |= 1 << (n % _WORD_BITS)
        return arr


def _nodes_of(arr: Any) -> frozenset[int]:
    out = set()
    for w in range(_WORDS):
        word = int(arr[w])
        b = 0
        while word:
            if word & 1:
                out.add(w * _WORD_BITS + b)
            word >>= 1
            b += 1
    return frozenset(out)


def _fmt(nodes: Iterable[int]) -> str:
    return format_cpulist(nodes) or "none"


def _code(policy: str) -> int:
    code = POLICIES[policy].code
    if code is None:
        raise ValueError(f"memory policy {policy!r} is not a kernel policy")
    return code


def _policy_nodes(lib: _Libc, code: int, nodes: frozenset[int]) -> tuple[Any, Any]:
    """The (nodemask, maxnode) pair of a policy call: MPOL_DEFAULT and MPOL_LOCAL take no
    nodes (NULL, 0); the others a mask of MAX_NODES bits (maxnode is bits + 1)."""
    ct = lib.ctypes
    if code in (POLICIES["default"].code, POLICIES["local"].code):
        return None, 0
    return ct.byref(lib.mask(nodes)), MAX_NODES + 1


def set_mempolicy(policy: str, nodes: Iterable[int] = ()) -> None:
    """Set the calling thread's memory policy (inherited by threads/processes it starts)."""
    set_mempolicy_mode(_code(policy), nodes)


def set_policy(
    policy: str, nodes: frozenset[int], home: int | None = None
) -> tuple[str, frozenset[int], str | None]:
    """Set the calling thread's memory policy, falling back as the policy table says where
    the kernel lacks it (MPOL_PREFERRED_MANY before 5.15 refuses with EINVAL: then the
    ``home`` node is preferred).  Returns (the policy set, its nodes, a note when the
    fallback was set); raises ``OSError`` when the kernel refuses both.  The one place
    that knows this: the process and thread appliers both set policies through it."""
    if policy == "local":
        nodes = frozenset()
    try:
        set_mempolicy(policy, nodes)
    except OSError as err:
        fallback = POLICIES[policy].fallback
        if fallback is None or err.errno != errno.EINVAL or not nodes:
            raise
        first = home if home in nodes else min(nodes)
        set_mempolicy(fallback, frozenset({first}))
        return (
            fallback,
            frozenset({first}),
            f"kernel refused MPOL_{policy.upper().replace('-', '_')}: "
            + (f"preferring node {first}" if fallback == "preferred" else f"{fallback} {first}"),
        )
    return policy, nodes, None


def get_mempolicy() -> tuple[str, frozenset[int]]:
    """The calling thread's memory policy and its nodes."""
    mode, nodes = get_mempolicy_mode()
    return policy_name(mode), nodes


def policy_name(mode: int) -> str:
    """A policy's name in the policy table, from its mode (flags ignored)."""
    found = POLICY_BY_CODE.get(mode & ~MODE_FLAGS)
    return found.name if found is not None else str(mode & ~MODE_FLAGS)


def get_mempolicy_mode() -> tuple[int, frozenset[int]]:
    """The calling thread's policy as the kernel reports it: the mode with its flags and
    the nodes as they were given (for static or relative nodes, the caller's own mask).
    What a binding saves, so that :func:`set_mempolicy_mode` puts back the same policy:
    ``bind`` over relative node 0 is not ``bind`` over node 0 in a cpuset whose first
    node is 1."""
    lib = _Libc.get()
    ct = lib.ctypes
    mode = ct.c_int(0)
    mask = lib.mask(())
    lib.call("get_mempolicy", "self", ct.byref(mode), ct.byref(mask), MAX_NODES + 1, None, 0)
    return mode.value, _nodes_of(mask)


def set_mempolicy_mode(mode: int, nodes: Iterable[int] = ()) -> None:
    """Set a policy by its mode, flags and all: what :func:`get_mempolicy_mode` read, put
    back, or a table policy's code (:func:`set_mempolicy`)."""
    lib = _Libc.get()
    nodes = frozenset(nodes)
    mask, maxnode = _policy_nodes(lib, mode & ~MODE_FLAGS, nodes)
    name = policy_name(mode) + (f" (mode 0x{mode:x})" if mode & MODE_FLAGS else "")
    lib.call("set_mempolicy", f"{name}, nodes {_fmt(nodes)}", mode, mask, maxnode)


def mbind(addr: int, length: int, policy: str, nodes: Iterable[int], flags: int = 0) -> None:
    """Set the policy of an address range; with ``MPOL_MF_MOVE`` also move its pages."""
    lib = _Libc.get()
    nodes = frozenset(nodes)
    code = _code(policy)
    mask, maxnode = _policy_nodes(lib, code, nodes)
    asked = f"0x{addr:x}+{length}, {policy}, nodes {_fmt(nodes)}, flags {flags}"
    lib.call("mbind", asked, addr, length, code, mask, maxnode, flags)


MADV_DONTFORK = 10  # fork does not copy the range (pages pinned for DMA would be copied)
MADV_DOFORK = 11
MADV_HUGEPAGE = 14
MADV_DONTDUMP = 16
MADV_POPULATE_WRITE = 23
PR_SET_VMA, PR_SET_VMA_ANON_NAME = 0x53564D41, 0


def name_mapping(addr: int, length: int, name: str) -> bool:
    """Give an anonymous mapping its own name in /proc/PID/maps (``[anon:NAME]``, Linux
    5.17+ with CONFIG_ANON_VMA_NAME), which also keeps the kernel from merging it with
    its neighbours; False where the kernel cannot."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    res = libc.prctl(
        ctypes.c_int(PR_SET_VMA),
        ctypes.c_ulong(PR_SET_VMA_ANON_NAME),
        ctypes.c_ulong(addr),
        ctypes.c_ulong(length),
        ctypes.c_char_p(name.encode()),
    )
    return int(res) == 0


def madvise(addr: int, length: int, advice: int) -> None:
    """madvise(2) through ``syscall``, which releases the GIL (CPython's ``mmap.madvise``
    holds it): threads populating parts of one buffer run in parallel."""
    _Libc.get().call("madvise", f"0x{addr:x}+{length}, advice {advice}", addr, length, advice)


def move_pages(pages: list[int], nodes: list[int] | None = None, pid: int = 0) -> list[int]:
    """Move pages (``nodes`` given) or ask where they are (``nodes`` None).

    Returns one status per page: the node it is on, or a negative errno (-ENOENT: not
    present, -EFAULT: not mapped).
    """
    lib = _Libc.get()
    ct = lib.ctypes
    n = len(pages)
    if n == 0:
        return []
    arr = ct.array(ct.c_void_p, n)(*pages)
    status = ct.array(ct.c_int, n)()
    node_arr = ct.array(ct.c_int, n)(*nodes) if nodes is not None else None
    lib.call("move_pages", f"pid {pid}, {n} pages", pid, n, arr, node_arr, status, MPOL_MF_MOVE)
    return list(status)


def migrate_pages(pid: int, old: Iterable[int], new: Iterable[int]) -> int:
    """Move all of a process's pages from ``old`` to ``new`` nodes (shared ones too, as
    root: numabind itself never calls this on a rank; it is here for tools and tests)."""
    lib = _Libc.get()
    ct = lib.ctypes
    old, new = frozenset(old), frozenset(new)
    a, b = lib.mask(old), lib.mask(new)
    asked = f"pid {pid}, {_fmt(old)} -> {_fmt(new)}"
    return lib.call("migrate_pages", asked, pid, MAX_NODES + 1, ct.byref(a), ct.byref(b))


# --- CPU affinity ------------------------------------------------------------------------------


thread_ids = _sysfs.thread_ids  # procfs readers, in the reading layer (the guards use them
affinity_of = _sysfs.affinity_of  # without loading this module)


def set_thread_affinity(tid: int, cpus: frozenset[int]) -> None:
    """Set one thread's CPU mask.  EINVAL here means none of ``cpus`` is allowed (a
    cgroup cpuset without them); the error then lists the ones that are."""
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError as err:
        if err.errno == errno.EINVAL:
            from ._environ import debugging

            eligible = format_cpulist(affinity_of(0) or frozenset())
            found = error(
                "sched_setaffinity",
                errno.EINVAL,
                f"thread {tid}, CPUs {format_cpulist(cpus)}; this process may use {eligible}",
            )
            if not debugging():  # the call and the thread are numabind's own business
                found = type(found)(
                    found.call,
                    errno.EINVAL,
                    found.asked,
                    found.meaning,
                    f"the kernel refused CPUs {format_cpulist(cpus)}: "
                    f"{(found.meaning or '').removeprefix('invalid: ')} (this process may use "
                    f"{eligible})",
                )
            raise found from err
        raise


# --- /proc: what the kernel says about a process -----------------------------------------------

ENVIRON_CAP = 4 << 20
STATUS_CAP = 16384
_SPECIAL = ("[vdso]", "[vvar]", "[vsyscall]", "[vectors]", "[sigpage]", "[uprobes]")


def read_environ(pid: int | str) -> dict[str, str]:
    """A process's initial environment (``/proc/PID/environ``: what it was started with, not
    what it has set since), capped like every other read; raises ``OSError``."""
    out = {}
    for item in _sysfs.read_bytes(f"/proc/{pid}/environ", ENVIRON_CAP).split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


def cmdline(pid: int | str) -> list[str]:
    """A process's argument vector (empty when unreadable)."""
    text = _sysfs.read_opt(f"/proc/{pid}/cmdline", 1 << 16) or ""
    return [a for a in text.split("\0") if a]


def _stat_fields(pid: int | str) -> list[str] | None:
    text = _sysfs.read_opt(f"/proc/{pid}/stat", 4096)
    if text is None:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    return text.rsplit(")", 1)[-1].split()


def start_time(pid: int | str) -> str | None:
    """When the process started (clock ticks since boot): with the pid, its identity."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else None


def process_state(pid: int | str) -> str | None:
    """The one-letter state of a process (``Z`` zombie, ``X`` dead), None if gone."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def alive(pid: int | str) -> bool:
    state = process_state(pid)
    return state is not None and state not in ("Z", "X")


def status(pid: int | str, tid: int | None = None) -> dict[str, str] | None:
    """``/proc/PID/status`` (or a thread's) as key -> value text, None if gone."""
    path = f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status"
    text = _sysfs.read_opt(path, STATUS_CAP)
    if text is None:
        return None
    out: dict[str, str] = {}
    for line in text.splitlines()[:128]:
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def process_uids(pid: int | str) -> set[int] | None:
    """The real and effective uid of a live process, None if it is gone."""
    found = status(pid)
    if found is None:
        return None
    ids = found.get("Uid", "").split()[:2]
    return {int(x) for x in ids if x.isascii() and x.isdigit() and len(x) < 11}


def cpus_allowed(pid: int | str, tid: int | None = None) -> frozenset[int] | None:
    """A process's (or one thread's) CPU mask, from ``Cpus_allowed_list``."""
    found = status(pid, tid)
    if found is None or "Cpus_allowed_list" not in found:
        return None
    try:
        return _sysfs.parse_cpulist(found["Cpus_allowed_list"])
    except ValueError:
        return None


def thread_masks(pid: int | str) -> dict[int, frozenset[int]]:
    """Every thread's CPU mask, read from /proc (works for another user's process)."""
    out = {}
    for tid in thread_ids(pid) if pid != "self" else thread_ids():
        mask = cpus_allowed(pid, tid)
        if mask is not None:
            out[tid] = mask
    return out


def thread_name(pid: int, tid: int) -> str:
    """A thread's name (``comm``: at most 15 bytes, set by the program), "" when gone."""
    text = _sysfs.read_opt(f"/proc/{pid}/task/{tid}/comm", 64)
    return (text or "").strip()


CHILDREN_CAP = 4096  # child processes looked at per process (DataLoader workers, helpers)


def child_pids(pid: int, tids: list[int] | None = None) -> list[int]:
    """The processes ``pid``'s threads started and that still run (``/proc/PID/task/TID/
    children``; empty where the kernel lacks CONFIG_PROC_CHILDREN), at most
    :data:`CHILDREN_CAP`."""
    found: set[int] = set()
    for tid in tids if tids is not None else thread_ids(pid):
        text = _sysfs.read_opt(f"/proc/{pid}/task/{tid}/children", 1 << 16) or ""
        found.update(int(c) for c in text.split() if c.isascii() and c.isdigit() and len(c) < 11)
        if len(found) >= CHILDREN_CAP:
            break
    return sorted(found)[:CHILDREN_CAP]


FDS_CAP = 4096  # open files looked at per process for device handles


def char_devices(pid: int | str) -> set[tuple[int, int]]:
    """The (major, minor) numbers of the character devices a process holds open, from
    ``stat`` of its ``/proc/PID/fd`` links (no open, no signal: it works while the process
    hangs in a collective); at most :data:`FDS_CAP` descriptors are looked at.  Empty when
    the descriptors are not readable by this user."""
    import stat as _stat

    found: set[tuple[int, int]] = set()
    for name in _sysfs.listdir(f"/proc/{pid}/fd", FDS_CAP):
        if not (name.isascii() and name.isdigit() and len(name) < 11):
            continue
        try:  # stat only what names a device: a file on a hung NFS mount would block
            if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("/dev/"):
                continue
            st = os.stat(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if _stat.S_ISCHR(st.st_mode):
            found.add((os.major(st.st_rdev), os.minor(st.st_rdev)))
    return found


class Region(Record):
    """One private anonymous mapping and its resident pages per node (in its own page
    size; ``anon`` pages counted as the kernel's ``anon=``)."""

    start: int
    end: int
    name: str
    page_size: int
    pages: dict[int, int]
    mapmax: int = 1  # the most processes mapping one of its pages (> 1: some are shared)
    policy: str = "default"  # the range's own policy, as numa_maps shows it

    def __hash__(self) -> int:
        return hash((self.start, self.end))


def hex_int(text: str) -> int | None:
    if not text or len(text) > 16:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


class Maps:
    """A process's private anonymous regions with their pages per node, and whether the
    caps cut the reading short (``truncated``)."""

    def __init__(self, regions: list[Region], truncated: bool) -> None:
        self.regions = regions
        self.truncated = truncated


def read_maps(pid: int | str = "self") -> Maps:
    """Private anonymous mappings of ``pid`` with their resident pages per NUMA node
    (``/proc/PID/maps`` for what is anonymous, ``numa_maps`` for where it is): the
    regions of :func:`memory_view`, the one reader of both files."""
    view = memory_view(pid)
    return Maps(list(view.regions), view.truncated)


class MemoryView(Record):
    """What one process's memory looks like, from one pass over ``/proc/PID/maps`` and one
    over ``numa_maps`` (however many host buffers its entry lists): its main thread's
    memory policy, its private anonymous regions, each listed buffer's pages per node (by
    index; None: not mapped), and whether a cap or the deadline cut the reading short."""

    policy: tuple[str, frozenset[int]] | None
    regions: tuple[Region, ...]
    buffers: dict[int, dict[int, int] | None]
    truncated: bool
    late: bool = False


def memory_view(
    pid: int | str, buffers: tuple[tuple[int, int], ...] = (), deadline: float | None = None
) -> MemoryView:
    """Read ``pid``'s maps and numa_maps once each (:class:`Lines`: bounded
    streams) and derive from that one reading everything ``check`` measures of a process:
    the policy numa_maps shows on the heap (else on the first anonymous region), the
    private anonymous regions with their pages per node, and the pages of each buffer
    ``(address, bytes)`` (the mappings that make it up; one that began before it counts
    whole, as numa_maps says no finer).  Stops at ``deadline`` (a ``time.monotonic()``
    value), marking the view late.  Raises OSError when the files cannot be read."""
    return _MemoryReader(pid, buffers, deadline).read()


class _MemoryReader:
    """The one pass of :func:`memory_view` (state kept between the two files)."""

    def __init__(
        self, pid: int | str, buffers: tuple[tuple[int, int], ...], deadline: float | None
    ) -> None:
        self.pid, self.buffers, self.deadline = pid, buffers, deadline
        self.late = False
        self.private: dict[int, tuple[int, str]] = {}  # start -> (end, name)
        self.firsts = {i: a for i, (a, _) in enumerate(buffers)}  # where their pages begin
        self.found: dict[int, dict[int, int] | None] = dict.fromkeys(range(len(buffers)))
        self.regions: list[Region] = []
        self.pick: str | None = None  # the numa_maps line the policy is read from
        self.heap = False

    def _stop(self, n: int) -> bool:
        if self.deadline is not None and n % 4096 == 0 and time.monotonic() > self.deadline:
            self.late = True
        return self.late

    def read(self) -> MemoryView:
        maps = Lines(f"/proc/{self.pid}/maps")
        starts = sorted((a, i) for i, (a, _) in enumerate(self.buffers))
        for n, line in enumerate(maps):
            if self._stop(n):
                break
            self._maps_line(line, starts)
        spans = sorted((self.firsts[i], a + size, i) for i, (a, size) in enumerate(self.buffers))
        numa = Lines(f"/proc/{self.pid}/numa_maps")
        for n, line in enumerate(numa):
            if self._stop(n):
                break
            self._numa_line(line, spans)
        return MemoryView(
            policy=self._policy(),
            regions=tuple(self.regions),
            buffers=self.found,
            truncated=maps.truncated or numa.truncated,
            late=self.late,
        )

    def _maps_line(self, line: str, starts: list[tuple[int, int]]) -> None:
        import bisect

        fields = line.split(None, 5)
        if len(fields) < 5:
            return
        a, _, b = fields[0].partition("-")
        lo, hi = hex_int(a), hex_int(b)
        if lo is None or hi is None or hi <= lo:
            return
        for k in range(bisect.bisect_left(starts, (lo, -1)), len(starts)):
            if starts[k][0] >= hi:
                break
            self.firsts[starts[k][1]] = lo  # the mapping holding this buffer's first byte
        name = fields[5].strip() if len(fields) == 6 else ""
        if len(fields[1]) < 4 or fields[1][3] != "p":
            return
        if name and not (name in ("[heap]", "[stack]") or name.startswith(("[anon:", "[stack:"))):
            return
        if name not in _SPECIAL:
            self.private[lo] = (hi, name or "[anon]")

    def _numa_line(self, line: str, spans: list[tuple[int, int, int]]) -> None:
        if not self.heap:  # the policy, as task_policy picks its line
            if " heap" in line:
                self.pick, self.heap = line, True
            elif self.pick is None and " anon=" in line and "file=" not in line:
                self.pick = line
        fields = line.split()
        start = hex_int(fields[0]) if fields else None
        if start is None:
            return
        page_kb, mapmax = 4, 1
        for f in fields[2:]:
            if f.startswith("kernelpagesize_kB="):
                page_kb = _sysfs.parse_int(f.split("=", 1)[1]) or 4
            elif f.startswith("mapmax="):
                mapmax = _sysfs.parse_int(f[7:]) or 1
        counts = list(node_counts(fields[2:]))
        for first, end, i in spans:
            if first > start:
                break
            if start < end:
                got = self.found[i] or {}
                for node, c in counts:
                    got[node] = got.get(node, 0) + c * (page_kb // 4)
                self.found[i] = got
        if start in self.private and not any(f.startswith("file=") for f in fields):
            end_, name = self.private[start]
            self.regions.append(
                Region(
                    start=start,
                    end=end_,
                    name=name,
                    page_size=page_kb * 1024,
                    pages=dict(counts),
                    mapmax=mapmax,
                    policy=parse_numa_maps_policy(fields)[0],
                )
            )

    def _policy(self) -> tuple[str, frozenset[int]] | None:
        if self.pick is None:
            return None
        name, nodes = parse_numa_maps_policy(self.pick.split())
        try:
            return name, _sysfs.parse_nodelist(nodes) if nodes else frozenset()
        except ValueError:
            return name, frozenset()


def private_anon_regions(pid: int | str = "self") -> list[Region]:
    """Private anonymous mappings of ``pid`` with their resident pages per NUMA node."""
    return read_maps(pid).regions


def task_policy(pid: int | str) -> tuple[str, frozenset[int]] | None:
    """The main thread's memory policy as numa_maps shows it on the heap (a region with no
    policy of its own shows its task's), else on the first anonymous region."""
    pick = None
    for line in Lines(f"/proc/{pid}/numa_maps"):
        if " heap" in line:
            pick = line
            break
        if pick is None and " anon=" in line and "file=" not in line:
            pick = line
    if pick is None:
        return None
    name, nodes = parse_numa_maps_policy(pick.split())
    try:
        return name, _sysfs.parse_nodelist(nodes) if nodes else frozenset()
    except ValueError:
        return name, frozenset()


_PAGEMAP_PRESENT = 1 << 63
_PAGEMAP_EXCLUSIVE = 1 << 56  # "page exclusively mapped" (Linux 4.2+)
PAGEMAP_BUDGET = 1 << 22  # pages looked at in all (16 GiB of 4 KiB pages; 32 MiB read)


def shared_pages(
    regions: list[Region], pid: int | str = "self", budget: int = PAGEMAP_BUDGET
) -> tuple[list[int], bool]:
    """Addresses of the resident pages that another process maps too (a fork child's
    copy-on-write pages still shared with its parent), from /proc/PID/pagemap's
    "exclusively mapped" bit, in regions whose numa_maps ``mapmax`` is above 1.  Returns
    (addresses, whether the budget cut the scan short)."""
    out: list[int] = []
    cut = False
    try:
        fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return out, False
    try:
        for r in regions:
            if r.mapmax <= 1 or r.page_size != 4096:
                continue  # (huge pages are not shared copy-on-write in practice)
            size = 4096
            addr = r.start
            while addr < r.end:
                n = min((r.end - addr) // size, 65536, budget)
                if n <= 0:
                    cut = addr < r.end
                    break
                budget -= n
                try:
                    data = os.pread(fd, n * 8, (addr // 4096) * 8)
                except OSError:
                    break
                for i in range(len(data) // 8):
                    word = int.from_bytes(data[i * 8 : i * 8 + 8], "little")
                    if word & _PAGEMAP_PRESENT and not word & _PAGEMAP_EXCLUSIVE:
                        out.append(addr + i * 4096)
                addr += n * size
            if budget <= 0:
                cut = True
                break
    finally:
        os.close(fd)
    return out, cut


def pages_per_node(regions: list[Region]) -> dict[int, int]:
    """Resident private anonymous memory per node, in 4 KiB page units."""
    total: dict[int, int] = {}
    for r in regions:
        factor = max(r.page_size // 4096, 1)
        for node, count in r.pages.items():
            total[node] = total.get(node, 0) + count * factor
    return dict(sorted(total.items()))


def locality(per_node: dict[int, int], nodes: frozenset[int]) -> float | None:
    """Share of pages on ``nodes`` (0..1), None when there are no pages."""
    total = sum(per_node.values())
    if total == 0:
        return None
    return sum(c for n, c in per_node.items() if n in nodes) / total
