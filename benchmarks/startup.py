"""What numabind's startup hook costs an interpreter: ``python -c pass`` measured side by side.

Variants, interleaved round by round (the machine is noisy; only ratios within one run mean
anything):
  bare      a fresh venv of the same Python, nothing installed
  inactive  the same venv plus numabind's wheel, no local rank in the environment (what
            every process on a machine pays)
  active    LOCAL_RANK=3 on a generated DGX H100 (224 CPUs, 8 GPUs, ~400 PCI functions)
            read through NUMABIND_SYSROOT: plan, bind, set the policy, migrate early pages
  nvml      a bare venv with nvidia-ml-py doing what NVML-based discovery (accelerate's
            --enable_cpu_affinity) pays before it knows anything: import pynvml + nvmlInit
            (no driver here, so nvmlInit fails fast; with a driver and persistence mode off
            it can take seconds)

Run: python benchmarks/startup.py    (NUMABIND_BENCH_SMALL=1: a few rounds, for CI)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from _common import ROOT, SMALL, clean_env, interleaved, median_ms, table

import synth


def main() -> int:
    rounds = 8 if SMALL else 200
    with tempfile.TemporaryDirectory(prefix="numabind-bench-") as tmp:
        base = getattr(sys, "_base_executable", sys.executable)
        venvs = {}
        for name in ("bare", "numabind"):
            venvs[name] = Path(tmp) / name
            subprocess.run([base, "-m", "venv", "--without-pip", str(venvs[name])], check=True)
        wheel_dir = Path(tmp) / "wheel"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "-w",
                str(wheel_dir),
                str(ROOT),
            ],
            check=True,
        )
        site = next((venvs["numabind"] / "lib").glob("python*/site-packages"))
        with zipfile.ZipFile(next(wheel_dir.glob("numabind-*.whl"))) as whl:
            whl.extractall(site)
        subprocess.run(
            [str(venvs["numabind"] / "bin" / "python"), "-m", "compileall", "-q", str(site)],
            check=True,
        )
        root = synth.write(synth.dgx_h100(), str(Path(tmp) / "dgx"))
        bare_py = str(venvs["bare"] / "bin" / "python")
        nb_py = str(venvs["numabind"] / "bin" / "python")
        active = clean_env(
            LOCAL_RANK="3", LOCAL_WORLD_SIZE="8", NUMABIND_SYSROOT=root, NUMABIND="force"
        )
        variants = {
            "bare": ([bare_py, "-c", "pass"], clean_env()),
            "inactive": ([nb_py, "-c", "pass"], clean_env()),
            "active": ([nb_py, "-c", "pass"], active),
        }
        # the same bare venv plus nvidia-ml-py's pynvml module (one file), when it is here
        found = subprocess.run(
            [sys.executable, "-c", "import pynvml; print(pynvml.__file__)"],
            capture_output=True,
            text=True,
        )
        has_nvml = found.returncode == 0
        if has_nvml:
            nvml_venv = Path(tmp) / "nvml"
            subprocess.run([base, "-m", "venv", "--without-pip", str(nvml_venv)], check=True)
            shutil.copy(
                found.stdout.strip(), next((nvml_venv / "lib").glob("python*/site-packages"))
            )
            nvml = "import pynvml\ntry:\n pynvml.nvmlInit()\nexcept Exception:\n pass"
            variants["nvml"] = ([str(nvml_venv / "bin" / "python"), "-c", nvml], clean_env())
        times = interleaved(variants, rounds)
        # where the active hook's time goes: its imports, from -X importtime
        out = subprocess.run(
            [nb_py, "-X", "importtime", "-c", "pass"], env=active, capture_output=True, text=True
        )
        own = sum(
            int(line.split("|")[0].split(":")[1])
            for line in out.stderr.splitlines()
            if line.startswith("import time:") and ("numabind" in line or "_ctypes" in line)
        )
    med = {k: median_ms(v) for k, v in times.items()}
    rows = []
    for name, ms in med.items():
        rows.append([name, f"{ms:.2f}", f"{ms - med['bare']:+.2f}", f"{ms / med['bare']:.3f}"])
    print(f"python -c pass, median of {rounds} interleaved runs each ({sys.version.split()[0]})\n")
    print(table(["variant", "median ms", "vs bare ms", "ratio to bare"], rows))
    if not has_nvml:
        print("\n(nvml row skipped: nvidia-ml-py is not installed in this environment)")
    print(
        f"\nof which the active hook's own imports (numabind modules, _ctypes): {own / 1000:.2f} ms"
    )
    print(
        f"\nhook budget: inactive {med['inactive'] - med['bare']:+.2f} ms (target < 0.5), "
        f"active {med['active'] - med['bare']:+.2f} ms (target < 5)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
