"""A rank bound by the startup hook, then ``apply()`` twice, then a second binder: a thread
that names itself ``uccl_proxy`` re-pinned to every CPU with ``os.sched_setaffinity`` (as
UCCL's proxies and TensorRT-LLM's second configure_cpu_affinity() do), ``numabind check``
of this very process, and ``apply()`` once more.  Prints one JSON line."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading

import numabind

NUMABIND = os.path.join(os.path.dirname(sys.executable), "numabind")


def masks() -> dict[str, list[int]]:
    out = {}
    for t in os.listdir("/proc/self/task"):
        try:
            out[t] = sorted(os.sched_getaffinity(int(t)))
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
    return out


def main() -> None:
    first = numabind.apply()
    before = masks()
    again = numabind.apply()
    ready, done = threading.Event(), threading.Event()

    def proxy() -> None:
        ctypes.CDLL(None).prctl(15, b"uccl_proxy", 0, 0, 0)  # PR_SET_NAME
        ready.set()
        done.wait()

    t = threading.Thread(target=proxy)
    t.start()
    ready.wait()
    tid = t.native_id
    assert tid is not None
    os.sched_setaffinity(tid, range(os.cpu_count() or 1))
    check = subprocess.run(
        [NUMABIND, "check", "--pid", str(os.getpid()), "--json"], capture_output=True, text=True
    )
    third = numabind.apply()
    after = sorted(os.sched_getaffinity(tid))
    done.set()
    t.join()
    print(
        json.dumps(
            {
                "same": again is first,
                # the threads there were before (join() returns before the proxy's kernel
                # thread is gone from /proc/self/task: it may still be listed)
                "masks_same": {t: m for t, m in masks().items() if t in before} == before,
                "before": before,
                "check_rc": check.returncode,
                "check": json.loads(check.stdout) if check.stdout.strip() else check.stderr,
                "third": str(third),
                "proxy_after": after,
                "proxy_tid": tid,
            }
        )
    )


if __name__ == "__main__":
    main()
