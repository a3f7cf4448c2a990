"""Safe on a shared machine, round two: what root sees, what root writes, which of its
environment an interpreter takes, and where numabind's lines go.

Each class of attack that worked on 0.2.0 is played here as an attacker would: an
unprivileged uid made by the test (``setpriv``), links and FIFOs planted where root writes,
control characters in every field another user controls; victims are checked unchanged and
terminal output byte by byte.  Hangs are caught by subprocess timeouts (nothing is timed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import synth
from support import clean_env, py, python_for, readable_src, started

ATTACKER = 43211
FORGED = "\x1b]0;pwned\x07\x1b[2J\x1b[H\x1b[32mOK       pid 1: all fine\x1b[0m\r\n\x9b2J\u202e"
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="plays another uid (root only)"
)


def numabind(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "numabind", *argv],
        capture_output=True,
        env=env or clean_env(),
        timeout=120,
    )


def control_bytes(data: bytes) -> list[int]:
    """Bytes a terminal acts on, other than the newlines numabind writes itself."""
    text = data.decode("utf-8", "replace")
    return [ord(c) for c in text if c != "\n" and not c.isprintable()]


# --- what root sees ----------------------------------------------------------------------------


@pytest.fixture
def shared_base() -> Iterator[Path]:
    """A registry base like /dev/shm (root's, mode 1777) that this test owns."""
    base = Path(tempfile.mkdtemp(prefix="numabind-base-", dir="/dev/shm"))
    base.chmod(0o1777)
    yield base
    shutil.rmtree(base, ignore_errors=True)


ATTACKER_CODE = r"""
import os, sys, time
base, forged = sys.argv[1], sys.argv[2]
pid = os.getpid()
start = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[19]
d = os.path.join(base, f"numabind-{os.geteuid()}")
os.mkdir(d, 0o700)
entry = (
    f"pid={pid}\nstart={start}\nlocal_rank=0\nrank_source=LOCAL_RANK\ndevice=0000:3b:00.0\n"
    f"numa_node=0\ncpus=0-1\nmemory_policy=none\nmemory_nodes=\nmode=node\n"
    f"reason={forged}\nthreads=1\n"
)
with open(os.path.join(d, str(pid)), "w") as f:
    f.write(entry)
print(pid, flush=True)
time.sleep(60)
"""


@needs_root
def test_root_check_all_prints_no_control_character_another_user_wrote(
    shared_base: Path,
) -> None:
    """An unprivileged rank plants escape sequences in its registry entry's text and in its
    thread variables; root's ``check --all`` shows them escaped, on one line each: no
    window title, no cleared screen, no green "OK" where its verdict was."""
    env = clean_env(
        LOCAL_RANK="0",
        OMP_NUM_THREADS=FORGED.replace("\x00", ""),
        MKL_NUM_THREADS="\x1b[31m3\nOK pid 1",
    )
    attacker = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={ATTACKER}",
            f"--regid={ATTACKER}",
            "--clear-groups",
            python_for(ATTACKER),
            "-I",
            "-S",
            "-c",
            ATTACKER_CODE,
            str(shared_base),
            FORGED.replace("\n", " ").replace("\r", " "),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert attacker.stdout is not None
        pid = int(attacker.stdout.readline())
        root_env = clean_env(NUMABIND_REGISTRY=str(shared_base))
        text = numabind("check", "--all", env=root_env)
        data = json.loads(numabind("check", "--all", "--json", env=root_env).stdout)
    finally:
        attacker.kill()
        attacker.wait()
    assert text.returncode in (0, 1), text.stderr
    assert control_bytes(text.stdout) == [], text.stdout
    assert control_bytes(text.stderr) == [], text.stderr
    out = text.stdout.decode()
    mine = [line for line in out.splitlines() if f"pid {pid} " in line]
    assert mine, out
    assert "\\x1b]0;pwned\\x07" in out, "what was there is shown, escaped"
    assert not any(line.startswith("OK       pid 1:") for line in out.splitlines())
    procs = {p["pid"]: p for p in data["processes"]}
    assert procs[pid]["plan_source"] == "registry"
    reason = procs[pid]["plan"]["reason"]
    assert "pwned" in reason and reason.isprintable(), "an entry's text is one clean line"


def test_every_text_line_goes_through_the_escaping_writer() -> None:
    """A structural guard: the CLI modules never print text but through write_lines (a new
    command or field cannot forget the escaping)."""
    cli = Path(__file__).resolve().parent.parent / "src" / "numabind" / "cli"
    for path in cli.glob("*.py"):
        source = path.read_text()
        for bad in ("sys.stdout.write(", "print(json", "json.dump(data, sys.stdout"):
            assert bad not in source, f"{path.name}: {bad}"


# --- what root writes --------------------------------------------------------------------------


def _svg(tmp_path: Path, target: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    return numabind("show", "--svg", str(target), *extra)


def test_show_svg_never_writes_through_a_planted_link(tmp_path: Path) -> None:
    victim = tmp_path / "important.conf"
    victim.write_text("precious\n")
    planted = tmp_path / "topology.svg"
    planted.symlink_to(victim)
    p = _svg(tmp_path, planted)
    assert p.returncode == 2 and b"exists; --force replaces it" in p.stderr, p.stderr
    assert p.stdout == b"", "refused before any work: nothing printed"
    assert victim.read_text() == "precious\n" and planted.is_symlink()
    p = _svg(tmp_path, planted, "--force")
    assert p.returncode == 0, p.stderr
    assert victim.read_text() == "precious\n", "the link is replaced, never followed"
    assert not planted.is_symlink() and planted.read_text().startswith("<svg")
    assert [f.name for f in tmp_path.iterdir() if f.name.endswith(".tmp")] == []


def test_a_fifo_at_the_output_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "topology.svg"
    os.mkfifo(fifo)
    p = _svg(tmp_path, fifo)
    assert p.returncode == 2 and b"exists" in p.stderr
    p = _svg(tmp_path, fifo, "--force")  # replaced by rename: the FIFO is never opened
    assert p.returncode == 0 and fifo.read_text().startswith("<svg")


def test_outputs_are_checked_before_any_work(tmp_path: Path) -> None:
    """``bench --svg DIR`` ran the whole benchmark, then a traceback (issue 19, defect 2):
    the output is refused first, even before the machine is read."""
    env = clean_env(NUMABIND_SYSROOT=str(tmp_path / "no-such-machine"))
    for argv in (["bench", "--svg", str(tmp_path)], ["show", "--svg", str(tmp_path)]):
        p = numabind(*argv, env=env)
        assert p.returncode == 2 and p.stderr.count(b"\n") == 1, p.stderr
        assert b"is a directory" in p.stderr and p.stdout == b"", p.stderr
    p = numabind("gather", str(tmp_path / "missing" / "x.tgz"), env=env)
    assert p.returncode == 2 and b"no such folder" in p.stderr


def test_dash_is_stdout_and_two_stdouts_are_a_usage_error() -> None:
    p = numabind("show", "--svg", "-")
    assert p.returncode == 0 and p.stdout.startswith(b"<svg"), p.stderr
    assert b"NUMA nodes" not in p.stdout, "the picture alone on stdout"
    p = numabind("show", "--svg", "-", "--json")
    assert p.returncode == 2 and b"both write to standard output" in p.stderr


# --- which redirections an interpreter takes ---------------------------------------------------


def test_python_dash_I_binds_but_ignores_sysroot(dgx_root: str) -> None:
    env = clean_env(LOCAL_RANK="5", NUMABIND_VERBOSE="1", NUMABIND_SYSROOT=dgx_root)
    plain = py("pass", env)
    assert "GPU 5" in plain.stderr, plain.stderr
    for flag in ("-I", "-E"):
        r = subprocess.run(
            [sys.executable, flag, "-c", "pass"], capture_output=True, text=True, env=env
        )
        assert r.returncode == 0
        assert "GPU 5" not in r.stderr, "the generated machine was not read"
        assert "NUMABIND_SYSROOT ignored: python -I/-E" in r.stderr, r.stderr


@needs_root
def test_root_ignores_a_sysroot_another_user_could_change(dgx_root: str, tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    shutil.copytree(dgx_root, theirs, symlinks=True)
    os.chown(theirs, ATTACKER, ATTACKER)
    env = clean_env(LOCAL_RANK="5", NUMABIND_VERBOSE="1", NUMABIND_SYSROOT=str(theirs))
    r = py("pass", env)
    assert "GPU 5" not in r.stderr and f"is owned by uid {ATTACKER}" in r.stderr, r.stderr
    os.chown(theirs, 0, 0)
    theirs.chmod(0o777)  # root's, but others may replace what is in it
    r = py("pass", env)
    assert "GPU 5" not in r.stderr and "writable by group or others" in r.stderr, r.stderr
    theirs.chmod(0o755)
    assert "GPU 5" in py("pass", env).stderr, "root's own tree is read"


@needs_root
@pytest.mark.parametrize("base", ["/proc", "/sys/fs/cgroup", "/sys/fs/cgroup/pids", "/dev"])
def test_root_never_creates_a_registry_in_a_kernel_file_system(base: str) -> None:
    root = synth.write(synth.two_nodes(), tempfile.mkdtemp(dir="/dev/shm"))
    try:
        env = clean_env(
            LOCAL_RANK="1",
            NUMABIND_VERBOSE="1",
            NUMABIND_MEMORY="none",
            NUMABIND_SYSROOT=root,
            NUMABIND_REGISTRY=base,
        )
        r = py("import numabind; b = numabind.apply(1); print(b.registered); print(b)", env)
        assert r.returncode == 0, r.stderr
        assert not os.path.exists(f"{base}/numabind-0"), "nothing created there"
        assert "NUMABIND_REGISTRY" in r.stdout and "ignored for root" in r.stdout, r.stdout
        assert r.stdout.startswith("/dev/shm/numabind-0/"), "the default base instead"
    finally:
        shutil.rmtree(root, ignore_errors=True)


# --- where numabind's lines go -----------------------------------------------------------------


def test_nothing_is_written_into_a_file_that_took_fd_2(tmp_path: Path) -> None:
    """Started with fd 2 closed (``2>&-``), a program's first open() gets fd 2; numabind's
    later lines must not land in that file (0.2.0 wrote into a user's CSV)."""
    csv = tmp_path / "data.csv"
    code = (
        f"f = open({str(csv)!r}, 'w'); import os; assert f.fileno() == 2, f.fileno();"
        "from numabind._output import say; say('a late line');"
        "f.write('a,b\\n'); f.close()"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=clean_env(LOCAL_RANK="x"),  # a garbled rank: the hook has a line to say too
        stdout=subprocess.PIPE,
        preexec_fn=lambda: os.close(2),  # the test needs fd 2 closed
        timeout=60,
    )
    assert r.returncode == 0
    assert csv.read_text() == "a,b\n"


def test_a_reopened_fd_2_is_not_written_to(tmp_path: Path) -> None:
    """stderr open at start, closed later and reused by a file: not the stderr meant."""
    log = tmp_path / "log"
    code = (
        "import os; from numabind import _output; os.close(2);"
        f"f = open({str(log)!r}, 'w'); assert f.fileno() == 2;"
        "_output.say('late'); f.write('mine\\n'); f.close()"
    )
    r = subprocess.run([sys.executable, "-c", code], env=clean_env(), timeout=60)
    assert r.returncode == 0 and log.read_text() == "mine\n"


# --- work bounded by the process, not by what it maps ------------------------------------------

MAPPER = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
for i in range(int(sys.argv[2])):  # PROT_READ, MAP_PRIVATE: one mapping each, not merged
    addr = libc.mmap(None, 4096, 1, 2, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
    if i % 64 == 0:
        ctypes.string_at(addr, 1)
print(os.getpid(), flush=True)
sys.stdin.read()
"""


def test_check_reads_a_huge_numa_maps_as_a_bounded_stream(tmp_path: Path) -> None:
    """60,000 mappings of a file whose path is ~4,000 characters: /proc/PID/numa_maps is
    ~250 MB (0.2.0: 24 s and 516 MiB per process).  Read as a stream under a cap, in 384 MiB
    of address space, and said to be partial."""
    d = tmp_path
    while len(str(d)) < 3800:
        d = d / ("d" * 200)
    d.mkdir(parents=True)
    target = d / "f"
    target.write_bytes(b"\0" * 4096)
    p = subprocess.Popen(
        [sys.executable, "-c", MAPPER, str(target), "60000"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(LOCAL_RANK="0"),
    )
    try:
        assert p.stdout is not None
        pid = int(p.stdout.readline())
        limit = 384 << 20
        code = (
            "import resource, runpy, sys; "
            f"resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit})); "
            "sys.argv = ['numabind', 'check', '--pid', sys.argv[1], '--json']; "
            "runpy.run_module('numabind', run_name='__main__')"
        )
        r = subprocess.run(
            [sys.executable, "-c", code, str(pid)],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=300,
        )
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait(timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]  # a one-node rank: its plan is a skip, on plan
    (proc,) = json.loads(r.stdout)["processes"]
    assert proc["maps_truncated"] is True and proc["status"] == "skipped"
    assert any("larger than numabind reads" in n for n in proc["notes"])


def test_check_all_stops_at_its_deadline_and_lists_what_it_skipped() -> None:
    sleepers = [
        started(
            [sys.executable, "-S", "-c", "import sys; sys.stdin.read()"],
            stdin=subprocess.PIPE,
            env=clean_env(LOCAL_RANK=str(i)),
        )
        for i in range(3)
    ]
    try:
        r = numabind("check", "--all", "--deadline", "0.000001", "--json")
        t = numabind("check", "--all", "--deadline", "0.000001")
    finally:
        for s in sleepers:
            assert s.stdin is not None
            s.stdin.close()
            s.wait()
    data = json.loads(r.stdout)
    assert {s.pid for s in sleepers} <= set(data["skipped"]), data["skipped"]
    assert r.returncode == 0, "the exit status comes from the processes checked"
    assert b"not reached before the deadline" in t.stdout


@needs_root
def test_check_of_a_process_another_user_owns_is_one_clear_verdict() -> None:
    """An ordinary user's ``check --pid`` of a root rank: its environ, numa_maps and maps
    are not theirs to read; the verdict says what could not be read, no traceback."""
    rank = started(["sleep", "60"], env=clean_env(LOCAL_RANK="0"))
    try:
        r = subprocess.run(
            [
                "setpriv",
                f"--reuid={ATTACKER}",
                f"--regid={ATTACKER}",
                "--clear-groups",
                python_for(ATTACKER),
                "-m",
                "numabind",
                "check",
                "--pid",
                str(rank.pid),
            ],
            capture_output=True,
            text=True,
            env=clean_env(PYTHONPATH=readable_src()),
            cwd="/",
            timeout=120,
        )
    finally:
        rank.kill()
        rank.wait()
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 3 and r.stdout.startswith("UNKNOWN"), r.stdout + r.stderr
    assert "not readable by this user" in r.stdout and "Permission denied" in r.stdout


@needs_root
def test_no_registry_inside_a_base_another_user_owns() -> None:
    """A sticky, world-writable base owned by another ordinary user (who could rename or
    replace what is made in it): a rank does not create its registry there."""
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="numabind-base-", dir="/dev/shm"))
    top.chmod(0o755)
    base = top / "base"
    base.mkdir()
    os.chown(base, ATTACKER + 1, ATTACKER + 1)
    base.chmod(0o1777)
    code = (
        "from numabind import _registry\n"
        "from numabind._registry import Entry\n"
        "import os\n"
        "from numabind._kernel import start_time\n"
        "e = Entry(pid=os.getpid(), start=start_time(os.getpid()))\n"
        "print(_registry.register(e, {'NUMABIND_REGISTRY': os.environ['BASE']}))\n"
    )
    r = subprocess.run(
        [
            "setpriv",
            f"--reuid={ATTACKER}",
            f"--regid={ATTACKER}",
            "--clear-groups",
            python_for(ATTACKER),
            "-c",
            code,
        ],
        capture_output=True,
        text=True,
        cwd="/",
        env=clean_env(BASE=str(base), PYTHONPATH=readable_src()),
        timeout=120,
    )
    try:
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("(None, ") and f"owned by uid {ATTACKER + 1}" in r.stdout
        assert list(base.iterdir()) == []
    finally:
        import shutil

        shutil.rmtree(top, ignore_errors=True)


@needs_root
def test_another_user_imports_numabind_from_a_copy_it_can_read() -> None:
    """Issue 37 #0: from a checkout in a folder other users cannot enter (root's home,
    ``mktemp -d``), the played user still finds numabind: a world-readable copy outside
    the checkout, every folder above it enterable."""
    where = Path(readable_src())
    checkout = Path(__file__).resolve().parent.parent
    assert checkout not in where.parents
    for folder in (where, *where.parents):
        assert folder.stat().st_mode & 0o005 == 0o005, folder
    r = subprocess.run(
        ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups",
         python_for(ATTACKER), "-S", "-c", "import numabind; print(numabind.__file__)"],
        capture_output=True, text=True, cwd="/", env=clean_env(PYTHONPATH=str(where)),
        timeout=120,
    )  # fmt: skip
    assert r.returncode == 0 and r.stdout.startswith(str(where)), r.stdout + r.stderr
