"""The one entry into binding: the keep/replace rule, strict mode, nesting, the lock, and
the memory-policy rule shared with child_binding, on the real kernel of this machine (a
generated two-node machine through NUMABIND_SYSROOT: CPU 0 = node 0, CPU 1 = node 1)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import synth
from support import clean_env, py, two_cpus

HERE = Path(__file__).resolve().parent
pytestmark = two_cpus


def test_concurrent_apply_and_restore_never_mix_plans(two: str) -> None:
    """Threads that bind and restore at once: without the lock, half the threads ended on
    one plan and half on the other.  With it every apply is whole, and restores nest."""
    code = """
import os, threading, json, numabind
from numabind._apply import LOCK
from numabind._errors import BindingError
errors, out = [], []
stop = threading.Event()
idle = [threading.Thread(target=stop.wait) for _ in range(6)]
[t.start() for t in idle]
def worker(rank):
    for _ in range(40):
        try:
            b = numabind.apply(rank, migrate=False)
            # read under numabind's own lock: an apply or restore holds it from its first
            # thread to its last, so whatever plan is in place here is whole (one mask),
            # and a half-done one (no lock in apply) shows as two
            with LOCK:
                masks = {
                    frozenset(os.sched_getaffinity(int(t))) for t in os.listdir('/proc/self/task')
                }
            out.append(len(masks))
            b.restore()
        except BindingError as err:
            errors.append('out of order' in str(err))
ts = [threading.Thread(target=worker, args=(r,)) for r in (0, 1)]
[t.start() for t in ts]; [t.join() for t in ts]
stop.set()
print(json.dumps({"masks": sorted(set(out)), "errors": errors}))
"""
    env = clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none", NUMABIND="force")
    r = py(code, env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["masks"] == [1], "every thread on one plan right after each apply"
    assert all(data["errors"]), "the only errors are out-of-order restores, said as such"


def test_a_thread_started_during_the_pass_is_bound_too(two: str) -> None:
    """A thread started by one not yet rebound, after apply listed the threads, inherits
    the old mask: apply lists them again until none is new.  The first listing is made to
    miss a real, running thread (the second one), as one its starter made mid-pass is
    missed; a process whose only thread is the caller is listed once."""
    code = """
import json, os, sys, threading, numabind
from numabind import _kernel
real, calls = _kernel.thread_ids, []
def listing(*a):
    if sys._getframe(1).f_code.co_name != "_apply_cpus":
        return real(*a)
    calls.append(1)
    return [x for x in real(*a) if len(calls) > 1 or x not in tids[1:]]
_kernel.thread_ids = listing
tids = []
alone = numabind.apply(1, migrate=False); alone.restore()
once = len(calls)
stop = threading.Event()
def idle():
    tids.append(threading.get_native_id()); stop.wait()
ts = [threading.Thread(target=idle) for _ in range(2)]
for t in ts:
    t.start()
while len(tids) < 2: pass
del calls[:]
b = numabind.apply(1, migrate=False)
late = sorted(os.sched_getaffinity(tids[1]))
# threads that never stop appearing: bounded, and said
n = iter(range(1 << 22, (1 << 22) + 100))  # above any pid_max: never a process
_kernel.thread_ids = lambda *a: [*real(*a), next(n)]
c = numabind.apply(0, migrate=False)
stop.set(); [t.join() for t in ts]
print(json.dumps({"once": once, "late": late, "passes": len(calls), "notes": c.notes}))
"""
    r = py(code, clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none", NUMABIND="force"))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["once"] == 1, "the caller alone: one listing (a rank's start pays no more)"
    assert data["late"] == [1], "the thread the first listing missed is on the plan's CPU"
    assert data["passes"] == 3, "listed until a listing held nothing new, then no more"
    assert any("threads kept starting while the CPUs were set (8 passes)" in n
               for n in data["notes"]), data["notes"]  # fmt: skip


def test_restore_out_of_order_raises_and_in_order_restores(two: str) -> None:
    code = """
import os, json, numabind
start = sorted(os.sched_getaffinity(0))
a = numabind.apply(0, migrate=False)
b = numabind.apply(1, migrate=False)
try:
    a.restore()
    raised = False
except numabind.BindingError as err:
    raised = "out of order" in str(err)
b.restore(); mid = sorted(os.sched_getaffinity(0))
a.restore(); end = sorted(os.sched_getaffinity(0))
print(json.dumps([raised, start, mid, end]))
"""
    r = py(code, clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none", NUMABIND="force"))
    raised, start, mid, end = json.loads(r.stdout)
    assert raised and mid == [0] and end == start


def test_force_applies_the_plan_over_a_narrower_mask_inside_it(tmp_path: Path) -> None:
    # node 0 = CPUs 0-1 (this host's), node 1 = CPUs 2-3 (absent here, never used)
    spec = synth.Spec(
        nodes=[[0, 1], [2, 3]], package_of_node=[0, 1], gpus=[synth.Gpu("0000:01:00.0", 0)]
    )
    root = synth.write(spec, str(tmp_path / "m"))
    env = clean_env(NUMABIND_SYSROOT=root, NUMABIND_MEMORY="none", LOCAL_RANK="0")
    code = "import os; print(sorted(os.sched_getaffinity(0)))"
    env["NUMABIND"] = "force"
    r = py(code, env, "taskset", "-c", "1")
    assert r.stdout.strip() == "[0, 1]", "force: the plan (node 0's CPUs), not the kept pin"
    env["NUMABIND"] = "respect"
    r = py(code, env, "taskset", "-c", "1")
    assert r.stdout.strip() == "[1]"


def test_child_binding_falls_back_where_preferred_many_is_refused(two: str) -> None:
    """A kernel before 5.15 refuses MPOL_PREFERRED_MANY with EINVAL (here: a seccomp filter
    answering exactly that).  child_binding shares apply's rule and prefers the GPU's node;
    the copy it used to carry would have failed."""
    code = """
import json, subprocess, sys
from numabind import child_binding
from numabind._plan import Plan
plan = Plan(local_rank=0, numa_node=0, cpus=frozenset({0}), memory_nodes=frozenset({0}),
            memory_policy="preferred-many", status="bound", reason="test")
with child_binding(0, plan=plan):
    out = subprocess.run([sys.executable, "-c",
        "import json; from numabind import _kernel; p = _kernel.get_mempolicy(); "
        "print(json.dumps([p[0], sorted(p[1])]))"], capture_output=True, text=True).stdout
print(out.strip())
"""
    seccomp = [sys.executable, "-S", str(HERE / "seccomp_eperm.py"), "--old-kernel", "--"]
    r = py(code, clean_env(NUMABIND_SYSROOT=two), *seccomp)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == ["preferred", [0]]


def test_apply_falls_back_where_preferred_many_is_refused(tmp_path: Path) -> None:
    code = """
import json, numabind
from numabind._apply import apply_plan
from numabind._plan import Plan
plan = Plan(local_rank=0, numa_node=0, cpus=frozenset({0, 1}), memory_nodes=frozenset({0}),
            memory_policy="preferred-many", status="bound", reason="test")
b = apply_plan(plan, migrate=False)
print(json.dumps([b.policy_applied, sorted(b.policy_nodes), b.notes]))
"""
    seccomp = [sys.executable, "-S", str(HERE / "seccomp_eperm.py"), "--old-kernel", "--"]
    r = py(code, clean_env(), *seccomp)
    policy, nodes, notes = json.loads(r.stdout)
    assert policy == "preferred" and nodes == [0] and "MPOL_PREFERRED_MANY" in notes[0]


def test_the_policy_table_s_codes_are_the_kernel_s() -> None:
    """The MPOL codes in numabind's one table, checked against the kernel itself: set each
    with the raw system call, then read back how /proc/self/numa_maps spells what the
    kernel holds (an oracle numabind does not write)."""
    code = """
import json, os
from numabind import _kernel
from numabind._model import MEMORY_POLICY_TABLE
out = {}
for p in MEMORY_POLICY_TABLE:
    if p.code is None:
        continue
    nodes = () if p.name in ("default", "local") else (0,)
    try:
        _kernel.set_mempolicy(p.name, nodes)
    except OSError as err:
        out[p.name] = ["refused", err.errno, p.min_kernel]
        continue
    seen = _kernel.task_policy("self")
    out[p.name] = [seen[0] if seen else None, sorted(seen[1]) if seen else None]
print(json.dumps(out))
"""
    r = py(code, clean_env())
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    release = tuple(int(x) for x in os.uname().release.split(".")[:2])
    from numabind._model import MEMORY_POLICY_TABLE

    for p in MEMORY_POLICY_TABLE:
        if p.code is None:
            continue
        seen = got[p.name]
        if seen[0] == "refused":
            assert p.min_kernel is not None and release < tuple(p.min_kernel), (p.name, seen)
            continue
        assert seen[0] == p.name, f"{p.name} (MPOL {p.code}): the kernel holds {seen[0]}"
        if p.name not in ("default", "local"):
            assert seen[1] == [0], (p.name, seen)
