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
  space per ``mbind`` call: long migrations have stalled processes for minutes
  elsewhere), and what ``mbind`` leaves behind (pages busy at that instant) is retried
  page by page with ``move_pages``; what still cannot move is counted by reason.

Bindings nest like ``with`` blocks: one process-wide lock serialises every apply and
restore (two threads binding at once can no longer leave half the threads on each plan),
and a restore out of order raises :class:`~numabind.BindingError` instead of putting back
a state that a later binding replaced.
"""

from __future__ import annotations

import _thread
import errno
import os

from . import _kernel, _sysfs
from ._errors import BindingError, KernelError
from ._procmaps import anon_pages_outside, pages_per_node, private_anon_regions

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Literal

    from ._plan import Plan
    from ._procmaps import Region

    ExistingAction = Literal["kept", "replaced"]

_BATCH = 1 << 30
_MOVE_BATCH = 16384  # pages per move_pages call (64 MiB of 4 KiB pages)
_QUERY_LIMIT = 1 << 22  # pages of address space queried in all (16 GiB of 4 KiB pages)
fmt = _sysfs.format_cpulist

LOCK = _thread.RLock()
ACTIVE: list[Binding] = []  # applied and not restored, oldest first

__all__ = ["ACTIVE", "LOCK", "Binding", "BindingError", "apply_plan"]


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
        self.registered: str | None = None
        self.kept_cpus: frozenset[int] | None = None
        self._previous_affinity: dict[int, frozenset[int]] = {}
        self._previous_policy: tuple[str, frozenset[int]] | None = None
        self._restored = False

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
        replaced CPU mask, a refused call or a warning (the rules promise one line saying
        so), else only when ``verbose``."""
        return (
            self.failed
            or self.existing_action == "replaced"
            or bool(self.refused)
            or bool(self.warnings)
            or verbose
        )

    def __str__(self) -> str:
        p = self.plan
        if not p.bound:
            return _sysfs.clean_line(
                " ".join([p.summary(), *(f"[{w}]" for w in self.warnings)]), 4000
            )
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
        return _sysfs.clean_line(" ".join(parts), 4000)

    def __repr__(self) -> str:
        return f"<Binding {self}>"

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

    @property
    def active(self) -> bool:
        """Applied and not restored yet (the guards and the registry follow it)."""
        return self in ACTIVE

    def restore(self) -> None:
        """Put back the CPU masks and the calling thread's memory policy seen before.

        Bindings nest: restoring one while a later binding of this process is still
        active raises :class:`~numabind.BindingError` (restore the later one first)."""
        with LOCK:
            if self._restored:
                return
            if self in ACTIVE and ACTIVE[-1] is not self:
                later = ACTIVE[-1]
                raise BindingError(
                    f"restore() out of order: a later binding ({later.plan.summary()}) is "
                    "still active; restore it first (bindings nest like with-blocks)"
                )
            self._restored = True
            if self in ACTIVE:
                ACTIVE.remove(self)
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
            _after_restore(self)

    def __enter__(self) -> Binding:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.restore()


# set by numabind._bind: keeps the registry and the intended binding in step on restore
_after_restore_hooks: list[object] = []


def _after_restore(b: Binding) -> None:
    for hook in _after_restore_hooks:
        try:
            hook(b)  # type: ignore[operator]
        except Exception:
            pass


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
    Entry points call :func:`numabind._bind.bind`, which adds the keep/replace rule,
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
        if memory and plan.memory_policy != "none":
            _apply_policy(b, plan, keep_policy)
            if migrate and b.policy_applied and plan.memory_nodes:
                _migrate(b, plan)
        ACTIVE.append(b)
    return b


def _apply_cpus(b: Binding, cpus: frozenset[int], all_threads: bool, rebind_inside: bool) -> None:
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


_RESTORE_HINT = (
    "--cap-add SYS_NICE restores set_mempolicy and mbind under docker's default seccomp "
    "profile; move_pages/migrate_pages need a custom profile; NUMABIND_MEMORY=none "
    "silences this"
)


def _refused(b: Binding, err: OSError, what: str) -> bool:
    """An EPERM from a memory-policy call: a seccomp filter or missing CAP_SYS_NICE.
    Recorded once as a note (never an error: the CPUs are bound and pages first touched
    on them are local anyway)."""
    if err.errno != errno.EPERM:
        return False
    call = err.call if isinstance(err, KernelError) else what
    if call not in b.refused:
        b.refused.append(call)
        b.notes.append(
            f"{call} was refused (EPERM: a seccomp filter or a missing CAP_SYS_NICE); "
            f"CPUs are bound and memory first touched on them is local; {_RESTORE_HINT}"
        )
    return True


def set_thread_policy(plan: Plan) -> tuple[str, frozenset[int], str | None]:
    """Set the calling thread's memory policy as ``plan`` says: the one place that knows
    a kernel without MPOL_PREFERRED_MANY (before 5.15) refuses it with EINVAL, and falls
    back to preferring the GPU's node.  Returns (policy set, its nodes, a note or None);
    raises ``OSError`` when the kernel refuses."""
    policy, nodes = plan.memory_policy, plan.memory_nodes
    if policy == "local":
        nodes = frozenset()
    try:
        _kernel.set_mempolicy(policy, nodes)
    except OSError as err:
        if policy != "preferred-many" or err.errno != errno.EINVAL:
            raise
        first = plan.numa_node if plan.numa_node in nodes else min(nodes)
        _kernel.set_mempolicy("preferred", frozenset({first}))
        return (
            "preferred",
            frozenset({first}),
            (f"kernel refused MPOL_PREFERRED_MANY: preferring node {first}"),
        )
    return policy, nodes, None


def _apply_policy(b: Binding, plan: Plan, keep_existing: bool = False) -> None:
    try:
        b._previous_policy = _kernel.get_mempolicy()
    except OSError as err:
        if not _refused(b, err, "get_mempolicy"):
            b.errors.append(str(err))
        return
    if keep_existing and b._previous_policy[0] != "default":
        name, nodes = b._previous_policy
        b.notes.append(f"kept the memory policy already set ({name} {fmt(nodes)})")
        return
    try:
        policy, nodes, note = set_thread_policy(plan)
    except OSError as err:
        if not _refused(b, err, "set_mempolicy"):
            b.errors.append(str(err))
        return
    if note:
        b.notes.append(note)
    b.policy_applied, b.policy_nodes = policy, nodes


def _migrate(b: Binding, plan: Plan) -> None:
    """Move private anonymous pages that lie off the plan's nodes onto them.

    mbind(MPOL_MF_MOVE) walks only the resident pages of a range, so a huge, mostly
    empty reservation costs little; a second mbind(MPOL_DEFAULT) without a move flag then
    clears the range policy again, so future allocations follow the thread's policy and a
    later restore() is not contradicted by leftover range policies.  Pages mbind left
    (busy at that instant, or mbind refused) get a page-by-page move_pages pass.
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
    mbind_refused = False
    for region in before:
        if mbind_refused or not any(n not in target for n in region.pages):
            continue
        start = region.start
        while start < region.end:
            length = min(_BATCH, region.end - start)
            try:
                _kernel.mbind(start, length, move_policy, target, _kernel.MPOL_MF_MOVE)
            except OSError as err:
                if _refused(b, err, "mbind"):
                    mbind_refused = True
                    break
                if err.errno not in (errno.EFAULT, errno.EIO):  # unmapped meanwhile; busy
                    b.notes.append(f"migration of {region.name} stopped: {err}")
                    break
            finally:
                if not mbind_refused:
                    try:
                        _kernel.mbind(start, length, "default", (), 0)
                    except OSError:
                        pass
            start += length
    try:
        after = private_anon_regions()
    except OSError:
        return
    if any(n not in target for r in after for n in r.pages):
        _move_leftovers(b, after, target)
        try:
            after = private_anon_regions()
        except OSError:
            return
    off_after = sum(c for n, c in pages_per_node(after).items() if n not in target)
    b.pages_failed = off_after
    b.pages_moved = max(off_before - off_after, 0)
    if off_after and not b.not_moved:
        b.not_moved["unknown"] = off_after


_WHY = {
    errno.EACCES: "shared with another process",
    errno.EBUSY: "busy (locked or under I/O)",
    errno.EFAULT: "zero page or special mapping",
    errno.ENOMEM: "target node full",
    errno.EIO: "not migratable",
    errno.EINVAL: "not migratable",
}


def _move_leftovers(b: Binding, regions: list[Region], target: frozenset[int]) -> None:
    """Ask where each page of the regions still holding remote pages lives (move_pages
    with no nodes) and move the remote ones, in batches; bounded in all by _QUERY_LIMIT."""
    dest = min(target, key=lambda n: (n != b.plan.numa_node, n))
    budget = _QUERY_LIMIT
    for region in regions:
        if not any(n not in target for n in region.pages):
            continue
        page, start, end = region.page_size, region.start, region.end
        addr = start
        while addr < end and budget > 0:
            n = min(_MOVE_BATCH, (end - addr) // page, budget)
            if n <= 0:
                break
            batch = [addr + i * page for i in range(n)]
            budget -= n
            addr += n * page
            try:
                where = _kernel.move_pages(batch)
            except OSError as err:
                if _refused(b, err, "move_pages"):
                    return
                b.notes.append(f"move_pages: {err}")
                return
            remote = [a for a, w in zip(batch, where) if w >= 0 and w not in target]
            if not remote:
                continue
            try:
                status = _kernel.move_pages(remote, [dest] * len(remote))
            except OSError as err:
                if _refused(b, err, "move_pages"):
                    return
                b.notes.append(f"move_pages: {err}")
                return
            for s in status:
                if s < 0:
                    why = _WHY.get(-s, os.strerror(-s))
                    b.not_moved[why] = b.not_moved.get(why, 0) + 1
