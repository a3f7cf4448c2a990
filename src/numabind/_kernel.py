"""Kernel calls: CPU affinity and memory policy, without libnuma.

glibc does not export the memory-policy calls, and libnuma is missing from many images, so
they go through ``syscall(2)`` by number, from the already-loaded libc (never
``ctypes.util.find_library``: ~20 ms, and it may spawn ``ldconfig``).  The ctypes machinery
is built on first use, only by a process that actually binds, and from the ``_ctypes`` C
module rather than the ctypes package (see :class:`_CTypes`).

Scope matters here: CPU affinity and memory policy both belong to one *thread*.  A
policy set here governs the calling thread and the threads and processes it creates
afterwards (kept across ``execve``); it cannot be set for another thread of the process.
"""

from __future__ import annotations

import errno
import os

from ._sysfs import MAX_NODES, format_cpulist

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from ._errors import KernelError

MPOL_DEFAULT, MPOL_PREFERRED, MPOL_BIND, MPOL_INTERLEAVE, MPOL_LOCAL, MPOL_PREFERRED_MANY = range(6)
MPOL_F_STATIC_NODES = 1 << 15
MPOL_F_RELATIVE_NODES = 1 << 14
MPOL_MF_STRICT, MPOL_MF_MOVE, MPOL_MF_MOVE_ALL = 1, 2, 4
POLICY_CODES = {
    "default": MPOL_DEFAULT,
    "preferred": MPOL_PREFERRED,
    "bind": MPOL_BIND,
    "interleave": MPOL_INTERLEAVE,
    "local": MPOL_LOCAL,
    "preferred-many": MPOL_PREFERRED_MANY,
}
POLICY_NAMES = {v: k for k, v in POLICY_CODES.items()}

_SYSCALLS = {
    "x86_64": {
        "mbind": 237,
        "set_mempolicy": 238,
        "get_mempolicy": 239,
        "migrate_pages": 256,
        "move_pages": 279,
    },
    "aarch64": {
        "mbind": 235,
        "set_mempolicy": 237,
        "get_mempolicy": 236,
        "migrate_pages": 238,
        "move_pages": 239,
    },
}
# Node masks are passed as arrays of unsigned longs; MAX_NODES (1024) covers every kernel
# configuration shipped (CONFIG_NODES_SHIFT <= 10).
_WORD_BITS = 64
_WORDS = MAX_NODES // _WORD_BITS


class _CTypes:
    """The few ctypes pieces the kernel layer needs, built on the ``_ctypes`` C module.

    ``import ctypes`` costs ~2 ms (its package sets up dozens of types and imports struct);
    the startup hook has 5 ms in all.  ``_ctypes`` is what ctypes itself is made of, so the
    handful of scalar, array and function-pointer types below behave exactly like ctypes'
    own.  If anything about it is unexpected, numabind falls back to the ctypes package.
    """

    def __init__(self) -> None:
        _ctypes: Any = __import__("_ctypes")  # typeshed's stubs do not describe these uses

        def scalar(name: str, code: str) -> Any:
            return type(name, (_ctypes._SimpleCData,), {"_type_": code})

        c_long, c_ulong, c_int = scalar("c_long", "l"), scalar("c_ulong", "L"), scalar("c_int", "i")
        c_uint, c_void_p = scalar("c_uint", "I"), scalar("c_void_p", "P")
        syscall_type: Any = type(
            "Syscall",
            (_ctypes.CFuncPtr,),
            {"_flags_": _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO, "_restype_": c_long},
        )

        class Handle:
            _handle = _ctypes.dlopen(
                None, getattr(os, "RTLD_LOCAL", 0) | getattr(os, "RTLD_NOW", 2)
            )

        self.c_long, self.c_ulong, self.c_int, self.c_uint, self.c_void_p = (
            c_long,
            c_ulong,
            c_int,
            c_uint,
            c_void_p,
        )
        self.byref = _ctypes.byref
        self.get_errno, self.set_errno = _ctypes.get_errno, _ctypes.set_errno
        self._array_base = _ctypes.Array
        self._arrays: dict[tuple[Any, int], Any] = {}
        self.syscall = syscall_type(("syscall", Handle()))

    def array(self, kind: Any, length: int) -> Any:
        key = (kind, length)
        if key not in self._arrays:
            self._arrays[key] = type(
                f"{kind.__name__}_Array_{length}",
                (self._array_base,),
                {"_type_": kind, "_length_": length},
            )
        return self._arrays[key]


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


def _error(call: str, err: int, asked: str) -> KernelError:
    # numabind._errors is imported only when a call fails: the hook's path stays short
    from ._errors import KernelError

    return KernelError(call, err, asked)


class _Libc:
    _instance: _Libc | None = None

    def __init__(self) -> None:
        machine = os.uname().machine
        if machine not in _SYSCALLS:
            raise _error(
                "syscall", errno.ENOSYS, f"memory-policy calls on {machine} are not supported"
            )
        self.numbers = _SYSCALLS[machine]
        ct: Any
        try:
            ct = _CTypes()
            ct.set_errno(0)
            # a harmless call proves the function pointer works: get_mempolicy(NULL...)
            if (
                int(
                    ct.syscall(
                        ct.c_long(self.numbers["get_mempolicy"]),
                        None,
                        None,
                        ct.c_ulong(0),
                        None,
                        ct.c_ulong(0),
                    )
                )
                < 0
                and ct.get_errno() == 0
            ):
                raise OSError("syscall returned -1 without errno")
        except Exception:
            ct = _CTypesPackage()
        self.ctypes = ct

    @classmethod
    def get(cls) -> _Libc:
        if cls._instance is None:
            cls._instance = _Libc()
        return cls._instance

    def call(self, name: str, asked: str, *args: Any) -> int:
        ct = self.ctypes
        ct.set_errno(0)
        res = int(ct.syscall(ct.c_long(self.numbers[name]), *args))
        if res < 0:
            raise _error(name, ct.get_errno(), asked)
        return res

    def mask(self, nodes: Iterable[int]) -> Any:
        arr = self.ctypes.array(self.ctypes.c_ulong, _WORDS)()
        for n in nodes:
            if not 0 <= n < MAX_NODES:
                raise _error("nodemask", errno.EINVAL, f"node {n}")
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


def _policy_nodes(lib: _Libc, code: int, nodes: frozenset[int]) -> tuple[Any, Any]:
    """The (nodemask, maxnode) pair of a policy call: MPOL_DEFAULT and MPOL_LOCAL take no
    nodes (NULL, 0); the others a mask of MAX_NODES bits (maxnode is bits + 1)."""
    ct = lib.ctypes
    if code in (MPOL_DEFAULT, MPOL_LOCAL):
        return None, ct.c_ulong(0)
    return ct.byref(lib.mask(nodes)), ct.c_ulong(MAX_NODES + 1)


def set_mempolicy(policy: str, nodes: Iterable[int] = ()) -> None:
    """Set the calling thread's memory policy (inherited by threads/processes it starts)."""
    lib = _Libc.get()
    nodes = frozenset(nodes)
    code = POLICY_CODES[policy]
    mask, maxnode = _policy_nodes(lib, code, nodes)
    lib.call(
        "set_mempolicy", f"{policy}, nodes {_fmt(nodes)}", lib.ctypes.c_int(code), mask, maxnode
    )


def get_mempolicy() -> tuple[str, frozenset[int]]:
    """The calling thread's memory policy and its nodes."""
    lib = _Libc.get()
    ct = lib.ctypes
    mode = ct.c_int(0)
    mask = lib.mask(())
    lib.call(
        "get_mempolicy",
        "self",
        ct.byref(mode),
        ct.byref(mask),
        ct.c_ulong(MAX_NODES + 1),
        None,
        ct.c_ulong(0),
    )
    code = mode.value & ~(MPOL_F_STATIC_NODES | MPOL_F_RELATIVE_NODES)
    return POLICY_NAMES.get(code, str(code)), _nodes_of(mask)


def mbind(addr: int, length: int, policy: str, nodes: Iterable[int], flags: int = 0) -> None:
    """Set the policy of an address range; with ``MPOL_MF_MOVE`` also move its pages."""
    lib = _Libc.get()
    ct = lib.ctypes
    nodes = frozenset(nodes)
    code = POLICY_CODES[policy]
    mask, maxnode = _policy_nodes(lib, code, nodes)
    lib.call(
        "mbind",
        f"0x{addr:x}+{length}, {policy}, nodes {_fmt(nodes)}, flags {flags}",
        ct.c_void_p(addr),
        ct.c_ulong(length),
        ct.c_int(code),
        mask,
        maxnode,
        ct.c_uint(flags),
    )


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
    lib.call(
        "move_pages",
        f"pid {pid}, {n} pages",
        ct.c_int(pid),
        ct.c_ulong(n),
        arr,
        node_arr,
        status,
        ct.c_int(MPOL_MF_MOVE),
    )
    return list(status)


def migrate_pages(pid: int, old: Iterable[int], new: Iterable[int]) -> int:
    """Move all of a process's pages from ``old`` to ``new`` nodes (shared ones too, as
    root: numabind itself never calls this on a rank; it is here for tools and tests)."""
    lib = _Libc.get()
    ct = lib.ctypes
    old, new = frozenset(old), frozenset(new)
    a, b = lib.mask(old), lib.mask(new)
    return lib.call(
        "migrate_pages",
        f"pid {pid}, {_fmt(old)} -> {_fmt(new)}",
        ct.c_int(pid),
        ct.c_ulong(MAX_NODES + 1),
        ct.byref(a),
        ct.byref(b),
    )


# --- CPU affinity -------------------------------------------------------------------------


def thread_ids(pid: int | str = "self") -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return [os.getpid()] if pid == "self" else []


def affinity_of(tid: int) -> frozenset[int] | None:
    try:
        return frozenset(os.sched_getaffinity(tid))
    except OSError:
        return None


def set_thread_affinity(tid: int, cpus: frozenset[int]) -> None:
    """Set one thread's CPU mask.  EINVAL here means none of ``cpus`` is allowed (a
    cgroup cpuset without them); the error then lists the ones that are."""
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError as err:
        if err.errno == errno.EINVAL:
            eligible = affinity_of(0) or frozenset()
            raise _error(
                "sched_setaffinity",
                errno.EINVAL,
                f"thread {tid}, CPUs {format_cpulist(cpus)}; this process may use "
                f"{format_cpulist(eligible)}",
            ) from err
        raise
