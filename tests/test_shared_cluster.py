"""Safe on a shared machine, round three (issue 32): root never runs another user's code,
and a job report can be neither forged nor blown up.

Each attack that worked on 0.3.0 is played here for real, in the unit stage wherever the
real thing can be built in-process: an unprivileged uid made by the test (``setpriv``),
packages and ``json.py`` planted where the collector starts, a fake ``srun`` that runs it
from a directory the job's owner controls, a venv whose ``.pth`` writes a marker,
processes of another uid claiming a job, oversized, nested and lying records through a
fake store and a fake Ray dashboard, a rank listing 16 buffers over a 30 MiB numa_maps.
What each costs is measured in a child process (time and peak memory) and printed for
the record (``-s``); the assertions are on what is read and what runs, never on time.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import clean_env

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
ATTACKER = 43213
needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="plays another uid (root only)"
)


def measured(argv: list[str], **kw: object) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run ``argv`` and return it with its wall time and its peak resident memory (KiB,
    from the kernel's accounting of the child)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    began = time.monotonic()
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]
    took = time.monotonic() - began
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return p, took, peak if peak > before else -1


@pytest.fixture(scope="module")
def readable_src() -> Iterator[Path]:
    """numabind's sources copied where any uid can read them (the checkout may be in a
    folder others cannot enter)."""
    d = Path(tempfile.mkdtemp(prefix="numabind-src-", dir="/var/tmp"))
    d.chmod(0o755)
    shutil.copytree(SRC / "numabind", d / "numabind", ignore=shutil.ignore_patterns("__pycache__"))
    for path in d.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


# --- attack 9: listed host buffers multiplied the cost of checking one process -------------------

BUFFERS_RANK = r"""
import ctypes, os, sys
from numabind._kernel import start_time
from numabind._registry import Entry, register
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3 + [ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDONLY)
for i in range(int(sys.argv[2])):  # PROT_READ, MAP_PRIVATE: one mapping each
    addr = libc.mmap(None, 4096, 1, 2, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
big = bytearray(8 << 20)
big[::4096] = b"x" * len(big[::4096])
# 16 buffers, each listed over the whole address space: every line of numa_maps is theirs
spans = tuple((4096 * (i + 1), (1 << 47) - 4096 * (i + 1), (0,), "bind") for i in range(16))
entry = Entry(
    pid=os.getpid(), start=start_time(os.getpid()), local_rank=0, cpus=frozenset({0}),
    memory_policy="none", buffers=spans,
)
where, why = register(entry, {"NUMABIND_REGISTRY": sys.argv[3]})
assert where, why
print(os.getpid(), flush=True)
sys.stdin.read()
"""

COUNT_OPENS = r"""
import json, runpy, sys
pid = sys.argv[1]
opened = {}
def audit(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].startswith(f"/proc/{pid}/"):
        opened[args[0]] = opened.get(args[0], 0) + 1
sys.addaudithook(audit)
sys.argv = ["numabind", "check", "--pid", pid, "--json"]
try:
    runpy.run_module("numabind", run_name="__main__")
except SystemExit:
    pass
sys.stderr.write("OPENED " + json.dumps(opened) + "\n")
"""


@pytest.fixture(scope="module")
def buffers_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """A rank whose numa_maps is about 30 MiB (50,000 file mappings with long paths) and
    whose registry entry lists 16 host buffers, each over its whole address space."""
    d = tmp_path_factory.mktemp("maps")
    registry = d / "registry"
    registry.mkdir()
    deep = d
    while len(str(deep)) < 500:
        deep = deep / ("d" * 100)
    deep = deep / ("e" * (620 - len(str(deep))))  # each numa_maps line ~640 bytes
    deep.mkdir(parents=True)
    target = deep / "f"
    target.write_bytes(b"\0" * 4096)
    p = subprocess.Popen(
        [sys.executable, "-c", BUFFERS_RANK, str(target), "50000", str(registry)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    assert p.stdout is not None
    pid = int(p.stdout.readline())
    yield pid, str(registry)
    assert p.stdin is not None
    p.stdin.close()
    p.wait(timeout=60)


def test_sixteen_buffers_read_numa_maps_once(buffers_rank: tuple[int, str]) -> None:
    """0.3.0 rescanned maps and numa_maps for every listed buffer (16 buffers: 9-22x
    slower, 28-36 s).  Each /proc file of the process is now opened a fixed number of
    times, whatever its entry lists, and every buffer is still measured."""
    pid, registry = buffers_rank
    size = sum(len(line) for line in open(f"/proc/{pid}/numa_maps", "rb"))  # noqa: SIM115
    assert 29 << 20 < size < 32 << 20, f"numa_maps is {size >> 20} MiB"
    env = clean_env(NUMABIND_REGISTRY=registry)
    p, took, peak = measured([sys.executable, "-c", COUNT_OPENS, str(pid)], env=env)
    print(f"\ncheck --pid, 16 buffers over a {size >> 20} MiB numa_maps: {took:.1f} s, "
          f"peak {peak >> 10} MiB")  # fmt: skip
    opened = json.loads(p.stderr.rsplit("OPENED ", 1)[1])
    assert opened[f"/proc/{pid}/numa_maps"] == 1 and opened[f"/proc/{pid}/maps"] == 1, opened
    assert max(opened.values()) <= 4, opened  # status: the registry, the uid, the cpuset
    (proc,) = json.loads(p.stdout)["processes"]
    assert proc["plan_source"] == "registry" and len(proc["host_buffers"]) == 16
    assert all(b["pages"] for b in proc["host_buffers"]), "each buffer measured"


def test_checking_one_process_stops_at_the_deadline(buffers_rank: tuple[int, str]) -> None:
    """The deadline was checked only between processes: a process with a huge numa_maps
    held check --all past it.  Reading its memory now stops there too, and says so."""
    pid, registry = buffers_rank
    from numabind import _inspect

    view = _inspect.memory_view(pid, ((4096, 1 << 40),), time.monotonic() - 1)
    assert view.late and not view.regions
    code = (
        "import sys, time; from numabind import _inspect; from numabind._topology import "
        "Machine; m = Machine.from_root('/'); t = time.monotonic(); "
        "r = _inspect.check([int(sys.argv[1])], m, deadline=t + 0.05); "
        "print(time.monotonic() - t); print(r.processes[0].notes if r.processes else r.skipped)"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(pid)],
        capture_output=True,
        text=True,
        env=clean_env(NUMABIND_REGISTRY=registry),
        timeout=120,
    )
    took, notes = p.stdout.splitlines()[:2]
    print(f"\ncheck with a 0.05 s deadline: {float(took):.2f} s")
    assert "read only in part: the deadline passed" in notes, p.stdout + p.stderr
