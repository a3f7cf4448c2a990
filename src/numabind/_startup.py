"""The startup hook: bind a rank process before any user import.

``_numabind_hook.pth`` decides with one dictionary test whether a trigger variable is
present; only then does it import this module and call :func:`run` (the PEP 829 entry and
the ``sitecustomize`` form, which run in every interpreter, go through the same check in
``_numabind_start`` first).  Rules for this path:

* cheap: no ``dataclasses``, ``json``, ``typing``, ``re``, ``logging``, ``warnings`` or
  ``threading`` (``-X importtime`` guards it in the tests); ctypes only once a plan says
  to bind;
* idempotent: a venv processes each .pth twice (CPython #75723), so a module global
  stops a second run, and an environment record lets children that inherited the same
  binding skip the work;
* never break the interpreter: every failure becomes at most one ``numabind: ...`` line on
  stderr (:mod:`numabind._output`); ``NUMABIND_STRICT=1`` turns that line into exit status
  1 before user code.
"""

from __future__ import annotations

import os
import sys

from ._output import report, say

STATE_VARIABLE = "NUMABIND_STATE"
_done = False
last: Binding | None = None  # what the hook did in this process (numabind show reports it)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from types import ModuleType

    from ._binding import Binding
    from ._config import Config
    from ._ranks import RankInfo


def _fail(message: str, strict: bool) -> None:
    say(message)
    if strict:
        say("NUMABIND_STRICT is set: exiting before user code")
        try:
            sys.stdout.flush()
        except Exception:
            pass
        os._exit(1)


def state_key(info: RankInfo, environ: Mapping[str, str], mode: str, memory: str) -> str:
    """What a binding depends on.  A child whose key matches the recorded one inherited
    exactly this binding and need not redo it; any other key plans afresh."""
    from ._vendors import VISIBILITY_VARIABLES

    visible = ",".join(
        f"{v}={environ[v][:200]}" for v in VISIBILITY_VARIABLES if v in environ
    ).replace("#", "")
    return f"{info.rank_source}={info.local_rank}|{visible}|{mode}|{memory}"


def record_state(binding: Binding, info: RankInfo, mode: str, memory: str) -> None:
    """Record in the environment what was done, so that children with the same key (same
    rank, same visible devices, same mode) inherit instead of planning again."""
    key = state_key(info, os.environ, mode, memory)
    os.environ[STATE_VARIABLE] = f"{key}#{binding.plan.status}"


def run(environ: Mapping[str, str] | None = None) -> Binding | None:
    """Plan and bind this process if it is a rank.  Returns the binding (for tests)."""
    global _done
    if _done:
        return None
    _done = True
    env = os.environ if environ is None else environ
    strict = env.get("NUMABIND_STRICT", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        return _run(env, strict)
    except Exception as err:  # the hook must never break an interpreter
        _fail(
            f"startup hook failed ({type(err).__name__}: {err}); this process runs unbound", strict
        )
        return None


def _truthy(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _run(env: Mapping[str, str], strict: bool) -> Binding | None:
    from ._config import config_from_env

    try:
        cfg = config_from_env(env)
    except ValueError as err:  # a ConfigError (its module loads only when one is raised)
        _fail(f"{err}; numabind left this process unbound", strict)
        return None
    if cfg.disabled:
        return None
    if _truthy(env, "NUMABIND_TORCH"):
        from .torch import install_when_imported

        install_when_imported()
    if _truthy(env, "NUMABIND_RAY"):
        from .ray import install_when_imported as ray_when_imported

        ray_when_imported()
    from ._ranks import detect

    info = detect(env, getattr(sys, "orig_argv", None))
    if cfg.warnings and not (
        info.launcher is None and (info.local_rank is not None or info.problem)
    ):
        say("; ".join(cfg.warnings))  # no binding line to carry them
    if info.launcher is not None:
        if cfg.verbose:
            say(
                f"{info.launcher} is a launcher, not a rank: not bound (its workers bind "
                "themselves)"
            )
        return None
    if info.local_rank is None and info.problem is None:
        return None
    key = state_key(info, env, cfg.mode, cfg.memory)
    recorded = env.get(STATE_VARIABLE, "")
    if recorded.rsplit("#", 1)[0] == key:
        if cfg.verbose or cfg.warnings:
            say(
                "; ".join(
                    [
                        f"local rank {info.local_rank}: binding inherited from the parent process",
                        *cfg.warnings,
                    ]
                )
            )
        return None
    return bind_rank(info, env, cfg, strict)


def bind_rank(info: RankInfo, env: Mapping[str, str], cfg: Config, strict: bool) -> Binding:
    """Plan and bind a rank found in the environment (the hook's work after its checks)."""
    from ._bind import bind
    from ._config import sysroot
    from ._plan import nothing_to_bind, plan, request_for
    from ._topology import Machine

    machine = Machine.from_root(sysroot(env))
    try:
        visible = None
        if info.problem is None and not nothing_to_bind(machine, cfg.mode):
            from ._devices import LazyNvml, resolve

            visible = resolve(machine, env, LazyNvml())
        p = plan(machine, request_for(info, visible, cfg.mode, cfg.memory))
        threads = None
        if p.bound and cfg.threads != "off":
            from ._threads import apply_env

            threads = apply_env(p, cfg.threads, env)
        binding = bind(
            p,
            machine,
            enable=cfg.enable,
            environ=env,
            migrate=True,
            strict=False,
            extra=threads.registry_fields() if threads is not None else None,
        )
    finally:
        machine.close()
    record_state(binding, info, cfg.mode, cfg.memory)
    global last
    last = binding
    binding.warnings.extend(cfg.warnings)  # said with the binding's line, not beside it
    if threads is not None:
        binding.notes.extend(threads.notes(cfg.verbose))
        if threads.affinity_warning:
            binding.warnings.append(threads.affinity_warning)
    if binding.failed or (strict and binding.refused):
        _fail(str(binding), strict)
    else:
        report(binding, cfg.verbose)
    if cfg.guard and p.bound and not binding.errors:
        arm_guard()
    return binding


def arm_guard() -> None:
    """Arm the guards (numabind._guard) for the first import of torch, numpy and torch's
    c10d; the guard's own module is imported only when one of them is."""
    from ._importhook import after_import

    def guard(what: str) -> Callable[[ModuleType], None]:
        def run(module: ModuleType) -> None:
            from . import _guard

            if what == "c10d":
                _guard.guard_c10d(module)
            else:
                _guard.check(f"import {what}")

        return run

    for name in ("torch", "numpy"):
        after_import(name, guard(name))
    after_import("torch.distributed.distributed_c10d", guard("c10d"))


def sitecustomize_dir() -> str:
    """The directory to put on PYTHONPATH for the sitecustomize form of the hook."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
