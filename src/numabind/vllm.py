"""vLLM integration: the ``vllm.general_plugins`` entry point (``numabind =
"numabind.vllm:register"`` in numabind's metadata).

vLLM calls every function of that group in every process it creates, before the process
starts any work (``vllm/plugins/__init__.py``: ``load_general_plugins`` loads
``importlib.metadata.entry_points(group="vllm.general_plugins")``, filtered by
``VLLM_PLUGINS``, and calls each; a function that raises stops that process, so this one
never raises).  :func:`register` does, in that process:

* a process numabind bound already (the startup hook, a numabind child; the hook told its
  transports, vLLM's map included): nothing;
* ``NUMABIND_NIC`` names ``vllm``: the node's GPU-to-NIC map (``VLLM_GPU_NIC_PCIE_MAPPING``,
  ``VLLM_NIC_SELECTION_VARS``: numabind._transports) is set where it is unset, from
  numabind's own NIC choice, in the API server and engine processes too (they are no
  ranks, so the startup hook leaves them alone); workers inherit it, and vLLM's worker sets
  each transport's variable to its own GPU's adapter;
* and the worker is bound to its device when vLLM selects it
  (``torch.cuda.set_device`` / ``torch.accelerator.set_device_index`` in the worker's
  ``init_device``, before the model is loaded and memory allocated): numabind.torch's
  device-selection binding, every thread of the process included
  (``NUMABIND_TORCH_SET_DEVICE=0`` turns it off).

``NUMABIND=0`` makes it do nothing.  The plugin is optional: the startup hook alone binds
ranks that carry rank variables; this adds vLLM's own workers, which carry none.
"""

from __future__ import annotations

import os

from ._output import say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from ._environ import Config


def register() -> None:
    """The ``vllm.general_plugins`` entry point (see the module docstring); never raises,
    idempotent (vLLM may call it more than once in one process)."""
    try:
        _register(os.environ)
    except Exception as err:  # a plugin that raises ends vLLM's process: one line instead
        say(f"numabind.vllm: not registered: {type(err).__name__}: {err}")


def _register(environ: MutableMapping[str, str]) -> None:
    from ._apply import bound_plan
    from ._environ import Config

    cfg = Config.from_env(environ)
    if cfg.disabled:
        return
    if bound_plan(process=True) is not None:
        return  # bound by the hook or as a numabind child (its NIC variables with it)
    if "vllm" in cfg.nic.split(","):
        nic_map(cfg, environ)
    if cfg.torch_set_device and not _armed:
        _arm()


_armed: list[bool] = []


def _arm() -> None:
    """Bind on the worker's device selection, once torch is imported (vLLM imports it
    before it loads plugins; the hook waits for it otherwise)."""
    from ._guard import after_import

    def hook(module: object) -> None:
        from .torch import install_set_device

        install_set_device()

    _armed.append(True)
    after_import("torch", hook)


def nic_map(cfg: Config, environ: MutableMapping[str, str]) -> None:
    """Set vLLM's two NIC variables for this node where unset (the keep/replace rule of
    numabind._transports.apply_env), from the choice numabind makes for every GPU of the
    node's first accelerator vendor; said in verbose mode."""
    from ._nics import assign, same_vendor
    from ._plan import device_node
    from ._topology import Machine
    from ._transports import VLLM, apply_env

    with Machine.here() as machine:
        accs = machine.accelerators
        if not accs:
            return
        found = assign(
            machine,
            same_vendor(machine, accs[0]),
            lambda d: device_node(machine, d).node,
            cfg.nic_mode,
            cfg.nic_min_rate,
        )
    only = tuple(v.name for v in VLLM.variables)
    done = apply_env(cfg.nic, (), environ, per_gpu=found.per_device, only=only)
    if cfg.verbose:
        for line in (*done.warnings, *done.notes):
            if "no RDMA adapter chosen for this rank" not in line:
                say(f"numabind.vllm: {line}")
