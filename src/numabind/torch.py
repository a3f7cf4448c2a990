"""PyTorch integration, two parts:

* **Children that start bound**: children of ``torch.multiprocessing.spawn`` /
  ``start_processes`` and of ``torch.distributed.elastic`` Callable launches
  (``elastic_launch(config, fn)``, ``torchrun`` with a function) start bound to their
  local rank.
* **Device selection binds**: the first time a process that is not bound yet selects a
  device through ``torch.cuda.set_device`` (ROCm builds use it too),
  ``torch.accelerator.set_device_index`` or ``torch.xpu.set_device``, numabind binds it
  late to that device's node (every thread's CPUs, the calling thread's memory policy,
  migration, the keep/replace rule, one line) before delegating to torch.  Engine
  workers that get their local rank as an argument and call ``set_device(local_rank)``
  (vLLM/SGLang-style executors) are bound this way.  A process bound already, by the hook
  or an earlier selection, is left alone; selecting a second device on another node is
  said, not chased; later calls cost one flag test.  ``with torch.cuda.device(i)`` and
  ``tensor.to("cuda:1")`` do not select a device for the process and do not bind.
  ``NUMABIND_TORCH_SET_DEVICE=0`` turns this part off.
* **DataLoader workers and the pin thread**: each DataLoader worker process places itself
  as ``NUMABIND_WORKERS`` says (``share`` the rank's CPUs, the default; ``spread`` one
  disjoint set of whole cores each; ``reserved`` the rank's ``NUMABIND_RESERVE`` cores)
  before it loads anything, whatever mask it inherited (an OpenMP runtime in the parent
  may have pinned the forking thread to one core); the pin-memory thread is put back on
  the rank's CPUs if it started elsewhere.

One line for users:

.. example: run with torch

::

    import numabind.torch; numabind.torch.install()

or ``NUMABIND_TORCH=1`` in the environment (the startup hook then installs it as soon as
torch is imported).  Importing this module does not import torch; :func:`install` does.

Where it hooks, and why there (torch 2.13 source):
``torch/multiprocessing/spawn.py:start_processes`` is the one place both paths start
processes: ``spawn()`` calls it, and elastic's ``MultiprocessContext`` calls it with its
own ``_wrap`` as ``fn``.  It starts process ``i`` as
``multiprocessing.get_context(m).Process(target=spawn._wrap, args=(fn, i, args, error_file))``,
and ``i`` is the local rank in both paths (elastic's ``_wrap`` indexes its per-rank
environments with it).  numabind replaces the ``multiprocessing`` module that spawn.py
sees with a thin proxy whose contexts' ``Process.start()`` runs inside
:func:`numabind.child_binding` for rank ``i`` and whose child enters through numabind
first.  The device-selection functions are replaced by wrappers that bind, then call
the original.  DataLoader: ``torch/utils/data/dataloader.py`` starts each worker with
``target=_utils.worker._worker_loop`` (looked up when the iterator is made) and the pin
thread with ``target=_utils.pin_memory._pin_memory_loop``; numabind replaces those two
module attributes with wrappers that place the caller, then call the original (the
worker's wrapper pickles by its own name, so spawned workers find it too).  Nothing else
in torch is touched.  :func:`install` checks each of those
internals and raises :class:`TorchIntegrationError` naming the one that changed.
"""

from __future__ import annotations

import multiprocessing as _stdlib_mp

from ._errors import IntegrationError
from ._model import VENDORS
from ._output import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

TESTED_TORCH = ("2.13",)  # major.minor versions whose internals the tests run against
_installed: dict[str, Any] = {}
# (module, attribute) of every function that selects a device for the process: each
# vendor's torch module (numabind._model.VENDORS) and torch's device-neutral ones
SELECTORS: tuple[tuple[str, str], ...] = (
    *((m, "set_device") for m in dict.fromkeys(v.torch_module for v in VENDORS if v.torch_module)),
    ("torch.accelerator", "set_device_index"),
    ("torch.accelerator", "set_device_idx"),
)
_selected: dict[str, Any] = {}  # the first selection's node, once made
_seen: set[int] = set()  # device indices already handled (the selectors' fast path)


class TorchIntegrationError(IntegrationError):
    """torch changed an internal numabind.torch relies on."""


def _check(spawn_mod: ModuleType) -> None:
    import inspect

    problems = []
    if not callable(getattr(spawn_mod, "start_processes", None)):
        problems.append("torch.multiprocessing.spawn.start_processes is gone")
    wrap = getattr(spawn_mod, "_wrap", None)
    if not callable(wrap):
        problems.append("torch.multiprocessing.spawn._wrap is gone")
    else:
        params = list(inspect.signature(wrap).parameters)
        if params[:2] != ["fn", "i"]:
            problems.append(f"spawn._wrap now takes {params} (expected fn, i, ...)")
    mp = getattr(spawn_mod, "multiprocessing", None)
    if mp is not _stdlib_mp and not isinstance(mp, _MultiprocessingProxy):
        problems.append("spawn.py no longer starts processes through the multiprocessing module")
    try:
        source = inspect.getsource(spawn_mod.start_processes)
    except (OSError, TypeError):
        source = ""
    if source and ("multiprocessing.get_context" not in source or "target=_wrap" not in source):
        problems.append(
            "start_processes no longer calls multiprocessing.get_context(...).Process(target=_wrap)"
        )
    if problems:
        import torch

        raise TorchIntegrationError(
            f"numabind.torch cannot hook torch {torch.__version__} (tested: "
            f"{', '.join(TESTED_TORCH)}): " + "; ".join(problems)
        )


def _torch_child_entry(
    target: Callable[..., Any],
    target_args: tuple[Any, ...],
    local_rank: int,
    method: str,
    mode: str | None,
    memory: str | None,
) -> Any:
    """The child's first numabind code: confirm the inherited binding (or, under forkserver,
    bind and migrate now), then hand over to torch's own ``_wrap``."""
    from ._api import bind

    bind(local_rank, mode=mode, memory=memory, migrate=method == "forkserver", strict=False)
    return target(*target_args)


def _process_class(
    base: Any, mode: str | None, memory: str | None, wrap: Callable[..., Any]
) -> type:
    from ._children import child_binding, children_say_it, say_forkserver_once

    class BoundProcess(base):  # type: ignore[misc]
        _numabind_method = "spawn"

        def start(self) -> None:
            # the spawn start method pickles this object: from here on it is the plain
            # context Process again, with numabind's entry as its target
            method = self._numabind_method
            self.__class__ = base
            target: Any = getattr(self, "_target", None)
            args: tuple[Any, ...] = tuple(getattr(self, "_args", ()))
            if target is not wrap or len(args) < 2 or type(args[1]) is not int:
                base.start(self)
                return
            rank = args[1]
            self._target = _torch_child_entry
            self._args = (target, tuple(args), rank, method, mode, memory)
            if method == "forkserver":
                say_forkserver_once()
                base.start(self)
                return
            ctx = _stdlib_mp.get_context(method)
            with children_say_it(), child_binding(rank, mode=mode, memory=memory, context=ctx):
                base.start(self)

    BoundProcess.__name__ = BoundProcess.__qualname__ = base.__name__
    return BoundProcess


class _ContextProxy:
    def __init__(self, ctx: Any, process_class: type) -> None:
        self._ctx = ctx
        self.Process = process_class

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)


class _MultiprocessingProxy:
    """What torch's spawn.py sees as ``multiprocessing``: the real module, except that
    ``get_context`` hands out contexts whose Process binds children."""

    def __init__(
        self, real: ModuleType, mode: str | None, memory: str | None, wrap: Callable[..., Any]
    ) -> None:
        self._real = real
        self._mode, self._memory, self._wrap = mode, memory, wrap

    def get_context(self, method: str | None = None) -> Any:
        ctx = self._real.get_context(method)
        cls: Any = _process_class(ctx.Process, self._mode, self._memory, self._wrap)
        cls._numabind_method = ctx.get_start_method()
        return _ContextProxy(ctx, cls)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def _device_index(device: Any) -> int | None:
    """The index a selector was given (int, "cuda:1", torch.device), None for none."""
    if isinstance(device, bool):
        return None
    if isinstance(device, int):
        return device
    try:
        import torch

        dev = torch.device(device) if isinstance(device, str) else device
        index = getattr(dev, "index", None)
    except Exception:
        return None
    return index if isinstance(index, int) else None


def _on_select(what: str, device: Any) -> None:
    """A device was selected: bind the process to its node, once; a later selection of a
    device not seen before is compared with that node (once per device)."""
    index = _device_index(device)
    if index is None or index < 0:
        return
    from ._apply import bound_plan

    process = bound_plan(process=True)
    if process is not None and process.per_device:
        _bind_selecting_thread(what, index)
        return
    _seen.add(index)
    checked: set[int] | None = _selected.get("checked")
    if checked is not None:
        if index not in checked:
            checked.add(index)
            _say_second(what, index)
        return
    _selected["first"], _selected["checked"] = index, {index}
    bound = bound_plan()
    if bound is not None:
        # bound already (the startup hook, numabind.apply, a numabind child): left alone,
        # and said when the device selected is on another node
        _selected["node"] = bound.numa_node
        _selected["first"] = None
        _say_second(what, index)
        return
    from ._api import bind

    binding = bind(device=index, migrate=True, strict=False, prefix=f"{what}({index}): ")
    _selected["node"] = binding.plan.numa_node


# thread id -> (device index, its ThreadBinding) from a selection
_threads_selected: dict[int, tuple[int, Any]] = {}


def _bind_selecting_thread(what: str, index: int) -> None:
    """A process bound to several devices (NUMABIND_DEVICES, ``apply(devices=...)``): the
    thread that selects device ``index`` is bound to that device's share, until it selects
    another; the process's own binding (the union) is left as it is."""
    import _thread

    from ._api import bind_thread

    tid = _thread.get_native_id()
    current = _threads_selected.get(tid)
    if current is not None:
        if current[0] == index:
            return
        try:
            current[1].restore()
        except Exception:  # a bind_thread block of the user's own is inside: leave both
            return
    binding = bind_thread(index)
    _threads_selected[tid] = (index, binding)
    if not binding.ok:
        say(f"{what}({index}): {binding}")


def _say_second(what: str, index: int) -> None:
    from ._api import plan_for

    node = _selected.get("node")
    try:
        other = plan_for(device=index).numa_node
    except Exception:
        return
    if node is not None and other is not None and other != node:
        first = _selected.get("first")
        when = "already" if first is None else f"when it selected device {first}"
        say(
            f"{what}({index}) selects a device on node {other}, but this process was bound to "
            f"node {node} {when}: not rebound"
        )


def _wrap_selector(module: Any, name: str, what: str) -> None:
    original = getattr(module, name, None)
    if original is None or getattr(original, "_numabind_original", None) is not None:
        return
    import functools

    seen = _seen

    @functools.wraps(original)
    def selector(device: Any, *args: Any, **kwargs: Any) -> Any:
        # a later call with a device already seen costs one type test and one set lookup
        # (a process bound to several devices binds per thread: it never adds to seen)
        if type(device) is not int or device not in seen:
            try:
                _on_select(what, device)
            except Exception as err:  # binding must never break the user's call
                say(f"{what}: binding failed ({type(err).__name__}: {err}); left unbound")
        return original(device, *args, **kwargs)

    selector._numabind_original = original  # type: ignore[attr-defined]
    setattr(module, name, selector)
    _installed.setdefault("selectors", []).append((module, name, original))


def install_set_device() -> None:
    """Make the device-selection functions bind (see the module docstring).  Raises
    :class:`TorchIntegrationError` when none of them is where torch 2.13 has it."""
    import importlib

    found = 0
    for mod_name, attr in SELECTORS:
        try:
            module = importlib.import_module(mod_name)
        except ImportError:
            continue
        if callable(getattr(module, attr, None)):
            found += 1
            _wrap_selector(module, attr, f"{mod_name}.{attr}")
    if not found:
        import torch

        raise TorchIntegrationError(
            f"numabind.torch cannot hook device selection in torch {torch.__version__} "
            f"(tested: {', '.join(TESTED_TORCH)}): none of "
            + ", ".join(f"{m}.{a}" for m, a in SELECTORS)
            + " exists"
        )


# --- DataLoader workers and the pin thread ------------------------------------------------------

_LOOPS = (
    ("torch.utils.data._utils.worker", "_worker_loop"),
    ("torch.utils.data._utils.pin_memory", "_pin_memory_loop"),
)
_said_workers: set[str] = set()


def _original_loop(module_name: str, name: str) -> Callable[..., Any]:
    """torch's own loop function: what install() replaced, else the module's (a spawned
    worker where numabind.torch was installed only in the parent)."""
    import importlib

    found = _installed.get(name)
    if found is None:
        found = getattr(importlib.import_module(module_name), name)
        found = getattr(found, "__wrapped__", found)
    return found  # type: ignore[no-any-return]


def _rank_plan() -> Any:
    """The binding this process runs under: the one numabind applied here (a forked worker
    keeps its parent's), else the plan its environment gives (a spawned worker inherited
    its binding without planning).  None when it is not bound."""
    from ._apply import bound_plan

    found = bound_plan()
    if found is not None:
        return found
    from ._api import plan_for

    try:
        p = plan_for()
    except Exception:
        return None
    return p if p.bound else None


def place_worker(worker_id: int, num_workers: int) -> frozenset[int] | None:
    """Put this DataLoader worker (every thread of it) where ``NUMABIND_WORKERS`` says, in
    its rank's sets; returns its CPUs (None: the rank is not bound, nothing done)."""
    from . import _kernel
    from ._environ import Config
    from ._plan import worker_cpus

    cfg = Config.from_env()
    p = _rank_plan()
    if p is None:
        return None
    if cfg.workers == "spread":
        from ._topology import Machine

        m = Machine.from_root(cfg.sysroot)
        try:
            cpus, note = worker_cpus(p, cfg.workers, worker_id, num_workers, m.siblings_of)
        finally:
            m.close()
    else:
        cpus, note = worker_cpus(p, cfg.workers, worker_id, num_workers, _alone)
    if note and worker_id == 0:
        say(f"DataLoader workers: {note}: they share the rank's CPUs")
    for tid in _kernel.thread_ids():
        try:
            _kernel.set_thread_affinity(tid, cpus)
        except OSError:
            continue
    return cpus


def _alone(cpu: int) -> frozenset[int]:
    return frozenset({cpu})  # share and reserved ask no sibling


def _worker_loop(*args: Any, **kwargs: Any) -> Any:
    """torch's DataLoader worker loop, after placing the worker."""
    import inspect

    original = _original_loop(*_LOOPS[0])
    try:
        call = inspect.signature(original).bind(*args, **kwargs).arguments
        place_worker(int(call["worker_id"]), int(call["num_workers"]))
    except Exception as err:  # placing is a courtesy: the worker must run regardless
        if "worker" not in _said_workers:
            _said_workers.add("worker")
            say(f"DataLoader worker not placed ({type(err).__name__}: {err})")
    return original(*args, **kwargs)


def _pin_memory_loop(*args: Any, **kwargs: Any) -> Any:
    """torch's pin-memory thread, put back on the rank's CPUs if it started elsewhere, and
    given the rank's memory policy where the process runs under one that interleaves over
    several nodes (``numactl --interleave=all`` kept for a deliberate binding): the pinned
    staging buffers it allocates are the rank's, not spread over every node."""
    from . import _kernel

    try:
        p = _rank_plan()
        now = _kernel.affinity_of(0)
        if p is not None and p.cpus and now is not None and not now <= p.cpus:
            _kernel.set_thread_affinity(0, p.cpus)
        if p is not None and staging_policy_needed(_kernel.get_mempolicy(), p):
            from ._pin import ThreadPin

            # memory only; this thread ends with the loop: nothing to put back
            ThreadPin(p.placement.replace(cpus=frozenset())).apply()
    except Exception:
        pass
    return _original_loop(*_LOOPS[1])(*args, **kwargs)


def staging_policy_needed(current: tuple[str, frozenset[int]], p: Any) -> bool:
    """Whether a thread that pins staging buffers for plan ``p`` runs under a policy that
    interleaves over several nodes the rank's plan does not: it then takes the plan's."""
    policy, nodes = current
    return (
        p.bound
        and p.placement.sets_memory
        and policy == "interleave"
        and len(nodes) > 1
        and p.memory_policy != "interleave"
    )


def install_dataloader() -> None:
    """Place DataLoader workers and the pin thread (see the module docstring); idempotent.
    Raises :class:`TorchIntegrationError` when torch's loops are not the ones tested."""
    import importlib
    import inspect

    wrappers = {"_worker_loop": _worker_loop, "_pin_memory_loop": _pin_memory_loop}
    for module_name, name in _LOOPS:
        module = importlib.import_module(module_name)
        current = getattr(module, name, None)
        if current is wrappers[name]:
            continue
        if not callable(current):
            raise TorchIntegrationError(f"numabind.torch: {module_name}.{name} is gone")
        if name == "_worker_loop":
            params = inspect.signature(current).parameters
            if not {"worker_id", "num_workers"} <= set(params):
                raise TorchIntegrationError(
                    f"numabind.torch: {module_name}.{name} has no worker_id/num_workers "
                    f"parameters (it takes {', '.join(params)})"
                )
        _installed[name] = current
        wrappers[name].__wrapped__ = current  # type: ignore[attr-defined]
        setattr(module, name, wrappers[name])


def _set_device_wanted() -> bool:
    from ._environ import Config

    try:
        return Config.from_env().torch_set_device
    except ValueError:  # a bad binding knob: binding will say so when it is tried
        return True


def install(*, mode: str | None = None, memory: str | None = None) -> None:
    """Make torch start its multiprocessing and elastic Callable children bound, and
    device selection bind a process that has no rank (unless NUMABIND_TORCH_SET_DEVICE=0).

    ``mode`` and ``memory`` override NUMABIND_MODE / NUMABIND_MEMORY for the children.
    Idempotent.  Raises :class:`TorchIntegrationError` when this torch's internals are not
    the ones numabind was tested against (see the module docstring for which).
    """
    import importlib

    from ._errors import require

    require("torch", "PyTorch", "pip install torch", "numabind.torch.install()")
    if _set_device_wanted():
        install_set_device()
    try:
        spawn_mod: Any = importlib.import_module("torch.multiprocessing.spawn")
    except ImportError as err:
        raise TorchIntegrationError(
            f"numabind.torch cannot hook torch's children: torch.multiprocessing.spawn does "
            f"not import ({err}); device selection is hooked"
        ) from None
    if not isinstance(spawn_mod.multiprocessing, _MultiprocessingProxy):
        _check(spawn_mod)
        spawn_mod.multiprocessing = _MultiprocessingProxy(_stdlib_mp, mode, memory, spawn_mod._wrap)
        _installed["spawn"] = spawn_mod
    try:
        install_dataloader()
    except ImportError as err:
        raise TorchIntegrationError(
            f"numabind.torch cannot place DataLoader workers: {err}; children and device "
            "selection are hooked"
        ) from None


def empty_on_node(
    shape: Any,
    *,
    dtype: Any = None,
    device: int | str | None = None,
    node: int | list[int] | None = None,
    policy: str = "bind",
    populate: bool = True,
) -> Any:
    """A CPU tensor whose memory is a :func:`numabind.host_buffer` on a GPU's node: for
    offload pools and staging tensors the GPU reads, placed whatever thread allocates it
    (not registered with the driver: :func:`pinned_empty` is).

    ``shape`` and ``dtype`` (default: torch's default dtype) are as for ``torch.empty``;
    the tensor's storage is exactly ``numel * itemsize`` bytes of the buffer, and the
    buffer lives as long as the storage does.  ``device``, ``node``, ``policy`` and
    ``populate`` are :func:`numabind.host_buffer`'s.  The contents are zeros when
    populated, undefined (as ``torch.empty``'s) otherwise.
    """
    return _placed_tensor(
        shape, dtype, device, node, policy, populate, False, "numabind.torch.empty_on_node()"
    )


def pinned_empty(
    shape: Any,
    *,
    dtype: Any = None,
    device: int | str | None = None,
    node: int | list[int] | None = None,
    policy: str = "bind",
) -> Any:
    """A CPU tensor on a GPU's node, registered with the GPU driver: ``is_pinned()`` is
    true on a CUDA build and copies to and from the GPU run at pinned speed, while the
    pages sit on the GPU's node (``torch.empty(pin_memory=True)`` puts them wherever the
    allocating thread runs, and rounds the size up to a power of two).  Exactly ``numel *
    itemsize`` bytes; the registration and the mapping live as long as the storage does
    and are undone when it is freed (unregistered first).  Where no GPU driver is present
    (the CPU build) the tensor is the placed one of :func:`empty_on_node`, and one line
    says it is not registered.  Arguments as for :func:`empty_on_node`.
    """
    return _placed_tensor(
        shape, dtype, device, node, policy, True, "auto", "numabind.torch.pinned_empty()"
    )


def pinned_like(
    tensor: Any,
    *,
    device: int | str | None = None,
    node: int | list[int] | None = None,
    policy: str = "bind",
) -> Any:
    """:func:`pinned_empty` with ``tensor``'s shape and dtype, its contents copied in
    (``device``, ``node`` and ``policy`` as there)."""
    out = _placed_tensor(
        tuple(tensor.shape),
        tensor.dtype,
        device,
        node,
        policy,
        True,
        "auto",
        "numabind.torch.pinned_like()",
    )
    out.copy_(tensor)
    return out


_said_unpinned: set[str] = set()


def _placed_tensor(
    shape: Any,
    dtype: Any,
    device: int | str | None,
    node: int | list[int] | None,
    policy: str,
    populate: bool,
    register: bool | str,
    caller: str,
) -> Any:
    import ctypes
    import math
    import weakref

    from ._errors import require

    require("torch", "torch", "pip install torch", caller)
    import torch

    from .memory._memory import CALLER, host_buffer

    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    kind = dtype if dtype is not None else torch.get_default_dtype()
    count = math.prod(dims)
    itemsize = torch.empty((), dtype=kind).element_size()
    named = CALLER.set(caller)  # the buffer's messages name the function called
    try:
        buf = host_buffer(
            max(count * itemsize, 1),
            device=device,
            node=node,
            policy=policy,
            populate=populate,
            register=register,
        )
    finally:
        CALLER.reset(named)
    if register and not buf.registered and "unpinned" not in _said_unpinned:
        _said_unpinned.add("unpinned")
        say(f"{caller}: placed, not registered: {buf.register_reason}")
    if count == 0:
        buf.close()
        return torch.empty(dims, dtype=kind)
    # the tensor holds a ctypes view of the memory, not the mapping: when the storage is
    # freed the view goes, and its finalizer closes the buffer (unregister, then unmap)
    window = (ctypes.c_char * (count * itemsize)).from_address(buf.address)
    weakref.finalize(window, buf.close)
    flat = torch.frombuffer(window, dtype=kind, count=count)
    return flat.view(dims)


def uninstall() -> None:
    """Undo :func:`install`."""
    spawn_mod = _installed.pop("spawn", None)
    if spawn_mod is not None and isinstance(spawn_mod.multiprocessing, _MultiprocessingProxy):
        spawn_mod.multiprocessing = _stdlib_mp
    for module, name, original in _installed.pop("selectors", []):
        setattr(module, name, original)
    import sys

    for module_name, name in _LOOPS:
        original = _installed.pop(name, None)
        module = sys.modules.get(module_name)
        if original is not None and module is not None:
            setattr(module, name, original)
    _selected.clear()
    _seen.clear()


def install_when_imported() -> None:
    """``NUMABIND_TORCH=1``: install as soon as torch is imported, without importing torch
    here (the startup hook calls this in launchers, ranks and engine workers alike)."""
    from ._guard import after_import

    def hook(module: Any) -> None:
        try:
            install()
        except TorchIntegrationError as err:
            say(str(err))

    after_import("torch", hook)
