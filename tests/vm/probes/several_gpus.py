"""One process, two threads, each in ``numabind.bind_thread(device=k)``: measured by code
that is not numabind's (raw ``sched_getaffinity`` of each thread, ``get_mempolicy`` and
``move_pages`` in query mode through this probe's own ctypes calls).

Each thread records its CPUs and memory policy inside its block, touches MB megabytes
(argv[1]) there and asks the kernel where every 8th page of it is; a ``threading.Thread``
it starts inside the block records its own CPUs and policy; after the block the thread
records what it has again.  Prints one JSON line.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import sys
import threading

import numabind

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
NR = {"x86_64": {"get_mempolicy": 239, "move_pages": 279}}[os.uname().machine]
PAGE = mmap.PAGESIZE


def get_mempolicy() -> list[object]:
    """The calling thread's policy and nodes, asked of the kernel directly."""
    mode = ctypes.c_int(0)
    mask = (ctypes.c_ulong * 16)()
    res = LIBC.syscall(
        ctypes.c_long(NR["get_mempolicy"]),
        ctypes.byref(mode),
        ctypes.byref(mask),
        ctypes.c_ulong(1025),
        None,
        ctypes.c_ulong(0),
    )
    if res < 0:
        return ["error", ctypes.get_errno()]
    nodes = [w * 64 + b for w in range(16) for b in range(64) if mask[w] >> b & 1]
    return [mode.value, nodes]


def where(addr: int, nbytes: int, every: int = 8) -> dict[str, int]:
    """Pages per node of every ``every``-th page of a range, from move_pages(2) itself."""
    pages = list(range(addr, addr + nbytes, PAGE * every))
    out: dict[str, int] = {}
    for i in range(0, len(pages), 4096):
        chunk = pages[i : i + 4096]
        arr = (ctypes.c_void_p * len(chunk))(*chunk)
        status = (ctypes.c_int * len(chunk))()
        LIBC.syscall(
            ctypes.c_long(NR["move_pages"]),
            ctypes.c_int(0),
            ctypes.c_ulong(len(chunk)),
            arr,
            None,
            status,
            ctypes.c_int(0),
        )
        for s in status:
            out[str(s)] = out.get(str(s), 0) + 1
    return out


def worker(k: int, mb: int, out: dict[str, object]) -> None:
    before = [sorted(os.sched_getaffinity(0)), get_mempolicy()]
    with numabind.bind_thread(device=k) as tb:
        inside = [sorted(os.sched_getaffinity(0)), get_mempolicy()]
        m = mmap.mmap(-1, mb << 20)
        m.write(b"\x01" * (mb << 20))  # first touched inside the block, by this thread
        addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
        child: dict[str, object] = {}

        def started() -> None:
            child["cpus"] = sorted(os.sched_getaffinity(0))
            child["policy"] = get_mempolicy()

        t = threading.Thread(target=started)
        t.start()
        t.join()
        out[str(k)] = {
            "before": before,
            "inside": inside,
            "pages": where(addr, mb << 20),
            "child": child,
            "ok": tb.ok,
            "line": str(tb),
        }
    out[str(k)]["after"] = [sorted(os.sched_getaffinity(0)), get_mempolicy()]  # type: ignore[index]


def main() -> None:
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    out: dict[str, object] = {}
    threads = [threading.Thread(target=worker, args=(k, mb, out)) for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out["main"] = [sorted(os.sched_getaffinity(0)), get_mempolicy()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
