"""An engine-style worker with no rank variable that picks its GPU with
torch.cuda.set_device(1) (NUMABIND_TORCH=1): bound late to GPU 1's node before torch is
asked (the CPU build then refuses the call itself).  Then 200 MB from this thread and 32 MB
through torch's allocator; prints one JSON line.

With ``threads`` (argv[1], under NUMABIND_DEVICES=all): a process that drives both GPUs,
one thread per GPU, each calling torch.cuda.set_device(k) and recording its own CPUs and
memory policy; the process keeps the union."""

import json
import os
import sys
import threading

import torch

from numabind import _kernel
from numabind._kernel import pages_per_node, private_anon_regions


def select(k: int) -> str:
    try:
        torch.cuda.set_device(k)
        return "ok"
    except Exception as err:
        return type(err).__name__


def threads() -> None:
    out: dict[str, object] = {"process": sorted(os.sched_getaffinity(0))}

    def worker(k: int) -> None:
        call = select(k)
        policy = _kernel.get_mempolicy()
        out[str(k)] = {
            "call": call,
            "cpus": sorted(os.sched_getaffinity(0)),
            "policy": [policy[0], sorted(policy[1])],
        }

    ts = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out["main"] = sorted(os.sched_getaffinity(0))
    print(json.dumps(out))


def main() -> None:
    if sys.argv[1:] == ["threads"]:
        threads()
        return
    first = sorted(os.sched_getaffinity(0))
    call = select(1)
    after = sorted(os.sched_getaffinity(0))
    policy = _kernel.get_mempolicy()
    buf = b"\x01" * (200 << 20)
    keep = torch.ones(8 << 20)
    print(
        json.dumps(
            {
                "first": first,
                "after": after,
                "call": call,
                "policy": [policy[0], sorted(policy[1])],
                "pages": pages_per_node(private_anon_regions()),
                "touched": len(buf) + int(keep.numel()),
            }
        )
    )


if __name__ == "__main__":
    main()
