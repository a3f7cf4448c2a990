"""A stand-in for vLLM's plugin loader (``vllm/plugins/__init__.py``:
``load_plugins_by_group`` and ``load_general_plugins``), for the tests of
``numabind.vllm``: vLLM does not install here.  It does what vLLM's does, in its order:
once per process, ``importlib.metadata.entry_points(group="vllm.general_plugins")``; a
plugin is loaded when ``VLLM_PLUGINS`` is unset or names it (a comma list, as vLLM's envs
parse it); a plugin whose ``load()`` raises is logged and skipped; then each loaded
function is called with no arguments, and what it raises propagates (vLLM does not catch
it: the process stops)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

DEFAULT_PLUGINS_GROUP = "vllm.general_plugins"
plugins_loaded = False


def _allowed() -> list[str] | None:
    raw = os.environ.get("VLLM_PLUGINS")
    return None if raw is None else raw.split(",")


def load_plugins_by_group(group: str) -> dict[str, Callable[[], Any]]:
    allowed = _allowed()
    plugins: dict[str, Callable[[], Any]] = {}
    for plugin in entry_points(group=group):
        if allowed is None or plugin.name in allowed:
            try:
                plugins[plugin.name] = plugin.load()
            except Exception as err:
                print(f"Failed to load plugin {plugin.name}: {err}", file=sys.stderr)
    return plugins


def load_general_plugins() -> None:
    global plugins_loaded
    if plugins_loaded:
        return
    plugins_loaded = True
    for func in load_plugins_by_group(DEFAULT_PLUGINS_GROUP).values():
        func()
