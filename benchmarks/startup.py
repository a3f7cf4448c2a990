"""What numabind's startup hook costs an interpreter: ``python -c pass`` measured side by side.

Variants, interleaved round by round (the machine is noisy; only ratios within one run mean
anything), each reported as the median of the per-round ratios to ``bare`` (paired):
  bare      a fresh venv of the same Python, nothing installed
  empty     the same venv with an empty .pth file (what any .pth costs)
  inactive  the same venv plus numabind's wheel, no trigger variable in the environment
            (what every process on a machine pays)
  active    LOCAL_RANK=3 on a generated DGX H100 (224 CPUs, 8 GPUs, ~400 PCI functions):
            plan, bind, set the policy, migrate early pages, register.  Read the way a
            rank reads it, from /sys and /proc/driver: the generated tree is bind-mounted
            over them in a private mount namespace (root and unshare(1) needed)
  capture   the same machine read as a capture (NUMABIND_SYSROOT): every path resolved
            inside the tree, every open checked to lie inside it; what the active row
            costs where no mount namespace is available
  one-node  LOCAL_RANK=0 on a generated one-node machine with one GPU (a workstation, a
            one-GPU cloud VM), read as a capture: the hook plans and has nothing to bind
  nvml      a bare venv with nvidia-ml-py doing what NVML-based discovery (accelerate's
            --enable_cpu_affinity) pays before it knows anything: import pynvml + nvmlInit

``--baseline REF`` adds ``inactive@REF``, ``active@REF``, ``capture@REF`` and
``one-node@REF``: the same, from another commit's wheel (e.g. the previous release),
measured in the same rounds.  Where valgrind is
installed the inactive variants are also counted in instructions (deterministic: the same
binary and environment give the same count, whatever else the machine does).

Run: python benchmarks/startup.py [--baseline REF] [--rounds N]
     (NUMABIND_BENCH_SMALL=1: a few rounds, for CI)
"""

from __future__ import annotations

import argparse
import json
import os
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
        live = clean_env(LOCAL_RANK="3", LOCAL_WORLD_SIZE="8", NUMABIND="force")
        capture = dict(live, NUMABIND_SYSROOT=root)
        one_node = clean_env(
            LOCAL_RANK="0", NUMABIND_SYSROOT=synth.write(synth.one_node(), str(tmp / "one-node"))
        )
        quiet = clean_env()
        namespace, why_not = _namespace(root)
        variants = {
            "bare": ([pythons["bare"], "-c", "pass"], quiet),
            "empty": ([pythons["empty"], "-c", "pass"], quiet),
            "inactive": ([pythons["numabind"], "-c", "pass"], quiet),
        }
        wheels = {"": pythons["numabind"]}
        if args.baseline:
            variants[f"inactive@{args.baseline}"] = ([pythons["baseline"], "-c", "pass"], quiet)
            wheels[f"@{args.baseline}"] = pythons["baseline"]
        for ref, python in wheels.items():
            if namespace:
                variants[f"active{ref}"] = ([python, "-c", "pass"], live)
            variants[f"capture{ref}"] = ([python, "-c", "pass"], capture)
            variants[f"one-node{ref}"] = ([python, "-c", "pass"], one_node)
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
        times = _timed(variants, args.rounds, namespace, tmp)
        counts = {}
        if not SMALL:
            for name in ("bare", "empty", "inactive") + (
                (f"inactive@{args.baseline}",) if args.baseline else ()
            ):
                counts[name] = _instructions(variants[name][0][0], quiet)
        out = subprocess.run(
            [*namespace, pythons["numabind"], "-X", "importtime", "-c", "pass"],
            env=live if namespace else capture,
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
    if not namespace:
        print(f"\nno active row (the live reader): {why_not}; the capture row stands in")
    med = {k: median_ms(v) for k, v in times.items()}
    hook = "active" if namespace else "capture"
    line = (
        f"\nhook budget: inactive {med['inactive'] - med['bare']:+.2f} ms "
        f"(target: under 1% of bare), {hook} {med[hook] - med['bare']:+.2f} ms"
    )
    if args.baseline:
        ref = f"{hook}@{args.baseline}"
        line += f" (target: no more than {ref}, {med[ref] - med['bare']:+.2f} ms)"
    print(line)
    return 0


def _namespace(root: str) -> tuple[list[str], str]:
    """The command prefix that runs a program with the generated machine mounted over
    /sys and /proc/driver in a private mount namespace, so that the hook reads it through
    the live reader exactly as on a real DGX; or ([], why that is not possible here)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("mount"):
        return [], "needs root, unshare(1) and mount(8)"
    if not os.path.isdir("/proc/driver"):
        return [], "this kernel's /proc has no driver directory to mount over"
    script = 'mount --bind "$0/sys" /sys && mount --bind "$0/proc/driver" /proc/driver && exec "$@"'
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, root]
    probe = subprocess.run(
        [*prefix, "cat", "/proc/driver/nvidia/gpus/0000:5d:00.0/information"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0 or "H100" not in probe.stdout:
        return [], f"a private mount namespace could not be set up ({probe.stderr.strip()!r})"
    return prefix, ""


def _timed(
    variants: dict[str, tuple[list[str], dict[str, str]]],
    rounds: int,
    namespace: list[str],
    tmp: Path,
) -> dict[str, list[float]]:
    """Interleaved rounds, all inside the mount namespace when there is one (the other
    variants read nothing under /sys: only the active rows see the mounts)."""
    if not namespace:
        return interleaved(variants, rounds)
    spec, result = tmp / "variants.json", tmp / "times.json"
    spec.write_text(json.dumps({"variants": variants, "rounds": rounds}))
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[3]); from _common import interleaved; "
        "s = json.load(open(sys.argv[1])); "
        "json.dump(interleaved({k: tuple(v) for k, v in s['variants'].items()}, s['rounds']), "
        "open(sys.argv[2], 'w'))"
    )
    here = str(Path(__file__).resolve().parent)
    subprocess.run(
        [*namespace, sys.executable, "-c", code, str(spec), str(result), here], check=True
    )
    times: dict[str, list[float]] = json.loads(result.read_text())
    return times


if __name__ == "__main__":
    sys.exit(main())
