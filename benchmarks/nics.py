"""What reading the RDMA adapters costs a rank at startup (``NUMABIND_NIC``), measured side
by side with the same hook without them, in one run.

The machine is a generated DGX A100 (256 CPUs, 8 GPUs, 10 RDMA adapters, the PCI tree),
read the way a rank reads it: bind-mounted over /sys in a private mount namespace where
root and unshare(1) allow, else as a capture (NUMABIND_SYSROOT).  Variants, interleaved
round by round, each reported as the median of its per-round ratio to ``hook`` (paired):

  inactive    python -c pass, no rank variable (what every other process pays)
  hook        LOCAL_RANK=3 of 8: plan and bind (no adapter is read)
  hook+nic    the same with NUMABIND_NIC=ucx,nvshmem: every adapter read, the machine's
              fair assignment computed, the variables set
  hook+nccl   NUMABIND_NIC=ucx,nccl: NCCL's node-wide rail list as well

The claim to check: ``hook`` costs what it cost before NICs existed (a rank that does not
ask loads and opens nothing of them: tests/test_transports.py counts it), and
``hook+nic`` / ``hook`` is the price of asking.

Run: python benchmarks/nics.py [--rounds N]   (NUMABIND_BENCH_SMALL=1: a few rounds)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import SMALL, clean_env, interleaved, median_ms, table

import synth
from support import as_live


def _variants(root: str, live: bool) -> dict[str, tuple[list[str], dict[str, str]]]:
    rank = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8", "NUMABIND": "force"}
    if not live:
        rank["NUMABIND_SYSROOT"] = root
    argv = [sys.executable, "-c", "pass"]
    return {
        "inactive": (argv, clean_env()),
        "hook": (argv, clean_env(**rank)),
        "hook+nic": (argv, clean_env(**rank, NUMABIND_NIC="ucx,nvshmem")),
        "hook+nccl": (argv, clean_env(**rank, NUMABIND_NIC="ucx,nccl")),
    }


def _timed(
    variants: dict[str, tuple[list[str], dict[str, str]]],
    rounds: int,
    namespace: list[str],
    tmp: Path,
) -> dict[str, list[float]]:
    """Interleaved rounds, inside the mount namespace when there is one."""
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


def _in_process_ms(root: str, repeat: int) -> tuple[float, float]:
    """The reading and the assignment alone, in this process (median ms of ``repeat``)."""
    from numabind._nics import assign, same_vendor
    from numabind._plan import device_node
    from numabind._topology import Machine

    reads, plans = [], []
    for _ in range(repeat):
        m = Machine.from_root(root)
        t0 = time.perf_counter()
        m.nics  # noqa: B018 - the read is what is timed
        t1 = time.perf_counter()
        assign(m, same_vendor(m, m.accelerators[3]), lambda d, m=m: device_node(m, d).node)
        t2 = time.perf_counter()
        reads.append(t1 - t0)
        plans.append(t2 - t1)
        m.close()
    return median_ms(reads), median_ms(plans)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8 if SMALL else 150)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="numabind-bench-nics-") as tmp_name:
        tmp = Path(tmp_name)
        root = synth.write(synth.dgx_a100(), str(tmp / "a100"))
        namespace, why_not = as_live(root)
        times = _timed(_variants(root, bool(namespace)), args.rounds, namespace, tmp)
        read_ms, assign_ms = _in_process_ms(root, 5 if SMALL else 50)
    hook = times["hook"]
    rows = []
    for name, samples in times.items():
        paired = statistics.median(a / b for a, b in zip(samples, hook))
        rows.append(
            [
                name,
                f"{median_ms(samples):.2f}",
                f"{median_ms(samples) - median_ms(hook):+.2f}",
                f"{paired:.3f}",
            ]
        )
    how = "read live, bind-mounted over /sys" if namespace else f"read as a capture ({why_not})"
    print(f"python -c pass on a generated DGX A100, {args.rounds} interleaved rounds, {how}\n")
    print(table(["variant", "median ms", "vs hook ms", "paired ratio to hook"], rows))
    ratio = statistics.median(a / b for a, b in zip(times["hook+nic"], hook))
    print(
        f"\nasking for NICs: hook+nic / hook = {ratio:.3f} (paired median); in this process, "
        f"read as a capture (every path resolved inside the tree, slower than /sys): the 10 "
        f"adapters {read_ms:.2f} ms, the machine's assignment {assign_ms:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
