"""Configuration from the environment; the same names as the keyword arguments.

| variable          | values                                          | default     | kind      |
|-------------------|-------------------------------------------------|-------------|-----------|
| NUMABIND          | auto, force, respect, 0/off                     | auto        | binding   |
| NUMABIND_MODE     | node, socket, exclusive, core-complex           | node        | binding   |
| NUMABIND_MEMORY   | preferred, bind, interleave, local, none        | preferred   | binding   |
| NUMABIND_STRICT   | 0/1 (also true/false, yes/no, on/off)           | 0           | binding   |
| NUMABIND_THREADS  | off, auto, a positive integer                   | off         | binding   |
| NUMABIND_VERBOSE  | 0/1                                             | 0           | cosmetic  |
| NUMABIND_GUARD    | 0/1                                             | 1           | cosmetic  |
| NUMABIND_SYSROOT  | a directory laid out like /                     | /           | machine   |

A bad value of a *binding* knob raises :class:`~numabind.ConfigError` naming the
variable, the value and what is accepted (the hook then leaves the process unbound: a typo
in ``NUMABIND_MODE`` must not bind in a way nobody asked for).  A bad value of a
*cosmetic* knob only changes what is said, so it becomes a warning in ``Config.warnings``
and the default is used.
"""

from __future__ import annotations

from ._model import Record
from ._modes import MODE_NAMES
from ._plan import MEMORY_POLICIES
from ._sysfs import short

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from ._errors import ConfigError

ENABLE_VALUES = ("auto", "force", "respect", "0", "off")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")
COSMETIC = ("NUMABIND_VERBOSE", "NUMABIND_GUARD")
MAX_THREADS = 1 << 16


def _invalid(message: str) -> ConfigError:
    # numabind._errors is imported only when a value is bad: the hook's path stays short
    from ._errors import ConfigError

    return ConfigError(message)


class Config(Record):
    enable: str = "auto"
    mode: str = "node"
    memory: str = "preferred"
    strict: bool = False
    verbose: bool = False
    guard: bool = True
    threads: str = "off"  # "off", "auto" or a decimal count
    warnings: tuple[str, ...] = ()

    @property
    def disabled(self) -> bool:
        return self.enable in ("0", "off")


def _choice(environ: Mapping[str, str], name: str, allowed: tuple[str, ...], default: str) -> str:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in allowed:
        raise _invalid(f"{name}={short(raw)} is not one of {', '.join(allowed)}")
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
    raise _invalid(f"{name}={short(raw)} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def parse_threads(raw: str | None, name: str = "NUMABIND_THREADS") -> str:
    """``off`` (default), ``auto`` or a positive integer, as a string."""
    if raw is None or raw.strip() == "":
        return "off"
    value = raw.strip().lower()
    if value in ("off", "0", "no", "false", "auto"):
        return "off" if value != "auto" else "auto"
    if value.isascii() and value.isdigit() and len(value) < 6 and 0 < int(value) < MAX_THREADS:
        return str(int(value))
    raise _invalid(f"{name}={short(raw)} is not off, auto or a thread count below {MAX_THREADS}")


def sysroot(environ: Mapping[str, str]) -> str:
    """Where the machine is read from: ``NUMABIND_SYSROOT`` (a capture laid out like ``/``,
    for tests and benchmarks; read like any capture, inside itself) or ``/``."""
    return environ.get("NUMABIND_SYSROOT") or "/"


def config_from_env(environ: Mapping[str, str]) -> Config:
    warnings: list[str] = []

    def cosmetic(name: str, default: bool) -> bool:
        try:
            return _flag(environ, name, default)
        except ValueError as err:  # a ConfigError: _flag raises nothing else
            warnings.append(f"{err}; using {'1' if default else '0'}")
            return default

    return Config(
        enable=_choice(environ, "NUMABIND", ENABLE_VALUES, "auto"),
        mode=_choice(environ, "NUMABIND_MODE", MODE_NAMES, "node"),
        memory=_choice(environ, "NUMABIND_MEMORY", MEMORY_POLICIES, "preferred"),
        strict=_flag(environ, "NUMABIND_STRICT", False),
        verbose=cosmetic("NUMABIND_VERBOSE", False),
        guard=cosmetic("NUMABIND_GUARD", True),
        threads=parse_threads(environ.get("NUMABIND_THREADS")),
        warnings=tuple(warnings),
    )
