"""Helpers the tests and benchmarks share: one clean environment for child processes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

# Variables that would make a child a rank, point it at another machine or change what
# numabind does; a test sets the ones it wants on top of this.
_DROPPED = (
    "NUMABIND",
    "LOCAL_",
    "OMPI_",
    "MPI_",
    "MV2_",
    "PALS_",
    "SLURM_",
    "PMI",
    "CUDA_",
    "ROCR_",
    "HIP_",
    "ZE_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "TORCHELASTIC",
    "PYTHONWARN",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONDEVMODE",
    "UCX_",
    "NVSHMEM_",
    "NCCL_",
    "UCCL_",
    "MC_MS_",
)


# The one skip marker for tests that need two CPUs to tell one binding from another (under
# CI=true a skip is a failure: conftest.py).
two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")


BIN = os.path.dirname(sys.executable)  # where this interpreter's torchrun, ray, ... are


def need(tool: str) -> str:
    """The path of launcher ``tool`` (this venv's bin first); a skip where it is not
    installed, and a failure instead under NUMABIND_REQUIRE_LAUNCHERS=1 (CI's launcher
    stage, which installs every one)."""
    import shutil

    path = shutil.which(tool, path=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    if path is None:
        if os.environ.get("NUMABIND_REQUIRE_LAUNCHERS") == "1":
            pytest.fail(f"{tool} is required but not installed")
        pytest.skip(f"{tool} is not installed (scripts/test-launchers installs it)")
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """``os.environ`` without rank, device, thread and numabind variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    env.update(extra)
    return env


def _first_byte(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(1)


def started(argv: list[str], **popen: object) -> subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, **popen)``, returned once the child's exec has finished:
    Popen returns when the close-on-exec pipe closes, which the kernel does before it lays
    out the new program's arguments and environment, so for a moment /proc/PID/environ and
    cmdline read empty and a scan of the child would not see a rank (a CI failure on 3.12)."""
    import time

    child: subprocess.Popen[bytes] = subprocess.Popen(argv, **popen)  # type: ignore[call-overload]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and child.poll() is None:
        try:
            if all(_first_byte(f"/proc/{child.pid}/{name}") for name in ("environ", "cmdline")):
                return child
        except OSError:
            pass
        time.sleep(0.001)
    if child.poll() is not None:
        raise AssertionError(f"{argv[0]} exited ({child.returncode}) before it could be read")
    child.kill()
    child.wait()
    raise AssertionError(f"{argv[0]} did not finish its exec in 30 s (an empty environment?)")


def py(code: str, env: dict[str, str], *pre: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in ``env``, behind an optional wrapper (``setpriv ...``,
    ``unshare ...``, the seccomp launcher)."""
    return subprocess.run(
        [*pre, sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )


def as_live(root: str) -> tuple[list[str], str]:
    """The command prefix that runs a program with a generated machine mounted over /sys
    (and /proc/driver, where the tree has one) in a private mount namespace, so that the
    hook reads it through the live reader exactly as a rank on that machine would; or
    ([], why that is not possible here: it needs root, unshare(1) and mount(8))."""
    import shutil

    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("mount"):
        return [], "needs root, unshare(1) and mount(8)"
    driver = os.path.isdir(f"{root}/proc/driver") and os.path.isdir("/proc/driver")
    script = 'mount --bind "$0/sys" /sys && '
    if driver:
        script += 'mount --bind "$0/proc/driver" /proc/driver && '
    script += 'exec "$@"'
    prefix = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, root]
    probe = subprocess.run(
        [*prefix, "cat", "/sys/devices/system/cpu/online"], capture_output=True, text=True
    )
    with open(f"{root}/sys/devices/system/cpu/online") as f:
        expected = f.read()
    if probe.returncode != 0 or probe.stdout != expected:
        return [], f"a private mount namespace could not be set up ({probe.stderr.strip()!r})"
    return prefix, ""


# What a rank's hook loads and opens: the audit hook is installed before site.main()
# runs the .pth files (python -S, then site.main() by hand), so it sees the hook's opens
# and none of the interpreter's own start.
COUNT_HOOK = (
    "import json, sys; opened = []\n"
    "def machine(path):\n"
    "    return isinstance(path, str) and (\n"
    "        path.startswith(('/sys', '/proc')) or not path.startswith('/'))\n"
    "def audit(event, args):\n"
    "    if event in ('open', 'os.scandir', 'os.listdir') and machine(args[0]):\n"
    "        opened.append(args[0])\n"
    "sys.addaudithook(audit)\n"
    "import site; site.main()\n"
    "mods = sorted(m for m in sys.modules if m == 'numabind' or m.startswith('numabind.'))\n"
    "print(json.dumps({'modules': mods, 'files': opened}))\n"
)


def venv_with_numabind(where: str, hook: bool) -> str:
    """A fresh venv (no pip) where numabind is importable from the checkout, by a path
    ``.pth`` as an editable install makes it, with or without the startup hook's ``.pth``.
    Returns its python."""
    import venv
    from pathlib import Path

    src = Path(__file__).resolve().parent.parent / "src"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    python = str(Path(where) / "bin" / "python")
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "numabind-src.pth").write_text(f"{src}\n")
    if hook:
        Path(site, "_numabind_hook.pth").write_text((src / "_numabind_hook.pth").read_text())
    return python


_RUNNABLE: dict[int, str] = {}
_READABLE: list[str] = []


def readable_src() -> str:
    """A copy of numabind's sources that any user can read, for the tests that play
    another (unprivileged) user: the checkout itself may sit in a folder that user cannot
    enter (root's home, a 0750 home directory, ``mktemp -d``).  Made once per session
    under /var/tmp (not /dev/shm, which some attacks replace), removed at exit; returns the
    directory to put on that user's PYTHONPATH."""
    if not _READABLE:
        import atexit
        import shutil
        import tempfile
        from pathlib import Path

        src = Path(__file__).resolve().parent.parent / "src"
        top = Path(tempfile.mkdtemp(prefix="numabind-readable-", dir="/var/tmp"))
        atexit.register(shutil.rmtree, top, True)
        shutil.copytree(
            src / "numabind", top / "numabind", ignore=shutil.ignore_patterns("__pycache__")
        )
        from _numabind_base import MODULES  # numabind imports them

        for module in MODULES:
            shutil.copy(src / f"{module}.py", top / f"{module}.py")
        for path in (top, *top.rglob("*")):
            path.chmod(0o755 if path.is_dir() else 0o644)
        _READABLE.append(str(top))
    return _READABLE[0]


def python_for(uid: int) -> str:
    """An interpreter that ``uid`` can start (for an attacker played with setpriv): this
    one, unless it loads a libpython under a home the uid cannot enter (pyenv's under
    /root), else the system's ``python3``.  The attacker's code needs only numabind's
    sources on PYTHONPATH, which every supported Python reads."""
    if uid not in _RUNNABLE:
        drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        for candidate in (sys.executable, "/usr/bin/python3"):
            probe = [*drop, candidate, "-c", "import sys; assert sys.version_info >= (3, 10)"]
            ok = subprocess.run(probe, capture_output=True, cwd="/").returncode == 0
            if ok:
                _RUNNABLE[uid] = candidate
                break
        else:
            raise AssertionError(f"no Python that uid {uid} can run (tried {sys.executable})")
    return _RUNNABLE[uid]


def two_core_nodes(where: str) -> str:
    """Write a generated machine whose node 0 is CPUs 0-1 (this host's two CPUs, two cores)
    and node 1 CPUs 2-3, GPU 0 on node 0 and GPU 1 on node 1, into ``where``: rank 0's plan
    is then both real CPUs, which a reservation or a placement can split for real."""
    import synth

    spec = synth.Spec(
        nodes=[[0, 1], [2, 3]],
        package_of_node=[0, 1],
        gpus=[synth.Gpu("0000:01:00.0", 0), synth.Gpu("0000:02:00.0", 1)],
        memory_gib=1,
    )
    return synth.write(spec, where)


def rank0_env(root: str, **extra: str) -> dict[str, str]:
    """The clean environment of local rank 0 of 2 on the machine at ``root``, bound exactly
    as planned (``NUMABIND=force``) and with no memory policy, plus ``extra``."""
    return clean_env(
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="2",
        NUMABIND_SYSROOT=root,
        NUMABIND_MEMORY="none",
        NUMABIND="force",
        **extra,
    )


def check_status(records: list[dict[str, object]]) -> int:
    """The exit status ``numabind check --all`` gives for these process records (1: one
    is off plan, 3: one could not be checked, 0: all on plan), as cli._check.exit_status
    says.  ``check --all`` sees every rank on the machine, and a shared host (another test
    run, another user's job) has ranks of its own: a test asserts the real status agrees
    with every record printed, and judges its own processes by this."""
    if any(r["status"] != "unknown" and not r["ok"] for r in records):
        return 1
    return 3 if any(r["status"] == "unknown" for r in records) else 0


class StandInStore:
    """A c10d store server (the wire protocol of ``numabind.check._store``: VALIDATE,
    then GET and CHECK queries) on loopback, for the tests and benchmarks that read a job
    report from a store, and for the attacks on that reader (c10d has no authentication:
    anyone on the network may answer as the store).

    ``values``: what GET answers (None: every key is there and ``announce`` is the length
    claimed for each, of which at most 64 KiB is sent, as a hostile store would);
    ``silent``: accept and never answer; ``break_after``: after that many queries, one
    byte of nonsense and the connection closed.  Records every key asked for as it came
    on the wire (``keys``), the queries (``requests``) and the value bytes sent (``sent``).
    """

    def __init__(
        self,
        values: dict[str, bytes] | None = None,
        *,
        announce: int = 0,
        silent: bool = False,
        break_after: int | None = None,
    ) -> None:
        import socket
        import threading

        self.values, self.announce, self.silent = values, announce, silent
        self.break_after, self.requests, self.sent = break_after, 0, 0
        self.keys: list[bytes] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import threading

        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: object) -> None:
        import socket
        import struct
        import time

        assert isinstance(conn, socket.socket)

        def take(n: int) -> bytes:
            data = b""
            while len(data) < n:
                chunk = conn.recv(n - len(data))
                if not chunk:
                    raise OSError("closed")
                data += chunk
            return data

        def key() -> bytes:
            raw = take(struct.unpack("=Q", take(8))[0])
            self.keys.append(raw)
            return raw

        with conn:
            try:
                take(5)  # VALIDATE, magic
                if self.silent:
                    time.sleep(60)
                    return
                while True:
                    query = take(1)[0]
                    self.requests += 1
                    if self.break_after is not None and self.requests > self.break_after:
                        conn.sendall(b"\x07")
                        return
                    count = struct.unpack("=Q", take(8))[0] if query == 5 else 1
                    asked = [key().decode()[1:] for _ in range(count)]
                    if query == 5:  # CHECK: whether every key is there
                        there = self.values is None or all(k in self.values for k in asked)
                        conn.sendall(b"\x00" if there else b"\x01")
                    elif self.values is None:  # GET, hostile: the announced length
                        conn.sendall(struct.pack("=Q", self.announce))
                        body = b"x" * min(self.announce, 1 << 16)
                        conn.sendall(body)
                        self.sent += len(body)
                    else:  # GET
                        value = self.values[asked[0]]
                        conn.sendall(struct.pack("=Q", len(value)) + value)
            except (OSError, KeyError, UnicodeError):
                return

    def close(self) -> None:
        self.server.close()
