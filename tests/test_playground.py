"""The playground (issue 37 #7): ``numabind gather --example NAME DIR`` writes an example
machine as a sysroot, and the knobs, ``show``, ``run``, ``check`` and the Python API read
it as this machine; ``show --example`` and a capture honour the shell's planning knobs and
say so in one line.  The folder is written as every file numabind writes: never through a
link, never into a folder someone else may change."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from support import clean_env, two_cpus

NUMABIND = [sys.executable, "-m", "numabind"]


def cli(*argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*NUMABIND, *argv], capture_output=True, text=True, env=clean_env(**env), timeout=120
    )


def gathered(tmp_path: Path, name: str) -> str:
    where = tmp_path / name
    r = cli("gather", "--example", name, str(where))
    assert r.returncode == 0, r.stderr
    assert f"export NUMABIND_SYSROOT={where}" in r.stdout, r.stdout
    return str(where)


def test_an_example_on_disk_plans_as_the_example_in_memory(tmp_path: Path) -> None:
    root = gathered(tmp_path, "dgx-h100")
    on_disk = json.loads(cli("show", "--json", NUMABIND_SYSROOT=root).stdout)
    in_memory = json.loads(cli("show", "--example", "dgx-h100", "--json").stdout)
    assert on_disk["machine"] == root and in_memory["machine"] == "example dgx-h100"
    for key in ("nodes", "devices", "ranks", "online_cpus", "allowed"):
        assert on_disk[key] == in_memory[key], key
    matrix = cli("show", "--matrix", NUMABIND_SYSROOT=root).stdout
    assert matrix == cli("show", "--example", "dgx-h100", "--matrix").stdout


def test_the_python_api_and_the_knobs_on_the_playground(tmp_path: Path) -> None:
    root = gathered(tmp_path, "gb200")
    code = (
        "import numabind\n"
        "p = numabind.plan_for(device=3)\n"
        "print(p.numa_node, p.memory_policy, sorted(p.cpus)[:2])\n"
        "print(numabind.Machine.from_root().description)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=clean_env(NUMABIND_SYSROOT=root, NUMABIND_MEMORY="bind"),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["1 bind [72, 73]", root], r.stdout
    data = json.loads(cli("show", "--json", NUMABIND_SYSROOT=root, NUMABIND_MODE="socket").stdout)
    assert {p["mode"] for p in data["ranks"]} == {"socket"}


@two_cpus
def test_run_and_check_on_the_playground(tmp_path: Path) -> None:
    """two-nodes is the example this 2-CPU host can really bind to: rank 1 runs on CPU 1
    (memory policy none: node 1 is not this kernel's), and check finds it on its plan."""
    root = gathered(tmp_path, "two-nodes")
    env = clean_env(NUMABIND_SYSROOT=root, NUMABIND_MEMORY="none", LOCAL_WORLD_SIZE="2")
    show = "import os; print(sorted(os.sched_getaffinity(0)))"
    r = subprocess.run(
        [*NUMABIND, "run", "--local-rank", "1", "--", sys.executable, "-c", show],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0 and r.stdout.strip() == "[1]", r
    rank = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], env={**env, "LOCAL_RANK": "1"}
    )
    try:
        # the rank binds itself in its startup hook: check it once it has (a loaded host
        # can take a while to start an interpreter)
        began = time.monotonic()
        while time.monotonic() - began < 20:
            try:
                if os.sched_getaffinity(rank.pid) == {1}:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        c = subprocess.run(
            [*NUMABIND, "check", "--pid", str(rank.pid)], capture_output=True, text=True, env=env
        )
    finally:
        rank.kill()
        rank.wait()
    assert c.stdout.startswith("OK ") and "node 1, CPUs 1" in c.stdout, c.stdout + c.stderr


def test_show_example_honours_the_knobs_and_says_what_it_left_out() -> None:
    r = cli("show", "--example", "dgx-h100", "--json", NUMABIND_MODE="exclusive",
            NUMABIND_SMT="1", CUDA_VISIBLE_DEVICES="4,5")  # fmt: skip
    data = json.loads(r.stdout)
    assert {p["mode"] for p in data["ranks"]} == {"exclusive"}
    assert {p["smt"] for p in data["ranks"]} == {"1"} and len(data["ranks"]) == 8
    assert data["notes"][0] == "from this shell: NUMABIND_MODE=exclusive, NUMABIND_SMT=1"
    assert data["notes"][1].startswith("CUDA_VISIBLE_DEVICES of this shell not applied")
    text = cli("show", "--example", "dgx-h100", NUMABIND_MODE="exclusive").stdout
    assert "Plan (mode exclusive" in text
    assert text.rstrip().splitlines()[-1] == "note: from this shell: NUMABIND_MODE=exclusive"
    r = cli("show", "--example", "dgx-h100", NUMABIND_MODE="sideways")
    assert r.returncode == 2 and "NUMABIND_MODE" in r.stderr and "sideways" in r.stderr
    r = cli("show", "--example", "gb200", "--json", NUMABIND_SYSROOT="/nowhere")
    assert json.loads(r.stdout)["notes"][-1].startswith("NUMABIND_SYSROOT of this shell not")
    plain = json.loads(cli("show", "--example", "dgx-h100", "--json").stdout)
    assert plain["notes"] == [] and {p["mode"] for p in plain["ranks"]} == {"node"}


def test_a_capture_with_a_recorded_environment_takes_the_shell_s_knobs(tmp_path: Path) -> None:
    import synth

    spec = synth.dgx_h100(filler_pci=0)
    spec.environ = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4", "NUMABIND_MODE": "socket"}
    root = synth.write(spec, str(tmp_path / "capture"))
    data = json.loads(cli("show", "--input", root, "--json").stdout)
    assert {p["mode"] for p in data["ranks"]} == {"socket"} and len(data["ranks"]) == 4
    assert data["notes"] == []
    data = json.loads(cli("show", "--input", root, "--json", NUMABIND_MODE="exclusive").stdout)
    assert {p["mode"] for p in data["ranks"]} == {"exclusive"} and len(data["ranks"]) == 4
    assert data["notes"] == [
        "from this shell: NUMABIND_MODE=exclusive (not the capture's 'socket')"
    ]


def test_the_folder_is_never_written_through_a_link_or_into_another_s(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    r = cli("gather", "--example", "one-node", str(link))
    assert r.returncode == 2 and "not a folder" in r.stderr and list(target.iterdir()) == []
    full = tmp_path / "full"
    full.mkdir()
    (full / "mine").write_text("keep")
    r = cli("gather", "--example", "one-node", str(full))
    assert r.returncode == 2 and "not empty" in r.stderr and len(r.stderr.splitlines()) == 1
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    r = cli("gather", "--example", "one-node", str(shared))
    assert r.returncode == 2 and "writable by group or others" in r.stderr
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 43212, 43212)
        r = cli("gather", "--example", "one-node", str(theirs))
        assert r.returncode == 2 and "owned by uid 43212" in r.stderr
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    r = cli("gather", "--example", "one-node", str(empty))
    assert r.returncode == 0 and (empty / "sys" / "devices" / "system" / "node").is_dir()
    r = cli("gather", "--example", "one-node")
    assert r.returncode == 2 and "give the folder to write" in r.stderr


@pytest.mark.parametrize(("name", "magic"), [
    ("c.tar", None), ("c.tar.gz", b"\x1f\x8b"), ("c.tar.xz", b"\xfd7zXZ"), ("c.tgz", b"\x1f\x8b"),
    ("c.tar.bz2", b"BZh"),
])  # fmt: skip
def test_gather_compresses_as_the_name_says(tmp_path: Path, name: str, magic: bytes | None) -> None:
    """Issue 37 #18: ``gather out.tar`` wrote gzip."""
    out = tmp_path / name
    r = cli("gather", str(out))
    assert r.returncode == 0, r.stderr
    head = out.read_bytes()[:6]
    if magic is None:
        assert tarfile.is_tarfile(out) and out.read_bytes()[257:262] == b"ustar"
    else:
        assert head.startswith(magic), head
    assert cli("show", "--input", str(out)).returncode == 0
    example = tmp_path / f"example-{name}"
    r = cli("gather", "--example", "mi300x", str(example))
    assert r.returncode == 0, r.stderr
    data = json.loads(cli("show", "--input", str(example), "--json").stdout)
    assert len(data["devices"]) == 8 and data["machine"] == str(example)
