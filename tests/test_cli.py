"""``numabind show`` / ``gather`` / ``run`` through ``main(argv)`` and as a real command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import synth
from numabind.cli import main
from support import clean_env, two_cpus


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_show_live_machine(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_main(capsys, "show")
    assert rc == 0, err
    assert "NUMA nodes" in out and "Plan (mode node" in out


def test_show_json_schema(capsys: pytest.CaptureFixture[str], dgx_root: str) -> None:
    rc, out, _ = run_main(capsys, "show", "--input", dgx_root, "--json", "--nproc", "8")
    assert rc == 0
    data = json.loads(out)
    assert {"id", "cpus", "has_cpus", "memory_bytes"} <= set(data["nodes"][0])
    assert {"index", "pci", "vendor", "numa_node", "memory_node", "uuid"} <= set(data["devices"][0])
    rank_keys = {
        "local_rank",
        "rank_source",
        "local_world_size",
        "device_pci",
        "numa_node",
        "cpus",
        "memory_nodes",
        "memory_policy",
        "status",
        "reason",
    }
    assert len(data["ranks"]) == 8 and rank_keys <= set(data["ranks"][0])
    assert (
        data["ranks"][5]["numa_node"] == 1 and data["ranks"][5]["device_pci"] == synth.DGX_BDFS[5]
    )
    assert data["ranks"][0]["cpus"] == sorted(data["ranks"][0]["cpus"])
    assert [d["pci"] for d in data["devices"] if d["vendor"] == "nvidia"] == synth.DGX_BDFS


def test_show_text_table(capsys: pytest.CaptureFixture[str], dgx_root: str) -> None:
    rc, out, _ = run_main(capsys, "show", "--input", dgx_root, "--mode", "exclusive")
    assert rc == 0
    assert "0-13,112-125" in out, "rank 0's exclusive share"
    assert "8 local ranks: one per visible device" in out
    assert "(memory only)" not in out


def test_show_uses_recorded_environment(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = synth.write(
        synth.dgx_h100(
            filler_pci=0,
            environ={"CUDA_VISIBLE_DEVICES": "6,7", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0"},
        ),
        str(tmp_path / "c"),
    )
    _rc, out, _ = run_main(capsys, "show", "--input", root, "--json")
    data = json.loads(out)
    assert [r["device_pci"] for r in data["ranks"]] == synth.DGX_BDFS[6:8]
    assert data["ranks"][0]["rank_source"] == "LOCAL_RANK"


def test_show_hwloc_xml_and_tarball(capsys: pytest.CaptureFixture[str], hwloc_dir: Path) -> None:
    rc, out, _ = run_main(capsys, "show", "--input", str(hwloc_dir / "nvidiaDGX2.xml"), "--json")
    assert rc == 0 and len(json.loads(out)["ranks"]) == 16
    rc, out, _ = run_main(capsys, "show", "--input", str(hwloc_dir / "nvidiagpunumanodes.tar.bz2"))
    assert rc == 0 and "(memory only)" in out and "255" in out


def test_gather_round_trip(
    capsys: pytest.CaptureFixture[str],
    dgx_root: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NUMABIND_SYSROOT", dgx_root)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    tar = str(tmp_path / "cap.tar.gz")
    rc, out, _ = run_main(capsys, "gather", tar)
    assert rc == 0 and "wrote" in out
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.delenv("NUMABIND_SYSROOT")
    rc, out, _ = run_main(capsys, "show", "--input", tar, "--json")
    data = json.loads(out)
    assert [r["device_pci"] for r in data["ranks"]] == synth.DGX_BDFS[4:6], (
        "the recorded CUDA_VISIBLE_DEVICES"
    )
    direct = json.loads(run_main(capsys, "show", "--input", dgx_root, "--json", "--nproc", "2")[1])
    assert data["nodes"] == direct["nodes"]


@pytest.mark.parametrize(
    "argv",
    [
        ["show", "--input", "/nonexistent"],
        ["show", "--input", ""],
        ["show", "--mode", "sideways"],
        ["show", "--mode", "bogus"],
        ["show", "--nproc", "0"],
        ["show", "--nproc", "-3"],
        ["show", "--nproc", "4097"],
        ["show", "--nproc", "abc"],
        ["show", "--svg", "/no/such/folder/x.svg"],
        ["bogus"],
        ["run"],
        ["run", "--local-rank", "-1", "--", "true"],
        ["run", "--local-rank", "abc", "--", "true"],
        ["run", "--local-rank", "99999999999", "--", "true"],
        ["check", "--pid", "abc"],
        ["check", "--pid", "-5"],
        ["gather", "/no/such/folder/cap.tar.gz"],
        ["show", "--input", "/etc/hostname"],
    ],
)
def test_usage_errors_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    rc, out, err = run_main(capsys, *argv)
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert out == ""


@pytest.mark.parametrize(
    "xml",
    [
        '<topology><object type="Machine" cpuset="0xzz"/></topology>',
        '<topology><object type="Machine" cpuset="0x1"><object type="NUMANode" os_index="abc"'
        ' cpuset="0x1"/></object></topology>',
        '<topology><object type="Machine" cpuset="0x1"><object type="PU" os_index="-3"/>'
        "</object></topology>",
        '<topology><object type="Machine" cpuset="' + "f" * 5000 + '"/></topology>',
        '<topology><object type="Machine" cpuset="0x' + "1" * 5000 + '"/></topology>',
        '<?xml version="1.0"?><!DOCTYPE t [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;">]>'
        "<topology>&b;</topology>",
        "<topology><object",
        "not xml at all",
        "<html></html>",
    ],
)
def test_malformed_hwloc_xml_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, xml: str
) -> None:
    path = tmp_path / "bad.xml"
    path.write_text(xml)
    rc, out, err = run_main(capsys, "show", "--input", str(path))
    assert rc == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert str(path) in err


def test_help_describes_everything(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_main(capsys, "--help")
    assert rc == 0
    for word in (
        "show",
        "gather",
        "run",
        "check",
        "exclusive",
        "NUMABIND_MODE",
        "NUMABIND_SYSROOT",
        "exit status",
    ):
        assert word in out, word
    rc, out, _ = run_main(capsys, "show", "--help")
    assert "core-complex" in out and "interleave" in out
    for sub in ("show", "gather", "run", "check"):
        rc, out, _ = run_main(capsys, sub, "--help")
        assert rc == 0 and "usage: numabind " + sub in out
    rc, out, _ = run_main(capsys, "check", "--help")
    assert "3   --pid: a process named" in out and "--all" in out and "--deadline" in out
    assert "interleave" not in out, "check takes no memory policy: its help lists none"


def test_gather_to_stdout(
    capsys: pytest.CaptureFixture[str], dgx_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    import tarfile

    monkeypatch.setenv("NUMABIND_SYSROOT", dgx_root)
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "gather", "-"],
        capture_output=True,
        env={**os.environ, "NUMABIND_SYSROOT": dgx_root},
    )
    assert p.returncode == 0 and b"wrote" in p.stderr
    with tarfile.open(fileobj=io.BytesIO(p.stdout)) as tar:
        names = tar.getnames()
    assert "numabind-capture/numabind-env.json" in names
    assert any(n.endswith("/sys/devices/system/node/node1/cpulist") for n in names)


def test_gather_replaces_a_planted_link(
    capsys: pytest.CaptureFixture[str],
    dgx_root: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NUMABIND_SYSROOT", dgx_root)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    out = tmp_path / "cap.tar.gz"
    out.symlink_to(victim)
    rc, _, err = run_main(capsys, "gather", str(out))
    assert rc == 2 and "exists; --force replaces it" in err, "checked before any work"
    assert victim.read_text() == "precious" and out.is_symlink()
    rc, _, err = run_main(capsys, "gather", "--force", str(out))
    assert rc == 0, err
    assert victim.read_text() == "precious" and not out.is_symlink(), "replaced, not followed"


def test_show_names_the_capture_given(capsys: pytest.CaptureFixture[str], hwloc_dir: Path) -> None:
    path = str(hwloc_dir / "nvidiagpunumanodes.tar.bz2")
    rc, out, _ = run_main(capsys, "show", "--input", path)
    assert rc == 0 and out.splitlines()[0].endswith(path)
    assert "1 local ranks" not in out and "  \n" not in out


def test_show_one_rank_is_singular(capsys: pytest.CaptureFixture[str], dgx_root: str) -> None:
    rc, out, _ = run_main(capsys, "show", "--input", dgx_root, "--nproc", "1")
    assert rc == 0 and "1 local rank:" in out and "1 local ranks" not in out
    assert all(line == line.rstrip() for line in out.splitlines()), "no trailing spaces"


def test_show_threads_per_rank(capsys: pytest.CaptureFixture[str], dgx_root: str) -> None:
    rc, out, _ = run_main(capsys, "show", "--input", dgx_root, "--json")
    assert rc == 0
    data = json.loads(out)
    # node mode: 56 cores per node shared by the 4 ranks whose GPUs are on it
    assert [r["threads"] for r in data["ranks"]] == [14] * 8
    _, out, _ = run_main(capsys, "show", "--input", dgx_root, "--json", "--mode", "exclusive")
    assert [r["threads"] for r in json.loads(out)["ranks"]] == [14] * 8
    _, out, _ = run_main(
        capsys, "show", "--input", dgx_root, "--json", "--nproc", "2", "--mode", "socket"
    )
    # ranks 0 and 1 both use GPUs of node 0 (= package 0): they share its 56 cores
    assert [r["threads"] for r in json.loads(out)["ranks"]] == [28, 28]


def test_check_without_rank_says_to_give_pid_or_all(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_main(capsys, "check")
    assert rc == 2 and out == "" and "--pid" in err and "--all" in err


def test_bad_env_value_is_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NUMABIND_MEMORY", "everywhere")
    rc, _, err = run_main(capsys, "show")
    assert rc == 2 and "NUMABIND_MEMORY='everywhere'" in err and "preferred" in err


def test_python_dash_m_and_console_script(dgx_root: str) -> None:
    a = subprocess.run(
        [sys.executable, "-m", "numabind", "show", "--input", dgx_root, "--json"],
        capture_output=True,
        text=True,
    )
    assert a.returncode == 0, a.stderr
    exe = Path(sys.executable).parent / "numabind"
    if exe.exists():
        b = subprocess.run(
            [str(exe), "show", "--input", dgx_root, "--json"], capture_output=True, text=True
        )
        assert b.returncode == 0 and json.loads(b.stdout) == json.loads(a.stdout)


def test_run_execs_the_command() -> None:
    env = clean_env()
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "numabind",
            "run",
            "--local-rank",
            "0",
            "--",
            sys.executable,
            "-c",
            "import os; print(os.environ['LOCAL_RANK'], os.environ['NUMABIND_STATE'])",
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    rank, state = p.stdout.split()
    assert rank == "0" and state.startswith("LOCAL_RANK=0|")
    missing = subprocess.run(
        [sys.executable, "-m", "numabind", "run", "--", "/no/such/program"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert missing.returncode == 127 and "cannot run" in missing.stderr


@two_cpus
@pytest.mark.parametrize(
    ("enable", "expected"),
    [
        ("auto", "replaced CPU mask 0 (outside the GPU's node)"),
        ("respect", "kept CPU mask 0 (NUMABIND=respect)"),
    ],
)
def test_show_reports_what_the_hook_did_to_it(tmp_path: Path, enable: str, expected: str) -> None:
    root = synth.write(synth.two_nodes(), str(tmp_path / "root"))
    env = clean_env()
    env.update(
        LOCAL_RANK="1",
        LOCAL_WORLD_SIZE="2",
        NUMABIND_SYSROOT=root,
        NUMABIND_MEMORY="none",
        NUMABIND=enable,
    )
    p = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-m", "numabind", "show", "--json"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert p.returncode == 0, p.stderr
    this = json.loads(p.stdout)["this_process"]
    assert this["hook"]["existing"].startswith(expected), this
    assert ("local rank 1 (LOCAL_RANK; 2 local ranks from LOCAL_WORLD_SIZE)") in this["summary"]
