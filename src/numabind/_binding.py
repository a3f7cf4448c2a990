"""What a binding did to this process, and undoing it: :class:`Binding`, and the stack of
bindings in force.

Kept apart from :mod:`numabind._apply` (the kernel calls that make a binding) so that an
entry point with nothing to bind (one NUMA node, a launcher's own process, a bad
variable) can say what it did not do without loading the kernel layer: the startup hook
on a one-socket machine imports neither ``ctypes`` nor the registry.

Bindings nest like ``with`` blocks: one process-wide lock serialises every apply and
restore (two threads binding at once can no longer leave half the threads on each plan),
and a restore out of order raises :class:`~numabind.BindingError` instead of putting back
a state that a later binding replaced.
"""

from __future__ import annotations

import _thread

from . import _sysfs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Literal

    from ._plan import Plan

    ExistingAction = Literal["kept", "replaced"]

fmt = _sysfs.format_cpulist

LOCK = _thread.RLock()
ACTIVE: list[Binding] = []  # applied and not restored, oldest first


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
                from ._errors import BindingError

                later = ACTIVE[-1]
                raise BindingError(
                    f"restore() out of order: a later binding ({later.plan.summary()}) is "
                    "still active; restore it first (bindings nest like with-blocks)"
                )
            self._restored = True
            if self in ACTIVE:
                ACTIVE.remove(self)
            if self._previous_affinity or self._previous_policy is not None:
                self._put_back()
            _after_restore(self)

    def _put_back(self) -> None:
        from . import _kernel

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


# set by numabind._bind: keeps the registry and the intended binding in step on restore
_after_restore_hooks: list[object] = []


def _after_restore(b: Binding) -> None:
    for hook in _after_restore_hooks:
        try:
            hook(b)  # type: ignore[operator]
        except Exception:
            pass
