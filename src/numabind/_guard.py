"""The guard: put back CPU masks that a library moved off the plan at import time.

After the startup hook bound a process, ``import torch`` or ``import numpy`` can undo it:
libgomp binds the importing thread to the first OpenMP place when OMP_PROC_BIND/OMP_PLACES
are set (vllm-ascend #11307, pytorch #101850), Intel's runtime does the same with
KMP_AFFINITY, and OpenBLAS pins its threads.  The guard costs nothing until the first of
those imports (an import hook on those two names only); then it checks every thread once,
restores the masks that left the plan and says once what changed them.
``NUMABIND_GUARD=0`` turns it off.
"""

from __future__ import annotations

import os

from . import _kernel, _sysfs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

WATCHED = ("torch", "numpy")
_AFFINITY_VARIABLES = ("OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY", "KMP_AFFINITY")
_said = False


def _cause(what: str) -> str:
    found = [f"{v}={os.environ[v]}" for v in _AFFINITY_VARIABLES if v in os.environ]
    if found:
        return f"{what} with {', '.join(found)} (the OpenMP runtime binds threads to its places)"
    return f"{what} (its OpenMP or BLAS runtime)"


def check(what: str, expected: frozenset[int]) -> list[tuple[int, frozenset[int]]]:
    """Restore every thread whose mask left ``expected``; returns (tid, mask it had)."""
    global _said
    moved: list[tuple[int, frozenset[int]]] = []
    for tid in _kernel.thread_ids():
        mask = _kernel.affinity_of(tid)
        if mask is None or mask <= expected:
            continue
        try:
            _kernel.set_thread_affinity(tid, expected)
        except OSError:
            continue
        moved.append((tid, mask))
    if moved and not _said:
        _said = True
        fmt = _sysfs.format_cpulist
        where = fmt(moved[0][1])
        import sys

        sys.stderr.write(
            f"numabind: {_cause(what)} moved {len(moved)} thread(s) off the planned CPUs "
            f"{fmt(expected)} (to {where}); numabind put them back. NUMABIND_GUARD=0 "
            "disables this check\n"
        )
    return moved


def install(expected: frozenset[int]) -> None:
    """Check the binding after the first import of each watched module."""
    from ._importhook import after_import

    def make(name: str) -> Any:
        return lambda module: check(f"import {name}", expected)

    for name in WATCHED:
        after_import(name, make(name))
