"""The thread applier: one :class:`~numabind._plan.Placement` on the *calling thread*, for
a block or until undone.

CPU affinity and memory policy both belong to one thread, and the kernel hands both to
every thread and process that thread starts afterwards.  So "this thread, for a while" is
the unit several places need: starting a child bound (:func:`numabind.child_binding`),
issuing a GPU's copies from its ranks' CPUs (``numabind bench``), faulting a buffer's
pages in from the node's own cores (the populate workers), a loader thread per GPU in a
process that drives several (:func:`numabind.bind_thread`), and the doctor's probe of
what the kernel allows.  :class:`ThreadPin` is the one implementation: it reads what the
thread has, applies the placement, records what the kernel refused, and puts back exactly
what it found, from the same thread.

The memory policy is set through :func:`numabind._kernel.set_policy`, the one place that
knows a kernel without a policy refuses it with EINVAL (MPOL_PREFERRED_MANY before Linux
5.15) and falls back as :data:`numabind._model.MEMORY_POLICY_TABLE` says; the process
applier (:mod:`numabind._apply`) sets the calling thread's policy through it too.
"""

from __future__ import annotations

import _thread
import errno

from . import _kernel

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType

    from ._plan import Placement


def _tid() -> int:
    return _thread.get_native_id()


class ThreadPin:
    """The calling thread on a :class:`~numabind._plan.Placement` until :meth:`undo` (or the
    end of a ``with`` block).  Nothing happens in the constructor: :meth:`apply` (or
    ``__enter__``) applies.

    ``memory`` False leaves the memory policy alone (the CPUs only).  What the kernel did
    is recorded, never raised: ``cpus_set`` (or ``cpu_error``: the CPUs were refused, and
    then nothing else is tried), ``policy`` (the policy and nodes set, or None),
    ``errors`` (the memory calls' refusals), ``refused`` (the names of those refused with
    EPERM: a seccomp filter, a missing CAP_SYS_NICE) and ``notes``.  A policy that cannot
    be set leaves the CPUs bound (pages first touched there are local anyway).
    :meth:`undo` puts back the CPU mask and the memory policy seen before, and must run on
    the thread that applied (another thread's mask and policy are not this one's to
    change)."""

    def __init__(self, placement: Placement, *, memory: bool = True) -> None:
        self.placement = placement
        self.memory = memory and placement.sets_memory
        self.cpus_set = False
        self.cpu_error: OSError | None = None
        self.policy: tuple[str, frozenset[int]] | None = None
        self.refused: list[str] = []
        self.errors: list[OSError] = []
        self.notes: list[str] = []
        self._tid: int | None = None
        self._previous_cpus: frozenset[int] | None = None
        self._previous_policy: tuple[int, frozenset[int]] | None = None  # mode with flags

    @property
    def applied(self) -> bool:
        return self._tid is not None

    @property
    def ok(self) -> bool:
        """Everything asked for was set."""
        return self.applied and self.cpu_error is None and not self.errors

    def apply(self) -> ThreadPin:
        """Apply the placement to the calling thread (once); returns the pin."""
        if self._tid is not None:
            return self
        self._tid = _tid()
        cpus = self.placement.cpus
        if cpus:
            self._previous_cpus = _kernel.affinity_of(0)
            try:
                _kernel.set_thread_affinity(0, cpus)
            except OSError as err:
                self.cpu_error = err
                return self
            self.cpus_set = True
        if self.memory:
            self._set_policy()
        return self

    def _set_policy(self) -> None:
        try:
            previous = _kernel.get_mempolicy_mode()
        except OSError as err:
            self._failed(err, "get_mempolicy")
            return
        asked, asked_nodes = self.placement.kernel_policy  # a spill mask is MPOL_BIND
        try:
            policy, nodes, note = _kernel.set_policy(asked, asked_nodes, self.placement.home)
        except OSError as err:
            self._failed(err, "set_mempolicy")
            return
        self._previous_policy = previous
        self.policy = (policy, nodes)
        if note:
            self.notes.append(note)

    def _failed(self, err: OSError, call: str) -> None:
        self.errors.append(err)
        if err.errno == errno.EPERM:
            self.refused.append(getattr(err, "call", None) or call)

    def rebase(self, cpus: frozenset[int] | None) -> frozenset[int] | None:
        """Make ``cpus`` what :meth:`undo` puts back, returning what it was: a process
        binding applied while this pin held its thread (``numabind.apply()`` during a
        ``bind_thread`` block) leaves the thread where it is and is where the thread
        returns; that binding's restore() rebases it back."""
        old = self._previous_cpus
        if self.cpus_set and cpus is not None:
            self._previous_cpus = cpus
        return old

    def undo(self) -> None:
        """Put back what :meth:`apply` found; a no-op when nothing was applied or it was
        undone already.  Raises ``RuntimeError`` on another thread than the one that
        applied."""
        if self._tid is None:
            return
        if self._tid != _tid():
            raise RuntimeError("ThreadPin.undo() must run on the thread that applied it")
        self._tid = None
        if self.cpus_set and self._previous_cpus is not None:
            try:
                _kernel.set_thread_affinity(0, self._previous_cpus)
            except OSError:
                pass  # the cgroup took those CPUs away meanwhile: the mask stays
        if self._previous_policy is not None:
            try:
                _kernel.set_mempolicy_mode(*self._previous_policy)
            except OSError:
                pass
        self.cpus_set = False
        self.policy = None
        self._previous_cpus = self._previous_policy = None

    def __enter__(self) -> ThreadPin:
        return self.apply()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.undo()


def pin_cpus(cpus: frozenset[int]) -> ThreadPin:
    """The calling thread on ``cpus`` (memory policy untouched), applied: for a worker
    thread that ends on those CPUs and needs no undo."""
    from ._plan import Placement

    return ThreadPin(Placement(cpus=cpus)).apply()
