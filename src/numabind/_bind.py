"""The one way into binding: :func:`bind`, which every entry point calls.

The startup hook, :func:`numabind.apply`, ``@numa_bound``, children started by numabind or
``numabind.torch``, ``numabind run``, the Ray integration: all of them plan, then call
this, which

1. judges the CPU mask already in place (:mod:`numabind._existing`: keep or replace),
2. applies the plan (:mod:`numabind._apply`, under the process-wide lock),
3. in strict mode restores and raises on any failure,
4. registers the process for ``numabind check --all`` (:mod:`numabind._registry`),
5. and records the result as the process's *intended binding*, which the guards read,
   so a guard never restores a mask that a later, legitimate binding replaced.
"""

from __future__ import annotations

import os

from . import _binding, _sysfs
from ._binding import ACTIVE, LOCK, Binding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._plan import Plan
    from ._topology import Machine

fmt = _sysfs.format_cpulist


def bind(
    plan: Plan,
    machine: Machine | None,
    *,
    enable: str = "auto",
    environ: Mapping[str, str] | None = None,
    migrate: bool = True,
    strict: bool = False,
    register: bool = True,
    all_threads: bool = True,
    extra: Mapping[str, str] | None = None,
) -> Binding:
    """Bind this process as ``plan`` says, under the keep/replace rule; returns what was
    done.  ``machine`` gives the GPU node's CPUs and the cgroup's for the rule (None: the
    plan is applied exactly, as with ``NUMABIND=force``).  ``extra`` adds fields to the
    registry entry (the thread settings a rank was given)."""
    env = os.environ if environ is None else environ
    with LOCK:
        keep: str | None = None
        keep_policy = rebind_inside = False
        message: str | None = None
        why: str | None
        if plan.bound:
            # the rule, the kernel layer and the registry load only when there is
            # something to bind: a skip (one node, a bad variable) needs none of them
            from ._apply import apply_plan
            from ._existing import for_this_process

            node = machine.node(plan.numa_node) if machine and plan.numa_node is not None else None
            existing, decision = for_this_process(
                plan.cpus,
                node.cpus if node is not None else None,
                machine.allowed.cpus if machine is not None else frozenset(),
                enable if machine is not None else "force",
                env,
            )
            if decision.action == "keep":
                why = "NUMABIND=respect" if enable == "respect" else existing.origin
                keep = f"kept CPU mask {fmt(existing.current)} ({why})"
                keep_policy = decision.memory_only_if_default
            rebind_inside = decision.rebind_inside
            message = decision.message
            b = apply_plan(
                plan,
                migrate=migrate,
                all_threads=all_threads,
                keep_cpus=keep,
                keep_policy=keep_policy,
                rebind_inside=rebind_inside,
            )
        else:
            b = Binding(plan)  # nothing to apply
        if message and b.existing is None and b.cpus_applied and b.threads_rebound:
            b.existing, b.existing_action = message, "replaced"
        if strict and (not plan.bound or b.errors or b.refused):
            what = "; ".join([*b.errors, *(f"{c} refused" for c in b.refused)])
            b.restore()
            from ._errors import BindingError

            raise BindingError(plan.summary() + (f": {what}" if what else ""))
        if register and plan.bound and not b.errors:
            from . import _registry

            path, why = _registry.register(entry_of(b, extra), env)
            b.registered = path
            if why and _verbose(env):
                b.notes.append(why)
    return b


def _verbose(env: Mapping[str, str]) -> bool:
    return env.get("NUMABIND_VERBOSE", "").strip().lower() in ("1", "true", "yes", "on")


def entry_of(b: Binding, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The registry entry of a binding (what ``numabind check`` compares against)."""
    from . import _registry

    p = b.plan
    pid = os.getpid()
    cpus = b.kept_cpus if b.existing_action == "kept" and b.kept_cpus else p.cpus
    entry = {
        "pid": str(pid),
        "start": _registry.start_time(pid) or "",
        "local_rank": "" if p.local_rank is None else str(p.local_rank),
        "rank_source": p.rank_source or "",
        "local_world_size": "" if p.local_world_size is None else str(p.local_world_size),
        "device": p.device.pci if p.device else "",
        "device_index": "" if p.device_index is None else str(p.device_index),
        "numa_node": "" if p.numa_node is None else str(p.numa_node),
        "cpus": fmt(cpus),
        "memory_policy": b.policy_applied
        or (
            "not-permitted"
            if "set_mempolicy" in b.refused or "get_mempolicy" in b.refused
            else p.memory_policy
        ),
        "memory_nodes": ""
        if b.refused and not b.policy_applied
        else fmt(b.policy_nodes or p.memory_nodes),
        "mode": p.mode,
        "reason": p.reason,
        "threads": "" if p.threads is None else str(p.threads),
    }
    entry.update(extra or {})
    return entry


def intended_cpus() -> frozenset[int] | None:
    """The CPUs this process is meant to run on: those of its latest active binding
    (a kept mask counts as intended), None when numabind has not bound it."""
    with LOCK:
        for b in reversed(ACTIVE):
            if b.cpus_applied:
                return b.plan.cpus
            if b.existing_action == "kept":
                return b.kept_cpus or b.plan.cpus
    return None


def _on_restore(b: Binding) -> None:
    """After a restore the registry describes the binding now on top, or nothing."""
    from . import _registry

    top = next((x for x in reversed(ACTIVE) if x.plan.bound and not x.errors), None)
    if top is None:
        _registry.unregister()
    else:
        _registry.register(entry_of(top))


_binding._after_restore_hooks.append(_on_restore)
