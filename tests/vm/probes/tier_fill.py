"""A rank (bound by the startup hook) that fills FILL_MIB of memory, then says where every
page is, measured by this probe's own code, never numabind's: its numa_maps line parsed
here, and move_pages in query mode (raw syscall) on every 16th page.

Options: ``--interleave-all`` sets this thread's policy to interleave over every node
first (numactl --interleave=all), then makes a 64 MiB numabind.host_buffer on node 0 and
fills 64 MiB by hand beside it; ``--by-hand N`` mbinds 64 MiB onto node N itself (raw
syscall) and fills it; ``--buffer N`` makes a 32 MiB numabind.host_buffer on node N;
``--hold`` prints its JSON, then waits for a line on stdin (check runs meanwhile).

Usage: tier_fill.py FILL_MIB [--interleave-all] [--by-hand N] [--buffer N] [--hold]
"""

import ctypes
import json
import mmap
import os
import sys

PAGE = mmap.PAGESIZE
MPOL_BIND, MPOL_INTERLEAVE = 2, 3
SYS_MBIND, SYS_SET_MEMPOLICY, SYS_GET_MEMPOLICY, SYS_MOVE_PAGES = 237, 238, 239, 279
LIBC = ctypes.CDLL(None, use_errno=True)


def nodes_online() -> list[int]:
    with open("/sys/devices/system/node/online") as f:
        text = f.read().strip()
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b or a) + 1))
    return out


def mask(nodes: list[int]) -> ctypes.Array[ctypes.c_ulong]:
    words = (ctypes.c_ulong * 2)()
    for n in nodes:
        words[n // 64] |= 1 << (n % 64)
    return words


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def policy() -> list[object]:
    mode, words = ctypes.c_int(0), (ctypes.c_ulong * 2)()
    check(LIBC.syscall(SYS_GET_MEMPOLICY, ctypes.byref(mode), words, 129, None, 0), "get")
    names = {
        0: "default",
        1: "preferred",
        2: "bind",
        3: "interleave",
        4: "local",
        5: "preferred-many",
    }
    nodes = [n for n in range(128) if words[n // 64] >> (n % 64) & 1]
    return [names.get(mode.value & 0xFF, str(mode.value)), nodes]


def region(mib: int) -> tuple[mmap.mmap, int]:
    """Private anonymous memory (what a heap is; a shared mapping is tmpfs)."""
    m = mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    cell = ctypes.c_char.from_buffer(m)
    address = ctypes.addressof(cell)
    del cell
    return m, address


def numa_maps(address: int) -> dict[str, int]:
    """Pages per node of the mapping at ``address``, from this process's numa_maps."""
    with open("/proc/self/numa_maps") as f:
        for line in f:
            fields = line.split()
            if int(fields[0], 16) == address:
                out: dict[str, int] = {}
                for field in fields[2:]:
                    if field.startswith("N") and "=" in field:
                        node, count = field[1:].split("=")
                        out[node] = out.get(node, 0) + int(count)
                return out
    return {}


def move_pages_query(address: int, nbytes: int, stride: int = 16) -> dict[str, int]:
    """Where every ``stride``-th page is, asked of the kernel (move_pages, nodes=NULL)."""
    pages = list(range(address, address + nbytes, PAGE * stride))
    out: dict[str, int] = {}
    for i in range(0, len(pages), 4096):
        chunk = pages[i : i + 4096]
        ptrs = (ctypes.c_void_p * len(chunk))(*chunk)
        status = (ctypes.c_int * len(chunk))()
        check(LIBC.syscall(SYS_MOVE_PAGES, 0, len(chunk), ptrs, None, status, 0), "move_pages")
        for s in status:
            key = str(s) if s >= 0 else f"error {-s}"
            out[key] = out.get(key, 0) + stride
    return out


def main() -> None:
    fill = int(sys.argv[1])
    args = sys.argv[2:]
    result: dict[str, object] = {"policy_at_start": policy(), "pid": os.getpid()}
    keep: list[object] = []
    if "--interleave-all" in args:
        every = nodes_online()
        words = mask(every)
        check(LIBC.syscall(SYS_SET_MEMPOLICY, MPOL_INTERLEAVE, words, 129), "set_mempolicy")
        result["policy_interleaved"] = policy()
        import numabind

        buf = numabind.host_buffer(64 << 20, node=0, register=False)
        keep.append(buf)
        result["buffer_under_interleave"] = {
            "policy": buf.policy,
            "numa_maps": numa_maps(buf.address),
            "move_pages": move_pages_query(buf.address, buf.nbytes),
        }
        plain, address = region(64)
        ctypes.memset(address, 1, 64 << 20)
        keep.append(plain)
        result["plain_under_interleave"] = numa_maps(address)
    m, address = region(fill)
    ctypes.memset(address, 1, fill << 20)
    keep.append(m)
    result["fill"] = {
        "mib": fill,
        "numa_maps": numa_maps(address),
        "move_pages": move_pages_query(address, fill << 20),
    }
    if "--by-hand" in args:
        node = int(args[args.index("--by-hand") + 1])
        hand, addr = region(64)
        check(
            LIBC.syscall(
                SYS_MBIND,
                ctypes.c_void_p(addr),
                ctypes.c_ulong(64 << 20),
                MPOL_BIND,
                mask([node]),
                129,
                0,
            ),
            "mbind",
        )
        ctypes.memset(addr, 1, 64 << 20)
        keep.append(hand)
        result["by_hand"] = {"node": node, "numa_maps": numa_maps(addr)}
    if "--buffer" in args:
        import numabind

        node = int(args[args.index("--buffer") + 1])
        buf = numabind.host_buffer(32 << 20, node=node, register=False)
        keep.append(buf)
        result["buffer"] = {"node": node, "policy": buf.policy, "numa_maps": numa_maps(buf.address)}
    result["policy"] = policy()
    print(json.dumps(result), flush=True)
    if "--hold" in args:
        sys.stdin.readline()


if __name__ == "__main__":
    main()
