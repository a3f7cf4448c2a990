"""A fork child still sharing its parent's pages: the parent allocates 100 MB on node 0,
then forks; the child becomes local rank 1 (node 1), binds late (pages it cannot move,
the shared ones, stay), allocates 50 MB of its own, reports its pid and waits for stdin
to close so that numabind check can look at it.  Before binding it computes for 3 s: with
NUMA balancing on (as in the VM's kernel and most distributions' defaults) the kernel then
unmaps its pages for hinting faults, which move_pages cannot see through (a bound task is
no longer scanned: its memory policy has no MPOL_F_NUMA_BALANCING); check must still count
the inherited pages as shared."""

import os
import sys
import time

from numabind import _kernel


def main() -> None:
    os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(",")])
    _kernel.set_mempolicy("bind", {0})
    shared = b"\x01" * (100 << 20)
    _kernel.set_mempolicy("default")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        t0 = time.time()
        while time.time() - t0 < 3:  # CPU time, unbound: NUMA balancing scans such a task
            pass
        os.environ["LOCAL_RANK"] = "1"
        import numabind

        numabind.apply(1)
        own = b"\x02" * (50 << 20)
        print(f"CHILD {os.getpid()}", flush=True)
        os.read(r, 1)  # until the parent lets go
        del own, shared
        os._exit(0)
    os.close(r)
    sys.stdin.read()
    os.close(w)
    os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
