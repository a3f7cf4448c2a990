"""The truth, now: no rank binds, and no verifier reports, from a machine that changed
after it was read (issue 44).

A machine read once per node is only as true as what can change under it.  Every cached
fact says how long it stays true (``_facts.FACTS``'s ``truth``); the changeable ones are
witnessed, and every rank compares the witnesses before it replays an answer.  Played on a
capture (``NUMABIND_SYSROOT``: the same reader as the live tree, and this host's kernel for
the binding): an answer is written, the capture is changed deep inside, and the next rank
follows the capture; ``show`` reads it as it is now.  The same changes on a real kernel are
in the VM tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import _numabind_base as base
import synth
from numabind import _cache, _facts
from numabind._sources import SysfsSource
from support import clean_env, two_cpus

PROBE = (
    "import json, os, sys\n"
    "s = sys.modules['_numabind_start']\n"
    "full = getattr(sys.modules.get('numabind._startup'), 'last', None)\n"
    "print(json.dumps({'handed_over': s.handed_over, 'cpus': sorted(os.sched_getaffinity(0)),"
    " 'state': os.environ.get('NUMABIND_STATE'),"
    " 'machine': full.machine if full is not None else s.machine_origin}))\n"
)


def _rank(root: str, **extra: str) -> dict[str, object]:
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, NUMABIND_MEMORY="none", **extra)
    r = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120
    )
    assert r.returncode == 0, r.stderr
    out: dict[str, object] = json.loads(r.stdout)
    return out


def _machine(tmp: Path) -> str:
    # two nodes that are this host's CPUs 0 and 1: GPUs 0 and 2 on node 0, 1 and 3 on node 1
    return synth.write(synth.two_nodes(4), str(tmp / "two"))


def test_every_fact_says_how_long_it_stays_true() -> None:
    """A fact with no class cannot be made (``truth`` has no default), and the classes are
    the four the cache knows; every witnessed fact but the cpuset's names its witnesses."""
    for fact in _facts.FACTS:
        assert fact.truth in _facts.TRUTHS, fact
        if fact.truth == "witnessed" and fact.method != "allowed":
            assert fact.witness is not None, fact.method
    with pytest.raises(TypeError, match="truth"):
        _facts.Fact(method="new_fact")
    methods = {m for m in dir(SysfsSource) if not m.startswith("_")}
    asked = {f.method for f in _facts.FACTS}
    assert asked <= methods


def test_a_live_fact_is_never_kept(tmp_path: Path) -> None:
    """numa_balancing is read every time: a machine file holds no answer of it, and a
    reading from the file answers what the tree says now."""
    root = _machine(tmp_path)
    sysctl = Path(root, "proc/sys/kernel/numa_balancing")
    sysctl.write_text("1\n")
    env = {"NUMABIND_REGISTRY": str(tmp_path / "base")}
    (tmp_path / "base").mkdir()
    first = _cache.open_machine(root, env)
    assert first.machine.numa_balancing == 1
    first.machine.close()
    found = _cache.lookup(env, root)
    assert found.data and b"numa_balancing" not in found.data, found.why
    sysctl.write_text("0\n")
    again = _cache.open_machine(root, env)
    assert again.origin == "cache" and again.machine.numa_balancing == 0
    again.machine.close()


def test_a_witness_tells_a_file_that_says_dash_from_an_absent_one(tmp_path: Path) -> None:
    """Present contents are marked (``=``), so no file can say what absence says (``-``):
    a file that read ``-`` and is then removed, or a meminfo with no MemTotal line that is
    then removed, is a changed machine."""
    sysroot = str(tmp_path)  # the files one level down: the root's own time is in the key
    (tmp_path / "w").mkdir()
    dash, meminfo = tmp_path / "w/dash", tmp_path / "w/meminfo"
    dash.write_text("-\n")
    meminfo.write_text("Node 0 MemFree: 1 kB\n")
    assert base.witness("f", str(dash)) == "=-"
    assert base.witness("m", str(meminfo)) == "=?"
    assert base.witness("f", str(tmp_path / "absent")) == "-"
    assert base.witness("m", str(tmp_path / "absent")) == "-"
    assert base.witness("l", str(tmp_path / "absent")) == "-"
    found = [(k, f"/w/{p.name}", base.witness(k, str(p))) for k, p in (("f", dash), ("m", meminfo))]
    lines = base.machine_head(base.machine_key(sysroot), found)
    assert base.machine_holds(lines, sysroot, 1) == (3, "")
    for path in (dash, meminfo):
        kept = path.read_bytes()
        path.unlink()
        _, why = base.machine_holds(lines, sysroot, 1)
        assert f"/w/{path.name} says otherwise" in why
        path.write_bytes(kept)


def test_a_reading_too_large_to_witness_is_not_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory of more names than the walk lists, or a file larger than one read, says
    ``+``: no reading is kept with it (a truncated witness would hold while what lies past
    it changes), and a file that says it anyway is refused."""
    root = _machine(tmp_path)
    source = _facts.Recording(_cache._live(root))
    source.node(0, source.online_cpus(), source.node_ids())  # witnessed by the node list
    assert _facts.witnesses(source, root) is not None
    nodes = Path(root, "sys/devices/system/node")
    monkeypatch.setattr(base, "LIST_CAP", len(os.listdir(nodes)))
    whole = base.witness("l", str(nodes))  # as many names as the cap: all of them
    assert whole[:1] == "=" and "node1" in whole.split(","), whole
    monkeypatch.setattr(base, "LIST_CAP", len(os.listdir(nodes)) - 1)
    assert base.witness("l", str(nodes)) == "+"
    assert _facts.witnesses(source, root) is None
    monkeypatch.undo()
    monkeypatch.setattr(base, "WITNESS_CAP", 2)
    assert base.witness("f", str(nodes / "node0/cpulist")) in ("=0", "+")
    Path(nodes, "node0/cpulist").write_text("0-1\n")
    assert base.witness("f", str(nodes / "node0/cpulist")) == "+"
    assert _facts.witnesses(source, root) is None
    lines = [f"key {base.machine_key(root)}", f"w f {base.escape('/sys/x')} +"]
    Path(root, "sys/x").write_text("x" * 4)  # too large now too: it would "hold"
    assert "/sys/x says otherwise" in base.machine_holds(lines, root, 1)[1]


@two_cpus
def test_a_gpu_moved_to_another_node_inside_a_capture_is_followed(tmp_path: Path) -> None:
    """Root rewrites a GPU's numa_node (a firmware workaround), deep inside the capture:
    the next rank's answer is refused for the change it names and the rank binds to the
    node the file says now (fails on a50e42a, whose capture key was its top directory)."""
    root = _machine(tmp_path)
    assert _rank(root, LOCAL_RANK="0")["cpus"] == [0]
    warm = _rank(root, LOCAL_RANK="0")
    assert warm["handed_over"] == "" and warm["cpus"] == [0], warm
    node_file = Path(root, "sys/bus/pci/devices/0000:01:00.0/numa_node")
    node_file.write_text("1\n")
    moved = _rank(root, LOCAL_RANK="0")
    assert "0000:01:00.0/numa_node" in str(moved["handed_over"]), moved
    assert moved["cpus"] == [1], moved
    assert _rank(root, LOCAL_RANK="0")["handed_over"] == "", "the new reading is kept"
    node_file.write_text("0\n")
    back = _rank(root, LOCAL_RANK="0")
    assert "numa_node" in str(back["handed_over"]) and back["cpus"] == [0], back


@two_cpus
def test_a_gpu_removed_from_a_capture_is_followed(tmp_path: Path) -> None:
    """A GPU gone from the PCI bus: rank 1 of two no longer goes to the node of a GPU that
    is not there; rescanned, it is rank 1's again."""
    root = _machine(tmp_path)
    # rank 1 drives GPU 1 (0000:02:00.0, node 1)
    assert _rank(root, LOCAL_RANK="1")["cpus"] == [1]
    assert _rank(root, LOCAL_RANK="1")["handed_over"] == ""
    for gone_dir in ("sys/bus/pci/devices/0000:02:00.0", "proc/driver/nvidia/gpus/0000:02:00.0"):
        shutil.move(str(Path(root, gone_dir)), str(tmp_path / gone_dir.split("/")[0]))
    gone = _rank(root, LOCAL_RANK="1")
    # the driver's list is the witness of the GPUs it names (the bus is listed only where
    # the plan scanned it: a rank lists ~400 functions of a DGX otherwise)
    assert "/proc/driver/nvidia/gpus" in str(gone["handed_over"]), gone
    # three GPUs left (0000:01, 03, 04 on nodes 0, 0, 1): rank 1 drives 0000:03:00.0
    assert gone["cpus"] == [0], gone
    assert _rank(root, LOCAL_RANK="1")["handed_over"] == ""
    for back_dir in ("sys/bus/pci/devices/0000:02:00.0", "proc/driver/nvidia/gpus/0000:02:00.0"):
        shutil.move(str(tmp_path / back_dir.split("/")[0]), str(Path(root, back_dir)))
    back = _rank(root, LOCAL_RANK="1")
    assert "/proc/driver/nvidia/gpus says otherwise" in str(back["handed_over"]), back
    assert back["cpus"] == [1], back


def test_an_answers_file_witnesses_every_answer_it_keeps(tmp_path: Path) -> None:
    """Each rank writes the file's witnesses from what its own plan asked; a rank that read
    the machine itself (it waited too long for the node's reading) may have asked less
    than the rank whose answer it keeps (an AMD GPU's own partition files).  The file
    witnesses both, so the kept answer is not replayed after its own files changed."""
    from numabind import _replay

    root = tmp_path / "root"  # the files one level down: the root's own time is in the key
    (root / "w").mkdir(parents=True)
    mine, theirs = root / "w/mine", root / "w/theirs"
    mine.write_text("CPX\n")
    theirs.write_text("SPX\n")
    sysroot = str(root)
    env = {"NUMABIND_SYSROOT": sysroot}

    def found(*paths: Path) -> list[tuple[str, str, str]]:
        return [("f", f"/w/{p.name}", base.witness("f", str(p))) for p in paths]

    first = ["a", "i X =1", "=", "plan theirs", "."]
    second = ["a", "i X =2", "=", "plan mine", "."]
    assert _replay._store(env, sysroot, found(mine, theirs), first)
    where = _replay._store(env, sysroot, found(mine), second)  # asked less: its own file
    assert where
    lines, why = base.unframe(Path(where).read_bytes(), "answers")
    assert not why and lines.count("a") == 2, lines
    held: list[tuple[str, str, str]] = []
    _, why = base.machine_holds(lines, sysroot, base.WITNESSES_FROM["answers"], held)
    assert not why and {p for _, p, _ in held} == {"/w/mine", "/w/theirs"}, held
    stale = found(mine, theirs)  # what a third rank read before amd-smi switched it
    theirs.write_text("DPX\n")
    before = Path(where).read_bytes()
    third = ["a", "i X =3", "=", "plan stale", "."]
    assert _replay._store(env, sysroot, stale, third) is None, "made under what is gone"
    assert Path(where).read_bytes() == before
    theirs.write_text("SPX\n")
    theirs.write_text("CPX\n")  # amd-smi switched the kept answer's GPU
    _, why = base.machine_holds(lines, sysroot, base.WITNESSES_FROM["answers"])
    assert "/w/theirs says otherwise" in why
    os.unlink(where)


@two_cpus
def test_a_gpu_gone_from_the_bus_alone_is_seen_by_its_own_files(tmp_path: Path) -> None:
    """Where the driver's list still names a GPU that left the bus, the GPU's own node file
    is the witness that says so; and when it is back on the bus, the node file of the GPU
    the reading found missing says that too."""
    root = _machine(tmp_path)
    assert _rank(root, LOCAL_RANK="1")["cpus"] == [1]
    assert _rank(root, LOCAL_RANK="1")["handed_over"] == ""
    away = tmp_path / "away"
    shutil.move(str(Path(root, "sys/bus/pci/devices/0000:02:00.0")), str(away))
    gone = _rank(root, LOCAL_RANK="1")
    assert "0000:02:00.0/numa_node" in str(gone["handed_over"]), gone
    assert gone["state"] == "LOCAL_RANK=1||node|none#skipped", gone  # its GPU is not there
    shutil.move(str(away), str(Path(root, "sys/bus/pci/devices/0000:02:00.0")))
    # another answer's inputs (a size given), so that this rank plans from the machine
    # file the last reading wrote, which found the GPU missing: that is witnessed too
    back = _rank(root, LOCAL_RANK="1", LOCAL_WORLD_SIZE="4")
    assert back["cpus"] == [1], back
    assert "0000:02:00.0/numa_node says otherwise" in str(back["machine"]), back


@two_cpus
def test_a_gpu_added_to_a_bus_the_plan_scanned_is_followed(tmp_path: Path) -> None:
    """No driver's list (the driver not loaded): the plan scans the bus, and the bus's
    listing is then a witness, so a GPU that appears on it (hot-plugged, rescanned) is seen
    by the next rank, which plans with it."""
    root = _machine(tmp_path)
    shutil.rmtree(Path(root, "proc/driver/nvidia"))
    devices = Path(root, "sys/bus/pci/devices")
    shutil.move(str(devices / "0000:01:00.0"), str(tmp_path / "away"))
    # GPUs 0000:02 (node 1), 03 (node 0), 04 (node 1): rank 0 drives 0000:02:00.0
    assert _rank(root, LOCAL_RANK="0")["cpus"] == [1]
    assert _rank(root, LOCAL_RANK="0")["handed_over"] == ""
    shutil.move(str(tmp_path / "away"), str(devices / "0000:01:00.0"))
    back = _rank(root, LOCAL_RANK="0")
    assert "/sys/bus/pci/devices" in str(back["handed_over"]), back
    assert back["cpus"] == [0], "rank 0 drives 0000:01:00.0 again, on node 0"


@two_cpus
def test_a_new_job_of_the_same_shape_replays(tmp_path: Path) -> None:
    """A step id is only tested for presence by the planner (SLURM_STEP_ID: SLURM_LOCALID
    is a rank only inside a step), and a job id not read at all: a new job of the same shape
    replays; the step's absence is another answer."""
    root = _machine(tmp_path)
    job = {"SLURM_LOCALID": "0", "SLURM_STEP_ID": "1", "SLURM_JOB_ID": "4711"}
    first = _rank(root, **job)
    assert first["handed_over"] == "no answer yet" and first["cpus"] == [0], first
    again = _rank(root, **dict(job, SLURM_STEP_ID="2", SLURM_JOB_ID="4712"))
    assert again["handed_over"] == "" and again["cpus"] == [0], again
    other = _rank(root, SLURM_LOCALID="0", SLURM_JOB_ID="4712")
    assert other["handed_over"] == "no answer for this process's inputs yet", other


def test_an_answers_file_says_which_numabind_sysroot_value_it_answers() -> None:
    """The head both sides share (``_numabind_base.answers_head``): the sysroot the
    witnesses are read under, and the variable's value, compared as written, so that
    unset and a value of ``~`` are two values; a line out of shape is a damaged file."""
    key = base.machine_key("/x y")
    unset, tilde = base.answers_head(key, "/x y", None, []), base.answers_head(key, "/x y", "~", [])
    assert base.answers_sysroot(unset, None) == ("/x y", "")
    assert base.answers_sysroot(tilde, "~") == ("/x y", "")
    assert base.answers_sysroot(unset, "~") == (None, "another NUMABIND_SYSROOT")
    assert base.answers_sysroot(tilde, None) == (None, "another NUMABIND_SYSROOT")
    for line in ("sysroot /x", "sysroot %zz ~", "root /x ~"):
        assert base.answers_sysroot([unset[0], line], None) == (None, "a damaged answers file")
    assert len(unset) == base.WITNESSES_FROM["answers"]  # no witnesses given: none follow


def test_the_names_looked_up_and_not_found_are_one_test_either_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``absent`` holds while none of its names is set: by one set test where no name
    needed escaping, and name by name where one did (the same answer both ways)."""
    import _numabind_start as start

    odd = "X WEIRD\u00e9"  # a name escape() must escape: the slow path
    for name in ("NUMABIND_TEST_ABSENT", odd):
        monkeypatch.delenv(name, raising=False)
    plain = "NUMABIND_TEST_ABSENT OTHER_TEST_ABSENT"
    escaped = f"NUMABIND_TEST_ABSENT {base.escape(odd)}"
    assert "%" in escaped
    assert start._absent(plain, os.environ) and start._absent(escaped, os.environ)
    monkeypatch.setenv(odd, "1")
    assert start._absent(plain, os.environ) and not start._absent(escaped, os.environ)
    monkeypatch.setenv("NUMABIND_TEST_ABSENT", "")
    assert not start._absent(plain, os.environ) and not start._absent(escaped, os.environ)
    for present in (True, False):  # the same line both ways: a mapping without _data is
        if not present:  # read name by name
            monkeypatch.delenv("NUMABIND_TEST_ABSENT")
        assert start._absent(plain, os.environ) == start._absent(plain, dict(os.environ))
        assert start._absent(plain, os.environ) is not present


def _escaped_byte_by_byte(value: str) -> str:
    # the rule as first written: each byte of the UTF-8 outside the safe set as %XX
    safe = set(base._SAFE.encode())
    data = value.encode("utf-8", "surrogatepass")
    return "".join(chr(b) if b in safe else f"%{b:02x}" for b in data)


def test_escape_gives_each_text_its_own_token_and_unescape_takes_only_those() -> None:
    """Any text, a command line's or a file name's that is not UTF-8 too (Python holds its
    bytes as surrogates), is one token without spaces that reads back as itself; a
    malformed escape (not % and two lowercase hex digits, or bytes no text encodes to) is
    refused, not read as something else."""
    import random

    rng = random.Random(7)
    alphabet = [*"aZ09 %,=+-./:@_\n\t\x00", "\u00e9", "\u20ac", "\U0001f600"]
    alphabet += ["\udcff", "\udc80", "\ud800", "\udfff"]  # surrogateescape's and others
    samples = ["", "plain", "a b", "%", "%41", "-", "\udcff", "caf\u00e9 \udc80"]
    samples += ["".join(rng.choices(alphabet, k=rng.randrange(1, 24))) for _ in range(3000)]
    for value in samples:
        token = base.escape(value)
        assert " " not in token and "\n" not in token and token.isascii(), value
        assert token == _escaped_byte_by_byte(value), value
        assert base.unescape(token) == value, value
    for bad in ("%4", "%+f", "% f", "%zz", "%\u0663\u0663", "%4G", "%4A", "%ff"):
        with pytest.raises(ValueError):
            base.unescape(bad)


@two_cpus
def test_a_rank_whose_command_line_is_not_utf8_replays(tmp_path: Path) -> None:
    """A command line with a byte that is not UTF-8 (a file name from another locale) is an
    input like any other: kept, and replayed by the next such rank."""
    root = _machine(tmp_path)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, NUMABIND_MEMORY="none", LOCAL_RANK="1")
    argv = [sys.executable.encode(), bytes(script), b"caf\xe9"]

    def rank() -> dict[str, object]:
        r = subprocess.run(argv, capture_output=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        out: dict[str, object] = json.loads(r.stdout)
        return out

    assert rank()["handed_over"] == "no answer yet"
    again = rank()
    assert again["handed_over"] == "" and again["cpus"] == [1], again


@two_cpus
def test_a_sysroot_whose_path_is_not_utf8_is_cached_and_replayed(tmp_path: Path) -> None:
    """A capture under a directory whose name is not UTF-8: its key and its answers file
    hold the path escaped, so its ranks replay like any other's."""
    root = _machine(tmp_path / os.fsdecode(b"caf\xe9"))
    assert _rank(root, LOCAL_RANK="1")["handed_over"] == "no answer yet"
    again = _rank(root, LOCAL_RANK="1")
    assert again["handed_over"] == "" and again["cpus"] == [1], again


@two_cpus
def test_an_answer_with_a_token_escape_cannot_make_applies_nothing(tmp_path: Path) -> None:
    """A variable of the answer that does not unescape (a checksum-valid file, damaged by
    its own user) is seen before the CPUs are set: the full path does the rank."""
    root = _machine(tmp_path)
    assert _rank(root, LOCAL_RANK="1", OMP_NUM_THREADS="3")["cpus"] == [1]
    path = Path(f"/dev/shm/numabind-cache-{os.geteuid()}", base.answers_name(root))
    lines, why = base.unframe(path.read_bytes(), "answers")
    assert not why and any(line.startswith("env ") for line in lines), lines
    lines = [f"{line} %ZZ" if line.startswith("env ") else line for line in lines]
    path.write_bytes(base.frame("answers", lines[:-1]))
    damaged = _rank(root, LOCAL_RANK="1", OMP_NUM_THREADS="3")
    assert damaged["handed_over"] == "a damaged answer (env)", damaged
    assert damaged["cpus"] == [1], damaged


def test_the_code_is_in_the_key(tmp_path: Path) -> None:
    """A module added to (or replaced in) the package is another key: no answer of another
    numabind is replayed."""
    import numabind

    pkg = Path(numabind.__file__).parent
    before = base.machine_key("/")
    st = os.stat(pkg)
    try:
        os.utime(pkg, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        assert base.machine_key("/") != before
    finally:
        os.utime(pkg, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert base.machine_key("/") == before


def test_show_reads_the_capture_as_it_is_now(tmp_path: Path) -> None:
    """The verifiers never answer from the cache: show follows numa_balancing both ways
    with a cache file in place (fails on a50e42a, whose show read through the cache)."""
    root = _machine(tmp_path)
    sysctl = Path(root, "proc/sys/kernel/numa_balancing")
    seen = []
    for value in ("1", "0", "1"):
        sysctl.write_text(value + "\n")
        r = subprocess.run(
            [sys.executable, "-m", "numabind", "show", "--json"],
            capture_output=True,
            text=True,
            env=clean_env(NUMABIND_SYSROOT=root),
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        seen.append(json.loads(r.stdout)["numa_balancing"])
    assert seen == [1, 0, 1], seen
