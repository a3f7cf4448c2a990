"""Where a warm rank's time goes: the parts of the warm start, each a row of its own, beside
the whole, in one run (``python -c ...`` measured side by side, CPU time, paired median
ratios to ``bare``, as ``startup.py`` measures).

  bare          a fresh venv of the same Python, numabind's wheel installed, no trigger
  numactl       ``numactl --cpunodebind=0 --membind=0`` in front of it (the peer)
  import start  ``import _numabind_start`` (and its base) with no trigger: the code a
                warm rank loads before it replays anything
  + _ctypes     the same, then ``_numabind_base.Calls().get()``: what reading and setting
                a memory policy loads (a rank that sets one needs it)
  warm          the capture rank of ``startup.py`` (LOCAL_RANK=3 of a generated DGX H100,
                read as a capture): the whole warm start, its answer replayed

What is left of ``warm`` after ``+ _ctypes`` is the replay itself: the answers file, the
key, the witnesses (``startup.py``'s witnesses row), the inputs, the calls, the registry
entry.  Where the import rows cost more than a module's size says, compare ``import
empty``: a module with nothing in it, in the same directory.

Run: python benchmarks/warm_parts.py [--rounds N]    (NUMABIND_BENCH_SMALL=1: a few rounds)
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import SMALL, clean_env, interleaved, median_ms, table
from startup import Variants, _costs, _pythons

import synth


def _rows(tmp: Path, python: str, root: str) -> Variants:
    quiet = clean_env()
    site = next((tmp / "numabind" / "lib").glob("python*/site-packages"))
    (site / "_numabind_bench_empty.py").write_text("")
    subprocess.run([python, "-m", "compileall", "-q", str(site)], check=True)
    rows: Variants = {"bare": ([python, "-c", "pass"], quiet)}
    numactl = shutil.which("numactl")
    if numactl:
        rows["numactl"] = ([numactl, "--cpunodebind=0", "--membind=0", python, "-c", "pass"], quiet)
    rows["import empty"] = ([python, "-c", "import _numabind_bench_empty"], quiet)
    rows["import start"] = ([python, "-c", "import _numabind_start"], quiet)
    calls = "import _numabind_start, _numabind_base as b; b.Calls().get()"
    rows["+ _ctypes"] = ([python, "-c", calls], quiet)
    rank = clean_env(LOCAL_RANK="3", LOCAL_WORLD_SIZE="8", NUMABIND="force", NUMABIND_SYSROOT=root)
    rows["warm"] = ([python, "-c", "pass"], rank)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8 if SMALL else 200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="numabind-bench-") as tmp_name:
        tmp = Path(tmp_name)
        python = _pythons(argparse.Namespace(baseline=None), tmp)["numabind"]
        root = synth.write(synth.dgx_h100(), str(tmp / "dgx"))
        rows = _rows(tmp, python, root)
        warm = rows["warm"]
        probe = "import sys; print(sys.modules['_numabind_start'].handed_over)"
        for _ in range(2):  # the answer made, then replayed: the rows measure a replay
            said = subprocess.run(
                [python, "-c", probe], env=warm[1], capture_output=True, text=True, check=True
            ).stdout.strip()
        if said:
            raise SystemExit(f"warm_parts.py: the warm row does not replay ({said})")
        # the probe's command line is another answer: the row's own is made here, untimed
        subprocess.run(warm[0], env=warm[1], check=True)
        times = interleaved(rows, args.rounds, "cpu")
    cost = _costs(times)
    bare = median_ms(times["bare"])
    out = [[name, f"{median_ms(t):.2f}", f"{cost[name]:+.2f}"] for name, t in times.items()]
    print(
        f"the warm start's parts, CPU time, {args.rounds} interleaved rounds "
        f"({sys.version.split()[0]}), over bare {bare:.2f} ms\n"
    )
    print(table(["row", "median ms", "paired over bare ms"], out))
    replay = cost["warm"] - cost["+ _ctypes"]
    print(
        f"\nthe start modules {cost['import start']:+.2f} ms (an empty module "
        f"{cost['import empty']:+.2f} ms), _ctypes and the policy calls "
        f"{cost['+ _ctypes'] - cost['import start']:+.2f} ms, the replay {replay:+.2f} ms"
        + (f"; numactl {cost['numactl']:+.2f} ms" if "numactl" in cost else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
