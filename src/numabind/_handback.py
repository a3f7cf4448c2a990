"""NUMABIND_PRIORITY=main: one thread on a priority core, and everything it starts on the
rank's whole set.

The kernel hands a thread's CPU mask to every thread and process it creates.  Pin the
thread that launches GPU work to one core and, left alone, the OpenMP pool, the DataLoader
workers and every helper it starts afterwards all crowd onto that core.  So while a thread
is pinned here (:func:`pin`), whatever it starts takes the rank's whole compute set back:

* threads started from Python (``threading``, ``_thread``): the new thread sets its own mask
  first thing, before its target runs (``_thread``'s start functions are wrapped, and the
  names ``threading`` bound from them when it was imported already);
* processes forked from Python (``os.fork``, multiprocessing's fork start method): an
  at-fork handler in the child;
* Python processes started any other way (``subprocess``, multiprocessing's spawn): the
  startup hook of the child, which inherits :data:`VARIABLE` and finds its mask equal to
  the pinned core;
* threads a native library creates (OpenMP, BLAS, NCCL): the guards give them the whole
  set back when they check (after ``import torch``/``numpy`` and ``init_process_group``:
  :func:`strays`).  A native thread created after those checks, or a non-Python program
  the rank executes, keeps the core: that is the kernel's rule and numabind cannot
  intercept ``pthread_create``; ``NUMABIND_PRIORITY=rank`` has no such gap.

A thread or child that was not started by the pinned thread has another mask, and is never
touched.  Only ``os``, ``_thread`` and ``sys`` are imported: this runs in the startup hook.
"""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

# set by numabind for a rank whose thread is pinned: "<pid>;<pinned CPUs>;<whole set>" (CPU
# lists), read by the startup hook of a child that inherited the pinned mask, and by the
# program ``numabind run`` executes in the same process (which keeps the pin)
VARIABLE = "NUMABIND_MAIN_CPUS"

# the pinned thread's id, its CPUs and the rank's whole compute set; empty: nothing pinned
_state: dict[str, Any] = {}
_installed: list[bool] = []


def pin(tid: int, main: frozenset[int], whole: frozenset[int]) -> None:
    """Record that thread ``tid`` runs on ``main`` within ``whole``, and make what it starts
    from now on take ``whole`` (the hooks are installed once per process)."""
    _state.update(tid=tid, main=frozenset(main), whole=frozenset(whole))
    os.environ[VARIABLE] = f"{os.getpid()};{_cpulist(main)};{_cpulist(whole)}"
    if not _installed:
        _installed.append(True)
        _install()


def release() -> None:
    """Nothing is pinned any more (the binding was restored)."""
    _state.clear()
    os.environ.pop(VARIABLE, None)


def pinned() -> tuple[int, frozenset[int], frozenset[int]] | None:
    """(thread id, its CPUs, the whole set) while a thread is pinned, else None."""
    if not _state:
        return None
    return _state["tid"], _state["main"], _state["whole"]


def give_back() -> bool:
    """In a thread or child just started: take the whole set if it inherited the pinned
    core from the pinned thread.  Returns whether it did.  Never raises."""
    try:
        found = pinned()
        if found is None:
            return False
        tid, main, whole = found
        if _thread.get_native_id() == tid or frozenset(os.sched_getaffinity(0)) != main:
            return False
        os.sched_setaffinity(0, whole)
        return True
    except Exception:
        return False


def strays(masks: Iterable[tuple[int, frozenset[int]]]) -> list[int]:
    """The threads (of ``masks``: thread id, mask) other than the pinned one that hold the
    pinned core's mask: what a native library started from the pinned thread."""
    found = pinned()
    if found is None:
        return []
    tid, main, _ = found
    return [t for t, mask in masks if t != tid and mask == main]


def inherited(value: str | None) -> bool:
    """The startup hook of a process that inherited ``NUMABIND_MAIN_CPUS`` (``value``) and
    runs on the pinned core: a child the pinned thread started takes the whole set; the
    pinned process itself (the program ``numabind run`` executed) keeps its pin, and what
    it starts takes the whole set, as before the exec.  Returns whether anything was done;
    never raises."""
    if not value or len(value) > 1 << 16:
        return False
    try:
        pid_text, main_text, whole_text = [*value.split(";"), "", ""][:3]
        main, whole = _parse(main_text), _parse(whole_text)
        if not main or not whole or not main <= whole or not pid_text.isdigit():
            return False
        if frozenset(os.sched_getaffinity(0)) != main:
            return False
        if int(pid_text) == os.getpid():
            pin(_thread.get_native_id(), main, whole)
            return True
        os.sched_setaffinity(0, whole)
        os.environ.pop(VARIABLE, None)  # this process's own threads are not pinned
        return True
    except Exception:
        return False


# --- the hooks ---------------------------------------------------------------------------------


def _after_fork_in_child() -> None:
    # the forking thread is the child's only thread; the child itself pins nothing
    if give_back():
        release()
    else:
        _state.clear()


def _wrap(start: Callable[..., Any]) -> Callable[..., Any]:
    def start_thread(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            give_back()
            return function(*a, **k)

        return start(run, *args, **kwargs)

    start_thread._numabind_handback = True  # type: ignore[attr-defined]
    return start_thread


def _install() -> None:
    os.register_at_fork(after_in_child=_after_fork_in_child)
    threading = sys.modules.get("threading")
    for name, alias in (
        ("start_new_thread", "_start_new_thread"),
        ("start_joinable_thread", "_start_joinable_thread"),  # Python 3.13+
    ):
        real = getattr(_thread, name, None)
        if real is None or getattr(real, "_numabind_handback", False):
            continue
        wrapped = _wrap(real)
        setattr(_thread, name, wrapped)
        if threading is not None and getattr(threading, alias, None) is real:
            setattr(threading, alias, wrapped)


# --- CPU lists, without importing numabind's own parser (the startup hook runs this) ------------


def _cpulist(cpus: Iterable[int]) -> str:
    out: list[str] = []
    run: list[int] = []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _parse(text: str) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(",")[:8192]:
        lo, sep, hi = part.partition("-")
        if not (lo.isascii() and lo.isdigit() and len(lo) < 6):
            return frozenset()
        if sep:
            if not (hi.isascii() and hi.isdigit() and len(hi) < 6) or int(hi) < int(lo):
                return frozenset()
            if int(hi) - int(lo) > 8192:
                return frozenset()
            out.update(range(int(lo), int(hi) + 1))
        else:
            out.add(int(lo))
    return frozenset(out)
