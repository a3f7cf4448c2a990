"""A fork child still sharing its parent's pages: the parent allocates 100 MB on node 0,
then forks; the child becomes local rank 1 (node 1), binds late (pages it cannot move,
the shared ones, stay), allocates 50 MB of its own, reports its pid and waits for stdin
to close so that numabind check can look at it."""

import os
import sys

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
