"""Optional NVML backend, used only when files cannot answer.

Files answer almost everything (sysfs for locality, /proc/driver/nvidia for UUIDs).  NVML is
the fallback for two questions they cannot: which GPU a ``MIG-<uuid>`` belongs to, and a
GPU UUID when /proc/driver/nvidia is not mounted.  ``nvmlInit`` can take seconds with
persistence mode off, and ``import pynvml`` alone costs ~30 ms, so nothing here runs unless
one of those questions is asked.  The interface is small so that tests can run the NVIDIA
path against a recorded fake (tests/nvml_fake.py), built from answers a real NVML gave.

NVML writes bus ids as ``00000000:3B:00.0``; everything leaving this module is in sysfs
form (``0000:3b:00.0``).
"""

from __future__ import annotations

from ._model import uuid_matches
from ._sysfs import normalize_pci

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class NvmlBackend:
    """What numabind asks NVML.  Every method returns None when NVML cannot say."""

    def gpus(self) -> list[dict[str, Any]]:
        """One dict per GPU: index, pci (sysfs form), uuid, name, numa_node, cpu_affinity."""
        raise NotImplementedError

    def pci_of_uuid(self, uuid: str) -> str | None:
        found = uuid_matches(uuid, ((str(g.get("uuid", "")), str(g["pci"])) for g in self.gpus()))
        return found[0] if len(found) == 1 else None

    def mig_parent_pci(self, mig_uuid: str) -> str | None:
        raise NotImplementedError


class PynvmlBackend(NvmlBackend):
    """The real NVML through the ``pynvml`` module of ``nvidia-ml-py`` (``numabind[nvml]``).

    Initialised on first use; any NVML error makes every answer None, so a missing driver
    (NVMLError_LibraryNotFound) or an unloaded one (DriverNotLoaded) costs one attempt.
    """

    def __init__(self) -> None:
        self._nvml: Any = None
        self._failed: str | None = None
        self._cache: list[dict[str, Any]] | None = None

    @property
    def error(self) -> str | None:
        return self._failed

    def _init(self) -> Any:
        if self._nvml is None and self._failed is None:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception as err:  # ImportError, NVMLError_*: NVML is simply absent
                self._failed = f"{type(err).__name__}: {err}"
        return self._nvml

    def gpus(self) -> list[dict[str, Any]]:
        if self._cache is not None:
            return self._cache
        nv = self._init()
        out: list[dict[str, Any]] = []
        if nv is not None:
            try:
                for i in range(nv.nvmlDeviceGetCount()):
                    h = nv.nvmlDeviceGetHandleByIndex(i)
                    pci = nv.nvmlDeviceGetPciInfo(h)
                    bus = pci.busId.decode() if isinstance(pci.busId, bytes) else pci.busId
                    uuid = nv.nvmlDeviceGetUUID(h)
                    name = nv.nvmlDeviceGetName(h)
                    gpu: dict[str, Any] = {
                        "index": i,
                        "pci": normalize_pci(str(bus)) or str(bus),
                        "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                        "name": name.decode() if isinstance(name, bytes) else name,
                    }
                    try:
                        gpu["numa_node"] = nv.nvmlDeviceGetNumaNodeId(h)
                    except Exception:
                        gpu["numa_node"] = None
                    try:
                        words = nv.nvmlDeviceGetCpuAffinity(h, 64)
                        cpus = [
                            w * 64 + b
                            for w, word in enumerate(words)
                            for b in range(64)
                            if int(word) >> b & 1
                        ]
                        gpu["cpu_affinity"] = cpus
                    except Exception:
                        gpu["cpu_affinity"] = None
                    out.append(gpu)
            except Exception as err:
                self._failed = f"{type(err).__name__}: {err}"
        self._cache = out
        return out

    def mig_parent_pci(self, mig_uuid: str) -> str | None:
        nv = self._init()
        if nv is None:
            return None
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                try:
                    count = nv.nvmlDeviceGetMaxMigDeviceCount(h)
                except Exception:
                    continue
                for j in range(count):
                    try:
                        mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                    except Exception:
                        continue
                    uuid = nv.nvmlDeviceGetUUID(mig)
                    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                    if str(uuid).lower() == mig_uuid.lower():
                        bus = nv.nvmlDeviceGetPciInfo(h).busId
                        bus = bus.decode() if isinstance(bus, bytes) else bus
                        return normalize_pci(str(bus))
        except Exception:
            return None
        return None
