"""Ray integration: a worker is bound when Ray assigns it accelerators.

Ray starts its workers before it knows which GPU they get, so they have no local rank and
the startup hook leaves them alone.  Ray then, in the worker, calls
``ray._private.utils.set_visible_accelerator_ids()`` right before running an actor's
``__init__`` or a task's body (``_raylet.pyx``: for normal and actor-creation tasks, not
for actor method calls), and ``reset_visible_accelerator_env_vars()`` after a normal task,
since its worker may be reused.  numabind wraps both:

* after Ray set the visible devices, the worker is bound (late: every thread's CPUs, the
  calling thread's memory policy, which is the thread Ray runs the task on, migration) to
  the node of the GPU it was given; several GPUs on one node: that node; GPUs spread over
  nodes: said, not bound;
* after a normal task, the worker goes back to its original mask, so a reused worker is
  bound afresh for its next GPU.  An actor keeps its binding for its lifetime.

With ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` Ray does not set the variable but
still knows the ids (``get_accelerator_ids()``): numabind binds from the ids.

Turn it on with ``NUMABIND_RAY=1`` in the workers' environment, or call :func:`install`
in them (e.g. at the top of an actor's module).  Workers inherit ``NUMABIND_RAY`` from the
driver only when ``ray.init()`` starts a local cluster; on a cluster started with
``ray start`` or KubeRay, put it in that environment or in ``runtime_env={"env_vars":
{"NUMABIND_RAY": "1"}}``.  :func:`install` checks Ray's internals and raises
:class:`RayIntegrationError` naming the one that changed: never a silent no-op.
"""

from __future__ import annotations

import os

from ._errors import IntegrationError
from ._output import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from ._apply import Binding

TESTED_RAY = ("2.60",)  # major.minor versions whose internals the tests run against
_state: dict[str, Any] = {}


class RayIntegrationError(IntegrationError):
    """Ray changed an internal numabind.ray relies on."""


def _check(utils: Any) -> None:
    import inspect

    problems = []
    for name, params in (
        ("set_visible_accelerator_ids", []),
        ("reset_visible_accelerator_env_vars", ["original_visible_accelerator_env_vars"]),
    ):
        fn = getattr(utils, name, None)
        if not callable(fn):
            problems.append(f"ray._private.utils.{name} is gone")
            continue
        try:
            got = list(inspect.signature(getattr(fn, "__wrapped__", fn)).parameters)
        except (TypeError, ValueError):
            continue
        if len(got) != len(params):
            problems.append(f"ray._private.utils.{name} now takes {got} (expected {params})")
    try:
        import ray
    except ImportError as err:
        raise RayIntegrationError(f"numabind.ray needs ray: {err}") from err
    context = getattr(ray, "get_runtime_context", None)
    if not callable(context):
        problems.append("ray.get_runtime_context is gone")
    if problems:
        raise RayIntegrationError(
            f"numabind.ray cannot hook ray {getattr(ray, '__version__', '?')} (tested: "
            f"{', '.join(TESTED_RAY)}): " + "; ".join(problems)
        )


def _assigned() -> tuple[str | None, list[str]]:
    """(the visibility variable of Ray's GPU accelerator manager, the GPU ids given)."""
    import ray

    ids = ray.get_runtime_context().get_accelerator_ids().get("GPU") or []
    var = None
    try:
        from ray._private.accelerators import get_accelerator_manager_for_resource

        manager: Any = get_accelerator_manager_for_resource("GPU")
        var = manager.get_visible_accelerator_ids_env_var()
    except Exception:
        var = "CUDA_VISIBLE_DEVICES"
    return var, [str(i) for i in ids]


def bind_assigned(var: str | None, ids: list[str], environ: Mapping[str, str]) -> Binding | None:
    """Bind this worker to the node of the GPUs Ray gave it (see the module docstring).
    Returns the binding, or None when there is nothing to bind."""
    if not ids:
        return None
    from ._api import bind
    from ._devices import resolve
    from ._environ import Config
    from ._plan import device_node
    from ._topology import Machine

    env = dict(environ)
    env[var or "CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    machine = Machine.from_root(Config.from_env(environ).sysroot)
    try:
        visible = resolve(machine, env)
        nodes = {device_node(machine, d).node for d in visible.devices}
    finally:
        machine.close()
    if visible.problem is None and (len(nodes) != 1 or None in nodes):
        say(
            f"Ray assigned GPUs {','.join(ids)}, on nodes "
            f"{sorted(n for n in nodes if n is not None)} (or unknown): not bound"
        )
        return None
    if not visible.devices:
        say(f"Ray assigned GPUs {','.join(ids)}: {visible.problem or visible.source}; not bound")
        return None
    return bind(device=visible.devices[0], migrate=True, source=f"Ray-assigned GPU {','.join(ids)}")


def _after_set_visible() -> None:
    var, ids = _assigned()
    key = (var, tuple(ids))
    current: Binding | None = _state.get("binding")
    if current is not None and current.active and _state.get("key") == key:
        return  # the same GPUs again (an actor's later task): nothing to do
    binding = bind_assigned(var, ids, os.environ)
    _state["binding"], _state["key"] = binding, key


def _after_reset() -> None:
    binding: Binding | None = _state.pop("binding", None)
    _state.pop("key", None)
    if binding is not None and binding.active:
        try:
            binding.restore()  # back to the worker's original mask, for its next task
        except Exception as err:
            say(f"Ray worker: could not restore its mask after the task ({err})")


def install() -> None:
    """Bind Ray workers when Ray assigns them GPUs.  Idempotent; raises
    :class:`RayIntegrationError` when Ray's internals are not the ones tested."""
    import functools
    import importlib

    from ._errors import require

    require("ray", "Ray", "pip install 'ray[default]'", "numabind.ray.install()")
    utils: Any = importlib.import_module("ray._private.utils")
    if getattr(utils.set_visible_accelerator_ids, "_numabind", False):
        return
    _check(utils)
    set_visible = utils.set_visible_accelerator_ids
    reset_visible = utils.reset_visible_accelerator_env_vars

    @functools.wraps(set_visible)
    def set_visible_accelerator_ids() -> Any:
        original = set_visible()
        try:
            _after_set_visible()
        except Exception as err:  # numabind must never fail a Ray task
            say(f"Ray worker: binding failed ({type(err).__name__}: {err}); left unbound")
        return original

    @functools.wraps(reset_visible)
    def reset_visible_accelerator_env_vars(original_visible_accelerator_env_vars: Any) -> Any:
        result = reset_visible(original_visible_accelerator_env_vars)
        _after_reset()
        return result

    set_visible_accelerator_ids._numabind = True  # type: ignore[attr-defined]
    utils.set_visible_accelerator_ids = set_visible_accelerator_ids
    utils.reset_visible_accelerator_env_vars = reset_visible_accelerator_env_vars
    _state["installed"] = (utils, set_visible, reset_visible)


def uninstall() -> None:
    """Undo :func:`install`."""
    installed = _state.pop("installed", None)
    if installed is not None:
        utils, set_visible, reset_visible = installed
        utils.set_visible_accelerator_ids = set_visible
        utils.reset_visible_accelerator_env_vars = reset_visible


def install_when_imported() -> None:
    """``NUMABIND_RAY=1``: install as soon as Ray is imported (the whole package: its
    ``__init__`` imports the worker utilities half-way through), without importing Ray
    here (the startup hook calls this in every process that has the switch)."""
    from ._guard import after_import

    def hook(module: Any) -> None:
        try:
            install()
        except RayIntegrationError as err:
            say(str(err))

    after_import("ray", hook)
