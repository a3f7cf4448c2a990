"""A rank's probe in the VM: its very first statement records the CPU mask and memory
policy the startup hook left (before any import of its own), then it allocates MB
megabytes (argv[1]), touches 4 MiB through mmap and 8 MiB from two threads, and prints
one JSON line: where its private pages are, and where move_pages says a fresh mapping is.
"""

import os

FIRST_AFFINITY = sorted(os.sched_getaffinity(0))
from numabind import _kernel  # noqa: E402

try:
    FIRST_POLICY = _kernel.get_mempolicy()
except OSError:  # a seccomp filter refuses it (tests/seccomp_eperm.py)
    FIRST_POLICY = ("refused", frozenset())

import ctypes  # noqa: E402
import json  # noqa: E402
import mmap  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

from numabind._kernel import pages_per_node, private_anon_regions  # noqa: E402


def main() -> None:
    mb = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    buf = b"\x01" * (mb << 20)
    m = mmap.mmap(-1, 4 << 20)
    m.write(b"\x01" * (4 << 20))
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    try:
        where = sorted(set(_kernel.move_pages([addr + i * 4096 for i in range(1024)])))
    except OSError:
        where = []
    keep: list[bytes] = []

    def worker() -> None:
        keep.append(b"\x02" * (4 << 20))

    ts = [threading.Thread(target=worker) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    threads = {k: os.environ.get(k) for k in names}
    print(
        json.dumps(
            {
                "affinity": FIRST_AFFINITY,
                "policy": [FIRST_POLICY[0], sorted(FIRST_POLICY[1])],
                "pages": pages_per_node(private_anon_regions()),
                "move_pages": where,
                "threads": threads,
                "touched": len(buf),
            }
        )
    )


if __name__ == "__main__":
    main()
