"""The warm start (``_numabind_start.replay``) against the full path whose answer it replays.

The full path (``numabind._startup``) plans and binds a rank and keeps its answer
(``numabind._replay``); the next process with the same inputs on the unchanged machine
does exactly that again with the one applier, without loading numabind.  It is only right
if it gives exactly the binding the full path gives, and hands everything else over: real
ranks bound each way give the same CPUs, memory policy, registry entry, state and output;
an input it did not see, a process that is not as the answer's was, or an answers file
that is not exactly this user's and this machine's goes to the full path, saying why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import _numabind_base as base
import synth
from numabind import _kernel, _replay
from numabind._sysfs import format_cpulist, parse_cpulist
from support import clean_env, two_cpus


def test_cpu_lists_are_numabinds() -> None:
    """The start modules' CPU lists (written into answers, read back by the replay) are
    the package's: the same text both ways, the same refusals."""
    for cpus in ({0}, {0, 1, 2, 5, 7, 8, 9}, set(range(224)), set(), {16383}):
        text = base.cpulist(cpus)
        assert text == format_cpulist(cpus)
        assert base.parse_cpulist(text) == parse_cpulist(text)
    for bad in ("1-0", "a", "16384", "0-99999", "1,,2"):
        assert base.parse_cpulist(bad) is None


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
def test_a_replayed_rank_is_bound_as_by_the_full_path(
    tmp_path: Path, extra: dict[str, str]
) -> None:
    """On this kernel (a two-node machine whose nodes are this host's CPUs 0 and 1): the
    full path without a cache, then the full path cold (it reads the machine and keeps
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


def test_only_a_rank_that_started_off_its_node_looks_for_early_pages() -> None:
    """numa_maps (the kernel walks every mapping: ~0.3 ms) is read unless the pages can
    only be on the rank's nodes already: it ran only on their CPUs under a policy that
    allocates on the running CPU's node, or its inherited policy names only those nodes."""
    home, nodes = frozenset({0, 1, 2, 3}), frozenset({0})
    inside = _replay.started_inside
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
    outs = []
    for prefix in ([], ["taskset", "-c", "0"]):
        for _ in range(
            2
        ):  # the first keeps the answer (a start mask is an input), the next replays
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
    """What ``program`` prints in rank 0 of the two-node sysroot, started (the second
    time: warm, under ``-S``, after ``prefix``) with memory policy ``mode`` over node 0
    set before the hook runs: the program's own ``site.main()`` runs it."""
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND_SYSROOT=root, LOCAL_RANK="0", **knobs)
    for _ in range(
        2
    ):  # the first keeps its answer (the command line is an input), the next replays
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
@pytest.mark.parametrize("cache", ["1", "0"])  # the replay; the full path
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
def test_a_rank_whose_mask_is_set_is_not_the_answer_of_one_whose_was_not(tmp_path: Path) -> None:
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
    (warm, warm_err), (full, full_err) = outs
    assert "no answer" in str(warm["handed_over"])
    assert warm["cpus"] == full["cpus"] and warm_err == full_err


@two_cpus
def test_the_replayed_binding_is_numabinds_active_binding_later(tmp_path: Path) -> None:
    """numabind loaded after the replay bound the process adopts that binding as the
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
    for cache in ("0", "1", "1"):  # the full path; the one that keeps the answer; the replay
        r = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**env, "NUMABIND_CACHE": cache},
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout))
    full, _, warm = outs
    assert full[0] == "NUMABIND_CACHE=0" and warm[0] == ""
    assert warm[1:] == full[1:], (warm, full)
    assert warm[3] == [0] and warm[4] is True
    assert warm[6] == list(range(os.cpu_count() or 2)) and warm[7] is False


@two_cpus
def test_a_replayed_rank_arms_the_guards_on_the_first_import_they_watch(tmp_path: Path) -> None:
    """The guards are armed when numpy (here) is first imported, not at start (no numabind
    module is loaded before it): an import that moves the mask is put back, as with the
    full path."""
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
        "print(sorted(m for m in sys.modules if m.startswith('numabind')))\n"
        "seen = []\n"
        "sys.addaudithook(lambda e, a: seen.append(str(a[0])) if e == 'open' else None)\n"
        "from numabind import _apply; b = _apply.adopted()\n"  # the replayed binding, adopted
        "print(sorted(p for p in seen if p.startswith(os.environ['NUMABIND_SYSROOT'])))\n"
        "print(str(b), sorted(m for m in sys.modules if m.startswith('numabind')))\n"
    )
    runs = [
        subprocess.run(  # started on its node's CPU: no early pages to look for either
            ["taskset", "-c", "0", sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**env, "PYTHONPATH": str(fake), "NUMABIND_CACHE": cache},
            timeout=120,
        )
        for cache in ("1", "1")  # the full path keeps its answer; the next rank replays it
    ]
    assert runs[0].returncode == 1 and "AssertionError" in runs[0].stderr  # the full path's modules
    r = runs[1]
    assert r.returncode == 0, r.stderr
    cpus, _, read, adopted = r.stdout.strip().split("\n")
    assert read == "[]", f"adopting read the machine: {read}"
    assert cpus == "[0]" and "numabind put them back" in r.stderr
    benign = tmp_path / "benign"
    benign.mkdir()
    (benign / "numpy.py").write_text("")
    for _ in range(2):  # PYTHONPATH is an input (the full path reads it): warmed first
        quiet = subprocess.run(
            ["taskset", "-c", "0", sys.executable, "-c", code],
            capture_output=True,
            text=True,
            env={**env, "PYTHONPATH": str(benign)},
            timeout=120,
        )
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    at_numpy = quiet.stdout.split("\n")[1]  # (cpus, modules, files read, adopted)
    # a numpy that moves nothing: the first import the guards watch loads them and what
    # they look with, and no binder, planner, machine reader, device layer or cache
    guards = ["numabind", "numabind._guard", "numabind._output", "numabind._sysfs"]
    assert at_numpy == str(guards), at_numpy
    # adopting the binding reads no machine and plans nothing
    line, _, modules = adopted.partition(" [")
    assert line.startswith("local rank 0") and "CPUs 0" in line, line
    for reader in ("_topology", "_devices", "_startup"):
        assert f"numabind.{reader}'" not in modules, (reader, modules)


# --- the answers file: only this user's, only whole, only this machine's ----------------------


def _answers(root: str) -> Path:
    return Path(f"/dev/shm/numabind-cache-{os.geteuid()}", base.answers_name(root))


def _reheader(body: bytes) -> bytes:
    return f"numabind-answers {base.FORMAT} {len(body)} {base.checksum(body)}\n".encode() + body


@two_cpus
def test_an_answers_file_that_is_not_exactly_whole_is_not_replayed(tmp_path: Path) -> None:
    """Truncated, damaged, of another format, another sysroot decision, a link in its
    place, or larger than the cap: the rank goes to the full path, saying why, and is
    bound exactly as without a cache; the full path then writes a good file again."""
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, LOCAL_RANK="1", NUMABIND_MEMORY="none")
    full = _run({**env, "NUMABIND_CACHE": "0"})
    _run(env)
    path = _answers(root)
    good = path.read_bytes()
    assert _run(env)["handed_over"] == ""
    _, _, body = good.partition(b"\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(good)
    cases: dict[str, object] = {
        "truncated": good[:-5],
        "format 99, not": good.replace(f"answers {base.FORMAT} ".encode(), b"answers 99 ", 1),
        "not a numabind answers file": b"#!/bin/sh\n",
        "the sysroot's ownership changed": _reheader(
            body.replace(b"\nsysroot ", b"\nsysroot /x", 1)
        ),
        "made for another machine reading": _reheader(body.replace(b"boot=", b"boot=0", 1)),
        "is not a regular file": elsewhere,
        "is larger than 4 MiB": good + b"x" * (base.CACHE_CAP + 1),
    }
    for why, data in cases.items():
        path.unlink()
        if isinstance(data, Path):
            path.symlink_to(data)
        else:
            assert isinstance(data, bytes)
            path.write_bytes(data)
        got = _run(env)
        assert why in str(got["handed_over"]), (why, got["handed_over"])
        for key in ("cpus", "policy", "state", "entry", "stderr"):
            assert got[key] == full[key], (why, key)
        assert not path.is_symlink() and elsewhere.read_bytes() == good, "never written through"
        assert _run(env)["handed_over"] == "", f"after {why}: the full path wrote it again"


@two_cpus
def test_a_witness_that_says_otherwise_is_followed(tmp_path: Path) -> None:
    """The GPU of rank 1 moves to node 0 in the capture after its answer was kept (a
    witnessed file): the next rank plans again and binds where the GPU is now."""
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, LOCAL_RANK="1", NUMABIND_MEMORY="none")
    _run(env)
    assert _run(env)["cpus"] == [1]
    (Path(root) / "sys/bus/pci/devices/0000:02:00.0/numa_node").write_text("0\n")
    moved = _run(env)
    assert "the machine changed since it was read" in str(moved["handed_over"]), moved
    assert moved["cpus"] == [0]
    assert _run(env)["handed_over"] == "" and _run(env)["cpus"] == [0]


@two_cpus
def test_each_shape_of_rank_keeps_its_own_answer(tmp_path: Path) -> None:
    """Two ranks of a node (their own LOCAL_RANK) and one with another knob: each keeps
    its answer beside the others', and each replays its own."""
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, NUMABIND_MEMORY="none")
    shapes = [{"LOCAL_RANK": "0"}, {"LOCAL_RANK": "1"}, {"LOCAL_RANK": "1", "NUMABIND_SMT": "1"}]
    cold = [_run({**env, **shape}) for shape in shapes]
    assert all(
        "no answer" in str(c["handed_over"]) or "no cache" in str(c["handed_over"]) for c in cold
    )
    warm = [_run({**env, **shape}) for shape in shapes]
    assert [w["handed_over"] for w in warm] == ["", "", ""]
    assert [w["cpus"] for w in warm] == [c["cpus"] for c in cold] == [[0], [1], [1]]
    assert _answers(root).read_bytes().count(b"\na\n") == 3


def _kinds_read(function: str) -> set[str]:
    """The line kinds a function of the start module tells apart (``kind == "..."``,
    ``kind in (...)``), read from its source."""
    import ast
    import inspect

    import _numabind_start

    tree = ast.parse(inspect.getsource(getattr(_numabind_start, function)))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and getattr(node.left, "id", None) == "kind":
            for right in node.comparators:
                consts = right.elts if isinstance(right, ast.Tuple) else [right]
                out |= {c.value for c in consts if isinstance(c, ast.Constant)}
    return out


def _kinds_written(function: str) -> set[str]:
    """The line kinds a writer of ``numabind._replay`` starts its lines with: the first word
    of each line it puts in ``out`` (``out = [...]``, ``out += [...]``, ``out.append(...)``),
    read from its source, so that a line no test's rank happens to write is held too."""
    import ast
    import inspect

    from numabind import _replay

    def head(node: ast.expr) -> str:
        while isinstance(node, ast.BinOp):  # "argv " + ...
            node = node.left
        if isinstance(node, ast.JoinedStr):  # f"cpus {...}"
            node = node.values[0]
        assert isinstance(node, ast.Constant) and isinstance(node.value, str), ast.dump(node)
        return node.value.split(" ")[0]

    def lines(node: ast.expr) -> list[ast.expr]:
        if isinstance(node, ast.List):
            return list(node.elts)
        if isinstance(node, ast.ListComp):
            return [node.elt]
        return []

    tree = ast.parse(inspect.getsource(getattr(_replay, function)))
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(getattr(t, "id", None) == "out" for t in targets):
                found += lines(node.value)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "append"
            and getattr(node.func.value, "id", None) == "out"
        ):
            found += node.args
    return {head(line) for line in found}


@two_cpus
def test_the_answer_vocabulary_is_one_table_for_its_writer_and_its_reader(tmp_path: Path) -> None:
    """Every kind of line an answer holds is in ``_numabind_base``'s tables, the warm start
    tells each apart, and an output of a kind it does not know is handed over, not
    skipped (a replay that left out what the full path did would not be the full path's)."""
    assert _kinds_read("_input_holds") == set(base.ANSWER_INPUTS)
    assert _kinds_read("_apply") == set(base.ANSWER_OUTPUTS)
    assert _kinds_written("_lines_in") == set(base.ANSWER_INPUTS)
    assert _kinds_written("_lines_out") == set(base.ANSWER_OUTPUTS)
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, LOCAL_RANK="0")  # node 0: a policy
    _run(env)
    assert _run(env)["handed_over"] == ""
    lines, why = base.unframe(_answers(root).read_bytes(), "answers")
    assert not why
    body = lines[lines.index("a") :]
    inputs, outputs = body[1 : body.index("=")], body[body.index("=") + 1 : body.index(".")]
    assert {line.split(" ")[0] for line in inputs} <= set(base.ANSWER_INPUTS), inputs
    assert {line.split(" ")[0] for line in outputs} <= set(base.ANSWER_OUTPUTS), outputs
    assert {"cpus", "mempolicy", "plan", "env", "entry"} <= {o.split(" ")[0] for o in outputs}
    data = "\n".join([*lines[: lines.index("a")], *body[: body.index(".")], "later 1", "."])
    _answers(root).write_bytes(_reheader((data + "\n").encode()))
    newer = _run(env)
    assert newer["handed_over"] == "an answer this start module cannot replay (later 1)"
    assert newer["cpus"] == [0], newer  # the full path bound it


@two_cpus
def test_no_answer_is_kept_under_a_registry_base_of_the_users_choosing(tmp_path: Path) -> None:
    """NUMABIND_REGISTRY moves where the cache is (the full path's rule): the warm start
    never reads an answer there, so none is written, under /dev/shm or the base."""
    root = _two_core_nodes(tmp_path)
    where = tmp_path / "registry"
    where.mkdir()
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, LOCAL_RANK="0")
    env["NUMABIND_REGISTRY"] = str(where)
    for _ in range(2):
        got = _run(env)
        assert "NUMABIND_REGISTRY is set" in str(got["handed_over"]), got
    assert not _answers(root).exists()
    assert not list(where.rglob("answers-*")), list(where.rglob("*"))


def test_at_most_max_files_answers_files_are_kept(tmp_path: Path) -> None:
    """One answers file per NUMABIND_SYSROOT value: the oldest go past the cap."""
    from numabind import _cache

    mine = Path(f"/dev/shm/numabind-cache-{os.geteuid()}")
    before = {p.name for p in mine.glob("answers-*")} if mine.exists() else set()
    roots = []
    for i in range(_cache.MAX_FILES + 2):
        root = synth.write(synth.one_node(), str(tmp_path / f"r{i}"))
        roots.append(root)
        env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, LOCAL_RANK="0")
        subprocess.run([sys.executable, "-c", "pass"], env=env, check=True, timeout=120)
    kept = [p for p in mine.glob("answers-*") if "." not in p.name]
    assert len(kept) <= _cache.MAX_FILES, len(kept)
    assert _answers(roots[-1]).exists() and not _answers(roots[0]).exists()
    for p in kept:
        if p.name not in before:
            p.unlink()


@two_cpus
def test_ranks_that_start_at_once_each_keep_their_answer(tmp_path: Path) -> None:
    """Four ranks of a node start together, no cache: each keeps its answer (the file is
    written under its lock: none is lost to another rank's write), and the next four all
    replay."""
    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, NUMABIND_MEMORY="none")

    def together() -> list[dict[str, object]]:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", PROBE],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env={**env, "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "4"},
            )
            for r in range(4)
        ]
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            outs.append(json.loads(out))
        return outs

    cold = together()
    assert all(c["handed_over"] for c in cold)
    warm = together()
    assert [w["handed_over"] for w in warm] == [""] * 4
    assert [w["cpus"] for w in warm] == [c["cpus"] for c in cold]
    assert _answers(root).read_bytes().count(b"\na\n") == 4


@two_cpus
def test_an_answer_is_written_only_under_the_files_lock(tmp_path: Path) -> None:
    """Another rank holds the answers file's lock (it is writing): a rank that finishes
    meanwhile waits a bounded time, then keeps nothing rather than write over the other's
    answers; with the lock free it keeps its own."""
    from numabind import _cache

    root = _two_core_nodes(tmp_path)
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, NUMABIND_MEMORY="none")
    _run({**env, "LOCAL_RANK": "0"})  # the cache directory and the machine file
    fd, _, _ = base.open_cache_dir(env, True)
    assert fd is not None
    holder = _cache._Lock(fd, base.answers_name(root))
    assert holder.take()
    try:
        before = _answers(root).read_bytes()
        _run({**env, "LOCAL_RANK": "1"})
        assert _answers(root).read_bytes() == before, "written while another held the lock"
    finally:
        holder.close()
        os.close(fd)
    _run({**env, "LOCAL_RANK": "1"})
    assert _answers(root).read_bytes().count(b"\na\n") == 2


@two_cpus
def test_a_narrowed_cpuset_is_followed_by_the_warm_start(tmp_path: Path) -> None:
    """The cpuset of the rank's cgroup narrowed after its answer was kept (a Slurm step's
    resize, the kubelet's CPU manager): the warm start finds its witness changed, hands
    over, and the full path binds inside the cpuset as it is now."""
    spec = synth.two_nodes(4)
    spec.cgroup_cpus = [0, 1]
    root = synth.write(spec, str(tmp_path / "cg"))
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, LOCAL_RANK="0", NUMABIND_MEMORY="none")
    _run(env)
    assert _run(env)["handed_over"] == ""
    for name in ("cpuset.cpus.effective", "cpuset.cpus"):
        f = Path(root, "sys/fs/cgroup/job/step", name)
        if f.exists():
            f.write_text("1\n")
    narrowed = _run(env)
    assert "the machine changed since it was read" in str(narrowed["handed_over"]), narrowed
    assert "cpuset" in str(narrowed["handed_over"]), narrowed
    alone = _run({**env, "NUMABIND_CACHE": "0"})
    assert narrowed["cpus"] == alone["cpus"] and narrowed["state"] == alone["state"]
