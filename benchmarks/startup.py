"""What numabind's startup hook costs an interpreter: ``python -c pass`` measured side by side.

Variants, interleaved round by round (the machine is noisy; only ratios within one run mean
anything):
  bare      a venv of the same Python without numabind
  inactive  numabind installed, no local rank in the environment (every process on a box)
  active    LOCAL_RANK=3 on a generated DGX H100 (224 CPUs, 8 GPUs, ~400 PCI functions)
            read through NUMABIND_SYSROOT: plan, bind, set the policy, migrate early pages
  nvml      what NVML-based discovery (accelerate's --enable_cpu_affinity) pays before it
            knows anything: import pynvml + nvmlInit (no driver here: it fails fast)

Run: python benchmarks/startup.py    (NUMABIND_BENCH_SMALL=1: a few rounds, for CI)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from _common import SMALL, clean_env, interleaved, median_ms, table

import synth


def main() -> int:
    rounds = 8 if SMALL else 200
    with tempfile.TemporaryDirectory(prefix="numabind-bench-") as tmp:
        bare = Path(tmp) / "bare"
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", "--without-pip", str(bare)], check=True)
        root = synth.write(synth.dgx_h100(), str(Path(tmp) / "dgx"))
        py = sys.executable
        variants = {
            "bare": ([str(bare / "bin" / "python"), "-c", "pass"], clean_env()),
            "inactive": ([py, "-c", "pass"], clean_env()),
            "active": (
                [py, "-c", "pass"],
                clean_env(
                    LOCAL_RANK="3", LOCAL_WORLD_SIZE="8", NUMABIND_SYSROOT=root, NUMABIND="force"
                ),
            ),
        }
        has_nvml = subprocess.run([py, "-c", "import pynvml"], capture_output=True).returncode == 0
        if has_nvml:
            variants["nvml"] = (
                [py, "-c", "import pynvml\ntry:\n pynvml.nvmlInit()\nexcept Exception:\n pass"],
                clean_env(),
            )
        times = interleaved(variants, rounds)
    med = {k: median_ms(v) for k, v in times.items()}
    rows = []
    for name, ms in med.items():
        rows.append([name, f"{ms:.2f}", f"{ms - med['bare']:+.2f}", f"{ms / med['bare']:.3f}"])
    print(f"python -c pass, median of {rounds} interleaved runs each ({sys.version.split()[0]})\n")
    print(table(["variant", "median ms", "vs bare ms", "ratio to bare"], rows))
    if not has_nvml:
        print("\n(nvml row skipped: nvidia-ml-py is not installed in this environment)")
    print(
        f"\nhook budget: inactive {med['inactive'] - med['bare']:+.2f} ms (target < 0.5), "
        f"active {med['active'] - med['bare']:+.2f} ms (target < 5)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
