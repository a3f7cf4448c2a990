"""The real-GPU check: numabind against NVIDIA's own answers on a machine with a GPU.

    scripts/device-check [--out DIR] [--fixture tests/data/nvml-NAME.json]

One short run for a machine with a real NVIDIA GPU (likely one NUMA node, no network):

1. ``numabind show --json`` is compared with ``nvidia-smi topo -m`` and with NVML's own
   answers (``pynvml`` from nvidia-ml-py when importable, else ``nvidia-smi --query-gpu``,
   which asks NVML too): PCI bus ids, UUIDs, CPU affinity, NUMA ids, MIG mode.  Any
   disagreement is a failure, named.
2. The answers are recorded (UUIDs and serials scrubbed consistently) into a fixture
   that tests/nvml_fake.py replays, together with a ``numabind gather`` capture of the
   machine, so the NVIDIA path is tested against a real machine's answers afterwards.
3. The startup hook on the real GPU (``LOCAL_RANK=0 NUMABIND_VERBOSE=1``), ``numabind
   check`` on that live rank, and ``numabind bench`` including pinned copies (through
   libcuda's own calls, from a registered buffer on the GPU's node and, where there is
   one, on a remote node; each GPU alone and all at once).
4. Host buffers registered with the real driver (``host_buffer(register=True)`` through
   libcuda, and ``numabind.torch.pinned_empty`` when torch has CUDA): registered,
   ``is_pinned()``, resident memory grown by the request and not by a power of two, every
   page on the buffer's node, and host-to-device copy bandwidth from it against
   ``torch.empty(pin_memory=True)`` (and from a remote node's buffer where there are two).

Exit status 0 when everything agrees; 1 with a list of disagreements.  Everything it
saw is written to --out (default: $OUT, else ./device-check-out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PY = sys.executable


def sh(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 300
) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: timed out"
    return p.returncode, p.stdout, p.stderr


def normalize_pci(text: str) -> str | None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from numabind._sysfs import normalize_pci as norm

    return norm(text)


def parse_cpus(text: str) -> list[int]:
    out: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            out.update(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.add(int(part))
    return sorted(out)


def parse_topo(text: str) -> dict[int, dict[str, Any]]:
    """``nvidia-smi topo -m``: per GPU index, its CPU affinity and NUMA affinity."""
    lines = [ln.rstrip("\n") for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    header = [h.strip() for h in re.split(r"\t+", lines[0].strip())]
    out: dict[int, dict[str, Any]] = {}
    for line in lines[1:]:
        cells = [c.strip() for c in re.split(r"\t+", line.strip())]
        name = cells[0]
        if not re.fullmatch(r"GPU\d+", name):
            continue
        row = dict(zip(header, cells[1:]))
        cpu = row.get("CPU Affinity", "")
        numa = row.get("NUMA Affinity", "")
        out[int(name[3:])] = {
            "cpu_affinity": parse_cpus(cpu) if re.fullmatch(r"[\d,\- ]+", cpu or "x") else None,
            "numa_node": int(numa) if numa.isdigit() else None,
        }
    return out


def nvml_answers() -> tuple[list[dict[str, Any]], str]:
    """Per GPU: index, pci, uuid, name, numa_node, cpu_affinity, mig_mode; and the source."""
    try:
        import pynvml
    except ImportError:
        pynvml = None
    gpus: list[dict[str, Any]] = []
    if pynvml is not None:
        try:
            pynvml.nvmlInit()
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                bus = pynvml.nvmlDeviceGetPciInfo(h).busId
                bus = bus.decode() if isinstance(bus, bytes) else bus
                uuid = pynvml.nvmlDeviceGetUUID(h)
                name = pynvml.nvmlDeviceGetName(h)
                gpu: dict[str, Any] = {
                    "index": i,
                    "pci": normalize_pci(str(bus)),
                    "uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
                    "name": name.decode() if isinstance(name, bytes) else name,
                }
                try:
                    gpu["numa_node"] = pynvml.nvmlDeviceGetNumaNodeId(h)
                except Exception:
                    gpu["numa_node"] = None
                try:
                    words = pynvml.nvmlDeviceGetCpuAffinity(h, 64)
                    gpu["cpu_affinity"] = [
                        w * 64 + b
                        for w, word in enumerate(words)
                        for b in range(64)
                        if int(word) >> b & 1
                    ]
                except Exception:
                    gpu["cpu_affinity"] = None
                try:
                    gpu["mig_mode"] = int(pynvml.nvmlDeviceGetMigMode(h)[0])
                except Exception:
                    gpu["mig_mode"] = None
                gpus.append(gpu)
            return gpus, "pynvml"
        except Exception as failure:
            print(f"device-check: pynvml failed ({failure}); asking nvidia-smi", file=sys.stderr)
    rc, out, err = sh(
        [
            "nvidia-smi",
            "--query-gpu=index,pci.bus_id,uuid,name,mig.mode.current",
            "--format=csv,noheader",
        ]
    )
    if rc != 0:
        raise SystemExit(f"device-check: no NVML answers: {err.strip() or rc}")
    for line in out.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 5:
            continue
        gpus.append(
            {
                "index": int(cells[0]),
                "pci": normalize_pci(cells[1]),
                "uuid": cells[2],
                "name": cells[3],
                "numa_node": None,
                "cpu_affinity": None,
                "mig_mode": {"Enabled": 1, "Disabled": 0}.get(cells[4]),
            }
        )
    return gpus, "nvidia-smi"


def compare(
    show: dict[str, Any], gpus: list[dict[str, Any]], topo: dict[int, dict[str, Any]]
) -> list[str]:
    """Every disagreement between numabind's view and NVIDIA's, one line each."""
    problems: list[str] = []
    ours = {d["pci"]: d for d in show["devices"] if d["vendor"] == "nvidia" and d["visible"]}
    theirs = {g["pci"]: g for g in gpus}
    if set(ours) != set(theirs):
        problems.append(f"GPUs: numabind sees {sorted(ours)}, NVML {sorted(theirs)}")
    nodes = {n["id"]: n for n in show["nodes"]}
    for pci, g in sorted(theirs.items()):
        d = ours.get(pci)
        if d is None:
            continue
        if d.get("uuid") and g.get("uuid") and d["uuid"].lower() != g["uuid"].lower():
            problems.append(f"{pci}: UUID {d['uuid']} here, {g['uuid']} from NVML")
        t = topo.get(int(g["index"]), {})
        cpu_node = t.get("numa_node")
        if cpu_node is not None and d.get("node") is not None and d["node"] != cpu_node:
            problems.append(f"{pci}: node {d['node']} here, NUMA affinity {cpu_node} in topo -m")
        nvml_node = g.get("numa_node")
        # NVML's NUMA id is the GPU's memory node on GH200/GB200, the CPU node elsewhere
        if (
            nvml_node is not None
            and nvml_node >= 0
            and nvml_node not in (d.get("node"), d.get("memory_node"))
        ):
            problems.append(
                f"{pci}: NVML NUMA id {nvml_node}, numabind node {d.get('node')} / memory "
                f"node {d.get('memory_node')}"
            )
        for source, cpus in (("NVML", g.get("cpu_affinity")), ("topo -m", t.get("cpu_affinity"))):
            if not cpus:
                continue
            mine = d.get("local_cpus")
            if mine is None and d.get("node") in nodes:
                mine = nodes[d["node"]]["cpus"]
            if mine is not None and sorted(mine) != sorted(cpus):
                problems.append(f"{pci}: CPU affinity {cpus} from {source}, {mine} here")
    for r in show["ranks"]:
        if r["status"] != "bound" and r.get("problem"):
            problems.append(f"rank {r['local_rank']}: {r['reason']}")
    return problems


def scrub(data: Any, uuids: dict[str, str]) -> Any:
    """Replace every UUID and serial with a stable stand-in (the same one everywhere)."""
    if isinstance(data, dict):
        return {k: scrub(v, uuids) for k, v in data.items() if k not in ("serial",)}
    if isinstance(data, list):
        return [scrub(v, uuids) for v in data]
    if isinstance(data, str):
        for real, fake in uuids.items():
            data = data.replace(real, fake)
        return data
    return data


def scrub_capture(path: Path, uuids: dict[str, str]) -> None:
    """Rewrite a gather tarball with the same stand-ins for UUIDs as the recording."""
    import io
    import tarfile

    if not path.exists():
        return
    members: list[tuple[tarfile.TarInfo, bytes]] = []
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            f = tar.extractfile(m) if m.isfile() else None
            data = f.read() if f is not None else b""
            text = data.decode("utf-8", "replace")
            for real, fake in uuids.items():
                text = text.replace(real, fake)
            members.append((m, text.encode()))
    with tarfile.open(path, "w:gz") as tar:
        for m, data in members:
            m.size = len(data)
            tar.addfile(m, io.BytesIO(data))


REGISTER = r"""
import json, os, time
import numabind
out = {"problems": []}
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
size = 96 << 20  # not a power of two: torch's pinned allocator would round it to 128 MiB
before = rss()
buf = numabind.host_buffer(size, device=0, register=True)
grown = rss() - before
where = buf.placement()
out.update(registered=buf.registered, with_=buf.registered_with, grown=grown,
           placement={str(k): v for k, v in where.items()}, nodes=list(buf.nodes))
if not buf.registered:
    out["problems"].append(f"host_buffer(register=True) not registered: {buf.register_reason}")
if not size <= grown < size + (16 << 20):
    out["problems"].append(f"resident memory grew by {grown} bytes for {size}")
if sum(v for k, v in where.items() if k in buf.nodes) != buf.mapped_bytes // 4096:
    out["problems"].append(f"registered pages not all on node(s) {buf.nodes}: {where}")
try:
    import torch
    if torch.cuda.is_available():
        import numabind.torch as nt
        t = nt.pinned_empty((size,), dtype=torch.uint8, device=0)
        out["is_pinned"] = bool(t.is_pinned())
        if not t.is_pinned():
            out["problems"].append("pinned_empty(...).is_pinned() is False on a CUDA build")
        ref = torch.empty((size,), dtype=torch.uint8, pin_memory=True)
        dev = torch.empty((size,), dtype=torch.uint8, device="cuda:0")
        def gbps(src):
            for _ in range(3):
                dev.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(20):
                dev.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            return 20 * size / (time.perf_counter() - t0) / 1e9
        out["h2d_gbps"] = {"pinned_empty": gbps(t), "torch_pin_memory": gbps(ref)}
        nodes = [
            int(n[4:])
            for n in os.listdir("/sys/devices/system/node")
            if n.startswith("node") and n[4:].isdigit()
        ]
        remote = [n for n in nodes if n not in buf.nodes]
        if remote:
            far = nt.pinned_empty((size,), dtype=torch.uint8, node=remote[0])
            out["h2d_gbps"]["remote_node"] = gbps(far)
except ImportError:
    out["torch"] = "not installed"
buf.close()
print("REGISTER " + json.dumps(out))
"""


def registration(env: dict[str, str]) -> dict[str, Any]:
    """Host buffers registered with the real driver (section 4 of the module docstring)."""
    rc, text, err = sh([PY, "-c", REGISTER], env, timeout=300)
    lines = [x[9:] for x in text.splitlines() if x.startswith("REGISTER ")]
    if rc != 0 or not lines:
        return {"problems": [f"registration check: exit {rc}: {err[-500:]}"]}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="device-check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "device-check-out")
    ap.add_argument("--fixture", default=None, help="also write the recording here")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("LOCAL_", "NUMABIND")) or k == "NUMABIND_SYSROOT"
    }

    rc, show_out, err = sh([PY, "-m", "numabind", "show", "--json"], env)
    if rc != 0:
        print(f"device-check: numabind show failed: {err}", file=sys.stderr)
        return 1
    show = json.loads(show_out)
    gpus, source = nvml_answers()
    rc, topo_text, _ = sh(["nvidia-smi", "topo", "-m"])
    topo = parse_topo(topo_text) if rc == 0 else {}
    problems = compare(show, gpus, topo)
    report.update(nvml_source=source, problems=problems)

    # the hook, check and bench on the real GPU
    rank_env = {**env, "LOCAL_RANK": "0", "NUMABIND_VERBOSE": "1"}
    rc, hook_out, hook_err = sh([PY, "-c", "print('USER CODE RAN')"], rank_env)
    report["hook"] = {"rc": rc, "stdout": hook_out, "stderr": hook_err}
    if rc != 0 or "USER CODE RAN" not in hook_out or hook_err.count("\n") != 1:
        problems.append(f"the hook on the real GPU: rc {rc}, stderr {hook_err!r}")
    holder = subprocess.Popen(
        [
            PY,
            "-c",
            "import sys, time; buf = b'1' * (64 << 20); print('up', flush=True); sys.stdin.read()",
        ],
        env={**env, "LOCAL_RANK": "0"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdin is not None
    holder.stdout.readline()
    rc, check_out, check_err = sh(
        [PY, "-m", "numabind", "check", "--pid", str(holder.pid), "--json"], env
    )
    holder.stdin.close()
    holder.wait(timeout=60)
    report["check"] = {
        "rc": rc,
        "json": json.loads(check_out) if check_out.strip() else None,
        "stderr": check_err,
    }
    if rc != 0:
        problems.append(f"numabind check on a live rank: exit {rc}")
    rc, bench_out, bench_err = sh([PY, "-m", "numabind", "bench", "--json"], env, timeout=600)
    report["bench"] = (
        json.loads(bench_out) if rc == 0 and bench_out.strip() else {"rc": rc, "stderr": bench_err}
    )
    if rc != 0:
        problems.append(f"numabind bench: exit {rc}")
    gpu_part = report["bench"].get("gpu") if isinstance(report["bench"], dict) else None
    report["pinned_copies"] = gpu_part
    if rc == 0 and (not isinstance(gpu_part, dict) or not gpu_part.get("copies")):
        problems.append(f"numabind bench timed no pinned copies through the driver: {gpu_part}")

    report["registration"] = registration(env)
    problems.extend(report["registration"].get("problems", []))

    # the recording the NVML fake replays
    uuids = {
        g["uuid"]: f"GPU-00000000-0000-4000-8000-{i:012x}"
        for i, g in enumerate(gpus)
        if g.get("uuid")
    }
    capture = out / "capture.tar.gz"
    sh([PY, "-m", "numabind", "gather", str(capture)], env)
    scrub_capture(capture, uuids)
    recording = scrub({"gpus": gpus, "topo": topo_text, "show": show, "nvml_source": source}, uuids)
    (out / "recording.json").write_text(json.dumps(recording, indent=1))
    if args.fixture:
        Path(args.fixture).write_text(json.dumps(recording, indent=1) + "\n")
        shutil.copy(capture, Path(args.fixture).with_suffix(".tar.gz"))
    (out / "report.json").write_text(json.dumps(scrub(report, uuids), indent=1, default=str))
    for p in problems:
        print(f"DISAGREE: {p}")
    print(f"device-check: {len(gpus)} GPU(s) from {source}; {len(problems)} disagreement(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
