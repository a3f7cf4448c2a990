"""Every binder named (numabind._binders.BINDER_TABLE): a real rank started with a
library's re-pinning switch is named by ``check --pid`` with what it will do and the fix;
``NUMABIND_BINDERS=keep`` sets the off switches where the user set none and keeps what
the user set; an active sched_ext scheduler is read from a sysroot; a mask an exec wrapper
left (numactl) is recorded with what the keep/replace rule did.

The libraries themselves (HIP, TensorRT-LLM, NCCL, RCCL) do not install here: the rows are
tested against their documented behaviour, each row naming its source."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from numabind import _binders
from numabind._environ import KNOBS
from numabind._topology import Machine
from support import clean_env, two_cpus

ROOT = Path(__file__).resolve().parent.parent
SWITCHES = {
    "AMD_CPU_AFFINITY": "1",
    "TLLM_NUMA_AWARE_WORKER_AFFINITY": "1",
    "NCCL_IGNORE_CPU_AFFINITY": "1",
}
CHILD = """
import os, sys
names = sys.argv[1:]
print("ready", *(f"{n}={os.environ.get(n, '-')}" for n in names), flush=True)
sys.stdin.readline()
"""


def _rank(
    root: str, registry: Path, rank: int, *pre: str, **env: str
) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """A rank the startup hook binds on ``root``, registered in ``registry``, exec'd
    through ``pre`` (a wrapper: ``taskset -c 1``); prints the variables of the binder
    table as it sees them after the hook, then waits."""
    e = clean_env(
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
        NUMABIND_SYSROOT=root,
        NUMABIND_REGISTRY=str(registry),
        NUMABIND_VERBOSE="1",
        **env,
    )
    names = [b.key for b in _binders.BINDER_TABLE if b.detect == "env"]
    child = subprocess.Popen(
        [*pre, sys.executable, "-c", CHILD, *names],
        env=e,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    line = child.stdout.readline().split()
    assert line and line[0] == "ready", (line, child.stderr.read() if child.stderr else "")
    seen = dict(item.split("=", 1) for item in line[1:])
    return child, seen


WRAPPER = shutil.which("numactl") or shutil.which("taskset")


def _check(pid: int, root: str, registry: Path) -> dict[str, Any]:
    e = clean_env(NUMABIND_SYSROOT=root, NUMABIND_REGISTRY=str(registry))
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "check", "--pid", str(pid), "--json"],
        capture_output=True,
        text=True,
        env=e,
        timeout=120,
    )
    (proc,) = json.loads(p.stdout)["processes"]
    assert isinstance(proc, dict)
    return proc


def _stop(child: subprocess.Popen[str]) -> None:
    child.kill()
    child.wait()


@two_cpus
def test_check_pid_names_each_switch_with_what_it_does_and_the_fix(
    two: str, tmp_path: Path
) -> None:
    """A real rank started with HIP's, TensorRT-LLM's and NCCL's switches: ``check --pid``
    lists each in ``binders`` and says, in a note, the variable, who reads it, what it
    will do to numabind's binding and the fix."""
    child, _ = _rank(two, tmp_path, 0, NUMABIND="force", **SWITCHES)
    try:
        proc = _check(child.pid, two, tmp_path)
        assert proc["status"] == "bound", proc
        assert set(proc["binders"]) == {"hip", "trtllm", "nccl-ignore"}, proc["binders"]
        notes = "\n".join(proc["notes"])
        for name, value in SWITCHES.items():
            row = next(b for b in _binders.BINDER_TABLE if b.key == name)
            line = next(n for n in proc["notes"] if n.startswith(f"{name}={value} "))
            assert row.label in line and row.does in line and f"fix: {row.fix}" in line, line
            assert row.source in line
        assert "GPU 0's nearest node" in notes  # HIP's effect, in the library's terms
        assert "ignores the process's CPU mask" in notes
        assert "numabind never sets it" in notes
    finally:
        _stop(child)


@two_cpus
def test_a_rank_without_switches_names_none(two: str, tmp_path: Path) -> None:
    """The same rank with the switches off (``0``): nothing named (a value that does not
    make the library re-pin is not a finding)."""
    off = {k: "0" for k in SWITCHES}
    child, _ = _rank(two, tmp_path, 0, NUMABIND="force", **off)
    try:
        proc = _check(child.pid, two, tmp_path)
        assert proc["binders"] == [], proc["binders"]
        assert not any("fix:" in n for n in proc["notes"]), proc["notes"]
    finally:
        _stop(child)


@two_cpus
def test_keep_sets_the_off_switches_where_unset(two: str, tmp_path: Path) -> None:
    """``NUMABIND_BINDERS=keep``: the rank runs with AMD_CPU_AFFINITY=0 and
    TLLM_NUMA_AWARE_WORKER_AFFINITY=0; NCCL_IGNORE_CPU_AFFINITY stays unset; without the
    knob nothing is set."""
    child, seen = _rank(two, tmp_path, 0, NUMABIND="force", NUMABIND_BINDERS="keep")
    _stop(child)
    assert seen["AMD_CPU_AFFINITY"] == "0" and seen["TLLM_NUMA_AWARE_WORKER_AFFINITY"] == "0"
    assert seen["NCCL_IGNORE_CPU_AFFINITY"] == "-", "named, never set"
    child, seen = _rank(two, tmp_path, 0, NUMABIND="force")
    _stop(child)
    assert set(seen.values()) == {"-"}, seen


@two_cpus
def test_keep_never_overwrites_a_value_the_user_set(two: str, tmp_path: Path) -> None:
    """A value set before numabind is kept, ``1`` included, and said once as a warning."""
    child, seen = _rank(
        two, tmp_path, 0, NUMABIND="force", NUMABIND_BINDERS="keep", AMD_CPU_AFFINITY="1"
    )
    child.kill()
    _, err = child.communicate()
    assert seen["AMD_CPU_AFFINITY"] == "1" and seen["TLLM_NUMA_AWARE_WORKER_AFFINITY"] == "0"
    assert err.count("AMD_CPU_AFFINITY=1 (HIP (ROCm))") == 1, err
    assert "kept: set before numabind" in err


def test_keep_env_is_the_keep_replace_rule() -> None:
    """The rule on a plain mapping: unset gets the off value, anything set stays."""
    env = {"TLLM_NUMA_AWARE_WORKER_AFFINITY": "auto"}
    done = _binders.keep_env(env)
    assert env == {"TLLM_NUMA_AWARE_WORKER_AFFINITY": "auto", "AMD_CPU_AFFINITY": "0"}
    assert done.set == (("AMD_CPU_AFFINITY", "0"),)
    assert done.kept == (("TLLM_NUMA_AWARE_WORKER_AFFINITY", "auto"),)
    assert "NCCL_IGNORE_CPU_AFFINITY" not in env


def _with_sched_ext(two: str, tmp_path: Path, state: str, ops: str) -> str:
    root = tmp_path / "root"
    shutil.copytree(two, root, symlinks=True)
    d = root / "sys" / "kernel" / "sched_ext"
    (d / "root").mkdir(parents=True)
    (d / "state").write_text(state + "\n")
    (d / "root" / "ops").write_text(ops + "\n")
    return str(root)


@pytest.mark.parametrize(
    ("state", "ops", "named"),
    [
        ("enabled", "scx_cosmos", "scx_cosmos"),
        ("disabled", "scx_cosmos", None),
        ("enabled", "evil\x1b[2J\nname", "an unnamed scheduler"),
    ],
)
def test_sched_ext_from_a_sysroot(
    two: str, tmp_path: Path, state: str, ops: str, named: str | None
) -> None:
    """The scheduler is read from the machine's files under the sysroot; a name that is
    not a plain word is never shown as it is."""
    root = _with_sched_ext(two, tmp_path, state, ops)
    with Machine.from_root(root) as m:
        assert m.sched_ext == named
    with Machine.from_root(two) as m:
        assert m.sched_ext is None


def test_gather_keeps_the_scheduler_and_the_capture_reads_it_back(two: str, tmp_path: Path) -> None:
    """``numabind gather`` copies the sched_ext files (they are among the files the reader
    reads): a capture of a machine running scx_cosmos says so where it is read."""
    from numabind._roots import for_path
    from numabind.cli._gather import _write_tar

    root = _with_sched_ext(two, tmp_path, "enabled", "scx_cosmos")
    out = tmp_path / "capture.tar.gz"
    r = for_path(root)
    with out.open("wb") as f:
        _write_tar(f, r, {})
    r.close()
    assert Machine.from_capture(str(out)).sched_ext == "scx_cosmos"


@two_cpus
def test_check_names_an_active_sched_ext_scheduler(two: str, tmp_path: Path) -> None:
    root = _with_sched_ext(two, tmp_path, "enabled", "scx_cosmos")
    child, _ = _rank(root, tmp_path, 0, NUMABIND="force")
    try:
        proc = _check(child.pid, root, tmp_path)
        assert "sched_ext" in proc["binders"], proc
        line = next(n for n in proc["notes"] if "scx_cosmos" in n)
        assert line.startswith("sched_ext scheduler scx_cosmos active (a sched_ext scheduler)")
        assert "fix:" in line
    finally:
        _stop(child)


@two_cpus
def test_a_mask_an_exec_wrapper_left_is_named_with_the_rule(two: str, tmp_path: Path) -> None:
    """A rank exec'd through numactl (or taskset) with CPU 1 only (what numactl leaves:
    torchrun --numa-binding, vllm --numa-bind) whose GPU is on node 0 (CPU 0): the
    keep/replace rule replaces the mask, the entry records it, and check says the mask
    and what the rule did."""
    assert WRAPPER is not None, "numactl or taskset (util-linux) is needed"
    pre = (WRAPPER, "--physcpubind=1") if WRAPPER.endswith("numactl") else (WRAPPER, "-c", "1")
    child, _ = _rank(two, tmp_path, 0, *pre)
    try:
        proc = _check(child.pid, two, tmp_path)
        assert proc["status"] == "bound" and proc["ok"], proc
        assert "numactl" in proc["binders"], proc["binders"]
        line = next(n for n in proc["notes"] if n.startswith("it started with CPU mask 1,"))
        assert "keep/replace rule replaced it with CPUs 0" in line, line
        assert "fix:" in line
    finally:
        _stop(child)


def test_the_table_is_the_one_vocabulary() -> None:
    """Each row says how it is detected, what it does, the fix and a source; the knob's
    values come from the table's home; every variable row is on the docs page."""
    docs = (ROOT / "docs" / "runtime.rst").read_text()
    for b in _binders.BINDER_TABLE:
        assert b.detect in ("env", "thread", "sysfs", "mask"), b
        assert b.does and b.fix and b.source and b.label, b
        if b.detect == "env":
            assert f"``{b.key}" in docs, b.key
            assert b.values, b
    knob = next(k for k in KNOBS if k.name == "NUMABIND_BINDERS")
    assert knob.values == _binders.BINDERS_MODES
    keeps = {b.key: b.keep for b in _binders.BINDER_TABLE if b.keep}
    assert keeps == {"AMD_CPU_AFFINITY": "0", "TLLM_NUMA_AWARE_WORKER_AFFINITY": "0"}
    assert all(k in knob.help for k in keeps)


def test_thread_rows_tell_rccl_from_nccl() -> None:
    """NCCL's thread names in a rank of an AMD GPU are RCCL's (it keeps the GPU-local
    mask on purpose); elsewhere NCCL's."""
    assert _binders.binder_of("NCCL Service  0", "amd") == "RCCL"
    assert _binders.binder_of("NCCL Service  0", "nvidia") == "NCCL"
    assert _binders.binder_of("uccl_proxy") == "UCCL"
    assert _binders.binder_of("python3") is None


def test_doctor_names_the_switches_and_the_scheduler(two: str, tmp_path: Path) -> None:
    """``doctor`` says which binders its environment and machine show, with the fix."""
    root = _with_sched_ext(two, tmp_path, "enabled", "scx_cosmos")
    e = clean_env(NUMABIND_SYSROOT=root, TLLM_NUMA_AWARE_WORKER_AFFINITY="1", AMD_CPU_AFFINITY="1")
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "doctor", "--json"],
        capture_output=True,
        text=True,
        env=e,
        timeout=120,
    )
    found = [f["detail"] for f in json.loads(p.stdout)["findings"] if f["check"] == "binders"]
    assert len(found) == 3, found
    assert found[0].startswith("AMD_CPU_AFFINITY=1 (HIP (ROCm))")
    assert found[1].startswith("TLLM_NUMA_AWARE_WORKER_AFFINITY=1 (TensorRT-LLM)")
    assert "fix: TLLM_NUMA_AWARE_WORKER_AFFINITY=0" in found[1]
    assert found[2].startswith("sched_ext scheduler scx_cosmos active")
