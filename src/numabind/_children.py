"""Children that start bound: :func:`child_binding` and :func:`spawn`.

CPU affinity and memory policy belong to the calling *thread* and are inherited by every
process it starts (fork, multiprocessing spawn, subprocess) and kept across exec.  So a
thread that takes a rank's binding for the moment it starts a child gives that child the
binding from its first instruction: no trampoline script, no numactl, no temp files, and
other threads are unaffected, which makes concurrent starts from several threads safe.

Two traps, both from PyTorch's history (pytorch#166026):

* multiprocessing starts helper processes lazily at the first ``start()``: the resource
  tracker (spawn, forkserver) and the fork server itself.  Started inside a rank's binding
  they would keep it for good, and so would every child of the fork server.  They are
  started first, unbound.
* a fork server's children fork from the server, not from the calling thread, so nothing
  is inherited.  For ``forkserver`` the child binds itself on entry and migrates the pages
  its start-up placed (said once).
"""

from __future__ import annotations

import contextlib
import errno
import multiprocessing
import os
import threading

from ._output import say
from ._plan import Plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from multiprocessing.context import BaseContext
    from typing import Any

    from ._topology import Machine

_lock = threading.Lock()
_machine: Machine | None = None
_plans: dict[tuple[Any, ...], Plan] = {}


def _machine_once() -> Machine:
    global _machine
    with _lock:
        if _machine is None:
            from ._topology import Machine

            _machine = Machine.here()
        return _machine


def plan_for_child(
    local_rank: int,
    *,
    mode: str | None = None,
    memory: str | None = None,
    device: int | str | None = None,
    local_world_size: int | None = None,
) -> Plan:
    """The plan of local rank ``local_rank`` as this process's environment describes the
    machine (visible devices, mode), cached: a launcher asks for the same ranks repeatedly."""
    from ._api import plan_for

    key = (local_rank, mode, memory, device, local_world_size)
    with _lock:
        cached = _plans.get(key)
    if cached is not None:
        return cached
    p = plan_for(
        local_rank,
        mode=mode,
        memory=memory,
        device=device,
        local_world_size=local_world_size,
        machine=_machine_once(),
    )
    with _lock:
        _plans[key] = p
    return p


def start_method_of(context: BaseContext | None) -> str:
    if context is not None:
        return str(context.get_start_method())
    return (
        multiprocessing.get_start_method(allow_none=True)
        or multiprocessing.get_context().get_start_method()
    )


def start_helpers_unbound(method: str) -> None:
    """Start multiprocessing's lazy helpers now, from an unbound thread."""
    if method in ("spawn", "forkserver"):
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
    if method == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


_said: set[str] = set()


def _say_once(key: str, message: str) -> None:
    if key not in _said:
        _said.add(key)
        say(message)


def say_forkserver_once() -> None:
    _say_once(
        "forkserver",
        "the forkserver start method forks children from its server, so they cannot "
        "inherit a binding: each child binds itself on entry and migrates its pages",
    )


# set by the starters whose children enter through numabind (spawn, numabind.torch's
# start_processes): those children bind their memory themselves and say a failure in
# their own line, so the parent does not say it a second time
_ENTERING = threading.local()


@contextlib.contextmanager
def children_say_it() -> Iterator[None]:
    """Inside: the children started enter through numabind and report for themselves."""
    _ENTERING.on = True
    try:
        yield
    finally:
        _ENTERING.on = False


@contextlib.contextmanager
def child_binding(
    local_rank: int,
    *,
    mode: str | None = None,
    memory: str | None = None,
    device: int | str | None = None,
    local_world_size: int | None = None,
    context: BaseContext | None = None,
    plan: Plan | None = None,
) -> Iterator[Plan]:
    """Give the calling thread rank ``local_rank``'s binding while the block runs.

    Any process started inside the block (``Process.start()``, ``subprocess``, ``os.fork``)
    starts with that rank's CPUs and memory policy.  On exit the thread's own affinity and
    policy are restored.  Only the calling thread changes, so threads starting different
    ranks at the same time do not disturb each other.  ``mode``, ``memory``, ``device`` and
    ``local_world_size`` are as in :func:`numabind.plan_for`; ``context`` is the
    multiprocessing context the children start from (its helpers are started unbound
    first; a ``forkserver`` context binds in the child instead).  ``plan`` overrides the
    planning (for tests and for callers that planned themselves).  Yields the plan; a plan
    that skips changes nothing (its reason says why).
    """
    method = start_method_of(context)
    start_helpers_unbound(method)
    if method == "forkserver":
        say_forkserver_once()
    p = plan or plan_for_child(
        local_rank, mode=mode, memory=memory, device=device, local_world_size=local_world_size
    )
    if not p.bound or method == "forkserver":
        yield p
        return
    from ._pin import ThreadPin

    with ThreadPin(p.placement) as pin:
        if pin.cpu_error is not None:
            raise pin.cpu_error
        for err in pin.errors:
            # EPERM (a seccomp filter): the child still starts on its CPUs and binds its
            # memory itself on entry, where the refusal is said once.  Anything else
            # (EINVAL: a node outside the cgroup's cpuset.mems) is said here, once per
            # kind, and the child starts with its CPUs bound, as the hook would do
            if err.errno == errno.EPERM or getattr(_ENTERING, "on", False):
                continue
            _say_once(
                f"policy-{err.errno}",
                f"local rank {local_rank}: {err}; CPUs bound, memory policy left as it is",
            )
        yield p


# --- spawn without torch -----------------------------------------------------------------------


def child_entry(
    fn: Callable[..., Any],
    local_rank: int,
    args: tuple[Any, ...],
    local_world_size: int | None,
    method: str,
    mode: str | None,
    memory: str | None,
) -> Any:
    """First code numabind runs in a child it started: record the rank (for libraries and
    ``numabind check``), confirm the inherited binding or, under forkserver, bind now and
    move the pages start-up placed; then run the user's function."""
    os.environ["LOCAL_RANK"] = str(local_rank)
    if local_world_size is not None:
        os.environ["LOCAL_WORLD_SIZE"] = str(local_world_size)
    from ._api import bind

    bind(
        local_rank,
        mode=mode,
        memory=memory,
        migrate=method == "forkserver",
        local_world_size=local_world_size,
        strict=False,
    )
    return fn(local_rank, *args)


def spawn(
    fn: Callable[..., Any],
    nprocs: int,
    args: tuple[Any, ...] = (),
    *,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
    mode: str | None = None,
    memory: str | None = None,
) -> list[multiprocessing.process.BaseProcess]:
    r"""Start ``fn``\ (i, \*\ ``args``) in ``nprocs`` processes, process ``i`` bound as
    local rank ``i`` from its first instruction (``torch.multiprocessing.spawn`` without
    torch).

    ``start_method`` is the multiprocessing start method (``spawn`` by default), ``daemon``
    as for ``Process``; ``mode`` and ``memory`` as in :func:`numabind.apply`.  With
    ``join`` (default) waits for all and raises ``ChildProcessError`` naming those that
    failed; otherwise returns the started processes.
    """
    if isinstance(nprocs, bool) or not isinstance(nprocs, int):
        raise TypeError(f"nprocs must be an int, not {type(nprocs).__name__}")
    if not 1 <= nprocs <= 4096:
        raise ValueError(f"nprocs must be in 1..4096, not {nprocs}")
    ctx: Any = multiprocessing.get_context(start_method)
    method = ctx.get_start_method()
    procs = []
    for i in range(nprocs):
        p = ctx.Process(
            target=child_entry,
            args=(fn, i, tuple(args), nprocs, method, mode, memory),
            daemon=daemon,
            name=f"numabind-rank-{i}",
        )
        with (
            children_say_it(),
            child_binding(i, mode=mode, memory=memory, local_world_size=nprocs, context=ctx),
        ):
            p.start()
        procs.append(p)
    if not join:
        return procs
    for p in procs:
        p.join()
    failed = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode != 0]
    if failed:
        what = ", ".join(f"rank {i} (exit {code})" for i, code in failed)
        raise ChildProcessError(f"numabind.spawn: {what} failed")
    return procs
