"""numabind: put each GPU rank process on the CPUs and memory of its GPU's NUMA node.

``import numabind`` is light: the public names below load their modules on first use, so
the startup hook (which imports ``numabind._startup``) pays only for what it runs, and no
NVML, psutil or torch is ever imported here.
"""

from __future__ import annotations

__version__ = "0.3.0"  # the one place the version lives (hatch reads it here)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._api import State, apply, bind_thread, current, nics_for, numa_bound, plan_for
    from ._apply import Binding, ThreadBinding
    from ._children import child_binding, spawn
    from ._errors import (
        BindingError,
        CaptureError,
        ConfigError,
        IntegrationError,
        KernelError,
        NumabindError,
        RegistrationError,
    )
    from ._model import NicChoice
    from ._plan import Placement, Plan, Request, plan
    from ._topology import Machine
    from .check._report import report
    from .memory._memory import (
        HostBuffer,
        PlacementError,
        RangeBinding,
        bind_range,
        host_buffer,
        placement,
    )

__all__ = [
    "Binding",
    "BindingError",
    "CaptureError",
    "ConfigError",
    "HostBuffer",
    "IntegrationError",
    "KernelError",
    "Machine",
    "NicChoice",
    "NumabindError",
    "Placement",
    "PlacementError",
    "Plan",
    "RangeBinding",
    "RegistrationError",
    "Request",
    "State",
    "ThreadBinding",
    "__version__",
    "apply",
    "bind_range",
    "bind_thread",
    "child_binding",
    "current",
    "host_buffer",
    "nics_for",
    "numa_bound",
    "placement",
    "plan",
    "plan_for",
    "report",
    "spawn",
]

_LAZY = {
    "apply": "_api",
    "bind_thread": "_api",
    "current": "_api",
    "numa_bound": "_api",
    "nics_for": "_api",
    "NicChoice": "_model",
    "plan_for": "_api",
    "State": "_api",
    "Binding": "_apply",
    "ThreadBinding": "_apply",
    "child_binding": "_children",
    "spawn": "_children",
    "BindingError": "_errors",
    "CaptureError": "_errors",
    "ConfigError": "_errors",
    "IntegrationError": "_errors",
    "KernelError": "_errors",
    "NumabindError": "_errors",
    "RegistrationError": "_errors",
    "Placement": "_plan",
    "Plan": "_plan",
    "Request": "_plan",
    "plan": "_plan",
    "Machine": "_topology",
    "HostBuffer": "memory._memory",
    "PlacementError": "memory._memory",
    "RangeBinding": "memory._memory",
    "bind_range": "memory._memory",
    "host_buffer": "memory._memory",
    "placement": "memory._memory",
    "report": "check._report",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'numabind' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"numabind.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
