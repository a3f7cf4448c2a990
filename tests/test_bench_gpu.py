"""``numabind bench``'s pinned host<->device copies, through the stand-in drivers
(tests/standin/, built from C by the tests and loaded under the real sonames): every call
the bench makes is one the stand-in checks (a device's context current at allocation and
copy, a copy only between *registered* host memory and that device's memory on its own
live stream), and its exit line says what the whole command left behind.

This host has one NUMA node: here the GPUs' buffers are local only, and the verdict says
there is nothing to compare; the multi-NUMA VM (tests/test_vm.py) measures a buffer on
each GPU's node against one on the other node, placement verified by the kernel."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import synth
from support import clean_env


@pytest.fixture(scope="module")
def nvidia_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """This host's one node (CPUs 0-1) with two NVIDIA GPUs on it."""
    spec = synth.Spec(
        nodes=[[0, 1]],
        package_of_node=[0],
        gpus=[synth.Gpu("0000:01:00.0", 0), synth.Gpu("0000:02:00.0", 0)],
        memory_gib=1,
    )
    return synth.write(spec, str(tmp_path_factory.mktemp("nv")))


@pytest.fixture(scope="module")
def amd_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    gpus = [
        synth.Gpu(f"0000:{b:02x}:00.0", 0, vendor=0x1002, device=0x74A1, pci_class=0x120000)
        for b in (0x05, 0x15)
    ]
    spec = synth.Spec(nodes=[[0, 1]], package_of_node=[0], gpus=gpus, memory_gib=1)
    return synth.write(spec, str(tmp_path_factory.mktemp("amd")))


def bench(
    root: str, libdir: Path | None, tmp: Path, *argv: str, **env: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, int], list[str]]:
    """Run the bench on ``root`` with the stand-in in ``libdir``; the process's result,
    the stand-in's exit counters and its call record."""
    exit_file = tmp / "standin-exit.txt"
    r = subprocess.run(
        [sys.executable, "-m", "numabind", "bench", "--only", "gpu", "--quick", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(
            NUMABIND_SYSROOT=root,
            LOCAL_WORLD_SIZE="2",
            LD_LIBRARY_PATH=str(libdir) if libdir else "/nonexistent",
            STANDIN_EXIT=str(exit_file),
            **env,
        ),
    )
    if not exit_file.exists():
        return r, {}, []
    first, *log = exit_file.read_text().splitlines()
    counters = {k: int(v) for k, v in (item.split("=") for item in first.split())}
    return r, counters, log


LEFT_NOTHING = {"registered": 0, "allocations": 0, "streams": 0, "retained": 0, "errors": 0}


def held(counters: dict[str, int]) -> dict[str, int]:
    return {k: counters[k] for k in LEFT_NOTHING}


def test_each_gpu_alone_and_both_at_once_through_the_driver(
    nvidia_root: str, standin: dict[str, Path], tmp_path: Path
) -> None:
    r, counters, log = bench(nvidia_root, standin["libcuda.so.1"], tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["measurements"] == [] and data["verdicts"] == []  # --only gpu
    gpu = data["gpu"]
    assert gpu["driver"] == "CUDA driver" and gpu["bytes"] == 16 << 20
    rows = {(tuple(c["devices"]), c["host"], c["kind"]): c for c in gpu["copies"]}
    assert set(rows) == {
        (devices, "local", kind) for devices in ((0,), (1,), (0, 1)) for kind in ("h2d", "d2h")
    }
    for c in gpu["copies"]:
        assert c["trusted"] and c["pages_verified_on_node"] == 1.0, c
        assert c["memory_nodes"] == c["gpu_nodes"] == [0] * len(c["devices"])
        assert len(c["samples"]) == 3 and c["value"] == max(c["samples"]) > 0
    assert "no remote host memory" in gpu["verdict"] and gpu["ratio"] is None
    # every check the stand-in makes held, and nothing is left: no registration, device
    # memory, stream or retained context; copies: per GPU 2 to warm up + 3 rounds x 2
    # kinds alone, then 3 rounds x 2 kinds x 3 copies x 2 GPUs together
    assert held(counters) == LEFT_NOTHING, log
    assert counters["copies"] == 2 * (2 + 6) + 36
    buses = [line.split()[1] for line in log if line.startswith("cuDeviceGetByPCIBusId")]
    assert set(buses) == {"0000:01:00.0", "0000:02:00.0"}
    allocs = [line for line in log if line.startswith("cuMemAlloc_v2")]
    assert sorted(allocs) == [f"cuMemAlloc_v2 {16 << 20} on device {d}" for d in (0, 1)]


def test_the_gpus_copy_at_the_same_time(
    nvidia_root: str, standin: dict[str, Path], tmp_path: Path
) -> None:
    """'At once' is at once: with each copy taking 30 ms the stand-in sees both GPUs'
    copies under way together (the driver calls release the GIL, the threads start at a
    barrier), and the aggregate rate is about twice one GPU's."""
    r, counters, _ = bench(
        nvidia_root, standin["libcuda.so.1"], tmp_path, "--json", STANDIN_COPY_US="30000"
    )
    assert r.returncode == 0, r.stderr
    assert counters["max_in_flight"] == 2 and counters["errors"] == 0
    rows = json.loads(r.stdout)["gpu"]["copies"]
    one = max(c["value"] for c in rows if c["devices"] == [0] and c["kind"] == "h2d")
    both = max(c["value"] for c in rows if c["devices"] == [0, 1] and c["kind"] == "h2d")
    assert both > 1.5 * one, (one, both)


def test_rank_selects_its_gpu(nvidia_root: str, standin: dict[str, Path], tmp_path: Path) -> None:
    r, counters, _ = bench(nvidia_root, standin["libcuda.so.1"], tmp_path, "--rank", "1", "--json")
    assert r.returncode == 0, r.stderr
    copies = json.loads(r.stdout)["gpu"]["copies"]
    assert {tuple(c["devices"]) for c in copies} == {(1,)} and len(copies) == 2
    assert counters["allocations"] == 0 and counters["errors"] == 0


def test_text_report(nvidia_root: str, standin: dict[str, Path], tmp_path: Path) -> None:
    r, _, _ = bench(nvidia_root, standin["libcuda.so.1"], tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(
        line.startswith("Pinned host<->device copies through the CUDA driver (16 MiB")
        for line in lines
    )
    header = next(line for line in lines if "h2d local" in line)
    assert header.split() == [
        "GPU",
        "node",
        "h2d",
        "local",
        "h2d",
        "remote",
        "d2h",
        "local",
        "d2h",
        "remote",
    ]
    assert any(line.split()[:2] == ["0", "0"] for line in lines)
    assert any(line.strip().startswith("all 2 at once") for line in lines)
    assert lines[-1].startswith("  verdict: one NUMA node near the GPUs")


def test_svg_has_a_bar_per_pinned_copy_row(
    nvidia_root: str, standin: dict[str, Path], tmp_path: Path
) -> None:
    svg = tmp_path / "bench.svg"
    r, _, _ = bench(nvidia_root, standin["libcuda.so.1"], tmp_path, "--svg", str(svg))
    assert r.returncode == 0, r.stderr
    text = svg.read_text()
    assert "pinned host&lt;-&gt;device copies (GB/s)" in text, text[:2000]
    for label in ("GPU 0 h2d local", "GPU 1 d2h local", "all 2 h2d local"):
        assert label in text
    assert text.count("<rect") >= 6 and "pinned copies: one NUMA node near the GPUs" in text


def test_hip_through_the_same_path(amd_root: str, standin: dict[str, Path], tmp_path: Path) -> None:
    r, counters, log = bench(amd_root, standin["libamdhip64.so"], tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    gpu = json.loads(r.stdout)["gpu"]
    assert gpu["driver"] == "HIP runtime" and len(gpu["copies"]) == 6
    assert held(counters) == LEFT_NOTHING and counters["copies"] == 52, log
    assert any(line == f"hipMalloc {16 << 20} on device 1" for line in log), log


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"STANDIN_ALLOC_ERROR": "2"},
            "not measured: GPU 0: not measured: CUDA driver: cuMemAlloc_v2 failed: "
            "CUDA_ERROR_OUT_OF_MEMORY (2); GPU 1: not measured: CUDA driver: cuMemAlloc_v2",
        ),
        (
            {"STANDIN_INIT_ERROR": "100"},
            "no GPU driver (CUDA driver: cuInit failed: CUDA_ERROR_NO_DEVICE (100))",
        ),
    ],
)
def test_a_failing_driver_is_one_line_and_leaves_nothing_held(
    nvidia_root: str, standin: dict[str, Path], tmp_path: Path, env: dict[str, str], expected: str
) -> None:
    r, counters, log = bench(nvidia_root, standin["libcuda.so.1"], tmp_path, "--json", **env)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    gpu = json.loads(r.stdout)["gpu"]
    assert isinstance(gpu, str) and gpu.startswith(expected), gpu
    assert held(counters) == LEFT_NOTHING, log


def test_a_gpu_whose_buffer_cannot_be_registered_is_left_out_with_a_note(
    nvidia_root: str, standin: dict[str, Path], tmp_path: Path
) -> None:
    """The first registration fails (GPU 0's buffer): GPU 1 is still measured, alone
    only, and a note says why GPU 0 is not; nothing is left registered or allocated."""
    r, counters, log = bench(
        nvidia_root, standin["libcuda.so.1"], tmp_path, "--json", STANDIN_FAIL_AT="1"
    )
    assert r.returncode == 0, r.stderr
    gpu = json.loads(r.stdout)["gpu"]
    assert {tuple(c["devices"]) for c in gpu["copies"]} == {(1,)}
    (note,) = gpu["notes"]
    assert note.startswith("GPU 0: not measured: ") and "CUDA_ERROR_OUT_OF_MEMORY (2)" in note
    assert held(counters) == LEFT_NOTHING, log
    from numabind.cli._bench import gpu_text

    assert f"  note: {note}" in gpu_text(gpu)


def test_no_driver(nvidia_root: str, tmp_path: Path) -> None:
    r, _, _ = bench(nvidia_root, None, tmp_path, "--json")
    assert r.returncode == 0, r.stderr
    assert (
        json.loads(r.stdout)["gpu"] == "no GPU driver (no CUDA driver (libcuda.so.1 does not load))"
    )


def test_only_memory_skips_the_gpu(
    nvidia_root: str, standin: dict[str, Path], tmp_path: Path
) -> None:
    argv = ["bench", "--only", "memory", "--quick", "--json", "--size", "8"]
    r = subprocess.run(
        [sys.executable, "-m", "numabind", *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=clean_env(LD_LIBRARY_PATH=str(standin["libcuda.so.1"])),
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["gpu"] == "not measured (--only memory)" and data["measurements"]


def _row(
    devices: tuple[int, ...],
    host: str,
    kind: str,
    samples: tuple[float, ...],
    verified: float = 1.0,
) -> Any:
    from numabind.cli._bench import GpuCopy

    return GpuCopy(
        devices=devices, gpu_nodes=(0,) * len(devices), host=host,
        memory_nodes=(0 if host == "local" else 1,) * len(devices), kind=kind,
        value=max(samples), samples=samples, pages_verified_on_node=verified, bytes=1 << 26,
    )  # fmt: skip


def test_gpu_verdict() -> None:
    from numabind.cli._bench import gpu_verdict

    # one GPU alone is link-bound (no difference); all at once the remote socket's
    # interconnect is: the verdict rests on the rows of every GPU at once
    rows = [
        _row((0,), "local", "h2d", (25.0, 25.1, 24.9)),
        _row((0,), "remote", "h2d", (24.8, 25.0, 24.7)),
        _row((0, 1), "local", "h2d", (50.0, 49.0, 50.5)),
        _row((0, 1), "remote", "h2d", (31.0, 30.0, 32.0)),
        _row((0, 1), "local", "d2h", (48.0, 48.0, 48.0)),
        _row((0, 1), "remote", "d2h", (47.0, 47.5, 47.0)),
    ]
    text, ratio = gpu_verdict(rows)
    assert text.startswith("copies from a remote host buffer are 1.6x slower (h2d, 2 GPUs at once)")
    assert ratio is not None and 1.55 < ratio < 1.65
    # one GPU: its own rows decide; alike round by round is no difference
    text, ratio = gpu_verdict(rows[:2])
    assert text.startswith("no measurable difference (local/remote 1.0") and "GPU 0" in text
    # one quiet round does not make a difference: the paired rounds must agree
    noisy = [
        _row((0,), "local", "h2d", (40.0, 20.0, 20.0)),
        _row((0,), "remote", "h2d", (20.0, 20.5, 19.5)),
    ]
    assert gpu_verdict(noisy)[0].startswith("no measurable difference")
    assert "no trusted" in gpu_verdict([_row((0,), "local", "h2d", (1.0,), verified=0.5)])[0]
    assert "no remote host memory" in gpu_verdict(rows[:1])[0]


def test_bench_against_the_real_driver_where_there_is_a_gpu(tmp_path: Path) -> None:
    """The bench's pinned copies on the machine's own libcuda.so.1 when it has an NVIDIA
    GPU (every GPU alone and at once, buffers placed and registered for real); where it
    has none, that is what is checked, so a GPU machine cannot pass without running it."""
    import os

    if not (os.path.exists("/dev/nvidiactl") and os.path.exists("/dev/nvidia0")):
        assert not os.path.exists("/proc/driver/nvidia/gpus")
        return
    r = subprocess.run(
        [sys.executable, "-m", "numabind", "bench", "--only", "gpu", "--quick", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=clean_env(),
    )
    assert r.returncode == 0, r.stderr
    gpu = json.loads(r.stdout)["gpu"]
    assert isinstance(gpu, dict) and gpu["driver"] == "CUDA driver", gpu
    assert gpu["copies"] and all(c["value"] > 0 for c in gpu["copies"]), gpu
    assert all(c["trusted"] for c in gpu["copies"]), gpu
