"""Apply a :class:`~numabind._plan.Plan` to the running process: the kernel calls.

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

What was done is a :class:`~numabind._binding.Binding` (its own module, with the lock
and the stack of bindings in force, and ``restore``).
"""

from __future__ import annotations

import errno
import os

from . import _kernel, _sysfs
from ._binding import ACTIVE, LOCK, Binding
from ._procmaps import anon_pages_outside, pages_per_node, private_anon_regions

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._plan import Plan
    from ._procmaps import Region

_BATCH = 1 << 30
_MOVE_BATCH = 16384  # pages per move_pages call (64 MiB of 4 KiB pages)
_QUERY_LIMIT = 1 << 22  # pages of address space queried in all (16 GiB of 4 KiB pages)
fmt = _sysfs.format_cpulist

__all__ = ["apply_plan", "set_thread_policy"]


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
    from ._errors import KernelError

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
