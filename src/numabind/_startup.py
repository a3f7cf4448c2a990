"""The startup hook: bind a rank process before any user import.

``_numabind_hook.pth`` decides with ``os.environ`` alone whether a local-rank variable is
present; only then is this module imported and :func:`run` called.  Rules for this path:

* cheap: no ``dataclasses``, ``json``, ``typing``, ``re``, ``logging`` or ``warnings``
  (``-X importtime`` guards it in the tests); ctypes only once a plan says to bind;
* idempotent: a venv processes each .pth twice (CPython #75723), so a module global
  stops a second run, and an environment record lets children that inherited the same
  binding skip the work;
* never break the interpreter: every failure becomes at most one ``numabind: ...`` line on
  stderr; ``NUMABIND_STRICT=1`` turns that line into exit status 1 before user code.
"""

from __future__ import annotations

import os
import sys

STATE_VARIABLE = "NUMABIND_STATE"
_done = False
last: Binding | None = None  # what the hook did in this process (numabind show reports it)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._apply import Binding
    from ._ranks import RankInfo


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"numabind: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


def _fail(message: str, strict: bool) -> None:
    _say(message)
    if strict:
        _say("NUMABIND_STRICT is set: exiting before user code")
        try:
            sys.stdout.flush()
        except Exception:
            pass
        os._exit(1)


def state_key(info: RankInfo, environ: Mapping[str, str], mode: str, memory: str) -> str:
    """What a binding depends on.  A child whose key matches the recorded one inherited
    exactly this binding and need not redo it; any other key plans afresh."""
    from ._devices import VISIBILITY_VARIABLES

    visible = ",".join(f"{v}={environ[v]}" for v, _ in VISIBILITY_VARIABLES if v in environ)
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


def _run(env: Mapping[str, str], strict: bool) -> Binding | None:
    from ._config import config_from_env

    try:
        cfg = config_from_env(env)
    except ValueError as err:
        _fail(f"{err}; numabind left this process unbound", strict)
        return None
    if cfg.disabled:
        return None
    if env.get("NUMABIND_TORCH", "").strip().lower() in ("1", "true", "yes", "on"):
        from .torch import install_when_imported

        install_when_imported()
    from ._ranks import detect

    info = detect(env, getattr(sys, "orig_argv", None))
    if info.launcher is not None:
        if cfg.verbose:
            _say(
                f"{info.launcher} is a launcher, not a rank: not bound "
                "(its workers bind themselves)"
            )
        return None
    if info.local_rank is None and info.problem is None:
        return None
    key = state_key(info, env, cfg.mode, cfg.memory)
    recorded = env.get(STATE_VARIABLE, "")
    if recorded.rsplit("#", 1)[0] == key:
        if cfg.verbose:
            _say(f"local rank {info.local_rank}: binding inherited from the parent process")
        return None
    from ._plan import plan, request_for
    from ._topology import Machine

    machine = Machine.from_root(env.get("NUMABIND_SYSROOT", "/"))
    visible = None
    if info.problem is None and not (
        cfg.mode in ("node", "socket") and len(machine.cpu_nodes) <= 1
    ):
        from ._devices import LazyNvml, resolve

        visible = resolve(machine, env, LazyNvml())
    request = request_for(info, visible, cfg.mode, cfg.memory)
    p = plan(machine, request)
    if (
        p.bound
        and cfg.enable != "force"
        and not machine.allowed.cpus <= frozenset(os.sched_getaffinity(0))
    ):
        # a mask narrower than the cgroup allows: whose is it? (_existing has the rule)
        from ._existing import bind

        binding = bind(p, machine, cfg.enable, env, migrate=True, strict=False)
    else:
        from ._apply import apply_plan

        binding = apply_plan(p, migrate=True, strict=False)
    record_state(binding, info, cfg.mode, cfg.memory)
    global last
    last = binding
    if binding.failed:
        _fail(str(binding), strict)
    elif binding.worth_a_line(cfg.verbose):
        _say(str(binding))
    if cfg.guard and p.bound and not binding.errors:
        _install_guard(p.cpus if binding.cpus_applied else frozenset(os.sched_getaffinity(0)))
    return binding


def _install_guard(expected: frozenset[int]) -> None:
    """Arm the guard (numabind._guard) for the first import of torch or numpy; the guard's
    own module is imported only if one of them is."""
    from ._importhook import after_import

    def check(module: object) -> None:
        from ._guard import check

        check(f"import {getattr(module, '__name__', '?')}", expected)

    for name in ("torch", "numpy"):
        after_import(name, check)


def sitecustomize_dir() -> str:
    """The directory to put on PYTHONPATH for the sitecustomize form of the hook."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
