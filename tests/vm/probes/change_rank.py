"""A rank of the changes scenario (tests/vm/changes.py): what the startup hook did with it
and where its binding came from, then (with ``--hold``) it waits for a line on stdin while
``show`` and ``check --pid`` look at it.

Its first statement records the CPU mask the hook left; then it says whether the warm
start replayed a kept answer (``handed_over`` is "" then, else why the full path planned
it), the full path's binding (``numabind._startup.last``: its plan's node, device, CPUs
and the machine it planned from: "cache", "sysfs (cache: ... refused: the machine changed
...)") or the replayed one (``_apply.adopted()``).  ``--by-hand N`` puts 16 MiB on node N
itself (raw mbind), the memory ``check`` then counts per node kind.  Prints one line,
``{json}``.

Usage: change_rank.py [--by-hand N] [--hold]
"""

import os

FIRST_AFFINITY = sorted(os.sched_getaffinity(0))

import ctypes  # noqa: E402
import json  # noqa: E402
import mmap  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

SYS_MBIND, MPOL_BIND = 237, 2


def _by_hand(node: int) -> object:
    """16 MiB of private memory bound to ``node`` and touched (kept alive by the caller)."""
    libc = ctypes.CDLL(None, use_errno=True)
    size = 16 << 20
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    cell = ctypes.c_char.from_buffer(m)
    address = ctypes.addressof(cell)
    del cell
    words = (ctypes.c_ulong * 2)()
    words[node // 64] |= 1 << (node % 64)
    if libc.syscall(SYS_MBIND, ctypes.c_void_p(address), size, MPOL_BIND, words, 129, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mbind onto node {node}: {os.strerror(err)}")
    m.write(b"\x03" * size)
    return m


def _binding(b: Any) -> dict[str, Any] | None:
    if b is None:
        return None
    p = b.plan
    return {
        "status": p.status,
        "numa_node": p.numa_node,
        "device_pci": p.device.pci if p.device is not None else None,
        "cpus": sorted(p.cpus),
        "memory_nodes": sorted(p.memory_nodes),
        "machine": getattr(b, "machine", ""),
    }


def main() -> None:
    args = sys.argv[1:]
    keep = _by_hand(int(args[args.index("--by-hand") + 1])) if "--by-hand" in args else None
    import numabind._startup
    from numabind import _apply

    start = sys.modules.get("_numabind_start")
    last = numabind._startup.last
    data = {
        "pid": os.getpid(),
        "rank": int(os.environ.get("LOCAL_RANK", "-1")),
        "first": FIRST_AFFINITY,
        "handed_over": getattr(start, "handed_over", None),
        "origin": getattr(start, "machine_origin", None),
        "last": _binding(last),
        "adopted": _binding(None if last is not None else _apply.adopted()),
        "by_hand": keep is not None,
    }
    print(json.dumps(data), flush=True)
    if "--hold" in args:
        sys.stdin.readline()
    del keep


if __name__ == "__main__":
    main()
