"""Apply a :class:`~numabind._plan.Plan` to the running process, and undo it.

What "the process" means differs per resource, and the difference is the whole story of
late binding:

* CPU affinity is per thread.  Every thread in /proc/self/task whose mask is not already
  inside the plan is rebound; a thread created afterwards inherits its creator's mask.
* Memory policy is per thread and can only be set by the thread itself: the calling thread
  gets it (and every thread and child it starts later).  Threads that already exist keep
  their own policy; their future allocations are the one gap late binding cannot close.
* Pages already placed stay where they are unless moved.  With ``migrate`` the private
  anonymous pages off the plan's nodes are moved in bounded batches (1 GiB of address
  space per call: long migrations have stalled processes for minutes elsewhere).
"""

from __future__ import annotations

from . import _kernel, _sysfs
from ._procmaps import anon_pages_outside, pages_per_node, private_anon_regions

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType

    from ._plan import Plan

_BATCH = 1 << 30
fmt = _sysfs.format_cpulist


class BindingError(RuntimeError):
    """Raised in strict mode when a plan could not be applied (or was skipped)."""


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
        self.errors: list[str] = []
        self.notes: list[str] = []
        self.existing: str | None = None  # what happened to a binding found in place
        self._previous_affinity: dict[int, frozenset[int]] = {}
        self._previous_policy: tuple[str, frozenset[int]] | None = None
        self._restored = False

    @property
    def ok(self) -> bool:
        return self.plan.bound and not self.errors

    @property
    def failed(self) -> bool:
        """A call failed, or the plan skipped because of bad input or a forbidding machine
        (a benign skip, such as a one-node machine, is not a failure)."""
        return bool(self.errors) or (not self.plan.bound and self.plan.problem)

    def worth_a_line(self, verbose: bool) -> bool:
        """Whether an entry point should print this binding: always for a failure or a
        replaced CPU mask (the rule promises one line saying so), else only when verbose."""
        return self.failed or (self.existing or "").startswith("replaced") or verbose

    def __str__(self) -> str:
        p = self.plan
        if not p.bound:
            return p.summary()
        parts = [p.summary().split(": ", 1)[0] + ":"]
        if self.cpus_applied:
            parts.append(
                f"CPUs {fmt(p.cpus)} ({self.threads_rebound} threads rebound, "
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
        for n in (*p.notes, *self.notes):
            parts.append(f"[{n}]")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"<Binding {self}>"

    def to_dict(self) -> dict[str, object]:
        return {
            "plan": self.plan.to_dict(),
            "cpus_applied": self.cpus_applied,
            "threads_rebound": self.threads_rebound,
            "policy": self.policy_applied,
            "policy_nodes": sorted(self.policy_nodes),
            "pages_moved": self.pages_moved,
            "pages_failed": self.pages_failed,
            "errors": list(self.errors),
            "existing": self.existing,
        }

    def restore(self) -> None:
        """Put back the CPU masks and the calling thread's memory policy seen before."""
        if self._restored:
            return
        self._restored = True
        for tid, cpus in self._previous_affinity.items():
            try:
                _kernel.set_thread_affinity(tid, cpus)
            except OSError:
                pass  # the thread has exited
        if self._previous_policy is not None:
            policy, nodes = self._previous_policy
            try:
                _kernel.set_mempolicy(policy, nodes)
            except OSError as err:
                self.errors.append(str(err))

    def __enter__(self) -> Binding:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


def apply_plan(
    plan: Plan,
    *,
    migrate: bool = True,
    all_threads: bool = True,
    cpus: bool = True,
    memory: bool = True,
    strict: bool = False,
    register: bool = True,
    keep_cpus: str | None = None,
    keep_policy: bool = False,
    rebind_inside: bool = False,
) -> Binding:
    """Bind this process as ``plan`` says.  In strict mode any failure, or a skipped plan,
    raises :class:`BindingError`; otherwise failures are recorded in ``Binding.errors``.
    A process that ends up bound registers itself for ``numabind check --all``.

    ``keep_cpus`` (a reason) leaves the CPU masks as they are; ``keep_policy`` leaves a
    memory policy already set (numactl --membind) and sets one only where there is none.
    A thread whose mask already lies inside the plan is kept, unless ``rebind_inside``.
    """
    b = Binding(plan)
    if not plan.bound:
        if strict:
            raise BindingError(plan.summary())
        return b
    if keep_cpus:
        b.existing = keep_cpus
    elif cpus and plan.cpus:
        _apply_cpus(b, plan.cpus, all_threads, rebind_inside)
    if memory and plan.memory_policy != "none":
        _apply_policy(b, plan, keep_policy)
        if migrate and b.policy_applied and plan.memory_nodes:
            _migrate(b, plan)
    if strict and b.errors:
        b.restore()
        raise BindingError(f"{plan.summary()}: " + "; ".join(b.errors))
    if register and not b.errors:
        from ._registry import register as _register

        _register(b)
    return b


def _apply_cpus(b: Binding, cpus: frozenset[int], all_threads: bool, rebind_inside: bool) -> None:
    import os

    tids = _kernel.thread_ids() if all_threads else [0]
    self_tid = getattr(os, "gettid", lambda: os.getpid())()
    for tid in tids:
        current = _kernel.affinity_of(tid)
        if current is None:
            continue  # exited meanwhile
        if current == cpus or (current <= cpus and not rebind_inside):
            b.threads_kept += 1
            continue
        try:
            _kernel.set_thread_affinity(tid, cpus)
        except ProcessLookupError:
            continue
        except OSError as err:
            b.errors.append(str(err))
            if tid in (0, self_tid):
                return
            continue
        b._previous_affinity[tid] = current
        b.threads_rebound += 1
        if tid in (0, self_tid):
            got = _kernel.affinity_of(tid)
            if got is not None and got != cpus:
                b.notes.append(
                    f"the kernel narrowed the CPUs to {fmt(got)} (a cpuset numabind could not read)"
                )
    b.cpus_applied = not b.errors


def _apply_policy(b: Binding, plan: Plan, keep_existing: bool = False) -> None:
    try:
        b._previous_policy = _kernel.get_mempolicy()
    except OSError as err:
        b.errors.append(str(err))
        return
    if keep_existing and b._previous_policy[0] != "default":
        name, nodes = b._previous_policy
        b.notes.append(f"kept the memory policy already set ({name} {fmt(nodes)})")
        return
    policy, nodes = plan.memory_policy, plan.memory_nodes
    if policy == "local":
        nodes = frozenset()
    try:
        _kernel.set_mempolicy(policy, nodes)
    except OSError as err:
        if policy == "preferred-many" and err.errno == 22:
            first = plan.numa_node if plan.numa_node in nodes else min(nodes)
            b.notes.append(f"kernel refused MPOL_PREFERRED_MANY: preferring node {first}")
            policy, nodes = "preferred", frozenset({first})
            try:
                _kernel.set_mempolicy(policy, nodes)
            except OSError as err2:
                b.errors.append(str(err2))
                return
        else:
            b.errors.append(str(err))
            return
    b.policy_applied, b.policy_nodes = policy, nodes


def _migrate(b: Binding, plan: Plan) -> None:
    """Move private anonymous pages that lie off the plan's nodes onto them.

    mbind(MPOL_MF_MOVE) walks only the resident pages of a range, so a huge, mostly
    empty reservation costs little; a second mbind(MPOL_DEFAULT) without a move flag then
    clears the range policy again, so future allocations follow the thread's policy and a
    later restore() is not contradicted by leftover range policies.
    """
    target = plan.memory_nodes
    policy = b.policy_applied or "preferred"
    move_policy = "bind" if policy in ("preferred", "preferred-many", "local") else policy
    try:
        if anon_pages_outside(target) == 0:
            return
        before = private_anon_regions()
    except OSError as err:
        b.notes.append(f"page migration skipped: {err}")
        return
    off_before = sum(c for n, c in pages_per_node(before).items() if n not in target)
    if off_before == 0:
        return
    for region in before:
        if not any(n not in target for n in region.pages):
            continue
        start = region.start
        while start < region.end:
            length = min(_BATCH, region.end - start)
            try:
                _kernel.mbind(start, length, move_policy, target, _kernel.MPOL_MF_MOVE)
            except OSError as err:
                if err.errno not in (14, 5):  # EFAULT: unmapped meanwhile; EIO: some pages busy
                    b.notes.append(f"migration of {region.name} stopped: {err}")
                    break
            finally:
                try:
                    _kernel.mbind(start, length, "default", (), 0)
                except OSError:
                    pass
            start += length
    try:
        after = private_anon_regions()
    except OSError:
        return
    off_after = sum(c for n, c in pages_per_node(after).items() if n not in target)
    b.pages_failed = off_after
    b.pages_moved = max(off_before - off_after, 0)
