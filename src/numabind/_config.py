"""Configuration from the environment; the same names as the keyword arguments.

| variable          | values                                          | default     |
|-------------------|-------------------------------------------------|-------------|
| NUMABIND          | auto, force, respect, 0/off                     | auto        |
| NUMABIND_MODE     | node, socket, exclusive, core-complex           | node        |
| NUMABIND_MEMORY   | preferred, bind, interleave, local, none        | preferred   |
| NUMABIND_STRICT   | 0/1 (also true/false, yes/no, on/off)           | 0           |
| NUMABIND_VERBOSE  | 0/1                                             | 0           |
| NUMABIND_GUARD    | 0/1                                             | 1           |

A bad value raises ``ValueError`` naming the variable, the value and what is accepted.
"""

from __future__ import annotations

from ._model import Record, _set
from ._plan import MEMORY_POLICIES, MODES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

ENABLE_VALUES = ("auto", "force", "respect", "0", "off")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class Config(Record):
    __slots__ = ("enable", "mode", "memory", "strict", "verbose", "guard")
    enable: str
    mode: str
    memory: str
    strict: bool
    verbose: bool
    guard: bool

    def __init__(
        self,
        enable: str = "auto",
        mode: str = "node",
        memory: str = "preferred",
        strict: bool = False,
        verbose: bool = False,
        guard: bool = True,
    ) -> None:
        _set(self, "enable", enable)
        _set(self, "mode", mode)
        _set(self, "memory", memory)
        _set(self, "strict", strict)
        _set(self, "verbose", verbose)
        _set(self, "guard", guard)

    @property
    def disabled(self) -> bool:
        return self.enable in ("0", "off")


def _choice(environ: Mapping[str, str], name: str, allowed: tuple[str, ...], default: str) -> str:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in allowed:
        raise ValueError(f"{name}={raw!r} is not one of {', '.join(allowed)}")
    return value


def _flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    raw = environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def config_from_env(environ: Mapping[str, str]) -> Config:
    return Config(
        _choice(environ, "NUMABIND", ENABLE_VALUES, "auto"),
        _choice(environ, "NUMABIND_MODE", MODES, "node"),
        _choice(environ, "NUMABIND_MEMORY", MEMORY_POLICIES, "preferred"),
        _flag(environ, "NUMABIND_STRICT", False),
        _flag(environ, "NUMABIND_VERBOSE", False),
        _flag(environ, "NUMABIND_GUARD", True),
    )
