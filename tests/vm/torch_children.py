"""Imported first thing by every child that torch starts in tests/vm/torch_scenarios.py.

Its first statement records what the child had before any import of its own, torch
included: the affinity and the memory policy it started with."""

import os

FIRST_AFFINITY = sorted(os.sched_getaffinity(0))
from numabind import _kernel  # noqa: E402  (a read of the policy; torch is not imported yet)

FIRST_POLICY = _kernel.get_mempolicy()
FIRST_MODULES_HAD_TORCH = "torch" in __import__("sys").modules

import json  # noqa: E402

import torch  # noqa: E402


def _measure(kind: str, rank: int, out: str) -> None:
    buf = b"\x01" * (200 << 20)  # touch 200 MB
    keep = torch.ones(8 << 20)  # and 32 MB through torch's allocator
    from numabind._kernel import pages_per_node, private_anon_regions

    data = {
        "rank": rank,
        "first_affinity": FIRST_AFFINITY,
        "first_policy": [FIRST_POLICY[0], sorted(FIRST_POLICY[1])],
        "torch_before_first_statement": FIRST_MODULES_HAD_TORCH,
        "pages": pages_per_node(private_anon_regions()),
        "touched": len(buf) + int(keep.numel()),
    }
    main = __import__("sys").modules.get("__mp_main__")
    if main is not None and hasattr(main, "FIRST_AFFINITY"):
        data["main_first_affinity"] = main.FIRST_AFFINITY
        data["main_first_policy"] = [main.FIRST_POLICY[0], sorted(main.FIRST_POLICY[1])]
    with open(f"{out}/{kind}-{rank}.json", "w") as f:
        json.dump(data, f)


def spawn_fn(rank: int, out: str) -> None:
    _measure("spawn", rank, out)


def elastic_fn(out: str) -> int:
    import torch.distributed as dist

    rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    dist.destroy_process_group()
    _measure("elastic", rank, out)
    return int(t.item())
