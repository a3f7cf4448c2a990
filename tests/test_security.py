"""numabind tried as an attacker would on a shared machine (the threat model is in
docs/security.rst).  Three fronts:

* the registry, against an unprivileged uid (``setpriv --reuid``) that plants links,
  FIFOs, forged and garbage entries, inside a private mount namespace with its own
  /dev/shm (``unshare -m``) or, where that is not permitted, a private base with mode 1777;
* captures someone sent you: tarballs whose links point outside, members written through
  links, decompression bombs, a recorded environment with absurd values, broken XML, run
  under this Python and under one without tarfile extraction filters where there is one;
* any environment: the startup hook in real interpreters always runs user code, says at
  most one line, in bounded time and memory, and never "startup hook failed" for a value
  the parsers reject by design.

Hangs are caught by subprocess timeouts (a hang fails the test; nothing is timed).
"""

from __future__ import annotations

import atexit
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import synth
from _numabind_base import MODULES
from numabind._topology import Machine
from support import check_status, clean_env

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
ATTACKER = 43210
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="plants files as another uid (root only)")


# --- the registry ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world_readable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of the source and a two-node machine that another uid can read, outside
    /dev/shm (the attack gets a private /dev/shm of its own)."""
    d = Path(tempfile.mkdtemp(prefix="numabind-attack-", dir="/var/tmp"))
    d.chmod(0o755)
    shutil.copytree(
        SRC / "numabind", d / "src" / "numabind", ignore=shutil.ignore_patterns("__pycache__")
    )
    for start in MODULES:  # the start modules it ships
        shutil.copy(SRC / f"{start}.py", d / "src")
    synth.write(synth.two_nodes(), str(d / "root"))
    for path in d.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _run_attack(world: Path, out: Path) -> dict[str, object]:
    script = HERE / "attack" / "registry_attack.py"
    args = [str(world / "src"), "BASE", str(world / "root"), str(out), str(ATTACKER)]
    inner = (
        "mount --make-rprivate / && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && "
        f"exec {sys.executable} {script} " + " ".join(args).replace("BASE", "/dev/shm")
    )
    p = subprocess.run(
        ["unshare", "-m", "sh", "-c", inner], capture_output=True, text=True, timeout=600
    )
    if p.returncode != 0 and not out.exists():
        # no private mount namespace here: a private base with /dev/shm's mode instead
        base = Path(tempfile.mkdtemp(prefix="numabind-base-", dir="/var/tmp"))
        base.chmod(0o1777)
        try:
            argv = [sys.executable, str(script), *[a.replace("BASE", str(base)) for a in args]]
            p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        finally:
            shutil.rmtree(base, ignore_errors=True)
    assert out.exists(), f"attack scenario failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    data: dict[str, object] = json.loads(out.read_text())
    data["namespace"] = p.args[0] == "unshare"
    return data


@needs_root
def test_the_attack_ran_in_a_private_namespace_where_permitted(attack: dict[str, object]) -> None:
    ok = subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0
    assert attack["namespace"] == ok, "with unshare permitted, /dev/shm itself is attacked"


@pytest.fixture(scope="module")
def attack(world_readable: Path) -> dict[str, object]:
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("the registry attack needs root and setpriv")
    # the results file lives outside /dev/shm too: the namespace gets a /dev/shm of its own
    return _run_attack(world_readable, world_readable / "out.json")


@needs_root
@pytest.mark.parametrize("squat", ["symlink", "fifo", "own_dir"])
def test_a_squatted_registry_is_never_written_and_never_hangs(
    attack: dict[str, object], squat: str
) -> None:
    r = attack[f"squat_{squat}"]
    assert isinstance(r, dict)
    assert r["plant_rc"] == 0, r["plant_err"]
    assert r["rc"] == 0, r
    assert "USER CODE RAN None [1]" in str(r["stdout"]), "bound, not registered, user code ran"
    assert r["stderr"] == "", "quiet at default verbosity"
    assert r["victim"] == "precious\n" and r["victim_dir"] == []
    if squat == "own_dir":
        planted = {str(p) for p in range(1, 400)} | {".tmp"}
        assert set(r["squat_entries"] or ()) == planted, "nothing of root's written there"


@needs_root
def test_check_all_trusts_no_forgery_and_survives_garbage(attack: dict[str, object]) -> None:
    r = attack["check_all"]
    assert isinstance(r, dict), r
    assert "Traceback" not in str(r["stderr"])
    data = r["json"]
    assert isinstance(data, dict)
    # every rank on the machine is judged (a shared host may have others'): the status
    # agrees with the records, and the attack's own root rank is on plan
    assert r["rc"] == check_status(data["processes"]), r
    procs = {p["pid"]: p for p in data["processes"]}
    line = str(attack["root_rank_line"])
    assert line.startswith("USER CODE RAN /"), line
    (root_pid,) = [
        int(p.rsplit("/", 1)[1]) for p in line.split() if p.startswith("/") and "numabind-0" in p
    ]
    assert procs[root_pid]["plan_source"] == "registry" and procs[root_pid]["ok"]
    assert procs[root_pid]["plan"]["cpus"] == [1], "its own entry, not the forged one"
    assert 1 not in procs, "an entry for init, written by another uid, is not a rank"
    ignored = data["registry_ignored"]
    assert ignored.get("foreign", 0) >= 1 and ignored.get("malformed", 0) >= 2
    assert ignored.get("special", 0) >= 5
    assert attack["root_entry"] == [str(root_pid)]
    assert attack["victim_end"] == "precious\n"


@needs_root
def test_a_user_rank_registers_after_root_ran(attack: dict[str, object]) -> None:
    r = attack["user_rank"]
    assert isinstance(r, dict) and r["rc"] == 0, r
    assert f"numabind-{ATTACKER}/" in str(r["stdout"]), r["stdout"]
    assert any(n.isdigit() and int(n) > 7 for n in attack["user_dir"]), attack["user_dir"]  # type: ignore[union-attr]


def test_registry_refuses_a_loose_base(tmp_path: Path) -> None:
    from numabind import _registry

    base = tmp_path / "base"
    base.mkdir()
    base.chmod(0o777)  # writable by all, no sticky bit: anyone could swap our directory
    path, why = _registry.register({"pid": str(os.getpid())}, {"NUMABIND_REGISTRY": str(base)})
    assert path is None and why and "sticky" in why
    assert list(base.iterdir()) == []


def test_registry_entry_bounds(tmp_path: Path) -> None:
    from numabind._registry import Entry

    parse_entry = Entry.parse
    assert parse_entry(b"pid=12\nstart=3\ncpus=0-3\nmemory_policy=bind\n") is not None
    assert parse_entry(b"pid=12\nstart=3\ncpus=0-99999999\n") is None
    assert parse_entry(b"pid=12\nstart=3\nlocal_rank=\xb2\n") is None
    assert parse_entry(b"pid=12\nstart=3\nmemory_policy=everything\n") is None
    assert parse_entry(b"pid=12\npid=13\nstart=3\n") is None, "a key given twice"
    assert parse_entry(b"\xff\xfe") is None
    assert parse_entry(b"pid=12\n") is None, "no start time: no identity"
    assert parse_entry(b"pid=12\nstart=3\nfuture_field=1\n") is not None, "newer fields"


# --- captures ----------------------------------------------------------------------------------


def _tar(path: Path, members: list[tuple[str, str, bytes | str]], mode: str = "w:gz") -> Path:
    """Write a tarball: (kind 'file'|'link'|'dir'|'hard', name, data or target)."""
    with tarfile.open(path, mode) as tar:
        for kind, name, payload in members:
            info = tarfile.TarInfo(name)
            if kind == "file":
                data = payload if isinstance(payload, bytes) else payload.encode()
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            if kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, str(payload)
            elif kind == "hard":
                info.type, info.linkname = tarfile.LNKTYPE, str(payload)
            else:
                info.type = tarfile.DIRTYPE
            tar.addfile(info)
    return path


def _base_members() -> list[tuple[str, str, bytes | str]]:
    root = "cap"
    return [
        ("file", f"{root}/sys/devices/system/cpu/online", "0-1\n"),
        ("file", f"{root}/sys/devices/system/node/node0/cpulist", "0\n"),
        ("file", f"{root}/sys/devices/system/node/node1/cpulist", "1\n"),
    ]


@pytest.fixture(scope="module")
def secret() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="numabind-secret-", dir="/var/tmp"))
    s = d / "secret"
    s.write_text("TOPSECRET-0123\n")
    s.chmod(0o600)
    yield s
    shutil.rmtree(d, ignore_errors=True)


def _show(
    path: Path, python: str = sys.executable, *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            python,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]); from numabind.cli import main; "
            "sys.exit(main(sys.argv[2:]))",
            str(SRC),
            "show",
            "--input",
            str(path),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(),
    )


def _pythons() -> list[str]:
    """This Python, and one without tarfile extraction filters when the machine has one
    (Debian 12's system /usr/bin/python3.11 is 3.11.2); numabind must not depend on them."""
    out = [sys.executable]
    for p in ("/usr/bin/python3.11", "/usr/bin/python3"):
        if os.path.exists(p):
            probe = subprocess.run(
                [p, "-c", "import tarfile; print(hasattr(tarfile, 'data_filter'))"],
                capture_output=True,
                text=True,
            )
            if probe.stdout.strip() == "False":
                out.append(p)
                break
    return out


@pytest.mark.parametrize("python", _pythons())
def test_capture_links_stay_inside_and_nothing_is_written(
    tmp_path: Path, secret: Path, python: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    depth = "../" * 40
    members = [
        *_base_members(),
        # absolute and relative links to a root-only file, and to /dev/zero
        ("link", "cap/sys/devices/system/node/node0/meminfo", str(secret)),
        ("link", "cap/sys/devices/system/node/node1/meminfo", depth + str(secret).lstrip("/")),
        ("link", "cap/sys/devices/system/node/node0/distance", "/dev/zero"),
        ("link", "cap/proc/self/mounts", depth + "proc/self/mounts"),
        # a link to a directory outside, then a member "written through" it
        ("link", "cap/sys/escape", depth + str(outside).lstrip("/")),
        ("file", "cap/sys/escape/pwned", "written through a link\n"),
        ("file", "../../../../tmp/numabind-dotdot-pwned", "x"),
        ("file", "/tmp/numabind-abs-pwned", "x"),
        ("hard", "cap/sys/devices/system/cpu/present", str(secret)),
    ]
    cap = _tar(tmp_path / "evil.tar.gz", members)
    p = _show(cap, python)
    assert p.returncode == 0, p.stderr
    assert "TOPSECRET" not in p.stdout + p.stderr, "a host file's lines must not leak"
    assert list(outside.iterdir()) == [], "nothing is ever extracted"
    assert not Path("/tmp/numabind-dotdot-pwned").exists()
    assert not Path("/tmp/numabind-abs-pwned").exists()
    assert "Traceback" not in p.stderr


def test_capture_directory_links_stay_inside(tmp_path: Path, secret: Path) -> None:
    root = tmp_path / "dir"
    synth.write(synth.two_nodes(), str(root))
    meminfo = root / "sys/devices/system/node/node0/meminfo"
    meminfo.unlink()
    meminfo.symlink_to(secret)
    (root / "sys/devices/system/node/node1/meminfo").unlink()
    (root / "sys/devices/system/node/node1/meminfo").symlink_to("/dev/zero")
    os.mkfifo(root / "sys/devices/system/node/node1/distance.tmp")
    (root / "sys/devices/system/node/node1/distance").unlink()
    (root / "sys/devices/system/node/node1/distance.tmp").rename(
        root / "sys/devices/system/node/node1/distance"
    )
    p = _show(root)
    assert p.returncode == 0, p.stderr
    assert "TOPSECRET" not in p.stdout, "a link to a host file is the capture's own (absent) file"


def test_a_remembered_directory_swapped_for_a_link_is_refused(tmp_path: Path, secret: Path) -> None:
    """DirRoot remembers each resolved directory; a directory replaced by a link to the
    host after that must not turn the next read into a read of the host's file."""
    from numabind._roots import DirRoot
    from numabind._sysfs import ReadError

    root = tmp_path / "cap"
    node = root / "sys/devices/system/node/node0"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("0-3\n")
    (node / "inside").symlink_to("cpulist")  # a link in the last component, inside
    (node / "escape").symlink_to(secret)  # ... and one to the host
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "cpulist").write_text(secret.read_text())
    r = DirRoot(str(root))
    assert r.read("/sys/devices/system/node/node0/cpulist") == "0-3"
    assert r.read("/sys/devices/system/node/node0/inside") == "0-3"
    assert r.opt("/sys/devices/system/node/node0/escape") is None
    with pytest.raises(FileNotFoundError, match="no such file"):
        r.read("/sys/devices/system/node/node0/absent")
    node.rename(tmp_path / "moved")
    node.symlink_to(outside)
    with pytest.raises(ReadError, match="resolves outside the capture"):
        r.read("/sys/devices/system/node/node0/cpulist")


@pytest.mark.parametrize(
    ("name", "make", "says"),
    [
        (
            "bomb.tar.gz",
            lambda: [("file", "cap/sys/zero", b"\0" * (80 << 20))],
            "decompresses to more than 64 MiB; not read",
        ),
        (
            "many.tar",
            lambda: [("dir", f"cap/d{i}", b"") for i in range(60_000)],
            "more than 50000 members; not read",
        ),
    ],
)
def test_capture_caps_size_and_members(tmp_path: Path, name: str, make, says: str) -> None:  # type: ignore[no-untyped-def]
    cap = _tar(tmp_path / name, make(), "w:gz" if name.endswith("gz") else "w")
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "import resource, sys; "
            "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "sys.path.insert(0, sys.argv[1]); from numabind.cli import main; "
            "sys.exit(main(sys.argv[2:]))",
            str(SRC),
            "show",
            "--input",
            str(cap),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert says in p.stderr, p.stderr


def test_recorded_environment_is_bounded(tmp_path: Path) -> None:
    env = {
        "environ": {
            "LOCAL_WORLD_SIZE": "100000000000",
            "LOCAL_RANK": "0",
            "SLURM_STEP_TASKS_PER_NODE": "1(x1000000000)",
            "CUDA_VISIBLE_DEVICES": ",".join(["0"] * 100000),
            "NOT_RECORDED": "x" * 100000,
            "NUMABIND_MODE": "exclusive",
        }
    }
    cap = _tar(
        tmp_path / "env.tar.gz",
        [*_base_members(), ("file", "cap/numabind-env.json", json.dumps(env))],
    )
    p = _show(cap, sys.executable, "--json")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert len(data["ranks"]) == 1, "an absurd size is treated as unknown, not planned"
    rank = data["ranks"][0]
    assert rank["size_source"] != "LOCAL_WORLD_SIZE", "the absurd size is not believed"
    assert any("LOCAL_WORLD_SIZE=" in n and "ceiling" in n for n in rank["notes"]), rank
    assert "4096 characters" in rank["reason"], "the long device list is cut, and said so"


def test_malformed_env_file_is_one_line(tmp_path: Path) -> None:
    for text in ("{", "[]", '{"environ": 3}', "\xff"):
        cap = _tar(
            tmp_path / "bad.tar.gz", [*_base_members(), ("file", "cap/numabind-env.json", text)]
        )
        p = _show(cap)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and "numabind-env.json" in p.stderr


# --- the environment ---------------------------------------------------------------------------

VALUES = st.one_of(
    st.sampled_from(
        [
            "0",
            "1",
            "7",
            "-1",
            "",
            " ",
            "²",
            "٣",
            "0x1",
            "1.5",
            "9" * 5000,
            "100000000000",
            "1\nnumabind: forged",
            "\x1b[31m0",
            "GPU-",
            "MIG-x",
            "0,0,0",
            "1(x1000000000)",
            "auto",
            "force",
            "respect",
            "off",
            "exclusive",
            "sideways",
            "true",
            "yes",
            "maybe",
        ]
    ),
    st.text(max_size=40),
)
VARIABLES = [
    "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "SLURM_LOCALID", "SLURM_STEP_ID",
    "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID", "SLURM_STEP_GPUS", "OMPI_COMM_WORLD_LOCAL_RANK",
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "ZE_AFFINITY_MASK",
    "NUMABIND", "NUMABIND_MODE", "NUMABIND_MEMORY", "NUMABIND_VERBOSE", "NUMABIND_GUARD",
    "NUMABIND_THREADS", "NUMABIND_STRICT", "OMP_NUM_THREADS", "NUMABIND_DEVICES",
]  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(env=st.dictionaries(st.sampled_from(VARIABLES), VALUES, max_size=8))
# "²" passes str.isdigit() but not int(): Slurm's gres indices used to end in a traceback
@example(env={"SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "²"})
@example(env={"SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "٣,²"})
def test_environment_parsers_never_raise(env: dict[str, str]) -> None:
    """In-process: detection, devices, config and the plan on a DGX for any environment."""
    from numabind._devices import resolve
    from numabind._environ import Config, detect
    from numabind._errors import ConfigError
    from numabind._plan import plan, request_for, with_devices

    env = {k: v.replace("\0", "") for k, v in env.items()}
    info = detect(env)
    try:
        cfg = Config.from_env(env)
    except ConfigError as err:
        assert "\n" not in str(err)
        return
    visible = resolve(DGX, env)
    request = request_for(info, visible, cfg.mode, cfg.memory)
    if cfg.devices:
        request = with_devices(request, DGX, cfg.devices, "NUMABIND_DEVICES")
    p = plan(DGX, request)
    for text in (p.reason, *p.notes, visible.source):
        assert "\n" not in text and len(text) < 5000


_TMP = tempfile.mkdtemp(
    prefix="numabind-security-", dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None
)
atexit.register(shutil.rmtree, _TMP, True)
DGX = Machine.from_root(synth.write(synth.dgx_h100(filler_pci=0), f"{_TMP}/dgx"))
TWO = synth.write(synth.two_nodes(gpus=2), f"{_TMP}/two")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(env=st.dictionaries(st.sampled_from(VARIABLES), VALUES, min_size=1, max_size=6))
def test_hook_always_runs_user_code_with_at_most_one_line(env: dict[str, str]) -> None:
    """Real interpreters with the installed hook, a memory limit and a timeout."""
    env = {k: v.replace("\0", "") for k, v in env.items()}
    env.setdefault("LOCAL_RANK", "0")
    full = clean_env(NUMABIND_SYSROOT=TWO, **env)
    full["NUMABIND_MEMORY"] = "none"  # this one-node host has no node 1 to put memory on
    full.pop("NUMABIND_STRICT", None)
    p = subprocess.run(
        [sys.executable, "-c", "print('USER CODE RAN')"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limit_memory,
    )
    assert p.returncode == 0 and p.stdout == "USER CODE RAN\n", (p.returncode, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) <= 1, p.stderr
    assert all(line.startswith("numabind: ") for line in lines), p.stderr
    assert "startup hook failed" not in p.stderr, p.stderr


def _limit_memory() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


@pytest.mark.parametrize(
    "flags",
    [
        ["-X", "warn_default_encoding", "-W", "error"],
        ["-W", "error::DeprecationWarning", "-W", "error::ResourceWarning"],
        ["-X", "dev"],
    ],
)
def test_warnings_as_errors_do_not_unbind(flags: list[str]) -> None:
    env = clean_env(LOCAL_RANK="1", NUMABIND_SYSROOT=TWO, NUMABIND_MEMORY="none", NUMABIND="force")
    env["PYTHONWARNDEFAULTENCODING"] = "1"
    p = subprocess.run(
        [sys.executable, *flags, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert p.stdout.strip() == "[1]", "bound, not 'runs unbound'"


def test_a_full_stderr_keeps_exit_status_zero() -> None:
    env = clean_env(LOCAL_RANK="zero", NUMABIND_SYSROOT=TWO)
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-c", "pass"], env=env, stderr=full, timeout=60)
    assert p.returncode == 0
