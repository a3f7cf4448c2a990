"""A newcomer's first hour (issue 19): ``show --matrix``, ``--example``, ``--numactl``,
``run --device/--node/--cpus``, ``doctor``, and one test per defect a new user hit.

The matrix is checked against machines whose PCI trees are known: the DGX-2 hwloc export
(two GPUs per leaf switch, four per second-level switch, eight per socket), the POWER8
export, a 2-socket export with two GPUs behind one host bridge, and the generated DGX H100
(each GPU on its own switch with one ConnectX-7), read five ways: from memory
(``--example``), as a directory, as a tarball, as ``numabind gather`` wrote it and,
mounted over /sys, live.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import numabind
import synth
from numabind import Machine
from numabind.capture._examples import EXAMPLES
from numabind.cli import main
from numabind.cli._matrix import path_class
from support import as_live, clean_env, py, started, two_cpus, venv_with_numabind

HERE = Path(__file__).resolve().parent
HWLOC = HERE / "data" / "hwloc"
SRC = HERE.parent / "src"
SECCOMP = [sys.executable, "-S", str(HERE / "seccomp_eperm.py")]
NUMABIND = [sys.executable, "-m", "numabind"]


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def matrix(text: str) -> dict[tuple[str, str], str]:
    """The matrix's cells by (row, column) label."""
    lines = text.splitlines()
    header = lines[0].split()
    labels = [h for h in header if h[:3] in ("GPU", "NIC") and h[3:].isdigit()]
    cells: dict[tuple[str, str], str] = {}
    for line in lines[1 : 1 + len(labels)]:
        parts = line.split()
        for col, value in zip(labels, parts[1 : 1 + len(labels)]):
            cells[(parts[0], col)] = value
    return cells


def cli(
    *argv: str, env: dict[str, str] | None = None, pre: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*pre, *NUMABIND, *argv],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=120,
    )


# --- show --matrix -----------------------------------------------------------------------------


def test_path_classes() -> None:
    host = ("pci0000:00",)
    sw = (*host, "0000:00:01.0", "0000:01:00.0")
    assert path_class((*sw, "0000:02:00.0"), (*sw, "0000:02:01.0"), 0, 0) == "PIX"
    assert path_class((*sw, "0000:02:00.0", "0000:03:00.0"), (*sw, "0000:02:01.0"), 0, 0) == "PXB"
    assert path_class((*host, "0000:00:01.0"), (*host, "0000:00:02.0"), 0, 0) == "PHB"
    assert path_class(("pci0000:00",), ("pci0000:80",), 0, 0) == "NODE"
    assert path_class(("pci0000:00",), ("pci0000:80",), 0, 1) == "SYS"
    assert path_class(None, ("pci0000:80",), 0, 0) == "NODE*"
    assert path_class(None, None, 0, 1) == "SYS*"
    assert path_class(None, None, None, 1) == "SYS*"


def test_matrix_of_the_dgx2_export(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_main(capsys, "show", "--input", str(HWLOC / "nvidiaDGX2.xml"), "--matrix")
    assert rc == 0, err
    m = matrix(out)
    assert len({r for r, _ in m}) == 16 and "*" not in "".join(m.values())
    # GPU0 and GPU1 share a leaf switch, 0-3 a second-level one, 0-7 a socket
    assert m[("GPU0", "GPU1")] == "PIX" and m[("GPU2", "GPU3")] == "PIX"
    assert m[("GPU0", "GPU2")] == "PXB" and m[("GPU1", "GPU3")] == "PXB"
    assert m[("GPU0", "GPU4")] == "NODE" and m[("GPU3", "GPU7")] == "NODE"
    assert m[("GPU0", "GPU8")] == "SYS" and m[("GPU15", "GPU0")] == "SYS"
    assert m[("GPU9", "GPU8")] == "PIX" and m[("GPU12", "GPU8")] == "NODE"
    assert all(m[(a, b)] == m[(b, a)] for a, b in m)
    assert "GPU0: GPU 0 (0000:34:00.0)" in out and "Legend:" in out


def test_matrix_phb_and_power8(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(
        capsys, "show", "--input", str(HWLOC / "24em64t-2n6c2t-pci.xml"), "--matrix"
    )
    m = matrix(out)
    assert rc == 0 and m[("GPU1", "GPU2")] == "PHB" and m[("GPU0", "GPU1")] == "SYS"
    rc, out, _ = run_main(
        capsys, "show", "--input", str(HWLOC / "power8gpudistances.xml"), "--matrix"
    )
    m = matrix(out)
    assert rc == 0 and m[("GPU0", "GPU1")] == "NODE" and m[("GPU0", "GPU2")] == "SYS"
    assert m[("GPU2", "GPU3")] == "NODE"


def test_matrix_without_a_pci_tree_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(
        capsys, "show", "--input", str(HWLOC / "nvidiagpunumanodes.tar.bz2"), "--matrix"
    )
    m = matrix(out)
    assert rc == 0 and m[("GPU0", "GPU1")] == "NODE*" and m[("GPU0", "GPU3")] == "SYS*"
    assert "told from the NUMA nodes alone" in out


def test_matrix_nics_of_a_sysfs_capture(capsys: pytest.CaptureFixture[str]) -> None:
    """Two ConnectX adapters found by class where /sys/class/infiniband was not captured."""
    rc, out, _ = run_main(
        capsys, "show", "--input", str(HWLOC / "32intel64-2p8co2t+8ve.tar.bz2"), "--matrix"
    )
    m = matrix(out)
    assert (
        rc == 0 and set(m) >= {("NIC0", "NIC1")} and "NIC0: network adapter (0000:1a:00.0)" in out
    )


def _generated_matrix_outputs(tmp_path: Path) -> dict[str, str]:
    root = synth.write(synth.dgx_h100(), str(tmp_path / "dgx"))
    tar = tmp_path / "dgx.tar.gz"
    with tarfile.open(tar, "w:gz") as t:
        t.add(root, arcname=".")
    env = clean_env()
    got = {}
    for name, argv in {
        "example": ["--example", "dgx-h100"],
        "directory": ["--input", root],
        "tarball": ["--input", str(tar)],
    }.items():
        r = cli("show", *argv, "--matrix", env=env)
        assert r.returncode == 0, r.stderr
        got[name] = r.stdout
    gathered = tmp_path / "gathered.tar.gz"
    r = cli("gather", str(gathered), env=clean_env(NUMABIND_SYSROOT=root))
    assert r.returncode == 0, r.stderr
    got["gathered"] = cli("show", "--input", str(gathered), "--matrix", env=env).stdout
    prefix, why = as_live(root)
    if not prefix:
        pytest.skip(f"the live reading of the matrix: {why}")
    r = subprocess.run(
        [*prefix, *NUMABIND, "show", "--matrix"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0, r.stderr
    got["live"] = r.stdout
    return got


def test_matrix_of_a_generated_dgx_h100_read_five_ways(tmp_path: Path) -> None:
    got = _generated_matrix_outputs(tmp_path)
    assert len(set(got.values())) == 1, {k: v[:300] for k, v in got.items()}
    m = matrix(got["example"])
    for i in range(8):
        assert m[(f"GPU{i}", f"NIC{i}")] == "PIX"  # each GPU shares its switch with one NIC
    assert m[("GPU0", "GPU3")] == "NODE" and m[("GPU0", "GPU4")] == "SYS"
    assert m[("NIC0", "NIC1")] == "NODE" and m[("NIC7", "GPU0")] == "SYS"
    assert "*" not in "".join(m.values())
    assert "NIC3: mlx5_3 (0000:5e:00.0)" in got["example"]


# --- --example, --numactl ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_every_example_plans(capsys: pytest.CaptureFixture[str], name: str) -> None:
    rc, out, err = run_main(capsys, "show", "--example", name, "--json")
    assert rc == 0, err
    report = json.loads(out)
    assert report["machine"] == f"example {name}" and report["ranks"]
    if name == "k8s-pod":  # the misaligned pod: CPUs on node 0, its GPUs on node 1
        assert {r["skip"] for r in report["ranks"]} == {"cgroup"}
    elif name != "one-node":
        assert any(r["status"] == "bound" for r in report["ranks"])


def test_example_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_main(capsys, "show", "--example", "dgx", "--input", "x")
    assert rc == 2 and "--example" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run_main(capsys, "show", "--example", "dgx-h100", "--input", "x")
    assert rc == 2 and "exclusive" in err
    rc, _, err = run_main(capsys, "show", "--example", "dgx-h100", "--json", "--matrix")
    assert rc == 2 and "both write to standard output" in err


def test_numactl_lines_match_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(capsys, "show", "--example", "dgx-h100", "--numactl")
    assert rc == 0
    lines = [x for x in out.splitlines() if x.startswith("rank ")]
    assert len(lines) == 8
    assert lines[0] == "rank 0: numactl --physcpubind=0-55,112-167 --preferred=0 -- CMD"
    assert lines[5] == "rank 5: numactl --physcpubind=56-111,168-223 --preferred=1 -- CMD"
    rc, out, _ = run_main(
        capsys,
        "show",
        "--example",
        "dgx-h100",
        "--numactl",
        "--memory",
        "none",
        "--mode",
        "exclusive",
    )
    lines = [x for x in out.splitlines() if x.startswith("rank ")]
    assert lines[0].startswith("rank 0: taskset -c ") and "numactl" not in lines[0]
    rc, out, _ = run_main(capsys, "show", "--example", "gb200", "--numactl", "--memory", "bind")
    assert "--membind=" in out
    rc, out, _ = run_main(capsys, "show", "--example", "one-node", "--numactl")
    assert "rank 0: CMD  # not bound: " in out


# --- run --device / --node / --cpus ------------------------------------------------------------


@two_cpus
def test_run_with_numactl_habits(tmp_path: Path) -> None:
    show = "import os; print(sorted(os.sched_getaffinity(0)))"
    env = clean_env()
    r = cli("run", "--cpus", "1", "--", sys.executable, "-c", show, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "[1]", r.stderr
    r = cli("run", "--node", "0", "--", sys.executable, "-c", show, env=env)
    assert r.returncode == 0 and r.stdout.strip() == str(sorted(os.sched_getaffinity(0)))
    two = synth.write(synth.two_nodes(gpus=2), str(tmp_path / "two"))
    r = cli(
        "run",
        "--device",
        "1",
        "--memory",
        "none",
        "--",
        sys.executable,
        "-c",
        show,
        env=clean_env(NUMABIND_SYSROOT=two),
    )
    assert r.returncode == 0 and r.stdout.strip() == "[1]", r.stderr
    marker = tmp_path / "ran"
    for argv, words in (
        (["--cpus", "5"], "--cpus 5: CPU 5 is"),
        (["--node", "3"], "--node 3: node 3: no such node"),
        (["--device", "7"], "--device: not bound: device index 7 is not visible"),
    ):
        r = cli("run", *argv, "--", "touch", str(marker), env=env)
        assert r.returncode == 1 and not marker.exists(), r
        assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = cli("run", "--cpus", "x", "--", "true", env=env)
    assert r.returncode == 2 and "--cpus" in r.stderr


def test_run_cpus_says_which_cpus_the_cgroup_left_out(tmp_path: Path) -> None:
    from numabind._plan import explicit

    spec = synth.two_nodes()
    spec.cgroup_cpus = [0]
    m = Machine.from_root(synth.write(spec, str(tmp_path / "m")))
    p = explicit(m, cpus=frozenset({0, 1}))
    assert p.bound and p.cpus == {0}
    assert p.notes == ("CPUs 1 are outside the cgroup: left out",)
    p = explicit(m, node=1)
    assert not p.bound and p.skip == "cgroup" and "all outside" in p.reason
    p = explicit(m, node=0, memory="bind")
    assert p.cpus == {0} and p.memory_nodes == {0} and p.memory_policy == "bind"


# --- doctor -------------------------------------------------------------------------------------


def _venv(where: Path, hook: bool) -> str:
    return venv_with_numabind(str(where), hook)


def _findings(r: subprocess.CompletedProcess[str]) -> dict[str, tuple[str, str]]:
    data = json.loads(r.stdout)
    return {f["check"]: (f["status"], f["detail"]) for f in data["findings"]}


def test_doctor_in_venvs_with_and_without_the_hook(tmp_path: Path) -> None:
    with_hook = _venv(tmp_path / "with", hook=True)
    without = _venv(tmp_path / "without", hook=False)
    r = cli("doctor", "--python", with_hook, "--json")
    f = _findings(r)
    assert f["hook file"][0] == "ok" and f["hook runs"][0] == "ok", f
    assert f["numabind"][0] == "ok" and f["hook order"][0] == "ok"
    assert r.returncode == 0, r.stdout
    r = cli("doctor", "--python", without, "--json")
    f = _findings(r)
    assert f["hook file"][0] == "fail" and f["hook runs"][0] == "fail", f
    assert r.returncode == 1
    # text form: one line per finding, statuses first
    r = cli("doctor", "--python", without)
    assert r.returncode == 1 and any(x.startswith("FAIL  hook file") for x in r.stdout.splitlines())


def test_doctor_sees_what_runs_before_the_hook(tmp_path: Path) -> None:
    py = _venv(tmp_path / "v", hook=True)
    site = Path(py).parent.parent / "lib"
    purelib = next(site.glob("python3*/site-packages"))
    (purelib / "00-preload.pth").write_text("import json\n")
    (purelib / "preload_heavy.pth").write_text("import sys; sys.modules.setdefault('torch', sys)\n")
    f = _findings(cli("doctor", "--python", py, "--json"))
    assert f["hook order"][0] == "warn" and "00-preload.pth" in f["hook order"][1]
    assert f["imported at start"][0] == "warn" and "torch" in f["imported at start"][1]


def test_doctor_finds_a_shadowing_sitecustomize(tmp_path: Path) -> None:
    py = _venv(tmp_path / "v", hook=False)
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("SHADOW = 1\n")
    ours = subprocess.run(
        [*NUMABIND, "sitecustomize-path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    shadowed = clean_env(PYTHONPATH=f"{other}{os.pathsep}{ours}")
    f = _findings(cli("doctor", "--python", py, "--json", env=shadowed))
    assert f["sitecustomize"][0] == "fail" and str(other) in f["sitecustomize"][1]
    right = clean_env(PYTHONPATH=f"{ours}{os.pathsep}{other}")
    f = _findings(cli("doctor", "--python", py, "--json", env=right))
    assert f["sitecustomize"][0] == "ok" and f["hook runs"][0] == "ok", f


def test_doctor_under_seccomp() -> None:
    r = cli("doctor", "--json", pre=(*SECCOMP, "--calls", "all", "--"))
    f = _findings(r)
    assert f["memory policy"][0] == "fail" and "not permitted" in f["memory policy"][1]
    assert f["page migration"][0] == "warn" and f["cpu affinity"][0] == "ok"
    assert r.returncode == 1
    f = _findings(cli("doctor", "--json", pre=(*SECCOMP, "--calls", "docker", "--")))
    assert f["memory policy"][0] == "ok" and f["page migration"][0] == "info"
    assert f["page migration"][0] == "info" and "move_pages" in f["page migration"][1]


def test_doctor_names_accelerators_it_does_not_handle(tmp_path: Path) -> None:
    with tarfile.open(HWLOC / "32intel64-2p8co2t+8ve.tar.bz2") as t:
        t.extractall(tmp_path, filter="data")
    root = next(p for p in tmp_path.iterdir() if p.is_dir())
    r = cli("doctor", "--json", env=clean_env(NUMABIND_SYSROOT=str(root)))
    f = _findings(r)
    status, detail = f["not handled"]
    assert status == "warn" and detail.startswith("8 x NEC SX-Aurora Vector Engine"), detail
    rc = cli("show", "--input", str(root))
    assert "not handled: 8 x NEC SX-Aurora Vector Engine" in rc.stdout


def test_doctor_with_an_interpreter_that_is_not_one(tmp_path: Path) -> None:
    for bad, words in (("/bin/true", "gave no answer"), (str(tmp_path / "nope"), "no such")):
        r = cli("doctor", "--python", bad)
        assert r.returncode == 1 and words in r.stdout and "Traceback" not in r.stderr
    liar = tmp_path / "liar"
    liar.write_text(
        '#!/bin/sh\nprintf \'{"pth": [{"name": "\\033]0;owned\\007x"}], "numabind": 5}\'\n'
    )
    liar.chmod(0o755)
    r = cli("doctor", "--python", str(liar))
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert r.returncode == 1


def test_doctor_reports_the_environment() -> None:
    f = _findings(cli("doctor", "--json", env=clean_env(LOCAL_RANK="3", NUMABIND="0")))
    assert f["enabled"][0] == "warn"
    assert "LOCAL_RANK=3 (local rank 3 from LOCAL_RANK)" in f["trigger variables"][1]
    f = _findings(cli("doctor", "--json", env=clean_env(NUMABIND_MODE="sideways")))
    assert f["settings"][0] == "fail" and "sideways" in f["settings"][1]


# --- the defects, one test each -----------------------------------------------------------------


def test_defect_1_split_distance_matrices_are_read(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(
        capsys, "show", "--input", str(HWLOC / "irregulargroups-disallowed.xml"), "--json"
    )
    report = json.loads(out)
    assert rc == 0 and len(report["nodes"]) >= 4
    assert all(n["distances"] for n in report["nodes"])
    assert not any("malformed" in r["reason"] for r in report["ranks"])


def test_defect_3_strict_apply_on_one_node_is_a_benign_skip() -> None:
    code = "import numabind; b = numabind.apply(); print(b.plan.status, b.plan.skip)"
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=clean_env(LOCAL_RANK="0", NUMABIND_STRICT="1", NUMABIND="0"),
    )
    assert r.returncode == 0 and r.stdout.split()[0] == "skipped", r.stderr


@two_cpus
def test_defect_4_child_binding_with_a_refused_policy_says_one_line(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The generated machine has a node 1 this kernel does not: set_mempolicy answers
    EINVAL; the child still starts on its CPU and the parent says so once."""
    from numabind import _children

    root = synth.write(synth.two_nodes(gpus=2), str(tmp_path / "root"))
    monkeypatch.setenv("NUMABIND_SYSROOT", root)
    monkeypatch.setenv("NUMABIND_MEMORY", "preferred")
    monkeypatch.setattr(_children, "_machine", None)
    monkeypatch.setattr(_children, "_plans", {})
    show = [sys.executable, "-S", "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    for _ in range(2):
        with numabind.child_binding(1):
            got = subprocess.run(show, capture_output=True, text=True).stdout
        assert got.strip() == "[1]"
    err = capfd.readouterr().err
    assert err.count("numabind:") == 1 and "memory policy left as it is" in err, err


def test_defect_5_machine_from_root_refuses_what_is_not_a_machine(tmp_path: Path) -> None:
    for path in (
        tmp_path / "missing",
        HWLOC / "nvidiaDGX2.xml",
        HWLOC / "memorysidecaches.tar.bz2",
    ):
        with pytest.raises(numabind.CaptureError):
            Machine.from_root(str(path))
    assert Machine.from_capture(str(HWLOC / "nvidiaDGX2.xml")).node_ids == (0, 1)
    assert len(Machine.from_capture(str(HWLOC / "memorysidecaches.tar.bz2")).node_ids) > 1


def test_defect_6_a_named_device_keeps_its_own_index(tmp_path: Path) -> None:
    m = Machine.from_root(synth.write(synth.dgx_h100(filler_pci=0), str(tmp_path / "d")))
    for device, index in ((4, 4), ("0000:ab:00.0", 5), (7, 7)):
        p = numabind.plan_for(device=device, machine=m, environ={})
        assert p.device_index == index and p.local_rank is None
        assert f"GPU {index} (" in p.reason and f"device {index} (" in p.summary()


def test_defect_8_check_of_a_process_without_a_rank_is_unknown() -> None:
    child = started(["sleep", "30"], env=clean_env())
    try:
        r = cli("check", "--pid", str(child.pid))
        j = cli("check", "--pid", str(child.pid), "--json")
    finally:
        child.kill()
        child.wait()
    assert r.returncode == 3 and r.stdout.startswith("UNKNOWN"), r.stdout
    (proc,) = json.loads(j.stdout)["processes"]
    assert j.returncode == 3 and proc["status"] == "unknown" and proc["ok"] is False
    assert proc["problems"] == [
        "no plan to check against: no local rank in its initial environment and not "
        "registered by numabind"
    ]


def test_defect_9_verbose_run_on_one_node_says_one_true_line() -> None:
    r = cli(
        "run",
        "--",
        sys.executable,
        "-c",
        "pass",
        env=clean_env(LOCAL_RANK="0", NUMABIND_VERBOSE="1"),
    )
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.returncode == 0 and len(lines) == 1, r.stderr
    assert "nothing to bind" in lines[0] and "inherited" not in lines[0]


def test_defect_10_pipes_full_disks_and_typos() -> None:
    big = subprocess.run(
        f"{sys.executable} -m numabind show --example dgx-h100 --nproc 4096 --json | head -1",
        shell=True,
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert big.stdout.strip() == "{" and big.stderr == "", big.stderr
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [*NUMABIND, "show", "--json"], stdout=full, stderr=subprocess.PIPE, text=True
        )
    assert r.returncode == 2 and "Traceback" not in r.stderr and "cannot write" in r.stderr
    r = cli("check", "--all", "--pid", "1")
    assert r.returncode == 2 and "exclusive" in r.stderr
    r = cli("show", "--jsn")
    assert r.returncode == 2 and r.stderr.strip() == (
        "numabind show: unrecognized arguments: --jsn (did you mean --json?)"
    )


def test_defect_11_words(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(capsys, "show", "--example", "one-node")
    assert rc == 0 and " ," not in out
    rc, out, _ = run_main(capsys, "show", "--input", str(HWLOC / "memorysidecaches.tar.bz2"))
    assert rc == 0 and "one per visible device" not in out  # no devices: not "one per" them
    for command, foreign in (("check", "--mode"), ("bench", "--pid"), ("doctor", "--mode")):
        assert main([command, "--help"]) == 0
        usage, _, rest = capsys.readouterr().out.partition("options:")
        options = rest.split("\n\n")[0]
        assert foreign not in usage and foreign not in options
    assert main(["--help"]) == 0
    assert "docs/environment.rst" not in capsys.readouterr().out


@pytest.mark.parametrize("module", ["torch", "ray"])
def test_defect_11_install_without_the_framework(module: str) -> None:
    code = (
        f"import sys; sys.modules['{module}'] = None\n"
        f"import numabind.{module} as m\n"
        "try:\n    m.install()\n"
        "except ImportError as e:\n    print(type(e).__name__, '|', e)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env()
    )
    name, _, message = r.stdout.partition(" | ")
    assert name == "FrameworkMissing", r.stdout + r.stderr
    assert "is not installed for this Python" in message and sys.executable in message


def test_a_pci_path_is_the_device_s_own(tmp_path: Path) -> None:
    """A capture whose bus entry for one device leads to another device's directory: the
    matrix must not take the other one's place in the tree for it."""
    root = synth.write(synth.dgx_h100(filler_pci=0), str(tmp_path / "m"))
    m = Machine.from_root(root)
    assert m.pci_path("0000:18:00.0") == (
        "pci0000:15",
        "0000:15:01.0",
        "0000:16:00.0",
        "0000:17:00.0",
    )
    m.close()
    link = Path(root, "sys/bus/pci/devices/0000:2a:00.0")
    target = os.readlink(Path(root, "sys/bus/pci/devices/0000:18:00.0"))
    link.unlink()
    link.symlink_to(target)  # 2a's entry now leads to 18's directory
    m = Machine.from_root(root)
    assert m.pci_path("0000:2a:00.0") is None
    assert m.pci_path("0000:18:00.0") is not None
    m.close()


# --- issue 37: the items, one test each (the playground, the docs runner and the pods have
# files of their own: test_playground.py, test_doc_examples.py, test_kubernetes.py) ---------


@two_cpus
def test_item_3_run_cpus_refuses_what_numactl_refuses(tmp_path: Path) -> None:
    """CPUs the machine lacks or the cgroup forbids refuse the whole list (numactl: "<0-7>
    is invalid"), the command not run; a list that names nothing is a usage error."""
    marker = tmp_path / "ran"
    r = cli("run", "--cpus", "0-7", "--", "touch", str(marker))
    assert r.returncode == 1 and not marker.exists(), r
    assert r.stderr.strip() == (
        "numabind run: --cpus 0-7: CPUs 2-7 are not on this machine (it has CPUs 0-1); the "
        "command was not run"
    )
    spec = synth.two_nodes()
    spec.cgroup_cpus = [0]
    root = synth.write(spec, str(tmp_path / "m"))
    r = cli(
        "run", "--cpus", "0-1", "--", "touch", str(marker), env=clean_env(NUMABIND_SYSROOT=root)
    )
    assert r.returncode == 1 and not marker.exists(), r
    assert (
        "--cpus 0-1: CPU 1 is outside the CPUs this process may use (0, from cgroup v2"
        in (r.stderr)
        and len(r.stderr.strip().splitlines()) == 1
    )
    for bad in ("", " ", ","):
        r = cli("run", "--cpus", bad, "--", "touch", str(marker))
        assert r.returncode == 2 and not marker.exists(), r
        assert len(r.stderr.strip().splitlines()) == 1 and "--cpus" in r.stderr, r.stderr


@two_cpus
@pytest.mark.parametrize("form", [["--node", "1"], ["--device", "1"], ["--local-rank", "1"]])
def test_item_9_one_rule_for_a_refused_memory_policy(tmp_path: Path, form: list[str]) -> None:
    """Node 1 of the generated machine is not this kernel's: set_mempolicy fails.  Every
    form of run binds the CPUs, says so in one line and runs the command; strict mode
    refuses every form."""
    root = synth.write(synth.two_nodes(gpus=2), str(tmp_path / "two"))
    show = "import os; print(sorted(os.sched_getaffinity(0)))"
    env = clean_env(NUMABIND_SYSROOT=root, NUMABIND_MEMORY="preferred", LOCAL_WORLD_SIZE="2")
    r = cli("run", *form, "--", sys.executable, "-c", show, env=env)
    assert r.returncode == 0 and r.stdout.strip() == "[1]", r
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "set_mempolicy" in lines[0], r.stderr
    r = cli("run", *form, "--", sys.executable, "-c", show, env={**env, "NUMABIND_STRICT": "1"})
    assert r.returncode == 1 and r.stdout == "", r
    assert len(r.stderr.strip().splitlines()) == 1 and "set_mempolicy" in r.stderr, r.stderr


def test_item_4_draw_with_smt_1_shows_the_ranks_letters(capsys: pytest.CaptureFixture[str]) -> None:
    """Under --smt 1 a core's second thread is planned for no one: the core carries its
    rank's letter, not the "different ranks" mark; and no rank's letter is a mark."""
    from numabind.cli._picture import MARKS, SYMBOLS

    rc, out, _ = run_main(
        capsys, "show", "--example", "dgx-h100", "--draw", "--smt", "1", "--mode", "exclusive"
    )
    rows = [x.split()[0] for x in out.splitlines() if x.endswith(tuple("0123456789")) and
            "cores of CPUs" in x]  # fmt: skip
    assert rc == 0 and "*" not in "".join(rows), out
    assert "".join(sorted(set("".join(rows)))) == "ABCDEFGH", rows
    assert not set(SYMBOLS) & set(MARKS) and len(set(SYMBOLS)) == len(SYMBOLS)
    rc, out, _ = run_main(
        capsys, "show", "--example", "container", "--draw", "--nproc", "64", "--mode", "exclusive"
    )
    legend = out.split("\nlegend\n", 1)[1].splitlines()
    letters = [line.split()[0] for line in legend if line.startswith("  ") and "rank" in line]
    assert rc == 0 and "x" not in letters and "r" not in letters, letters


def test_item_5_svg_breaks_cpu_lists_after_commas() -> None:
    from numabind.cli._svg import wrap

    text = "CPUs " + ",".join(str(c) for c in range(0, 400, 8))
    lines = wrap(text, 300)
    assert len(lines) > 2 and " ".join(lines).replace(", ", ",") == text
    for line in lines[:-1]:
        assert line.endswith(","), lines
    assert wrap("x" * 100, 120)[0] == "x" * 16, "a word with no comma is still split"


def test_item_10_bench_labels_are_whole_and_untrusted_is_marked() -> None:
    """The SVG draws every value label whole inside the canvas; the text table marks an
    untrusted latency (--quick) where the number is, and says what untrusted means."""
    import xml.etree.ElementTree as ET

    from numabind.cli._bench import text
    from numabind.cli._svg import render_bench, text_width

    def m(kind: str, node: int, value: float, trusted: bool) -> dict[str, object]:
        return {"kind": kind, "from_node": 0, "from_cpus": [0, 1], "memory_node": node,
                "value": value, "trusted": trusted, "pages_verified_on_node": 1.0,
                "placement": "mbind"}  # fmt: skip

    report = {
        "machine": "live system",
        "nodes": [{"id": 0}],
        "measurements": [m("copy", 0, 13.2, True), m("latency", 0, 13.2, False),
                         m("copy", 1, 1.0, True), m("latency", 1, 99999.5, False)],
        "verdicts": [{"from_node": 0, "from_cpus": [0, 1], "ranks": [], "verdict": "fine"}],
        "gpu": "no GPU driver here",
    }  # fmt: skip
    svg = ET.fromstring(render_bench(report))
    width = float(svg.get("width", "0"))
    labels = [
        t for t in svg.iter("{http://www.w3.org/2000/svg}text") if "untrusted" in (t.text or "")
    ]
    assert len(labels) == 2
    for t in labels:
        assert "…" not in (t.text or "")
        assert float(t.get("x", "0")) + text_width(t.text or "") <= width, t.text
    lines = text(report)
    row = next(x for x in lines if x.strip().startswith("0 (local)"))
    assert "13 (untrusted)" in row and "13.20 " in row and "13.20 (untrusted)" not in row
    assert any(x.strip().startswith("note: (untrusted):") for x in lines)


def test_item_1_a_buffer_still_viewed_says_what_to_release() -> None:
    """Leaving the block while a view is alive: one error that says what to release, the
    buffer still usable; releasing the view (the docstring's form) lets it close."""
    buf = numabind.host_buffer(1 << 20, node=0, register=False)
    view = buf.view()
    with pytest.raises(BufferError, match=r"release the view \(view.release\(\), or take it"):
        buf.close()
    assert not buf.closed and view[0] == 0
    view.release()
    buf.close()
    assert buf.closed
    with numabind.host_buffer(1 << 20, node=0, register=False) as buf, buf.view() as view:
        view[:5] = b"hello"
    assert buf.closed


def test_item_11_an_oversized_unpopulated_buffer_names_size_and_limit() -> None:
    with pytest.raises(numabind.PlacementError) as info:
        numabind.host_buffer(1 << 50, node=0, populate=False, register=False)
    text = str(info.value)
    assert text.startswith("numabind.host_buffer(): 1024.0 TiB cannot be mapped"), text
    assert "nothing was mapped" in text and ("memory and swap" in text or "limit" in text)
    code = (
        "import resource, numabind\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 32, 1 << 32))\n"
        "try:\n    numabind.host_buffer(3 << 31, node=0, populate=False, register=False)\n"
        "except numabind.PlacementError as e:\n    print(e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env())  # fmt: skip
    assert "address-space limit (ulimit -v, RLIMIT_AS) is 4.0 GiB" in r.stdout, r


def test_item_13_report_without_torch_and_torch_errors_name_their_function() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import numabind\n"
        "try:\n    numabind.report()\n"
        "except ImportError as e:\n    print(type(e).__name__, '|', e)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=clean_env())  # fmt: skip
    assert r.stdout.startswith("FrameworkMissing | numabind.report(): torch is not installed")
    from numabind.memory import _memory

    token = _memory.CALLER.set("numabind.torch.empty_on_node()")
    try:
        with pytest.raises(numabind.ConfigError, match=r"^numabind.torch.empty_on_node\(\): "):
            numabind.host_buffer(1 << 20, node=99)
    finally:
        _memory.CALLER.reset(token)
    with pytest.raises(numabind.ConfigError, match=r"^numabind.host_buffer\(\): "):
        numabind.host_buffer(1 << 20, node=99)


def test_item_14_cache_domains_from_shared_cpu_map(capsys: pytest.CaptureFixture[str]) -> None:
    """The capture has shared_cpu_map and no shared_cpu_list: two L3 per package, as
    lstopo finds on it (nvidiagpunumanodes-kept.console: L3Cache L#0-L#3)."""
    capture = str(HWLOC / "nvidiagpunumanodes.tar.bz2")
    rc, out, _ = run_main(capsys, "show", "--input", capture, "--draw")
    assert rc == 0 and "cache domains unknown" not in out
    l3 = [x.strip() for x in out.splitlines() if x.strip().startswith("L3 ")]
    assert l3 == ["L3 0-7 (2 cores)", "L3 8-15 (2 cores)", "L3 88-95 (2 cores)",
                  "L3 96-103 (2 cores)"], l3  # fmt: skip
    m = Machine.from_capture(capture)
    assert m.cache_of(4) == frozenset(range(8))
    from numabind._sources import read_paths

    assert "/sys/devices/system/cpu/{cpu}/cache/{index}/shared_cpu_map" in read_paths()


@two_cpus
def test_item_6_a_reservation_not_honoured_is_said_without_verbose(tmp_path: Path) -> None:
    """Node 0 has two cores: NUMABIND_RESERVE=2 would leave it none and is dropped.  The
    rank says so in one line at the default verbosity (what it was asked and did not do);
    a reservation that is honoured stays quiet."""
    from support import rank0_env, two_core_nodes

    root = two_core_nodes(str(tmp_path / "m"))
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    r = py(code, rank0_env(root, NUMABIND_RESERVE="2"))
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert r.stdout.strip() == "[0, 1]" and len(lines) == 1, r.stderr
    assert "no cores reserved: 2/node would leave node 0 (2 usable cores) no core" in lines[0]
    r = py(code, rank0_env(root, NUMABIND_RESERVE="1"))
    assert r.stdout.strip() == "[0]" and r.stderr == "", r.stderr
    from numabind._devices import resolve
    from numabind._plan import Request, plan

    m = Machine.from_root(root)
    p = plan(m, Request(local_rank=0, local_world_size=2, mode="exclusive",
                        visible=resolve(m, {})))  # fmt: skip
    assert p.unmet == () and p.bound
    p = plan(m, Request(local_rank=0, mode="exclusive", visible=resolve(m, {})))
    assert len(p.unmet) == 1 and "exclusive mode needs to know" in p.unmet[0], p


def test_item_15_matrix_says_what_it_does_not_read(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(
        capsys, "show", "--input", str(HWLOC / "memorysidecaches.tar.bz2"), "--matrix"
    )
    assert rc == 0 and out.splitlines() == [
        f"no GPUs or RDMA network adapters found ({HWLOC / 'memorysidecaches.tar.bz2'}): no matrix"
    ]
    rc, out, _ = run_main(capsys, "show", "--input", str(HWLOC / "nvidiaDGX2.xml"), "--matrix")
    notes = [x for x in out.splitlines() if x.startswith("note: ")]
    assert "NVLink is not read" in notes[0] and "NV#" in notes[0]
    assert "carries NVLink bandwidths (NVLinkBandwidth)" in notes[1]
    rc, out, _ = run_main(capsys, "show", "--example", "dgx-h100", "--matrix")
    assert "NVLinkBandwidth" not in out and "GPU NUMA ID" not in out
    rc, out, _ = run_main(capsys, "show", "--example", "gb200", "--matrix")
    header, *rows = out.splitlines()[:5]
    assert header.split()[-3:] == ["GPU", "NUMA", "ID"]
    assert [r.split()[-1] for r in rows] == ["2", "3", "4", "5"], rows
    assert matrix(out)[("GPU0", "GPU1")] == "NODE*"


def test_item_17_cli_text(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    def codes(command: str) -> list[str]:
        assert main([command, "--help"]) == 0
        section = capsys.readouterr().out.split("exit status:\n", 1)[1].split("\n\n")[0]
        return [line.split()[0] for line in section.splitlines()]

    assert codes("show") == ["0", "2"] and codes("gather") == ["0", "2"]
    assert codes("run") == ["0", "1", "2", "127"] and codes("check") == ["0", "1", "2", "3"]
    assert codes("doctor") == ["0", "1", "2"] and codes("bench") == ["0", "2"]
    rc, _, err = run_main(capsys, "show", "--json", "--matrix")
    assert rc == 2 and "to a file" not in err and "give one of them" in err
    rc, _, err = run_main(capsys, "show", "--json", "--svg", "-")
    assert rc == 2 and err.strip().endswith("give --svg a FILE instead of -"), err
    f = _findings(cli("doctor", "--json", env=clean_env(NUMABIND_MODE="sideways",
                                                        NUMABIND_MEMORY="nowhere")))  # fmt: skip
    r = cli("doctor", "--json", env=clean_env(NUMABIND_MODE="sideways", NUMABIND_MEMORY="nowhere"))
    details = [x["detail"] for x in json.loads(r.stdout)["findings"] if x["check"] == "settings"]
    assert len(details) == 2 and "sideways" in details[0] and "nowhere" in details[1], details
    assert f["machine"][0] == "info", "a bad setting is not the machine's fault"
    with tarfile.open(HWLOC / "32intel64-2p8co2t+8ve.tar.bz2") as t:
        t.extractall(tmp_path, filter="data")
    root = next(p for p in tmp_path.iterdir() if p.is_dir())
    r = cli("show", "--input", str(root))
    line = next(x for x in r.stdout.splitlines() if "not handled" in x)
    assert "doctor" not in line, "doctor looks at this machine, not at a capture"
    r = cli("show", env=clean_env(NUMABIND_SYSROOT=str(root)))
    assert "numabind doctor says more" in r.stdout
    with open(HWLOC / "nvidiaDGX2.xml", "rb") as xml:
        r = subprocess.run([*NUMABIND, "show", "--input", "-", "--matrix"], stdin=xml,
                           capture_output=True, text=True, env=clean_env())  # fmt: skip
    assert r.returncode == 0 and matrix(r.stdout)[("GPU0", "GPU1")] == "PIX", r.stderr
    gz = tmp_path / "c.tar.gz"
    assert cli("gather", str(gz)).returncode == 0
    with open(gz, "rb") as data:
        r = subprocess.run([*NUMABIND, "show", "--input", "-"], stdin=data,
                           capture_output=True, text=True, env=clean_env())  # fmt: skip
    assert r.returncode == 0 and r.stdout.startswith("numabind 0.3.0: standard input"), r


def test_item_18_wording(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _rc, out, _ = run_main(capsys, "show", "--example", "container")
    assert (
        "Accelerators (8 on the PCI bus, 2 visible and indexed: all 2 reachable nvidia GPUs)" in out
    )
    _, out, _ = run_main(capsys, "show", "--example", "two-nodes", "--draw")
    assert "(1 core)" in out and "(1 cores)" not in out
    one = synth.write(synth.one_node(), str(tmp_path / "one"))
    f = _findings(cli("doctor", "--json", env=clean_env(NUMABIND_SYSROOT=one)))
    assert f["machine"][1].startswith("1 NUMA node, 1 with CPUs"), f["machine"]
    _, out, _ = run_main(capsys, "show", "--example", "one-node", "--json")
    (rank,) = json.loads(out)["ranks"]
    assert rank["status"] == "skipped" and rank["memory_policy"] is None
    m = Machine.from_example("gb200")
    assert repr(m) == "<Machine 'example gb200', nodes 0-5, CPUs 0-143>"
    from numabind.check import _job, _report

    class Store:
        def check(self, keys: list[str]) -> bool:
            return False

    report = _report.read_report(Store(), "numabind/none/0", 1, 1.0)
    assert _job.report_lines(report)[0].startswith("numabind job report (no torchrun run id):")
    two = synth.write(synth.two_nodes(gpus=2), str(tmp_path / "two"))
    code = (
        "import numabind\n"
        "def work(rank):\n    pass\n"
        "if __name__ == '__main__':\n    numabind.spawn(work, 2)\n"
    )
    script = tmp_path / "spawn.py"
    script.write_text(code)
    env = clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="preferred")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stderr.count("set_mempolicy") == 1, r.stderr


def test_item_16_docs_render_and_resolve() -> None:
    """Gallery captions are commands a reader can type; every cross-reference resolves
    (the docs stage builds with nitpicky on and -W); no docstring puts two literals
    around a dot (``major``.``minor`` renders as backquotes); Request takes keywords,
    says so without a stale version, and shows its fields."""
    import inspect
    import pydoc
    import re

    sys.path.insert(0, str(HERE.parent / "docs" / "_ext"))
    import doc_examples
    import numabind_gallery

    lines = numabind_gallery.figure("x.png", ["--example", "gb200"], "GB200")
    assert "``numabind show --example gb200 --svg FILE``: GB200" in "\n".join(lines)
    conf = (HERE.parent / "docs" / "conf.py").read_text()
    assert re.search(r"^nitpicky = True$", conf, re.MULTILINE)
    for name, obj in doc_examples.docstring_objects():
        doc = inspect.getdoc(obj) or ""
        assert not re.search(r"``[^`]+``\.``", doc), name
    with pytest.raises(TypeError, match="keyword arguments only") as info:
        numabind.Request(0)  # type: ignore[misc]
    assert "0.3;" not in str(info.value) and "will be removed" not in str(info.value)
    signature = inspect.signature(numabind.Request)
    assert list(signature.parameters)[:3] == ["local_rank", "local_world_size", "rank_source"]
    assert {p.kind for p in signature.parameters.values()} == {inspect.Parameter.KEYWORD_ONLY}
    shown = pydoc.render_doc(numabind.Request, renderer=pydoc.plaintext)
    assert "local_rank: 'int | None'" in shown and "mode: 'str' = 'node'" in shown
    api = (HERE.parent / "docs" / "api.rst").read_text()
    for record in ("Accelerator", "Node", "Allowed", "Nic", "OtherDevice", "CpuInfo"):
        assert f".. autoclass:: numabind._model.{record}" in api, record


# --- issue 46: every setting that is set is used or said -----------------------------------------


def test_46_show_example_applies_every_planning_knob() -> None:
    """The memory-tiers and priority-cores pages give the variable form first: each knob of
    this shell plans the example, and the note names only what the user set."""
    r = cli("show", "--example", "gb200", env=clean_env(NUMABIND_SPILL="any"))
    assert r.returncode == 0, r.stderr
    assert "preferred 0, then 1" not in r.stdout and "preferred 0  bound" in r.stdout, r.stdout
    assert "NUMABIND_SPILL=cpu" not in r.stdout
    assert "note: from this shell: NUMABIND_SPILL=any" in r.stdout
    r = cli("show", "--example", "gb200")  # nothing set: the note names the default as such
    assert "note: spill cpu (the default): once a rank's nodes are full" in r.stdout, r.stdout
    assert "NUMABIND_SPILL=cpu" not in r.stdout
    r = cli("show", "--example", "gb200", "--spill", "cpu")
    assert "note: --spill cpu: once a rank's nodes are full" in r.stdout, r.stdout
    r = cli("show", "--example", "dgx-b300", env=clean_env(NUMABIND_PRIORITY="main"))
    assert "Plan (mode node, memory preferred, priority main;" in r.stdout, r.stdout
    assert "main thread" in r.stdout.split("Plan (")[1].splitlines()[1]
    env = clean_env(NUMABIND_NIC="ucx", NUMABIND_NIC_MODE="exclusive", NUMABIND_NIC_MIN_RATE="500")
    r = cli("show", "--example", "dgx-h100", env=env)
    assert "never: slow: 400 Gb/s below the minimum 500 Gb/s" in r.stdout, r.stdout
    assert (
        "note: from this shell: NUMABIND_NIC=ucx, NUMABIND_NIC_MODE=exclusive, "
        "NUMABIND_NIC_MIN_RATE=500"
    ) in r.stdout


def test_46_nic_column_says_it_is_advice_when_no_transport_is_told() -> None:
    r = cli("show", "--example", "dgx-h100")
    advice = "the ranks' adapters are advice: NUMABIND_NIC is unset, so no transport is told one"
    assert f"  note: {advice}" in r.stdout, r.stdout
    r = cli("show", "--example", "dgx-h100", "--draw")
    assert f"note: {advice}" in r.stdout and "NIC mlx5_0 (0000:19:00.0" in r.stdout, r.stdout
    for argv in (("show", "--example", "dgx-h100"), ("show", "--example", "dgx-h100", "--draw")):
        r = cli(*argv, env=clean_env(NUMABIND_NIC="nccl"))
        assert "advice" not in r.stdout and "mlx5_0" in r.stdout, r.stdout


def test_46_accelerator_counts_match_the_rows() -> None:
    """A container: 8 GPUs on the bus, 2 visible.  The header's numbers are the rows
    under it (8) and the rows with an index (2)."""
    r = cli("show", "--example", "container")
    lines = r.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("Accelerators ("))
    assert lines[at].startswith("Accelerators (8 on the PCI bus, 2 visible and indexed"), lines[at]
    rows = [x for x in lines[at + 2 : at + 20] if x.startswith("  ") and "nvidia" in x]
    assert len(rows) == 8 and sum(x.split()[0] != "-" for x in rows) == 2, rows
    r = cli("show", "--example", "mi300x-cpx")  # 8 GPUs split 64 ways: 8 rows, all indexed
    assert "on the PCI bus" not in r.stdout and "Accelerators (all 64 reachable" in r.stdout


def test_46_draw_legend_calls_a_character_a_core() -> None:
    r = cli("show", "--example", "container", "--draw")
    legend = r.stdout.split("\nlegend\n")[1]
    assert "  .  a core no rank is planned onto" in legend, legend
    assert "  x  a core this process may not use (its cgroup)" in legend
    assert "a CPU" not in legend and "each character is one core" in legend
    r = cli("show", "--example", "dgx-h100", "--draw")
    assert "  A  ranks 0-3 share these cores: CPUs 0-55,112-167" in r.stdout, r.stdout


def test_46_one_usable_core_is_singular() -> None:
    r = cli("show", "--example", "two-nodes", env=clean_env(NUMABIND_RESERVE="1"))
    assert "would leave node 0 (1 usable core) no core to compute on" in r.stdout, r.stdout
    assert "usable cores" not in r.stdout


def test_46_machine_from_root_without_a_root_follows_the_sysroot(tmp_path: Path) -> None:
    """``Machine.from_root()`` is this machine as numabind sees it (``Machine.here()``),
    as host_buffer and plan_for in the same shell read it; ``from_root("/")`` reads /."""
    root = str(tmp_path / "gb200")
    assert cli("gather", "--example", "gb200", root).returncode == 0
    code = (
        "import numabind\n"
        "print(numabind.Machine.from_root().description, len(numabind.Machine.from_root()"
        ".accelerators))\n"
        "print(numabind.Machine.from_root('/').description)\n"
    )
    r = py(code, clean_env(NUMABIND_SYSROOT=root))
    assert r.returncode == 0 and r.stdout.splitlines() == [f"{root} 4", "live system"], r


@pytest.mark.skipif(os.geteuid() != 0, reason="the redirect rules for root")
def test_46_a_sysroot_set_and_not_used_is_said_in_one_line(tmp_path: Path) -> None:
    """Root: show, doctor and the hook each say in one line, without verbose, that the
    sysroot is not used (before, only the header's 'live system' gave it away)."""
    two = synth.write(synth.two_nodes(), str(tmp_path / "two"))
    theirs = tmp_path / "theirs"
    shutil.copytree(two, theirs)
    os.chown(theirs, 65534, 65534)
    for root in ("rel/dir", "/nonexistent-numabind", str(theirs)):
        env = clean_env(NUMABIND_SYSROOT=root)
        r = cli("show", env=env)
        (line,) = r.stderr.splitlines()
        assert line.startswith("numabind show: NUMABIND_SYSROOT=") and "ignored for root: " in line
        assert line.endswith("; using /") and "//" not in line, line
        r = cli("doctor", env=env)
        said = [x for x in r.stdout.splitlines() if "NUMABIND_SYSROOT" in x]
        assert len(said) == 1 and said[0].startswith("WARN  settings"), r.stdout
        r = py("print('ok')", clean_env(LOCAL_RANK="0", NUMABIND_SYSROOT=root))
        (line,) = r.stderr.splitlines()
        assert r.stdout == "ok\n" and line.startswith("numabind: NUMABIND_SYSROOT="), r.stderr
    r = cli("show", env=clean_env(NUMABIND_SYSROOT=two))  # a root-owned tree is used: quiet
    assert r.returncode == 0 and r.stderr == "" and r.stdout.startswith(f"numabind 0.3.0: {two}")
    tarball = tmp_path / "x.tar.gz"  # a capture, not a folder: one line each, saying so
    tarball.write_bytes(b"")
    env = clean_env(NUMABIND_SYSROOT=str(tarball))
    for r in (cli("show", env=env), py("pass", clean_env(LOCAL_RANK="0", **env))):
        (line,) = r.stderr.splitlines()
        assert f"{tarball}: not a directory; Machine.from_capture reads a tarball" in line, line
    said = [x for x in cli("doctor", env=env).stdout.splitlines() if str(tarball) in x]
    assert len(said) == 1 and said[0].startswith("FAIL  machine"), said


@two_cpus
def test_46_every_knob_typo_gets_the_same_one_line(tmp_path: Path) -> None:
    """A NIC typo was the last bracket of a long binding line, a MODE typo its own line:
    now each is one line 'NUMABIND_X=... is not ...; <what numabind does instead>', and
    a binding that has nothing else to say stays quiet."""
    two = synth.write(synth.two_nodes(), str(tmp_path / "two"))
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    for knob, value, then in (
        ("NUMABIND_NIC", "uxc", "; using none"),
        ("NUMABIND_NIC_MODE", "nearst", "; using nearest"),
        ("NUMABIND_VERBOSE", "yse", "; using 0"),
        ("NUMABIND_MODE", "nod", "; numabind left this process unbound"),
    ):
        env = clean_env(LOCAL_RANK="0", NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none")
        env[knob] = value
        r = py(code, env)
        (line,) = r.stderr.splitlines()
        assert line.startswith(f"numabind: {knob}={value!r} is not ") and line.endswith(then), line
        assert len(line) < 130, line
        assert r.stdout.strip() == ("[0, 1]" if knob == "NUMABIND_MODE" else "[0]"), r.stdout
        r = cli("show", env=env)
        assert f"{knob}={value!r} is not " in r.stderr or knob == "NUMABIND_MODE", r.stderr


def test_46_a_device_list_typo_is_checked_on_a_one_node_machine(tmp_path: Path) -> None:
    one = synth.write(synth.one_node(), str(tmp_path / "one"))
    r = py("print('ok')", clean_env(LOCAL_RANK="0", NUMABIND_SYSROOT=one, NUMABIND_DEVICES="al"))
    (line,) = r.stderr.splitlines()
    assert "NUMABIND_DEVICES: device 'al': no accelerator 'al' on this machine" in line, r.stderr
    r = py("print('ok')", clean_env(LOCAL_RANK="0", NUMABIND_SYSROOT=one, NUMABIND_DEVICES="all"))
    assert r.stderr == "" and r.stdout == "ok\n", r.stderr


def test_46_a_static_rendezvous_job_is_not_titled_not_under_torchrun(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """torchrun --rdzv-backend static leaves --rdzv-id at its default, "none": the records
    are under numabind/none/0, and the report still names torchrun."""
    from numabind.check import _job, _report

    class Store:
        def check(self, keys: list[str]) -> bool:
            return False

    for name in ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "ROLE_NAME", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ROLE_NAME", "default")
    monkeypatch.setenv("GROUP_RANK", "0")
    title = _job.report_lines(_report.read_report(Store(), "numabind/none/0", 1, 1.0))[0]
    assert title.startswith(
        "numabind job report (torchrun, static rendezvous: no run id, restart 0):"
    ), title
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    title = _job.report_lines(_report.read_report(Store(), "numabind/none/0", 1, 1.0))[0]
    assert "not under torchrun" not in title and "torchrun, static rendezvous" in title, title


@two_cpus
def test_46_priority_main_hands_back_what_the_kernel_narrowed(tmp_path: Path) -> None:
    """The dgx-b300 playground on this 2-CPU host: rank 0's priority core is {0,128} and
    the kernel keeps {0}.  A thread and a child the pinned main thread starts still take
    the rank's whole set (what the kernel keeps of it: 0-1), as cores.rst says."""
    root = str(tmp_path / "b300")
    assert cli("gather", "--example", "dgx-b300", root).returncode == 0
    code = (
        "import os, subprocess, sys, threading\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0))))\n"
        "t.start(); t.join()\n"
        "child = subprocess.run([sys.executable, '-c', 'import os; "
        "print(sorted(os.sched_getaffinity(0)))'], capture_output=True, text=True)\n"
        "print(sorted(os.sched_getaffinity(0)), seen[0], child.stdout.strip())\n"
    )
    env = clean_env(
        LOCAL_RANK="0", NUMABIND_SYSROOT=root, NUMABIND_PRIORITY="main", NUMABIND_MEMORY="none"
    )
    r = py(code, env)
    assert r.returncode == 0 and r.stdout.strip() == "[0] [0, 1] [0, 1]", (r.stdout, r.stderr)


@two_cpus
def test_46_check_says_where_a_moved_thread_runs_now(tmp_path: Path) -> None:
    """A rank bound to CPU 0 and moved to 0-1: check's line names the plan's CPUs and
    where the threads run now, as the job table's CPUS NOW does."""
    two = synth.write(synth.two_nodes(), str(tmp_path / "two"))
    code = (
        "import os, subprocess, sys\n"
        "os.sched_setaffinity(0, {0, 1})\n"
        "r = subprocess.run([sys.executable, '-m', 'numabind', 'check', '--pid', "
        "str(os.getpid())], capture_output=True, text=True)\n"
        "print(r.stdout)\n"
    )
    r = py(code, clean_env(LOCAL_RANK="0", NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none"))
    first = r.stdout.splitlines()[0]
    assert first.startswith("OFF PLAN ") and ": node 0, CPUs 0, now 0-1, memory none" in first, (
        r.stdout
    )
    assert "machine: " not in r.stdout, "numabind's own note, for NUMABIND_DEBUG=1 only"


@two_cpus
def test_46_internal_notes_only_under_numabind_debug(tmp_path: Path) -> None:
    """Verbose prints the binding; the machine's origin, the warm start's hand-over and
    the kernel call behind a refusal are numabind's own notes: NUMABIND_DEBUG=1 only."""
    root = str(tmp_path / "b300")
    assert cli("gather", "--example", "dgx-b300", root).returncode == 0
    base = {"NUMABIND_SYSROOT": root, "NUMABIND_MEMORY": "none"}
    verbose = py("pass", clean_env(LOCAL_RANK="0", NUMABIND_VERBOSE="1", **base)).stderr
    assert verbose.startswith("numabind: local rank 0 (LOCAL_RANK): CPUs 0-63,128-191"), verbose
    assert "[machine: " not in verbose and "planned by the full path" not in verbose, verbose
    debug = py("pass", clean_env(LOCAL_RANK="0", NUMABIND_VERBOSE="1", NUMABIND_DEBUG="1", **base))
    assert "[machine: " in debug.stderr and "[planned by the full path: " in debug.stderr
    refused = py("pass", clean_env(LOCAL_RANK="4", **base)).stderr  # node 1: no CPU here
    assert (
        "[error: the kernel refused CPUs 64-127,192-255: none of these CPUs is online and "
        "allowed by this process's cgroup cpuset (this process may use 0-1)]"
    ) in refused, refused
    assert "sched_setaffinity" not in refused and "thread " not in refused
    debug = py("pass", clean_env(LOCAL_RANK="4", NUMABIND_DEBUG="1", **base)).stderr
    assert "[error: sched_setaffinity(thread " in debug, debug


def test_46_gather_force_replaces_a_folder_gather_wrote(tmp_path: Path) -> None:
    out = tmp_path / "dgx"
    assert cli("gather", "--example", "two-nodes", str(out)).returncode == 0
    r = cli("gather", "--example", "two-nodes", str(out))
    assert r.returncode == 2 and r.stderr.strip().endswith(
        "not empty: give a new or an empty folder, or --force to replace it"
    ), r.stderr
    r = cli("gather", "--example", "gb200", str(out), "--force")
    assert r.returncode == 0 and r.stdout.startswith("numabind: wrote example gb200 ("), r.stderr
    assert cli("show", env=clean_env(NUMABIND_SYSROOT=str(out))).stdout.count("GB200") == 4
    mine = tmp_path / "mine"  # a folder of the user's own: --force never empties it
    (mine / "sys").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep\n")
    r = cli("gather", "--example", "gb200", str(mine), "--force")
    assert r.returncode == 2 and "--force replaces only a folder numabind gather" in r.stderr
    assert (mine / "notes.txt").read_text() == "keep\n"


def test_46_show_svg_says_it_wrote_the_file(tmp_path: Path) -> None:
    target = tmp_path / "dgx.svg"
    r = cli("show", "--example", "dgx-h100", "--svg", str(target))
    assert r.returncode == 0 and target.read_text().startswith("<svg"), r.stderr
    assert r.stderr == f"numabind show: wrote the picture to {target}\n", r.stderr
    assert r.stdout.startswith("numabind 0.3.0: example dgx-h100")
    r = cli("show", "--example", "dgx-h100", "--svg", "-")
    assert r.stderr == "" and r.stdout.startswith("<svg")


def test_46_doctor_cpuset_finding_is_a_sentence(tmp_path: Path) -> None:
    """The k8s-pod playground: two GPUs on node 1, the pod's CPUs 0-7 on node 0.  The
    finding names the GPUs, their node and the CPUs allowed in one sentence, then the fix
    (before: 'the node of GPU 0 (...) is on node 1')."""
    root = str(tmp_path / "pod")
    assert cli("gather", "--example", "k8s-pod", root).returncode == 0
    r = cli("doctor", env=clean_env(NUMABIND_SYSROOT=root))
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("FAIL  cpuset")]
    assert (
        "GPU 0 (0000:9a:00.0), GPU 1 (0000:ab:00.0) are on node 1 (CPUs 56-111,168-223), and "
        "none of the CPUs this process may use is there (CPUs 0-7, from cgroup v2 "
    ) in line, line
    assert "): their ranks are not bound. Fix: in Kubernetes, give the pod exclusive CPUs" in line
    assert "the node of GPU" not in line and "is on node 1 (CPUs" not in line


def test_46_a_corrupt_dra_file_is_said_once_and_the_fall_back_too(tmp_path: Path) -> None:
    root = tmp_path / "pod"
    assert cli("gather", "--example", "k8s-pod", str(root)).returncode == 0
    (meta,) = root.glob("var/run/kubernetes.io/dra-device-attributes/*/*/*/*-metadata.json")
    meta.write_text("{not json\n")
    env = clean_env(NUMABIND_SYSROOT=str(root))
    r = cli("show", env=env)
    assert r.returncode == 0 and r.stdout.count("not JSON") == 1, r.stdout
    fell = "no DRA device metadata could be used: planned for all 8 nvidia GPUs in sysfs"
    assert f"  note: {fell}, which may be more than this container was given" in r.stdout
    r = cli("doctor", env=env)
    assert r.stdout.count("not JSON") == 1 and f"WARN  visible devices    {fell}" in r.stdout, (
        r.stdout
    )
