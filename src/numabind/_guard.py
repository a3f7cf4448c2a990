"""The guards: put back CPU masks that a library moved off the process's binding; and the
import hook that arms them.

After a process was bound, ``import torch`` or ``import numpy`` can undo it: libgomp binds
the importing thread to the first OpenMP place when OMP_PROC_BIND/OMP_PLACES are set
(vllm-ascend #11307, pytorch #101850), Intel's runtime does the same with KMP_AFFINITY,
and OpenBLAS pins its threads.  NCCL 2.29.2-2.29.7 left the thread that called
``torch.distributed.init_process_group`` pinned to GPU-local CPUs (nccl#2033).

Each guard compares with the process's *intended binding* (:func:`numabind._apply.
intended_cpus`, handed over when the binder arms the guards: the latest binding numabind
applied, late ones included), read when the guard runs, so it never restores a mask that
a later, legitimate binding replaced.  The import guard costs nothing until the first of
those imports (an import hook on those names only); then it checks every thread once.
The ``init_process_group`` guard checks only the calling thread: threads NCCL pins on
purpose (its proxy threads) are left alone.
``NUMABIND_GUARD=0`` turns both off.

The import hook (:func:`after_import`): a finder at the front of ``sys.meta_path`` answers
only for the watched names, asks the other finders for the real spec and wraps its loader
so that the callback runs after the module has executed.  Every other import passes
through with one dict lookup.  :func:`arm` watches torch, numpy and torch's c10d;
``NUMABIND_TORCH``/``NUMABIND_RAY`` use it to install themselves when the framework is
imported.  Nothing of the guards themselves runs until one of those imports happens.
"""

from __future__ import annotations

import os
import sys

from . import _sysfs
from ._output import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

_said: set[str] = set()


def _cause(what: str) -> str:
    from ._threads import AFFINITY_VARIABLES

    found = [f"{v}={os.environ[v]!r}" for v in AFFINITY_VARIABLES if v in os.environ]
    if found:
        return f"{what} with {', '.join(found)} (the OpenMP runtime binds threads to its places)"
    return f"{what} (its OpenMP or BLAS runtime)"


def _say_once(key: str, message: str) -> None:
    if key in _said:
        return
    _said.add(key)
    say(message)


def _nothing() -> frozenset[int] | None:
    return None


# where the guards read the process's intended binding: handed over by the binder that arms
# them (numabind._apply.intended_cpus), so that this module never imports the binder
_intended: list[Callable[[], frozenset[int] | None]] = [_nothing]


def _expected(expected: frozenset[int] | None) -> frozenset[int] | None:
    if expected is not None:
        return expected
    return _intended[0]()


def _read_intended_from(intended: Callable[[], frozenset[int] | None] | None) -> None:
    if intended is not None:
        _intended[0] = intended


def check(what: str, expected: frozenset[int] | None = None) -> list[tuple[int, frozenset[int]]]:
    """Restore every thread whose mask left the intended CPUs; returns (tid, mask it had).
    Looking costs a listing and a mask per thread; the binder (``_kernel``) is loaded only
    when there is a thread to put back (a warm rank's first ``import numpy`` loads no more)."""
    want = _expected(expected)
    if not want:
        return []
    off: list[tuple[int, frozenset[int]]] = []
    inside: list[tuple[int, frozenset[int]]] = []
    for tid in _sysfs.thread_ids():
        mask = _sysfs.affinity_of(tid)
        if mask is not None and mask <= want:
            inside.append((tid, mask))
        elif mask is not None:
            off.append((tid, mask))
    handback = sys.modules.get("numabind._handback")
    # NUMABIND_PRIORITY=main: what native code started from the pinned thread gets the
    # whole set back
    strays = handback.strays(inside) if handback is not None else []
    if not off and not strays:
        return []
    from . import _kernel

    moved: list[tuple[int, frozenset[int]]] = []
    for tid, mask in off:
        try:
            _kernel.set_thread_affinity(tid, want)
        except OSError:
            continue
        moved.append((tid, mask))
    for tid in strays:
        try:
            _kernel.set_thread_affinity(tid, want)
        except OSError:
            continue
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
    now = _sysfs.affinity_of(0)
    if not want or before is None or now is None or now == before or not before <= want:
        return None
    from . import _kernel

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


def keep_importer(what: str, armed: frozenset[int] | None) -> frozenset[int] | None:
    """NUMABIND_OMP_PLACES: after ``what`` loaded an OpenMP runtime, put the calling thread
    back on the rank's CPUs if the runtime narrowed it to one place (libgomp pins the
    thread that loads it when OMP_PLACES/OMP_PROC_BIND are set).  Returns the mask it had
    been narrowed to, None when it was not."""
    from . import _kernel

    want = _expected(None) or armed
    now = _kernel.affinity_of(0)
    if not want or now is None or not now < want:
        return None
    try:
        _kernel.set_thread_affinity(0, want)
    except OSError:
        return None
    return now


def arm_places(intended: Callable[[], frozenset[int] | None] | None = None) -> None:
    """Watch the imports that load an OpenMP runtime and keep the importing thread on the
    CPUs it has now (or the binding numabind applies later, as ``intended`` reads it): the
    main thread, and what it starts afterwards, keep the rank's CPUs while the OpenMP
    workers hold their places."""
    from ._sysfs import affinity_of
    from ._threads import PLACES_MODULES

    _read_intended_from(intended)
    armed = affinity_of(0)

    def run(module: ModuleType) -> None:
        keep_importer(f"import {module.__name__}", armed)

    for name in PLACES_MODULES:
        after_import(name, run)


def around_init_process_group(
    c10d: Any, name: str, around: Callable[[Callable[[], Any]], Any]
) -> None:
    """Run ``around(call)`` in place of each call of c10d's ``init_process_group`` (``call``
    makes the real one), under ``name`` once however often it is asked.  One wrapper holds
    every numabind hook (the guard, the job report), so there is one patch to undo, one
    marker, and the name ``torch.distributed`` re-exports is patched with it."""
    import functools

    current = getattr(c10d, "init_process_group", None)
    if current is None:
        return
    hooks: dict[str, Callable[[Callable[[], Any]], Any]] | None = getattr(
        current, "_numabind_hooks", None
    )
    if hooks is None:
        original, hooks = current, {}
        chain = hooks

        @functools.wraps(original)
        def init_process_group(*args: Any, **kwargs: Any) -> Any:
            def call() -> Any:
                return original(*args, **kwargs)

            for hook in chain.values():  # the first added runs innermost
                call = functools.partial(hook, call)
            return call()

        init_process_group._numabind_hooks = hooks  # type: ignore[attr-defined]
        c10d.init_process_group = init_process_group
        dist = sys.modules.get("torch.distributed")
        if dist is not None and getattr(dist, "init_process_group", None) is original:
            setattr(dist, "init_process_group", init_process_group)  # noqa: B010
    hooks.setdefault(name, around)


def _guarded(call: Callable[[], Any]) -> Any:
    """The guard around init_process_group: did it narrow the calling thread's CPUs?"""
    from ._sysfs import affinity_of

    before = affinity_of(0)
    try:
        return call()
    finally:
        try:
            check_calling_thread("torch.distributed.init_process_group", before)
        except Exception:
            pass


def guard_c10d(c10d: Any) -> None:
    """After ``torch.distributed.distributed_c10d`` is imported: guard its
    ``init_process_group`` (and the name ``torch.distributed`` re-exports)."""
    around_init_process_group(c10d, "guard", _guarded)


def arm(intended: Callable[[], frozenset[int] | None] | None = None) -> None:
    """Arm the guards for the first import of torch, numpy and torch's c10d; ``intended``
    reads the process's intended CPUs whenever a guard runs (the binder's
    :func:`numabind._apply.intended_cpus`)."""
    _read_intended_from(intended)

    def guard(what: str) -> Callable[[ModuleType], None]:
        def run(module: ModuleType) -> None:
            if what == "c10d":
                guard_c10d(module)
            else:
                check(f"import {what}")

        return run

    for name in ("torch", "numpy"):
        after_import(name, guard(name))
    after_import("torch.distributed.distributed_c10d", guard("c10d"))


# --- the import hook ---------------------------------------------------------------------------


class _Loader:
    def __init__(self, loader: Any, callbacks: list[Callable[[ModuleType], None]]) -> None:
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        # the real loader goes back on the spec, so reloads and introspection see it
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        for cb in self._callbacks:
            try:
                cb(module)
            except Exception as err:  # a callback must never break the user's import
                say(f"after importing {module.__name__}: {type(err).__name__}: {err}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder:
    def __init__(self) -> None:
        self.watch: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._busy: set[str] = set()

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        callbacks = self.watch.get(name)
        if callbacks is None or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        del self.watch[name]  # once
        spec.loader = _Loader(spec.loader, callbacks)  # type: ignore[assignment]
        return spec


_finder: _Finder | None = None


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once ``name`` is imported (now, if it already is)."""
    global _finder
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__spec__", None) is not None:
        try:
            callback(module)
        except Exception as err:
            say(f"after importing {name}: {type(err).__name__}: {err}")
        return
    if _finder is None:
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)
    _finder.watch.setdefault(name, []).append(callback)
