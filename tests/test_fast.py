"""The startup fast path (``_numabind_start``) against the full path it stands in for.

The fast path plans and binds a rank from the node's cached machine without importing
numabind; it is only right if it gives exactly the binding the full path gives, and hands
everything else over.  Held to that three ways: every plan it makes, in-process, on
generated machines and the shipped captures, for every rank, mode, memory policy, SMT
level, priority role and visibility list, equals the planner's (or it hands over);
real ranks bound by each path give the same CPUs, memory policy, registry entry, state and
output; and its vocabularies are numabind's own tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import _numabind_fast as fast
import _numabind_start as start
import synth
from numabind import _cache, _kernel
from numabind._devices import resolve
from numabind._environ import KNOBS, MAX_LOCAL, Config, detect
from numabind._model import (
    MEMORY_POLICY_TABLE,
    RANK_VARIABLES,
    VISIBILITY_VARIABLES,
)
from numabind._plan import Plan, nothing_to_bind, plan, request_for
from numabind._sources import SysfsSource
from numabind._topology import Machine
from numabind.capture._examples import EXAMPLES, MemoryRoot, build
from support import clean_env, two_cpus

DATA = Path(__file__).parent / "data" / "hwloc"


# --- the vocabularies are numabind's own ----------------------------------------------------


def test_the_fast_paths_tables_are_numabinds() -> None:
    from numabind import _environ, _kernel, _sysfs

    assert start.TRIGGERS == _environ.TRIGGER_VARIABLES
    assert start._VISIBILITY == VISIBILITY_VARIABLES
    assert tuple((v.name, v.sizes) for v in RANK_VARIABLES if v.requires is None) == start._RANKS
    assert start.MAX_LOCAL == MAX_LOCAL and fast.MAX_CPUS == _sysfs.MAX_CPUS
    assert fast.MAX_NODES == _sysfs.MAX_NODES
    codes = {p.name: p.code for p in MEMORY_POLICY_TABLE if p.code is not None}
    assert codes == fast._POLICY_CODE
    moves = {p.name: p.migrate_as for p in MEMORY_POLICY_TABLE if p.migrate_as}
    assert moves == fast._MIGRATE_AS
    for arch, (get, setp) in fast._SYSCALLS.items():
        assert _kernel.BY_NAME["get_mempolicy"].number(arch) == get
        assert _kernel.BY_NAME["set_mempolicy"].number(arch) == setp
    assert set(start._LAUNCHER_MODULES) == set(_environ._LAUNCHER_MODULES)
    assert set(start._LAUNCHER_SCRIPTS) >= set(_environ._LAUNCHER_SCRIPTS)
    assert start.root_owned_path is _sysfs.root_owned_path, "one copy of the rule"


def test_every_knob_is_known_to_the_fast_path_or_handed_over() -> None:
    """A knob the fast path lists accepts only values that mean what numabind's own
    parser makes of them; every other knob (a branch adding one) hands over."""
    names = {k.name for k in KNOBS}
    assert set(start._FAST_KNOBS) <= names | {"NUMABIND_CACHE"}, set(start._FAST_KNOBS) - names
    for name, accepted in start._FAST_KNOBS.items():
        for value in accepted or ():
            Config.from_env({name: value})  # every accepted value is valid for numabind
    env = {"LOCAL_RANK": "0", "NUMABIND_SOMETHING_NEW": "1"}
    with pytest.raises(start.Handover, match="NUMABIND_SOMETHING_NEW"):
        start._config(env)
    with pytest.raises(start.Handover, match="NUMABIND_VERBOSE"):
        start._config({"NUMABIND_VERBOSE": "1"})


def test_the_code_files_of_the_key_are_the_modules_that_derive_the_machine() -> None:
    """The key's version part covers every module whose code decides a cache file."""
    files = {Path(p).stem for p in fast._code_files()}
    assert {"_numabind_start", "_numabind_fast", "__init__", "_cache", "_plan"} <= files
    assert {"_sources", "_topology"} <= files
    assert {"_devices", "_model", "_hwloc", "_dra", "_sysfs"} <= files


def test_every_source_method_is_a_fact_the_cache_holds() -> None:
    """A fact a branch adds to Source (a method) is one row of _cache.FACTS: without it
    the cache would answer the base class's nothing."""
    from numabind._sources import Source

    methods = {n for n, v in vars(Source).items() if callable(v) and not n.startswith("_")}
    derived = {"warn", "close", "cpu_info"}  # not answers, or built of other answers
    assert methods - derived == set(_cache.BY_METHOD)
    for name in _cache.BY_METHOD:
        assert name in vars(_cache.Recording), name


def test_cpu_lists_are_numabinds() -> None:
    from numabind._sysfs import format_cpulist, parse_cpulist

    for cpus in ({0}, {0, 1, 2, 5, 7, 8, 9}, set(range(224)), set(), {16383}):
        text = fast.cpulist(cpus)
        assert text == format_cpulist(cpus)
        assert fast.parse_cpulist(text) == parse_cpulist(text)
    for bad in ("1-0", "a", "16384", "0-99999", "1,,2"):
        assert fast.parse_cpulist(bad) is None


# --- every plan, in-process -----------------------------------------------------------------


def full_plan(m: Machine, env: dict[str, str]) -> Plan:
    """What numabind._startup.bind_rank plans for ``env`` on ``m``."""
    cfg = Config.from_env(env)
    info = detect(env, ["python", "-c", "pass"])
    visible = None
    if info.problem is None and not nothing_to_bind(
        m, cfg.mode, cfg.memory, cfg.spill, cfg.priority
    ):
        visible = resolve(m, env, None)
    request = request_for(
        info, visible, cfg.mode, cfg.memory, reserve=cfg.reserve, smt=cfg.smt,
        priority=cfg.priority,
    )  # fmt: skip
    return plan(m, request.replace(budget=cfg.threads != "off"))


def quick_of(m: Machine, want: frozenset[str]) -> dict[str, list[list[str]]]:
    quick: dict[str, list[list[str]]] = {}
    for line in _cache.derive(m, want):
        tokens = line.split(" ")
        quick.setdefault(tokens[1], []).append(tokens[2:])
    return quick


FIELDS = (
    "local_rank", "rank_source", "local_world_size", "device_index", "numa_node", "cpus",
    "memory_policy", "memory_nodes", "mode", "reason", "priority_cpus", "main_cpus",
    "helpers",
)  # fmt: skip


def compare(m: Machine, env: dict[str, str], quick: dict[str, list[list[str]]]) -> str | None:
    """None when the fast path plans as the full path does (or hands over); else what
    differs."""
    try:
        cfg = start._config(env)
        source, rank, size, _ = start._rank(env)
        mine = fast.plan(fast._Machine(quick), env, cfg, source, rank, size)
    except start.Handover:
        return None
    full = full_plan(m, env)
    if mine["status"] == "skipped":
        if full.bound or full.problem is not None:
            return f"fast skipped, full {full.status}: {full.reason}"
        return None
    if not full.bound:
        return f"fast bound, full skipped: {full.reason}"
    if full.unmet:  # the full path says those in a line: the fast path must hand them over
        return f"fast bound silently, full says {full.unmet}"
    got = {k: mine[k] for k in FIELDS}
    want = {k: getattr(full, k) for k in FIELDS}
    if mine["device"] != (full.device.pci if full.device else ""):
        return f"device {mine['device']} vs {full.device}"
    return None if got == want else f"{ {k: (got[k], want[k]) for k in got if got[k] != want[k]} }"


def _memory(spec: synth.Spec, name: str) -> Machine:
    tree = build(spec)
    return Machine(SysfsSource(MemoryRoot(tree.files, name, tree.links)))


def machines() -> Iterator[tuple[str, Machine]]:
    for name in EXAMPLES:
        yield name, Machine.from_example(name)
    yield "sst-bf", _memory(synth.sst_bf(), "sst-bf")
    yield "b300-2", _memory(synth.dgx_b300(priority=2), "b300-2")
    one = synth.one_node()
    one.cpu_files = {"acpi_cppc/highest_perf": {0: 30, 1: 40}}
    yield "one-node-fast", _memory(one, "one-node-fast")
    for capture in (
        "nvidiaDGX2.xml", "24em64t-2n6c2t-pci.xml", "power8gpudistances.xml",
        "irregulargroups-disallowed.xml", "nvidiagpunumanodes.tar.bz2",
        "40intel64-2g2n4c+pcilocality.tar.bz2", "32amd64-4s2n4c-cgroup2.tar.bz2",
        "32intel64-2p8co2t+8ve.tar.bz2", "20em64t-hybrid-1p6c2t+2ca4co1t.tar.bz2",
        "nvidia-dgx-gb10.xml", "memorysidecaches.tar.bz2",
    ):  # fmt: skip
        yield capture, Machine.from_capture(str(DATA / capture))


def _reservations() -> Iterator[dict[str, str]]:
    for reserve in ("1", "2/node", "1/rank", "3/rank", "64", "0"):
        for mode in ("node", "socket", "exclusive"):
            for priority in ("off", "rank", "main"):
                for rank, size in ((0, None), (1, "4"), (5, "8")):
                    env = {"LOCAL_RANK": str(rank), "NUMABIND_MODE": mode,
                           "NUMABIND_RESERVE": reserve, "NUMABIND_PRIORITY": priority}  # fmt: skip
                    if size is not None:
                        env["LOCAL_WORLD_SIZE"] = size
                    yield env


def environments(devices: int) -> Iterator[dict[str, str]]:
    sizes = [None, str(max(devices, 1)), "8", "two"]
    for priority in ("off", "rank", "main"):
        for mode in ("node", "socket", "exclusive"):
            for smt in ("all", "1"):
                for memory in ("preferred", "bind", "none", "local"):
                    if memory != "preferred" and (smt, priority) != ("all", "off"):
                        continue  # memory policies are independent of the core roles
                    for size in sizes:
                        for rank in range(min(int(size) if size and size.isdigit() else 8, 8)):
                            env = {"LOCAL_RANK": str(rank), "NUMABIND_MODE": mode}
                            env.update(NUMABIND_SMT=smt, NUMABIND_MEMORY=memory)
                            env["NUMABIND_PRIORITY"] = priority
                            if size is not None:
                                env["LOCAL_WORLD_SIZE"] = size
                            yield env
    yield from _reservations()
    for visible in ("1,0", "3", "GPU-00000002", "GPU-0000000", "7,6,5,4", "0,0", "9", ""):
        for rank in range(4):
            yield {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "4",
                   "CUDA_VISIBLE_DEVICES": visible}  # fmt: skip
    yield {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    yield {"LOCAL_RANK": "1", "ROCR_VISIBLE_DEVICES": "0"}
    yield {"LOCAL_RANK": "x"}


def test_every_fast_plan_is_the_planners() -> None:
    """Tens of thousands of plans: the fast path's equal the planner's, field by field,
    or it hands the rank over; what the planner could not do (a line says it) it always
    hands over.  And of the ranks the planner binds without a word it hands over only a
    small share (it is the common cases it is for)."""
    wrong: list[str] = []
    decided = handed = 0
    for name, m in machines():
        quick = quick_of(m, frozenset({"cores", "kinds"}))
        devices = len(quick.get("dev", []))
        for env in environments(devices):
            try:
                found = compare(m, env, quick)
            except Exception as err:  # a planner exception is a failure of this test
                found = f"{type(err).__name__}: {err}"
            if found is not None:
                wrong.append(f"{name} {env}: {found}")
            try:
                fast.plan(fast._Machine(quick), env, start._config(env), *start._rank(env)[:3])
                decided += 1
            except start.Handover:
                try:
                    full = full_plan(m, env)
                except Exception:
                    continue
                # a rank the full path binds without a word is what the fast path is for;
                # memory-only nodes (their spill rule) and GPU partitions it leaves to the
                # planner by design, and a test below shows each is handed over
                left = quick.get("memory-only") != [["-"]] or bool(quick.get("partitioned"))
                handed += full.bound and not full.unmet and not left
    assert not wrong, "\n".join(wrong[:20]) + f"\n({len(wrong)} in all)"
    assert decided > 10000 and handed < decided / 10, (decided, handed)


def test_the_fast_path_hands_over_what_it_does_not_decide() -> None:
    m = Machine.from_example("dgx-h100")
    quick = quick_of(m, frozenset())
    fm = fast._Machine(quick)
    cases = {
        "exclusive needs the cores": {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "8",
                                      "NUMABIND_MODE": "exclusive"},
        "priority needs the kinds": {"LOCAL_RANK": "1", "NUMABIND_PRIORITY": "rank"},
        "MIG": {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "MIG-GPU-1/0/0"},
        "Slurm GPUs": {"LOCAL_RANK": "0", "SLURM_STEP_GPUS": "0,1"},
        "core-complex": {"LOCAL_RANK": "0", "NUMABIND_MODE": "core-complex"},
    }  # fmt: skip
    for what, env in cases.items():
        with pytest.raises(start.Handover):
            fast.plan(fm, env, start._config(env), *start._rank(env)[:3])
            pytest.fail(f"{what}: decided")


def test_memory_only_nodes_and_gpu_partitions_go_to_the_planner() -> None:
    """A GH200 (its GPU's memory a node without CPUs: NUMABIND_SPILL keeps memory off it),
    and an MI300X in CPX (eight devices on one PCI function): the planner decides these;
    the fast path hands every rank over, saying why, and never binds one as a one-node
    machine's skip."""
    for name, why in (("gh200", "memory-only node"), ("mi300x-cpx", "compute partitions")):
        fm = fast._Machine(quick_of(Machine.from_example(name), frozenset()))
        for rank in range(2):
            env = {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2"}
            with pytest.raises(start.Handover, match=why):
                fast.plan(fm, env, start._config(env), *start._rank(env)[:3])
    plain = quick_of(Machine.from_example("dgx-h100"), frozenset())
    assert plain["memory-only"] == [["-"]] and "partitioned" not in plain


# --- real ranks, bound by each path ------------------------------------------------------------

PROBE = r"""
import json, os, sys
s = sys.modules["_numabind_start"]
from numabind import _kernel, _registry
pid = os.getpid()
entry = None
for parent, name, _ in _registry.candidates(os.environ, os.geteuid()):
    path = os.path.join(parent, name, str(pid))
    if os.path.exists(path):
        e = _registry.Entry.parse(open(path, "rb").read())
        entry = {k: (sorted(v) if isinstance(v, frozenset) else v) for k, v in
                 zip(e._fields, e._values()) if k not in ("pid", "start", "machine")}
        break
print(json.dumps({
    "handed_over": s.handed_over,
    "cpus": sorted(os.sched_getaffinity(0)),
    "policy": list(_kernel.get_mempolicy()[:1]) + [sorted(_kernel.get_mempolicy()[1])],
    "state": os.environ.get("NUMABIND_STATE"),
    "main": os.environ.get("NUMABIND_MAIN_CPUS", "").split(";")[1:],
    "entry": entry,
}))
"""


def _run(env: dict[str, str]) -> dict[str, object]:
    r = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    out["stderr"] = r.stderr
    return out


def _two_core_nodes(tmp: Path) -> str:
    spec = synth.two_nodes(4)
    spec.cpu_files = {"acpi_cppc/highest_perf": {0: 40, 1: 30}}
    return synth.write(spec, str(tmp / "two"))


@two_cpus
@pytest.mark.parametrize(
    "extra",
    [  # node 1 is CPU 1 but no memory node of this kernel: its ranks set no memory policy
        {"LOCAL_RANK": "1", "NUMABIND_MEMORY": "none"},
        {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"},
        {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "NUMABIND_MEMORY": "bind"},
        {"LOCAL_RANK": "0", "NUMABIND_MEMORY": "local"},
        {
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "2",
            "NUMABIND_MODE": "exclusive",
            "NUMABIND_MEMORY": "none",
        },
        {"LOCAL_RANK": "2", "CUDA_VISIBLE_DEVICES": "1,0", "NUMABIND_MEMORY": "none"},
        {"LOCAL_RANK": "0", "NUMABIND_MEMORY": "interleave", "NUMABIND_SMT": "1"},
        {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "NUMABIND_PRIORITY": "rank"},
        {"LOCAL_RANK": "1", "NUMABIND_MODE": "socket", "NUMABIND_MEMORY": "none"},
        {"OMPI_COMM_WORLD_LOCAL_RANK": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
        {"LOCAL_RANK": "0", "NUMABIND": "respect", "NUMABIND_STRICT": "1"},
    ],
)
def test_a_rank_bound_by_the_fast_path_is_bound_as_by_the_full_path(
    tmp_path: Path, extra: dict[str, str]
) -> None:
    """On this kernel (a two-node machine whose nodes are this host's CPUs 0 and 1): the
    full path without a cache, then the fast path cold (it reads the machine and writes
    the cache), then warm: the same CPUs, memory policy, registry entry (all but pid, start
    and where the machine came from), state and output; and the warm one decided alone."""
    root = _two_core_nodes(tmp_path)
    env = {**clean_env(NUMABIND="force", NUMABIND_SYSROOT=root), **extra}
    full = _run({**env, "NUMABIND_CACHE": "0"})
    assert full["handed_over"] == "NUMABIND_CACHE=0"
    cold = _run(env)
    warm = _run(env)
    assert warm["handed_over"] == "", warm["handed_over"]
    for got in (cold, warm):
        for key in ("cpus", "policy", "state", "main", "entry", "stderr"):
            assert got[key] == full[key], (key, got[key], full[key])


def test_the_one_node_test_reads_the_live_tree_and_captures_alike(tmp_path: Path) -> None:
    """Whether a machine has at most one node, as numabind._sources lists its nodes: the
    live /sys (listed directly) and captures (opened a part at a time, never through a
    link) give the answer the machine reader gives."""
    live = [n for n in os.listdir("/sys/devices/system/node") if n[4:].isdigit()]
    assert start._one_node("/") == (len(live) <= 1)
    one = synth.write(synth.one_node(), str(tmp_path / "one"))
    two = synth.write(synth.two_nodes(), str(tmp_path / "two"))
    assert start._one_node(one) and not start._one_node(two)
    linked = tmp_path / "linked"
    (linked / "sys" / "devices" / "system").mkdir(parents=True)
    (linked / "sys" / "devices" / "system" / "node").symlink_to(f"{two}/sys/devices/system/node")
    assert not start._one_node(str(linked))  # node1 seen through the link: on to the cache
    (tmp_path / "two" / "sys" / "devices" / "system" / "node" / "node1").rename(
        tmp_path / "node1-away"
    )
    assert not start._one_node(str(linked)), "a capture's node directory is not read through a link"


def test_only_a_rank_that_started_off_its_node_looks_for_early_pages() -> None:
    """numa_maps (the kernel walks every mapping: ~0.3 ms) is read unless the pages can
    only be on the rank's nodes already: it ran only on their CPUs under a policy that
    allocates on the running CPU's node, or its inherited policy names only those nodes."""
    home, nodes = frozenset({0, 1, 2, 3}), frozenset({0})
    inside = fast.started_inside
    assert inside(frozenset({0, 1}), (0, frozenset()), home, nodes)  # default, confined
    assert inside(home, (4, frozenset()), home, nodes)  # MPOL_LOCAL
    assert not inside(frozenset({0, 4}), (0, frozenset()), home, nodes)  # a CPU off the node
    assert not inside(frozenset(), (0, frozenset()), home, nodes)
    for code in (1, 2, 3, 5):  # preferred, bind, interleave, preferred-many: where they say
        assert inside(frozenset({9}), (code, frozenset({0})), home, nodes)
        assert not inside(frozenset({0}), (code, frozenset({1})), home, nodes)
        assert not inside(frozenset({0}), (code, frozenset()), home, nodes)
    assert not inside(frozenset({0}), (6, frozenset({0})), home, nodes)  # a policy it does not know


EARLY = (
    "import sys; seen = []\n"
    "def audit(event, args):\n"
    "    if event == 'open' and str(args[0]).endswith('/numa_maps'):\n"
    "        seen.append(args[0])\n"
    "sys.addaudithook(audit)\n"
    "import site; site.main()\n"
    "import json, os, _numabind_start as s\n"
    "print(json.dumps([s.handed_over, seen, sorted(os.sched_getaffinity(0))]))\n"
)


@two_cpus
def test_a_rank_confined_to_its_node_at_start_does_not_read_numa_maps(tmp_path: Path) -> None:
    """Rank 0's device is on node 0 (this host's CPU 0).  Started with both CPUs (as
    torchrun starts a rank) it may have faulted pages on node 1's CPU, so it reads
    numa_maps; started on CPU 0 alone (srun --cpu-bind, a pod's cpuset) under the default
    policy, every page is on node 0 already, and it does not.  Both end bound alike."""
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND_SYSROOT=root, LOCAL_RANK="0")
    _run(env)  # warm the cache
    outs = []
    for prefix in ([], ["taskset", "-c", "0"]):
        r = subprocess.run(
            [*prefix, sys.executable, "-S", "-c", EARLY],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout))
    (wide_why, wide_seen, wide_cpus), (tight_why, tight_seen, tight_cpus) = outs
    assert wide_why == tight_why == ""
    assert wide_seen == ["/proc/self/numa_maps"] and tight_seen == []
    assert wide_cpus == tight_cpus == [0]


POLICY_FIRST = (
    "import ctypes, os, sys\n"
    "nr = {'x86_64': 238, 'aarch64': 237}[os.uname().machine]\n"
    "mask = ctypes.c_ulong(1)\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "assert libc.syscall(ctypes.c_long(nr), ctypes.c_long(int(sys.argv[1])),\n"
    "                    ctypes.byref(mask), ctypes.c_ulong(65)) == 0, ctypes.get_errno()\n"
)


def _started_under(tmp_path: Path, mode: int, program: str, prefix: list[str], **knobs: str) -> Any:
    """What ``program`` prints in rank 0 of the two-node sysroot, started (warm, under
    ``-S``, after ``prefix``) with memory policy ``mode`` over node 0 set before the hook
    runs: the program's own ``site.main()`` runs it."""
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND_SYSROOT=root, LOCAL_RANK="0", **knobs)
    _run(env)  # warm the cache
    r = subprocess.run(
        [*prefix, sys.executable, "-S", "-c", POLICY_FIRST + program, str(mode)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@two_cpus
@pytest.mark.parametrize(
    ("mode", "reads"),
    [(2, False), (2 | 1 << 14, True), (2 | 1 << 15, True)],  # bind; relative; static nodes
)
def test_an_inherited_policy_with_mode_flags_is_looked_at(
    tmp_path: Path, mode: int, reads: bool
) -> None:
    """A rank on node 0's CPU that inherited MPOL_BIND of node 0 has its pages there; one
    whose policy carries MPOL_F_RELATIVE_NODES or MPOL_F_STATIC_NODES (numactl's ``+``
    and ``=`` nodes) names nodes get_mempolicy does not translate, so numa_maps is read."""
    why, seen, cpus = _started_under(tmp_path, mode, EARLY, ["taskset", "-c", "0"])
    assert why == "" and cpus == [0]
    assert seen == (["/proc/self/numa_maps"] if reads else []), seen


RESTORED = (  # after POLICY_FIRST, under -S: the hook runs once the policy is set
    "import site; site.main()\n"
    "import json, numabind, threading\n"
    "from numabind import _kernel, _startup\n"
    "bound = _kernel.get_mempolicy_mode()\n"
    "_startup.last.restore()\n"
    "after = _kernel.get_mempolicy_mode()\n"
    "seen = []\n"
    "def pinned():\n"
    "    with numabind.bind_thread(0):\n"
    "        pass\n"
    "    seen.append(_kernel.get_mempolicy_mode())\n"
    "t = threading.Thread(target=pinned); t.start(); t.join()\n"
    "print(json.dumps([[bound[0], sorted(bound[1])], [after[0], sorted(after[1])],\n"
    "                  [seen[0][0], sorted(seen[0][1])]]))\n"
)


@two_cpus
@pytest.mark.parametrize("cache", ["1", "0"])  # the fast path; the full path
@pytest.mark.parametrize("mode", [2, 2 | 1 << 14, 2 | 1 << 15])  # bind; relative; static
def test_restore_puts_back_an_inherited_policy_with_its_mode_flags(
    tmp_path: Path, mode: int, cache: str
) -> None:
    """numactl --membind=+0 (relative) or =0 (static) before the rank: restore() and the
    end of a bind_thread block put back that policy, flags and all (without them it would
    be bind over node 0 itself, which a cpuset whose first node is 1 does not mean)."""
    # no mask of its own: the hook replaces the policy, and restore() has one to put back
    bound, after, thread = _started_under(tmp_path, mode, RESTORED, [], NUMABIND_CACHE=cache)
    assert bound == [_kernel.POLICIES["preferred"].code, [0]]  # the hook's own policy
    assert after == [mode, [0]], (after, mode)
    assert thread == [mode, [0]], (thread, mode)


@two_cpus
def test_the_fast_path_hands_a_rank_whose_mask_is_set_to_the_full_path(tmp_path: Path) -> None:
    """A mask narrower than the cgroup (taskset, a launcher): the keep/replace rule and
    its line are the full path's; the result is the same as without a cache."""
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND_SYSROOT=root, LOCAL_RANK="0", NUMABIND_MEMORY="none")
    _run(env)  # warm the cache
    pinned = ["taskset", "-c", "1", sys.executable, "-c", PROBE]
    outs = []
    for cache in ("1", "0"):
        r = subprocess.run(
            pinned, capture_output=True, text=True, env={**env, "NUMABIND_CACHE": cache}
        )
        assert r.returncode == 0, r.stderr
        outs.append((json.loads(r.stdout), r.stderr))
    (fast, fast_err), (full, full_err) = outs
    assert "keep/replace" in str(fast["handed_over"])
    assert fast["cpus"] == full["cpus"] and fast_err == full_err


@two_cpus
def test_verbose_is_the_full_paths_and_says_where_the_machine_came_from(tmp_path: Path) -> None:
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, LOCAL_RANK="0")
    _run(env)
    loud = _run({**env, "NUMABIND_VERBOSE": "1"})
    line = str(loud["stderr"])
    assert line.count("\n") == 1 and "[machine: cache]" in line
    assert "planned by the full path: NUMABIND_VERBOSE='1'" in line
    off = _run({**env, "NUMABIND_VERBOSE": "1", "NUMABIND_CACHE": "0"})
    assert "[machine: sysfs (NUMABIND_CACHE=0)]" in str(off["stderr"])


@two_cpus
def test_the_fast_binding_is_numabinds_active_binding_later(tmp_path: Path) -> None:
    """numabind loaded after the fast path bound the process adopts that binding as the
    full path's own: the same Binding (its line, its plan's every field), the same intended
    CPUs for the guards and the same registry entry; apply() afterwards does what it does
    after the full path; restore() puts back what the process had and unregisters."""
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, LOCAL_RANK="0")
    _run(env)
    code = (
        "import json, os, sys, numabind\n"
        "from numabind import _apply, _startup\n"
        "b = _startup.last\n"
        "out = [sys.modules['_numabind_start'].handed_over, str(b), b.plan.to_dict(),\n"
        "       sorted(_apply.intended_cpus()), os.path.exists(b.registered or '')]\n"
        "again = numabind.apply()\n"
        "out.append(str(again))\n"
        "again.restore(); b.restore()\n"
        "out += [sorted(os.sched_getaffinity(0)), os.path.exists(b.registered or '')]\n"
        "print(json.dumps(out))\n"
    )
    outs = []
    for cache in ("0", "1"):
        r = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**env, "NUMABIND_CACHE": cache},
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout))
    full, fast = outs
    assert full[0] == "NUMABIND_CACHE=0" and fast[0] == ""
    assert fast[1:] == full[1:], (fast, full)
    assert fast[3] == [0] and fast[4] is True
    assert fast[6] == list(range(os.cpu_count() or 2)) and fast[7] is False


@two_cpus
def test_a_fast_rank_arms_the_guards_on_the_first_import_they_watch(tmp_path: Path) -> None:
    """The guards are armed when numpy (here) is first imported, not at start: an import
    that moves the mask is put back, as with the full path."""
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, LOCAL_RANK="0")
    _run(env)
    fake = tmp_path / "lib"
    fake.mkdir()
    (fake / "numpy.py").write_text("import os\nos.sched_setaffinity(0, {0, 1})\n")
    code = (
        "import os, sys\n"
        "assert not any(m.startswith('numabind') for m in sys.modules)\n"
        "import numpy\n"
        "print(sorted(os.sched_getaffinity(0)))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**env, "PYTHONPATH": str(fake)},
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[0]" and "numabind put them back" in r.stderr
