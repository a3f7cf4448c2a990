"""Run a command under a seccomp filter that refuses memory-policy calls with EPERM.

    python -S tests/seccomp_eperm.py [--calls docker|all|NAME,NAME...] -- CMD ARGS...

(``-S``: this launcher itself must not be a rank that the startup hook binds.)

What docker's default profile does to a container without CAP_SYS_NICE (``all``: the five
memory-policy calls plus set_mempolicy_home_node refused) or with it (``docker``: only
move_pages and migrate_pages refused).  ``--old-kernel`` instead answers EINVAL to
set_mempolicy(MPOL_PREFERRED_MANY), which is what kernels before 5.15 do.  A real kernel
filter, installed with prctl (no libseccomp needed), then ``execv``: the command and
everything it starts run under it.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

# The numbers come from numabind's one table of system calls (numabind._kernel.SYSCALLS),
# so the filter refuses exactly the calls numabind makes; this launcher runs with -S, so
# the checkout's src/ is put on the path by hand.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src"))
from numabind._kernel import SYSCALLS

NUMBERS: dict[str, dict[str, int]] = {
    machine: {s.name: n for s in SYSCALLS if s.policy and (n := s.number(machine)) is not None}
    for machine in ("x86_64", "aarch64")
}
ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
SETS = {
    "all": tuple(NUMBERS["x86_64"]),
    "docker": ("move_pages", "migrate_pages"),  # docker's default profile, with CAP_SYS_NICE
}
EPERM = 1
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
RET_ALLOW, RET_ERRNO = 0x7FFF0000, 0x00050000


def program(calls: tuple[str, ...]) -> bytes:
    machine = os.uname().machine
    nrs = [NUMBERS[machine][c] for c in calls]
    ops: list[tuple[int, int, int, int]] = [(BPF_LD_W_ABS, 0, 0, 4)]  # seccomp_data.arch
    n = len(nrs)
    ops.append((BPF_JEQ_K, 0, n + 2, ARCH[machine]))  # another arch: allow
    ops.append((BPF_LD_W_ABS, 0, 0, 0))  # seccomp_data.nr
    for i, nr in enumerate(nrs):
        ops.append((BPF_JEQ_K, n - i, 0, nr))  # jump to the ERRNO return
    ops.append((BPF_RET_K, 0, 0, RET_ALLOW))
    ops.append((BPF_RET_K, 0, 0, RET_ERRNO | EPERM))
    return b"".join(struct.pack("HBBI", *op) for op in ops)


EINVAL = 22
MPOL_PREFERRED_MANY = 5


def old_kernel_program() -> bytes:
    """set_mempolicy(mode == MPOL_PREFERRED_MANY, ...) -> EINVAL; everything else allowed."""
    machine = os.uname().machine
    nr = NUMBERS[machine]["set_mempolicy"]
    ops = [
        (BPF_LD_W_ABS, 0, 0, 4),
        (BPF_JEQ_K, 0, 5, ARCH[machine]),
        (BPF_LD_W_ABS, 0, 0, 0),
        (BPF_JEQ_K, 0, 3, nr),
        (BPF_LD_W_ABS, 0, 0, 16),  # args[0], low word: the mode (flags live above 0xffff)
        (0x54, 0, 0, 0xFFFF),  # BPF_ALU | BPF_AND | BPF_K: drop the mode flags
        (BPF_JEQ_K, 1, 0, MPOL_PREFERRED_MANY),
        (BPF_RET_K, 0, 0, RET_ALLOW),
        (BPF_RET_K, 0, 0, RET_ERRNO | EINVAL),
    ]
    return b"".join(struct.pack("HBBI", *op) for op in ops)


def install(calls: tuple[str, ...], code: bytes | None = None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    code = code if code is not None else program(calls)
    buf = ctypes.create_string_buffer(code, len(code))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(code) // 8, ctypes.addressof(buf))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def main(argv: list[str]) -> int:
    calls = SETS["all"]
    code = None
    if argv[:1] == ["--old-kernel"]:
        code = old_kernel_program()
        argv = argv[1:]
    if argv[:1] == ["--calls"]:
        spec = argv[1]
        calls = SETS.get(spec) or tuple(spec.split(","))
        argv = argv[2:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    install(calls, code)
    os.execvp(argv[0], argv)
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
