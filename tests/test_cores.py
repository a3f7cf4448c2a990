"""Which cores: core kinds read from the per-CPU files any user can read (real captures of
a Raptor Lake laptop and a DGX Spark, hwloc's export of the Spark with ``<cpukind>``, and
generated machines with CPPC rankings and SST-BF base frequencies), the priority roles
(NUMABIND_PRIORITY=rank|main) checked against the documented rule, and what a thread
pinned to one priority core hands to the threads and processes it starts."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import synth
from numabind import ConfigError, plan_for
from numabind._devices import resolve
from numabind._environ import Config
from numabind._model import KIND_FILES, CoreKinds
from numabind._plan import Plan, Request, groups, nothing_to_bind, plan
from numabind._sources import SysfsSource
from numabind._sysfs import format_cpulist
from numabind._topology import Machine
from numabind.capture._examples import MemoryRoot, build
from numabind.cli._show import kinds_lines, plans_for, show_text
from support import clean_env, two_cpus

DATA = Path(__file__).parent / "data" / "hwloc"
MakeMachine = Callable[[synth.Spec], Machine]


def _memory(spec: synth.Spec, name: str = "generated") -> Machine:
    tree = build(spec)
    return Machine(SysfsSource(MemoryRoot(tree.files, name, tree.links)))


def _plans(
    m: Machine,
    size: int,
    priority: str,
    mode: str = "node",
    reserve: str = "",
    smt: str = "all",
) -> list[Plan]:
    from numabind._environ import parse_reserve

    visible = resolve(m, {})
    return [
        plan(
            m,
            Request(
                local_rank=r,
                local_world_size=size,
                rank_source="LOCAL_RANK",
                visible=visible,
                mode=mode,
                reserve=parse_reserve(reserve),
                smt=smt,
                priority=priority,
                budget=False,
            ),
        )
        for r in range(size)
    ]


def _levels(k: CoreKinds) -> list[tuple[int, str]]:
    return [(v, format_cpulist(c)) for v, c in k.levels]


# --- kinds, from real captures -----------------------------------------------------------


def test_a_real_raptor_lake_capture_ranks_its_cores_by_cppc_highest_perf() -> None:
    """MANIFEST #12: CPPC highest_perf 67 on the two Turbo Boost Max 3.0 cores (4-5, 8-9),
    64 on the other P-cores, 39 on the E-cores; the first file that differs decides."""
    m = Machine.from_capture(str(DATA / "20em64t-hybrid-1p6c2t+2ca4co1t.tar.bz2"))
    k = m.core_kinds
    assert k.source == "acpi_cppc/highest_perf" and k.distinct
    assert _levels(k) == [(67, "4-5,8-9"), (64, "0-3,6-7,10-11"), (39, "12-19")]
    assert m.priority_cpus(0) == frozenset({4, 5, 8, 9})
    assert not m.warnings
    assert "3 kinds by acpi_cppc/highest_perf: priority 4-5,8-9 (67)" in m.describe_kinds(
        m.online_cpus
    )


def test_a_real_dgx_spark_capture_and_its_hwloc_export_agree_on_the_big_cores() -> None:
    """MANIFEST #13/#14: the tarball's CPPC values rank all 20 cores (five values); hwloc's
    export groups them into two cpukinds.  The fastest CPPC core lies among hwloc's big
    ones, and hwloc's priority kind is exactly the Cortex-X925 cores."""
    tar = Machine.from_capture(str(DATA / "nvidia-dgx-gb10.tar.bz2"))
    xml = Machine.from_capture(str(DATA / "nvidia-dgx-gb10.xml"))
    assert tar.core_kinds.source == "acpi_cppc/highest_perf"
    assert [v for v, _ in tar.core_kinds.levels] == [154, 153, 150, 110, 108]
    assert xml.core_kinds.source == "hwloc cpukinds"
    assert _levels(xml.core_kinds) == [(997, "5-9,15-19"), (718, "0-4,10-14")]
    big = xml.priority_cpus(0)
    assert big == frozenset(range(5, 10)) | frozenset(range(15, 20))
    assert tar.priority_cpus(0) == frozenset({19}) and tar.priority_cpus(0) <= big
    big_by_cppc = frozenset().union(*(c for v, c in tar.core_kinds.levels if v >= 150))
    assert big_by_cppc == big


@pytest.mark.parametrize(
    "name", ["24em64t-2n6c2t-pci.xml", "nvidiaDGX2.xml", "32amd64-4s2n4c-cgroup2.tar.bz2"]
)
def test_captures_without_kind_files_are_one_kind_said_once(name: str) -> None:
    m = Machine.from_capture(str(DATA / name))
    k = m.core_kinds
    assert not k.distinct and k.source == "" and len(k.levels) == 1
    assert all(m.priority_cpus(n.id) == frozenset() for n in m.cpu_nodes)
    lines = kinds_lines(m)
    assert len(lines) == 1 and lines[0].startswith("  cores: one kind: no file tells them apart")


# --- kinds, from generated machines --------------------------------------------------------


def test_generated_cppc_rankings_mark_exactly_the_priority_cores() -> None:
    m = Machine.from_example("dgx-b300")
    k = m.core_kinds
    assert k.source == "acpi_cppc/highest_perf" and [v for v, _ in k.levels] == [46, 39]
    for node, first in ((0, 0), (1, 64)):
        fast = {first + 8 * i for i in range(8)}
        assert m.priority_cpus(node) == frozenset(fast | {c + 128 for c in fast})


def test_generated_sst_bf_base_frequencies_mark_the_high_priority_cores() -> None:
    """CPPC absent and cpuinfo_max_freq the same everywhere: base_frequency decides."""
    m = _memory(synth.sst_bf())
    k = m.core_kinds
    assert k.source == "cpufreq/base_frequency"
    assert k.looked == ("cpufreq/base_frequency", "cpufreq/cpuinfo_max_freq")[:1]
    assert m.priority_cpus(0) == frozenset({0, 4, 8, 12, 16, 20})
    assert m.priority_cpus(1) == frozenset({24, 28, 32, 36, 40, 44})


def test_files_that_say_nothing_are_passed_over_in_order() -> None:
    """An equal CPPC value everywhere says nothing: the next file in KIND_FILES decides,
    and what was read to decide is recorded."""
    spec = synth.sst_bf()
    spec.cpu_files["acpi_cppc/highest_perf"] = dict.fromkeys(range(48), 40)
    k = _memory(spec).core_kinds
    assert k.source == "cpufreq/base_frequency"
    assert k.looked == ("acpi_cppc/highest_perf", "cpufreq/base_frequency")


def test_a_garbled_or_partial_kind_file_tells_nothing_and_says_so() -> None:
    spec = synth.sst_bf()
    spec.cpu_files["acpi_cppc/highest_perf"] = {c: 50 if c < 4 else 40 for c in range(48)}
    del spec.cpu_files["acpi_cppc/highest_perf"][30]  # one CPU lacks it
    tree = build(spec)
    tree.files["/sys/devices/system/cpu/cpu7/cpufreq/base_frequency"] = "2.7GHz\n"
    m = Machine(SysfsSource(MemoryRoot(tree.files, "garbled", tree.links)))
    k = m.core_kinds
    assert not k.distinct  # neither CPPC (cpu30 absent) nor base_frequency (cpu7) is used
    assert any("cpu30/acpi_cppc/highest_perf" in w for w in m.warnings)
    assert any("cpu7/cpufreq/base_frequency: '2.7GHz'" in w for w in m.warnings)


def test_a_file_the_first_cpu_lacks_is_not_opened_for_the_others() -> None:
    """One open per absent file, not one per CPU (the DGX H100 example has none)."""
    m = Machine.from_example("dgx-h100")
    before = m.source.budget.files
    assert not m.core_kinds.distinct
    assert m.source.budget.files - before <= len(KIND_FILES)


def test_every_kind_file_is_gathered() -> None:
    from numabind._sources import read_paths

    paths = read_paths()
    assert all(f"/sys/devices/system/cpu/{{cpu}}/{k.path}" in paths for k in KIND_FILES)


def test_gather_captures_the_kind_files_and_the_capture_reads_back_the_same(
    tmp_path: Path,
) -> None:
    """``numabind gather`` of a machine with CPPC and SST-BF files, read back by ``show
    --input``: the same kinds from the same file."""
    from numabind._roots import for_path
    from numabind.cli._gather import _write_tar

    root = synth.write(synth.sst_bf(), str(tmp_path / "m"))
    out = tmp_path / "capture.tar.gz"
    r = for_path(root)
    with out.open("wb") as f:
        _write_tar(f, r, {})
    r.close()
    live = Machine.from_root(root)
    again = Machine.from_capture(str(out))
    assert again.core_kinds == live.core_kinds and again.core_kinds.distinct


# --- the roles ----------------------------------------------------------------------------


def oracle_priority_share(m: Machine, node: int, position: int, count: int) -> frozenset[int]:
    """The documented rule for ``rank``: the node's priority cores as whole cores in
    order, split as exclusive mode splits a node (the remainder to the first ranks)."""
    cores: dict[frozenset[int], None] = {}
    fast = m.priority_cpus(node)
    for c in sorted(fast):
        cores.setdefault(frozenset((m.siblings_of(c) | {c}) & fast), None)
    ordered = list(cores)
    each, extra = divmod(len(ordered), count)
    start = position * each + min(position, extra)
    take = each + (1 if position < extra else 0)
    return frozenset().union(*ordered[start : start + take])


@pytest.mark.parametrize("mode", ["node", "exclusive", "socket"])
def test_rank_gives_each_rank_an_even_share_of_exactly_the_priority_cores(mode: str) -> None:
    m = Machine.from_example("dgx-b300")
    plans = _plans(m, 8, "rank", mode=mode)
    for node in (0, 1):
        mine = [p for p in plans if p.numa_node == node]
        assert len(mine) == 4
        union = frozenset().union(*(p.cpus for p in mine))
        assert union == m.priority_cpus(node), "exactly the priority cores, all of them"
        assert sum(len(p.cpus) for p in mine) == len(union), "disjoint"
        assert {len(p.cpus) for p in mine} == {4}, "even: 2 cores of 2 threads each"
        for i, p in enumerate(mine):
            assert p.cpus == oracle_priority_share(m, node, i, 4)
            assert p.priority_cpus == m.priority_cpus(node) and not p.main_cpus


def test_rank_shares_sst_bf_cores_evenly_and_says_nothing_when_they_suffice() -> None:
    m = _memory(synth.sst_bf())
    plans = _plans(m, 4, "rank")
    assert [format_cpulist(p.cpus) for p in plans] == ["0,4,8", "12,16,20", "24,28,32", "36,40,44"]
    assert not any("priority" in n for p in plans for n in p.notes)


def test_main_pins_one_distinct_priority_core_per_rank_and_keeps_the_node() -> None:
    m = Machine.from_example("dgx-b300")
    plans = _plans(m, 8, "main")
    for p in plans:
        node = m.node(p.numa_node or 0)
        assert node is not None and p.cpus == node.cpus, "the process keeps the whole node"
        assert p.main_cpus <= m.priority_cpus(p.numa_node or 0) and len(p.main_cpus) == 2
    mains = [p.main_cpus for p in plans]
    assert len(set(mains)) == 8, "one core each"
    assert plans[0].placement.main_cpus == plans[0].main_cpus


def test_fewer_priority_cores_than_ranks_are_shared_and_said() -> None:
    m = _memory(synth.dgx_b300(priority=2))
    rank = _plans(m, 8, "rank")
    main = _plans(m, 8, "main")
    for plans in (rank, main):
        assert any("2 priority cores for 4 ranks" in n for n in plans[0].notes), plans[0].notes
    assert rank[0].cpus == rank[2].cpus and rank[0].cpus != rank[1].cpus
    assert main[0].main_cpus == main[2].main_cpus


def test_a_machine_without_the_files_keeps_the_modes_cpus_with_one_note() -> None:
    m = Machine.from_example("dgx-h100")
    off, on = _plans(m, 8, "off"), _plans(m, 8, "rank")
    assert [p.cpus for p in off] == [p.cpus for p in on]
    notes = [n for n in on[0].notes if "NUMABIND_PRIORITY" in n]
    assert len(notes) == 1 and "no priority cores on node 0 (one kind" in notes[0]
    text = "\n".join(show_text(m, resolve(m, {}), on, "test", "node", "preferred"))
    assert text.count("cores: one kind: no file tells them apart") == 1, "one line for the machine"
    assert "cores of node" not in text


def test_reserve_and_smt_1_compose_with_rank() -> None:
    """The reservation comes from the standard cores (the priority ones stay for compute)
    and SMT 1 keeps one thread of each priority core."""
    m = Machine.from_example("dgx-b300")
    plans = _plans(m, 8, "rank", reserve="2/node", smt="1")
    for p in plans:
        assert p.helpers and not p.helpers & m.priority_cpus(p.numa_node or 0)
        assert len(p.cpus) == 2 and all(c < 128 for c in p.cpus), "one thread per core"
        assert p.cpus <= m.priority_cpus(p.numa_node or 0)
    # a reservation large enough to reach the priority cores takes the standard ones first
    wide = _plans(m, 8, "rank", reserve="60/node")
    assert any("reserved CPUs" in n for n in wide[0].notes)
    node0 = m.priority_cpus(0)
    assert len(wide[0].helpers & node0) == 8, "60 of 64 cores: 56 standard, then 4 priority"


def test_main_in_exclusive_mode_takes_a_core_of_its_own_share() -> None:
    m = Machine.from_example("dgx-b300")
    for p in _plans(m, 8, "main", mode="exclusive"):
        assert p.main_cpus and p.main_cpus <= p.cpus & m.priority_cpus(p.numa_node or 0)


def test_one_node_machines_bind_only_where_their_cores_differ() -> None:
    plain = Machine.from_example("one-node")
    assert nothing_to_bind(plain, "node", priority="rank")
    skipped = _plans(plain, 1, "rank")[0]
    assert not skipped.bound and "cores are one kind" in skipped.reason
    spec = synth.one_node()
    spec.cpu_files = {"acpi_cppc/highest_perf": {0: 30, 1: 40}}
    fast = _memory(spec)
    assert not nothing_to_bind(fast, "node", priority="rank") and nothing_to_bind(fast, "node")
    p = _plans(fast, 1, "rank")[0]
    assert p.bound and p.cpus == frozenset({1})
    q = _plans(fast, 1, "main")[0]
    assert q.cpus == frozenset({0, 1}) and q.main_cpus == frozenset({1})


def test_a_cpu_only_job_on_the_spark_export_shares_its_big_cores() -> None:
    m = Machine.from_capture(str(DATA / "nvidia-dgx-gb10.xml"))
    plans = _plans(m, 2, "rank")
    assert all(p.bound for p in plans)
    assert frozenset().union(*(p.cpus for p in plans)) == m.priority_cpus(0)
    assert len(plans[0].cpus) == len(plans[1].cpus) == 5


def test_the_role_is_a_binding_knob_and_an_api_keyword() -> None:
    assert Config.from_env({"NUMABIND_PRIORITY": "Rank"}).priority == "rank"
    with pytest.raises(ConfigError, match="NUMABIND_PRIORITY='fast'"):
        Config.from_env({"NUMABIND_PRIORITY": "fast"})
    m = Machine.from_example("dgx-b300")
    p = plan_for(local_rank=1, local_world_size=8, machine=m, environ={}, priority="main")
    assert p.main_cpus == frozenset({8, 136}) and p.to_dict()["main_cpus"] == [8, 136]
    env = plan_for(
        local_rank=1, local_world_size=8, machine=m, environ={"NUMABIND_PRIORITY": "rank"}
    )
    assert env.cpus == frozenset({16, 24, 144, 152})
    with pytest.raises(ConfigError):
        plan_for(local_rank=0, machine=m, environ={}, priority="fastest")


def test_show_lists_kinds_marks_priority_cores_and_the_main_column() -> None:
    from numabind.cli._picture import build as picture
    from numabind.cli._picture import draw
    from numabind.cli._svg import render

    m = Machine.from_example("dgx-b300")
    visible, plans, source = plans_for(m, {}, 8, "node", "preferred", priority="main")
    text = show_text(m, visible, plans, source, "node", "preferred")
    assert sum("2 kinds by acpi_cppc/highest_perf" in line for line in text) == 2
    assert any("main thread" in line for line in text)
    lines = draw(picture(m, plans, "node", "preferred"))
    marks = [line for line in lines if line.endswith("priority cores")]
    assert marks and "@" in marks[0] and "^" in "".join(marks)
    assert any(line.startswith("  ^  a priority core") for line in lines)
    svg = render(m, plans)
    assert svg.count('data-priority="1"') == len(m.priority_cpus(0) | m.priority_cpus(1))


def test_groups_of_a_share_are_whole_cores() -> None:
    m = Machine.from_example("dgx-b300")
    for p in _plans(m, 8, "rank"):
        assert all(len(g) == 2 for g in groups(p.cpus, m.siblings_of))


# --- what the pinned thread hands down (a real process on this kernel) ---------------------

PROBE = r"""
import json, os, subprocess, sys, threading
out = {"main": sorted(os.sched_getaffinity(0))}
box = {}
def run():
    box["thread"] = sorted(os.sched_getaffinity(0))
    def inner():
        box["grandchild"] = sorted(os.sched_getaffinity(0))
    t2 = threading.Thread(target=inner); t2.start(); t2.join()
t = threading.Thread(target=run); t.start(); t.join()
out.update(box)
import time
end = time.monotonic() + 10  # a joined thread's task may outlive join() briefly, and
while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < end:  # 3.12+ warns
    time.sleep(0.01)  # at a fork while another task is there
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, json.dumps(sorted(os.sched_getaffinity(0))).encode()); os._exit(0)
os.waitpid(pid, 0); out["fork"] = json.loads(os.read(r, 4096))
out["python child"] = json.loads(subprocess.run(
    [sys.executable, "-c", "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))"],
    capture_output=True, text=True, check=True).stdout)
status = subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout
out["native child"] = [line.split()[1] for line in status.splitlines()
                       if line.startswith("Cpus_allowed_list")][0]
print(json.dumps(out))
"""


@two_cpus
def test_main_pins_the_main_thread_and_what_it_starts_gets_the_whole_set(tmp_path: Path) -> None:
    """A one-node machine of CPUs 0-1 where CPU 1 is the faster kind.  The rank's main
    thread runs on CPU 1 alone; threads (and their threads), a forked child and a Python
    child it starts run on 0-1.  A non-Python child keeps CPU 1: the kernel's rule that
    ``main`` works around in Python, shown here as the documented gap."""
    spec = synth.one_node()
    spec.cpu_files = {"acpi_cppc/highest_perf": {0: 30, 1: 40}}
    root = synth.write(spec, str(tmp_path / "m"))
    env = clean_env(
        LOCAL_RANK="0",
        NUMABIND="force",
        NUMABIND_SYSROOT=root,
        NUMABIND_PRIORITY="main",
        NUMABIND_MEMORY="none",
        NUMABIND_REGISTRY=str(tmp_path),
    )
    r = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0 and r.stderr == "", r.stderr
    got = json.loads(r.stdout)
    assert got["main"] == [1]
    assert got["thread"] == got["grandchild"] == got["fork"] == got["python child"] == [0, 1]
    assert got["native child"] == "1"
    off = subprocess.run(
        [sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env={**env, "NUMABIND_PRIORITY": "rank"},
        timeout=120,
    )
    assert json.loads(off.stdout)["main"] == json.loads(off.stdout)["thread"] == [1]


@two_cpus
def test_check_says_whether_the_main_thread_is_on_a_priority_core(tmp_path: Path) -> None:
    # node 0 (this host's CPUs 0-1, CPU 1 the faster kind) holds the GPU; node 1 exists only
    # in the generated tree, so that the rank is bound with the role off too
    spec = synth.Spec(
        nodes=[[0, 1], [2, 3]], package_of_node=[0, 1], gpus=[synth.Gpu("0000:01:00.0", 0)]
    )
    spec.cpu_files = {"acpi_cppc/highest_perf": {0: 30, 1: 40, 2: 30, 3: 30}}
    root = synth.write(spec, str(tmp_path / "m"))
    env = clean_env(
        LOCAL_RANK="0",
        NUMABIND="force",
        NUMABIND_SYSROOT=root,
        NUMABIND_MEMORY="none",
        NUMABIND_REGISTRY=str(tmp_path),
    )
    code = (
        "import json, os, subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-m', 'numabind', 'check', '--pid', str(os.getpid()),"
        " '--json'], capture_output=True, text=True)\n"
        "p = json.loads(r.stdout)['processes'][0]\n"
        "print(json.dumps([p['main_on_priority'], p['priority_cpus'], p['notes'], p['problems']]))"
    )
    for role, expected in (("main", True), ("off", False)):
        r = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**env, "NUMABIND_PRIORITY": role},
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        on, prio, notes, problems = json.loads(r.stdout)
        assert (on, prio, problems) == (expected, [1], []), (role, notes, problems)
        text = " ".join(notes)
        assert ("a priority core" in text) and (("not a priority core" in text) != expected)
