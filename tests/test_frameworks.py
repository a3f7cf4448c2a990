"""Processes without a rank variable, bound when they pick their GPU: real torch (device
selection) and real Ray (accelerator assignment), on this machine with a generated
two-node machine through NUMABIND_SYSROOT (CPU affinity is the real kernel's; memory
locality is proven in the VM)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import synth
from support import clean_env, two_cpus

pytestmark = two_cpus
HERE = Path(__file__).resolve().parent


def run(code: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout
    )


def torch_env(root: str, **extra: str) -> dict[str, str]:
    return clean_env(
        NUMABIND_TORCH="1", NUMABIND_SYSROOT=root, NUMABIND_MEMORY="none", NUMABIND="force", **extra
    )


SELECT = """
import json, os, torch
first = sorted(os.sched_getaffinity(0))
try:
    {call}
    ok = True
except Exception as err:  # the CPU build refuses the call itself: the binding came first
    ok = type(err).__name__
print(json.dumps({{"first": first, "after": sorted(os.sched_getaffinity(0)), "call": ok}}))
"""


@pytest.mark.torch
@pytest.mark.parametrize(
    "call",
    [
        "torch.cuda.set_device(1)",
        "torch.cuda.set_device('cuda:1')",
        "torch.cuda.set_device(torch.device('cuda', 1))",
        "torch.accelerator.set_device_index(1)",
        "torch.xpu.set_device(1)",
    ],
)
def test_device_selection_binds_a_process_without_rank(two: str, call: str) -> None:
    pytest.importorskip("torch")
    r = run(SELECT.format(call=call), torch_env(two))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["first"] == [0, 1] and data["after"] == [1], (data, r.stderr)


@pytest.mark.torch
def test_device_selection_opt_out_and_bound_processes(two: str) -> None:
    pytest.importorskip("torch")
    code = SELECT.format(call="torch.cuda.set_device(1)")
    r = run(code, torch_env(two, NUMABIND_TORCH_SET_DEVICE="0"))
    assert json.loads(r.stdout)["after"] == [0, 1], "opted out"
    # bound by the hook as rank 0 (node 0): set_device(1) is said, not chased
    r = run(code, torch_env(two, LOCAL_RANK="0"))
    assert json.loads(r.stdout)["after"] == [0]
    assert "selects a device on node 1, but this process was bound to node 0" in r.stderr
    # a second selection on another node: said once, not rebound
    two_calls = SELECT.format(
        call="torch.cuda.set_device(1)\n    torch.cuda.set_device(0)\n    torch.cuda.set_device(0)"
    )
    r = run(two_calls, torch_env(two))
    assert json.loads(r.stdout)["after"] == [1]


@pytest.mark.torch
def test_second_device_on_another_node_is_said_once(two: str) -> None:
    pytest.importorskip("torch")
    code = (
        "import os, torch\n"
        "for d in (1, 0, 0, 1, 0):\n"
        "    try:\n"
        "        torch.cuda.set_device(d)\n"
        "    except Exception:\n"
        "        pass\n"
        "print(sorted(os.sched_getaffinity(0)))\n"
    )
    r = run(code, torch_env(two))
    assert r.stdout.strip() == "[1]"
    assert r.stderr.count("selects a device on node 0") == 1, r.stderr


WORKER = """
import json, os, sys
import multiprocessing as mp

def worker(local_rank, out):
    import torch
    try:
        torch.cuda.set_device(local_rank)  # how vLLM/SGLang-style executors pick a GPU
    except Exception:
        pass
    with open(f"{out}/{local_rank}.json", "w") as f:
        json.dump(sorted(os.sched_getaffinity(0)), f)

if __name__ == "__main__":
    out = sys.argv[1]
    if sys.argv[2] == "torch":
        import torch.multiprocessing as tmp
        tmp.spawn(worker, args=(out,), nprocs=2)
    else:
        ctx = mp.get_context("spawn")
        ps = [ctx.Process(target=worker, args=(r, out)) for r in range(2)]
        [p.start() for p in ps]; [p.join() for p in ps]
"""


@pytest.mark.torch
@pytest.mark.parametrize("how", ["torch", "multiprocessing"])
def test_engine_style_workers_each_on_their_gpus_node(two: str, tmp_path: Path, how: str) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "engine.py"
    script.write_text(WORKER)
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path), how],
        capture_output=True,
        text=True,
        env=torch_env(two),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "0.json").read_text()) == [0]
    assert json.loads((tmp_path / "1.json").read_text()) == [1]


# --- Ray ----------------------------------------------------------------------------------------

RAY = """
import json, os, sys, ray
ray.init(num_gpus=int(sys.argv[2]), num_cpus=2, include_dashboard=False,
         _temp_dir=sys.argv[1], object_store_memory=78 * 1024 * 1024, log_to_driver=False,
         # the reuse case below needs its idle worker kept: no prestarted ones beside it,
         # and no killing of idle workers beyond num_cpus (the holders count) after 1 s
         _system_config={"prestart_worker_first_driver": False, "enable_worker_prestart": False,
                         "idle_worker_killing_time_threshold_ms": 600_000})

@ray.remote(num_gpus=1)
class Actor:
    def __init__(self):
        self.init = sorted(os.sched_getaffinity(0))  # already bound when __init__ runs
    def where(self):
        return {"init": self.init, "now": sorted(os.sched_getaffinity(0)),
                "ids": ray.get_runtime_context().get_accelerator_ids()["GPU"]}

@ray.remote(num_gpus=1)
def task():
    return {"pid": os.getpid(), "now": sorted(os.sched_getaffinity(0)),
            "ids": ray.get_runtime_context().get_accelerator_ids()["GPU"]}

@ray.remote(num_gpus=1, max_calls=0)
def reusable():
    return {"pid": os.getpid(), "now": sorted(os.sched_getaffinity(0)),
            "ids": ray.get_runtime_context().get_accelerator_ids()["GPU"]}

@ray.remote(num_gpus=1)
class Holder:
    def ready(self):
        return True

@ray.remote(num_gpus=2)
class Pair:
    def where(self):
        return {"now": sorted(os.sched_getaffinity(0)),
                "ids": ray.get_runtime_context().get_accelerator_ids()["GPU"]}

out = {}
if sys.argv[3] == "one":
    actors = [Actor.remote() for _ in range(2)]
    out["actors"] = ray.get([a.where.remote() for a in actors])
    for a in actors:
        ray.kill(a)
    # one at a time (Ray runs each GPU task in a fresh worker by default: max_calls=1)
    out["tasks"] = [ray.get(task.options(num_gpus=1).remote()) for _ in range(8)]
    # the same idle worker given the other GPU.  Ray ends a GPU task's worker after one
    # call unless max_calls says otherwise (0: reuse without limit); holders (their own
    # runtime_env, so never the pooled task worker) steer which GPU each task gets; with
    # ray.init's settings above the first task's worker is the only idle one, and stays
    hold_a = Holder.options(runtime_env={"env_vars": {"NB_HOLD": "a"}}).remote()
    ray.get(hold_a.ready.remote())
    first = ray.get(reusable.remote())
    hold_b = Holder.options(runtime_env={"env_vars": {"NB_HOLD": "b"}}).remote()
    ray.get(hold_b.ready.remote())  # takes the GPU the first task just gave back
    ray.kill(hold_a)
    out["reuse"] = [first, ray.get(reusable.remote())]
else:
    p = Pair.remote()
    out["pair"] = ray.get(p.where.remote())
print("RESULT " + json.dumps(out))
ray.shutdown()
"""


def _ray(root: str, tmp_path: Path, gpus: int, kind: str, **extra: str) -> dict[str, object]:
    pytest.importorskip("ray")
    env = clean_env(
        NUMABIND_RAY="1", NUMABIND_SYSROOT=root, NUMABIND_MEMORY="none", NUMABIND="force", **extra
    )
    env["RAY_AUTH_MODE"] = "disabled"  # Ray 2.60 writes a token into ~/.ray otherwise
    script = tmp_path / "ray_job.py"
    script.write_text(RAY)
    import shutil
    import tempfile

    short = tempfile.mkdtemp(prefix="nbray-")  # Ray's socket paths must stay under 107 bytes
    try:
        r = subprocess.run(
            [sys.executable, str(script), short, str(gpus), kind],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
    finally:
        shutil.rmtree(short, ignore_errors=True)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(lines[-1][7:])  # type: ignore[no-any-return]


@pytest.mark.ray
def test_ray_actors_and_reused_task_workers_follow_their_gpu(two: str, tmp_path: Path) -> None:
    data = _ray(two, tmp_path, 2, "one")
    for a in data["actors"]:  # type: ignore[union-attr]
        node = int(a["ids"][0])  # GPU i is on node i, whose CPU is i
        assert a["init"] == [node] and a["now"] == [node], a
    tasks = data["tasks"]
    assert all(t["now"] == [int(t["ids"][0])] for t in tasks), tasks  # type: ignore[index]
    first, second = data["reuse"]  # type: ignore[misc]
    assert first["pid"] == second["pid"], "Ray started a new worker: reuse not exercised"
    assert first["ids"] != second["ids"], data["reuse"]
    for t in (first, second):  # the reused worker rebound for its next GPU
        assert t["now"] == [int(t["ids"][0])], data["reuse"]


@pytest.mark.ray
def test_ray_nosetting_visible_devices_still_binds(two: str, tmp_path: Path) -> None:
    data = _ray(two, tmp_path, 2, "one", RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES="1")
    for a in data["actors"]:  # type: ignore[union-attr]
        assert a["init"] == [int(a["ids"][0])], a


@pytest.mark.ray
def test_ray_gpus_on_one_node_bind_there_spread_ones_do_not(tmp_path: Path) -> None:
    same = synth.two_nodes(gpus=2)
    for g in same.gpus:
        g.node = 1  # both GPUs on node 1
    root = synth.write(same, str(tmp_path / "same"))
    pair = _ray(root, tmp_path, 2, "pair")["pair"]
    assert pair["now"] == [1], pair  # type: ignore[index]
    spread = synth.write(synth.two_nodes(gpus=2), str(tmp_path / "spread"))
    pair = _ray(spread, tmp_path, 2, "pair")["pair"]
    assert pair["now"] == [0, 1], "GPUs on two nodes: said, not bound"  # type: ignore[index]


def test_ray_integration_fails_loudly_on_changed_internals(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    from numabind import ray as nray

    fake_ray = types.ModuleType("ray")
    fake_ray.__version__ = "9.0"  # type: ignore[attr-defined]
    fake_utils = types.ModuleType("ray._private.utils")
    fake_utils.set_visible_accelerator_ids = lambda: {}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.setitem(sys.modules, "ray._private", types.ModuleType("ray._private"))
    monkeypatch.setitem(sys.modules, "ray._private.utils", fake_utils)
    with pytest.raises(
        nray.RayIntegrationError, match="reset_visible_accelerator_env_vars is gone"
    ):
        nray.install()


# --- the integrations' own logic, against stand-in packages the tests build ---------------
# (numabind's hooks need neither torch nor Ray to be tested: a package with the same few
# functions, put first on the path, stands in; the real ones run in the torch/Ray stages)

STAND_INS = {
    "torch/__init__.py": (
        "__version__ = '2.13.0'\n"
        "class device:\n"
        "    def __init__(self, spec, index=None):\n"
        "        kind, _, num = str(spec).partition(':')\n"
        "        self.type, self.index = kind, int(num) if num else index\n"
    ),
    "torch/cuda/__init__.py": "selected = []\ndef set_device(d):\n    selected.append(d)\n",
    "torch/accelerator/__init__.py": "def set_device_index(d):\n    pass\n",
    "ray/__init__.py": (
        "__version__ = '2.60.0'\n"
        "ids = []\n"
        "class _Context:\n"
        "    def get_accelerator_ids(self):\n"
        "        return {'GPU': list(ids)}\n"
        "def get_runtime_context():\n"
        "    return _Context()\n"
    ),
    "ray/_private/__init__.py": "",
    "ray/_private/utils.py": (
        "import os\n"
        "def set_visible_accelerator_ids():\n"
        "    import ray\n"
        "    os.environ['CUDA_VISIBLE_DEVICES'] = ','.join(map(str, ray.ids))\n"
        "def reset_visible_accelerator_env_vars(original_visible_accelerator_env_vars):\n"
        "    os.environ.pop('CUDA_VISIBLE_DEVICES', None)\n"
    ),
}


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("stand-ins")
    for name, text in STAND_INS.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return str(root)


def test_torch_device_selection_logic(two: str, stand_ins: str) -> None:
    """NUMABIND_TORCH=1: the hook wraps the selectors when torch is imported; the first
    selection binds to that GPU's node, a later one on another node is said once and does
    not rebind, an already-seen device costs nothing, uninstall puts the originals back."""
    code = """
import json, os, torch, torch.cuda, numabind.torch as nt
aff = lambda: sorted(os.sched_getaffinity(0))
out = [aff()]
torch.cuda.set_device(1); out.append(aff())
torch.cuda.set_device("cuda:0"); torch.cuda.set_device(0); out.append(aff())
out.append(torch.cuda.selected)
nt.uninstall(); out.append(hasattr(torch.cuda.set_device, "_numabind_original"))
print(json.dumps(out))
"""
    env = torch_env(two, PYTHONPATH=stand_ins)
    r = run(code, env)
    assert r.returncode == 0, r.stderr
    first, after, later, selected, wrapped = json.loads(r.stdout)
    assert first == [0, 1] and after == [1] and later == [1]
    assert selected == [1, "cuda:0", 0], "the original is called every time, with its argument"
    assert not wrapped
    said = [x for x in r.stderr.splitlines() if "selects a device on node 0" in x]
    assert len(said) == 1 and "bound to node 1 when it selected device 1" in said[0], r.stderr


def test_set_device_binds_the_calling_thread_in_a_process_bound_to_several_devices(
    two: str, stand_ins: str
) -> None:
    """NUMABIND_DEVICES=all with numabind.torch: each thread's set_device(k) binds that
    thread to GPU k's share (and a later selection of another device moves it), while the
    process keeps the union; the original is still called every time."""
    code = """
import json, os, threading, torch, torch.cuda
aff = lambda: sorted(os.sched_getaffinity(0))
out = {"process": aff()}
def worker(k):
    torch.cuda.set_device(k); out[f"t{k}"] = aff()
    torch.cuda.set_device(1 - k); out[f"t{k}_moved"] = aff()
    torch.cuda.set_device(1 - k); out[f"t{k}_again"] = aff()
ts = [threading.Thread(target=worker, args=(k,)) for k in (0, 1)]
[t.start() for t in ts]; [t.join() for t in ts]
out["main"] = aff(); out["selected"] = sorted(map(str, torch.cuda.selected))
print(json.dumps(out))
"""
    r = run(code, torch_env(two, PYTHONPATH=stand_ins, NUMABIND_DEVICES="all"))
    assert r.returncode == 0, r.stderr
    # the stand-in has no torch.multiprocessing: the one line about that, nothing else
    assert [x for x in r.stderr.splitlines() if "cannot hook torch's children" not in x] == []
    out = json.loads(r.stdout)
    assert out["process"] == [0, 1] and out["main"] == [0, 1], "the process keeps the union"
    assert out["t0"] == [0] and out["t1"] == [1], "each thread on its own device's share"
    assert out["t0_moved"] == [1] and out["t1_moved"] == [0], "another device: moved"
    assert out["t0_again"] == [1] and out["t1_again"] == [0]
    assert out["selected"] == ["0", "0", "0", "1", "1", "1"]


def test_torch_stand_in_without_spawn_says_one_line(two: str, stand_ins: str) -> None:
    r = run("import torch; print('imported')", torch_env(two, PYTHONPATH=stand_ins))
    assert r.stdout.strip() == "imported"
    assert r.stderr.count("\n") == 1 and "torch.multiprocessing.spawn" in r.stderr, r.stderr


def test_ray_accelerator_hook_logic(two: str, stand_ins: str) -> None:
    """NUMABIND_RAY=1: the hook wraps Ray's visibility functions when ray is imported; a
    task given GPU 1 runs on node 1 and is put back after it; GPUs on two nodes are not
    bound, and that is said."""
    code = """
import json, os, ray
from ray._private import utils
aff = lambda: sorted(os.sched_getaffinity(0))
out = [aff()]
ray.ids[:] = [1]; utils.set_visible_accelerator_ids(); out.append(aff())
utils.reset_visible_accelerator_env_vars({}); out.append(aff())
ray.ids[:] = [0, 1]; utils.set_visible_accelerator_ids(); out.append(aff())
print(json.dumps(out))
"""
    env = clean_env(
        NUMABIND_RAY="1",
        NUMABIND_SYSROOT=two,
        NUMABIND_MEMORY="none",
        NUMABIND="force",
        PYTHONPATH=stand_ins,
    )
    r = run(code, env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [[0, 1], [1], [0, 1], [0, 1]], r.stderr
    assert "Ray assigned GPUs 0,1, on nodes [0, 1]" in r.stderr and "not bound" in r.stderr
