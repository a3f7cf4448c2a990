"""Applying a :class:`~numabind._plan.Plan` to the running process: the one protocol every
entry point calls (:func:`enter`), what a binding did (:class:`Binding`), the rule for a
CPU mask already in place, and the kernel calls.

**The protocol.**  The startup hook, :func:`numabind.apply`, ``@numa_bound``, children
started by numabind or ``numabind.torch``, device selection, ``numabind run`` and the Ray
integration all plan, then call :func:`enter`, which runs the same steps:

1. **threads**: size the thread pools to the rank's budget (``NUMABIND_THREADS``):
   variables before any runtime loads (the hook, ``run``), pools already loaded when
   binding late;
2. **bind**: judge the CPU mask already in place and apply the plan under the
   process-wide lock; in strict mode a failure restores and raises;
3. **record**: register the process for ``numabind check --all`` (:mod:`numabind._registry`,
   with the thread settings it was given) and keep the result as the process's *intended
   binding*, which the guards read;
4. **report**: one line when the rule says so (:meth:`Binding.report`);
5. **guard**: a binding that took arms the guards (:func:`numabind._guard.arm`), whoever
   entered.

A plan that skips (one NUMA node, a launcher's own process, a bad variable) stops after
step 1's check: no kernel layer, no ctypes, no registry is loaded for it.

Bindings nest like ``with`` blocks: one process-wide lock serialises every apply and
restore, and a restore out of order raises :class:`~numabind.BindingError` instead of
putting back a state that a later binding replaced; restoring puts the registry back to
the binding now on top (or removes the entry).

**The rule.**  Launchers bind by default and know nothing of GPUs: Open MPI pins each rank
to a core (round-robin by socket beyond two ranks, so alternate ranks sit on the wrong
socket), Slurm's task/affinity pins tasks to cores, and a torchrun agent pinned by ``srun
-n1`` passes its pin to every worker.  Keeping such a binding is the bug numabind exists to
fix.  A user's ``numactl``/``taskset`` wrapper, ``mpirun --bind-to``, Slurm's explicit
``--cpu-bind`` or DeepSpeed's ``--bind_cores_to_rank`` are deliberate choices
(docs/how-it-works.rst has the rule as a table):

==========================================  =====================  ==================
current CPU mask                            NUMABIND=auto          respect / force
==========================================  =====================  ==================
not narrower than the cgroup allows         apply the plan         apply / apply
narrower, same as the parent's (inherited)  apply, say so          keep / apply
narrower, set by a launcher by default      apply, say so          keep / apply
narrower, deliberate, inside GPU's node     keep CPUs; memory      keep / apply
                                            policy only if none
narrower, deliberate, outside GPU's node    apply, say so          keep / apply
==========================================  =====================  ==================

``force`` applies the plan exactly, even to a mask that already lies inside it.

**The calls.**  What "the process" means differs per resource, and the difference is the
whole story of late binding:

* CPU affinity is per thread.  Every thread in /proc/self/task whose mask is not already
  inside the plan is rebound; a thread created afterwards inherits its creator's mask.
* Memory policy is per thread and can only be set by the thread itself: the calling thread
  gets it (and every thread and child it starts later).  Threads that already exist keep
  their own policy; their future allocations are the one gap late binding cannot close.
* Pages already placed stay where they are unless moved: with ``migrate`` the private
  anonymous pages off the plan's nodes are moved (:func:`numabind._range.migrate_private`)
  and what could not move is counted by reason.
"""

from __future__ import annotations

import _thread
import errno
import os
import sys

from . import _sysfs
from ._model import POLICIES, Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType
    from typing import Literal

    from ._environ import Config
    from ._plan import Plan
    from ._registry import Entry
    from ._threads import Places, ThreadSettings
    from ._topology import Machine
    from ._transports import NicEnv

    ExistingAction = Literal["kept", "replaced"]
    Origin = Literal["none", "launcher", "inherited", "deliberate"]
    Action = Literal["apply", "keep"]

fmt = _sysfs.format_cpulist

LOCK = _thread.RLock()
ACTIVE: list[Binding] = []  # applied and not restored, oldest first
# listings of /proc/self/task one apply makes to catch the threads started during its pass
# (each pass visits only threads not seen; one started by a rebound thread is already right)
THREAD_PASSES = 8


# --- what a binding did ------------------------------------------------------------------------


class Binding:
    """What was applied to this process, what was skipped and why; restorable.

    ``str(binding)`` is one readable line.  ``restore()`` (or leaving the ``with`` block)
    puts back the CPU masks and the calling thread's memory policy seen before; pages that
    were migrated stay where they went.
    """

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.cpus_applied = False
        self.threads_rebound = 0
        self.threads_kept = 0
        self.policy_applied: str | None = None
        self.policy_nodes: frozenset[int] = frozenset()
        self.pages_moved = 0
        self.pages_failed = 0
        self.not_moved: dict[str, int] = {}  # why -> pages (move_pages' answers)
        self.errors: list[str] = []
        self.refused: list[str] = []  # system calls refused with EPERM (seccomp, no caps)
        self.notes: list[str] = []
        self.warnings: list[str] = []  # notes the rules promise to say, verbose or not
        self.existing: str | None = None  # what happened to a CPU binding found in place
        self.existing_action: ExistingAction | None = None
        # the mask found in place (narrower than the cgroup's, not the plan) and what the
        # keep/replace rule did with it, for the registry entry ("": none found)
        self.start_mask: frozenset[int] = frozenset()
        self.start_action = ""
        self.registered: str | None = None
        self.kept_cpus: frozenset[int] | None = None
        self.thread_env: tuple[tuple[str, str], ...] = ()  # thread variables it was given
        self.nic_env: tuple[tuple[str, str], ...] = ()  # NIC variables it set (NUMABIND_NIC)
        self._previous_affinity: dict[int, frozenset[int]] = {}
        # threads inside a bind_thread block when this binding was applied: the block,
        # the thread, and what its end would have put back before this binding rebased it
        self._rebased: list[tuple[ThreadBinding, int, frozenset[int] | None]] = []
        # every thread's mask as this binding left it (a later apply() tells what changed)
        self.masks: dict[int, frozenset[int]] = {}
        self._previous_policy: tuple[int, frozenset[int]] | None = None  # mode with flags
        self._restored = False
        # NUMABIND_PRIORITY=main: the thread put on a priority core (None: none was)
        self.main_thread: int | None = None
        # where the plan's machine came from (numabind._cache: "sysfs", "cache", ...)
        self.machine = ""

    @property
    def ok(self) -> bool:
        """The plan was bound and no kernel call failed."""
        return self.plan.bound and not self.errors

    @property
    def failed(self) -> bool:
        """A call failed, or the plan skipped because of bad input or a forbidding machine
        (a benign skip, such as a one-node machine, is not a failure).  Memory-policy calls
        refused by a seccomp filter are not a failure: the CPUs are bound and pages first
        touched on them are local (the refusal is said once, see ``worth_a_line``)."""
        return bool(self.errors) or (not self.plan.bound and self.plan.problem is not None)

    def worth_a_line(self, verbose: bool) -> bool:
        """Whether an entry point should print this binding: always for a failure, a
        replaced CPU mask, a refused call, a warning or something asked for that the plan
        could not do (the rules promise one line saying so), else only when ``verbose``."""
        return (
            self.failed
            or self.existing_action == "replaced"
            or bool(self.refused)
            or bool(self.warnings)
            or bool(self.plan.unmet)  # something asked for was not done: always said
            or verbose
        )

    @property
    def cpus(self) -> frozenset[int]:
        """The CPUs this process is meant to run on: the plan's, or the mask kept."""
        if self.existing_action == "kept" and self.kept_cpus:
            return self.kept_cpus
        return self.plan.cpus

    def __str__(self) -> str:
        p = self.plan
        if not p.bound:
            return " ".join([p.summary(), *(f"[{n}]" for n in (*self.notes, *self.warnings))])
        parts = [p.who() + ":"]
        if self.cpus_applied:
            threads = "thread" if self.threads_rebound == 1 else "threads"
            parts.append(
                f"CPUs {fmt(p.cpus)} ({self.threads_rebound} {threads} rebound, "
                f"{self.threads_kept} kept)"
            )
        if self.policy_applied:
            nodes = f" {fmt(self.policy_nodes)}" if self.policy_nodes else ""
            parts.append(f"memory {self.policy_applied}{nodes}")
        if self.pages_moved or self.pages_failed:
            parts.append(f"{self.pages_moved} pages moved, {self.pages_failed} not")
        parts.append(f"({p.reason})")
        if self.existing:
            parts.append(f"[{self.existing}]")
        for e in self.errors:
            parts.append(f"[error: {e}]")
        for n in (*p.notes, *self.notes, *self.warnings):
            parts.append(f"[{n}]")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"<Binding {self}>"

    def report(self, verbose: bool, prefix: str = "") -> None:
        """The rule for printing a binding, at every entry point: a failure, a replaced
        CPU mask or a refused call always get their line; anything else only when
        ``verbose``.  ``prefix`` goes before the line (such as
        ``"torch.cuda.set_device(1): "``)."""
        if self.worth_a_line(verbose):
            from ._output import say

            say(prefix + str(self))

    def to_dict(self) -> dict[str, object]:
        """The binding as JSON-ready data (what ``numabind show`` reports of the hook)."""
        return {
            "plan": self.plan.to_dict(),
            "cpus_applied": self.cpus_applied,
            "threads_rebound": self.threads_rebound,
            "policy": self.policy_applied,
            "policy_nodes": sorted(self.policy_nodes),
            "pages_moved": self.pages_moved,
            "pages_failed": self.pages_failed,
            "not_moved": dict(self.not_moved),
            "errors": list(self.errors),
            "refused": list(self.refused),
            "existing": self.existing,
            "existing_action": self.existing_action,
            "registered": self.registered,
        }

    def entry(self) -> Entry:
        """The registry entry of this binding: the plan as applied (what ``numabind
        check`` compares against), with the thread settings it was given."""
        from ._kernel import start_time
        from ._model import NOT_PERMITTED
        from ._registry import Entry, listed_buffers

        p = self.plan
        pid = os.getpid()
        refused_policy = "set_mempolicy" in self.refused or "get_mempolicy" in self.refused
        policy = self.policy_applied or (NOT_PERMITTED if refused_policy else p.memory_policy)
        nodes = (
            frozenset()
            if self.refused and not self.policy_applied
            else (self.policy_nodes or p.memory_nodes)
        )
        # a spill mask applied: the nodes beyond the plan's own are where memory may spill
        spill = nodes - p.memory_nodes if p.memory_mask and nodes == p.memory_mask else frozenset()
        device_plans, thread_devices = _thread_entries(p)
        return Entry(
            buffers=listed_buffers(),
            device_plans=device_plans,
            thread_devices=thread_devices,
            pid=pid,
            start=start_time(pid) or "0",
            local_rank=p.local_rank,
            rank_source=p.rank_source or "",
            local_world_size=p.local_world_size,
            device=p.device.pci if p.device else "",
            device_index=p.device_index,
            numa_node=p.numa_node,
            cpus=self.cpus,
            memory_policy=policy,
            memory_nodes=nodes,
            mode=p.mode,
            reason=p.reason,
            threads=p.threads,
            thread_env=self.thread_env,
            helpers=p.helpers,
            priority_cpus=p.priority_cpus,
            main_thread=self.main_thread,
            main_cpus=p.main_cpus if self.main_thread is not None else frozenset(),
            machine=self.machine,
            spill=spill,
            nics=p.nics,
            nic_env=self.nic_env,
            start_mask=self.start_mask,
            start_action=self.start_action,
        )

    @property
    def active(self) -> bool:
        """Applied and not restored yet (the guards and the registry follow it)."""
        return self in ACTIVE

    def changes(self) -> str | None:
        """What moved since this binding: each thread whose mask is no longer what it left
        (another binder, a library's own pinning), named with who did it where the
        thread's name tells; None when nothing moved."""
        from . import _kernel
        from ._binders import binder_of

        moved = []
        pid = os.getpid()
        own = {tid: stack[-1].plan.cpus for tid, stack in THREADS.items() if stack}
        for tid in _kernel.thread_ids():
            now, was = _kernel.affinity_of(tid), self.masks.get(tid)
            if now is None or now == was or (was is None and now <= self.cpus):
                continue  # as it was left, or started since inside the binding
            if now == own.get(tid):
                continue  # numabind.bind_thread's own
            name = _kernel.thread_name(pid, tid)
            who = binder_of(name)
            moved.append(
                f"thread {tid} {name!r} "
                + (f"{fmt(was)} -> {fmt(now)}" if was is not None else f"on {fmt(now)}")
                + (f" ({who}?)" if who else "")
            )
        if not moved:
            return None
        more = f"; and {len(moved) - 4} more" if len(moved) > 4 else ""
        return (
            "since numabind bound this process another binder moved "
            + "; ".join(moved[:4])
            + more
            + ": bound again"
        )

    def policy_holds(self) -> bool:
        """Whether the calling thread still has the memory policy this binding set (it was
        set for the thread that applied it, and what that thread started)."""
        if not self.policy_applied:
            return True
        from . import _kernel

        try:
            return _kernel.get_mempolicy() == (self.policy_applied, self.policy_nodes)
        except OSError:
            return False

    def restore(self) -> None:
        """Put back the CPU masks and the calling thread's memory policy seen before.

        Bindings nest: restoring one while a later binding of this process is still
        active raises :class:`~numabind.BindingError` (restore the later one first)."""
        with LOCK:
            if self._restored:
                return
            if self in ACTIVE and ACTIVE[-1] is not self:
                from ._errors import BindingError

                later = ACTIVE[-1]
                raise BindingError(
                    f"restore() out of order: a later binding ({later.plan.summary()}) is "
                    "still active; restore it first (bindings nest like with-blocks)"
                )
            self._restored = True
            if self in ACTIVE:
                ACTIVE.remove(self)
            if self._previous_affinity or self._rebased or self._previous_policy is not None:
                self._put_back()
            if self.registered:
                self._register_top()

    def _put_back(self) -> None:
        from . import _kernel

        if self.main_thread is not None:
            from . import _handback

            _handback.release()

        for tid, cpus in self._previous_affinity.items():
            try:
                _kernel.set_thread_affinity(tid, cpus)
            except OSError:
                pass  # the thread has exited
        for block, tid, before in self._rebased:
            with LOCK:
                inside = block in THREADS.get(tid, [])
            if inside:
                block.pin.rebase(before)  # its end puts back what it would have
            elif before is not None:
                try:  # the block ended on this binding's CPUs: back to what it had
                    _kernel.set_thread_affinity(tid, before)
                except OSError:
                    pass
        if self._previous_policy is not None:
            mode, nodes = self._previous_policy
            try:
                _kernel.set_mempolicy_mode(mode, nodes)
            except OSError as err:
                self.errors.append(str(err))

    @staticmethod
    def _register_top() -> None:
        """After a restore the registry describes the binding now on top, or nothing."""
        from . import _registry

        top = next((x for x in reversed(ACTIVE) if x.registered), None)
        if top is None:
            _registry.unregister()
        else:
            _registry.register(top.entry())

    def __enter__(self) -> Binding:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


def bound_plan(process: bool = False) -> Plan | None:
    """The plan the calling thread runs under: its own :func:`numabind.bind_thread` block,
    else this process's latest active binding that binds; None when numabind has bound
    neither (host buffers and DataLoader workers take their node and device here).
    ``process`` asks for the process's binding alone."""
    with LOCK:
        if not process:
            mine = THREADS.get(_tid())
            if mine:
                return mine[-1].plan
        for b in reversed(ACTIVE):
            if b.plan.bound:
                return b.plan
    return None


# --- one thread's binding ----------------------------------------------------------------------

THREADS: dict[int, list[ThreadBinding]] = {}  # thread id -> its active blocks, innermost last


def _tid() -> int:
    return _thread.get_native_id()


class ThreadBinding:
    """The calling thread bound to one device's plan (:func:`numabind.bind_thread`): its
    CPUs and memory policy, inherited by the threads and processes it starts, put back by
    :meth:`restore` or at the end of a ``with`` block.  ``str()`` is one line; ``ok`` is
    False when the kernel refused part of it (``pin`` says what)."""

    def __init__(self, plan: Plan) -> None:
        from ._pin import ThreadPin

        self.plan = plan
        self.pin = ThreadPin(plan.placement)
        self.tid: int | None = None

    @property
    def ok(self) -> bool:
        """The plan binds and the kernel accepted all of it."""
        return self.plan.bound and self.pin.ok

    def apply(self) -> ThreadBinding:
        """Bind the calling thread (once) and list it in the registry entry."""
        if self.tid is not None or not self.plan.bound:
            return self
        self.pin.apply()
        self.tid = _tid()
        with LOCK:
            THREADS.setdefault(_tid(), []).append(self)
        reregister()
        return self

    def restore(self) -> None:
        """Put back the thread's CPUs and memory policy; blocks nest, innermost first."""
        with LOCK:
            mine = THREADS.get(_tid(), [])
            if self not in mine:
                return
            if mine[-1] is not self:
                from ._errors import BindingError

                raise BindingError(
                    "restore() out of order: a later bind_thread block of this thread is "
                    "still active; restore it first"
                )
            self.pin.undo()
            mine.pop()
            if not mine:
                THREADS.pop(_tid(), None)
        reregister()

    def __str__(self) -> str:
        p = self.plan
        if not p.bound:
            return f"this thread: not bound: {p.reason}"
        parts = [f"this thread: {p.placement.describe()} ({p.reason})"]
        if self.pin.cpu_error is not None:
            parts.append(f"[error: {self.pin.cpu_error}]")
        parts += [f"[{err}]" for err in self.pin.errors]
        parts += [f"[{n}]" for n in (*p.notes, *self.pin.notes)]
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"<ThreadBinding {self}>"

    def __enter__(self) -> ThreadBinding:
        return self.apply()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


def reregister() -> None:
    """Write this process's registry entry again (its threads or host buffers changed),
    when a binding of it is registered."""
    with LOCK:  # the entry is read and written under the lock: the last writer is current
        top = next((b for b in reversed(ACTIVE) if b.registered), None)
        if top is not None:
            from . import _registry

            _registry.register(top.entry())


def _thread_entries(
    plan: Plan,
) -> tuple[
    tuple[tuple[str, frozenset[int], str, frozenset[int]], ...], tuple[tuple[int, int], ...]
]:
    """The registry's ``device_plans`` (each device of a multi-device plan, and each device
    a bind_thread block uses) and ``thread_devices`` (the threads in such a block)."""
    plans = [q for q in plan.per_device if q.bound and q.device is not None]
    pairs: list[tuple[int, int]] = []
    with LOCK:
        blocks = [(tid, stack[-1].plan) for tid, stack in THREADS.items() if stack]
    for tid, p in blocks:
        if p.device is None:
            continue
        same = [i for i, q in enumerate(plans) if q.device == p.device and q.cpus == p.cpus]
        if not p.bound:
            continue
        if not same:
            plans.append(p)
            same = [len(plans) - 1]
        pairs.append((tid, same[0]))
    device_plans = tuple(
        (q.device.pci, q.cpus, q.memory_policy, q.memory_nodes)
        for q in plans
        if q.device is not None
    )
    return device_plans, tuple(pairs)


def intended_cpus() -> frozenset[int] | None:
    """The CPUs this process is meant to run on: those of its latest active binding
    (a kept mask counts as intended), None when numabind has not bound it."""
    with LOCK:
        for b in reversed(ACTIVE):
            if b.cpus_applied or b.existing_action == "kept":
                return b.cpus
    return None


def enter(
    plan: Plan,
    machine: Machine | None,
    cfg: Config,
    *,
    environ: Mapping[str, str] | None = None,
    migrate: bool = True,
    strict: bool | None = None,
    threads: str | None = "runtime",
    register: bool = True,
    report: bool = True,
    prefix: str = "",
    machine_origin: str = "",
) -> Binding:
    """The one way into binding (see the module docstring): bind this process as
    ``plan`` says and return what was done.

    ``machine`` gives the GPU node's CPUs and the cgroup's for the keep/replace rule (None:
    the plan is applied exactly, as with ``NUMABIND=force``).  ``threads`` is how
    ``NUMABIND_THREADS`` applies: ``"env"`` (set the variables: nothing is loaded yet),
    ``"runtime"`` (resize the pools already loaded) or None.  ``strict`` (default:
    ``cfg.strict``) restores and raises :class:`~numabind.BindingError` on a failure or a
    refused call; a benign skip (one NUMA node) is never a failure.  ``report`` prints the
    one line the rules call for, ``prefix`` before it.  ``machine_origin`` says where the
    plan's machine came from (numabind._cache: ``cache``, ``sysfs``...), for the entry."""
    env = os.environ if environ is None else environ
    strict = cfg.strict if strict is None else strict
    nics = _enter_nics(plan, machine, cfg, env)
    if not plan.bound:
        b = Binding(plan)
        b.machine = machine_origin  # where the machine that bound nothing came from
        _nic_result(b, nics, cfg.verbose)
        b.warnings.extend(cfg.warnings)
        if cfg.verbose:
            b.notes.extend(cfg.notes)
        if strict and b.failed:
            from ._errors import BindingError

            raise BindingError(plan.summary())
        if report:
            b.report(cfg.verbose, prefix)
        return b
    settings = None
    if cfg.threads != "off" and threads == "env":
        from ._threads import apply_env

        settings = apply_env(plan, cfg.threads, env)
    places = None
    if cfg.omp_places != "off" and threads is not None:
        from ._threads import apply_places

        places = apply_places(cfg.omp_places, env)
    with LOCK:
        previous = _same_binding(plan)
        changed = previous.changes() if previous is not None else None
        if previous is not None and not changed and previous.policy_holds():
            return previous  # apply() twice: nothing to do, nothing to say
        b = apply_with_rule(plan, machine, cfg.enable, env, migrate=migrate)
        b.machine = machine_origin
        _nic_result(b, nics, cfg.verbose)
        if changed:
            b.warnings.append(changed)
        if strict and (b.errors or b.refused):
            what = "; ".join([*b.errors, *(f"{c} refused" for c in b.refused)])
            b.restore()
            from ._errors import BindingError

            raise BindingError(plan.summary() + (f": {what}" if what else ""))
        _enter_threads(b, cfg, threads, settings, places)
        _enter_binders(b, cfg, env)
        if register and not b.errors:
            from . import _registry

            path, why = _registry.register(b.entry(), env)
            b.registered = path
            if why and cfg.verbose:
                b.notes.append(why)
    b.warnings.extend(cfg.warnings)
    if cfg.verbose:
        b.notes.extend(cfg.notes)
    if report:
        b.report(cfg.verbose, prefix)
    if b.ok:
        _arm(cfg)
    return b


def _enter_binders(b: Binding, cfg: Config, env: Mapping[str, str]) -> None:
    """``NUMABIND_BINDERS=keep`` for a binding that took (its CPUs applied, or a mask
    kept by the rule): turn off the pinning of the libraries that have a switch, where the
    user set none (numabind._binders.keep_env); a value kept that re-pins is warned of."""
    if cfg.binders != "keep" or not hasattr(env, "__setitem__"):
        return
    if b.errors or not (b.cpus_applied or b.existing_action == "kept"):
        return
    from ._binders import env_lines, keep_env

    done = keep_env(env)  # type: ignore[arg-type]  # a mutable mapping: __setitem__ above
    if cfg.verbose:
        b.notes.extend(done.notes())
    b.warnings.extend(
        f"{line} (kept: set before numabind, NUMABIND_BINDERS)"
        for line in env_lines(dict(done.kept))
    )


def _enter_nics(
    plan: Plan, machine: Machine | None, cfg: Config, env: Mapping[str, str]
) -> NicEnv | None:
    """The NIC step of entering (``NUMABIND_NIC``): the transports named are told the
    plan's adapters before anything that reads them loads (numabind._transports, which
    only a process that asks for NICs imports)."""
    if not cfg.nic or not hasattr(env, "__setitem__"):
        return None
    from ._transports import enter_nics

    return enter_nics(plan, machine, cfg, env)  # type: ignore[arg-type]


def _nic_result(b: Binding, nics: NicEnv | None, verbose: bool) -> None:
    if nics is not None:
        b.nic_env = nics.set
        b.warnings.extend(nics.warnings)
        if verbose:
            b.notes.extend(nics.notes)


def _same_binding(plan: Plan) -> Binding | None:
    """The active binding of this process that placed exactly ``plan``'s placement for the
    same device (the caller holds the lock), None when there is none."""
    for b in reversed(ACTIVE):
        if b.plan.bound and b.cpus_applied:
            same = b.plan.placement == plan.placement and b.plan.device == plan.device
            return b if same else None
    return None


def _arm(cfg: Config) -> None:
    """Step 5 of the protocol, for every entry point: a binding that took arms the guards
    (they cost nothing until torch, numpy or c10d is imported)."""
    if cfg.guard:
        from ._guard import arm

        arm(intended_cpus)
    if cfg.omp_places != "off":
        from ._guard import arm_places

        arm_places(intended_cpus)


def _enter_threads(
    b: Binding,
    cfg: Config,
    threads: str | None,
    settings: ThreadSettings | None,
    places: Places | None,
) -> None:
    """The thread pools' part of entering a binding (NUMABIND_THREADS and
    NUMABIND_OMP_PLACES): resize what is loaded on late binding, record what was set."""
    if cfg.threads != "off" and threads == "runtime":
        from ._threads import apply_runtime

        settings, notes = apply_runtime(b.plan, cfg.threads)
        b.notes.extend(notes)
    if settings is not None:
        b.thread_env = settings.registry_env()
        b.notes.extend(settings.notes(cfg.verbose))
        if settings.affinity_warning:
            b.warnings.append(settings.affinity_warning)
    if places is not None:
        _enter_places(b, places, threads, cfg.verbose)


def _enter_places(b: Binding, places: Places, threads: str | None, verbose: bool) -> None:
    """NUMABIND_OMP_PLACES for a binding that took: record the variables, say what was
    done (the entry points arm :func:`numabind._guard.arm_places`, which keeps the main
    thread on the rank's CPUs once an OpenMP runtime loads)."""
    from ._threads import PLACES_MODULES

    b.thread_env = tuple(sorted({**dict(b.thread_env), **dict(places.set or places.kept)}.items()))
    if verbose:
        b.notes.append(places.note())
    loaded = [m for m in PLACES_MODULES if m in sys.modules]
    if places.set and threads == "runtime" and loaded:
        b.notes.append(
            f"NUMABIND_OMP_PLACES: {loaded[0]} was imported before this binding: its OpenMP "
            "runtime keeps the places it read; processes started from here get them"
        )


# --- the rule for a mask already in place ------------------------------------------------------


class Existing(Record):
    """The CPU mask found on the process and what it is judged to be."""

    current: frozenset[int]
    parent: frozenset[int] | None
    narrower: bool
    kind: Origin
    launcher: str | None = None  # the launcher whose default binding it is

    @property
    def deliberate(self) -> bool:
        return self.kind == "deliberate"

    @property
    def origin(self) -> str:
        """One phrase: who set the mask."""
        if self.kind == "launcher":
            return self.launcher or "a launcher's default binding"
        if self.kind == "inherited":
            return "inherited from the parent process"
        if self.kind == "deliberate":
            return "set for this process (numactl, taskset or a launcher option)"
        return "no narrower binding"


class Decision(Record):
    """What to do with the CPU mask in place: ``apply`` the plan or ``keep`` it; whether
    the memory policy may replace one already set; whether threads whose masks lie inside
    the plan are rebound anyway; and the line to print, if any."""

    action: Action
    memory_only_if_default: bool = False
    rebind_inside: bool = False
    message: str | None = None


def launcher_default(environ: Mapping[str, str]) -> str | None:
    """Name the launcher whose *automatic* binding this is, or None.

    Open MPI marks a rank it bound with ``OMPI_MCA_orte_bound_at_launch=1``; a binding the
    user asked for (``--bind-to``) also sets ``OMPI_MCA_hwloc_base_binding_policy``.

    Slurm (22.05, measured with real srun): the default task/affinity binding and an
    explicit ``--cpu-bind=cores`` (or sockets, threads, ldoms) leave byte-identical task
    environments, ``SLURM_CPU_BIND_TYPE=mask_cpu:`` with masks Slurm computed itself, always
    written ``0x...``.  Masks or CPU maps the user typed arrive verbatim (``map_cpu:1,0``,
    ``mask_cpu:1``).  So ``mask_cpu:`` with only 0x-masks counts as Slurm's automatic,
    GPU-unaware binding; ``NUMABIND=respect`` keeps it for users who chose it on purpose.
    """
    if environ.get("OMPI_MCA_orte_bound_at_launch") == "1" and not environ.get(
        "OMPI_MCA_hwloc_base_binding_policy"
    ):
        return "Open MPI's default core binding"
    if "SLURM_STEP_ID" in environ and environ.get("SLURM_CPU_BIND_TYPE", "") == "mask_cpu:":
        text = environ.get("SLURM_CPU_BIND_LIST", "")
        masks = [m for m in text.split(",", 8192)[:8192] if m] if len(text) < 1 << 17 else []
        if masks and all(m.lower().startswith("0x") for m in masks):
            return "Slurm's automatic task/affinity binding"
    return None


def assess(
    current: frozenset[int],
    allowed: frozenset[int],
    parent: frozenset[int] | None,
    environ: Mapping[str, str],
) -> Existing:
    narrower = bool(current) and not (allowed <= current)
    if not narrower:
        return Existing(current=current, parent=parent, narrower=False, kind="none")
    launcher = launcher_default(environ)
    if launcher is not None:
        return Existing(
            current=current, parent=parent, narrower=True, kind="launcher", launcher=launcher
        )
    if parent is not None and parent == current:
        return Existing(current=current, parent=parent, narrower=True, kind="inherited")
    return Existing(current=current, parent=parent, narrower=True, kind="deliberate")


def decide(
    existing: Existing,
    plan_cpus: frozenset[int],
    node_cpus: frozenset[int] | None,
    enable: str,
) -> Decision:
    """Apply the rule above.  ``node_cpus`` are the GPU's node's CPUs (None: unknown)."""
    if enable == "force":
        return Decision(action="apply", rebind_inside=True)  # the plan, exactly
    if not existing.narrower or existing.current == plan_cpus:
        # nothing in place, or already the plan; under respect a memory policy set for the
        # process (numactl --membind) stays as well
        return Decision(action="apply", memory_only_if_default=enable == "respect")
    if enable == "respect":
        return Decision(action="keep", memory_only_if_default=True)
    inside = node_cpus is not None and existing.current <= node_cpus
    if existing.deliberate and inside:
        return Decision(action="keep", memory_only_if_default=True)
    where = "outside the GPU's node" if existing.deliberate else existing.origin
    # a mask judged not to be this process's choice is replaced even where it lies inside
    # the plan (Open MPI's core pin inside the right node still wastes the node's other cores)
    return Decision(
        action="apply",
        rebind_inside=True,
        message=f"replaced CPU mask {fmt(existing.current)} ({where}) with {fmt(plan_cpus)}; "
        "NUMABIND=respect keeps such masks",
    )


def judge(
    plan_cpus: frozenset[int],
    node_cpus: frozenset[int] | None,
    allowed: frozenset[int],
    enable: str,
    environ: Mapping[str, str],
) -> tuple[Existing, Decision]:
    """Assess this process's current mask against its parent's and decide."""
    from ._kernel import cpus_allowed

    current = frozenset(os.sched_getaffinity(0))
    existing = assess(current, allowed, cpus_allowed(os.getppid()), environ)
    return existing, decide(existing, plan_cpus, node_cpus, enable)


def apply_with_rule(
    plan: Plan,
    machine: Machine | None,
    enable: str,
    environ: Mapping[str, str],
    *,
    migrate: bool = True,
    all_threads: bool = True,
) -> Binding:
    """Judge the mask in place (``machine`` None: apply the plan exactly, as ``force``)
    and apply ``plan`` accordingly; the caller holds the lock."""
    node = machine.node(plan.numa_node) if machine and plan.numa_node is not None else None
    node_cpus = node.cpus if node is not None else None
    if plan.per_device:
        # several devices: a mask is "inside" only where it holds a CPU of every device's
        # share (a mask on one device's node would starve the threads of the others)
        shares = [p.cpus for p in plan.per_device if p.bound]
        current = frozenset(os.sched_getaffinity(0))
        node_cpus = plan.cpus if all(current & s for s in shares) else frozenset()
    existing, decision = judge(
        plan.cpus,
        node_cpus,
        machine.allowed.cpus if machine is not None else frozenset(),
        enable if machine is not None else "force",
        environ,
    )
    keep: str | None = None
    if decision.action == "keep":
        why = "NUMABIND=respect" if enable == "respect" else existing.origin
        keep = f"kept CPU mask {fmt(existing.current)} ({why})"
    b = apply_plan(
        plan,
        migrate=migrate,
        all_threads=all_threads,
        keep_cpus=keep,
        keep_policy=decision.memory_only_if_default,
        rebind_inside=decision.rebind_inside,
    )
    if decision.message and b.existing is None and b.cpus_applied and b.threads_rebound:
        b.existing, b.existing_action = decision.message, "replaced"
    if existing.narrower and existing.current != plan.cpus:
        if decision.action == "keep":
            b.start_mask, b.start_action = existing.current, "kept"
        elif b.existing_action == "replaced":
            b.start_mask, b.start_action = existing.current, "replaced"
    return b


# --- the kernel calls --------------------------------------------------------------------------


def apply_plan(
    plan: Plan,
    *,
    migrate: bool = True,
    all_threads: bool = True,
    cpus: bool = True,
    memory: bool = True,
    keep_cpus: str | None = None,
    keep_policy: bool = False,
    rebind_inside: bool = False,
) -> Binding:
    """Bind this process as ``plan`` says; failures are recorded in ``Binding.errors``.
    Entry points call :func:`numabind._apply.enter`, which adds the keep/replace rule,
    strict mode and registration around this.

    ``keep_cpus`` (a reason) leaves the CPU masks as they are; ``keep_policy`` leaves a
    memory policy already set (numactl --membind) and sets one only where there is none.
    A thread whose mask already lies inside the plan is kept, unless ``rebind_inside``.
    """
    b = Binding(plan)
    if not plan.bound:
        return b
    with LOCK:
        if keep_cpus:
            b.existing, b.existing_action = keep_cpus, "kept"
            b.kept_cpus = frozenset(os.sched_getaffinity(0))
        elif cpus and plan.cpus:
            _apply_cpus(b, plan.cpus, all_threads, rebind_inside)
            if plan.main_cpus and b.cpus_applied:
                _pin_main(b, plan)
        if memory and plan.memory_policy != "none":
            _apply_policy(b, plan, keep_policy)
            if migrate and b.policy_applied and plan.memory_nodes:
                _migrate(b, plan)
        ACTIVE.append(b)
    return b


def _pin_main(b: Binding, plan: Plan) -> None:
    """NUMABIND_PRIORITY=main: the calling thread (the one that launches GPU work) on its
    priority core, and what it starts from now on on the whole compute set
    (:mod:`numabind._handback`).  A refusal leaves it on the whole set, with a note."""
    from . import _handback, _kernel

    tid = _thread.get_native_id()
    before = _kernel.affinity_of(0)
    try:
        _kernel.set_thread_affinity(0, plan.main_cpus)
    except OSError as err:
        b.notes.append(
            f"the main thread could not be put on priority core {fmt(plan.main_cpus)}: {err}"
        )
        return
    if before is not None:
        b._previous_affinity.setdefault(tid, before)
    # what the kernel kept: a cpuset or an offline sibling narrows {0,128} to {0}, and what
    # the pinned thread starts is recognised by that mask, not by the one asked for
    kept = _kernel.affinity_of(0)
    main = kept if kept and kept <= plan.main_cpus else plan.main_cpus
    b.masks[tid] = main
    b.main_thread = tid
    _handback.pin(tid, main, plan.cpus)


def _apply_cpus(b: Binding, cpus: frozenset[int], all_threads: bool, rebind_inside: bool) -> None:
    """Every thread on ``cpus``.  A thread started during the pass by one not yet rebound
    inherits the old mask and is not in the list the pass began with (a dataloader or a
    watchdog starting its workers while a late ``apply()`` runs), so the threads are
    listed again until a listing holds none not seen, at most :data:`THREAD_PASSES`
    times; what still appeared after the last is said in a note.  A process whose only
    thread is the caller is listed once: nothing else runs to start a thread."""
    from . import _kernel

    seen: set[int] = set()
    tids = _kernel.thread_ids() if all_threads else [0]
    for _ in range(THREAD_PASSES):
        new = [tid for tid in tids if tid not in seen]
        if not new:
            break
        seen.update(new)
        if not _apply_threads(b, new, cpus, rebind_inside):
            return  # the calling thread could not be bound: b.errors says why
        if not all_threads or len(seen) == 1:
            break  # the caller alone (a rank's start): no other thread could start one
        tids = _kernel.thread_ids()
    else:
        if any(tid not in seen for tid in tids):
            b.notes.append(
                f"threads kept starting while the CPUs were set ({THREAD_PASSES} passes): "
                "the newest may be on the CPUs they were started with; check --pid shows them"
            )
    b.cpus_applied = not b.errors


def _apply_threads(b: Binding, tids: list[int], cpus: frozenset[int], rebind_inside: bool) -> bool:
    """One pass of :func:`_apply_cpus`; False when the calling thread could not be bound."""
    from . import _kernel

    self_tid = _thread.get_native_id()
    with LOCK:  # threads inside a bind_thread block that set their CPUs: the outermost
        held = {tid: stack[0] for tid, stack in THREADS.items() if stack and stack[0].pin.cpus_set}
    for tid in tids:
        current = _kernel.affinity_of(tid)
        if current is None:
            continue  # exited meanwhile
        block = held.get(tid or self_tid)
        if block is not None:
            # bind_thread's own: the thread stays on its device's CPUs, and returns to
            # this binding's when its block ends (changes() knows a thread in a block)
            b._rebased.append((block, tid or self_tid, block.pin.rebase(cpus)))
            b.threads_kept += 1
            b.masks[tid] = cpus
            continue
        if current == cpus or (current <= cpus and not rebind_inside):
            b.threads_kept += 1
            b.masks[tid] = current
            continue
        try:
            _kernel.set_thread_affinity(tid, cpus)
        except ProcessLookupError:
            continue
        except OSError as err:
            b.errors.append(str(err))
            if tid in (0, self_tid):
                return False
            continue
        b._previous_affinity[tid] = current
        b.threads_rebound += 1
        b.masks[tid] = cpus
        if tid in (0, self_tid):
            got = _kernel.affinity_of(tid)
            if got is not None and got != cpus:
                b.notes.append(
                    f"the kernel narrowed the CPUs to {fmt(got)} (a cpuset numabind could not read)"
                )
    return True


_RESTORE_HINT = (
    "--cap-add SYS_NICE restores set_mempolicy and mbind under docker's default seccomp "
    "profile; move_pages/migrate_pages need a custom profile; NUMABIND_MEMORY=none "
    "silences this"
)


def _refused(b: Binding, refusal: OSError | str, what: str = "") -> bool:
    """An EPERM from a memory-policy call (``refusal``: the error, or the name of a call
    already known to be refused): a seccomp filter or missing CAP_SYS_NICE.  Recorded once
    as a note (never an error: the CPUs are bound and pages first touched on them are
    local anyway)."""
    if isinstance(refusal, str):
        call = refusal
    else:
        if refusal.errno != errno.EPERM:
            return False
        call = getattr(refusal, "call", None) or what
    if call not in b.refused:
        b.refused.append(call)
        b.notes.append(
            f"{call} was refused (EPERM: a seccomp filter or a missing CAP_SYS_NICE); "
            f"CPUs are bound and memory first touched on them is local; {_RESTORE_HINT}"
        )
    return True


def _apply_policy(b: Binding, plan: Plan, keep_existing: bool = False) -> None:
    from . import _kernel

    try:
        b._previous_policy = _kernel.get_mempolicy_mode()
    except OSError as err:
        if not _refused(b, err, "get_mempolicy"):
            b.errors.append(str(err))
        return
    name = _kernel.policy_name(b._previous_policy[0])
    if keep_existing and name != "default":
        nodes = b._previous_policy[1]
        b.notes.append(f"kept the memory policy already set ({name} {fmt(nodes)})")
        return
    # the plan's policy, or MPOL_BIND over its spill mask (NUMABIND_SPILL=cpu)
    asked, asked_nodes = plan.placement.kernel_policy
    try:
        policy, nodes, note = _kernel.set_policy(asked, asked_nodes, plan.numa_node)
    except OSError as err:
        if not _refused(b, err, "set_mempolicy"):
            b.errors.append(str(err))
        return
    if note:
        b.notes.append(note)
    b.policy_applied, b.policy_nodes = policy, nodes


def _migrate(b: Binding, plan: Plan) -> None:
    """Move the private anonymous pages off the plan's nodes onto them, under the policy
    the table says moves pages for the policy applied (the range applier, loaded only
    when numa_maps shows a page elsewhere: a rank starting where it belongs skips it)."""
    from ._sysfs import anon_pages_outside

    target = plan.memory_nodes
    try:
        if anon_pages_outside(target) == 0:
            return
    except OSError as err:
        b.notes.append(f"page migration skipped: {err}")
        return
    from ._range import migrate_private

    move_as = POLICIES[b.policy_applied or "preferred"].migrate_as or "bind"
    dest = min(target, key=lambda n: (n != plan.numa_node, n))
    done = migrate_private(target, move_as, dest, plan.memory_mask)
    if done is None:
        return
    b.pages_moved, b.pages_failed = done.moved, done.failed
    b.not_moved.update(done.not_moved)
    b.notes.extend(done.notes)
    for call in done.refused:
        _refused(b, call)


# --- a binding the warm start replayed ----------------------------------------------------------

_adopted: list[Binding | None] = []


def adopted() -> Binding | None:
    """The binding the warm start (``_numabind_start``) replayed in this process before
    numabind was loaded, as a :class:`Binding` (made once, when this module is first
    imported: it is then this process's active binding, which ``apply()``, the guards,
    children and host buffers read); None when the warm start bound nothing."""
    if not _adopted:
        _adopted.append(None)  # a failure below leaves None, once
        _adopted[0] = _adopt()
    return _adopted[0]


def _adopt() -> Binding | None:
    """The Binding of what was replayed, from the plan the answer carries: nothing is
    planned again and the machine is not read."""
    import _numabind_base

    record = _numabind_base.applied
    if not isinstance(record, dict) or not record.get("plan"):
        return None
    from ._plan import Plan
    from ._text import decode_record

    try:
        plan = decode_record(str(record["plan"]), Plan)
    except (ValueError, TypeError, KeyError):
        return None
    b = Binding(plan)
    b.cpus_applied = True
    before = record.get("previous_cpus")
    b.threads_rebound = int(isinstance(before, frozenset))
    b.threads_kept = 1 - b.threads_rebound
    tid = os.getpid()
    if isinstance(before, frozenset):
        b._previous_affinity[tid] = before
    b.masks[tid] = plan.cpus
    said = str(record.get("binding", "")).split(" ")
    policy = said[1] if len(said) == 2 and said[1] in POLICIES else None
    if policy is not None:
        nodes = record.get("policy_nodes")
        b.policy_applied = policy
        b.policy_nodes = nodes if isinstance(nodes, frozenset) else frozenset()
        previous = record.get("previous_policy")
        if isinstance(previous, tuple) and len(previous) == 2 and isinstance(previous[0], int):
            b._previous_policy = (previous[0], frozenset(previous[1]))  # mode with its flags
    registered = record.get("registered")
    if isinstance(registered, str):
        from . import _registry

        b.registered = registered
        label = record.get("registered_label")
        _registry._registered.update(path=registered, pid=os.getpid(), label=label)
    b.machine = "answer"
    with LOCK:
        ACTIVE.append(b)
    return b


adopted()
