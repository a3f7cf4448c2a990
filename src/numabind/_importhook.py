"""Run a callback right after a module is first imported, at no cost until then.

A finder at the front of ``sys.meta_path`` answers only for the watched names: it asks
the other finders for the real spec and wraps its loader so that the callback runs after
the module has executed.  Every other import passes through with one dict lookup.  Used by
``NUMABIND_TORCH=1`` (patch torch's process starts once ``torch.multiprocessing`` exists)
and by the guard (check the binding after ``import torch``/``numpy``).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any


def _say(message: str) -> None:
    try:
        sys.stderr.write(f"numabind: {message}\n")
    except Exception:
        pass


class _Loader:
    def __init__(self, loader: Any, callbacks: list[Callable[[ModuleType], None]]) -> None:
        self._loader = loader
        self._callbacks = callbacks

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        # the real loader goes back on the spec, so reloads and introspection see it
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        module.__loader__ = self._loader
        for cb in self._callbacks:
            try:
                cb(module)
            except Exception as err:  # a callback must never break the user's import
                _say(f"after importing {module.__name__}: {type(err).__name__}: {err}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _Finder:
    def __init__(self) -> None:
        self.watch: dict[str, list[Callable[[ModuleType], None]]] = {}
        self._busy: set[str] = set()

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        callbacks = self.watch.get(name)
        if callbacks is None or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        del self.watch[name]  # once
        spec.loader = _Loader(spec.loader, callbacks)  # type: ignore[assignment]
        return spec


_finder: _Finder | None = None


def after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once ``name`` is imported (now, if it already is)."""
    global _finder
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__spec__", None) is not None:
        try:
            callback(module)
        except Exception as err:
            _say(f"after importing {name}: {type(err).__name__}: {err}")
        return
    if _finder is None:
        _finder = _Finder()
        sys.meta_path.insert(0, _finder)
    _finder.watch.setdefault(name, []).append(callback)
