"""The Python API: :func:`apply`, :func:`numa_bound`, :func:`current`, :func:`plan_for`.

These are for processes the startup hook could not bind at their first instruction:
Callable entrypoints whose rank arrives as an argument, and code that wants to bind late
or temporarily.  Late binding rebinds every thread's CPU mask and migrates the private
pages already placed on the wrong node, but the memory policy can only be set for the
calling thread (see :mod:`numabind._apply`).
"""

from __future__ import annotations

import functools
import os
import sys

from . import _kernel
from ._apply import Binding
from ._config import config_from_env
from ._devices import Visible, resolve
from ._model import Record, _set
from ._plan import Plan, plan, request_for
from ._procmaps import pages_per_node, private_anon_regions
from ._ranks import RankInfo, detect
from ._topology import Machine, normalize_pci

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, TypeVar

    F = TypeVar("F", bound=Callable[..., Any])


def plan_for(
    local_rank: int | None = None,
    *,
    device: int | str | None = None,
    mode: str | None = None,
    memory: str | None = None,
    local_world_size: int | None = None,
    machine: Machine | None = None,
    environ: Mapping[str, str] | None = None,
) -> Plan:
    """The plan :func:`apply` would apply, without applying it.

    ``device`` overrides the device choice: an index into the visible devices, a PCI
    address or a ``GPU-`` UUID.  Arguments left None come from the environment.
    """
    env = os.environ if environ is None else environ
    cfg = config_from_env(env)
    m = machine if machine is not None else Machine.from_root(env.get("NUMABIND_SYSROOT", "/"))
    if local_rank is not None:
        if local_rank < 0:
            raise ValueError(f"local_rank must be >= 0, not {local_rank}")
        found = detect(env)
        size = local_world_size if local_world_size is not None else found.local_world_size
        info = RankInfo(
            local_rank, size, "argument", "argument" if local_world_size else found.size_source
        )
    else:
        info = detect(env, getattr(sys, "orig_argv", None))
        if local_world_size is not None:
            info = RankInfo(
                info.local_rank, local_world_size, info.rank_source, "argument", None, info.problem
            )
    visible = resolve(m, env)
    if device is not None:
        visible = _pick(visible, device, m)
        if visible.problem is None and info.local_rank is None:
            info = RankInfo(0, 1, "device argument")
    request = request_for(info, visible, mode or cfg.mode, memory or cfg.memory)
    return plan(m, request)


def _pick(visible: Visible, device: int | str, machine: Machine) -> Visible:
    devs = visible.devices
    if isinstance(device, int):
        if 0 <= device < len(devs):
            return Visible((devs[device],), visible.family, f"device={device}")
        return Visible(
            (),
            visible.family,
            f"device={device}",
            f"device index {device} is not visible ({len(devs)} are)",
        )
    pci = normalize_pci(device)
    for acc in (*devs, *machine.accelerators):
        if acc.pci == pci or (acc.uuid and acc.uuid.lower().startswith(device.lower())):
            return Visible((acc,), acc.vendor, f"device={device}")
    return Visible(
        (), visible.family, f"device={device}", f"no accelerator {device!r} on this machine"
    )


def apply(
    local_rank: int | None = None,
    *,
    device: int | str | None = None,
    mode: str | None = None,
    memory: str | None = None,
    migrate: bool = True,
    strict: bool | None = None,
    local_world_size: int | None = None,
) -> Binding:
    """Plan and apply this process's binding now; returns what was done.

    Every thread's CPU mask is rebound (threads already inside the plan are kept); the
    memory policy is set for the *calling thread* and what it starts afterwards; with
    ``migrate`` the private anonymous pages already on other nodes are moved.  The result
    prints as one line, says what was skipped and why, and restores the previous state
    with ``restore()`` or as a context manager.  ``strict`` (default: NUMABIND_STRICT)
    raises :class:`~numabind.BindingError` instead of recording failures.
    """
    cfg = config_from_env(os.environ)
    machine = Machine.from_root(os.environ.get("NUMABIND_SYSROOT", "/"))
    p = plan_for(
        local_rank,
        device=device,
        mode=mode,
        memory=memory,
        local_world_size=local_world_size,
        machine=machine,
    )
    from ._existing import bind

    return bind(
        p,
        machine,
        cfg.enable,
        os.environ,
        migrate=migrate,
        strict=cfg.strict if strict is None else strict,
    )


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


def numa_bound(
    func: F | None = None,
    *,
    mode: str | None = None,
    memory: str | None = None,
    rank_arg: int | str | None = None,
    migrate: bool = True,
    strict: bool | None = None,
) -> Any:
    """Decorator: bind the process when the function is called (not when decorated).

    The rank comes from ``rank_arg`` (a keyword name or a position) if given, else from
    the environment, else, in a multiprocessing child, from the first positional argument
    when it is an int (``torch.multiprocessing.spawn(fn)`` passes the process index
    first).  The binding stays after the call: the function is the process's work.
    Usable bare (``@numa_bound``) or with arguments (``@numa_bound(mode="exclusive")``).
    """

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            rank = _rank_from_call(rank_arg, args, kwargs)
            binding = apply(rank, mode=mode, memory=memory, migrate=migrate, strict=strict)
            wrapper.binding = binding  # type: ignore[attr-defined]
            cfg = config_from_env(os.environ)
            if binding.worth_a_line(cfg.verbose):
                print(f"numabind: {binding}", file=sys.stderr)
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    if func is not None:
        return decorate(func)
    return decorate


class State(Record):
    """This process's live binding: every thread's CPUs, the calling thread's memory
    policy, and resident private anonymous memory per node (4 KiB pages)."""

    __slots__ = ("pid", "threads", "memory_policy", "memory_nodes", "pages")
    pid: int
    threads: dict[int, frozenset[int]]
    memory_policy: str | None
    memory_nodes: frozenset[int]
    pages: dict[int, int]

    def __init__(
        self,
        pid: int,
        threads: dict[int, frozenset[int]],
        memory_policy: str | None,
        memory_nodes: frozenset[int],
        pages: dict[int, int],
    ) -> None:
        _set(self, "pid", pid)
        _set(self, "threads", threads)
        _set(self, "memory_policy", memory_policy)
        _set(self, "memory_nodes", memory_nodes)
        _set(self, "pages", pages)

    def __hash__(self) -> int:
        return hash(self.pid)

    def locality(self, nodes: frozenset[int]) -> float | None:
        total = sum(self.pages.values())
        return None if total == 0 else sum(c for n, c in self.pages.items() if n in nodes) / total


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
    return State(os.getpid(), threads, policy, nodes, pages)
