"""Planning time on large generated machines, and how it grows with CPUs and devices.

The reference machine: 8 sockets x 64 cores x 2 threads (1024 CPUs), one node per socket,
64 accelerators (8 per socket).  'warm' plans on a Machine already read (the planner's
own cost); 'cold' includes reading the sysfs tree from scratch, which is what the startup
hook pays once per process.  Target: under 1 ms warm.

Run: python benchmarks/plan.py    (NUMABIND_BENCH_SMALL=1: small sizes, for CI)
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

from _common import SMALL, table

import synth
from numabind._devices import resolve
from numabind._plan import Request, plan
from numabind._topology import Machine


def machine_spec(sockets: int, cores: int, devices: int) -> synth.Spec:
    per = 2 * cores
    total = sockets * per
    nodes = [
        list(range(s * cores, (s + 1) * cores))
        + list(range(total // 2 + s * cores, total // 2 + (s + 1) * cores))
        for s in range(sockets)
    ]
    gpus = [
        synth.Gpu(
            f"{d // 32:04x}:{(d % 32) * 4 + 1:02x}:00.0",
            d * sockets // devices,
            uuid=f"GPU-{d:08x}-0000-0000-0000-000000000000",
            minor=d,
        )
        for d in range(devices)
    ]
    return synth.Spec(
        nodes=nodes,
        package_of_node=list(range(sockets)),
        smt=2,
        smt_stride=total // 2,
        gpus=gpus,
        memory_gib=64,
    )


def time_plan(root: str, devices: int, mode: str, iterations: int) -> tuple[float, float]:
    m = Machine.from_root(root)
    visible = resolve(m, {})
    for k in range(min(devices, 8)):  # warm the caches this mode reads
        plan(
            m,
            Request(
                local_rank=k,
                local_world_size=devices,
                rank_source="LOCAL_RANK",
                visible=visible,
                mode=mode,
            ),
        )
    warm = []
    for i in range(iterations):
        r = Request(
            local_rank=i % devices,
            local_world_size=devices,
            rank_source="LOCAL_RANK",
            visible=visible,
            mode=mode,
        )
        t0 = time.perf_counter()
        plan(m, r)
        warm.append(time.perf_counter() - t0)
    cold = []
    for i in range(max(iterations // 10, 3)):
        t0 = time.perf_counter()
        mc = Machine.from_root(root)
        plan(
            mc,
            Request(
                local_rank=i % devices,
                local_world_size=devices,
                rank_source="LOCAL_RANK",
                visible=resolve(mc, {}),
                mode=mode,
            ),
        )
        cold.append(time.perf_counter() - t0)
    return statistics.median(warm) * 1000, statistics.median(cold) * 1000


def main() -> int:
    iterations = 30 if SMALL else 400
    ref = (2, 8, 8) if SMALL else (8, 64, 64)
    rows = []
    with tempfile.TemporaryDirectory(prefix="numabind-plan-") as tmp:
        root = synth.write(machine_spec(*ref), f"{tmp}/ref")
        cpus = ref[0] * ref[1] * 2
        for mode in ("node", "socket", "exclusive", "core-complex"):
            warm, cold = time_plan(root, ref[2], mode, iterations)
            rows.append([mode, str(cpus), str(ref[2]), f"{warm:.3f}", f"{cold:.2f}"])
        print(
            f"planning one rank, median of {iterations} (warm) / {max(iterations // 10, 3)} (cold) "
            f"({sys.version.split()[0]})\n"
        )
        print(table(["mode", "CPUs", "devices", "warm ms", "cold ms (read + plan)"], rows))
        ok = all(float(r[3]) < 1.0 for r in rows)
        print(
            f"\nwarm planning under 1 ms on {cpus} CPUs / {ref[2]} devices: {'yes' if ok else 'NO'}"
        )

        growth = []
        cores_list = [4, 8] if SMALL else [8, 16, 32, 64]
        for cores in cores_list:
            r = synth.write(machine_spec(ref[0], cores, ref[2]), f"{tmp}/c{cores}")
            warm, cold = time_plan(r, ref[2], "node", iterations)
            growth.append(
                [f"{ref[0] * cores * 2} CPUs, {ref[2]} devices", f"{warm:.3f}", f"{cold:.2f}"]
            )
        dev_list = [2, 8] if SMALL else [8, 16, 32, 64]
        for devs in dev_list:
            r = synth.write(machine_spec(ref[0], ref[1], devs), f"{tmp}/d{devs}")
            warm, cold = time_plan(r, devs, "node", iterations)
            growth.append([f"{cpus} CPUs, {devs} devices", f"{warm:.3f}", f"{cold:.2f}"])
        print("\ngrowth (node mode)\n")
        print(table(["machine", "warm ms", "cold ms"], growth))
    return 0


if __name__ == "__main__":
    sys.exit(main())
