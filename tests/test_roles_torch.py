"""Core roles with the real torch 2.13 (CPU build, its own libgomp): NUMABIND_OMP_PLACES keeps
the main thread, a thread started afterwards and a forked child on the rank's CPUs while
the OpenMP workers hold one place each; NUMABIND_WORKERS places real DataLoader workers
(fork and spawn) and the pin thread.

The machine is generated: node 0 is CPUs 0-1 (this host's two CPUs, two cores), node 1
CPUs 2-3; rank 0's GPU is on node 0, so its plan is CPUs 0-1, bound for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from support import rank0_env, two_core_nodes, two_cpus

pytestmark = [two_cpus, pytest.mark.torch]


def _machine(tmp_path: Path) -> str:
    return two_core_nodes(str(tmp_path / "m"))


def _run(code: str, root: str, **env: str) -> dict[str, object]:
    pytest.importorskip("torch")
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=rank0_env(root, **env),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


OMP = r"""
import json, os, threading
import torch
main = sorted(os.sched_getaffinity(0))
torch.set_num_threads(2)
x = torch.ones(4_000_000)
for _ in range(20):
    (x * 2).sum()
after = sorted(os.sched_getaffinity(0))
seen = {}
t = threading.Thread(target=lambda: seen.update(thread=sorted(os.sched_getaffinity(0))))
t.start(); t.join()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, json.dumps(sorted(os.sched_getaffinity(0))).encode()); os._exit(0)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 100))
others = [sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")
          if int(t) != os.getpid()]
print(json.dumps(dict(main=main, after=after, thread=seen["thread"], child=child,
                      others=others, places=os.environ.get("OMP_PLACES"),
                      bind=os.environ.get("OMP_PROC_BIND"))))
"""


def test_omp_places_keep_the_main_thread_and_what_it_starts(tmp_path: Path) -> None:
    root = _machine(tmp_path)
    got = _run(OMP, root, NUMABIND_OMP_PLACES="cores")
    assert got["places"] == "cores" and got["bind"] == "close"
    # libgomp pinned the importing thread to CPU 0; numabind put it back
    assert got["main"] == got["after"] == got["thread"] == got["child"] == [0, 1], got
    # the OpenMP workers kept a place each
    assert [1] in got["others"], got  # type: ignore[operator]


def test_without_numabind_the_main_thread_is_left_on_one_core(tmp_path: Path) -> None:
    """The oracle of the test above: the same program with the variables set by hand and
    no NUMABIND_OMP_PLACES shows what libgomp does on its own."""
    root = _machine(tmp_path)
    got = _run(OMP, root, OMP_PLACES="cores", OMP_PROC_BIND="close")
    assert got["main"] == got["thread"] == got["child"] == [0], got


def test_a_users_omp_places_is_kept(tmp_path: Path) -> None:
    root = _machine(tmp_path)
    got = _run(OMP, root, NUMABIND_OMP_PLACES="cores", OMP_PLACES="threads")
    assert got["places"] == "threads" and got["bind"] is None


LOADER = r"""
import json, os, sys
import torch
from torch.utils.data import DataLoader, Dataset

class Where(Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        return torch.tensor([info.id, *sorted(os.sched_getaffinity(0))])

if __name__ == "__main__":
    if len(sys.argv) > 2:
        os.sched_setaffinity(0, {1})  # as an OpenMP runtime would pin the starting thread
    loader = DataLoader(Where(), batch_size=None, num_workers=2,
                        multiprocessing_context=sys.argv[1])
    seen = {}
    for item in loader:
        wid, *cpus = item.tolist()
        seen[wid] = cpus
    print(json.dumps({"workers": {str(k): v for k, v in sorted(seen.items())}}))
"""


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize(
    ("placement", "want"),
    [("share", {"0": [0, 1], "1": [0, 1]}), ("spread", {"0": [0], "1": [1]})],
)
def test_dataloader_workers_are_placed(
    tmp_path: Path, context: str, placement: str, want: dict[str, list[int]]
) -> None:
    root = _machine(tmp_path)
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    r = subprocess.run(
        [sys.executable, str(script), context, "pinned"],
        env=rank0_env(
            root,
            NUMABIND_TORCH="1",
            NUMABIND_WORKERS=placement,
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    # the parent's starting thread was on CPU 1 only: the workers were placed regardless
    assert got["workers"] == want, (got, r.stderr)


def test_reserved_workers_run_on_the_reserved_core(tmp_path: Path) -> None:
    root = _machine(tmp_path)
    script = tmp_path / "loader.py"
    script.write_text(LOADER)
    r = subprocess.run(
        [sys.executable, str(script), "fork"],
        env=rank0_env(
            root,
            NUMABIND_TORCH="1",
            NUMABIND_RESERVE="1",
            NUMABIND_WORKERS="reserved",
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["workers"] == {"0": [1], "1": [1]}, got  # compute CPU 0, helper CPU 1


PIN = r"""
import json, os, threading
import torch
import torch.utils.data._utils.pin_memory as pm
import numabind.torch as nt
seen = {}
def spy(*a, **k):
    seen.update(cpus=sorted(os.sched_getaffinity(0)))
nt._installed["_pin_memory_loop"] = spy
def thread():
    os.sched_setaffinity(0, {1})  # started off the rank's CPUs
    pm._pin_memory_loop("in", "out", 0, "done")
t = threading.Thread(target=thread); t.start(); t.join()
print(json.dumps({"rank": sorted(os.sched_getaffinity(0)), "pin": seen["cpus"],
                  "wrapped": pm._pin_memory_loop is nt._pin_memory_loop}))
"""


def test_the_pin_thread_is_put_back_on_the_ranks_cpus(two: str) -> None:
    """The CPU build starts no pin thread (no accelerator): torch's loop is replaced by a
    spy behind numabind's wrapper, called from a thread that started on CPU 1."""
    got = _run(PIN, two, NUMABIND_TORCH="1")
    assert got == {"rank": [0], "pin": [0], "wrapped": True}, got
