"""The startup hook: bind a rank process before any user import.

``_numabind_hook.pth`` decides with one dictionary test whether a trigger variable is
present; only then does it call ``_numabind_start.start()``, the one start path of all
three hook forms (the ``.pth`` line, PEP 829's ``.start`` file and the ``sitecustomize``
form), which checks ``NUMABIND=0`` before importing anything of numabind and then calls
:func:`run`.  Rules for this path:

* cheap: no ``dataclasses``, ``json``, ``typing``, ``re``, ``logging``, ``warnings`` or
  ``threading`` (``-X importtime`` guards it in the tests); ctypes only once a plan says
  to bind; a rank with nothing to bind loads at most 10 numabind modules, a bound DGX
  rank 15 (tests/test_startup.py counts them);
* idempotent: a venv processes each .pth twice (CPython #75723), so a module global
  stops a second run, and an environment record lets children that inherited the same
  binding skip the work;
* never break the interpreter: every failure becomes at most one ``numabind: ...`` line on
  stderr (:mod:`numabind._output`); ``NUMABIND_STRICT=1`` turns that line into exit status
  1 before user code.

A bound rank arms the guards (:func:`numabind._guard.arm`), which cost nothing until the
first import of torch, numpy or torch's c10d.
"""

from __future__ import annotations

import os
import sys

from ._output import say

STATE_VARIABLE = "NUMABIND_STATE"
_done = False
# what the hook's full path saw (its configuration, the machine it planned from), for the
# answer numabind._replay keeps
_seen: dict[str, object] = {}
# what the hook did in this process (numabind show, numabind run read it): set by the full
# path below; where the start module's fast path bound the process, made from what it
# recorded on first read (module __getattr__)
last: Binding | None

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._apply import Binding
    from ._environ import Config, RankInfo


# what was set and is not used (a knob's typo, a sysroot refused): it leads the one line
# the hook says, or is that line (the rules allow one; the typo must not be its last bracket)
_pending: list[str] = []


def _lead(message: str) -> str:
    """``message`` with what is pending before it, said once."""
    text = "; ".join([*_pending, message])
    _pending.clear()
    return text


def _fail(message: str, strict: bool) -> None:
    say(_lead(message))
    if strict:
        say("NUMABIND_STRICT is set: exiting before user code")
        try:
            sys.stdout.flush()
        except Exception:
            pass
        os._exit(1)


def state_key(
    info: RankInfo, environ: Mapping[str, str], mode: str, memory: str, roles: str = ""
) -> str:
    """What a binding depends on.  A child whose key matches the recorded one inherited
    exactly this binding and need not redo it; any other key plans afresh."""
    from ._model import VISIBILITY_VARIABLES

    visible = ",".join(
        f"{v}={environ[v][:200]}" for v in VISIBILITY_VARIABLES if v in environ
    ).replace("#", "")
    return f"{info.rank_source}={info.local_rank}|{visible}|{mode}|{memory}{roles}"


def roles_key(cfg: Config) -> str:
    """The part of the state key NUMABIND_RESERVE / NUMABIND_SMT / NUMABIND_SPILL /
    NUMABIND_DEVICES / NUMABIND_NIC add
    (empty by default, so that keys recorded by an older numabind still match)."""
    key = "" if not cfg.reserve and cfg.smt == "all" else f"|reserve={cfg.reserve}|smt={cfg.smt}"
    key += f"|priority={cfg.priority}" if cfg.priority != "off" else ""
    key += f"|spill={cfg.spill}" if str(cfg.spill) != "cpu" else ""
    key += f"|devices={cfg.devices[:200]}" if cfg.devices else ""
    return key + (f"|nic={cfg.nic}|{cfg.nic_mode}|{cfg.nic_min_rate}" if cfg.nic else "")


def record_state(binding: Binding, info: RankInfo, mode: str, memory: str, roles: str = "") -> None:
    """Record in the environment what was done, so that children with the same key (same
    rank, same visible devices, same mode) inherit instead of planning again."""
    key = state_key(info, os.environ, mode, memory, roles)
    os.environ[STATE_VARIABLE] = f"{key}#{binding.plan.status}"
    if binding.main_thread is None:
        os.environ.pop("NUMABIND_MAIN_CPUS", None)  # a parent's pinned core is not this one's


def __getattr__(name: str) -> object:
    if name == "last":
        from ._apply import adopted

        return adopted()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _decided_fast() -> bool:
    """Whether the start module replayed this process's answer (bound it, or found it
    has nothing to bind): then the hook has nothing left to do."""
    start = sys.modules.get("_numabind_start")
    return bool(start is not None and getattr(start, "_done", None)) and not getattr(
        start, "handed_over", "x"
    )


def run(environ: Mapping[str, str] | None = None) -> Binding | None:
    """Plan and bind this process if it is a rank.  Returns the binding (for tests).

    Run by the hook (``environ`` None), it reads ``os.environ`` through a recorder, and
    writes what it read and did as an answer the warm start replays next time
    (numabind._replay)."""
    global _done
    if _done or (environ is None and _decided_fast()):
        return None
    _done = True
    import _numabind_base

    off = _numabind_base.cache_off(os.environ)
    if environ is not None or off:
        return _guarded(os.environ if environ is None else environ)
    from . import _output, _replay

    real = os.environ
    rec = _replay.Recorder(real)
    start_mask = frozenset(os.sched_getaffinity(0))
    said = _output.said
    # every read of the hook's path is seen, os.environ's own and every module's alike
    os.environ = rec  # type: ignore[assignment]  # noqa: B003
    try:
        binding = _guarded(rec)
    finally:
        os.environ = real  # noqa: B003
    try:
        _replay.keep(rec, binding, start_mask, _output.said - said, _seen)
    except Exception:
        pass  # an answer not kept is planned again next time: nothing to say
    return binding


def _guarded(env: Mapping[str, str]) -> Binding | None:
    from ._environ import TRUE

    # known before the configuration is read, so that a failure to read it obeys it too
    strict = env.get("NUMABIND_STRICT", "").strip().lower() in TRUE
    try:
        return _run(env, strict)
    except Exception as err:  # the hook must never break an interpreter
        _fail(
            f"startup hook failed ({type(err).__name__}: {err}); this process runs unbound", strict
        )
        return None


def _run(env: Mapping[str, str], strict: bool) -> Binding | None:
    from ._environ import Config, detect

    try:
        cfg = Config.from_env(env)
    except ValueError as err:  # a ConfigError (its module loads only when one is raised)
        _fail(f"{err}; numabind left this process unbound", strict)
        return None
    if cfg.disabled:
        return None
    _seen["cfg"] = cfg
    if cfg.torch:
        from .torch import install_when_imported

        install_when_imported()
    if cfg.ray:
        from .ray import install_when_imported as ray_when_imported

        ray_when_imported()
    info = detect(env, getattr(sys, "orig_argv", None))
    _pending[:] = cfg.warnings  # said first in the line, or alone (_lead, below)
    cfg = cfg.replace(warnings=())
    try:
        return _bind_found(info, env, cfg)
    finally:
        if _pending:  # no line carried it: it is the line
            say("; ".join(_pending))
            _pending.clear()


def _bind_found(info: RankInfo, env: Mapping[str, str], cfg: Config) -> Binding | None:
    """The hook's work once the configuration is read: a launcher, an inherited binding,
    or a rank to plan and bind."""
    if info.launcher is not None:
        if cfg.verbose:
            say(
                _lead(
                    f"{info.launcher} is a launcher, not a rank: not bound (its workers bind "
                    "themselves)"
                )
            )
        return None
    if info.local_rank is None and info.problem is None and not cfg.devices:
        return None
    key = state_key(info, env, cfg.mode, cfg.memory, roles_key(cfg))
    recorded, _, status = cfg.state.rpartition("#")
    if recorded == key:
        # the parent planned exactly this (and said so): a binding is inherited, a skip
        # would be the same skip
        lines: list[str] = []
        if cfg.priority == "main" and status == "bound" and cfg.main_cpus:
            from ._handback import inherited

            inherited(cfg.main_cpus)  # started by the pinned thread: the whole set back
        if cfg.omp_places != "off" and status == "bound":
            from ._guard import arm_places

            arm_places()  # this interpreter loads its own OpenMP runtime: keep its importer
        if cfg.verbose and status == "bound":
            lines.insert(
                0, f"local rank {info.local_rank}: binding inherited from the parent process"
            )
        if lines:
            say(_lead("; ".join(lines)))
        return None
    return bind_rank(info, env, cfg)


def bind_rank(info: RankInfo, env: Mapping[str, str], cfg: Config) -> Binding:
    """Plan and bind a rank found in the environment (the hook's work after its checks),
    from the node's cached machine where there is one (numabind._cache)."""
    from ._apply import enter
    from ._plan import nothing_to_bind, plan, request_from, with_devices
    from ._topology import Machine

    global last
    opened = None
    if cfg.cache:
        from ._cache import open_machine, origin_of

        opened = open_machine(cfg.sysroot, env)
        machine, origin = opened.machine, opened.origin
    else:
        machine, origin = Machine.from_root(cfg.sysroot), "sysfs (NUMABIND_CACHE=0)"
    _seen["machine"] = machine
    try:
        visible = None
        # a one-node machine has nothing to bind, but a rank that asks for NICs still
        # needs its device (and a rank that does not never reads an adapter)
        nothing = nothing_to_bind(machine, cfg.mode, cfg.memory, cfg.spill, cfg.priority)
        # a device list is checked on any machine: a typo is said on a one-node one too
        named = cfg.devices not in ("", "all")
        if info.problem is None and (cfg.nic or named or not nothing):
            from ._devices import LazyNvml, resolve

            visible = resolve(machine, env, LazyNvml())
        request = request_from(info, visible, cfg)
        if cfg.devices and visible is not None and request.problem is None:
            request = with_devices(request, machine, cfg.devices, "NUMABIND_DEVICES")
        p = plan(machine, request.replace(budget=cfg.threads != "off"))
        if opened is not None:
            origin = origin_of(opened)  # what planning had to read beside the file
        # strict mode here is an exit before user code, after the binding's own line
        binding = enter(
            p,
            machine,
            cfg,
            environ=env,
            strict=False,
            threads="env",
            report=False,
            machine_origin=origin,
        )
    finally:
        machine.close()  # a cached machine writes back what planning had to read
    if cfg.debug:  # numabind's own notes: for a bug report, not for the user (NUMABIND_DEBUG)
        binding.notes.append(f"machine: {origin}")
        start = sys.modules.get("_numabind_start")
        fell = getattr(start, "handed_over", "")
        if fell:
            binding.notes.append(f"planned by the full path: {fell}")
    record_state(binding, info, cfg.mode, cfg.memory, roles_key(cfg))
    last = binding
    if binding.failed or (cfg.strict and binding.refused):
        _fail(str(binding), cfg.strict)
    elif binding.worth_a_line(cfg.verbose):
        say(_lead(str(binding)))  # Binding.report's rule, what is pending first
    if cfg.report:  # bound or not: the report says where the rank is either way
        from .check._report import arm as arm_report

        arm_report()
    return binding


def sitecustomize_dir() -> str:
    """The directory to put on PYTHONPATH for the sitecustomize form of the hook."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
