"""numabind's exceptions: one root, each kept on the standard base callers already catch.

``except numabind.NumabindError`` catches anything numabind raises on purpose; the second
base keeps older code working (``KernelError`` is an ``OSError`` with the kernel's
``errno``, ``BindingError`` a ``RuntimeError``, ``ConfigError`` a ``ValueError``).  Every
class survives pickling (a child's failure reaches its parent) and prints as one line.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class NumabindError(Exception):
    """Root of numabind's exceptions."""


class ConfigError(NumabindError, ValueError):
    """A ``NUMABIND_*`` variable or an API argument has a value numabind does not accept;
    the message names it, quotes the value and lists what is accepted."""


class CaptureError(NumabindError):
    """The input is not a capture (directory, tarball or hwloc XML) numabind can read."""


class BindingError(NumabindError, RuntimeError):
    """Raised in strict mode when a plan could not be applied (or was skipped), and when
    bindings are restored out of order."""


class IntegrationError(NumabindError, RuntimeError):
    """A framework changed an internal that numabind hooks (torch, Ray); the message names
    the internal and the versions numabind was tested against."""


class FrameworkMissing(IntegrationError, ImportError):
    """``numabind.torch.install()`` / ``numabind.ray.install()`` in a Python without the
    framework: one line naming the interpreter and the install command (an
    ``ImportError`` too, so ``except ImportError`` around an optional install works)."""


def require(module: str, product: str, pip: str, caller: str) -> None:
    """Raise :class:`FrameworkMissing` unless ``module`` can be imported here, so the
    user reads what is missing and where, not "No module named 'ray._private'"."""
    import importlib.util
    import sys

    loaded = sys.modules.get(module, False)
    try:
        found = bool(loaded) or (loaded is False and importlib.util.find_spec(module) is not None)
    except (ImportError, ValueError):
        found = False
    if not found:
        raise FrameworkMissing(
            f"{caller}: {product} is not installed for this Python ({sys.executable}); "
            f"install it ({pip}) or leave the call out"
        )


class DriverError(NumabindError, RuntimeError):
    """A GPU driver call failed; the message names the call and the driver's own name for
    the error (``CUDA_ERROR_OUT_OF_MEMORY (2)``)."""


class RegistrationError(DriverError):
    """Host memory could not be registered with the GPU driver where registration was
    required (``host_buffer(..., register=True)``); the message names the driver's error."""


class UsageError(NumabindError):
    """Bad command-line arguments or an unreadable input: one line, exit status 2."""


class KernelError(NumabindError, OSError):
    """A failed kernel call, with what was asked.  ``errno`` is the kernel's answer and
    ``call`` the system call's name; the message says what the errno means for that call
    (the meanings live in the kernel layer's table of system calls)."""

    def __init__(
        self, call: str, err: int, asked: str, meaning: str | None = None, said: str | None = None
    ) -> None:
        # ``said``: the message in the user's words, where the call and its arguments are
        # numabind's own business (NUMABIND_DEBUG=1 says those instead)
        super().__init__(err, said or f"{call}({asked}) failed: {meaning or os.strerror(err)}")
        self.call = call
        self.asked = asked
        self.meaning = meaning
        self.said = said

    def __str__(self) -> str:
        return str(self.strerror)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.call, self.errno, self.asked, self.meaning, self.said))
