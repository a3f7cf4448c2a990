"""Whose CPU binding is already on this process, and whether to keep it (a pure rule).

Launchers bind by default and know nothing of GPUs: Open MPI pins each rank to a core
(round-robin by socket beyond two ranks, so alternate ranks sit on the wrong socket),
Slurm's task/affinity pins tasks to cores, and a torchrun agent pinned by ``srun -n1``
passes its pin to every worker.  Keeping such a binding is the bug numabind exists to fix.
A user's ``numactl``/``taskset`` wrapper, ``mpirun --bind-to``, Slurm's explicit
``--cpu-bind`` or DeepSpeed's ``--bind_cores_to_rank`` are deliberate choices.

The rule (docs/how-it-works.rst has it as a table):

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
"""

from __future__ import annotations

from . import _sysfs
from ._model import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Literal

    Origin = Literal["none", "launcher", "inherited", "deliberate"]
    Action = Literal["apply", "keep"]

fmt = _sysfs.format_cpulist


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
        return Decision(action="apply")  # nothing in place, or already the plan
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
