"""A process that drives several GPUs: the union for the process (``apply(devices=...)``,
NUMABIND_DEVICES), each device's share for a thread (``bind_thread``), what ``check`` says
of such a process, and ``apply()`` twice (with another binder in between).

Plans are checked on the generated DGX H100 (8 GPUs, 2 nodes); bindings on the real kernel
of this machine through the generated two-node machine (CPU 0 = node 0 with GPU 0, CPU 1 =
node 1 with GPU 1), with ``NUMABIND_MEMORY=none`` where the live kernel has one memory
node.  The multi-NUMA VM checks memory too (tests/test_vm.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import numabind
from numabind import _registry
from numabind._plan import PER_DEVICE
from support import clean_env, py, two_cpus


@pytest.fixture(scope="module")
def dgx() -> numabind.Machine:
    return numabind.Machine.from_example("dgx-h100")


MODES = ("node", "socket", "exclusive", "core-complex")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("roles", [(None, None), (1, None), (None, 1), ("1/rank", 1)])
def test_each_device_gets_what_its_own_rank_would_and_the_process_the_union(
    dgx: numabind.Machine, mode: str, roles: tuple[object, object]
) -> None:
    reserve, smt = roles
    devices = [0, 3, 5]
    p = numabind.plan_for(
        devices=devices, mode=mode, reserve=reserve, smt=smt, machine=dgx, environ={}
    )  # type: ignore[arg-type]
    assert p.bound and len(p.per_device) == 3
    for k, sub in zip(devices, p.per_device):
        alone = numabind.plan_for(
            k, local_world_size=8, mode=mode, reserve=reserve, smt=smt, machine=dgx, environ={}
        )  # type: ignore[arg-type]
        assert sub.rank_source == PER_DEVICE and sub.device_index == k
        assert (sub.cpus, sub.helpers, sub.memory_nodes) == (
            alone.cpus,
            alone.helpers,
            alone.memory_nodes,
        ), f"device {k}: its share is its rank's"
    assert p.cpus == frozenset().union(*(s.cpus for s in p.per_device))
    assert p.helpers == frozenset().union(*(s.helpers for s in p.per_device))
    assert p.memory_nodes == {0, 1} and p.memory_policy == "preferred-many"
    assert p.numa_node == p.per_device[0].numa_node, "memory prefers the first device's node"
    if mode == "exclusive":
        assert not (p.per_device[0].cpus & p.per_device[1].cpus), "disjoint shares"
    if smt == 1:
        assert all(dgx.siblings_of(c) & p.cpus == {c} for c in p.cpus), "one thread per core"
    assert "devices 0, 3, 5" in p.summary()
    assert [d["device_index"] for d in p.to_dict()["per_device"]] == devices


def test_bind_and_interleave_cover_the_union_and_none_sets_nothing(dgx: numabind.Machine) -> None:
    for memory in ("bind", "interleave"):
        p = numabind.plan_for(devices=[0, 7], memory=memory, machine=dgx, environ={})
        assert (p.memory_policy, p.memory_nodes) == (memory, {0, 1})
    p = numabind.plan_for(devices=[0, 7], memory="none", machine=dgx, environ={})
    assert (p.memory_policy, p.memory_nodes) == ("none", frozenset())


def test_devices_all_is_every_visible_device_and_a_bad_one_refuses_all(
    dgx: numabind.Machine,
) -> None:
    every = numabind.plan_for(devices="all", machine=dgx, environ={})
    assert [s.device_index for s in every.per_device] == list(range(8))
    seen = numabind.plan_for(devices="all", machine=dgx, environ={"CUDA_VISIBLE_DEVICES": "6,2"})
    assert [s.device.pci for s in seen.per_device] == [  # type: ignore[union-attr]
        d.pci for d in (dgx.accelerators[6], dgx.accelerators[2])
    ], "in the runtime's order"
    bad = numabind.plan_for(devices=[0, 12], machine=dgx, environ={})
    assert not bad.bound and "device '12'" in bad.reason and "not visible" in bad.reason
    by_env = numabind.plan_for(machine=dgx, environ={"NUMABIND_DEVICES": "0,5"})
    assert [s.device_index for s in by_env.per_device] == [0, 5]
    assert "NUMABIND_DEVICES" in by_env.summary()
    with pytest.raises(numabind.ConfigError, match="NUMABIND_DEVICES"):
        numabind.plan_for(machine=dgx, environ={"NUMABIND_DEVICES": "0,\x1b[2J"})
    with pytest.raises(TypeError, match="devices"):
        numabind.plan_for(devices="0,1", machine=dgx, environ={})
    with pytest.raises(numabind.ConfigError, match="1 to 64"):
        numabind.plan_for(devices=range(100), machine=dgx, environ={})


def test_a_one_node_machine_has_nothing_to_bind_for_several_devices_either() -> None:
    one = numabind.Machine.from_example("one-node")
    p = numabind.plan_for(devices="all", machine=one, environ={})
    assert not p.bound and p.skip == "one-node" and p.problem is None, p.summary()


# --- on the real kernel ----------------------------------------------------------------------


THREADS = """
import json, os, threading, numabind
out = {}
def worker(k):
    before = sorted(os.sched_getaffinity(0))
    with numabind.bind_thread(k) as tb:
        out[f"in{k}"] = sorted(os.sched_getaffinity(0))
        out[f"ok{k}"] = tb.ok
        seen = lambda: out.setdefault(f"child{k}", sorted(os.sched_getaffinity(0)))
        child = threading.Thread(target=seen)
        child.start(); child.join()
    out[f"after{k}"] = sorted(os.sched_getaffinity(0)) == before
ts = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
[t.start() for t in ts]; [t.join() for t in ts]
out["main"] = sorted(os.sched_getaffinity(0))
print(json.dumps(out))
"""


@two_cpus
def test_each_thread_lands_on_its_device_and_what_it_starts_inherits(two: str) -> None:
    r = py(THREADS, clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out = json.loads(r.stdout)
    assert out["in0"] == [0] and out["in1"] == [1]
    assert out["child0"] == [0] and out["child1"] == [1], "a thread started inside inherits"
    assert out["after0"] and out["after1"], "each thread back to what it had"
    assert out["main"] == [0, 1] and out["ok0"] and out["ok1"]


@two_cpus
def test_a_thread_of_a_multi_device_process_takes_that_devices_share(two: str) -> None:
    code = """
import json, os, numabind
b = numabind.apply(devices="all")
with numabind.bind_thread(1) as tb:
    inside = sorted(os.sched_getaffinity(0))
    shared = tb.plan is b.plan.for_device(tb.plan.device)
    from numabind._apply import bound_plan
    here = bound_plan().device_index
print(json.dumps({"process": sorted(b.plan.cpus), "inside": inside, "shared": shared,
                  "bound_plan": here, "after": sorted(os.sched_getaffinity(0))}))
"""
    r = py(code, clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out == {
        "process": [0, 1],
        "inside": [1],
        "shared": True,
        "bound_plan": 1,
        "after": [0, 1],
    }


# The worker thread's failure reaches the main thread, every wait has a limit, and the
# worker is released (and joined, with a limit) even when restore() raises: a failure
# anywhere ends the child at once with its traceback, where it used to leave the worker
# waiting forever and the test hanging until its timeout.  BREAK_RESTORE=1 makes
# restore() raise (the test below checks that this fails fast).
LATER_APPLY = """
import json, os, threading, traceback, numabind
WAIT = 20
inside, go, left, back = (threading.Event() for _ in range(4))
out, failed = {}, []
def worker():
    try:
        with numabind.bind_thread(1):
            inside.set()
            if not go.wait(WAIT):
                raise TimeoutError("never told to leave the block")
            out["during"] = sorted(os.sched_getaffinity(0))
        out["after"] = sorted(os.sched_getaffinity(0))
        left.set()
        if not back.wait(WAIT):
            raise TimeoutError("the binding was never restored")
        out["restored"] = sorted(os.sched_getaffinity(0))
    except BaseException:
        failed.append(traceback.format_exc())
    finally:
        inside.set(); left.set()
def worker_ok():
    if failed:
        raise SystemExit("the worker thread failed: " + failed[0])
def wait(event, what):
    if not event.wait(WAIT):
        raise SystemExit("timed out waiting for " + what)
    worker_ok()
t = threading.Thread(target=worker, daemon=True); t.start()
wait(inside, "the worker's block")
b = numabind.apply(device=0, local_rank=0)
out["main"] = sorted(os.sched_getaffinity(0))
out["changes"] = b.changes()
go.set()
wait(left, "the worker to leave its block")
out["changes_after"] = b.changes()
out["same"] = numabind.apply(device=0, local_rank=0) is b
if os.environ.get("BREAK_RESTORE") == "1":
    def broken():
        raise numabind.BindingError("restore() broken on purpose")
    b.restore = broken
try:
    b.restore()
finally:
    back.set()
    t.join(WAIT)
worker_ok()
if t.is_alive():
    raise SystemExit("the worker thread did not end")
print(json.dumps(out))
"""


@two_cpus
def test_a_later_apply_leaves_a_bind_thread_block_where_it_is(two: str) -> None:
    """A process binding applied while another thread is inside a bind_thread block
    (a framework calling apply() after its per-GPU driver threads started) rebinds every
    other thread, not that one; when the block ends the thread joins the new binding (no
    other binder moved it: the same apply() is still a no-op), and that binding's restore()
    puts it back where the block would have."""
    r = py(LATER_APPLY, clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none"))
    assert r.returncode == 0 and r.stderr == "", r.stderr
    out = json.loads(r.stdout)
    assert out == {
        "main": [0],
        "changes": None,
        "during": [1],
        "after": [0],
        "changes_after": None,
        "same": True,
        "restored": [0, 1],
    }, out


@two_cpus
def test_the_later_apply_test_fails_fast_when_restore_raises(two: str) -> None:
    """restore() raising ends the child at once with the error (the worker is released
    and joined), where the test above used to wait for its 120 s timeout."""
    import time

    began = time.monotonic()
    r = py(LATER_APPLY, clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none", BREAK_RESTORE="1"))
    took = time.monotonic() - began
    assert r.returncode != 0 and "restore() broken on purpose" in r.stderr, r.stderr
    assert took < 15, f"{took:.1f} s"


@two_cpus
def test_blocks_nest_and_restore_in_order(two: str) -> None:
    code = """
import os, numabind
outer = numabind.bind_thread(0)
inner = numabind.bind_thread(1)
assert sorted(os.sched_getaffinity(0)) == [1]
try:
    outer.restore()
except numabind.BindingError as err:
    print("refused:", "out of order" in str(err))
inner.restore(); assert sorted(os.sched_getaffinity(0)) == [0]
outer.restore(); print(sorted(os.sched_getaffinity(0)))
"""
    r = py(code, clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["refused: True", "[0, 1]"]


@two_cpus
@pytest.mark.parametrize(
    ("value", "cpus", "line"),
    [
        ("all", [0, 1], ""),
        ("1", [1], ""),
        ("0000:02:00.0", [1], ""),
        ("0,7", [0, 1], "NUMABIND_DEVICES: device '7': device index 7 is not visible"),
        ("GPU-nope", [0, 1], "NUMABIND_DEVICES: device 'GPU-nope'"),
    ],
)
def test_the_startup_hook_binds_a_process_that_asks_for_several_devices(
    two: str, value: str, cpus: list[int], line: str
) -> None:
    env = clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none", NUMABIND_DEVICES=value)
    r = py("import os; print(sorted(os.sched_getaffinity(0)))", env)
    assert r.returncode == 0 and json.loads(r.stdout) == cpus
    if line:
        assert line in r.stderr and len(r.stderr.splitlines()) == 1, r.stderr
    else:
        assert r.stderr == ""


@two_cpus
def test_a_garbled_devices_list_leaves_the_process_unbound_with_one_line(two: str) -> None:
    env = clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none", NUMABIND_DEVICES="0,,1")
    r = py("import os; print(sorted(os.sched_getaffinity(0)))", env)
    assert json.loads(r.stdout) == [0, 1] and len(r.stderr.splitlines()) == 1
    assert "NUMABIND_DEVICES='0,,1'" in r.stderr and "unbound" in r.stderr
    strict = py("print('user code')", {**env, "NUMABIND_STRICT": "1"})
    assert strict.returncode == 1 and "user code" not in strict.stdout


CHECKED = """
import ctypes, json, os, subprocess, sys, threading, numabind
numabind.apply(devices="all")
ready, done = threading.Barrier(3), threading.Event()
def worker(k, name, repin):
    ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME: the thread's own name
    with numabind.bind_thread(k):
        if repin:
            os.sched_setaffinity(0, {0, 1})  # a second binder undoing numabind's pin
        ready.wait(); done.wait()
ts = [threading.Thread(target=worker, args=(0, "loader0", False)),
      threading.Thread(target=worker, args=(1, sys.argv[1], sys.argv[2] == "repin"))]
[t.start() for t in ts]
ready.wait()
r = subprocess.run([sys.executable, "-m", "numabind", "check", "--pid", str(os.getpid()), "--json"],
                   capture_output=True, text=True)
done.set(); [t.join() for t in ts]
print(json.dumps({"exit": r.returncode, "report": json.loads(r.stdout)}))
"""


@two_cpus
@pytest.mark.parametrize("repin", [False, True])
def test_check_judges_each_thread_against_its_own_device(two: str, repin: bool, tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none", NUMABIND_REGISTRY=str(tmp_path))
    r = subprocess.run(
        [sys.executable, "-c", CHECKED, "uccl_proxy", "repin" if repin else "stay"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    proc = out["report"]["processes"][0]
    roles = {g["role"]: g for g in proc["roles"]}
    assert roles["device 0000:01:00.0"]["cpus"] == [0]
    if not repin:
        assert out["exit"] == 0 and proc["ok"], proc["problems"]
        assert roles["device 0000:02:00.0"]["cpus"] == [1]
        return
    assert out["exit"] == 1 and not proc["ok"]
    (problem,) = proc["problems"]
    assert "'uccl_proxy' on CPUs 0-1 OFF PLAN (its device 0000:02:00.0: CPUs 1)" in problem
    assert "re-pinned by UCCL?" in problem
    assert roles["device 0000:02:00.0"]["on_plan"] is False
    assert roles["device 0000:01:00.0"]["on_plan"] is True, "the other device's thread is fine"


@two_cpus
def test_apply_twice_is_a_no_op_and_after_a_second_binder_it_says_what_moved(two: str) -> None:
    """TensorRT-LLM#18848: a second binder put every pinned thread back on all CPUs; the
    next apply() names what moved (and who, where the thread's name tells) and binds
    again; with nothing moved it hands back the binding in place."""
    code = """
import ctypes, json, os, threading, numabind
first = numabind.apply(1)
again = numabind.apply(1)
ready, go = threading.Event(), threading.Event()
def trt():
    ctypes.CDLL(None).prctl(15, b"trtllm-affinity", 0, 0, 0)
    ready.set(); go.wait()
t = threading.Thread(target=trt); t.start(); ready.wait()
os.sched_setaffinity(t.native_id, {0, 1})  # TensorRT-LLM#18848: back on every CPU
third = numabind.apply(1)
after = sorted(os.sched_getaffinity(t.native_id))
go.set(); t.join()
print(json.dumps({"same": again is first, "third_is_new": third is not first, "after": after,
                  "line": str(third)}))
"""
    r = py(code, clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none"))
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["same"] and out["third_is_new"] and out["after"] == [1]
    assert "another binder moved thread" in out["line"] and "0-1 (TensorRT-LLM?)" in out["line"]
    assert r.stderr == "", "apply() says nothing itself: the binding it returns says it"


# --- the registry's fields -------------------------------------------------------------------


def test_the_entry_carries_device_plans_and_threads_and_refuses_hostile_ones() -> None:
    entry = _registry.Entry(
        pid=10,
        start="5",
        device_plans=(
            ("0000:01:00.0", frozenset({0, 1}), "preferred", frozenset({0})),
            ("0000:02:00.0", frozenset({2}), "bind", frozenset({1})),
        ),
        thread_devices=((11, 0), (12, 1)),
    )
    assert _registry.Entry.parse(entry.encode()) == entry
    base = entry.encode().decode()
    for bad in (
        "thread_devices=11:2",  # an index past the list
        "thread_devices=" + ",".join(f"{i}:0" for i in range(1, 70)),  # over the cap
        "device_plans=0000:01:00.0/0/preferred",  # a field short
        "device_plans=../../etc/0/bind/0",  # not a PCI address
        "device_plans=0000:01:00.0/0-99999999/bind/0",  # a CPU list past the ceiling
    ):
        key = bad.split("=")[0]
        lines = [ln for ln in base.splitlines() if not ln.startswith(key + "=")] + [bad]
        assert _registry.Entry.parse("\n".join(lines).encode()) is None, bad


@two_cpus
def test_bind_thread_to_a_device_not_there_says_one_line_and_strict_raises(two: str) -> None:
    code = """
import os, numabind
b = numabind.bind_thread(7)
print(b.ok, sorted(os.sched_getaffinity(0)))
try:
    numabind.bind_thread("GPU-nope", strict=True)
except numabind.BindingError as err:
    print("raised:", "GPU-nope" in str(err))
"""
    r = py(code, clean_env(NUMABIND_SYSROOT=two, NUMABIND_MEMORY="none"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["False [0, 1]", "raised: True"]
    (line,) = r.stderr.splitlines()
    assert "device 7: device index 7 is not visible (2 are)" in line, line
