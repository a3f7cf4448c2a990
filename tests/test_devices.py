"""Visible devices: CUDA/HIP/ROCR/ZE lists resolved over the GPUs this process can reach."""

from __future__ import annotations

from collections.abc import Callable

import pytest

import synth
from numabind._devices import resolve
from numabind._sysfs import normalize_pci
from numabind._topology import Machine
from nvml_fake import RecordedNvml

MakeMachine = Callable[[synth.Spec], Machine]


@pytest.fixture
def dgx(dgx_root: str) -> Machine:
    return Machine.from_root(dgx_root)


def pcis(v: object) -> list[str]:
    return [d.pci for d in v.devices]  # type: ignore[attr-defined]


def test_no_variable_means_all_reachable_in_pci_order(dgx: Machine) -> None:
    v = resolve(dgx, {})
    assert pcis(v) == synth.DGX_BDFS and v.vendor == "nvidia" and v.problem is None


@pytest.mark.parametrize(
    ("cvd", "expected"),
    [
        ("3,1", [synth.DGX_BDFS[3], synth.DGX_BDFS[1]]),
        (" 7 ", [synth.DGX_BDFS[7]]),
        (synth._uuid(5), [synth.DGX_BDFS[5]]),
        (synth._uuid(5)[:12], [synth.DGX_BDFS[5]]),  # short UUID prefix
        (synth._uuid(2).lower().replace("gpu-", "GPU-"), [synth.DGX_BDFS[2]]),
        (f"MIG-{synth._uuid(6)}/1/0", [synth.DGX_BDFS[6]]),  # legacy MIG-GPU-<uuid>/gi/ci
        ("0,foo,2", [synth.DGX_BDFS[0]]),  # CUDA stops at the first invalid entry
        ("1,9", [synth.DGX_BDFS[1]]),
        ("2,2", [synth.DGX_BDFS[2]]),
    ],
)
def test_cuda_visible_devices(dgx: Machine, cvd: str, expected: list[str]) -> None:
    v = resolve(dgx, {"CUDA_VISIBLE_DEVICES": cvd})
    assert pcis(v) == expected and v.problem is None


def test_invalid_tail_is_noted(dgx: Machine) -> None:
    v = resolve(dgx, {"CUDA_VISIBLE_DEVICES": "1,9,2"})
    assert any("index 9 is out of range" in n and "'9,2'" in n for n in v.notes)


@pytest.mark.parametrize(
    ("cvd", "problem"),
    [
        ("GPU-ffffffff", "no reachable GPU has UUID"),
        ("12", "index 12 is out of range (8 reachable)"),
        ("abc", "is neither an index nor a GPU-/MIG- UUID"),
        ("GPU-0000000", "matches 8 GPUs"),
    ],
)
def test_bad_lists_are_problems(dgx: Machine, cvd: str, problem: str) -> None:
    v = resolve(dgx, {"CUDA_VISIBLE_DEVICES": cvd})
    assert (
        v.devices == ()
        and v.problem
        and problem in v.problem
        and "CUDA_VISIBLE_DEVICES" in v.problem
    )


@pytest.mark.parametrize("cvd", ["", "-1", "-1,0"])
def test_hidden_gpus_are_not_problems(dgx: Machine, cvd: str) -> None:
    v = resolve(dgx, {"CUDA_VISIBLE_DEVICES": cvd})
    assert v.devices == () and v.problem is None


def test_mig_uuid_needs_nvml_or_one_gpu(dgx: Machine, synth_machine: MakeMachine) -> None:
    mig = "MIG-8e7d3f44-0b8a-5a5f-8e0b-2f3f3b5d7c11"
    v = resolve(dgx, {"CUDA_VISIBLE_DEVICES": mig})
    assert v.problem and "without NVML" in v.problem
    nvml = RecordedNvml({"gpus": [], "mig": {mig: "00000000:AB:00.0"}})
    v = resolve(dgx, {"CUDA_VISIBLE_DEVICES": mig}, nvml)
    assert pcis(v) == ["0000:ab:00.0"]


def test_container_mig_with_one_gpu(synth_machine: MakeMachine) -> None:
    spec = synth.container_2_of_8()
    for i, g in enumerate(spec.gpus[:8]):
        g.driver = i == 5
    m = synth_machine(spec)
    v = resolve(m, {"CUDA_VISIBLE_DEVICES": "MIG-1234"})
    assert pcis(v) == [synth.DGX_BDFS[5]]


def test_uuid_without_proc_files_uses_nvml(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.dgx_h100(proc_nvidia=False, filler_pci=0))
    v = resolve(m, {"CUDA_VISIBLE_DEVICES": synth._uuid(4)})
    assert v.problem and "cannot be checked" in v.problem
    nvml = RecordedNvml(
        {
            "gpus": [
                {"index": i, "pci": b.upper().replace("0000:", "00000000:"), "uuid": synth._uuid(i)}
                for i, b in enumerate(synth.DGX_BDFS)
            ]
        }
    )
    v = resolve(m, {"CUDA_VISIBLE_DEVICES": synth._uuid(4)}, nvml)
    assert pcis(v) == [synth.DGX_BDFS[4]]


def test_slurm_device_cgroup_renumbers(dgx: Machine) -> None:
    v = resolve(dgx, {"SLURM_STEP_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert pcis(v) == synth.DGX_BDFS[4:6]
    # without a device cgroup Slurm sets CUDA_VISIBLE_DEVICES to the gres indices themselves
    v = resolve(dgx, {"SLURM_STEP_GPUS": "4,5", "CUDA_VISIBLE_DEVICES": "4,5"})
    assert pcis(v) == synth.DGX_BDFS[4:6]


def test_mixed_models_warn_about_order(synth_machine: MakeMachine) -> None:
    spec = synth.dgx_h100(filler_pci=0)
    spec.gpus[1].device = 0x2331
    spec.gpus[1].uuid = None
    m = synth_machine(spec)
    # the model comes from the driver's information file, identical here: use the name
    devs = list(resolve(m, {}).devices)
    devs[1] = devs[1].replace(name="NVIDIA A100")
    from numabind._devices import _order_notes
    from numabind._model import AMD, NVIDIA

    assert any("CUDA_DEVICE_ORDER" in n for n in _order_notes(NVIDIA, tuple(devs), {}, []))
    assert not _order_notes(NVIDIA, tuple(devs), {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, [])
    assert not _order_notes(AMD, tuple(devs), {}, []), "a vendor without an order variable"


def test_ze_affinity_mask(synth_machine: MakeMachine) -> None:
    spec = synth.mi300x()
    for g in spec.gpus:
        g.vendor, g.pci_class, g.device = 0x8086, 0x038000, 0x0BD5
    m = synth_machine(spec)
    v = resolve(m, {"ZE_AFFINITY_MASK": "6.0,6.1,1"})
    assert pcis(v) == [spec.gpus[6].bdf, spec.gpus[1].bdf]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("00000000:3B:00.0", "0000:3b:00.0"),
        ("0000:3b:00.0", "0000:3b:00.0"),
        ("3B:00.0", "0000:3b:00.0"),
        ("0001:0A:1F.7", "0001:0a:1f.7"),
        ("nonsense", None),
        ("zz:00.0", None),
    ],
)
def test_normalize_pci(text: str, expected: str | None) -> None:
    assert normalize_pci(text) == expected


def test_amd_uuid_tokens_from_unique_id(synth_machine: MakeMachine) -> None:
    spec = synth.mi300x()
    for i, g in enumerate(spec.gpus):
        g.unique_id = f"{0xA3D6E2FA74D1B200 + i:x}"
    m = synth_machine(spec)
    assert m.all_accelerators[3].uuid == f"GPU-{0xA3D6E2FA74D1B203:x}"
    v = resolve(m, {"ROCR_VISIBLE_DEVICES": f"GPU-{0xA3D6E2FA74D1B206:x},1"})
    assert pcis(v) == [spec.gpus[6].bdf, spec.gpus[1].bdf]
    v = resolve(m, {"HIP_VISIBLE_DEVICES": f"GPU-{0xA3D6E2FA74D1B205:X}"})
    assert pcis(v) == [spec.gpus[5].bdf]
    # HIP renumbers what ROCR left; a UUID ROCR hid is not there any more
    v = resolve(m, {"ROCR_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": "1"})
    assert pcis(v) == [spec.gpus[5].bdf]
    v = resolve(
        m, {"ROCR_VISIBLE_DEVICES": "4,5", "HIP_VISIBLE_DEVICES": f"GPU-{0xA3D6E2FA74D1B200:x}"}
    )
    assert v.problem and "no reachable GPU has UUID" in v.problem


def test_amd_uuid_without_unique_id_says_why(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.mi300x())
    v = resolve(m, {"HIP_VISIBLE_DEVICES": "GPU-abcdef"})
    assert v.problem and "no unique_id in sysfs" in v.problem


def test_cuda_visible_devices_on_rocm_selects_amd(synth_machine: MakeMachine) -> None:
    m = synth_machine(synth.mi300x())
    v = resolve(m, {"CUDA_VISIBLE_DEVICES": "7"})  # ROCm reads it as HIP's fallback
    assert v.vendor == "amd" and pcis(v) == [synth.mi300x().gpus[7].bdf]


def test_intel_uuid_tokens_are_explained(synth_machine: MakeMachine) -> None:
    spec = synth.mi300x()
    for g in spec.gpus:
        g.vendor, g.pci_class, g.device = 0x8086, 0x038000, 0x0BD5
    v = resolve(synth_machine(spec), {"ZE_AFFINITY_MASK": "GPU-1234"})
    assert v.problem and "not a Level Zero device index" in v.problem


@pytest.mark.parametrize(
    "cvd",
    [
        ",".join(["0"] * 200_000),  # repeats: ends at the second entry
        ",".join(str(i) for i in range(100_000)),
        "9" * 5000,
        "²",
        "1\nnumabind: forged line",
        "GPU-" + "f" * 100_000,
    ],
)
def test_any_list_costs_what_the_devices_cost(dgx: Machine, cvd: str) -> None:
    import time

    t0 = time.perf_counter()
    v = resolve(dgx, {"CUDA_VISIBLE_DEVICES": cvd})
    assert time.perf_counter() - t0 < 2, "bounded by the 8 devices, not by the value"
    for text in (v.problem or "", *v.notes, v.source):
        assert "\n" not in text and len(text) < 2000
