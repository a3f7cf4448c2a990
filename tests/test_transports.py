"""Telling the transports (issue 34): each variable's exact syntax, the keep/replace rule
with its record (a child rank gets its own adapter, not its parent's: ucx#11259), the
judgement of a value someone else set, and the places that show it: the startup hook,
late binding, the registry, ``check``, ``doctor`` and ``show``.  A rank that does not ask
for NICs loads none of this and opens no adapter's file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import synth
from numabind import _transports
from numabind._environ import Config
from numabind._model import NicChoice
from numabind._plan import device_node
from numabind._registry import Entry
from numabind._topology import Machine
from numabind._transports import TRANSPORTS, apply_env, judge, named, value_for
from support import COUNT_HOOK, as_live, clean_env

ROOT = Path(__file__).resolve().parent.parent
NUMABIND = [sys.executable, "-m", "numabind"]
TWO = (
    NicChoice(name="mlx5_0", port=1, pci="0000:0c:00.0", relation="PXB", rate=200.0),
    NicChoice(name="mlx5_1", port=1, pci="0000:0e:00.0", relation="PXB", rate=200.0),
)


@pytest.fixture(scope="module")
def a100(tmp_path_factory: pytest.TempPathFactory) -> str:
    return synth.write(synth.dgx_a100(), str(tmp_path_factory.mktemp("a100")))


def _judge(m: Machine, gpu: int, name: str, value: str) -> str | None:
    g = m.accelerators[gpu]
    return judge(m, g, f"GPU {gpu}", name, value, (), lambda d: device_node(m, d).node)


# --- the table and the syntax --------------------------------------------------------------


def test_every_transport_and_variable_is_documented_with_its_source() -> None:
    page = (ROOT / "docs" / "nics.rst").read_text()
    env_page = (ROOT / "docs" / "environment.rst").read_text()
    for t in TRANSPORTS:
        assert f"``{t.name}``" in page, t.name
        for v in t.variables:
            assert f"``{v.name}``" in page and f"``{v.name}``" in env_page, v.name
            repo = v.source.split()[0]
            assert v.source and (repo in page or "NCCL" in repo), (v.name, v.source)


def test_each_variable_is_written_in_its_transports_syntax() -> None:
    by = {v.name: v for v in _transports.VARIABLES}
    assert value_for(by["UCX_NET_DEVICES"], TWO) == "mlx5_0:1,mlx5_1:1"
    assert value_for(by["NVSHMEM_HCA_LIST"], TWO) == "mlx5_0:1,mlx5_1:1"
    assert value_for(by["NVSHMEM_ENABLE_NIC_PE_MAPPING"], TWO) == "1"
    assert value_for(by["UCCL_P2P_RDMA_DEV"], TWO) == "mlx5_0,mlx5_1"
    assert value_for(by["MC_MS_FILTERS"], TWO) == "mlx5_0,mlx5_1"
    assert value_for(by["NCCL_IB_HCA"], TWO) == "=mlx5_0:1,mlx5_1:1", "= : exact, not prefixes"
    assert all(value_for(v, ()) == "" for v in _transports.VARIABLES)
    wanted = _transports.wanted_values("ucx,nixl,nvshmem", TWO[:1])
    assert wanted == {
        "UCX_NET_DEVICES": "mlx5_0:1",
        "NVSHMEM_HCA_LIST": "mlx5_0:1",
        "NVSHMEM_ENABLE_NIC_PE_MAPPING": "1",
    }, "nixl reaches its NICs through UCX: one variable, once"


def test_what_a_value_names_follows_each_transports_matching() -> None:
    spec = synth.dgx_a100()
    spec.adapters[0].name = "mlx5_10"  # NCCL's trap: mlx5_1 is a prefix of mlx5_10
    tree = synth.build(spec)
    from numabind._sources import SysfsSource
    from numabind.capture._examples import MemoryRoot

    m = Machine(SysfsSource(MemoryRoot(tree.files, "g", tree.links)))
    by = {v.name: v for v in _transports.VARIABLES}

    def names(var: str, value: str) -> list[str] | None:
        got = named(by[var], value, m.nics)
        return None if got is None else sorted(f"{n.name}:{p}" for n, p in got)

    assert names("NCCL_IB_HCA", "mlx5_1") == ["mlx5_10:1", "mlx5_1:1"]
    assert names("NCCL_IB_HCA", "=mlx5_1") == ["mlx5_1:1"]
    assert names("NCCL_IB_HCA", "=mlx5_1:2") == []
    assert len(names("NCCL_IB_HCA", "^mlx5_1") or []) == 8
    assert len(names("NCCL_IB_HCA", "^=mlx5_1") or []) == 9
    assert names("UCX_NET_DEVICES", "mlx5_1:1,mlx5_2:1") == ["mlx5_1:1", "mlx5_2:1"]
    assert names("UCX_NET_DEVICES", "mlx5_1") == ["mlx5_1:1"], "UCX names are exact"
    assert names("UCX_NET_DEVICES", "all") is None
    assert names("NVSHMEM_HCA_LIST", "^mlx5_1:1") is not None
    assert "mlx5_1:1" not in (names("NVSHMEM_HCA_LIST", "^mlx5_1:1") or [])
    assert names("UCCL_P2P_RDMA_DEV", "4,5") is None, "ibverbs indices are not judged"
    assert names("MC_MS_FILTERS", " mlx5_2 , mlx5_3") == ["mlx5_2:1", "mlx5_3:1"]
    assert names("UCX_NET_DEVICES", "x" * 5000) is None


def test_a_farther_adapter_is_named_with_the_nearest(a100: str) -> None:
    m = Machine.from_root(a100)
    assert (
        _judge(m, 0, "UCX_NET_DEVICES", "mlx5_8:1")
        == "UCX_NET_DEVICES=mlx5_8:1 is SYS from GPU 0; "
        "mlx5_0 is PXB"
    )
    assert _judge(m, 0, "UCX_NET_DEVICES", "mlx5_1:1") is None, "the neighbour's rail: as near"
    assert "names mlx5_8:1, SYS" in (_judge(m, 0, "UCX_NET_DEVICES", "mlx5_0:1,mlx5_8:1") or "")
    assert _judge(m, 0, "NCCL_IB_HCA", "mlx5") is None, "NCCL takes the nearest of a list"
    assert "is SYS from GPU 0" in (_judge(m, 0, "NCCL_IB_HCA", "=mlx5_8") or "")
    assert _judge(m, 0, "UCX_NET_DEVICES", "mlx5_99:1") == (
        "UCX_NET_DEVICES=mlx5_99:1 names no RDMA adapter of this machine"
    )
    assert _judge(m, 0, "UCX_NET_DEVICES", "all") is None
    shown = _judge(m, 0, "UCX_NET_DEVICES", "mlx5_8:1\x1b[2J")
    assert shown is not None and "\x1b" not in shown, "a value is input: quoted"
    one = Machine.from_example("nics-one-socket")
    assert _judge(one, 5, "UCCL_P2P_RDMA_DEV", "mlx5_4") == (
        "UCCL_P2P_RDMA_DEV=mlx5_4 names only adapters never chosen (mlx5_4:1: port 1 down)"
    )


# --- keep, replace, record ---------------------------------------------------------------------


def test_set_kept_replaced_removed_and_recorded() -> None:
    env: dict[str, str] = {}
    done = apply_env("ucx,nvshmem", TWO[:1], env)
    assert env["UCX_NET_DEVICES"] == "mlx5_0:1" and env["NVSHMEM_ENABLE_NIC_PE_MAPPING"] == "1"
    assert env["NUMABIND_NIC_SET"] == (
        "UCX_NET_DEVICES=mlx5_0:1;NVSHMEM_HCA_LIST=mlx5_0:1;NVSHMEM_ENABLE_NIC_PE_MAPPING=1"
    )
    assert len(done.set) == 3 and not done.kept
    # a child of that process, another rank: what numabind set is replaced, not kept
    child = dict(env)
    apply_env("ucx,nvshmem", TWO[1:], child)
    assert child["UCX_NET_DEVICES"] == "mlx5_1:1" and "mlx5_1:1" in child["NUMABIND_NIC_SET"]
    # the user's own value is kept, and what is wrong with it said
    user = {"UCX_NET_DEVICES": "mlx5_8:1"}
    kept = apply_env("ucx", TWO[:1], user, judge_kept=lambda n, v: f"{n}={v} is SYS")
    assert user["UCX_NET_DEVICES"] == "mlx5_8:1" and kept.kept == (("UCX_NET_DEVICES", "mlx5_8:1"),)
    assert kept.warnings == (
        "UCX_NET_DEVICES=mlx5_8:1 is SYS: kept, as it was set before numabind (NUMABIND_NIC)",
    )
    assert "NUMABIND_NIC_SET" not in user
    # a value changed after numabind set it is the user's now
    changed = {**env, "UCX_NET_DEVICES": "mlx5_3:1"}
    apply_env("ucx", TWO[1:], changed)
    assert changed["UCX_NET_DEVICES"] == "mlx5_3:1"
    # inherited for another GPU, and this rank has none: removed rather than wrong
    none = dict(env)
    gone = apply_env("ucx", (), none)
    assert "UCX_NET_DEVICES" not in none and any("removed" in n for n in gone.notes)


@pytest.mark.parametrize(
    ("record", "after"),
    [
        # the record's own entry is honoured, the junk after it ignored, bounded
        ("UCX_NET_DEVICES=mlx5_8:1" + ";X=1" * 40, "mlx5_0:1"),
        # a variable outside the table is never numabind's, whatever the record says
        ("LD_PRELOAD=/tmp/evil.so;UCX_NET_DEVICES=mlx5_8:1", "mlx5_0:1"),
        ("UCX_NET_DEVICES=mlx5_8:1" + "x" * 5000, "mlx5_8:1"),  # too long: no record
        ("UCX_NET_DEVICES", "mlx5_8:1"),
        ("UCX_NET_DEVICES=mlx5_9:1", "mlx5_8:1"),  # not what is there: the user's
    ],
)
def test_a_hostile_record_touches_only_the_tables_variables(record: str, after: str) -> None:
    env = {"NUMABIND_NIC_SET": record, "UCX_NET_DEVICES": "mlx5_8:1", "LD_PRELOAD": "/tmp/evil.so"}
    apply_env("ucx", TWO[:1], env)
    assert env["LD_PRELOAD"] == "/tmp/evil.so"
    assert env["UCX_NET_DEVICES"] == after


def test_the_knobs_parse_and_warn() -> None:
    cfg = Config.from_env({"NUMABIND_NIC": " NCCL,ucx ,nixl", "NUMABIND_NIC_MIN_RATE": "100G"})
    assert cfg.nic == "ucx,nixl,nccl" and cfg.nic_min_rate == "100" and not cfg.warnings
    bad = Config.from_env(
        {"NUMABIND_NIC": "ucz", "NUMABIND_NIC_MODE": "fair", "NUMABIND_NIC_MIN_RATE": "fast"}
    )
    assert bad.nic == "" and bad.nic_mode == "nearest" and bad.nic_min_rate == "auto"
    assert len(bad.warnings) == 3 and "'ucz'" in bad.warnings[0] and "using none" in bad.warnings[0]


# --- the startup hook, late binding ------------------------------------------------------------


def _py(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(**env)
    )


SHOW = "import os; print(os.environ.get('UCX_NET_DEVICES'), os.environ.get('NCCL_IB_HCA'))"


def test_the_hook_tells_each_rank_its_own_rail_and_nccl_the_nodes(a100: str) -> None:
    got = {}
    for rank in (0, 1, 5):
        r = _py(
            SHOW,
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="8",
            NUMABIND_SYSROOT=a100,
            NUMABIND_NIC="ucx,nccl",
        )
        assert r.returncode == 0, r.stderr
        got[rank] = r.stdout.split()
    rails = "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_6:1,mlx5_7:1,mlx5_8:1,mlx5_9:1"
    assert got == {0: ["mlx5_0:1", rails], 1: ["mlx5_1:1", rails], 5: ["mlx5_7:1", rails]}


def test_a_child_rank_gets_its_own_adapter_and_a_users_value_is_kept(a100: str) -> None:
    parent = (
        "import os, subprocess, sys\n"
        f"print('parent', os.environ['UCX_NET_DEVICES'], flush=True)\n"
        "sys.exit(subprocess.run([sys.executable, '-c', "
        f"{SHOW!r}], env={{**os.environ, 'LOCAL_RANK': '6'}}).returncode)\n"
    )
    r = _py(parent, LOCAL_RANK="0", LOCAL_WORLD_SIZE="8", NUMABIND_SYSROOT=a100, NUMABIND_NIC="ucx")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["parent", "mlx5_0:1", "mlx5_8:1", "None"], "ucx#11259"
    user = _py(
        SHOW,
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="8",
        NUMABIND_SYSROOT=a100,
        NUMABIND_NIC="ucx",
        UCX_NET_DEVICES="mlx5_8:1",
    )
    assert user.stdout.split()[0] == "mlx5_8:1"
    assert "UCX_NET_DEVICES=mlx5_8:1 is SYS from GPU 0; mlx5_0 is PXB: kept" in user.stderr


def test_late_binding_tells_them_too_and_a_one_node_host_still_has_a_nearest(
    tmp_path: Path,
) -> None:
    """A worker that learns its GPU late (apply(device=...), numabind.torch's set_device)
    sets the variables before its transport starts; a one-node machine binds nothing and
    still tells its ranks their adapter."""
    spec = synth.nics_one_socket()
    spec.nodes = [spec.nodes[0] + spec.nodes[1]]
    spec.package_of_node = [0]
    for d in (*spec.gpus, *spec.adapters):
        d.node = 0
    one = synth.write(spec, str(tmp_path / "one"))
    late = _py(
        "import numabind, os; numabind.apply(device=2); print(os.environ.get('UCX_NET_DEVICES'))",
        NUMABIND_SYSROOT=one,
        NUMABIND_NIC="ucx",
    )
    assert late.stdout.split()[-1] == "mlx5_2:1", late.stderr
    hook = _py(SHOW, LOCAL_RANK="6", NUMABIND_SYSROOT=one, NUMABIND_NIC="ucx")
    assert hook.stdout.split()[0] == "mlx5_2:1", hook.stderr
    off = _py(SHOW, LOCAL_RANK="6", NUMABIND_SYSROOT=one)
    assert off.stdout.split() == ["None", "None"]


def test_a_rank_that_does_not_ask_loads_and_opens_nothing_of_it(a100: str) -> None:
    prefix, _ = as_live(a100)
    base = {"LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}
    if not prefix:
        base["NUMABIND_SYSROOT"] = a100

    def counted(**extra: str) -> dict[str, list[str]]:
        r = subprocess.run(
            [*prefix, sys.executable, "-S", "-c", COUNT_HOOK],
            capture_output=True,
            text=True,
            env=clean_env(**base, **extra),
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        data: dict[str, list[str]] = json.loads(r.stdout)
        return data

    nic = {"numabind._nics", "numabind._rdma", "numabind._transports"}
    plain = counted()
    assert not nic & set(plain["modules"]), plain["modules"]
    assert not [f for f in plain["files"] if "infiniband" in f or "/class/net" in f]
    asked = counted(NUMABIND_NIC="ucx")
    assert nic <= set(asked["modules"])
    assert any("infiniband" in f for f in asked["files"])


# --- what numabind records and shows -----------------------------------------------------------


def test_the_registry_entry_carries_nics_and_what_was_set() -> None:
    e = Entry(
        pid=1234,
        start="99",
        nics=TWO,
        nic_env=(("UCX_NET_DEVICES", "mlx5_0:1,mlx5_1:1"), ("NVSHMEM_ENABLE_NIC_PE_MAPPING", "1")),
    )
    back = Entry.parse(e.encode())
    assert back is not None and back.nic_env == e.nic_env
    assert [(n.label, n.pci, n.relation, n.rate) for n in back.nics] == [
        (n.label, n.pci, n.relation, n.rate) for n in TWO
    ]
    many = Entry(
        pid=1, start="1", nic_env=tuple(("NCCL_IB_HCA", "=" + "mlx5_0:1," * 200) for _ in range(3))
    )
    assert Entry.parse(many.encode()) is not None, "what does not fit is left out whole"
    text = e.encode().decode()
    for bad in (
        text.replace("mlx5_0:1@", "mlx5_0;evil:1@"),
        text.replace("/PXB/", "/NEAR/"),
        text.replace("nic_env=UCX_NET_DEVICES", "nic_env=LD_PRELOAD"),
        text.replace("0000:0c:00.0", "../../etc"),
    ):
        assert Entry.parse(bad.encode()) is None, bad


def test_check_shows_the_nics_and_warns_on_a_farther_one(a100: str) -> None:
    from numabind.check._inspect import check_pid
    from numabind.cli._check import process_lines

    env = clean_env(
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="8",
        NUMABIND="0",
        UCX_NET_DEVICES="mlx5_8:1",
        NVSHMEM_HCA_LIST="mlx5_0:1",
    )
    p = subprocess.Popen(
        [sys.executable, "-c", "import sys; print(1, flush=True); sys.stdin.read()"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout is not None and p.stdout.readline().strip() == "1"
        r = check_pid(p.pid, Machine.from_root(a100))
    finally:
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
    assert [n.label for n in r.nics] == ["mlx5_0:1"]
    assert r.nic_settings == {"UCX_NET_DEVICES": "mlx5_8:1", "NVSHMEM_HCA_LIST": "mlx5_0:1"}
    assert "warning: UCX_NET_DEVICES=mlx5_8:1 is SYS from GPU 0; mlx5_0 is PXB" in r.notes
    assert any("without NVSHMEM_ENABLE_NIC_PE_MAPPING=1" in n for n in r.notes)
    lines = process_lines(r)
    assert any(
        line.strip().startswith(
            "nics: mlx5_0:1 (PXB, 200 Gb/s); NVSHMEM_HCA_LIST=mlx5_0:1 (set before numabind)"
        )
        for line in lines
    ), lines
    d = r.to_dict()
    assert d["nics"][0]["name"] == "mlx5_0" and d["nic_set"] == []


def test_doctor_names_the_gpus_with_nothing_nearer_than_sys() -> None:
    from numabind.cli._doctor import machine_findings

    far = [
        f
        for f in machine_findings(Machine.from_example("nics-one-socket"))
        if f.check == "nic distance"
    ]
    assert [f.detail.split(" (")[0] for f in far] == [f"GPU {i}" for i in range(4, 8)]
    assert all(f.status == "warn" for f in far)
    assert not [
        f for f in machine_findings(Machine.from_example("dgx-h100")) if f.check == "nic distance"
    ]
    rdma = next(
        f
        for f in machine_findings(Machine.from_example("nics-one-socket"))
        if f.check == "rdma adapters"
    )
    assert "mlx5_4: port 1 down" in rdma.detail and "mlx5_5: slow" in rdma.detail


def test_show_has_the_adapters_the_column_the_picture_and_the_json() -> None:
    def show(*argv: str) -> str:
        r = subprocess.run(
            [*NUMABIND, "show", "--example", "nics-one-socket", *argv],
            capture_output=True,
            text=True,
            env=clean_env(),
        )
        assert r.returncode == 0, r.stderr
        return r.stdout

    text = show()
    assert "Network adapters" in text and "mlx5_4  0000:f1:00.0  1     1:down/10G/IB" in text
    assert "never: slow: 25 Gb/s below the minimum 200 Gb/s" in text
    assert "mlx5_0:1 SYS" in text.split("Plan (")[1]
    data = json.loads(show("--json"))
    rows = {r["name"]: r for r in data["nics"]}
    assert rows["mlx5_0"]["given_to"] == ["0000:18:00.0", "0000:98:00.0"]
    assert rows["mlx5_4"]["never"] == "port 1 down" and rows["mlx5_4"]["offered"] == []
    assert rows["mlx5_0"]["ports"][0] == {
        "number": 1,
        "state": "ACTIVE",
        "rate": 400.0,
        "link_layer": "InfiniBand",
        "netdev": None,
    }
    assert data["ranks"][4]["nics"][0]["relation"] == "SYS"
    drawn = show("--draw")
    assert "NIC mlx5_0 (0000:19:00.0, 400 Gb/s): ranks 0,4" in drawn
    assert "NIC mlx5_4 (0000:f1:00.0): never chosen (port 1 down)" in drawn
    assert "rank 4: CPUs 32-63, memory preferred on node 1, NIC mlx5_0:1 (SYS)" in drawn
    svg = show("--svg", "-")
    assert "NIC mlx5_5 (0000:99:00.0): never chosen (slow" in svg
    exclusive = subprocess.run(
        [*NUMABIND, "show", "--example", "dgx-a100", "--json"],
        capture_output=True,
        text=True,
        env=clean_env(NUMABIND_NIC_MODE="exclusive", NUMABIND_NIC_MIN_RATE="0"),
    )
    assert json.loads(exclusive.stdout)["ranks"][0]["nics"][0]["name"] == "mlx5_0"


def test_nics_for_names_a_gpu_like_plan_for_and_refuses_what_is_not_there() -> None:
    import numabind

    m = Machine.from_example("dgx-a100")
    assert [n.label for n in numabind.nics_for(1, machine=m, environ={})] == ["mlx5_1:1"]
    assert numabind.nics_for("0000:87:00.0", machine=m, environ={})[0].name == "mlx5_6"
    assert numabind.nics_for(machine=m, environ={"LOCAL_RANK": "7"})[0].name == "mlx5_9"
    assert numabind.nics_for(local_rank=2, machine=m, environ={})[0].name == "mlx5_2"
    assert numabind.nics_for(synth._uuid(3), machine=m, environ={})[0].name == "mlx5_3"
    one = Machine.from_example("nics-one-socket")
    assert numabind.nics_for(4, machine=one, environ={}, min_rate=0)[0].name == "mlx5_5"
    assert numabind.nics_for(4, machine=one, environ={})[0].name == "mlx5_0"
    for bad in ({"device": 99}, {"device": "GPU-nope"}, {"mode": "fair"}, {"min_rate": "fast"}):
        with pytest.raises(numabind.ConfigError):
            numabind.nics_for(machine=m, environ={"LOCAL_RANK": "0"}, **bad)  # type: ignore[arg-type]
    with pytest.raises(numabind.ConfigError, match="no GPU"):
        numabind.nics_for(machine=m, environ={})
