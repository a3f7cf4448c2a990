"""What numabind's startup hook costs an interpreter: ``python -c pass`` measured side by side.

Variants, interleaved round by round (the machine is noisy; only ratios within one run mean
anything), each reported as the median of the per-round ratios to ``bare`` (paired):
  bare      a fresh venv of the same Python, nothing installed
  empty     the same venv with an empty .pth file (what any .pth costs)
  inactive  the same venv plus numabind's wheel, no trigger variable in the environment
            (what every process on a machine pays)
  active    LOCAL_RANK=3 on a generated DGX H100 (224 CPUs, 8 GPUs, ~400 PCI functions)
            read through NUMABIND_SYSROOT: plan, bind, set the policy, migrate early pages
  nvml      a bare venv with nvidia-ml-py doing what NVML-based discovery (accelerate's
            --enable_cpu_affinity) pays before it knows anything: import pynvml + nvmlInit

``--baseline REF`` adds ``inactive@REF`` and ``active@REF``: the same, from another commit's
wheel (e.g. the previous release), measured in the same rounds.  Where valgrind is
installed the inactive variants are also counted in instructions (deterministic: the same
binary and environment give the same count, whatever else the machine does).

Run: python benchmarks/startup.py [--baseline REF] [--rounds N]
     (NUMABIND_BENCH_SMALL=1: a few rounds, for CI)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from _common import ROOT, SMALL, clean_env, interleaved, median_ms, table

import synth


def _venv(base: str, path: Path) -> Path:
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True)
    return next((path / "lib").glob("python*/site-packages"))


def _install_wheel(source: Path, site: Path, tmp: Path, name: str) -> None:
    wheel_dir = tmp / f"wheel-{name}"
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
            str(source),
        ],
        check=True,
    )
    with zipfile.ZipFile(next(wheel_dir.glob("numabind-*.whl"))) as whl:
        whl.extractall(site)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(site)], check=True)


def _instructions(python: str, env: dict[str, str]) -> int | None:
    if not shutil.which("valgrind"):
        return None
    counts = []
    for _ in range(3):
        p = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                python,
                "-c",
                "pass",
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        for line in p.stderr.splitlines():
            if "Collected" in line:
                counts.append(int(line.split()[-1]))
    return int(statistics.median(counts)) if counts else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", help="also measure the wheel of this git ref")
    ap.add_argument("--rounds", type=int, default=8 if SMALL else 200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="numabind-bench-") as tmp_name:
        tmp = Path(tmp_name)
        base = getattr(sys, "_base_executable", sys.executable)
        pythons = {}
        for name in ("bare", "empty", "numabind"):
            site = _venv(base, tmp / name)
            pythons[name] = str(tmp / name / "bin" / "python")
            if name == "empty":
                (site / "zz-empty.pth").write_text("")
            if name == "numabind":
                _install_wheel(ROOT, site, tmp, "head")
        if args.baseline:
            src = tmp / "baseline-src"
            subprocess.run(
                [
                    "git",
                    "-C",
                    str(ROOT),
                    "worktree",
                    "add",
                    "-q",
                    "--detach",
                    str(src),
                    args.baseline,
                ],
                check=True,
            )
            try:
                site = _venv(base, tmp / "baseline")
                _install_wheel(src, site, tmp, "baseline")
            finally:
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(src)], check=False
                )
            pythons["baseline"] = str(tmp / "baseline" / "bin" / "python")
        root = synth.write(synth.dgx_h100(), str(tmp / "dgx"))
        active = clean_env(
            LOCAL_RANK="3", LOCAL_WORLD_SIZE="8", NUMABIND_SYSROOT=root, NUMABIND="force"
        )
        quiet = clean_env()
        variants = {
            "bare": ([pythons["bare"], "-c", "pass"], quiet),
            "empty": ([pythons["empty"], "-c", "pass"], quiet),
            "inactive": ([pythons["numabind"], "-c", "pass"], quiet),
            "active": ([pythons["numabind"], "-c", "pass"], active),
        }
        if args.baseline:
            variants[f"inactive@{args.baseline}"] = ([pythons["baseline"], "-c", "pass"], quiet)
            variants[f"active@{args.baseline}"] = ([pythons["baseline"], "-c", "pass"], active)
        found = subprocess.run(
            [sys.executable, "-c", "import pynvml; print(pynvml.__file__)"],
            capture_output=True,
            text=True,
        )
        if found.returncode == 0:
            site = _venv(base, tmp / "nvml")
            shutil.copy(found.stdout.strip(), site)
            code = "import pynvml\ntry:\n pynvml.nvmlInit()\nexcept Exception:\n pass"
            variants["nvml"] = ([str(tmp / "nvml" / "bin" / "python"), "-c", code], quiet)
        times = interleaved(variants, args.rounds)
        counts = {}
        if not SMALL:
            for name in ("bare", "empty", "inactive") + (
                (f"inactive@{args.baseline}",) if args.baseline else ()
            ):
                counts[name] = _instructions(variants[name][0][0], quiet)
        out = subprocess.run(
            [pythons["numabind"], "-X", "importtime", "-c", "pass"],
            env=active,
            capture_output=True,
            text=True,
        )
        own = sum(
            int(line.split("|")[0].split(":")[1])
            for line in out.stderr.splitlines()
            if line.startswith("import time:") and ("numabind" in line or "_ctypes" in line)
        )
    bare = times["bare"]
    rows = []
    for name, samples in times.items():
        ratios = [a / b for a, b in zip(samples, bare)]
        paired = statistics.median(ratios)
        count = counts.get(name)
        inst = ""
        if count and counts.get("bare"):
            inst = f"{count / counts['bare'] - 1:+.2%}"
        rows.append(
            [
                name,
                f"{median_ms(samples):.2f}",
                f"{median_ms(samples) - median_ms(bare):+.2f}",
                f"{paired - 1:+.2%}",
                inst,
            ]
        )
    print(f"python -c pass, {args.rounds} interleaved rounds ({sys.version.split()[0]})\n")
    print(
        table(
            ["variant", "median ms", "vs bare ms", "paired median vs bare", "instructions vs bare"],
            rows,
        )
    )
    print(
        f"\nof which the active hook's own imports (numabind modules, _ctypes): {own / 1000:.2f} ms"
    )
    med = {k: median_ms(v) for k, v in times.items()}
    print(
        f"\nhook budget: inactive {med['inactive'] - med['bare']:+.2f} ms "
        "(target: under 1% of bare), "
        f"active {med['active'] - med['bare']:+.2f} ms (target < 5)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
