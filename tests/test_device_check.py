"""scripts/device-check, ready for a real GPU and tested against a recorded fake: a fake
``nvidia-smi`` and a fake ``pynvml`` replay what NVIDIA's tools answer on a DGX H100
(the layout tests/synth.py generates), and the check must pass when they agree with
numabind and name the disagreement when they do not.  The recording it writes is what
tests/nvml_fake.py replays."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import synth
from nvml_fake import RecordedNvml
from support import clean_env, two_cpus

ROOT = Path(__file__).resolve().parent.parent

FAKE_PYNVML = """
import json, os
_DATA = json.load(open(os.environ["FAKE_NVML"]))["gpus"]
class _Pci:
    def __init__(self, bus): self.busId = bus.encode()
def nvmlInit(): pass
def nvmlDeviceGetCount(): return len(_DATA)
def nvmlDeviceGetHandleByIndex(i): return _DATA[i]
def nvmlDeviceGetPciInfo(h): return _Pci(h["nvml_bus"])
def nvmlDeviceGetUUID(h): return h["uuid"]
def nvmlDeviceGetName(h): return h["name"]
def nvmlDeviceGetNumaNodeId(h): return h["numa_node"]
def nvmlDeviceGetCpuAffinity(h, n):
    words = [0] * n
    for c in h["cpu_affinity"]:
        words[c // 64] |= 1 << (c % 64)
    return words
def nvmlDeviceGetMigMode(h): return (0, 0)
"""


def _fake_tools(tmp: Path, swap_numa: bool = False, driver: Path | None = None) -> dict[str, str]:
    spec = synth.dgx_h100(filler_pci=0)
    root = synth.write(spec, str(tmp / "dgx"))
    gpus = []
    for i, g in enumerate(spec.gpus[:8]):
        node = g.node
        gpus.append(
            {
                "index": i,
                "nvml_bus": "0000" + g.bdf.upper(),
                "uuid": g.uuid,
                "name": "NVIDIA H100 80GB HBM3",
                "numa_node": node,
                "cpu_affinity": spec.nodes[node],
            }
        )
    (tmp / "nvml.json").write_text(json.dumps({"gpus": gpus}))
    mods = tmp / "mods"
    mods.mkdir()
    (mods / "pynvml.py").write_text(FAKE_PYNVML)
    bindir = tmp / "bin"
    bindir.mkdir()
    from numabind._sysfs import format_cpulist

    header = (
        "\t" + "\t".join(f"GPU{i}" for i in range(8)) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
    )
    rows = []
    for i, g in enumerate(gpus):
        numa = g["numa_node"] if not swap_numa else 1 - g["numa_node"]
        links = "\t".join("X" if j == i else "NV18" for j in range(8))
        rows.append(f"GPU{i}\t{links}\t{format_cpulist(g['cpu_affinity'])}\t{numa}\t\tN/A")
    topo = "\n".join([header, *rows, "", "Legend:", "  X    = Self"]) + "\n"
    (tmp / "topo.txt").write_text(topo)
    csv = "\n".join(
        f"{g['index']}, {g['nvml_bus']}, {g['uuid']}, {g['name']}, Disabled" for g in gpus
    )
    (tmp / "query.csv").write_text(csv + "\n")
    smi = bindir / "nvidia-smi"
    smi.write_text(
        f'#!/bin/sh\nif [ "$1" = topo ]; then cat {tmp}/topo.txt; else cat {tmp}/query.csv; fi\n'
    )
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    return clean_env(
        NUMABIND_SYSROOT=root,
        FAKE_NVML=str(tmp / "nvml.json"),
        PYTHONPATH=str(mods),
        PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        LD_LIBRARY_PATH=str(driver) if driver else "/nonexistent",
    )


def _run(env: dict[str, str], out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "device_check.py"), "--out", str(out), *extra],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


@two_cpus
def test_device_check_agrees_with_a_faithful_fake(tmp_path: Path, standin: dict[str, Path]) -> None:
    env = _fake_tools(tmp_path, driver=standin["libcuda.so.1"])
    fixture = tmp_path / "nvml-fake-dgx.json"
    r = _run(env, tmp_path / "out", "--fixture", str(fixture))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "8 GPU(s) from pynvml; 0 disagreement(s)" in r.stdout
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["hook"]["rc"] == 0 and report["check"]["rc"] == 0
    reg = report["registration"]  # the stand-in libcuda.so.1 registered the buffer
    assert reg["registered"] and reg["with_"] == "CUDA driver" and not reg["problems"], reg
    recording = json.loads(fixture.read_text())
    text = json.dumps(recording)
    assert synth._uuid(3) not in text, "UUIDs are scrubbed"
    # the recording replays through the NVML fake, against its own scrubbed capture
    from numabind._devices import resolve
    from numabind._topology import Machine

    nvml = RecordedNvml({"gpus": [{**g, "pci": g["pci"]} for g in recording["gpus"]]})
    machine = Machine.from_capture(str(fixture.with_suffix(".tar.gz")))
    uuid = recording["gpus"][5]["uuid"]
    assert (
        resolve(machine, {"CUDA_VISIBLE_DEVICES": uuid}, nvml).devices[0].pci == synth.DGX_BDFS[5]
    )


@two_cpus
def test_device_check_names_a_disagreement(tmp_path: Path) -> None:
    env = _fake_tools(tmp_path, swap_numa=True)
    r = _run(env, tmp_path / "out")
    assert r.returncode == 1
    assert "DISAGREE: 0000:18:00.0: node 0 here, NUMA affinity 1 in topo -m" in r.stdout


def test_device_check_falls_back_to_nvidia_smi(tmp_path: Path) -> None:
    env = _fake_tools(tmp_path)
    env["PYTHONPATH"] = ""  # no pynvml: nvidia-smi's CSV query answers (it asks NVML too)
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); import device_check; "
        "gpus, source = device_check.nvml_answers(); print(source, json.dumps(gpus[3]))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(ROOT / "scripts")], capture_output=True, text=True, env=env
    )
    source, _, gpu = r.stdout.partition(" ")
    assert source == "nvidia-smi", r.stderr
    assert json.loads(gpu)["pci"] == synth.DGX_BDFS[3] and json.loads(gpu)["mig_mode"] == 0
    sys.path.insert(0, str(ROOT / "scripts"))
    import device_check

    topo = device_check.parse_topo((tmp_path / "topo.txt").read_text())
    assert topo[7]["numa_node"] == 1 and topo[0]["cpu_affinity"][:2] == [0, 1]
