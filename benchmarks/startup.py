"""What numabind's startup hook costs an interpreter: ``python -c pass`` measured side by side.

Variants, interleaved round by round (the machine is noisy; only ratios within one run mean
anything), each measured in CPU time (the child's own rusage; ``--clock wall`` for wall
time) and reported as the median of the per-round ratios to ``bare`` (paired).  Each rank
row comes three ways: warm (the node's machine cache is there: the start module's fast
path), ``cold`` (no cache: this rank reads the machine for the node and writes it; the
cache files of that row are removed before each of its runs, untimed) and ``full``
(``NUMABIND_CACHE=0``: the full path, reading sysfs as before the cache):
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
  outside   the capture with this host's CPU 1 moved to the far node: the rank starts
            with a CPU off its node (as a torchrun rank starts with every CPU), so the
            hook reads numa_maps for early pages off the node (active and capture ranks
            start inside their node, like a rank srun or a pod's cpuset confined: there
            the kernel has placed every page on the node already)
  one-node  LOCAL_RANK=0 on a generated one-node machine with one GPU (a workstation, a
            one-GPU cloud VM), read as a capture: the hook plans and has nothing to bind
  numactl   the peer a user would pick instead: ``numactl --cpunodebind=0 --membind=0``
            in front of the bare venv's ``python -c pass``
  witnesses the capture rank beside the same answer with its witness lines taken out,
            in rounds of their own: what checking that the machine is unchanged costs
  nvml      a bare venv with nvidia-ml-py doing what NVML-based discovery (accelerate's
            --enable_cpu_affinity) pays before it knows anything: import pynvml + nvmlInit

``--baseline REF`` adds ``inactive@REF``, ``active@REF``, ``capture@REF`` and
``one-node@REF``: the same, from another commit's wheel (e.g. the previous release),
measured in the same rounds.  Where valgrind is
installed the inactive variants are also counted in instructions (deterministic: the same
binary and environment give the same count, whatever else the machine does).

The budget (issue 35): a bound DGX rank warm costs at most twice the numactl trampoline's
cost over bare, a one-node rank warm at most once; cold no more than full.

Run: python benchmarks/startup.py [--baseline REF] [--rounds N] [--clock cpu|wall]
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
from support import as_live


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


def _pythons(args: argparse.Namespace, tmp: Path) -> dict[str, str]:
    """The interpreters compared: bare, with an empty .pth, with numabind's wheel, and
    (``--baseline``) with another commit's wheel."""
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
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "-q", "--detach", str(src), args.baseline], check=True)
        try:
            site = _venv(base, tmp / "baseline")
            _install_wheel(src, site, tmp, "baseline")
        finally:
            subprocess.run([*git, "remove", "--force", str(src)], check=False)
        pythons["baseline"] = str(tmp / "baseline" / "bin" / "python")
    return pythons


Variants = dict[str, tuple[list[str], dict[str, str]]]


def _variants(
    args: argparse.Namespace, tmp: Path, pythons: dict[str, str], namespace: list[str], root: str
) -> tuple[Variants, dict[str, str]]:
    live = clean_env(LOCAL_RANK="3", LOCAL_WORLD_SIZE="8", NUMABIND="force")
    capture = dict(live, NUMABIND_SYSROOT=root)
    one_root = synth.write(synth.one_node(), str(tmp / "one-node"))
    one_node = clean_env(LOCAL_RANK="0", NUMABIND_SYSROOT=one_root)
    # the DGX with this host's CPU 1 on the far node: rank 3 (node 0) starts with a CPU
    # off its node, as a torchrun rank starts with all of them, so the hook must look
    # where its early pages are (numa_maps) before it may leave them
    far = synth.dgx_h100()
    far.nodes = [[c for c in far.nodes[0] if c != 1], sorted([1, *far.nodes[1]])]
    far_root = synth.write(far, str(tmp / "dgx-far"))
    outside = dict(live, NUMABIND_SYSROOT=far_root)
    markers = {
        "active": "sysroot=/|",
        "capture": f"sysroot={root}|",
        "outside": f"sysroot={far_root}|",
        "one-node": f"sysroot={one_root}|",
    }
    cold: dict[str, str] = {}
    quiet = clean_env()
    bare = [pythons["bare"], "-c", "pass"]
    variants: Variants = {
        "bare": (bare, quiet),
        "empty": ([pythons["empty"], "-c", "pass"], quiet),
        "inactive": ([pythons["numabind"], "-c", "pass"], quiet),
    }
    numactl = shutil.which("numactl")
    if numactl:  # the peer a user would pick instead: a trampoline in front of bare python
        variants["numactl bare"] = ([numactl, "--cpunodebind=0", "--membind=0", *bare], quiet)
    wheels = {"": pythons["numabind"]}
    if args.baseline:
        variants[f"inactive@{args.baseline}"] = ([pythons["baseline"], "-c", "pass"], quiet)
        wheels[f"@{args.baseline}"] = pythons["baseline"]
    for ref, python in wheels.items():
        rows = {"active": live, "capture": capture, "outside": outside, "one-node": one_node}
        for name, env in rows.items():
            if name == "active" and not namespace:
                continue
            variants[f"{name}{ref}"] = ([python, "-c", "pass"], env)
            if ref:
                continue  # another commit's wheel: its own path, however it reads the machine
            variants[f"{name} cold"] = ([python, "-c", "pass"], env)
            cold[f"{name} cold"] = markers[name]
            variants[f"{name} full"] = ([python, "-c", "pass"], dict(env, NUMABIND_CACHE="0"))
    found = subprocess.run(
        [sys.executable, "-c", "import pynvml; print(pynvml.__file__)"],
        capture_output=True,
        text=True,
    )
    if found.returncode == 0:
        base = getattr(sys, "_base_executable", sys.executable)
        site = _venv(base, tmp / "nvml")
        shutil.copy(found.stdout.strip(), site)
        code = "import pynvml\ntry:\n pynvml.nvmlInit()\nexcept Exception:\n pass"
        variants["nvml"] = ([str(tmp / "nvml" / "bin" / "python"), "-c", code], quiet)
    return variants, cold


NUMPY = "import numpy"


def _numpy_rows(tmp: Path, pythons: dict[str, str], rank: dict[str, str]) -> Variants:
    """What users run: the same rank doing ``import numpy`` (its first import is where the
    warm start's guards arm), against a bare ``import numpy`` and numactl's.  numpy is put
    on PYTHONPATH (links to this interpreter's copy) for every row alike.  Timed in rounds
    of their own: a cold row of the main rounds removes the node's answers file, and a
    warm numpy rank run after it would find no answer and plan (it measured cold)."""
    import numpy

    variants: Variants = {}
    numactl = shutil.which("numactl")

    where = tmp / "numpy-path"
    where.mkdir()
    site = Path(numpy.__file__).resolve().parent.parent
    for name in ("numpy", "numpy.libs"):
        if (site / name).exists():
            (where / name).symlink_to(site / name)
    path = {"PYTHONPATH": str(where)}
    quiet = clean_env(**path)
    bare = [pythons["bare"], "-c", NUMPY]
    variants["bare numpy"] = (bare, quiet)
    if numactl:
        variants["numactl numpy"] = ([numactl, "--cpunodebind=0", "--membind=0", *bare], quiet)
    variants["rank numpy"] = ([pythons["numabind"], "-c", NUMPY], dict(rank, **path))
    variants["rank numpy full"] = (
        [pythons["numabind"], "-c", NUMPY],
        dict(rank, NUMABIND_CACHE="0", **path),
    )
    return variants


def _report_numpy(times: dict[str, list[float]]) -> None:
    """The numpy rows, each over a bare ``import numpy`` (paired, same rounds)."""
    if "bare numpy" not in times:
        return
    ref = times["bare numpy"]
    bare = median_ms(ref)

    def cost(name: str) -> float:
        return (statistics.median(a / b for a, b in zip(times[name], ref)) - 1) * bare

    line = f"  import numpy (over a bare import numpy, {bare:.2f} ms): "
    line += f"warm {cost('rank numpy'):+.2f} ms"
    line += f", full {cost('rank numpy full'):+.2f} ms"
    if "numactl numpy" in times:
        trampoline = cost("numactl numpy")
        line += (
            f"; numactl {trampoline:+.2f} ms: warm = {cost('rank numpy') / trampoline:.2f}x "
            "numactl's (target: at most 2x)"
        )
    print(line)


def _witness_rounds(
    args: argparse.Namespace, tmp: Path, pythons: dict[str, str], rank: dict[str, str]
) -> dict[str, list[float]]:
    """What the witnesses cost a warm rank: the capture rank against the same rank on a
    second copy of the machine whose answers file has had its witness lines taken out
    (everything else replayed alike), in rounds of their own beside bare.  Both answers are
    made by a first, untimed run of each; only then are the copy's witnesses removed."""
    sys.path.insert(0, str(ROOT / "src"))
    import _numabind_base as base

    copy = synth.write(synth.dgx_h100(), str(tmp / "dgx-unwitnessed"))
    python = pythons["numabind"]
    rows: Variants = {
        "bare": ([pythons["bare"], "-c", "pass"], clean_env()),
        "witnessed": ([python, "-c", "pass"], rank),
        "unwitnessed": ([python, "-c", "pass"], dict(rank, NUMABIND_SYSROOT=copy)),
    }
    for argv, env in rows.values():
        subprocess.run(argv, env=env, check=True)
    fd, _, why = base.open_cache_dir(os.environ, False)
    if fd is None:
        raise SystemExit(f"startup.py: no cache directory to take the witnesses out of ({why})")
    try:
        name = base.answers_name(copy)
        bad, data, _ = base.read_private(fd, name, (os.geteuid(),), base.CACHE_CAP)
        lines, why = base.unframe(data, "answers") if bad is None else ([], bad)
        if not lines or not any(line.startswith("w ") for line in lines):
            raise SystemExit(f"startup.py: the copy's answers file has no witnesses ({why})")
        kept = [line for line in lines if not line.startswith("w ")]
        if kept[-1] == "":  # the newline that ends the body (frame() adds it back)
            kept.pop()
        base.write_private(fd, name, base.frame("answers", kept), "answers")
    finally:
        os.close(fd)
    return interleaved(rows, args.rounds, args.clock)


def _report_witnesses(times: dict[str, list[float]]) -> None:
    """Both estimates, which disagree by more than the target on a noisy host: the two
    rows' costs over bare (as every other row is given) and their paired difference."""
    cost = _costs(times)
    with_them, without = cost["witnessed"], cost["unwitnessed"]
    pairs = [a - b for a, b in zip(times["witnessed"], times["unwitnessed"])]
    print(
        f"  witnesses (capture rank, its own rounds): warm {with_them:+.2f} ms, the same "
        f"answer without its witness lines {without:+.2f} ms: witnesses "
        f"{with_them - without:+.3f} ms (median of the paired differences "
        f"{statistics.median(pairs) * 1000:+.3f} ms; target: at most 0.1 ms)"
    )


def _own_imports_ms(python: str, namespace: list[str], env: dict[str, str]) -> float:
    """The hook's own imports by ``-X importtime``, run twice, the second counted: the
    command line is an input of the answer, and the first run of this one plans it."""
    command = [*namespace, python, "-X", "importtime", "-c", "pass"]
    subprocess.run(command, env=env, capture_output=True, check=False)
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    return (
        sum(
            int(line.split("|")[0].split(":")[1])
            for line in out.stderr.splitlines()
            if line.startswith("import time:")
            and ("numabind" in line or "_ctypes" in line or "_numabind_start" in line)
        )
        / 1000
    )


def _report(
    args: argparse.Namespace,
    times: dict[str, list[float]],
    counts: dict[str, int | None],
    own_ms: dict[str, float],
    why_not: str,
) -> None:
    bare, bare_count = times["bare"], counts.get("bare")
    rows = []
    for name, samples in times.items():
        if "numpy" in name:
            continue  # over a bare import numpy: _report_numpy
        paired = statistics.median(a / b for a, b in zip(samples, bare))
        count, inst = counts.get(name), ""
        if count and bare_count:
            inst = f"{count / bare_count - 1:+.2%}"
        rows.append(
            [
                name,
                f"{median_ms(samples):.2f}",
                f"{median_ms(samples) - median_ms(bare):+.2f}",
                f"{paired - 1:+.2%}",
                inst,
            ]
        )
    what = "CPU time" if args.clock == "cpu" else "wall time"
    print(f"python -c pass, {what}, {args.rounds} interleaved rounds ({sys.version.split()[0]})\n")
    print(
        table(
            ["variant", "median ms", "vs bare ms", "paired median vs bare", "instructions vs bare"],
            rows,
        )
    )
    print(
        "\nof which the hook's own imports (numabind modules, _numabind_start, _ctypes), by "
        "-X importtime: " + ", ".join(f"{k} {v:.2f} ms" for k, v in own_ms.items())
    )
    if why_not:
        print(f"\nno active row (the live reader): {why_not}; the capture row stands in")
    bare = median_ms(times["bare"])
    cost = _costs(times)
    hook = "capture" if why_not else "active"
    print(
        f"\nhook budget (paired, over bare {bare:.2f} ms): inactive {cost['inactive']:+.2f} ms "
        "(target: under 1% of bare)"
    )
    trampoline = cost.get("numactl bare")
    for name, times_budget in ((hook, 2), ("outside", 2), ("one-node", 1)):
        line = f"  {name}: warm {cost[name]:+.2f} ms, cold {cost[name + ' cold']:+.2f} ms, "
        line += f"full {cost[name + ' full']:+.2f} ms"
        if trampoline is not None:
            line += (
                f"; numactl {trampoline:+.2f} ms: warm = {cost[name] / trampoline:.2f}x "
                f"numactl's (target: at most {times_budget}x)"
            )
        print(line)
    if args.baseline:
        ref = f"{hook}@{args.baseline}"
        print(f"  {ref}: {cost[ref]:+.2f} ms (cold target: no more than this)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", help="also measure the wheel of this git ref")
    ap.add_argument("--rounds", type=int, default=8 if SMALL else 200)
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="numabind-bench-") as tmp_name:
        tmp = Path(tmp_name)
        pythons = _pythons(args, tmp)
        root = synth.write(synth.dgx_h100(), str(tmp / "dgx"))
        namespace, why_not = as_live(root)
        variants, cold = _variants(args, tmp, pythons, namespace, root)
        times = _timed(variants, args.rounds, namespace, tmp, args.clock, cold)
        rank = variants["active" if namespace else "capture"][1]
        numpy_rows = _numpy_rows(tmp, pythons, rank)
        # one round more, the first dropped: in a new mount namespace the first rank plans
        numpy_times = _timed(numpy_rows, args.rounds + 1, namespace, tmp, args.clock)
        times.update({k: v[1:] for k, v in numpy_times.items()})
        counts: dict[str, int | None] = {}
        if not SMALL:
            for name in ("bare", "empty", "inactive") + (
                (f"inactive@{args.baseline}",) if args.baseline else ()
            ):
                counts[name] = _instructions(variants[name][0][0], variants[name][1])
        live_one = _live_one_node(args, variants)
        witness_times = _witness_rounds(args, tmp, pythons, variants["capture"][1])
        hook = "active" if namespace else "capture"
        own_ms = {
            "warm": _own_imports_ms(pythons["numabind"], namespace, variants[hook][1]),
            "full": _own_imports_ms(pythons["numabind"], namespace, variants[f"{hook} full"][1]),
        }
    _report(args, times, counts, own_ms, why_not)
    _report_numpy(times)
    _report_live_one(live_one)
    _report_witnesses(witness_times)
    return 0


def _costs(times: dict[str, list[float]]) -> dict[str, float]:
    """Each variant's cost over bare in ms: the paired median ratio (robust to the host's
    drift within the run) times bare's median."""
    bare = median_ms(times["bare"])
    return {
        k: (statistics.median(a / b for a, b in zip(v, times["bare"])) - 1) * bare
        for k, v in times.items()
    }


def _live_one_node(args: argparse.Namespace, variants: Variants) -> dict[str, list[float]] | None:
    """A one-node rank on this host as it is (no capture, no mount namespace: a
    workstation's or a one-GPU VM's rank reads its own /sys), in rounds of its own beside
    bare and numactl: where this host has more than one node, None."""
    try:
        nodes = [n for n in os.listdir("/sys/devices/system/node") if n[4:].isdigit()]
    except OSError:
        return None
    if len(nodes) > 1:
        return None
    subset = {k: variants[k] for k in ("bare", "numactl bare") if k in variants}
    python, env = variants["one-node"][0][0], dict(variants["one-node"][1])
    env.pop("NUMABIND_SYSROOT", None)
    subset["one-node live"] = ([python, "-c", "pass"], env)
    return interleaved(subset, args.rounds, args.clock)


def _report_live_one(times: dict[str, list[float]] | None) -> None:
    if times is None:
        print("  one-node live: not measured (this host has more than one NUMA node)")
        return
    cost = _costs(times)
    mine = cost["one-node live"]
    line = f"  one-node live (LOCAL_RANK=0 on this one-node host, its own rounds): {mine:+.2f} ms"
    if "numactl bare" in times:
        trampoline = cost["numactl bare"]
        line += (
            f"; numactl {trampoline:+.2f} ms: {mine / trampoline:.2f}x "
            "numactl's (target: at most 1x)"
        )
    print(line)


def _timed(
    variants: dict[str, tuple[list[str], dict[str, str]]],
    rounds: int,
    namespace: list[str],
    tmp: Path,
    clock: str = "cpu",
    cold: dict[str, str] | None = None,
) -> dict[str, list[float]]:
    """Interleaved rounds, all inside the mount namespace when there is one (the other
    variants read nothing under /sys: only the active rows see the mounts; and the warm
    active row's cache is that namespace's)."""
    if not namespace:
        return interleaved(variants, rounds, clock, cold)
    spec, result = tmp / "variants.json", tmp / "times.json"
    spec.write_text(
        json.dumps({"variants": variants, "rounds": rounds, "clock": clock, "cold": cold or {}})
    )
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[3]); from _common import interleaved; "
        "s = json.load(open(sys.argv[1])); "
        "json.dump(interleaved({k: tuple(v) for k, v in s['variants'].items()}, s['rounds'], "
        "s['clock'], s['cold']), open(sys.argv[2], 'w'))"
    )
    here = str(Path(__file__).resolve().parent)
    subprocess.run(
        [*namespace, sys.executable, "-c", code, str(spec), str(result), here], check=True
    )
    times: dict[str, list[float]] = json.loads(result.read_text())
    return times


if __name__ == "__main__":
    sys.exit(main())
