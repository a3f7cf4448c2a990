"""The runtime around a binding, on this machine (real kernel, real interpreters; a generated
machine through NUMABIND_SYSROOT): thread pools sized to the binding, containers whose
seccomp filter refuses the memory-policy calls, automatic NUMA balancing, and the guard's
intended binding.  Memory locality of the same features is proven in the VM."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import synth
from numabind._threads import VARIABLES as THREAD_VARS
from support import clean_env, py, two_cpus

HERE = Path(__file__).resolve().parent
SECCOMP = [sys.executable, "-S", str(HERE / "seccomp_eperm.py")]
SHOW_THREADS = (
    "import os, json; print(json.dumps({k: os.environ.get(k) for k in " + repr(THREAD_VARS) + "}))"
)


def rank_env(root: str, **extra: str) -> dict[str, str]:
    """Rank 1 of 8 on the generated DGX: GPU 1, node 0 (CPUs 0-55,112-167, which this
    2-CPU host narrows to its own 0-1)."""
    return clean_env(
        LOCAL_RANK="1", LOCAL_WORLD_SIZE="8", NUMABIND_SYSROOT=root, NUMABIND="force", **extra
    )


# --- NUMABIND_THREADS ----------------------------------------------------------------------


def test_threads_auto_sets_the_budget_except_the_users(dgx_root: str) -> None:
    env = rank_env(dgx_root, NUMABIND_THREADS="auto", NUMABIND_MEMORY="none", MKL_NUM_THREADS="3")
    r = py(SHOW_THREADS, env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    # 56 cores of node 0 shared by the 4 ranks whose GPUs are there: 14 each
    assert got == {**dict.fromkeys(THREAD_VARS, "14"), "MKL_NUM_THREADS": "3"}
    assert r.stderr == "", "quiet unless asked"


def test_threads_verbose_says_what_and_why(dgx_root: str) -> None:
    env = rank_env(dgx_root, NUMABIND_THREADS="auto", NUMABIND_MEMORY="none", NUMABIND_VERBOSE="1")
    env["OPENBLAS_NUM_THREADS"] = "2"
    r = py("pass", env)
    (line,) = r.stderr.splitlines()
    assert "NUMABIND_THREADS: set OMP_NUM_THREADS=14" in line
    assert "left as the user set them: OPENBLAS_NUM_THREADS=2" in line


def test_threads_off_by_default_and_a_count(dgx_root: str) -> None:
    r = py(SHOW_THREADS, rank_env(dgx_root, NUMABIND_MEMORY="none"))
    assert set(json.loads(r.stdout).values()) == {None}
    r = py(SHOW_THREADS, rank_env(dgx_root, NUMABIND_MEMORY="none", NUMABIND_THREADS="4"))
    assert set(json.loads(r.stdout).values()) == {"4"}


def test_torchruns_own_value_is_replaced_a_users_kept(dgx_root: str) -> None:
    """torchrun writes OMP_NUM_THREADS=1 into its agent's environment when it is unset: the
    rank sees 1 while the agent's initial environment (/proc/PPID/environ) has none."""
    agent = (
        "import os, subprocess, sys\n"
        "os.environ['OMP_NUM_THREADS'] = '1'  # what torch/distributed/run.py does\n"
        "os.environ['TORCHELASTIC_RUN_ID'] = 'x'\n"
        f"subprocess.run([sys.executable, '-c', {SHOW_THREADS!r}], env={{**os.environ, "
        "'LOCAL_RANK': '1', 'LOCAL_WORLD_SIZE': '8'}, check=True)\n"
    )
    env = clean_env(NUMABIND_SYSROOT=dgx_root, NUMABIND="force", NUMABIND_THREADS="auto")
    env["NUMABIND_MEMORY"] = "none"
    r = py(agent, env)
    assert json.loads(r.stdout)["OMP_NUM_THREADS"] == "14", r.stderr
    env["OMP_NUM_THREADS"] = "1"  # the user's own 1: in the agent's initial environment too
    r = py(agent, env)
    assert json.loads(r.stdout)["OMP_NUM_THREADS"] == "1", r.stderr


def test_affinity_variables_outside_the_binding_are_said_once(dgx_root: str) -> None:
    env = rank_env(
        dgx_root, NUMABIND_THREADS="auto", NUMABIND_MEMORY="none", GOMP_CPU_AFFINITY="56-59"
    )
    r = py("pass", env)
    (line,) = r.stderr.splitlines()
    assert "GOMP_CPU_AFFINITY='56-59' would place threads on CPUs outside the binding" in line
    env["GOMP_CPU_AFFINITY"] = "0-3,112"  # inside node 0: nothing to say
    env.pop("KMP_AFFINITY", None)
    assert py("pass", env).stderr == ""
    env.pop("GOMP_CPU_AFFINITY")
    env["OMP_PLACES"] = "cores"  # abstract places follow the process's mask
    env["OMP_PROC_BIND"] = "close"
    assert py("pass", env).stderr == ""


def test_bad_threads_value_is_a_binding_knob(dgx_root: str) -> None:
    r = py("print('ran')", rank_env(dgx_root, NUMABIND_THREADS="lots", NUMABIND_MEMORY="none"))
    assert r.stdout == "ran\n" and r.stderr.count("\n") == 1
    assert "NUMABIND_THREADS='lots'" in r.stderr and "unbound" in r.stderr


@two_cpus
def test_late_binding_resizes_loaded_pools(two: str) -> None:
    pytest.importorskip("numpy")
    pytest.importorskip("threadpoolctl")
    code = (
        "import json, numpy, threadpoolctl, numabind\n"
        "before = [p['num_threads'] for p in threadpoolctl.threadpool_info()]\n"
        "b = numabind.apply(1, local_world_size=2)\n"
        "after = [p['num_threads'] for p in threadpoolctl.threadpool_info()]\n"
        "print(json.dumps({'before': before, 'after': after, 'threads': b.plan.threads}))\n"
    )
    env = clean_env(NUMABIND_SYSROOT=two, NUMABIND="force", NUMABIND_MEMORY="none")
    env["NUMABIND_THREADS"] = "auto"
    r = py(code, env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["threads"] == 1 and data["after"] and set(data["after"]) == {1}, data


@pytest.mark.torch
@two_cpus
def test_late_binding_sets_torch_threads(two: str) -> None:
    pytest.importorskip("torch")
    code = (
        "import json, torch, numabind\n"
        "before = torch.get_num_threads()\n"
        "numabind.apply(1, local_world_size=2)\n"
        "print(json.dumps([before, torch.get_num_threads()]))\n"
    )
    env = clean_env(NUMABIND_SYSROOT=two, NUMABIND="force", NUMABIND_MEMORY="none")
    env["NUMABIND_THREADS"] = "auto"
    r = py(code, env)
    assert r.returncode == 0, r.stderr
    before, after = json.loads(r.stdout)
    assert before == 2 and after == 1


# --- containers that refuse the memory-policy calls ------------------------------------------


@two_cpus
def test_seccomp_refusal_binds_cpus_and_says_once(two: str) -> None:
    env = clean_env(LOCAL_RANK="1", NUMABIND_SYSROOT=two, NUMABIND="force")
    r = py("import os; print('USER', sorted(os.sched_getaffinity(0)))", env, *SECCOMP)
    assert r.returncode == 0 and r.stdout == "USER [1]\n", r.stderr
    (line,) = r.stderr.splitlines()
    assert "refused (EPERM" in line and "--cap-add SYS_NICE" in line
    assert "move_pages/migrate_pages need a custom profile" in line
    assert "NUMABIND_MEMORY=none silences this" in line and "Traceback" not in line


@two_cpus
def test_seccomp_refusal_silenced_and_strict(two: str) -> None:
    env = clean_env(LOCAL_RANK="1", NUMABIND_SYSROOT=two, NUMABIND="force", NUMABIND_MEMORY="none")
    r = py("import os; print(sorted(os.sched_getaffinity(0)))", env, *SECCOMP)
    assert r.returncode == 0 and r.stdout == "[1]\n" and r.stderr == ""
    env["NUMABIND_MEMORY"] = "preferred"
    env["NUMABIND_STRICT"] = "1"
    r = py("print('USER CODE RAN')", env, *SECCOMP)
    assert r.returncode == 1 and "USER CODE RAN" not in r.stdout and "NUMABIND_STRICT" in r.stderr


@two_cpus
def test_check_copes_under_seccomp(two: str) -> None:
    env = clean_env(LOCAL_RANK="1", NUMABIND_SYSROOT=two, NUMABIND="force")
    code = (
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-m', 'numabind', 'check', '--json'], "
        "capture_output=True, text=True)\n"
        "print(r.returncode); print(r.stdout); print(r.stderr, file=sys.stderr)\n"
    )
    r = py(code, env, *SECCOMP)
    assert r.returncode == 0, r.stderr
    rc, _, out = r.stdout.partition("\n")
    data = json.loads(out)
    assert "Traceback" not in r.stderr
    (proc,) = data["processes"]
    assert proc["status"] == "bound" and proc["plan"]["cpus"] == [1]
    assert any("not permitted" in n for n in proc["notes"]), proc
    assert rc == "0", "a refused policy is not off plan"


# --- automatic NUMA balancing -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"), [(1, True), (3, True), (2, False), (0, False), (None, None)]
)
def test_show_reports_numa_balancing(
    tmp_path: Path, value: int | None, expected: bool | None
) -> None:
    spec = synth.two_nodes()
    spec.numa_balancing = value
    root = synth.write(spec, str(tmp_path / "m"))
    r = subprocess.run(
        [sys.executable, "-m", "numabind", "show", "--input", root, "--json"],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    assert json.loads(r.stdout)["numa_balancing"] is expected
    text = subprocess.run(
        [sys.executable, "-m", "numabind", "show", "--input", root, "--memory", "none"],
        capture_output=True,
        text=True,
        env=clean_env(),
    ).stdout
    assert ("automatic NUMA balancing is on" in text) is bool(expected)
    if expected:
        assert "are scanned" in text


def test_gather_records_numa_balancing(tmp_path: Path) -> None:
    import tarfile

    spec = synth.two_nodes()
    spec.numa_balancing = 1
    root = synth.write(spec, str(tmp_path / "m"))
    out = tmp_path / "cap.tar.gz"
    r = subprocess.run(
        [sys.executable, "-m", "numabind", "gather", str(out)],
        capture_output=True,
        text=True,
        env=clean_env(NUMABIND_SYSROOT=root),
    )
    assert r.returncode == 0, r.stderr
    with tarfile.open(out) as tar:
        assert "numabind-capture/proc/sys/kernel/numa_balancing" in tar.getnames()


# --- the guard reads the intended binding -----------------------------------------------------


@two_cpus
def test_guard_restores_the_latest_binding_not_the_first(tmp_path: Path, two: str) -> None:
    """The hook bound rank 0 (CPU 0); the program rebinds itself late to rank 1 (CPU 1);
    then an import pins the thread elsewhere: the guard restores CPU 1, the later binding."""
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "numpy.py").write_text("import os\nos.sched_setaffinity(0, {0})\n")
    env = clean_env(
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="2",
        NUMABIND_SYSROOT=two,
        NUMABIND_MEMORY="none",
        NUMABIND="force",
        PYTHONPATH=str(fake),
    )
    code = (
        "import os, numabind\n"
        "a = sorted(os.sched_getaffinity(0))\n"
        "numabind.apply(1)\n"
        "import numpy\n"
        "print(a, sorted(os.sched_getaffinity(0)))\n"
    )
    r = py(code, env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0] [1]"
    assert "put them back" in r.stderr


@pytest.mark.torch
@two_cpus
def test_init_process_group_guard_restores_the_calling_thread(tmp_path: Path, two: str) -> None:
    """A real init_process_group (gloo), through a registered backend that does what NCCL
    2.29.2-2.29.7 did: pin the calling thread to 'GPU-local' CPUs and leave it there."""
    pytest.importorskip("torch")
    code = f"""
import os, threading, json
import torch, torch.distributed as dist
from torch.distributed import Backend

def pinning_gloo(store, rank, size, timeout):
    os.sched_setaffinity(0, {{0}})  # the leak: the calling thread, on a CPU outside the plan
    return dist.ProcessGroupGloo(store, rank, size, timeout=timeout)

Backend.register_backend("leaky", pinning_gloo, devices=["cpu"])
other = threading.Thread(target=lambda: None)
dist.init_process_group("leaky", init_method="file://{tmp_path}/rdzv", rank=0, world_size=1)
after = sorted(os.sched_getaffinity(0))
t = torch.ones(1); dist.all_reduce(t); dist.destroy_process_group()
print(json.dumps(after))
"""
    env = clean_env(
        LOCAL_RANK="1",
        LOCAL_WORLD_SIZE="2",
        NUMABIND_SYSROOT=two,
        NUMABIND_MEMORY="none",
        NUMABIND="force",
    )
    r = py(code, env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [1], r.stderr
    assert "init_process_group moved the calling thread" in r.stderr
    env["NUMABIND_GUARD"] = "0"
    r = py(code, env)
    assert json.loads(r.stdout.strip().splitlines()[-1]) == [0], "the stand-in really pins"


def test_registry_thread_env_reads_back_what_was_written_and_nothing_else() -> None:
    from numabind._registry import Entry
    from numabind._threads import ThreadSettings
    from numabind.check._inspect import _thread_settings

    s = ThreadSettings(3)
    s.set = {"OMP_NUM_THREADS": ("1", "torchrun"), "MKL_NUM_THREADS": (None, "unset")}
    s.kept = {"OPENBLAS_NUM_THREADS": "7"}
    want = {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "7"}
    entry = Entry(pid=1, start="1", thread_env=s.registry_env())
    back = Entry.parse(entry.encode())
    assert back is not None and dict(back.thread_env) == want
    # check reads the entry, not the process's initial environment (pid 1 here)
    assert _thread_settings(back, {"OMP_NUM_THREADS": "99"}) == want
    # an entry is input: non-numbers and huge values refuse the whole entry; names it does
    # not know are kept out of what check reports
    base = b"pid=1\nstart=1\nthread_env="
    for hostile in (
        b"OMP_NUM_THREADS:-1",
        b"MKL_NUM_THREADS:9999999",
        b"BLIS_NUM_THREADS:\xc2\xb2",
    ):
        assert Entry.parse(base + hostile + b"\n") is None, hostile
    odd = Entry.parse(base + b"LD_PRELOAD:1,OMP_NUM_THREADS:2\n")
    assert odd is not None and _thread_settings(odd, {}) == {"OMP_NUM_THREADS": "2"}
    flood = Entry.parse(base + b"OMP_NUM_THREADS:2," * 100_000 + b"\n")
    assert flood is None, "more than an entry holds: not read"
