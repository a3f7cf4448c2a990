"""The Python API: :func:`apply`, :func:`numa_bound`, :func:`current`, :func:`plan_for`.

These are for processes the startup hook could not bind at their first instruction:
Callable entrypoints whose rank arrives as an argument, engine workers that learn their
GPU late (``apply(device=...)`` is the stable call for them), and code that wants to bind
late or temporarily.  Late binding rebinds every thread's CPU mask and migrates the private
pages already placed on the wrong node, but the memory policy can only be set for the
calling thread (see :mod:`numabind._apply`).

Arguments are checked before anything happens: a bad one raises ``TypeError`` or
:class:`~numabind.ConfigError` (a ``ValueError``) that names it and lists what is accepted.
"""

from __future__ import annotations

import functools
import os
import sys

from . import _kernel
from ._apply import Binding, enter
from ._devices import find_device, resolve
from ._environ import MAX_LOCAL, Config, RankInfo, detect, parse_reserve
from ._errors import ConfigError
from ._kernel import locality, pages_per_node, private_anon_regions
from ._model import MODE_NAMES, SMT_LEVELS, USER_POLICIES, Record
from ._plan import Plan, plan, request_for
from ._topology import Machine

MEMORY_POLICIES = USER_POLICIES

TYPE_CHECKING = False
if not TYPE_CHECKING:  # typing.overload without importing typing (~4 ms) at run time

    def overload(f):
        return f


if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, TypeVar, overload

    from ._model import Accelerator

    F = TypeVar("F", bound="Callable[..., Any]")


def _check_count(name: str, value: object, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, not {type(value).__name__} {value!r}")
    if not minimum <= value < MAX_LOCAL:
        raise ConfigError(f"{name} must be in {minimum}..{MAX_LOCAL - 1}, not {value}")
    return value


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str or None, not {type(value).__name__} {value!r}")
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}")
    return value


def _check_reserve(value: object) -> str | None:
    """``reserve=2``, ``"2/node"`` or ``"1/rank"`` as NUMABIND_RESERVE (0: none)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"reserve must be an int, a str or None, not {type(value).__name__}")
    if isinstance(value, int) and not 0 <= value < 1 << 16:
        raise ConfigError(f"reserve must be a core count of 0 or more, not {value}")
    return parse_reserve(str(value), "reserve")


def _check_smt(value: object) -> str | None:
    """``smt=1`` (or ``"1"``) or ``"all"`` as NUMABIND_SMT."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value != 1:
            raise ConfigError(f"smt={value!r} is not one of 1, 'all'")
        return "1"
    return _check_choice("smt", value, SMT_LEVELS)


def _check_device(device: object) -> int | str | None:
    if device is None or isinstance(device, str):
        if isinstance(device, str) and (not device.strip() or len(device) > 128):
            raise ConfigError(f"device={device!r} is not an index, PCI address or UUID")
        return device
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError(
            f"device must be an index, a PCI address or a UUID string, not "
            f"{type(device).__name__} {device!r}"
        )
    if not 0 <= device < 4096:
        raise ConfigError(f"device index must be in 0..4095, not {device}")
    return device


def plan_for(
    local_rank: int | None = None,
    *,
    device: int | str | None = None,
    mode: str | None = None,
    memory: str | None = None,
    local_world_size: int | None = None,
    machine: Machine | None = None,
    environ: Mapping[str, str] | None = None,
    reserve: int | str | None = None,
    smt: int | str | None = None,
) -> Plan:
    """The plan :func:`apply` would apply, without applying it.

    ``local_rank`` picks the device among the visible ones (rank modulo their count);
    ``device`` names the device instead: an index into the visible devices, a PCI address
    (``0000:3b:00.0``, NVML's ``00000000:3B:00.0`` too) or a ``GPU-`` UUID (a unique
    prefix is enough).  ``mode`` and ``memory`` are as NUMABIND_MODE / NUMABIND_MEMORY;
    ``local_world_size`` tells exclusive/core-complex modes how many ranks share a node.
    ``reserve`` (``2``, ``"2/node"``, ``"1/rank"``) and ``smt`` (``1`` or ``"all"``) are as
    NUMABIND_RESERVE / NUMABIND_SMT: cores kept out of the compute set for helpers, and
    one hardware thread per core.  ``machine`` plans on another machine (default: this
    one, or NUMABIND_SYSROOT).
    Arguments left None come from the environment (``environ``, default ``os.environ``).
    Bad arguments raise ``TypeError`` or :class:`~numabind.ConfigError`.
    """
    local_rank = _check_count("local_rank", local_rank, 0)
    local_world_size = _check_count("local_world_size", local_world_size, 1)
    device = _check_device(device)
    mode = _check_choice("mode", mode, MODE_NAMES)
    memory = _check_choice("memory", memory, MEMORY_POLICIES)
    roles = (_check_reserve(reserve), _check_smt(smt))
    env = os.environ if environ is None else environ
    cfg = Config.from_env(env)
    m = machine if machine is not None else Machine.from_root(cfg.sysroot)
    return _plan(m, env, cfg, local_rank, device, mode, memory, local_world_size, roles=roles)


def _plan(
    m: Machine,
    env: Mapping[str, str],
    cfg: Config,
    local_rank: int | None,
    device: int | str | Accelerator | None,
    mode: str | None,
    memory: str | None,
    local_world_size: int | None,
    source: str = "device argument",
    roles: tuple[str | None, str | None] = (None, None),
) -> Plan:
    """The plan of an API call: arguments left None come from ``cfg``; ``roles`` is
    (reserve, smt), each None for the configuration's."""
    if local_rank is not None:
        found = detect(env)
        size = local_world_size if local_world_size is not None else found.local_world_size
        info = RankInfo(
            local_rank=local_rank,
            local_world_size=size if size is None or local_rank < size else None,
            rank_source="argument",
            size_source="argument" if local_world_size else found.size_source,
        )
    else:
        info = detect(env, getattr(sys, "orig_argv", None))
        if local_world_size is not None:
            info = info.replace(local_world_size=local_world_size, size_source="argument")
    visible = resolve(m, env)
    chosen: Accelerator | None = None
    if device is not None:
        if isinstance(device, (int, str)):
            chosen, why = find_device(device, visible, m)
            if chosen is None:
                visible = visible.replace(devices=(), problem=why)
        else:
            chosen = device
        if info.local_rank is None:  # the device was named: say by whom, found or not
            info = RankInfo(rank_source=source)
    reserve, smt = roles
    request = request_for(
        info,
        visible,
        mode or cfg.mode,
        memory or cfg.memory,
        reserve=cfg.reserve if reserve is None else reserve,
        smt=smt or cfg.smt,
    )
    return plan(m, request.replace(device=chosen))


def apply(
    local_rank: int | None = None,
    *,
    device: int | str | None = None,
    mode: str | None = None,
    memory: str | None = None,
    migrate: bool = True,
    strict: bool | None = None,
    local_world_size: int | None = None,
    reserve: int | str | None = None,
    smt: int | str | None = None,
) -> Binding:
    """Plan and apply this process's binding now; returns what was done.

    The stable call for a framework's worker that learns its GPU late:

    .. example: run on two-nodes

    ::

        import numabind

        def worker(local_rank: int) -> None:
            binding = numabind.apply(device=local_rank)  # or a PCI address / UUID
            print(binding)             # then torch.cuda.set_device(local_rank)

        worker(1)

    ``local_rank``, ``device``, ``mode``, ``memory``, ``local_world_size``, ``reserve`` and
    ``smt`` choose the plan as in :func:`plan_for`.  Every thread's CPU mask is rebound
    (threads already inside the plan are kept); the memory policy is set for the *calling
    thread* and what it starts afterwards; with ``migrate`` (default True) the private
    anonymous pages already on other nodes are moved.  The result prints as one line,
    says what was skipped and why, and restores the previous state with ``restore()`` or
    as a context manager (bindings nest; see :class:`Binding`).  ``strict`` (default:
    NUMABIND_STRICT) raises :class:`~numabind.BindingError` instead of recording
    failures.  Thread-safe: concurrent calls are serialised.
    """
    if not isinstance(migrate, bool):
        raise TypeError(f"migrate must be a bool, not {type(migrate).__name__}")
    if strict is not None and not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool or None, not {type(strict).__name__}")
    return bind(
        local_rank,
        device=_check_device(device),
        mode=_check_choice("mode", mode, MODE_NAMES),
        memory=_check_choice("memory", memory, MEMORY_POLICIES),
        migrate=migrate,
        strict=strict,
        local_world_size=_check_count("local_world_size", local_world_size, 1),
        report=False,
        roles=(_check_reserve(reserve), _check_smt(smt)),
    )


def bind(
    local_rank: int | None = None,
    *,
    device: int | str | Accelerator | None = None,
    mode: str | None = None,
    memory: str | None = None,
    migrate: bool = True,
    strict: bool | None = None,
    local_world_size: int | None = None,
    threads: str | None = "runtime",
    report: bool = True,
    prefix: str = "",
    source: str = "device argument",
    roles: tuple[str | None, str | None] = (None, None),
) -> Binding:
    """Plan this process's binding from ``os.environ`` and enter it through the one
    protocol (:func:`numabind._apply.enter`); the guards are armed for a binding that
    took.  What :func:`apply`, the children, torch's device selection, Ray and ``numabind
    run`` share (``device`` may be a device itself; ``source`` names who chose it)."""
    local_rank = _check_count("local_rank", local_rank, 0)
    cfg = Config.from_env(os.environ)
    machine = Machine.from_root(cfg.sysroot)
    try:
        p = _plan(
            machine,
            os.environ,
            cfg,
            local_rank,
            device,
            mode,
            memory,
            local_world_size,
            source,
            roles=roles,
        )
        binding = enter(
            p,
            machine,
            cfg,
            migrate=migrate,
            strict=strict,
            threads=threads,
            report=report,
            prefix=prefix,
        )
    finally:
        machine.close()
    if cfg.guard and binding.ok:
        from ._guard import arm

        arm()
    if cfg.omp_places != "off" and binding.ok:
        from ._guard import arm_places

        arm_places()
    return binding


def _rank_from_call(
    rank_arg: int | str | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> int | None:
    if isinstance(rank_arg, str):
        value = kwargs.get(rank_arg)
        if value is None:
            raise TypeError(f"numa_bound: the call has no keyword argument {rank_arg!r}")
        return int(value)
    if isinstance(rank_arg, int):
        if rank_arg >= len(args):
            raise TypeError(f"numa_bound: the call has no positional argument {rank_arg}")
        return int(args[rank_arg])
    if detect(os.environ).local_rank is not None:
        return None  # the environment knows
    import multiprocessing

    if multiprocessing.parent_process() is not None and args and type(args[0]) is int:
        return args[0]  # torch.multiprocessing.spawn passes the process index first
    return None


@overload
def numa_bound(func: F, /) -> F: ...
@overload
def numa_bound(
    func: None = None,
    *,
    mode: str | None = None,
    memory: str | None = None,
    rank_arg: int | str | None = None,
    migrate: bool = True,
    strict: bool | None = None,
    reserve: int | str | None = None,
    smt: int | str | None = None,
) -> Callable[[F], F]: ...
def numa_bound(
    func: F | None = None,
    *,
    mode: str | None = None,
    memory: str | None = None,
    rank_arg: int | str | None = None,
    migrate: bool = True,
    strict: bool | None = None,
    reserve: int | str | None = None,
    smt: int | str | None = None,
) -> Any:
    """Decorator: bind the process when the function is called (not when decorated).

    ``func`` is the function (when used bare).  The rank comes from ``rank_arg`` (a
    keyword name or a position) if given, else from the environment, else, in a
    multiprocessing child, from the first positional argument when it is an int
    (``torch.multiprocessing.spawn(fn)`` passes the process index first).  ``mode``,
    ``memory``, ``migrate``, ``strict``, ``reserve`` and ``smt`` are as in :func:`apply`.
    The binding stays after the call: the function is the process's work.  Usable bare
    (``@numa_bound``) or with arguments (``@numa_bound(mode="exclusive")``).
    """
    _check_choice("mode", mode, MODE_NAMES)
    _check_choice("memory", memory, MEMORY_POLICIES)
    roles = (_check_reserve(reserve), _check_smt(smt))
    if rank_arg is not None and (
        isinstance(rank_arg, bool) or not isinstance(rank_arg, (int, str))
    ):
        raise TypeError(
            f"rank_arg must be a position (int) or a keyword name (str), not {rank_arg!r}"
        )

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            rank = _rank_from_call(rank_arg, args, kwargs)
            binding = bind(
                rank, mode=mode, memory=memory, migrate=migrate, strict=strict, roles=roles
            )
            wrapper.binding = binding  # type: ignore[attr-defined]
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    if func is not None:
        if not callable(func):
            raise TypeError(f"numa_bound decorates a function, not {func!r}")
        return decorate(func)
    return decorate


class State(Record):
    """This process's live binding: every thread's CPUs, the calling thread's memory
    policy, and resident private anonymous memory per node (4 KiB pages)."""

    pid: int
    threads: dict[int, frozenset[int]]
    memory_policy: str | None
    memory_nodes: frozenset[int]
    pages: dict[int, int]

    def __hash__(self) -> int:
        return hash(self.pid)

    def locality(self, nodes: frozenset[int]) -> float | None:
        """Share (0..1) of the private anonymous pages on ``nodes``; None without pages."""
        return locality(self.pages, nodes)


def current() -> State:
    """Read this process's live state from the kernel."""
    threads = {
        tid: cpus for tid in _kernel.thread_ids() if (cpus := _kernel.affinity_of(tid)) is not None
    }
    try:
        policy, nodes = _kernel.get_mempolicy()
    except OSError:
        policy, nodes = None, frozenset()
    try:
        pages = pages_per_node(private_anon_regions())
    except OSError:
        pages = {}
    return State(
        pid=os.getpid(), threads=threads, memory_policy=policy, memory_nodes=nodes, pages=pages
    )
