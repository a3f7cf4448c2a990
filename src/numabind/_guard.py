"""The guards: put back CPU masks that a library moved off the process's binding.

After a process was bound, ``import torch`` or ``import numpy`` can undo it: libgomp binds
the importing thread to the first OpenMP place when OMP_PROC_BIND/OMP_PLACES are set
(vllm-ascend #11307, pytorch #101850), Intel's runtime does the same with KMP_AFFINITY,
and OpenBLAS pins its threads.  NCCL 2.29.2-2.29.7 left the thread that called
``torch.distributed.init_process_group`` pinned to GPU-local CPUs (nccl#2033).

Each guard compares with the process's *intended binding* (:func:`numabind._bind.
intended_cpus`: the latest binding numabind applied, late ones included), read when the
guard runs, so it never restores a mask that a later, legitimate binding replaced.  The
import guard costs nothing until the first of those imports (an import hook on those names
only); then it checks every thread once.  The ``init_process_group`` guard checks only
the calling thread: threads NCCL pins on purpose (its proxy threads) are left alone.
``NUMABIND_GUARD=0`` turns both off.
"""

from __future__ import annotations

import os

from . import _kernel, _sysfs
from ._output import say
from ._threads import AFFINITY_VARIABLES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_said: set[str] = set()


def _cause(what: str) -> str:
    found = [f"{v}={os.environ[v]!r}" for v in AFFINITY_VARIABLES if v in os.environ]
    if found:
        return f"{what} with {', '.join(found)} (the OpenMP runtime binds threads to its places)"
    return f"{what} (its OpenMP or BLAS runtime)"


def _say_once(key: str, message: str) -> None:
    if key in _said:
        return
    _said.add(key)
    say(message)


def _expected(expected: frozenset[int] | None) -> frozenset[int] | None:
    if expected is not None:
        return expected
    from ._bind import intended_cpus

    return intended_cpus()


def check(what: str, expected: frozenset[int] | None = None) -> list[tuple[int, frozenset[int]]]:
    """Restore every thread whose mask left the intended CPUs; returns (tid, mask it had)."""
    want = _expected(expected)
    if not want:
        return []
    moved: list[tuple[int, frozenset[int]]] = []
    for tid in _kernel.thread_ids():
        mask = _kernel.affinity_of(tid)
        if mask is None or mask <= want:
            continue
        try:
            _kernel.set_thread_affinity(tid, want)
        except OSError:
            continue
        moved.append((tid, mask))
    if moved:
        fmt = _sysfs.format_cpulist
        _say_once(
            "import",
            f"{_cause(what)} moved {len(moved)} thread(s) off the planned CPUs {fmt(want)} "
            f"(to {fmt(moved[0][1])}); numabind put them back. NUMABIND_GUARD=0 disables this "
            "check",
        )
    return moved


def check_calling_thread(what: str, before: frozenset[int] | None) -> frozenset[int] | None:
    """After ``what`` ran on this thread: if the thread was on the intended binding before
    and its mask changed, put the mask back.  Returns the mask it had been moved to."""
    want = _expected(None)
    now = _kernel.affinity_of(0)
    if not want or before is None or now is None or now == before or not before <= want:
        return None
    try:
        _kernel.set_thread_affinity(0, before)
    except OSError:
        return None
    fmt = _sysfs.format_cpulist
    _say_once(
        "init_process_group",
        f"{what} moved the calling thread to CPUs {fmt(now)} (NCCL 2.29.2-2.29.7 does this, "
        f"nccl#2033); numabind put it back on {fmt(before)}. NUMABIND_GUARD=0 disables this "
        "check",
    )
    return now


def wrap_init_process_group(dist: Any) -> None:
    """Guard ``torch.distributed.init_process_group`` (idempotent)."""
    original = getattr(dist, "init_process_group", None)
    if original is None or getattr(original, "_numabind_guard", False):
        return
    import functools

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        before = _kernel.affinity_of(0)
        try:
            return original(*args, **kwargs)
        finally:
            try:
                check_calling_thread("torch.distributed.init_process_group", before)
            except Exception:
                pass

    init_process_group._numabind_guard = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def guard_c10d(c10d: Any) -> None:
    """After ``torch.distributed.distributed_c10d`` is imported: guard its
    ``init_process_group`` and the name ``torch.distributed`` re-exports."""
    wrap_init_process_group(c10d)
    import sys

    dist = sys.modules.get("torch.distributed")
    current = getattr(dist, "init_process_group", None)
    # torch.distributed re-exports the function: patch the name users call
    if current is not None and not getattr(current, "_numabind_guard", False):
        setattr(dist, "init_process_group", c10d.init_process_group)  # noqa: B010
