"""The per-node machine cache: written once, read by every rank, refused when it is not
this process's own, and never a way in.

The attacks are played as an attacker would: a real unprivileged user made by setpriv
plants a cache directory before its victim, a file in the victim's place is a link, a
file comes from another boot or another cpuset, is cut short, is huge or damaged.  Each
is refused and the rank reads sysfs, and its binding is the one it gets without a cache.
A rank in another cgroup (a real cpuset cgroup of this kernel) never uses a file made in
another.  Ranks that start at once read the machine once."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import _numabind_fast as fast
import synth
from _numabind_start import MODULES
from numabind import _cache
from numabind._topology import Machine
from support import clean_env, python_for, two_cpus

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
VICTIM, ATTACKER = 4242, 4343


def _dir(base: Path, uid: int | None = None) -> Path:
    return base / f"numabind-cache-{os.geteuid() if uid is None else uid}"


# --- in-process: written, read, refused ---------------------------------------------------------


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A private registry base (this process's own environment is not the rank's: the
    redirect rule applies to the process's own environment only)."""
    b = tmp_path / "base"
    b.mkdir(mode=0o755)
    return b


def _env(base: Path, **extra: str) -> dict[str, str]:
    return {"NUMABIND_REGISTRY": str(base), **extra}


def test_the_first_reading_is_written_and_the_next_is_read(tmp_path: Path, base: Path) -> None:
    root = synth.write(synth.dgx_h100(), str(tmp_path / "dgx"))
    env = _env(base)
    first = _cache.open_machine(root, env)
    assert first.origin == "sysfs (cache: no cache yet; written)" and first.path
    mode = os.stat(_dir(base)).st_mode
    assert stat.S_IMODE(mode) == 0o700 and stat.S_IMODE(os.stat(first.path).st_mode) == 0o600
    second = _cache.open_machine(root, env)
    assert second.origin == "cache" and second.path == first.path
    live, cached = Machine.from_root(root), second.machine
    from numabind._devices import resolve
    from numabind._plan import Request, plan

    for m in (live, cached):  # a rank's plan needs nothing the file does not hold
        plan(m, Request(local_rank=3, local_world_size=8, visible=resolve(m, {})))
    assert isinstance(cached.source, _cache.Cached) and cached.source.misses == 0
    assert cached.cpu_nodes == live.cpu_nodes and cached.allowed == live.allowed
    assert cached.all_accelerators == live.all_accelerators
    assert [cached.detailed(a).uuid for a in cached.accelerators] == [
        live.detailed(a).uuid for a in live.accelerators
    ]
    assert cached.description == live.description == root


def test_what_the_file_lacks_is_read_added_and_kept(tmp_path: Path, base: Path) -> None:
    """A rank in another mode asks for more (the cores, the kinds): read once, added."""
    root = synth.write(synth.dgx_b300(), str(tmp_path / "b300"))
    env = _env(base)
    _cache.open_machine(root, env)
    more = _cache.open_machine(root, env, frozenset({"cores", "kinds"}))
    assert more.origin.endswith("lacks cores, kinds: read and added; written)"), more.origin
    again = _cache.open_machine(root, env, frozenset({"cores", "kinds"}))
    assert again.origin == "cache"
    assert again.machine.core_kinds == Machine.from_root(root).core_kinds


@pytest.mark.parametrize("example", ["dgx-a100", "p4d", "k8s-pod"])
def test_the_facts_other_readers_add_are_kept_too(tmp_path: Path, base: Path, example: str) -> None:
    """The RDMA adapters (ports, rates in Gb/s, bonds), the plain interfaces beside them
    and a pod's DRA device list: asked once, added to the file, then answered from it
    exactly as the live reader answers."""
    from numabind.capture._examples import EXAMPLES

    root = synth.write(EXAMPLES[example](), str(tmp_path / example))
    env = _env(base)
    cores = frozenset({"cores"})
    _cache.open_machine(root, env, cores).machine.source.close()
    first = _cache.open_machine(root, env, cores).machine
    asked = (first.nics, first.ethernet, first.dra_devices)
    first.source.close()  # what the file lacked is written back
    again = _cache.open_machine(root, env, cores)  # and the rewritten file kept the cores
    assert again.origin == "cache", again.origin
    cached, live = again.machine, Machine.from_root(root)
    assert (cached.nics, cached.ethernet, cached.dra_devices) == asked
    assert asked == (live.nics, live.ethernet, live.dra_devices)
    assert isinstance(cached.source, _cache.Cached) and cached.source.misses == 0
    assert example != "k8s-pod" or cached.dra_devices, "the pod's list is in the file"


def test_the_cache_is_off_with_numabind_cache_0(tmp_path: Path, base: Path) -> None:
    root = synth.write(synth.two_nodes(), str(tmp_path / "two"))
    off = _cache.open_machine(root, _env(base, NUMABIND_CACHE="0"))
    assert off.origin == "sysfs (NUMABIND_CACHE=0)" and not _dir(base).exists()


def _written(tmp_path: Path, base: Path) -> tuple[str, Path]:
    root = synth.write(synth.two_nodes(), str(tmp_path / "two"))
    opened = _cache.open_machine(root, _env(base))
    return root, Path(opened.path)


def _refused(root: str, base: Path) -> str:
    found = _cache.lookup(_env(base), root)
    assert found.quick is None
    return found.why


def test_a_file_that_is_not_exactly_this_processes_is_refused(tmp_path: Path, base: Path) -> None:
    root, path = _written(tmp_path, base)
    good = path.read_bytes()
    cases = {
        "truncated": good[: len(good) - 10],
        "damaged": good.replace(b"q node 0 0", b"q node 0 1", 1),
        "format 9": good.replace(b"numabind-machine 1 ", b"numabind-machine 9 ", 1),
        "another machine reading": _rekey(good, b"boot=", b"boot=0000"),
        "not a numabind machine file": b"#!/bin/sh\nrm -rf /\n",
    }
    for what, data in cases.items():
        path.write_bytes(data)
        why = _refused(root, base)
        assert what in why, (what, why)
    path.write_bytes(good)
    assert _cache.lookup(_env(base), root).quick is not None


def _rekey(data: bytes, old: bytes, new: bytes) -> bytes:
    """The file with its key changed and its length and checksum made right again: a
    file another boot wrote, with nothing else wrong."""
    _, _, body = data.partition(b"\n")
    body = body.replace(old, new, 1)
    return f"numabind-machine 1 {len(body)} {fast.checksum(body)}\n".encode() + body


def test_a_huge_file_and_a_link_in_its_place_are_never_read(tmp_path: Path, base: Path) -> None:
    root, path = _written(tmp_path, base)
    good = path.read_bytes()
    path.write_bytes(good + b"x" * (fast.CACHE_CAP + 1))
    assert "larger than" in _refused(root, base)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(good)
    path.unlink()
    path.symlink_to(elsewhere)
    assert "not a regular file" in _refused(root, base)
    opened = _cache.open_machine(root, _env(base))  # the rank reads sysfs and writes anew
    assert opened.origin.startswith("sysfs (cache: ") and opened.origin.endswith("written)")
    assert not path.is_symlink() and elsewhere.read_bytes() == good, "the link was replaced"
    fifo = path.with_name(path.name + "-fifo")
    os.mkfifo(fifo)
    bad, _, _ = fast.read_private(
        os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY), fifo.name, (os.geteuid(),), 100
    )
    assert bad == "special", "a FIFO is never opened for reading (no hang)"


def test_a_cache_made_in_another_cpuset_is_refused(tmp_path: Path, base: Path) -> None:
    """Same cgroup, its cpuset changed since (the kubelet's CPU manager, a Slurm step's
    resize): refused, and the rank plans with the cpuset it has now."""
    spec = synth.two_nodes()
    spec.cgroup_cpus = [0, 1]
    root = synth.write(spec, str(tmp_path / "cg"))
    _cache.open_machine(root, _env(base))
    cpus = Path(root, "sys/fs/cgroup/job/step/cpuset.cpus.effective")
    cpus.write_text("1\n")
    assert "another cpuset" in _refused(root, base)
    opened = _cache.open_machine(root, _env(base))
    assert opened.machine.allowed.cpus == frozenset({1})
    cgroup = Path(root, "proc/self/cgroup")
    cgroup.write_text("0::/job/other\n")  # another cgroup altogether: another file
    assert _cache.lookup(_env(base), root).why == "no cache yet"


def test_a_waiting_rank_reads_itself_after_the_bounded_wait(tmp_path: Path, base: Path) -> None:
    """Another rank holds the lock and never writes (it hangs): this one waits at most
    ``wait`` seconds, then reads sysfs itself, writing nothing."""
    root = synth.write(synth.two_nodes(), str(tmp_path / "two"))
    env = _env(base)
    fd, _, _ = fast.open_cache_dir(env, True, str(base))
    assert fd is not None
    key, _ = fast.cache_key(root)
    holder = _cache._Lock(fd, fast.cache_name(key))
    assert holder.take()
    try:
        t0 = time.monotonic()
        opened = _cache.open_machine(root, env, wait=0.3)
        took = time.monotonic() - t0
    finally:
        holder.close()
        os.close(fd)
    assert 0.3 <= took < 3, took
    assert opened.origin == "sysfs (cache: another rank held the lock for 0.3 s)"
    assert opened.machine.cpu_nodes == Machine.from_root(root).cpu_nodes
    assert not list(_dir(base).glob("machine-*[!k]")), "the waiter wrote nothing"


def test_a_waiting_rank_takes_the_file_the_holder_writes(tmp_path: Path, base: Path) -> None:
    root = synth.write(synth.two_nodes(), str(tmp_path / "two"))
    env = _env(base)
    fd, _, _ = fast.open_cache_dir(env, True, str(base))
    assert fd is not None
    key, _ = fast.cache_key(root)
    holder = _cache._Lock(fd, fast.cache_name(key))
    assert holder.take()
    writer = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; time.sleep(0.3); from numabind import _cache; "
         "from numabind._topology import Machine; "
         "_cache.write(dict(NUMABIND_REGISTRY=sys.argv[2]), sys.argv[1], "
         "Machine(_cache.Recording(_cache._live(sys.argv[1]))), frozenset())",
         root, str(base)],
    )  # fmt: skip
    try:
        opened = _cache.open_machine(root, env, wait=10)
    finally:
        writer.wait(30)
        holder.close()
        os.close(fd)
    assert opened.origin == "cache"


def test_at_most_max_files_are_kept(tmp_path: Path, base: Path) -> None:
    env = _env(base)
    for i in range(_cache.MAX_FILES + 3):
        root = synth.write(synth.two_nodes(), str(tmp_path / f"m{i}"))
        _cache.open_machine(root, env)
    kept = [p for p in _dir(base).iterdir() if not p.name.endswith(".lock")]
    assert len(kept) == _cache.MAX_FILES


# --- as an attacker would: a real other user ----------------------------------------------------


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """numabind's source and a two-node machine that other uids can read, and a base
    (/dev/shm-like: sticky, writable by all) for their caches."""
    d = Path(tempfile.mkdtemp(prefix="numabind-cache-attack-", dir="/var/tmp"))
    d.chmod(0o755)
    shutil.copytree(
        SRC / "numabind", d / "src" / "numabind", ignore=shutil.ignore_patterns("__pycache__")
    )
    for module in MODULES:
        shutil.copy(SRC / f"{module}.py", d / "src")
    synth.write(synth.two_nodes(), str(d / "root"))
    for path in d.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
    (d / "shm").mkdir()
    (d / "shm").chmod(0o1777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_caches_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each attack starts from no cache and leaves none (a failed one included)."""
    yield
    if "world" in request.fixturenames:
        world = request.getfixturevalue("world")
        for d in (world / "shm").glob("numabind-cache-*"):
            shutil.rmtree(d, ignore_errors=True)


RANK = (
    "import json, os, sys\n"
    "import _numabind_start as s\n"
    "s.start()\n"
    "print(json.dumps([s.handed_over, s.machine_origin, sorted(os.sched_getaffinity(0)),\n"
    "                  os.environ.get('NUMABIND_STATE')]))\n"
)


def _as(uid: int, world: Path, **extra: str) -> list[object]:
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(world / "src"),
        "NUMABIND_SYSROOT": str(world / "root"),
        "NUMABIND_REGISTRY": str(world / "shm"),
        "NUMABIND": "force",
        "NUMABIND_MEMORY": "none",
        "LOCAL_RANK": "1",
        **extra,
    }
    drop = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    r = subprocess.run(
        [*drop, python_for(uid), "-c", RANK], capture_output=True, text=True, env=env,
        cwd="/", timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    found: list[object] = json.loads(r.stdout)
    return found


@two_cpus
def test_another_users_planted_cache_directory_is_never_used(world: Path) -> None:
    """The attacker makes the victim's cache directory first, with a forged machine in it
    (binding CPU 0 where the victim's GPU is on CPU 1): the victim refuses the directory,
    reads sysfs, and binds as it does without any cache."""
    honest = _as(VICTIM, world, NUMABIND_CACHE="0")
    squat = world / "shm" / f"numabind-cache-{VICTIM}"
    subprocess.run(
        ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups",
         "sh", "-c", f"mkdir -m 0777 {squat}"], check=True,
    )  # fmt: skip
    key_dir = squat
    forged = _forged_for(world)
    (key_dir / forged[0]).write_bytes(forged[1])
    os.chown(key_dir / forged[0], ATTACKER, ATTACKER)
    got = _as(VICTIM, world)
    assert got[0] == "" and got[2] == honest[2] == [1], (got, honest)
    assert f"is owned by uid {ATTACKER}" in str(got[1]), got[1]
    assert not any(p.stat().st_uid == VICTIM for p in squat.iterdir()), "nothing written there"
    shutil.rmtree(squat)


def _forged_for(world: Path) -> tuple[str, bytes]:
    """A well-formed file for the victim's key saying its GPU's node is node 0 (CPU 0)."""
    code = (
        "import sys, os; sys.path.insert(0, sys.argv[1]); import _numabind_fast as s\n"
        "key, _ = s.cache_key(sys.argv[2]); print(s.cache_name(key)); print(key)"
    )
    r = subprocess.run(
        ["setpriv", f"--reuid={VICTIM}", f"--regid={VICTIM}", "--clear-groups",
         python_for(VICTIM), "-c", code, str(world / "src"), str(world / "root")],
        capture_output=True, text=True, check=True, cwd="/",
    )  # fmt: skip
    name, key = r.stdout.split("\n")[:2]
    body = "\n".join([
        f"key {key}", "q node 0 0", "q node 1 1", "q allowed 0-1 0-1", "q many 1",
        "q package 0 0", "q package 1 1", "q vendors nvidia amd intel",
        "q dev nvidia 0000:01:00.0 0 GPU -", "q dev nvidia 0000:02:00.0 0 GPU -", "--", "",
    ]).encode()  # fmt: skip
    return name, f"numabind-machine 1 {len(body)} {fast.checksum(body)}\n".encode() + body


@two_cpus
def test_a_file_of_another_user_in_the_victims_own_directory_is_refused(world: Path) -> None:
    honest = _as(VICTIM, world, NUMABIND_CACHE="0")
    _as(VICTIM, world)  # the victim's own directory and file
    mine = world / "shm" / f"numabind-cache-{VICTIM}"
    name, data = _forged_for(world)
    (mine / name).write_bytes(data)  # root puts a forged file there, owned by the attacker
    os.chown(mine / name, ATTACKER, ATTACKER)
    got = _as(VICTIM, world)
    assert got[2] == honest[2] == [1] and "another user's: refused" in str(got[1]), got
    assert (mine / name).stat().st_uid == VICTIM, "the victim wrote its own in its place"
    shutil.rmtree(mine)


@two_cpus
def test_an_unprivileged_rank_uses_its_own_cache_and_binds_as_without(world: Path) -> None:
    honest = _as(VICTIM, world, NUMABIND_CACHE="0")
    cold = _as(VICTIM, world)
    warm = _as(VICTIM, world)
    assert cold[0] == warm[0] == "" and str(cold[1]).endswith("written)") and warm[1] == "cache"
    assert honest[2] == cold[2] == warm[2] == [1] and honest[3] == cold[3] == warm[3]
    mine = world / "shm" / f"numabind-cache-{VICTIM}"
    assert mine.stat().st_uid == VICTIM and stat.S_IMODE(mine.stat().st_mode) == 0o700
    shutil.rmtree(mine)


# --- a rank in another cgroup ---------------------------------------------------------------------


def _cpuset_cgroup(name: str, cpus: str) -> Path:
    """A cpuset cgroup of this kernel (v1 where mounted, else v2), or a test failure."""
    v1 = Path("/sys/fs/cgroup/cpuset")
    if (v1 / "cpuset.cpus").exists():
        d = v1 / name
        d.mkdir(exist_ok=True)
        (d / "cpuset.mems").write_text((v1 / "cpuset.mems").read_text())
        (d / "cpuset.cpus").write_text(cpus)
        return d
    v2 = Path("/sys/fs/cgroup")
    if "cpuset" in (v2 / "cgroup.controllers").read_text().split():
        (v2 / "cgroup.subtree_control").write_text("+cpuset")
        d = v2 / name
        d.mkdir(exist_ok=True)
        (d / "cpuset.cpus").write_text(cpus)
        return d
    pytest.fail("no cpuset cgroup can be made here (as root, with cgroupfs writable)")


@two_cpus
def test_a_rank_in_another_cgroup_never_uses_a_cache_made_in_another() -> None:
    """Real cgroups of this kernel, the live machine: a rank in cgroup A writes its file
    and a second rank in A reads it; a rank in cgroup B (with the same CPUs) and one outside
    both never read A's: each key holds its cgroup (the cache is /dev/shm's, as root's)."""
    made = [_cpuset_cgroup(f"numabind-test-{os.getpid()}-{x}", "0-1") for x in "ab"]
    probe = (
        "import json, sys; import _numabind_start as s, _numabind_fast as f; "
        "key, _ = f.cache_key('/'); "
        "print(json.dumps([s.handed_over, s.machine_origin, f.cache_name(key)]))"
    )

    def rank(cgroup: Path | None) -> list[str]:
        enter = f"echo $$ > {cgroup}/cgroup.procs && " if cgroup else ""
        r = subprocess.run(
            ["sh", "-c", f'{enter}exec "$0" -c "$1"', sys.executable, probe],
            # exclusive mode: past the one-node shortcut, so that the rank reads its machine
            capture_output=True, text=True, timeout=60,
            env=clean_env(LOCAL_RANK="0", NUMABIND_MODE="exclusive"),
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        out: list[str] = json.loads(r.stdout)
        assert out[0] == "", f"the live machine here needs the full path: {out[0]}"
        return out

    try:
        a1, a2 = rank(made[0]), rank(made[0])
        b1 = rank(made[1])
        outside = rank(None)
    finally:
        for d in made:
            d.rmdir()
    assert a1[1].startswith("sysfs (cache: no cache yet") and a2[1] == "cache"
    assert a1[2] == a2[2], "a rank in A reads the file a rank in A wrote"
    assert b1[1].startswith("sysfs (cache: no cache yet") and b1[2] != a1[2]
    assert outside[2] not in (a1[2], b1[2])
    for name in (a1[2], b1[2]):
        (Path("/dev/shm/numabind-cache-0") / name).unlink()


# --- ranks that start at once --------------------------------------------------------------------

COUNT = (
    "import json, sys; opened = []\n"
    "def audit(event, args):\n"
    "    if event == 'open' and isinstance(args[0], str) and args[0].startswith(FILES):\n"
    "        opened.append(args[0])\n"
    "sys.addaudithook(audit)\n"
    "import site; site.main()\n"
    "import os; s = sys.modules['_numabind_start']\n"
    "full = sys.modules.get('numabind._startup')  # a rank handed to the full path\n"
    "origin = full.last.machine if s.handed_over and full and full.last else s.machine_origin\n"
    "print(json.dumps([opened, origin, os.environ.get('NUMABIND_STATE'),\n"
    "                  sorted(os.sched_getaffinity(0))]))\n"
)


@pytest.mark.parametrize(
    ("ranks", "extra"),
    [(8, {}), (8, {"NUMABIND_VERBOSE": "1"})],
    ids=["fast-path", "full-path"],
)
def test_ranks_that_start_at_once_read_the_machine_once(
    tmp_path: Path, ranks: int, extra: dict[str, str]
) -> None:
    """Ranks of a generated DGX started together, no cache, planned by the fast path or
    handed to the full path (verbose): no file of the machine is opened by two of them
    (the cpuset files of the key aside: every rank reads those), one of them read it and
    every other waited for its file; each rank's state and CPUs are what it gets without
    a cache."""
    root = synth.write(synth.dgx_h100(), str(tmp_path / "dgx"))
    env = clean_env(NUMABIND="force", NUMABIND_SYSROOT=root, NUMABIND_MEMORY="none", **extra)
    # a sysroot is read by names relative to its directory (and the key by whole paths)
    code = f"FILES = {(root + '/', 'sys/', 'proc/')!r}\n" + COUNT
    procs = [
        subprocess.Popen(
            [sys.executable, "-S", "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(ranks)},
        )
        for r in range(ranks)
    ]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        outs.append(json.loads(out))
    key = (f"{root}/sys/fs/cgroup/", f"{root}/proc/", "sys/fs/cgroup/", "proc/")  # the key's
    openers: dict[str, int] = {}
    for o in outs:
        for path in set(o[0]):
            if not path.startswith(key):
                openers[path] = openers.get(path, 0) + 1
    assert openers and max(openers.values()) == 1, sorted(p for p, n in openers.items() if n > 1)
    readers = [o for o in outs if any(not p.startswith(key) for p in o[0])]
    assert len(readers) == 1, [o[1] for o in outs]
    assert sum(1 for o in outs if o[1] == "cache") == ranks - 1, [o[1] for o in outs]
    for r, o in enumerate(outs):
        code = "import os; print(os.environ['NUMABIND_STATE'], sorted(os.sched_getaffinity(0)))"
        mine = {"LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(ranks), "NUMABIND_CACHE": "0"}
        alone = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env={**env, **mine}
        )
        state, _, cpus = alone.stdout.strip().partition(" ")
        assert o[2] == state and o[3] == json.loads(cpus), (r, o, alone.stdout)
