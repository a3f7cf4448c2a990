"""Host buffers on a real two-node kernel, from a process bound to node 0 (CPUs and memory
policy): where numabind puts them, measured here by code that is not numabind's (this
file's own reading of /proc/self/numa_maps, and move_pages in query mode through its own
ctypes call).  Prints one JSON object.

Usage: host_buffers.py MIB [--seccomp]  (under the seccomp launcher: only the fallback)
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

import numabind

MIB = int(sys.argv[1])
PAGE = os.sysconf("SC_PAGE_SIZE")
LIBC = ctypes.CDLL(None, use_errno=True)
MOVE_PAGES = {"x86_64": 279, "aarch64": 239}[os.uname().machine]
SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}[os.uname().machine]


def maps_pages(address: int, nbytes: int) -> dict[str, int]:
    """Pages per node of the mappings starting in the range, from numa_maps (in 4 KiB)."""
    out: dict[str, int] = {}
    with open("/proc/self/numa_maps") as f:
        for line in f:
            fields = line.split()
            start = int(fields[0], 16)
            if not address <= start < address + nbytes:
                continue
            for field in fields[2:]:
                if field.startswith("N") and "=" in field:
                    node, count = field[1:].split("=")
                    out[node] = out.get(node, 0) + int(count)
    return out


def queried(address: int, nbytes: int) -> dict[str, int]:
    """Pages per node (``-``: not present) from move_pages(2) with no target nodes."""
    count = nbytes // PAGE
    pages = (ctypes.c_void_p * count)(*[address + i * PAGE for i in range(count)])
    status = (ctypes.c_int * count)()
    res = LIBC.syscall(MOVE_PAGES, 0, ctypes.c_ulong(count), pages, None, status, 0)
    if res != 0:
        return {"error": ctypes.get_errno()}
    out: dict[str, int] = {}
    for s in status:
        key = str(s) if s >= 0 else "-"
        out[key] = out.get(key, 0) + 1
    return out


def bind_to_node0() -> None:
    """This process on node 0's CPUs, preferring node 0's memory (what a rank of GPU 0
    would have): every buffer below is placed against it."""
    with open("/sys/devices/system/node/node0/cpulist") as f:
        text = f.read().strip()
    cpus: set[int] = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        cpus.update(range(int(a), int(b or a) + 1))
    os.sched_setaffinity(0, cpus)
    mask = ctypes.c_ulong(1)  # node 0
    LIBC.syscall(SET_MEMPOLICY, 1, ctypes.byref(mask), ctypes.c_ulong(65))  # MPOL_PREFERRED


def record(buf: Any) -> dict[str, Any]:
    return {
        "nbytes": buf.nbytes,
        "nodes": list(buf.nodes),
        "policy": buf.policy,
        "populated": buf.populated,
        "threads": buf.threads,
        "notes": buf.notes,
        "maps": maps_pages(buf.address, buf.mapped_bytes),
        "query": queried(buf.address, buf.mapped_bytes),
        "own": {str(k): v for k, v in buf.placement().items()},
    }


def main() -> None:
    bind_to_node0()
    out: dict[str, Any] = {}
    size = MIB << 20
    if "--seccomp" in sys.argv:
        with numabind.host_buffer(size, node=1) as buf:
            out["fallback"] = record(buf)
        print(json.dumps(out))
        return
    for policy in ("bind", "preferred"):
        with numabind.host_buffer(size, node=1, policy=policy) as buf:
            out[policy] = record(buf)
    with numabind.host_buffer(size // 2, node=[0, 1], policy="interleave") as buf:
        out["interleave"] = record(buf)
    for device in (0, 1):
        with numabind.host_buffer(16 << 20, device=device) as buf:
            out[f"device{device}"] = record(buf)
    # bind_range: memory this process placed on node 0 (its own policy), moved to node 1
    region = bytearray(size // 2)
    region[::PAGE] = b"\1" * len(region[::PAGE])
    view = memoryview(region)
    cell = ctypes.c_char.from_buffer(view)
    address = ctypes.addressof(cell)
    del cell
    before = maps_pages(address // PAGE * PAGE, len(region))
    r = numabind.bind_range(address, len(region), 1)
    out["bind_range"] = {
        "before": before,
        "moved": r.moved,
        "not_moved": r.not_moved,
        "left_out": r.left_out,
        "placement": {str(k): v for k, v in r.placement.items()},
        "query": queried(r.start, r.nbytes),
    }
    view.release()
    # more than node 1 holds: refused before populating
    try:
        numabind.host_buffer(1 << 40, node=1)
        out["too_big"] = "mapped"
    except numabind.PlacementError as err:
        out["too_big"] = str(err)
    # close() unmaps
    buf = numabind.host_buffer(4 << 20, node=1)
    address = buf.address
    buf.close()
    with open("/proc/self/maps") as f:
        out["closed_still_mapped"] = any(ln.startswith(f"{address:x}-") for ln in f)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
