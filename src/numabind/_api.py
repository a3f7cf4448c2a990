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
from ._apply import Binding, ThreadBinding, bound_plan, enter
from ._devices import find_device, resolve
from ._environ import MAX_LOCAL, Config, RankInfo, detect, parse_reserve
from ._errors import ConfigError
from ._kernel import locality, pages_per_node, private_anon_regions
from ._model import (
    MODE_NAMES,
    NIC_MODES,
    PRIORITY_ROLES,
    SMT_LEVELS,
    USER_POLICIES,
    Record,
    Reserve,
)
from ._plan import Plan, plan, request_for, with_devices
from ._topology import Machine

MEMORY_POLICIES = USER_POLICIES

TYPE_CHECKING = False
if not TYPE_CHECKING:  # typing.overload without importing typing (~4 ms) at run time

    def overload(f):
        return f


if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any, TypeVar, overload

    from ._model import Accelerator, NicChoice

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


def _check_reserve(value: object) -> Reserve | None:
    """``reserve=2``, ``"2/node"`` or ``"1/rank"`` as NUMABIND_RESERVE (0: none; None:
    the configuration's)."""
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


def _check_devices(devices: object) -> str | tuple[int | str, ...] | None:
    """``devices="all"`` or a list of what ``device=`` takes."""
    if devices is None or devices == "all":
        return None if devices is None else "all"
    if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
        raise TypeError(
            f"devices must be 'all' or a list of indices, PCI addresses or UUIDs, not {devices!r}"
        )
    import itertools

    items = tuple(itertools.islice(devices, 65))
    if not 1 <= len(items) <= 64:
        raise ConfigError(f"devices: give 1 to 64 devices, not {len(items)}")
    checked = tuple(_check_device(d) for d in items)
    return tuple(d for d in checked if d is not None)


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
    devices: str | Sequence[int | str] | None = None,
    priority: str | None = None,
) -> Plan:
    """The plan :func:`apply` would apply, without applying it.

    ``local_rank`` picks the device among the visible ones (rank modulo their count);
    ``device`` names the device instead: an index into the visible devices, a PCI address
    (``0000:3b:00.0``, NVML's ``00000000:3B:00.0`` too) or a ``GPU-`` UUID (a unique
    prefix is enough).  ``mode`` and ``memory`` are as NUMABIND_MODE / NUMABIND_MEMORY;
    ``local_world_size`` tells exclusive/core-complex modes how many ranks share a node.
    ``reserve`` (``2``, ``"2/node"``, ``"1/rank"``) and ``smt`` (``1`` or ``"all"``) are as
    NUMABIND_RESERVE / NUMABIND_SMT: cores kept out of the compute set for helpers, and
    one hardware thread per core.  ``devices`` (``"all"`` or a list of what ``device``
    takes; as NUMABIND_DEVICES) plans a process that drives several devices: the union of
    what each device's rank would get, with each device's own plan in ``per_device``
    (:func:`numabind.bind_thread` binds a thread to one of them).  ``priority``
    (``"rank"``, ``"main"`` or ``"off"``; as NUMABIND_PRIORITY) uses the node's priority
    cores: the rank's compute set becomes its fair share of them, or only the calling
    thread goes on one (``main_cpus``).  ``machine`` plans on
    another machine (default: this one, or NUMABIND_SYSROOT).
    Arguments left None come from the environment (``environ``, default ``os.environ``).
    Bad arguments raise ``TypeError`` or :class:`~numabind.ConfigError`.
    """
    local_rank = _check_count("local_rank", local_rank, 0)
    local_world_size = _check_count("local_world_size", local_world_size, 1)
    device = _check_device(device)
    mode = _check_choice("mode", mode, MODE_NAMES)
    memory = _check_choice("memory", memory, MEMORY_POLICIES)
    roles = (_check_reserve(reserve), _check_smt(smt))
    wanted = _check_devices(devices)
    role = _check_choice("priority", priority, PRIORITY_ROLES)
    env = os.environ if environ is None else environ
    cfg = Config.from_env(env)
    m = machine if machine is not None else Machine.from_root(cfg.sysroot)
    return _plan(
        m,
        env,
        cfg,
        local_rank,
        device,
        mode,
        memory,
        local_world_size,
        roles=roles,
        devices=wanted,
        priority=role,
        nics=True,
    )


def nics_for(
    device: int | str | None = None,
    *,
    local_rank: int | None = None,
    local_world_size: int | None = None,
    mode: str | None = None,
    min_rate: float | str | None = None,
    machine: Machine | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[NicChoice, ...]:
    """The RDMA adapter ports numabind chooses for a GPU's rank, nearest first, for code
    that passes a device list itself (a transfer engine's ``device_name``, a connector's
    config): ``[n.label for n in numabind.nics_for(0)]`` is ``["mlx5_0:1"]`` on a DGX.

    ``device`` names the GPU as :func:`plan_for` does (an index into the visible devices,
    a PCI address, a ``GPU-`` UUID); default: this process's rank's device
    (``local_rank``, else the rank variables of ``environ``, default ``os.environ``).
    ``local_world_size`` splits a GPU's rails among the ranks that drive it.  ``mode``
    (``nearest`` or ``exclusive``) and ``min_rate`` (Gb/s, or ``"auto"``) are as
    NUMABIND_NIC_MODE / NUMABIND_NIC_MIN_RATE.  The choice is the machine's (``machine``,
    default this one): every GPU of the host is counted, so two processes never compute
    different answers.  Each :class:`NicChoice` says its ``name``, ``port``, ``pci``,
    ``relation`` to the GPU (``PIX`` ... ``SYS``), ``rate`` and ``sharing``.  An empty
    tuple: no adapter may be offered.  A device that cannot be found raises
    :class:`~numabind.ConfigError`.
    """
    from ._environ import parse_rate

    local_rank = _check_count("local_rank", local_rank, 0)
    local_world_size = _check_count("local_world_size", local_world_size, 1)
    device = _check_device(device)
    mode = _check_choice("mode", mode, NIC_MODES)
    rate = None if min_rate is None else parse_rate(str(min_rate), "min_rate")
    env = os.environ if environ is None else environ
    cfg = Config.from_env(env)
    cfg = cfg.replace(nic_mode=mode or cfg.nic_mode, nic_min_rate=rate or cfg.nic_min_rate)
    m = machine if machine is not None else Machine.from_root(cfg.sysroot)
    try:
        p = _plan(m, env, cfg, local_rank, device, None, None, local_world_size, nics=True)
    finally:
        if machine is None:
            m.close()
    if p.device is None:
        raise ConfigError(f"nics_for: no GPU to choose adapters for ({p.reason or 'none found'})")
    return p.nics


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
    roles: tuple[Reserve | None, str | None] = (None, None),
    devices: str | tuple[int | str, ...] | None = None,
    priority: str | None = None,
    nics: bool | None = None,
) -> Plan:
    """The plan of an API call: arguments left None come from ``cfg``; ``roles`` is
    (reserve, smt), each None for the configuration's; ``devices`` (else
    ``NUMABIND_DEVICES``) binds the process to several devices' union.  ``nics`` plans
    the RDMA adapters too (default: when ``NUMABIND_NIC`` names a transport, so that a
    binding that tells none reads no adapter)."""
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
        priority=priority or cfg.priority,
        spill=cfg.spill,
        nic_mode=cfg.nic_mode if (bool(cfg.nic) if nics is None else nics) else "",
        nic_min_rate=cfg.nic_min_rate,
    )
    wanted = devices if devices is not None else (cfg.devices or None)
    if wanted is not None and device is None:
        what = "devices argument" if devices is not None else "NUMABIND_DEVICES"
        return plan(m, with_devices(request, m, wanted, what))
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
    devices: str | Sequence[int | str] | None = None,
    priority: str | None = None,
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

    ``local_rank``, ``device``, ``mode``, ``memory``, ``local_world_size``, ``reserve``,
    ``smt``, ``devices`` and ``priority`` choose the plan as in :func:`plan_for` (with
    ``priority="main"`` the calling thread goes on a priority core, and the threads and
    processes it starts afterwards get the whole set); a process that drives
    several GPUs asks for ``devices="all"`` (or a list) and is bound to their union, so
    that each of its threads can take its own device's share with
    :func:`numabind.bind_thread`.  Every thread's CPU mask is rebound
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
        devices=_check_devices(devices),
        priority=_check_choice("priority", priority, PRIORITY_ROLES),
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
    roles: tuple[Reserve | None, str | None] = (None, None),
    devices: str | tuple[int | str, ...] | None = None,
    priority: str | None = None,
) -> Binding:
    """Plan this process's binding from ``os.environ`` and enter it through the one
    protocol (:func:`numabind._apply.enter`, which arms the guards for a binding that
    took).  What :func:`apply`, the children, torch's device selection, Ray and ``numabind
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
            devices=devices,
            priority=priority,
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
    return binding


def bind_thread(
    device: int | str,
    *,
    mode: str | None = None,
    memory: str | None = None,
    reserve: int | str | None = None,
    smt: int | str | None = None,
    strict: bool | None = None,
) -> ThreadBinding:
    """Bind the *calling thread* to ``device``'s CPUs and memory: for a process that drives
    several GPUs, one loader or launch thread per GPU:

    .. example: run on two-nodes, env NUMABIND_MEMORY=none

    ::

        import threading

        import numabind

        def loader(k: int) -> None:
            with numabind.bind_thread(device=k) as thread:  # this thread on GPU k's node
                staging = bytearray(64 << 20)               # first touched there
                print(thread)

        threading.Thread(target=loader, args=(1,)).start()

    ``device`` is what :func:`apply` takes (an index among the visible devices, a PCI
    address or a UUID).  The thread gets exactly what the rank driving that device alone
    would get in a job with one rank per visible device (its node, or in ``exclusive``
    mode its disjoint share of the node's cores; ``mode``, ``memory``, ``reserve`` and
    ``smt`` as in :func:`plan_for`); in a process bound to several devices
    (``apply(devices=...)``, NUMABIND_DEVICES) and with no argument changed, it is that
    device's share of the process's own plan.  Threads and processes the thread starts
    afterwards inherit the binding; memory it first touches lands on the device's node,
    and :func:`numabind.host_buffer` called in the block places on it.  Nothing else of
    the process changes.  Returns a :class:`ThreadBinding`, already applied: a context
    manager, or ``restore()`` to put back the thread's CPUs and memory policy (blocks
    nest).  The thread is listed in the process's registry entry while bound, so
    ``numabind check`` judges it against its own device's plan.  ``strict`` (default:
    NUMABIND_STRICT) raises :class:`~numabind.BindingError` when the plan skips or the
    kernel refuses part of it (else that is in ``str()`` and ``ok`` is False).
    """
    dev = _check_device(device)
    if dev is None:
        raise TypeError("bind_thread needs a device (an index, a PCI address or a UUID)")
    mode = _check_choice("mode", mode, MODE_NAMES)
    memory = _check_choice("memory", memory, MEMORY_POLICIES)
    roles = (_check_reserve(reserve), _check_smt(smt))
    if strict is not None and not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool or None, not {type(strict).__name__}")
    cfg = Config.from_env(os.environ)
    with Machine.from_root(cfg.sysroot) as m:
        p = _thread_plan(m, cfg, dev, mode, memory, roles)
    binding = ThreadBinding(p).apply()
    if (cfg.strict if strict is None else strict) and not binding.ok:
        binding.restore()
        from ._errors import BindingError

        raise BindingError(str(binding))
    if (p.bound and not binding.ok) or (not p.bound and p.problem):
        from ._output import say

        say(str(binding))  # asked for and not done: one line (a benign skip says nothing)
    return binding


def _thread_plan(
    m: Machine,
    cfg: Config,
    device: int | str,
    mode: str | None,
    memory: str | None,
    roles: tuple[Reserve | None, str | None],
) -> Plan:
    """Device ``device``'s plan for one thread: its share of the process's multi-device
    plan where there is one and nothing was changed, else what its own rank would get."""
    process = bound_plan(process=True)
    visible = resolve(m, os.environ)
    found, why = find_device(device, visible, m)
    if (
        found is not None
        and process is not None
        and mode is memory is None
        and roles == (None, None)
    ):
        mine = process.for_device(found)
        if mine is not None:
            return mine
    if found is None:
        request = request_for(
            RankInfo(rank_source="bind_thread"), visible, cfg.mode, cfg.memory, spill=cfg.spill
        )
        return plan(m, request.replace(problem=f"device {device!r}: {why}"))
    return _plan(
        m, os.environ, cfg, None, None, mode, memory, None, roles=roles, devices=(device,)
    ).per_device[0]


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
