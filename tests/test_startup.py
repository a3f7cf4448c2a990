"""The startup hook in real interpreters: the .pth line, its cost, its manners."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import support
import synth
from support import COUNT_HOOK, as_live, two_cpus, venv_with_numabind

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
FORBIDDEN = {
    "dataclasses",
    "json",
    "typing",
    "re",
    "logging",
    "warnings",
    "inspect",
    "psutil",
    "pynvml",
    "torch",
}


def clean_env(**extra: str) -> dict[str, str]:
    # A generated machine (NUMABIND_SYSROOT) is bigger than this one, so this process's
    # real mask always looks narrower than its cgroup: force skips the keep/replace rule.
    return support.clean_env(**{"NUMABIND": "force", **extra})


def py(code: str, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def site_packages() -> Path:
    return Path(sysconfig.get_paths()["purelib"])


def test_pth_is_installed_and_sorts_right() -> None:
    names = sorted(p.name for p in site_packages().glob("*.pth"))
    assert "_numabind_hook.pth" in names, "pip install (-e) . installs the hook"
    mine = names.index("_numabind_hook.pth")
    for other in names:
        if other.startswith(("_editable_impl_", "_numabind.pth", "__editable__")):
            assert names.index(other) < mine, (
                f"{other} must come first: it puts numabind on sys.path"
            )
    lines = (site_packages() / "_numabind_hook.pth").read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("import os;")
    assert (site_packages() / "_numabind_hook.start").read_text().strip() == "_numabind_start:start"


def test_inactive_imports_nothing() -> None:
    r = py("import sys; print('numabind' in sys.modules)", clean_env())
    assert r.stdout.strip() == "False" and r.stderr == ""


SHOW_MODULES = "import sys; print(' '.join(sorted(sys.modules)))"


def test_active_hook_stays_off_heavy_modules(dgx_root: str) -> None:
    """Every path of a bound rank (the full path, NUMABIND_CACHE=0; the cold fast path
    that reads the machine for its node; the warm one) stays off the heavy modules."""
    base = set(py(SHOW_MODULES, clean_env()).stdout.split())
    env = clean_env(LOCAL_RANK="5", LOCAL_WORLD_SIZE="8", NUMABIND_SYSROOT=dgx_root)
    full = py(SHOW_MODULES, {**env, "NUMABIND_CACHE": "0"})
    assert full.returncode == 0, full.stderr
    added = set(full.stdout.split()) - base
    assert "numabind._startup" in added and "numabind._plan" in added
    assert not (added & FORBIDDEN), added & FORBIDDEN
    env["LOCAL_RANK"] = "1"  # on node 0, whose CPUs include this host's: its binding takes
    for _ in range(2):  # cold (or warm, where another test read this machine), then warm
        r = py(SHOW_MODULES, env)
        assert r.returncode == 0, r.stderr
        assert not ((set(r.stdout.split()) - base) & FORBIDDEN)
    warm = set(r.stdout.split()) - base
    assert not any(m.startswith("numabind") for m in warm), f"a warm rank imported {warm}"


def _counted(
    root: str, env: dict[str, str], tmp: Path | None = None, runs: int = 1
) -> tuple[dict[str, list[str]], bool]:
    """What the hook of a rank with ``env`` loads and opens on the machine ``root``: read
    as a rank reads it (mounted over /sys in a private mount namespace) where this test may
    do that, else through NUMABIND_SYSROOT (one more module: the capture reader).  With
    ``runs`` > 1 the rank starts that many times in the same namespace and the last is
    reported (the first reads the machine for the cache: the others find it warm)."""
    prefix, _why = as_live(root)
    if not prefix:
        env = {**env, "NUMABIND_SYSROOT": root}
    cmd = [sys.executable, "-S", "-c", COUNT_HOOK]
    if runs > 1:
        assert tmp is not None
        out = str(tmp / "counted.json")
        loop = f'for i in $(seq {runs}); do "$@" > {out} || exit 1; done; cat {out}'
        cmd = ["sh", "-c", loop, "sh", *cmd]
    r = subprocess.run(
        [*prefix, *cmd], capture_output=True, text=True, env=clean_env(**env), timeout=120
    )
    assert r.returncode == 0, r.stderr
    data: dict[str, list[str]] = json.loads(r.stdout)
    return data, bool(prefix)


HEAVY = {"numabind._kernel", "numabind._registry", "numabind._apply", "numabind._errors"}


def test_a_one_node_rank_loads_ten_modules_and_no_kernel_layer(tmp_path: Path) -> None:
    """On a one-node machine (a workstation, a one-GPU cloud VM) the hook only plans: the
    full path (NUMABIND_CACHE=0) at most 10 numabind modules, and none of the kernel,
    registry or device layers, ctypes or the error classes (each module costs the rank
    ~0.2 ms of interpreter start); the cold fast path only the machine reader and the
    cache and the answer it keeps; a warm rank none at all, and of the machine only the files
    its answer's witnesses name."""
    root = synth.write(synth.one_node(), str(tmp_path / "one"))
    data, live = _counted(root, {"LOCAL_RANK": "0", "NUMABIND_CACHE": "0"})
    mods = set(data["modules"])
    assert "numabind._plan" in mods and "numabind._apply" in mods
    assert len(mods) <= (10 if live else 11), sorted(mods)
    heavy = {"numabind._kernel", "numabind._registry", "numabind._devices", "numabind._errors"}
    assert not (mods & heavy), sorted(mods & heavy)
    # cold: the full path, and the cache and the answer it keeps for the next rank
    cold, _ = _counted(root, {"LOCAL_RANK": "0"})
    # _dra: a cached record; _facts and _text: what is kept, and how it is written
    keeping = {"numabind._cache", "numabind._facts", "numabind._text", "numabind._replay"}
    keeping.add("numabind._dra")
    assert set(cold["modules"]) <= mods | keeping and "numabind._replay" in cold["modules"], cold
    warm, _ = _counted(root, {"LOCAL_RANK": "0"}, tmp_path, runs=2)
    assert warm["modules"] == [], warm["modules"]
    # of the machine, only what the answer's witnesses name (its cpuset, CPUs and nodes)
    machine = [f for f in warm["files"] if f.startswith("/sys") or (not live and root in f)]
    assert set(machine) <= _witnessed(root, live), warm["files"]


def test_a_bound_dgx_rank_loads_15_modules_and_opens_30_files(
    dgx_root: str, tmp_path: Path
) -> None:
    """A bound rank of an 8-GPU DGX.  The full path (NUMABIND_CACHE=0): at most 15 numabind
    modules (0.2.0: 23) and 30 files and directories opened (0.2.0: 68; only its own GPU's
    driver files are read), no capture reader and no registry reader.  Warm: no numabind
    module, and of the machine only the files its key holds (its cgroup's cpuset)."""
    env = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}
    data, live = _counted(dgx_root, {**env, "NUMABIND_CACHE": "0"})
    mods = set(data["modules"])
    assert "numabind._apply" in mods and "numabind._registry" in mods, sorted(mods)
    assert len(mods) <= (15 if live else 16), sorted(mods)
    # the machine's files, apart from the binding's own (its parent's mask, its threads,
    # its numa_maps to migrate, its start time and registry entry)
    own = ("/proc/self/task", "/proc/self/numa_maps")
    files = [
        f
        for f in data["files"]
        if f.startswith(
            ("/sys", "/proc/driver", "/proc/self/mounts", "/proc/self/cgroup", "/proc/self/status")
        )
        or (not live and not f.startswith(("/proc", "numabind", ".")) and f not in own)
    ]
    assert len(files) <= 30, files
    assert len(data["files"]) - len(files) <= 7, data["files"]
    driver = [f for f in files if "driver/nvidia/gpus/0000:" in f]
    assert all("0000:5d:00.0" in f for f in driver), "GPU 3's driver files, no other GPU's"
    idle = {
        "numabind.capture._tarroot",
        "numabind.capture._hwloc",
        "numabind.capture._capture",
        "numabind._errors",
    }
    assert not (mods & idle), sorted(mods & idle)
    warm, _ = _counted(dgx_root, env, tmp_path, runs=2)
    assert warm["modules"] == [], warm["modules"]
    machine = [
        f
        for f in warm["files"]
        if f.startswith(("/sys", "/proc/driver"))
        or not f.startswith(("/", "numabind", ".", "machine-", "answers-"))
    ]
    # of the machine, a warm rank reads only what its answer's witnesses name
    assert machine and set(machine) <= _witnessed(dgx_root, live), machine


def _witnessed(root: str, live: bool) -> set[str]:
    """The paths the witnesses of this user's answers files name (as the rank opens them:
    under the sysroot, unless the machine is mounted over /sys)."""
    import _numabind_base as base

    fd, _, _ = base.open_cache_dir(os.environ, create=False)
    assert fd is not None
    out: set[str] = set()
    try:
        for name in os.listdir(fd):
            if name.startswith("answers-"):
                _bad, data, _ = base.read_private(fd, name, (os.geteuid(),), base.CACHE_CAP)
                for line in data.decode().split("\n"):
                    if line.startswith("w "):
                        path = base.unescape(line.split(" ")[2])
                        out.add(path if live else root.rstrip("/") + path)
    finally:
        os.close(fd)
    return out


def test_hook_is_quiet_on_success_and_verbose_on_request(dgx_root: str) -> None:
    quiet = py("pass", clean_env(LOCAL_RANK="0", NUMABIND_SYSROOT=dgx_root))
    assert quiet.returncode == 0 and quiet.stderr == ""
    loud = py(
        "pass",
        clean_env(
            LOCAL_RANK="6", LOCAL_WORLD_SIZE="8", NUMABIND_VERBOSE="1", NUMABIND_SYSROOT=dgx_root
        ),
    )
    lines = loud.stderr.strip().splitlines()
    assert len(lines) == 1, loud.stderr
    assert (
        lines[0].startswith(
            "numabind: local rank 6 (LOCAL_RANK; 8 local ranks from LOCAL_WORLD_SIZE)"
        )
        and "GPU 6 (0000:ba:00.0) is on node 1" in lines[0]
    )


def test_warnings_as_errors_do_not_break_it(dgx_root: str) -> None:
    r = py(
        "print('ran')", clean_env(LOCAL_RANK="x", PYTHONWARNINGS="error", NUMABIND_SYSROOT=dgx_root)
    )
    assert r.returncode == 0 and r.stdout == "ran\n"
    assert r.stderr.count("\n") == 1 and "LOCAL_RANK='x'" in r.stderr


def test_python_dash_S_skips_and_dash_I_runs(dgx_root: str) -> None:
    env = clean_env(LOCAL_RANK="0", NUMABIND_VERBOSE="1", NUMABIND_SYSROOT=dgx_root)
    assert py("pass", env, "-S").stderr == ""
    said = py("pass", env, "-I").stderr  # the sysroot set and not used leads the one line
    assert said.startswith("numabind: NUMABIND_SYSROOT ignored: python -I/-E ignores the "), said
    assert said.count("\n") == 1 and "; local rank 0 (LOCAL_RANK)" in said, said


def test_state_key_lets_children_inherit(dgx_root: str) -> None:
    env = clean_env(LOCAL_RANK="1", NUMABIND_VERBOSE="1", NUMABIND_SYSROOT=dgx_root)
    code = (
        "import os, subprocess, sys; print(os.environ['NUMABIND_STATE']);"
        "subprocess.run([sys.executable, '-c', 'pass'])"
    )
    r = py(code, env)
    assert r.returncode == 0
    assert r.stdout.startswith("LOCAL_RANK=1||node|preferred#bound")
    lines = r.stderr.strip().splitlines()
    assert "CPUs" in lines[0] and "inherited from the parent" in lines[1]
    # a child with another rank plans again
    code2 = (
        "import os, subprocess, sys;"
        "subprocess.run([sys.executable, '-c', 'pass'], env=dict(os.environ, LOCAL_RANK='5'))"
    )
    r2 = py(code2, env)
    assert "local rank 5" in r2.stderr.splitlines()[1]


def test_run_is_idempotent_in_process(dgx_root: str) -> None:
    """The .pth already ran the hook at startup (a venv runs each .pth twice): calling it
    again binds nothing, says nothing and keeps the first binding."""
    code = "import numabind._startup as s; first = s.last; s.run(); s.run(); print(s.last is first)"
    r = py(code, clean_env(LOCAL_RANK="0", NUMABIND_SYSROOT=dgx_root, NUMABIND_VERBOSE="1"))
    assert r.stdout.strip() == "True", r.stderr
    assert r.stderr.count("numabind: local rank 0") == 1, r.stderr


def test_launcher_is_not_bound(tmp_path: Path, dgx_root: str) -> None:
    script = tmp_path / "torchrun"
    script.write_text("print('agent')\n")
    env = clean_env(
        SLURM_LOCALID="0", SLURM_STEP_ID="0", NUMABIND_VERBOSE="1", NUMABIND_SYSROOT=dgx_root
    )
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env)
    assert r.stdout == "agent\n" and "torchrun is a launcher, not a rank" in r.stderr


def test_strict_mode_exits_before_user_code(dgx_root: str) -> None:
    r = py(
        "print('user')",
        clean_env(
            LOCAL_RANK="0",
            CUDA_VISIBLE_DEVICES="GPU-nope",
            NUMABIND_STRICT="1",
            NUMABIND_SYSROOT=dgx_root,
        ),
    )
    assert (
        r.returncode == 1 and r.stdout == "" and "no reachable GPU has UUID 'GPU-nope'" in r.stderr
    )


def test_sitecustomize_runs_hook_and_chains(tmp_path: Path, dgx_root: str) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import sys; sys.stderr.write('other sitecustomize\\n')\n"
    )
    from numabind._startup import sitecustomize_dir

    env = clean_env(
        LOCAL_RANK="0",
        NUMABIND_VERBOSE="1",
        NUMABIND_SYSROOT=dgx_root,
        PYTHONPATH=os.pathsep.join([sitecustomize_dir(), str(other)]),
    )
    # -S: no .pth processing and no site at all; run site explicitly to import sitecustomize
    r = py(
        "import site; site.main(); import sitecustomize, sys; print(sitecustomize.__file__)",
        env,
        "-S",
    )
    assert "other sitecustomize" in r.stderr and "numabind: local rank 0" in r.stderr
    assert r.stdout.strip() == str(other / "sitecustomize.py")
    p = subprocess.run(
        [sys.executable, "-m", "numabind", "sitecustomize-path"], capture_output=True, text=True
    )
    assert (
        p.stdout.strip() == sitecustomize_dir()
        and Path(p.stdout.strip(), "sitecustomize.py").exists()
    )


@pytest.mark.slow
def test_wheel_install_kind(tmp_path: Path, dgx_root: str) -> None:
    """A regular (non-editable) install from a built wheel carries the hook too."""
    wheel_dir = tmp_path / "wheel"
    b = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(ROOT)],
        capture_output=True,
        text=True,
    )
    assert b.returncode == 0, b.stderr[-2000:]
    (wheel,) = wheel_dir.glob("numabind-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "_numabind_hook.pth",
        "_numabind_hook.start",
        "_numabind_start.py",
        "_numabind_base.py",
        "numabind/_startup.py",
        "numabind/_site/sitecustomize.py",
        "numabind/py.typed",
    } <= names
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    target = next((venv / "lib").glob("python*/site-packages"))
    zipfile.ZipFile(wheel).extractall(target)
    r = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "pass"],
        capture_output=True,
        text=True,
        env=clean_env(LOCAL_RANK="3", NUMABIND_VERBOSE="1", NUMABIND_SYSROOT=dgx_root),
    )
    assert "numabind: local rank 3" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_every_hook_form_checks_the_same_variables() -> None:
    """The .pth line, the PEP 829 entry and numabind itself must agree on what makes a
    process worth looking at (the first two cannot import numabind to ask)."""
    import _numabind_base
    from numabind._environ import TRIGGER_VARIABLES

    assert TRIGGER_VARIABLES is _numabind_base.TRIGGERS  # one table, not two
    # the .pth line is that table rendered (it cannot import anything to ask)
    assert (ROOT / "src" / "_numabind_hook.pth").read_text() == _numabind_base.pth_line()


@pytest.fixture(scope="module")
def two_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    return synth.write(synth.two_nodes(), str(tmp_path_factory.mktemp("two")))


@two_cpus
@pytest.mark.parametrize("knob", ["NUMABIND_VERBOSE", "NUMABIND_GUARD"])
def test_a_typo_in_a_cosmetic_knob_warns_and_still_binds(two_root: str, knob: str) -> None:
    env = clean_env(LOCAL_RANK="1", NUMABIND_SYSROOT=two_root, NUMABIND_MEMORY="none")
    env[knob] = "yse"
    r = py("import os; print(sorted(os.sched_getaffinity(0)))", env)
    assert r.stdout.strip() == "[1]", "bound despite the typo"
    (line,) = r.stderr.splitlines()
    assert f"{knob}='yse' is not a boolean" in line


@pytest.mark.parametrize(
    ("knob", "value"), [("NUMABIND_MODE", "exclusiv"), ("NUMABIND_MEMORY", "prefered")]
)
def test_a_typo_in_a_binding_knob_leaves_the_process_unbound(
    two_root: str, knob: str, value: str
) -> None:
    env = clean_env(LOCAL_RANK="1", NUMABIND_SYSROOT=two_root)
    env[knob] = value
    r = py("import os; print(sorted(os.sched_getaffinity(0)))", env)
    assert r.stdout.strip() == str(sorted(os.sched_getaffinity(0)))
    (line,) = r.stderr.splitlines()
    assert f"{knob}='{value}'" in line and "unbound" in line


@two_cpus
def test_a_garbled_local_world_size_is_said_and_the_rank_binds(two_root: str) -> None:
    env = clean_env(
        LOCAL_RANK="1", LOCAL_WORLD_SIZE="two", NUMABIND_SYSROOT=two_root, NUMABIND_MEMORY="none"
    )
    env["NUMABIND_VERBOSE"] = "1"
    r = py("import os; print(sorted(os.sched_getaffinity(0)))", env)
    assert r.stdout.strip() == "[1]"
    (line,) = r.stderr.splitlines()
    assert "LOCAL_WORLD_SIZE='two' is not a non-negative integer: local world size unknown" in line


@pytest.mark.parametrize(
    ("call", "error"),
    [
        ("numabind.apply(0, mode='bogus')", "ConfigError"),
        ("numabind.apply('abc')", "TypeError"),
        ("numabind.apply(0.5)", "TypeError"),
        ("numabind.apply(-1)", "ConfigError"),
        ("numabind.apply(device=1.5)", "TypeError"),
        ("numabind.apply(0, memory='everywhere')", "ConfigError"),
        ("numabind.apply(0, migrate='yes')", "TypeError"),
        ("numabind.numa_bound(mode='x')", "ConfigError"),
        ("numabind.spawn(print, 0)", "ValueError"),
    ],
)
def test_the_api_rejects_bad_arguments_clearly(call: str, error: str) -> None:
    code = (
        "import numabind\n"
        f"try:\n    {call}\nexcept Exception as e:\n"
        "    print(type(e).__name__, isinstance(e, (ValueError, TypeError)), e)\n"
    )
    r = py(code, clean_env())
    name, is_std, message = r.stdout.strip().split(" ", 2)
    assert name == error and is_std == "True", r.stdout + r.stderr
    assert len(message) < 300


@pytest.mark.parametrize("switch", ["NUMABIND_TORCH", "NUMABIND_RAY", None])
def test_every_hook_form_reacts_to_the_framework_switches(
    tmp_path: Path, switch: str | None
) -> None:
    """The sitecustomize form and PEP 829's ``.start`` entry share the .pth's start path:
    a framework switch alone (no rank) loads numabind's hook; nothing loads it without a
    trigger.  (The venv has no ``.pth`` hook, so only the form under test can run it.)"""
    from numabind._startup import sitecustomize_dir

    python = venv_with_numabind(str(tmp_path / "v"), hook=False)
    extra = {switch: "1"} if switch else {}
    probe = "import sys; print('numabind._startup' in sys.modules)"
    site_form = subprocess.run(
        [python, "-c", probe],
        capture_output=True,
        text=True,
        env=support.clean_env(PYTHONPATH=sitecustomize_dir(), **extra),
    )
    entry = (SRC / "_numabind_hook.start").read_text().strip()
    module, _, function = entry.partition(":")
    start_form = subprocess.run(
        [python, "-c", f"import {module}; {module}.{function}(); {probe}"],
        capture_output=True,
        text=True,
        env=support.clean_env(**extra),
    )
    expected = "True" if switch else "False"
    assert site_form.stdout.strip() == expected, site_form.stderr
    assert start_form.stdout.strip() == expected, start_form.stderr


@pytest.mark.parametrize("value", ["0", "off", "OFF", " off "])
def test_numabind_off_disables_the_hook_before_any_import(dgx_root: str, value: str) -> None:
    """NUMABIND=0/off: a rank's hook returns before importing anything of numabind (and
    before its start module looks at anything)."""
    probe = (
        "import sys; s = sys.modules.get('_numabind_start');"
        "print(bool(s and s._done), sorted(m for m in sys.modules if m.startswith('numabind')))"
    )
    r = py(probe, clean_env(LOCAL_RANK="0", NUMABIND_SYSROOT=dgx_root, NUMABIND=value))
    assert r.returncode == 0 and r.stdout.strip() == "False []" and r.stderr == "", r
    on = py(probe, clean_env(LOCAL_RANK="0", NUMABIND_SYSROOT=dgx_root))
    assert on.stdout.startswith("True"), "the probe sees the hook when it runs"
