"""PyTorch integration: children of ``torch.multiprocessing.spawn``/``start_processes`` and of
``torch.distributed.elastic`` Callable launches (``elastic_launch(config, fn)``,
``torchrun`` with a function) start bound to their local rank.

One line for users::

    import numabind.torch; numabind.torch.install()

or ``NUMABIND_TORCH=1`` in the launcher's environment (the startup hook then installs it
as soon as ``torch.multiprocessing`` is imported).  Importing this module does not import
torch; :func:`install` does.

Where it hooks, and why there (torch 2.13 source):
``torch/multiprocessing/spawn.py:start_processes`` is the one place both paths start
processes: ``spawn()`` calls it, and elastic's ``MultiprocessContext`` calls it with its
own ``_wrap`` as ``fn``.  It starts process ``i`` as
``multiprocessing.get_context(m).Process(target=spawn._wrap, args=(fn, i, args, error_file))``,
and ``i`` is the local rank in both paths (elastic's ``_wrap`` indexes its per-rank
environments with it).  numabind replaces the ``multiprocessing`` module that spawn.py
sees with a thin proxy whose contexts' ``Process.start()`` runs inside
:func:`numabind.child_binding` for rank ``i`` and whose child enters through numabind
first.  Nothing else in torch is touched.  :func:`install` checks each of those internals
and raises :class:`TorchIntegrationError` naming the one that changed.
"""

from __future__ import annotations

import multiprocessing as _stdlib_mp
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

TESTED_TORCH = ("2.13",)  # major.minor versions whose internals the tests run against
_installed: dict[str, Any] = {}


class TorchIntegrationError(RuntimeError):
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
    from ._api import apply
    from ._config import config_from_env

    binding = apply(
        local_rank, mode=mode, memory=memory, migrate=method == "forkserver", strict=False
    )
    cfg = config_from_env(os.environ)
    if binding.worth_a_line(cfg.verbose):
        sys.stderr.write(f"numabind: {binding}\n")
    return target(*target_args)


def _process_class(
    base: Any, mode: str | None, memory: str | None, wrap: Callable[..., Any]
) -> type:
    from ._children import child_binding, say_forkserver_once

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
            with child_binding(rank, mode=mode, memory=memory, context=ctx):
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


def install(*, mode: str | None = None, memory: str | None = None) -> None:
    """Make torch start its multiprocessing and elastic Callable children bound.

    Idempotent.  Raises :class:`TorchIntegrationError` when this torch's internals are not
    the ones numabind was tested against (see the module docstring for which).
    """
    import importlib

    spawn_mod: Any = importlib.import_module("torch.multiprocessing.spawn")
    if isinstance(spawn_mod.multiprocessing, _MultiprocessingProxy):
        return
    _check(spawn_mod)
    spawn_mod.multiprocessing = _MultiprocessingProxy(_stdlib_mp, mode, memory, spawn_mod._wrap)
    _installed["spawn"] = spawn_mod


def uninstall() -> None:
    """Undo :func:`install`."""
    spawn_mod = _installed.pop("spawn", None)
    if spawn_mod is not None and isinstance(spawn_mod.multiprocessing, _MultiprocessingProxy):
        spawn_mod.multiprocessing = _stdlib_mp


def install_when_imported() -> None:
    """``NUMABIND_TORCH=1``: install as soon as torch's multiprocessing is imported, without
    importing torch here (the startup hook calls this in launcher processes)."""
    from ._importhook import after_import

    def hook(module: Any) -> None:
        try:
            install()
        except TorchIntegrationError as err:
            sys.stderr.write(f"numabind: {err}\n")

    after_import("torch.multiprocessing.spawn", hook)
