"""An engine-style worker with no rank variable that picks its GPU with
torch.cuda.set_device(1) (NUMABIND_TORCH=1): bound late to GPU 1's node before torch is
asked (the CPU build then refuses the call itself).  Then 200 MB from this thread and 32 MB
through torch's allocator; prints one JSON line."""

import json
import os

import torch

from numabind import _kernel
from numabind._kernel import pages_per_node, private_anon_regions


def main() -> None:
    first = sorted(os.sched_getaffinity(0))
    try:
        torch.cuda.set_device(1)
        call = "ok"
    except Exception as err:
        call = type(err).__name__
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
