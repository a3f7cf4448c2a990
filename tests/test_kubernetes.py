"""Inside a Kubernetes pod (issue 37): the DRA device metadata (KEP-5304) as one more source
of where a GPU is, read from generated pods: metadata that agrees with sysfs, that
disagrees, that fills in a numa_node of -1, that stands in for a masked sysfs, and
metadata crafted to hurt; and a pod whose cpuset holds no CPU of its GPU's node, for which
``check``, ``doctor`` and ``show`` name the fix of where they run (Kubernetes or Slurm).

Every pod is a generated sysroot read through the same reader as a live system (and, for
the gathered one, as a tarball)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import synth
from numabind import Machine
from numabind._devices import resolve
from numabind._dra import FILE_CAP, MAX_FILES, ROOT, parse, read
from numabind._plan import Request, plan
from numabind.capture._examples import DGX_BDFS, KUBEPODS, dra_metadata, k8s_pod
from support import clean_env

NUMABIND = [sys.executable, "-m", "numabind"]
GPU4, GPU5 = DGX_BDFS[4], DGX_BDFS[5]


def pod(
    tmp_path: Path,
    devices: list[tuple[str, str, int | None]],
    *,
    cpus: list[int] | None = None,
    **over: object,
) -> str:
    """A DGX H100 pod without the NVIDIA driver's list, granted ``devices`` by DRA."""
    spec = synth.dgx_h100(filler_pci=8)
    for g in spec.gpus[:8]:
        g.driver = False
    for k, v in over.items():
        setattr(spec, k, v)
    path, text = dra_metadata("gpu.nvidia.com", "gpus", "gpu", devices)
    spec.files = {**spec.files, path: text}
    if cpus is not None:
        spec.cgroup_cpus = cpus
        spec.cgroup_path = KUBEPODS
    return synth.write(spec, str(tmp_path / "pod"))


def plans(m: Machine, n: int = 2) -> list[object]:
    visible = resolve(m, {})
    return [plan(m, Request(local_rank=r, local_world_size=n, visible=visible)) for r in range(n)]


def dra_lines(m: Machine) -> list[str]:
    return [w for w in m.warnings if "DRA" in w or "sysfs" in w]


def test_metadata_that_agrees_with_sysfs_narrows_the_gpus_and_says_nothing_more(
    tmp_path: Path,
) -> None:
    m = Machine.from_root(pod(tmp_path, [("gpu-4", GPU4, 1), ("gpu-5", GPU5, 1)]))
    assert [(d.pci, d.numa_node, d.driver) for d in m.dra_devices] == [
        (GPU4, 1, "gpu.nvidia.com"),
        (GPU5, 1, "gpu.nvidia.com"),
    ]
    visible = resolve(m, {})
    assert [d.pci for d in visible.devices] == [GPU4, GPU5], "the pod's GPUs, not the host's 8"
    assert "the DRA device metadata limits this process to 2 of the nvidia GPUs" in visible.notes[0]
    p0, p1 = plans(m)
    assert p0.bound and p0.numa_node == 1 and p0.device.pci == GPU4  # type: ignore[attr-defined]
    assert p1.bound and p1.device.pci == GPU5  # type: ignore[attr-defined]
    assert dra_lines(m) == []


def test_metadata_that_disagrees_is_said_and_sysfs_is_followed(tmp_path: Path) -> None:
    m = Machine.from_root(pod(tmp_path, [("gpu-4", GPU4, 0), ("gpu-5", GPU5, 1)]))
    p0, _ = plans(m)
    assert p0.numa_node == 1  # type: ignore[attr-defined]
    (line,) = dra_lines(m)
    assert line == (
        f"{GPU4}: the DRA device metadata (resourceclaimtemplates/gpus/gpu, gpu.nvidia.com) "
        "says NUMA node 0, sysfs numa_node 1: numabind follows sysfs (the kernel's own answer)"
    )
    assert any(line in n for n in p0.notes), "the plan carries the line"  # type: ignore[attr-defined]


def test_metadata_fills_in_a_numa_node_of_minus_one(tmp_path: Path) -> None:
    spec_gpus = synth.dgx_h100(filler_pci=8).gpus
    for g in spec_gpus[:8]:
        g.driver = False
        g.node = -1
        g.local_cpus = list(range(224))  # the firmware says nothing: the whole machine
    root = pod(tmp_path, [("gpu-4", GPU4, 1), ("gpu-5", GPU5, 1)], gpus=spec_gpus)
    m = Machine.from_root(root)
    p0, _ = plans(m)
    assert p0.bound and p0.numa_node == 1, p0  # type: ignore[attr-defined]
    assert f"{GPU4}: sysfs numa_node is -1 (unknown); node 1 from the DRA device metadata" in (
        " ".join(dra_lines(m))
    )
    bare = synth.dgx_h100(filler_pci=8)
    for g in bare.gpus[:8]:
        g.node, g.local_cpus = -1, list(range(224))
    m2 = Machine.from_root(synth.write(bare, str(tmp_path / "bare")))
    p = plan(m2, Request(local_rank=4, local_world_size=8, visible=resolve(m2, {})))
    assert not p.bound and p.skip == "unknown-node", "without the metadata: unknown"


def test_a_masked_sysfs_is_stood_in_for_by_the_metadata(tmp_path: Path) -> None:
    root = pod(tmp_path, [("gpu-4", GPU4, 1), ("gpu-5", GPU5, 1)], masked_pci=(GPU4, GPU5))
    m = Machine.from_root(root)
    assert not Path(root, "sys/bus/pci/devices", GPU4).exists()
    p0, p1 = plans(m)
    assert p0.bound and p0.numa_node == 1 and p0.device.pci == GPU4  # type: ignore[attr-defined]
    assert p1.bound and p1.numa_node == 1  # type: ignore[attr-defined]
    assert any(f"{GPU4}: not in sysfs" in w and "node 1 from" in w for w in m.warnings)


def test_a_stream_of_versions_uses_the_first_it_reads(tmp_path: Path) -> None:
    _, text = dra_metadata("gpu.amd.com", "g", "r", [("gpu-0", "0000:05:00.0", 0)],
                              versions=("v9", "v1beta1", "v1alpha1"))  # fmt: skip
    warn: list[str] = []
    (dev,) = parse(text, "f", warn)
    assert warn == [] and dev.vendor == "amd" and dev.numa_node == 0
    _, nv = dra_metadata("gpu.nvidia.com", "g", "r", [("gpu-0", "00000000:9A:00.0", 1)],
                         numa_attribute="gpu.nvidia.com/numa")  # fmt: skip
    (dev,) = parse(nv, "f", warn)
    assert dev.pci == GPU4 and dev.numa_node == 1, "NVML's spelling and a qualified name"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{", "not JSON"),
        ("[" * 100_000 + "]" * 100_000, "not JSON"),
        ('{"kind": "DeviceMetadata", "apiVersion": "metadata.resource.k8s.io/v9"}', "v9"),
        ('{"kind": "Pod", "apiVersion": "v1"}', "no DeviceMetadata"),
        ("7", "no DeviceMetadata"),
    ],
)
def test_hostile_files_are_one_line_each(text: str, words: str) -> None:
    warn: list[str] = []
    assert parse(text, "resourceclaims/x/y/evil-metadata.json", warn) == []
    assert len(warn) == 1 and words in warn[0] and warn[0].isprintable(), warn


def test_hostile_values_are_ignored(tmp_path: Path) -> None:
    devices = [
        ("a", "\x1b[2Jnot-a-bus", 1),
        ("b", "0000:ab:00.0", 1_000_000),  # a node beyond any machine's
        ("c", GPU4, None),
    ]
    _, text = dra_metadata("gpu.nvidia.com\x1b]0;x\x07", "c", "r", devices)
    warn: list[str] = []
    out = parse(text, "f", warn)
    assert [(d.pci, d.numa_node) for d in out] == [(GPU5, None), (GPU4, None)]
    assert all(d.driver.isprintable() for d in out)
    assert len(warn) == 1 and "is not one" in warn[0] and "\x1b" not in warn[0]


def test_the_tree_is_read_bounded(tmp_path: Path) -> None:
    spec = synth.one_node()
    files = {}
    for i in range(MAX_FILES + 5):
        path, text = dra_metadata(
            f"d{i:02}.example.com", "c", "r", [("x", f"0000:{i:02x}:00.0", 0)]
        )
        files[path] = text
    files[f"{ROOT}/resourceclaims/c/r/huge-metadata.json"] = " " * (FILE_CAP + 10) + "{}"
    files[f"{ROOT}/resourceclaims/c/r/notes.txt"] = "not a metadata file"
    spec.files = files
    root = synth.write(spec, str(tmp_path / "m"))
    Path(root + ROOT, "resourceclaims", "c", "r", "link-metadata.json").symlink_to("/etc/passwd")
    m = Machine.from_root(root)
    from numabind._roots import DirRoot

    devices, warn = read(DirRoot(root))
    assert len(devices) <= MAX_FILES and len(warn) <= MAX_FILES
    assert m.dra_devices == devices


# --- the cpuset off the GPU's node ---------------------------------------------------------------


def cli(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NUMABIND, *argv], capture_output=True, text=True, env=clean_env(**env), timeout=120
    )


def test_doctor_names_the_kubernetes_fix(tmp_path: Path) -> None:
    root = synth.write(k8s_pod(), str(tmp_path / "pod"))
    r = cli("doctor", "--json", NUMABIND_SYSROOT=root)
    found = {f["check"]: f for f in json.loads(r.stdout)["findings"]}
    cpuset = found["cpuset"]
    assert cpuset["status"] == "fail" and r.returncode == 1
    assert cpuset["detail"].startswith(f"GPU 0 ({GPU4}), GPU 1 (0000:ab:00.0) are on node 1 (CPUs ")
    assert (
        "none of the CPUs this process may use is there (CPUs 0-7, from cgroup v2 "
        in (cpuset["detail"])
    )
    assert "their ranks are not bound. Fix: in Kubernetes" in cpuset["detail"]
    for words in ("static CPU manager", "Guaranteed", "single-numa-node", "matchAttribute"):
        assert words in cpuset["detail"], words
    ok = cli("doctor", "--json", NUMABIND_SYSROOT=pod(tmp_path / "b", [("gpu-4", GPU4, 1)],
                                                      cpus=list(range(56, 64))))  # fmt: skip
    assert "cpuset" not in {f["check"] for f in json.loads(ok.stdout)["findings"]}


def test_check_and_show_name_the_fix_of_where_they_run(tmp_path: Path) -> None:
    root = synth.write(k8s_pod(), str(tmp_path / "pod"))
    env = clean_env(NUMABIND_SYSROOT=root, LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")
    # the hook has run (and said its line) before the -c code prints "ready"
    rank = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert rank.stdout is not None and rank.stdout.readline() == "ready\n"
        r = cli("check", "--pid", str(rank.pid), "--json", NUMABIND_SYSROOT=root)
    finally:
        try:
            _, hook = rank.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            rank.kill()
            _, hook = rank.communicate()
    (proc,) = json.loads(r.stdout)["processes"]
    assert proc["status"] == "skipped" and proc["problems"][0].startswith("cgroup too narrow")
    assert any(n.startswith("to bind it: in Kubernetes") for n in proc["notes"]), proc["notes"]
    assert "all outside the CPUs this process may use" in hook, "the rank said it once"
    text = cli("show", NUMABIND_SYSROOT=root).stdout
    assert "note: to bind the ranks skipped for the cgroup: in Kubernetes" in text
    spec = k8s_pod()
    spec.cgroup_path = "/system.slice/slurmstepd.scope/job_42/step_0"
    slurm = synth.write(spec, str(tmp_path / "slurm"))
    text = cli("show", NUMABIND_SYSROOT=slurm).stdout
    assert "--gpu-bind=closest" in text and "--cpus-per-gpu" in text and "Kubernetes" not in text
    r = cli("doctor", "--json", NUMABIND_SYSROOT=slurm, SLURM_JOB_ID="42")
    found = {f["check"]: f for f in json.loads(r.stdout)["findings"]}
    assert "--gpu-bind=closest" in found["cpuset"]["detail"]


def test_gather_keeps_the_metadata_for_show_elsewhere(tmp_path: Path) -> None:
    root = pod(tmp_path, [("gpu-4", GPU4, 0), ("gpu-5", GPU5, 1)])
    out = tmp_path / "pod.tar.gz"
    r = cli("gather", str(out), NUMABIND_SYSROOT=root)
    assert r.returncode == 0, r.stderr
    data = json.loads(cli("show", "--input", str(out), "--json").stdout)
    assert [d["pci"] for d in data["devices"] if d["visible"]] == [GPU4, GPU5]
    assert any("says NUMA node 0, sysfs numa_node 1" in w for w in data["warnings"])


def test_two_thousand_metadata_files_bound_the_work_not_the_answer(tmp_path: Path) -> None:
    """Round four (issue 42): 2,048 metadata files of 130 KiB passed the whole machine's
    reading budget, so reading the machine refused and the pod's ranks went unbound.
    Now the first :data:`TOTAL_FILES` files (:data:`TOTAL_BYTES` in all) are read and
    used, the pod's GPUs are found in them, and one line says what was left."""
    from numabind._dra import TOTAL_BYTES, TOTAL_FILES

    spec = synth.dgx_h100(filler_pci=8)
    for g in spec.gpus[:8]:
        g.driver = False
    path, text = dra_metadata(
        "gpu.nvidia.com", "gpus", "gpu", [("gpu-4", GPU4, 1), ("gpu-5", GPU5, 1)],
        kind="resourceclaims",
    )  # fmt: skip
    pad = json.dumps({
        "kind": "DeviceMetadata", "apiVersion": "metadata.resource.k8s.io/v1alpha1",
        "requests": [{"name": "r", "devices": []}], "pad": "x" * (130 << 10),
    })  # fmt: skip
    files = {path: text}
    for i in range(2047):
        claim, request, driver = divmod(i, 16 * 16)[0], (i // 16) % 16, i % 16
        files[f"{ROOT}/resourceclaims/x{claim}/r{request}/d{driver:02}-metadata.json"] = pad
    assert len(files) == 2048 and sum(map(len, files.values())) > 256 << 20
    spec.files = files
    root = synth.write(spec, str(tmp_path / "pod"))
    began = time.monotonic()
    m = Machine.from_root(root)
    devices = [(d.pci, d.numa_node) for d in m.dra_devices]
    took = time.monotonic() - began
    print(f"\na pod with 2,048 DRA metadata files of 130 KiB: read in {took:.1f} s")
    assert devices == [(GPU4, 1), (GPU5, 1)]
    read_files = min(TOTAL_FILES, 1 + (TOTAL_BYTES - len(text)) // len(pad))
    assert (
        f"DRA device metadata: read {read_files} of 2048 files (at most {TOTAL_FILES}, "
        f"{TOTAL_BYTES >> 20} MiB in all); the rest ignored"
    ) in m.warnings, m.warnings
    assert "limits this process to 2 of the nvidia GPUs" in resolve(m, {}).notes[0]
    from numabind.cli._gather import gather_paths

    copied = [p for p in gather_paths(m.source.root) if p.startswith(ROOT)]  # type: ignore[attr-defined]
    assert len(copied) == TOTAL_FILES, len(copied)  # gather copies what the reader may use
