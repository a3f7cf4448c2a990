"""The optional NVML backend, against NVML answers recorded in nvidiaDGX2.xml.

The real backend (PynvmlBackend) runs against a stand-in ``pynvml`` module that replays
those answers through the same function names nvidia-ml-py exposes, so the code that would
talk to a driver is the code under test."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import synth
from numabind._devices import resolve
from numabind._nvml import PynvmlBackend
from numabind._topology import Machine
from nvml_fake import RecordedNvml, nvml_osdevs, recorded_from_hwloc_osdevs


@pytest.fixture
def dgx2_nvml(hwloc_dir: Path) -> list[tuple[str, str, str | None]]:
    devs = nvml_osdevs(str(hwloc_dir / "nvidiaDGX2.xml"))
    assert len(devs) == 16
    return devs


def _dgx2_sysfs(devs: list[tuple[str, str, str | None]]) -> synth.Spec:
    """The DGX-2's GPUs in sysfs, without /proc/driver/nvidia (no UUIDs from files)."""
    gpus = [synth.Gpu(pci, 0 if int(name[4:]) < 8 else 1, device=0x1DB8) for name, pci, _ in devs]
    return synth.Spec(
        nodes=[[0, 1], [24, 25]], package_of_node=[0, 1], gpus=gpus, proc_nvidia=False
    )


def test_recorded_nvml_maps_uuid_to_pci(dgx2_nvml: list[tuple[str, str, str | None]]) -> None:
    nvml = recorded_from_hwloc_osdevs(dgx2_nvml)
    _name, pci, uuid = dgx2_nvml[9]
    assert uuid is not None
    assert nvml.pci_of_uuid(uuid) == pci
    assert nvml.pci_of_uuid(uuid[:10]) == pci, "short UUID prefixes as CUDA accepts them"
    assert nvml.pci_of_uuid("GPU-ffffffff") is None


def test_uuid_visible_devices_through_nvml(
    dgx2_nvml: list[tuple[str, str, str | None]], synth_machine: Callable[[synth.Spec], Machine]
) -> None:
    m = synth_machine(_dgx2_sysfs(dgx2_nvml))
    _, pci, uuid = dgx2_nvml[12]
    assert uuid
    without = resolve(m, {"CUDA_VISIBLE_DEVICES": uuid})
    assert without.problem and "cannot be checked" in without.problem
    v = resolve(m, {"CUDA_VISIBLE_DEVICES": uuid}, recorded_from_hwloc_osdevs(dgx2_nvml))
    assert [d.pci for d in v.devices] == [pci] and v.problem is None


def _fake_pynvml(
    devs: list[tuple[str, str, str | None]], fail: Exception | None = None
) -> types.ModuleType:
    mod = types.ModuleType("pynvml")
    handles = {
        i: (f"{'00000000:' + pci[5:].upper()}", uuid) for i, (_, pci, uuid) in enumerate(devs)
    }

    class PciInfo:
        def __init__(self, bus: str) -> None:
            self.busId = bus.encode()

    def init() -> None:
        if fail:
            raise fail

    mod.nvmlInit = init  # type: ignore[attr-defined]
    mod.nvmlDeviceGetCount = lambda: len(handles)  # type: ignore[attr-defined]
    mod.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    mod.nvmlDeviceGetPciInfo = lambda h: PciInfo(handles[h][0])  # type: ignore[attr-defined]
    mod.nvmlDeviceGetUUID = lambda h: handles[h][1]  # type: ignore[attr-defined]
    mod.nvmlDeviceGetName = lambda h: b"Tesla V100-SXM3-32GB-H"  # type: ignore[attr-defined]
    mod.nvmlDeviceGetNumaNodeId = lambda h: 0 if h < 8 else 1  # type: ignore[attr-defined]

    def affinity(h: int, n: int) -> list[int]:
        return [0x3] if h < 8 else [0x3 << 24]

    mod.nvmlDeviceGetCpuAffinity = affinity  # type: ignore[attr-defined]

    def mig_count(h: int) -> int:
        return 1 if h == 3 else 0

    mod.nvmlDeviceGetMaxMigDeviceCount = mig_count  # type: ignore[attr-defined]
    mod.nvmlDeviceGetMigDeviceHandleByIndex = lambda h, j: 100 + h  # type: ignore[attr-defined]
    real_uuid = mod.nvmlDeviceGetUUID

    def uuid(h: int) -> Any:
        return "MIG-0a1b2c3d-0000-1111-2222-333344445555" if h >= 100 else real_uuid(h)

    mod.nvmlDeviceGetUUID = uuid  # type: ignore[attr-defined]
    return mod


def test_pynvml_backend_normalizes_bus_ids(
    dgx2_nvml: list[tuple[str, str, str | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(dgx2_nvml))
    nvml = PynvmlBackend()
    gpus = nvml.gpus()
    assert [g["pci"] for g in gpus] == [pci for _, pci, _ in dgx2_nvml]
    assert gpus[0]["cpu_affinity"] == [0, 1] and gpus[8]["cpu_affinity"] == [24, 25]
    assert nvml.mig_parent_pci("MIG-0a1b2c3d-0000-1111-2222-333344445555") == dgx2_nvml[3][1]
    assert nvml.error is None


def test_pynvml_without_driver_answers_none(
    dgx2_nvml: list[tuple[str, str, str | None]], monkeypatch: pytest.MonkeyPatch
) -> None:
    class NVMLError_LibraryNotFound(Exception):
        pass

    monkeypatch.setitem(
        sys.modules,
        "pynvml",
        _fake_pynvml(dgx2_nvml, NVMLError_LibraryNotFound("NVML Shared Library Not Found")),
    )
    nvml = PynvmlBackend()
    assert (
        nvml.gpus() == []
        and nvml.pci_of_uuid("GPU-1") is None
        and nvml.mig_parent_pci("MIG-1") is None
    )
    assert nvml.error and "LibraryNotFound" in nvml.error


def test_recorded_nvml_from_json() -> None:
    nvml = RecordedNvml(
        {
            "gpus": [{"index": 0, "pci": "00000000:3B:00.0", "uuid": "GPU-abc"}],
            "mig": {"MIG-x": "0000:3b:00.0"},
        }
    )
    assert (
        nvml.pci_of_uuid("GPU-ABC") == "0000:3b:00.0"
        and nvml.mig_parent_pci("mig-x") == "0000:3b:00.0"
    )
