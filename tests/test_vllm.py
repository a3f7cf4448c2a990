"""vLLM wired in (issue 45): ``NUMABIND_NIC=vllm`` writes vLLM's GPU-to-NIC map
(``VLLM_GPU_NIC_PCIE_MAPPING``, ``VLLM_NIC_SELECTION_VARS``: vllm-project/vllm#42083,
``vllm/v1/executor/vllm_net_devices.py``) from numabind's own NIC choice, under the
keep/replace rule; read back the way vLLM's worker reads it (its PCI addresses compared as
numbers, the NIC found through ``/sys/class/infiniband/*/device``), each GPU's entry names
the adapter the plan chose for that GPU.

vLLM does not install here: what reads the map is :func:`vllm_worker_reads`, written
after vLLM's documented parsing (the file named above), not vLLM itself."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import synth
from numabind import _transports, nics_for
from numabind._topology import Machine
from support import clean_env

ROOT = Path(__file__).resolve().parent.parent
HWLOC = ROOT / "tests" / "data" / "hwloc"
NAMES = ("VLLM_GPU_NIC_PCIE_MAPPING", "VLLM_NIC_SELECTION_VARS", "UCX_NET_DEVICES")
SHOW = "import os; print(*(os.environ.get(n, '-') for n in %r), sep='|')" % (NAMES,)
MACHINES: dict[str, Callable[[], synth.Spec]] = {
    "dgx-a100": synth.dgx_a100,
    "p4d": synth.p4d,
    "nics-one-socket": synth.nics_one_socket,
}


@pytest.fixture(scope="module", params=sorted(MACHINES))
def example(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """Each example machine with adapters, written out as a sysroot."""
    name = request.param
    return synth.write(MACHINES[name](), str(tmp_path_factory.mktemp(name)))


def _bdf(text: str) -> tuple[int, int, int, int]:
    """A PCI address as vLLM compares it: domain, bus, device, function as numbers,
    ``bus:dev.fn`` meaning domain 0; ValueError for anything else."""
    body, _, fn = text.strip().lower().removeprefix("0x").rpartition(".")
    parts = body.split(":")
    if not fn or len(parts) not in (2, 3):
        raise ValueError(text)
    nums = [int(p, 16) for p in parts]
    domain, bus, dev = [0, *nums] if len(nums) == 2 else nums
    if bus > 0xFF or dev > 0x1F or int(fn, 16) > 0xFF:
        raise ValueError(text)
    return domain, bus, dev, int(fn, 16)


def vllm_worker_reads(sysroot: str, gpu_pci: str, mapping: str, selection: str) -> dict[str, str]:
    """What a vLLM worker on ``gpu_pci`` sets from the two variables: the mapped NIC's
    RDMA device (the one whose ``/sys/class/infiniband/NAME/device`` resolves to that PCI
    address, under ``sysroot``), with each selection entry's suffix."""
    pairs = {}
    for seg in mapping.split(","):
        if seg.strip():
            gpu, sep, nic = seg.partition("=")
            assert sep, f"not GPU_BDF=NIC_BDF: {seg!r}"
            pairs[_bdf(gpu)] = _bdf(nic)
    want = pairs[_bdf(gpu_pci)]
    ib = Path(sysroot, "sys/class/infiniband")
    names = [
        n.name
        for n in sorted(ib.iterdir())
        if _bdf(os.path.basename(os.path.realpath(n / "device"))) == want
    ]
    assert len(names) == 1, names
    out = {}
    for entry in selection.split(","):
        var, sep, suffix = entry.strip().partition(":")
        out[var] = names[0] + (sep + suffix if sep else "")
    return out


def _rank(root: str, rank: int, **env: str) -> tuple[str, str, str]:
    r = subprocess.run(
        [sys.executable, "-c", SHOW],
        capture_output=True,
        text=True,
        env=clean_env(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="8", NUMABIND_SYSROOT=root, **env),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    mapping, selection, ucx = r.stdout.strip().split("|")
    return mapping, selection, ucx


def test_each_gpu_is_mapped_to_the_adapter_the_plan_chose(example: str) -> None:
    """The map a rank gets names every GPU of the node with the first adapter numabind's
    plan chose for that GPU (``nics_for``, the planner's choice), the same on every rank;
    a vLLM worker reading it on each GPU picks that adapter by name, with its port."""
    m = Machine.from_root(example)
    gpus = m.accelerators
    maps = {_rank(example, r, NUMABIND_NIC="vllm") for r in (0, 3, 7)}
    assert len(maps) == 1, "one map for the node, whichever rank wrote it"
    ((mapping, selection, ucx),) = maps
    assert ucx == "-", "UCX_NET_DEVICES is left to vLLM, which sets it per worker"
    assert len(mapping.split(",")) == len(gpus)
    for i, gpu in enumerate(gpus):
        chosen = nics_for(i, machine=m)[0]
        assert f"{gpu.pci}={chosen.pci}" in mapping.split(","), (i, mapping)
        got = vllm_worker_reads(example, gpu.pci, mapping, selection)
        assert got == {"UCX_NET_DEVICES": chosen.label}, (i, got)


def test_the_transports_named_beside_vllm_go_into_its_selection(example: str) -> None:
    """``vllm,ucx,uccl,nccl``: vLLM is told to set UCX's and UCCL's variables (UCX's with
    the port); numabind sets neither itself, and NCCL's node-wide list stays numabind's."""
    mapping, selection, ucx = _rank(example, 0, NUMABIND_NIC="vllm,ucx,uccl,nccl")
    assert selection == "UCX_NET_DEVICES:1,UCCL_P2P_RDMA_DEV" and ucx == "-"
    got = vllm_worker_reads(
        example, Machine.from_root(example).accelerators[0].pci, mapping, selection
    )
    assert got["UCX_NET_DEVICES"].endswith(":1") and ":" not in got["UCCL_P2P_RDMA_DEV"]
    without = _rank(example, 0, NUMABIND_NIC="ucx")
    assert without[:2] == ("-", "-") and without[2] != "-", "no vllm: UCX told directly"


def test_a_users_map_is_kept(example: str) -> None:
    """A map set before numabind is the user's: kept as it is, and so is its partner."""
    own = "0000:07:00.0=0000:0c:00.0"
    mapping, selection, _ = _rank(example, 0, NUMABIND_NIC="vllm", VLLM_GPU_NIC_PCIE_MAPPING=own)
    assert mapping == own
    assert selection == "UCX_NET_DEVICES:1", "the partner variable is still numabind's to set"
    _, kept, _ = _rank(example, 0, NUMABIND_NIC="vllm", VLLM_NIC_SELECTION_VARS="NCCL_IB_HCA")
    assert kept == "NCCL_IB_HCA"


def test_the_values_for_a_given_choice() -> None:
    """The exact spelling, from a choice: PCI order, the most common port as the suffix,
    nothing at all when no GPU has an adapter (vLLM refuses one variable without the
    other)."""
    from numabind._model import NicChoice

    def c(name: str, pci: str, port: int = 1) -> tuple[NicChoice, ...]:
        return (NicChoice(name=name, port=port, pci=pci, relation="PIX"),)

    per_gpu = {
        "0000:b7:00.0": c("mlx5_3", "0000:b8:00.0"),
        "0000:07:00.0": c("mlx5_0", "0000:08:00.0"),
        "0000:47:00.0": c("mlx5_1", "0000:48:00.0", 2),
        "0000:87:00.0": c("mlx5_2", "0000:88:00.0"),
    }
    mapping, names = _transports.vllm_values("vllm,nvshmem", per_gpu)
    assert mapping == (
        "0000:07:00.0=0000:08:00.0,0000:47:00.0=0000:48:00.0,"
        "0000:87:00.0=0000:88:00.0,0000:b7:00.0=0000:b8:00.0"
    )
    assert names == "NVSHMEM_HCA_LIST:1"
    assert _transports.vllm_values("vllm", {"0000:07:00.0": ()}) == ("", "")
    wanted = _transports.wanted_values("vllm,nvshmem", (), per_gpu=per_gpu)
    assert "NVSHMEM_HCA_LIST" not in wanted and wanted["NVSHMEM_ENABLE_NIC_PE_MAPPING"] == ""


@pytest.mark.parametrize(
    "capture", ["nvidiaDGX2.xml", "24em64t-2n6c2t-pci.xml", "nvidiagpunumanodes.tar.bz2"]
)
def test_real_captures_without_an_offered_adapter_set_neither(capture: str) -> None:
    """The real hwloc captures with GPUs here have no RDMA adapter numabind may offer
    (none recorded, or one without its port state): vLLM is told nothing, rather than a
    map naming no NIC, which vLLM would refuse."""
    m = Machine.from_capture(str(HWLOC / capture))
    assert m.accelerators, capture
    from numabind._nics import assign, same_vendor
    from numabind._plan import device_node

    found = assign(m, same_vendor(m, m.accelerators[0]), lambda d: device_node(m, d).node)
    mapping, names = _transports.vllm_values("vllm", found.per_device)
    assert (mapping, names) == ("", ""), capture
    env: dict[str, str] = {}
    done = _transports.apply_env("vllm", (), env, per_gpu=found.per_device)
    assert env == {} and done.set == ()
    assert any("no RDMA adapter chosen" in n for n in done.notes)


# --- the vllm.general_plugins entry point -----------------------------------------------------

STANDIN = ROOT / "tests" / "standin"
PROCESS = f"""
import json, os, sys
sys.path.insert(0, {str(STANDIN)!r})
import vllm_plugins
before = sorted(sys.modules)
vllm_plugins.load_general_plugins()
vllm_plugins.plugins_loaded = False
vllm_plugins.load_general_plugins()  # vLLM may load them again in one process
import numabind.vllm
from numabind._apply import bound_plan
print(json.dumps({{
    "map": os.environ.get("VLLM_GPU_NIC_PCIE_MAPPING"),
    "vars": os.environ.get("VLLM_NIC_SELECTION_VARS"),
    "armed": len(numabind.vllm._armed),
    "bound": bound_plan(process=True) is not None,
    "torch_hooked": "numabind.torch" in sys.modules,
}}))
"""


def _vllm_process(**env: str) -> tuple[dict[str, object], str]:
    import json

    r = subprocess.run(
        [sys.executable, "-c", PROCESS],
        capture_output=True,
        text=True,
        env=clean_env(**env),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr


def test_the_entry_point_is_in_the_installed_metadata() -> None:
    """vLLM finds it as it finds any plugin: by group, in the installed distribution's
    entry points; it loads to the function."""
    from importlib.metadata import entry_points

    import numabind.vllm

    (ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "numabind"]
    assert ep.value == "numabind.vllm:register"
    assert ep.load() is numabind.vllm.register


def test_a_vllm_process_without_a_rank_gets_the_map_and_binds_on_device_selection(
    example: str,
) -> None:
    """vLLM's API server or a worker (no rank variables: the hook leaves it alone): the
    loader calls the plugin, which sets the node's map (the one a rank's hook writes) and
    arms the binding on the worker's device selection, once however often it is called."""
    got, err = _vllm_process(NUMABIND_SYSROOT=example, NUMABIND_NIC="vllm")
    rank_map, rank_vars, _ = _rank(example, 0, NUMABIND_NIC="vllm")
    assert (got["map"], got["vars"]) == (rank_map, rank_vars) and rank_map != "-"
    assert got["armed"] == 1 and not got["bound"], got
    assert err == ""


def test_a_process_the_hook_bound_is_left_alone(two: str) -> None:
    """A rank the startup hook bound: the plugin arms nothing and sets nothing more."""
    got, _ = _vllm_process(LOCAL_RANK="1", LOCAL_WORLD_SIZE="2", NUMABIND_SYSROOT=two)
    assert got["bound"] and got["armed"] == 0 and got["map"] is None, got


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"NUMABIND_MODE": "bogus"}, "numabind.vllm: not registered: ConfigError"),
        ({"NUMABIND": "0", "NUMABIND_NIC": "vllm"}, ""),
        ({"VLLM_PLUGINS": "someone_else", "NUMABIND_NIC": "vllm"}, ""),
    ],
)
def test_the_plugin_never_stops_vllm_and_obeys_the_switches(
    two: str, env: dict[str, str], said: str
) -> None:
    """A bad knob is one line, never an exception (vLLM would stop the process);
    ``NUMABIND=0`` and a ``VLLM_PLUGINS`` list without it do nothing."""
    got, err = _vllm_process(NUMABIND_SYSROOT=two, **env)
    assert got["armed"] == 0 and got["map"] is None, got
    assert (said in err) if said else err == "", err


@pytest.fixture(scope="module")
def a100(tmp_path_factory: pytest.TempPathFactory) -> str:
    return synth.write(synth.dgx_a100(), str(tmp_path_factory.mktemp("a100-kept")))


@pytest.mark.parametrize(
    ("kept", "said"),
    [
        # GPU 0 (0000:07:00.0) to mlx5_8, across the sockets; another spelling of the address
        ("7:00.0=0000:bc:00.0", "is SYS from GPU 0; mlx5_0 is PXB: kept"),
        ("0000:09:00.0=0000:0e:00.0", "has no entry for GPU 0 (0000:07:00.0)"),
        ("0000:07:00.0=0000:ff:00.0", "names no RDMA adapter of this machine"),
        ("0000:07:00.0=0000:0C:00.0", None),  # its nearest, in capitals: nothing to say
    ],
)
def test_a_kept_map_is_judged_for_the_ranks_gpu(a100: str, kept: str, said: str | None) -> None:
    """A map the user set is kept, and what it gives this rank's GPU is judged as any kept
    adapter variable is: farther than the nearest, no entry for it, no such adapter."""
    r = subprocess.run(
        [sys.executable, "-c", SHOW],
        capture_output=True,
        text=True,
        env=clean_env(
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="8",
            NUMABIND_SYSROOT=a100,
            NUMABIND_NIC="vllm",
            VLLM_GPU_NIC_PCIE_MAPPING=kept,
        ),
        timeout=120,
    )
    assert r.returncode == 0 and r.stdout.split("|")[0] == kept, r.stderr
    if said is None:
        assert "VLLM_GPU_NIC_PCIE_MAPPING" not in r.stderr, r.stderr
    else:
        assert r.stderr.count(f"VLLM_GPU_NIC_PCIE_MAPPING={kept} {said}") == 1, r.stderr
