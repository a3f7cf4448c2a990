"""Host buffers, bind_range and placement on this machine's real kernel (node 0): sizes,
views, close, populate, the errors and their figures, a memory cgroup, the seccomp
fallback, the shared memfd, and what check measures.  Placement across nodes (a buffer on
the other node than the caller's, interleave, moving a range) is proven in the VM
(tests/test_vm.py), measured by code independent of numabind."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import numabind
from numabind.memory import _memory
from support import clean_env, two_cpus

HERE = Path(__file__).resolve().parent
SECCOMP = [sys.executable, "-S", str(HERE / "seccomp_eperm.py")]
PAGE = mmap.PAGESIZE


def own_numa_maps(address: int) -> dict[int, int]:
    """Pages per node of the mapping at ``address``, parsed here from /proc/self/numa_maps
    (an oracle numabind does not write)."""
    for line in Path("/proc/self/numa_maps").read_text().splitlines():
        fields = line.split()
        if int(fields[0], 16) == address:
            out = {}
            for f in fields[2:]:
                if f.startswith("N") and "=" in f:
                    node, count = f[1:].split("=")
                    out[int(node)] = int(count)
            return out
    raise AssertionError(f"no mapping at 0x{address:x}")


def mapped(address: int) -> bool:
    want = f"{address:x}-"
    return any(line.startswith(want) for line in Path("/proc/self/maps").read_text().splitlines())


def test_a_buffer_is_exact_placed_and_populated() -> None:
    with numabind.host_buffer(5000, node=0) as buf:
        assert buf.nbytes == 5000 and buf.mapped_bytes == 2 * PAGE
        assert buf.nodes == (0,) and buf.policy == "bind"
        assert len(buf.view()) == 5000
        assert buf.placement() == {0: 2}, "both pages present, on node 0"
        assert own_numa_maps(buf.address) == {0: 2}
        assert buf.populated in ("MADV_POPULATE_WRITE", "touch") and buf.threads >= 1
    assert buf.closed and not mapped(buf.address)


def test_a_big_buffer_from_several_threads() -> None:
    cpus = os.sched_getaffinity(0)
    cores = {
        Path(f"/sys/devices/system/cpu/cpu{c}/topology/core_cpus_list").read_text().strip()
        for c in cpus
    }
    with numabind.host_buffer(256 << 20, node=0) as buf:
        assert buf.threads == min(len(cores), 16)  # one per core, at most one per 16 MiB
        assert buf.placement() == {0: (256 << 20) // PAGE}
        assert sum(own_numa_maps(buf.address).values()) == (256 << 20) // PAGE
    with numabind.host_buffer(64 << 20, node=0, threads=1) as one:
        assert one.threads == 1 and one.placement() == {0: (64 << 20) // PAGE}


def test_unpopulated_buffers_have_no_pages_yet() -> None:
    with numabind.host_buffer(10 << 20, node=0, populate=False) as buf:
        assert buf.placement() == {None: (10 << 20) // PAGE} and buf.populated is None
        buf.view()[: PAGE * 3] = b"x" * (PAGE * 3)
        assert buf.placement() == {0: 3, None: (10 << 20) // PAGE - 3}


def test_close_refuses_while_a_view_is_out() -> None:
    buf = numabind.host_buffer(PAGE, node=0)
    view = buf.view()
    with pytest.raises(BufferError):
        buf.close()
    assert not buf.closed and mapped(buf.address)
    view.release()
    buf.close()
    buf.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        buf.view()


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"nbytes": 0, "node": 0}, numabind.ConfigError, "positive integer"),
        ({"nbytes": True, "node": 0}, numabind.ConfigError, "positive integer"),
        ({"nbytes": 10, "node": 7}, numabind.ConfigError, "node 7 does not exist"),
        ({"nbytes": 10, "node": [0, "1"]}, numabind.ConfigError, "node="),
        ({"nbytes": 10}, numabind.ConfigError, "give device="),
        ({"nbytes": 10, "node": 0, "policy": "local"}, numabind.ConfigError, "policy="),
        ({"nbytes": 10, "node": 0, "threads": 0}, numabind.ConfigError, "threads"),
        ({"nbytes": 10, "device": 3}, numabind.ConfigError, "device 3"),
    ],
)
def test_bad_requests_say_what_was_wrong(
    kwargs: dict[str, object], error: type, words: str
) -> None:
    before = Path("/proc/self/maps").read_text().count("\n")
    with pytest.raises(error, match=words):
        numabind.host_buffer(**kwargs)  # type: ignore[arg-type]
    assert Path("/proc/self/maps").read_text().count("\n") <= before + 2


def test_more_than_the_node_holds_is_refused_with_the_figures() -> None:
    free = _memory.node_free_bytes(0)
    assert free is not None
    with pytest.raises(numabind.PlacementError) as err:
        numabind.host_buffer(free + (1 << 30), node=0)
    text = str(err.value)
    assert f"{(free + (1 << 30)) / (1 << 20):.0f} MiB do not fit on node 0" in text
    assert "MiB free" in text and "nothing was mapped" in text
    assert isinstance(err.value, MemoryError)


def _memory_cgroup() -> Path | None:
    """A child memory cgroup of this process's (v1 or v2), or None where none can be made."""
    text = Path("/proc/self/cgroup").read_text()
    for line in text.splitlines():
        ident, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            base = Path("/sys/fs/cgroup/memory") / path.lstrip("/")
        elif (
            ident == "0"
            and controllers == ""
            and Path("/sys/fs/cgroup/cgroup.controllers").exists()
        ):
            base = Path("/sys/fs/cgroup") / path.lstrip("/")
        else:
            continue
        child = base / f"numabind-test-{uuid.uuid4().hex[:8]}"
        try:
            child.mkdir()
        except OSError:
            continue
        return child
    return None


@pytest.mark.skipif(os.geteuid() != 0, reason="makes a memory cgroup (root only)")
def test_a_memory_cgroup_limit_is_checked_before_mapping() -> None:
    cg = _memory_cgroup()
    if cg is None:
        pytest.skip("no memory cgroup can be made here")
    try:
        limit = cg / (
            "memory.limit_in_bytes" if (cg / "memory.limit_in_bytes").exists() else "memory.max"
        )
        limit.write_text(str(256 << 20))
        code = (
            "import os, sys, numabind\n"
            "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
            "try:\n    numabind.host_buffer(512 << 20, node=0)\n"
            "except numabind.PlacementError as e:\n    print(e)\n"
        )
        r = subprocess.run(
            [sys.executable, "-c", code, str(cg / "cgroup.procs")],
            capture_output=True,
            text=True,
            env=clean_env(),
        )
        assert "exceed what the cgroup" in r.stdout and str(cg) in r.stdout, r.stdout + r.stderr
        assert "nothing was mapped" in r.stdout
    finally:
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except OSError:
                import time

                time.sleep(0.1)


def test_a_shared_buffer_can_be_mapped_by_another_process() -> None:
    with numabind.host_buffer(PAGE * 4, node=0, shared=True) as buf:
        assert buf.fd is not None
        buf.view()[:5] = b"hello"
        code = "import mmap, sys; m = mmap.mmap(int(sys.argv[1]), 4096); print(m[:5].decode())"
        r = subprocess.run(
            [sys.executable, "-c", code, str(buf.fd)],
            capture_output=True,
            text=True,
            pass_fds=(buf.fd,),
            env=clean_env(),
        )
        assert r.stdout.strip() == "hello", r.stderr
        assert buf.placement() == {0: 4}


def test_huge_asks_for_huge_pages_and_says_which() -> None:
    with numabind.host_buffer(3 << 20, node=0, huge=True) as buf:
        assert buf.mapped_bytes == 4 << 20 and buf.huge in ("hugetlb", "thp", None)
        if buf.huge == "thp":
            assert any("transparent huge pages" in n for n in buf.notes)
        assert sum(buf.placement().values()) == (4 << 20) // PAGE


def test_bind_range_covers_whole_pages_and_says_what_it_left() -> None:
    m = mmap.mmap(-1, 16 * PAGE)
    m[:] = b"\1" * (16 * PAGE)
    import ctypes

    cell = ctypes.c_char.from_buffer(m)
    base = ctypes.addressof(cell)
    del cell
    try:
        r = numabind.bind_range(base + 100, 16 * PAGE - 200, 0)
        assert r.start == base + PAGE and r.nbytes == 14 * PAGE and r.left_out == 2 * PAGE - 200
        assert r.placement == {0: 14} and r.moved == 0 and r.not_moved == {}
        assert any("not whole pages" in n for n in r.notes)
        assert own_numa_maps(base + PAGE) == {0: 14}  # the policy split the mapping
        with pytest.raises(numabind.ConfigError, match="no whole page"):
            numabind.bind_range(base + 1, PAGE, 0)
    finally:
        m.close()


def test_placement_says_what_is_not_present() -> None:
    m = mmap.mmap(-1, 8 * PAGE)
    import ctypes

    cell = ctypes.c_char.from_buffer(m)
    base = ctypes.addressof(cell)
    del cell
    try:
        assert numabind.placement(base, 8 * PAGE) == {None: 8}
        m[: 3 * PAGE] = b"\1" * (3 * PAGE)
        assert numabind.placement(base, 8 * PAGE) == {0: 3, None: 5}
    finally:
        m.close()


def test_refused_policy_calls_fall_back_to_first_touch() -> None:
    code = """
import json, numabind
b = numabind.host_buffer(32 << 20, node=0)
out = {"policy": b.policy, "placement": {str(k): v for k, v in b.placement().items()},
       "notes": b.notes}
try:
    numabind.bind_range(b.address, b.nbytes, 0)
except numabind.KernelError as err:
    out["bind_range"] = err.errno
print(json.dumps(out))
"""
    r = subprocess.run(
        [*SECCOMP, "--calls", "all", "--", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=clean_env(),
    )
    out = json.loads(r.stdout)
    assert out["policy"] == "first-touch" and out["placement"] == {"0": 8192, "None": 0}
    assert "not permitted" in out["notes"][0] and "first touch" in out["notes"][0]
    assert out["bind_range"] == 1  # EPERM, as a KernelError


@two_cpus
def test_check_measures_the_buffers_a_rank_made(two: str, tmp_path: Path) -> None:
    """A rank bound by the hook makes a buffer on its node: its registry entry lists it,
    and check measures it (100% on node 0); closing it removes it from the entry."""
    code = """
import sys, numabind
buf = numabind.host_buffer(16 << 20, device=0)
print(hex(buf.address), flush=True)
sys.stdin.readline()
buf.close()
print("closed", flush=True)
sys.stdin.readline()
"""
    env = clean_env(
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="2",
        NUMABIND_SYSROOT=two,
        NUMABIND_REGISTRY=str(tmp_path),
        NUMABIND="force",
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        address = int(child.stdout.readline(), 16)

        def report() -> dict[str, object]:
            r = subprocess.run(
                [sys.executable, "-m", "numabind", "check", "--pid", str(child.pid), "--json"],
                capture_output=True,
                text=True,
                env=clean_env(NUMABIND_SYSROOT=two, NUMABIND_REGISTRY=str(tmp_path)),
            )
            proc: dict[str, object] = json.loads(r.stdout)["processes"][0]
            return proc

        proc = report()
        (entry,) = proc["host_buffers"]  # type: ignore[misc]
        assert entry["address"] == address and entry["nodes"] == [0] and entry["policy"] == "bind"
        assert entry["locality"] == 1.0 and entry["ok"] is True
        assert entry["pages"] == {"0": (16 << 20) // 4096}
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "closed"
        assert report()["host_buffers"] == []
    finally:
        child.kill()
        child.wait()


def test_the_entry_s_buffers_field_is_bounded() -> None:
    from numabind._registry import MAX_BUFFERS, Entry

    e = Entry(pid=1, start="5", buffers=((0x7F0000000000, 1 << 30, (0, 1), "interleave"),))
    assert Entry.parse(e.encode()) == e
    bad = e.encode().replace(b"/interleave", b"/sideways")
    assert Entry.parse(bad) is None
    many = ";".join(["10+4096@0/bind"] * (MAX_BUFFERS + 1))
    assert Entry.parse(b"pid=1\nstart=5\nbuffers=" + many.encode() + b"\n") is None


@pytest.mark.torch
def test_a_torch_tensor_on_a_node_lives_as_long_as_its_storage() -> None:
    torch = pytest.importorskip("torch")
    import gc

    import numabind.torch as nt

    t = nt.empty_on_node((3, 1000), dtype=torch.float16, node=0)
    storage = t.untyped_storage()
    assert t.shape == (3, 1000) and t.dtype == torch.float16
    assert storage.nbytes() == 6000 and float(t.sum()) == 0.0
    address = storage.data_ptr()
    assert numabind.placement(address, 6000) == {0: 2}
    t[0, 0] = 5
    assert float(t[0, 0]) == 5.0
    del t, storage
    gc.collect()
    assert not mapped(address // PAGE * PAGE), "the buffer went with the tensor"
    assert nt.empty_on_node(0, node=0).shape == (0,)
    assert nt.empty_on_node([2, 2], node=0).dtype == torch.get_default_dtype()


@pytest.mark.torch
def test_torch_tensor_errors_name_the_function_called() -> None:
    """Issue 37 #13: the message names numabind.torch.empty_on_node / pinned_empty /
    pinned_like, not host_buffer(), which the user never called."""
    torch = pytest.importorskip("torch")
    import numabind.torch as nt

    for call, name in (
        (lambda: nt.empty_on_node((4,), node=99), "empty_on_node"),
        (lambda: nt.pinned_empty((4,), node=99), "pinned_empty"),
        (lambda: nt.pinned_like(torch.zeros(4), node=99), "pinned_like"),
    ):
        with pytest.raises(numabind.ConfigError, match=rf"^numabind\.torch\.{name}\(\): node 99"):
            call()
