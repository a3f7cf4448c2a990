"""Whose CPU binding is already on this process, and whether to keep it.

Launchers bind by default and know nothing of GPUs: Open MPI pins each rank to a core
(round-robin by socket beyond two ranks, so alternate ranks sit on the wrong socket),
Slurm's task/affinity pins tasks to cores, and a torchrun agent pinned by ``srun -n1``
passes its pin to every worker.  Keeping such a binding is the bug numabind exists to fix.
A user's ``numactl``/``taskset`` wrapper, ``mpirun --bind-to``, Slurm's explicit
``--cpu-bind`` or DeepSpeed's ``--bind_cores_to_rank`` are deliberate choices.

The rule (documented as a table in docs/how-it-works.md):

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
"""

from __future__ import annotations

from . import _sysfs
from ._model import Record, _set

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ._apply import Binding
    from ._plan import Plan
    from ._topology import Machine

fmt = _sysfs.format_cpulist


class Existing(Record):
    """The CPU mask found on the process and what it is judged to be."""

    __slots__ = ("current", "parent", "narrower", "origin", "deliberate")
    current: frozenset[int]
    parent: frozenset[int] | None
    narrower: bool
    origin: str
    deliberate: bool

    def __init__(
        self,
        current: frozenset[int],
        parent: frozenset[int] | None,
        narrower: bool,
        origin: str,
        deliberate: bool,
    ) -> None:
        _set(self, "current", current)
        _set(self, "parent", parent)
        _set(self, "narrower", narrower)
        _set(self, "origin", origin)
        _set(self, "deliberate", deliberate)


class Decision(Record):
    """What to do: ``apply`` the plan's CPUs or ``keep`` the current ones; whether the
    memory policy may replace one already set; and the line to print, if any."""

    __slots__ = ("cpus", "memory_only_if_default", "message")
    cpus: str
    memory_only_if_default: bool
    message: str | None

    def __init__(self, cpus: str, memory_only_if_default: bool, message: str | None) -> None:
        _set(self, "cpus", cpus)
        _set(self, "memory_only_if_default", memory_only_if_default)
        _set(self, "message", message)


def parent_mask(ppid: int) -> frozenset[int] | None:
    text = _sysfs.read_opt(f"/proc/{ppid}/status")
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            try:
                return _sysfs.parse_cpulist(line.split(":", 1)[1])
            except ValueError:
                return None
    return None


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
        masks = [m for m in environ.get("SLURM_CPU_BIND_LIST", "").split(",") if m]
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
        return Existing(current, parent, False, "no narrower binding", False)
    launcher = launcher_default(environ)
    if launcher is not None:
        return Existing(current, parent, True, launcher, False)
    if parent is not None and parent == current:
        return Existing(current, parent, True, "inherited from the parent process", False)
    return Existing(
        current, parent, True, "set for this process (numactl, taskset or a launcher option)", True
    )


def decide(
    existing: Existing,
    plan_cpus: frozenset[int],
    node_cpus: frozenset[int] | None,
    enable: str,
) -> Decision:
    """Apply the rule above.  ``node_cpus`` are the GPU's node's CPUs (None: unknown)."""
    if not existing.narrower:
        return Decision("apply", False, None)
    if enable == "force" or existing.current == plan_cpus:
        return Decision("apply", False, None)  # asked for, or already the plan: nothing to say
    cur = fmt(existing.current)
    if enable == "respect":
        return Decision("keep", True, None)
    inside = node_cpus is not None and existing.current <= node_cpus
    if existing.deliberate and inside:
        return Decision("keep", True, None)
    where = "outside the GPU's node" if existing.deliberate else existing.origin
    return Decision(
        "apply",
        False,
        f"replaced CPU mask {cur} ({where}) with {fmt(plan_cpus)}; "
        "NUMABIND=respect keeps such masks",
    )


def for_this_process(
    plan_cpus: frozenset[int],
    node_cpus: frozenset[int] | None,
    allowed: frozenset[int],
    enable: str,
    environ: Mapping[str, str],
) -> tuple[Existing, Decision]:
    """Assess this process's current mask against its parent's and decide."""
    import os

    current = frozenset(os.sched_getaffinity(0))
    existing = assess(current, allowed, parent_mask(os.getppid()), environ)
    return existing, decide(existing, plan_cpus, node_cpus, enable)


def bind(
    plan: Plan,
    machine: Machine,
    enable: str,
    environ: Mapping[str, str],
    **apply_kwargs: Any,
) -> Binding:
    """Apply ``plan`` to this process under the rule above: keep or replace the CPU mask
    found in place, and record which and why on the returned binding."""
    from ._apply import apply_plan

    keep: str | None = None
    keep_policy = False
    message: str | None = None
    if plan.bound:
        node = machine.node(plan.numa_node) if plan.numa_node is not None else None
        existing, decision = for_this_process(
            plan.cpus,
            node.cpus if node is not None else None,
            machine.allowed.cpus,
            enable,
            environ,
        )
        if decision.cpus == "keep":
            why = "NUMABIND=respect" if enable == "respect" else existing.origin
            keep = f"kept CPU mask {fmt(existing.current)} ({why})"
            keep_policy = decision.memory_only_if_default
        message = decision.message
    # a mask judged not to be this process's choice is replaced even where it lies inside
    # the plan (Open MPI's core pin inside the right node still wastes the node's other cores)
    replace = plan.bound and keep is None and message is not None
    binding = apply_plan(
        plan, keep_cpus=keep, keep_policy=keep_policy, rebind_inside=replace, **apply_kwargs
    )
    if message and binding.existing is None:
        binding.existing = message
    return binding
