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

import _numabind_base as nb
import synth
from _numabind_base import MODULES
from numabind import _cache, _facts
from numabind._topology import Machine
from support import clean_env, python_for, two_cpus

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
VICTIM, ATTACKER = 4242, 4343
NL = "\n"


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


def _planned(opened: _cache.Opened, rank: int, **knobs: str) -> _cache.Opened:
    """``opened``'s machine after a rank's plan asked it what it needs, closed (a reading
    that lacked a fact writes the file again with it)."""
    from numabind._devices import resolve
    from numabind._environ import Config
    from numabind._plan import Request, plan

    m, cfg = opened.machine, Config.from_env(knobs)
    visible = resolve(m, {})
    request = Request(local_rank=rank, local_world_size=8, visible=visible, mode=cfg.mode)
    plan(m, request.replace(priority=cfg.priority))
    m.close()
    return opened


def test_the_first_reading_is_written_and_the_next_is_read(tmp_path: Path, base: Path) -> None:
    root = synth.write(synth.dgx_h100(), str(tmp_path / "dgx"))
    env = _env(base)
    first = _planned(_cache.open_machine(root, env), 3)  # written when its reading closes
    assert first.origin == "sysfs (cache: no cache yet; written)"
    path = _path(root, base)
    mode = os.stat(_dir(base)).st_mode
    assert stat.S_IMODE(mode) == 0o700 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    second = _cache.open_machine(root, env)
    assert second.origin == "cache" and second.path == str(path)
    live, cached = Machine.from_root(root), second.machine
    from numabind._devices import resolve
    from numabind._plan import Request, plan

    for m in (live, cached):  # a rank's plan needs nothing the file does not hold
        plan(m, Request(local_rank=3, local_world_size=8, visible=resolve(m, {})))
    assert isinstance(cached.source, _facts.Cached) and cached.source.misses == 0
    assert cached.cpu_nodes == live.cpu_nodes and cached.allowed == live.allowed
    assert cached.all_accelerators == live.all_accelerators
    assert [cached.detailed(a).uuid for a in cached.accelerators] == [
        live.detailed(a).uuid for a in live.accelerators
    ]
    assert cached.description == live.description == root


def test_what_the_file_lacks_is_read_added_and_kept(tmp_path: Path, base: Path) -> None:
    """A rank with other knobs asks for more (priority cores: the kinds): read once from sysfs,
    said (the origin is not "cache" alone: the registry entry and verbose say it), added
    to the file; the next such rank has every fact from the file."""
    root = synth.write(synth.dgx_b300(), str(tmp_path / "b300"))
    env = _env(base)
    _planned(_cache.open_machine(root, env), 0)
    first = _cache.open_machine(root, env)
    assert first.origin == "cache"
    more = _planned(first, 0, NUMABIND_PRIORITY="rank")
    assert isinstance(more.machine.source, _facts.Cached) and more.machine.source.misses
    said = _cache.origin_of(more)
    assert said.startswith("cache, and sysfs for what it lacked (") and said.endswith("; added)")
    again = _planned(_cache.open_machine(root, env), 0, NUMABIND_PRIORITY="rank")
    assert again.origin == "cache" and _cache.origin_of(again) == "cache"
    assert again.machine.core_kinds == Machine.from_root(root).core_kinds


@pytest.mark.parametrize("example", ["dgx-a100", "p4d", "k8s-pod"])
def test_the_facts_other_readers_add_are_kept_too(tmp_path: Path, base: Path, example: str) -> None:
    """The RDMA adapters (ports, rates in Gb/s, bonds), the plain interfaces beside them
    and a pod's DRA device list: asked once, added to the file, then answered from it
    exactly as the live reader answers."""
    from numabind.capture._examples import EXAMPLES

    root = synth.write(EXAMPLES[example](), str(tmp_path / example))
    env = _env(base)
    _planned(_cache.open_machine(root, env), 0)
    first = _cache.open_machine(root, env).machine
    asked = (first.nics, first.ethernet, first.dra_devices)
    first.source.close()  # what the file lacked is written back
    again = _cache.open_machine(root, env)  # and the rewritten file kept them
    assert again.origin == "cache", again.origin
    cached, live = again.machine, Machine.from_root(root)
    assert (cached.nics, cached.ethernet, cached.dra_devices) == asked
    assert asked == (live.nics, live.ethernet, live.dra_devices)
    assert isinstance(cached.source, _facts.Cached) and cached.source.misses == 0
    assert example != "k8s-pod" or cached.dra_devices, "the pod's list is in the file"


def test_the_cache_is_off_with_numabind_cache_0(tmp_path: Path, base: Path) -> None:
    root = synth.write(synth.two_nodes(), str(tmp_path / "two"))
    off = _cache.open_machine(root, _env(base, NUMABIND_CACHE="0"))
    assert off.origin == "sysfs (NUMABIND_CACHE=0)" and not _dir(base).exists()


def test_numabind_cache_means_the_same_to_the_warm_start_the_config_and_doctor(
    tmp_path: Path, base: Path
) -> None:
    """One reading of NUMABIND_CACHE: a value the settings take as false (the empty one
    too) keeps the warm start from replaying, the full path from using the file and
    ``doctor`` from calling it valid; unset, true, or no boolean at all (which the settings
    warn of and take as the default), all three use it."""
    from numabind._environ import Config

    root = synth.write(synth.two_nodes(), str(tmp_path / "two"))
    _cache.open_machine(root, _env(base)).machine.close()  # a file doctor would call valid
    for raw in ("", "0", " OFF ", "no", "false"):
        env = _env(base, NUMABIND_CACHE=raw)
        assert nb.cache_off(env) and not Config.from_env(env).cache, raw
        assert _cache.status(env, root).startswith("off"), raw
        assert _cache.open_machine(root, env).origin.startswith("sysfs"), raw
    for raw in (None, "1", "yes", " On ", "TRUE", "maybe"):
        env = _env(base) if raw is None else _env(base, NUMABIND_CACHE=raw)
        cfg = Config.from_env(env)
        assert not nb.cache_off(env) and cfg.cache, raw
        assert (raw == "maybe") == any("NUMABIND_CACHE" in w for w in cfg.warnings), raw
        assert "valid for this process" in _cache.status(env, root), raw
        assert _cache.open_machine(root, env).origin == "cache", raw


def _path(root: str, base: Path) -> Path:
    """Where this process's machine file of ``root`` is."""
    return _dir(base) / _cache.cache_name(nb.machine_key(root))


def _written(tmp_path: Path, base: Path) -> tuple[str, Path]:
    root = synth.write(synth.two_nodes(), str(tmp_path / "two"))
    _planned(_cache.open_machine(root, _env(base)), 1)
    return root, _path(root, base)


def _refused(root: str, base: Path) -> str:
    found = _cache.lookup(_env(base), root)
    assert not found.data
    return found.why


def test_a_file_that_is_not_exactly_this_processes_is_refused(tmp_path: Path, base: Path) -> None:
    root, path = _written(tmp_path, base)
    good = path.read_bytes()
    cases = {
        "truncated": good[: len(good) - 10],
        "damaged": good.replace(b"m node 0.0 RNode ( i0 c0", b"m node 0.0 RNode ( i0 c1", 1),
        "format 99": good.replace(
            f"numabind-machine {nb.FORMAT} ".encode(), b"numabind-machine 99 ", 1
        ),
        # a length of 5,000 digits: past int()'s limit, refused before it is converted
        "a damaged header": f"numabind-machine {nb.FORMAT} {'9' * 5000} 1\n".encode(),
        "another machine reading": _rekey(good, b"boot=", b"boot=0000"),
        "not a numabind machine file": b"#!/bin/sh\nrm -rf /\n",
    }
    for what, data in cases.items():
        path.write_bytes(data)
        why = _refused(root, base)
        assert what in why, (what, why)
    path.write_bytes(good)
    assert _cache.lookup(_env(base), root).data


def _rekey(data: bytes, old: bytes, new: bytes) -> bytes:
    """The file with its key changed and its length and checksum made right again: a
    file another boot wrote, with nothing else wrong."""
    _, _, body = data.partition(b"\n")
    body = body.replace(old, new, 1)
    return f"numabind-machine {nb.FORMAT} {len(body)} {nb.checksum(body)}\n".encode() + body


def test_a_huge_file_and_a_link_in_its_place_are_never_read(tmp_path: Path, base: Path) -> None:
    root, path = _written(tmp_path, base)
    good = path.read_bytes()
    path.write_bytes(good + b"x" * (nb.CACHE_CAP + 1))
    assert "larger than" in _refused(root, base)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(good)
    path.unlink()
    path.symlink_to(elsewhere)
    assert "not a regular file" in _refused(root, base)
    opened = _planned(_cache.open_machine(root, _env(base)), 1)  # it reads sysfs, writes anew
    assert opened.origin.startswith("sysfs (cache: ") and opened.origin.endswith("written)")
    assert not path.is_symlink() and elsewhere.read_bytes() == good, "the link was replaced"
    fifo = path.with_name(path.name + "-fifo")
    os.mkfifo(fifo)
    bad, _, _ = nb.read_private(
        os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY), fifo.name, (os.geteuid(),), 100
    )
    assert bad == "special", "a FIFO is never opened for reading (no hang)"


def test_a_cache_made_in_another_cpuset_is_refused(tmp_path: Path, base: Path) -> None:
    """Same cgroup, its cpuset changed since (the kubelet's CPU manager, a Slurm step's
    resize): refused, and the rank plans with the cpuset it has now."""
    spec = synth.two_nodes()
    spec.cgroup_cpus = [0, 1]
    root = synth.write(spec, str(tmp_path / "cg"))
    _planned(_cache.open_machine(root, _env(base)), 1)
    cpus = Path(root, "sys/fs/cgroup/job/step/cpuset.cpus.effective")
    cpus.write_text("1\n")
    assert "cpuset.cpus.effective says otherwise" in _refused(root, base)
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
    fd, _, _ = nb.open_cache_dir(env, True, str(base))
    assert fd is not None
    holder = _cache._Lock(fd, _cache.cache_name(nb.machine_key(root)))
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
    fd, _, _ = nb.open_cache_dir(env, True, str(base))
    assert fd is not None
    holder = _cache._Lock(fd, _cache.cache_name(nb.machine_key(root)))
    assert holder.take()
    writer = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; time.sleep(0.3); from numabind import _cache, _facts; "
         "from numabind._topology import Machine; "
         "_cache.write(dict(NUMABIND_REGISTRY=sys.argv[2]), sys.argv[1], "
         "Machine(_facts.Recording(_cache._live(sys.argv[1]))))",
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
        _planned(_cache.open_machine(root, env), 1)
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
    if "world" not in request.fixturenames:
        yield
        return
    world = request.getfixturevalue("world")
    places = [*(world / "shm").glob("numabind-cache-*"), Path(f"/dev/shm/numabind-cache-{VICTIM}")]
    for d in places:
        shutil.rmtree(d, ignore_errors=True)
    yield
    for d in [*(world / "shm").glob("numabind-cache-*"), places[-1]]:
        shutil.rmtree(d, ignore_errors=True)


RANK = (
    "import json, os, sys\n"
    "import _numabind_start as s\n"
    "s.start()\n"
    "full = sys.modules.get('numabind._startup')  # a rank handed to the full path\n"
    "origin = full.last.machine if s.handed_over and full and full.last else s.machine_origin\n"
    "print(json.dumps([s.handed_over, origin, sorted(os.sched_getaffinity(0)),\n"
    "                  os.environ.get('NUMABIND_STATE')]))\n"
)


def _as(uid: int, world: Path, shm: Path | None = None, **extra: str) -> list[object]:
    """What the rank of ``RANK`` says, run as ``uid``; its caches under ``shm`` (the real
    /dev/shm is the default base: no NUMABIND_REGISTRY, so the warm start is in play)."""
    shm = world / "shm" if shm is None else shm
    registry = {} if shm == Path("/dev/shm") else {"NUMABIND_REGISTRY": str(shm)}
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(world / "src"),
        "NUMABIND_SYSROOT": str(world / "root"),
        **registry,
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


def _victims_file(world: Path, prefix: str, shm: Path) -> tuple[str, bytes]:
    """The name and bytes of the file (``machine-`` or ``answers-``) a real cold rank of
    the victim writes under ``shm``; the victim's directory is then removed."""
    _as(VICTIM, world, shm=shm)
    mine = shm / f"numabind-cache-{VICTIM}"
    found = [p for p in mine.iterdir() if p.name.startswith(prefix) and "." not in p.name]
    assert len(found) == 1, sorted(p.name for p in mine.iterdir())
    name, data = found[0].name, found[0].read_bytes()
    shutil.rmtree(mine)
    return name, data


def _forged(prefix: str, good: bytes) -> bytes:
    """``good`` made to bind the victim's rank 1 on CPU 0 (its GPU is on node 1, CPU 1),
    its length and checksum right again: a well-formed file with a lie in it."""
    kind = prefix.rstrip("-")
    _, _, body = good.partition(b"\n")
    lines = body.split(b"\n")
    for i, line in enumerate(lines):
        if kind == "machine" and line.startswith((b"m locate 0000:02", b"m accelerator 0000:02")):
            lines[i] = line.replace(b" ~ i1 ", b" ~ i0 ", 1).replace(b" i1 c1 ", b" i0 c0 ", 1)
        if kind == "answers" and line == b"cpus 1":
            lines[i] = b"cpus 0"
    forged = b"\n".join(lines)
    assert forged != body, "nothing to forge"
    return f"numabind-{kind} {nb.FORMAT} {len(forged)} {nb.checksum(forged)}\n".encode() + forged


# the machine file (read by the full path; NUMABIND_REGISTRY names its base) and the answers
# file (read by the warm start, under the real /dev/shm: a registry base turns replay off)
FILES = [("machine-", False), ("answers-", True)]


def _shm(world: Path, real: bool) -> Path:
    return Path("/dev/shm") if real else world / "shm"


@two_cpus
@pytest.mark.parametrize(("prefix", "real"), FILES, ids=["machine", "answers"])
def test_another_users_planted_cache_directory_is_never_used(
    world: Path, prefix: str, real: bool
) -> None:
    """The attacker makes the victim's cache directory first, with a forged file in it
    (binding CPU 0 where the victim's GPU is on CPU 1): the victim refuses the directory,
    reads sysfs, and binds as it does without any cache.  The forgery is a good one: in
    the victim's own directory, owned by the victim, it is believed."""
    shm = _shm(world, real)
    honest = _as(VICTIM, world, NUMABIND_CACHE="0", shm=shm)
    name, good = _victims_file(world, prefix, shm)
    forged = _forged(prefix, good)
    squat = shm / f"numabind-cache-{VICTIM}"
    _as(VICTIM, world, shm=shm)  # the control: the victim's own directory, the lie in it
    (squat / name).write_bytes(forged)
    os.chown(squat / name, VICTIM, VICTIM)
    if real:  # the machine file is not read where an answer replays: the control is the replay's
        assert _as(VICTIM, world, shm=shm)[2] == [0], (
            "the forgery is believed when it is the victim's"
        )
    shutil.rmtree(squat)
    subprocess.run(
        ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups",
         "sh", "-c", f"mkdir -m 0777 {squat}"], check=True,
    )  # fmt: skip
    (squat / name).write_bytes(forged)
    os.chown(squat / name, ATTACKER, ATTACKER)
    try:
        got = _as(VICTIM, world, shm=shm)
        assert got[2] == honest[2] == [1], (got, honest)
        if not real:
            assert f"is owned by uid {ATTACKER}" in str(got[1]), got[1]
        else:
            assert f"is owned by uid {ATTACKER}" in str(got[0]), got[0]
        assert not any(p.stat().st_uid == VICTIM for p in squat.iterdir()), "nothing written there"
    finally:
        shutil.rmtree(squat)


@two_cpus
@pytest.mark.parametrize(("prefix", "real"), FILES, ids=["machine", "answers"])
def test_a_file_of_another_user_in_the_victims_own_directory_is_refused(
    world: Path, prefix: str, real: bool
) -> None:
    shm = _shm(world, real)
    honest = _as(VICTIM, world, NUMABIND_CACHE="0", shm=shm)
    name, good = _victims_file(world, prefix, shm)
    _as(VICTIM, world, shm=shm)  # the victim's own directory and files again
    mine = shm / f"numabind-cache-{VICTIM}"
    (mine / name).write_bytes(_forged(prefix, good))  # root puts a forged file there
    os.chown(mine / name, ATTACKER, ATTACKER)  # owned by the attacker
    try:
        got = _as(VICTIM, world, shm=shm)
        why = str(got[0] if real else got[1])
        assert got[2] == honest[2] == [1] and "another user's" in why, got
        if not real:  # the full path writes its own in its place
            assert (mine / name).stat().st_uid == VICTIM
    finally:
        shutil.rmtree(mine)


@two_cpus
def test_an_unprivileged_rank_uses_its_own_cache_and_binds_as_without(world: Path) -> None:
    """Under the real /dev/shm: cold (the full path reads sysfs, writes the machine and
    keeps its answer), warm (the answer replayed), and another input (the full path from
    the machine file): bound alike, in a directory of the victim's own, mode 0700."""
    shm = Path("/dev/shm")
    honest = _as(VICTIM, world, NUMABIND_CACHE="0", shm=shm)
    cold = _as(VICTIM, world, shm=shm)
    warm = _as(VICTIM, world, shm=shm)
    full = _as(VICTIM, world, shm=shm, NUMABIND_MODE="socket")  # another input: no answer
    mine = shm / f"numabind-cache-{VICTIM}"
    try:
        assert str(cold[1]).endswith("written)"), cold
        assert warm[0] == "" and warm[1] == "answer", warm
        assert full[0] == "no answer for this process's inputs yet", full
        assert str(full[1]).startswith("cache, and sysfs for what it lacked ("), full
        assert honest[2] == cold[2] == warm[2] == full[2] == [1]
        assert honest[3] == cold[3] == warm[3]
        assert mine.stat().st_uid == VICTIM and stat.S_IMODE(mine.stat().st_mode) == 0o700
    finally:
        shutil.rmtree(mine, ignore_errors=True)


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
        "import json, sys; import _numabind_start as s, _numabind_base as b; "
        "from numabind import _cache, _startup; "
        "full = _startup.last.machine if s.handed_over and _startup.last else s.machine_origin; "
        "print(json.dumps([s.handed_over, full, _cache.cache_name(b.machine_key('/'))]))"
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
        return out

    try:
        a1, a2 = rank(made[0]), rank(made[0])
        b1 = rank(made[1])
        outside = rank(None)
    finally:
        for d in made:
            d.rmdir()
    assert a1[1].startswith("sysfs (cache: no cache yet"), a1
    assert a2[1] in ("cache", "answer"), "a rank in A uses what a rank in A kept"
    assert a1[2] == a2[2]
    assert b1[1].startswith("sysfs (cache: no cache yet") and b1[2] != a1[2], b1
    assert b1[0], "B replays no answer A kept"
    assert outside[0] and outside[2] not in (a1[2], b1[2])
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
    [
        (8, {}),
        (8, {"NUMABIND_VERBOSE": "1"}),
        (8, {"NUMABIND_RESERVE": "1/node"}),  # each rank asks its own share's cores
        (8, {"NO_DRIVER": "1"}),  # no driver's list: the plan scans the bus for its GPUs
    ],
    ids=["quiet", "verbose", "reserve", "no-driver"],
)
def test_ranks_that_start_at_once_read_the_machine_once(
    tmp_path: Path, ranks: int, extra: dict[str, str]
) -> None:
    """Ranks of a generated DGX started together, no cache (each goes to the full path:
    there is no answer yet), quiet or verbose: no file of the machine is opened by two of them
    (the cpuset files of the key aside: every rank reads those), one of them read it and
    every other waited for its file; each rank's state and CPUs are what it gets without
    a cache."""
    spec, extra = synth.dgx_h100(), dict(extra)
    if extra.pop("NO_DRIVER", None):
        for gpu in spec.gpus:
            gpu.driver = False
    root = synth.write(spec, str(tmp_path / "dgx"))
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
    # every rank looks at the witnesses (the files that say the machine is unchanged)
    name = _cache.cache_name(nb.machine_key(root))
    machine = Path(f"/dev/shm/numabind-cache-{os.geteuid()}", name)
    witnessed = set()
    for line in machine.read_text().split(NL)[2:]:
        if not line.startswith("w "):
            break
        path = line.split(" ")[2]
        witnessed |= {root + path, path.lstrip("/")}
    openers: dict[str, int] = {}
    for o in outs:
        for path in set(o[0]):
            if not path.startswith(key) and path not in witnessed:
                openers[path] = openers.get(path, 0) + 1
    assert openers and max(openers.values()) == 1, (
        [o[1] for o in outs],
        sorted(p for p, n in openers.items() if n > 1)[:3],
    )
    readers = [o for o in outs if any(not p.startswith(key) and p not in witnessed for p in o[0])]
    assert len(readers) == 1, [o[1] for o in outs]
    assert sum(1 for o in outs if o[1] == "cache") == ranks - 1, [o[1] for o in outs]
    machine.unlink()
    for r, o in enumerate(outs):
        code = "import os; print(os.environ['NUMABIND_STATE'], sorted(os.sched_getaffinity(0)))"
        mine = {"LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(ranks), "NUMABIND_CACHE": "0"}
        alone = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env={**env, **mine}
        )
        state, _, cpus = alone.stdout.strip().partition(" ")
        assert o[2] == state and o[3] == json.loads(cpus), (r, o, alone.stdout)
