"""Host buffers registered with the GPU driver, against stand-in driver libraries the tests
build from C source (tests/standin/) with the system compiler and load under the real
sonames (libcuda.so.1, libamdhip64.so) from a private directory.  The stand-ins record
every call and check what the real driver needs: a context current at registration,
the PORTABLE flag, every page present when registered, unregister before unmap.  The
same scenario runs against the real driver where this machine has an NVIDIA GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import clean_env

PRELUDE = """
import ctypes, gc, json, os, sys
import numabind, numabind.memory._driver as driver
lib = None
def standin(name="libcuda.so.1"):
    global lib
    lib = ctypes.CDLL(name)
    lib.standin_log.restype = ctypes.c_char_p
    return lib
def log():
    return lib.standin_log().decode().splitlines() if lib is not None else []
def mapped(address):
    with open("/proc/self/maps") as f:
        return any(int(line.split("-")[0], 16) <= address < int(line.split()[0].split("-")[1], 16)
                   for line in f)
out = {}
"""


def run(code: str, libdir: Path | None, **env: str) -> dict[str, object]:
    r = subprocess.run(
        [sys.executable, "-c", PRELUDE + code],
        env=clean_env(LD_LIBRARY_PATH=str(libdir) if libdir else "/nonexistent", **env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


REGISTER = """
driver.CHUNK = 1 << 20  # three chunks for a 3 MiB buffer
standin()
buf = numabind.host_buffer(3 << 20, node=0)
out.update(registered=buf.registered, with_=buf.registered_with, dontfork=buf.dontfork,
           live=lib.standin_registered(), depth=lib.standin_ctx_depth(),
           retained=lib.standin_retained(0), address=buf.address)
buf.view()[:5] = b"hello"
buf.close()
out.update(after_live=lib.standin_registered(), after_retained=lib.standin_retained(0),
           after_mapped=mapped(out["address"]), log=log())
print(json.dumps(out))
"""


def test_registration_in_chunks_with_a_pushed_primary_context(
    standin: dict[str, Path],
) -> None:
    got = run(REGISTER, standin["libcuda.so.1"])
    assert got["registered"] and got["with_"] == "CUDA driver" and got["dontfork"]
    assert got["live"] == 3 and got["depth"] == 0 and got["retained"] == 1, got
    assert got["after_live"] == 0 and got["after_retained"] == 0 and not got["after_mapped"]
    calls = [line.split()[0] for line in got["log"]]  # type: ignore[union-attr]
    assert calls == [
        "cuInit",
        "cuDeviceGet",
        "cuDevicePrimaryCtxRetain",
        "cuCtxPushCurrent_v2",
        *["cuMemHostRegister_v2"] * 3,
        "cuCtxPopCurrent_v2",
        "cuCtxPushCurrent_v2",
        *["cuMemHostUnregister"] * 3,
        "cuCtxPopCurrent_v2",
        "cuDevicePrimaryCtxRelease_v2",
    ], got["log"]
    registers = [line.split() for line in got["log"] if line.startswith("cuMemHostRegister")]  # type: ignore[union-attr]
    assert all(r[3] == "1" and r[2] == str(1 << 20) for r in registers)  # PORTABLE, 1 MiB
    assert int(registers[0][1], 16) == got["address"]
    assert not any("ERROR" in line for line in got["log"])  # type: ignore[union-attr]


def test_the_callers_context_is_untouched(standin: dict[str, Path]) -> None:
    code = """
standin()
lib.cuInit(0)
lib.cuCtxPushCurrent_v2(ctypes.c_void_p(0x9999))  # the caller's own context
buf = numabind.host_buffer(1 << 20, node=0)
out.update(registered=buf.registered, depth=lib.standin_ctx_depth())
buf.close()
out.update(depth_after=lib.standin_ctx_depth())
print(json.dumps(out))
"""
    got = run(code, standin["libcuda.so.1"])
    assert got == {"registered": True, "depth": 1, "depth_after": 1}


FORK = """
standin()
buf = numabind.host_buffer(1 << 20, node=0, dontfork={dontfork})
buf.view()[:2] = b"ok"
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, json.dumps(mapped(buf.address)).encode())
    os._exit(0)
os.waitpid(pid, 0)
out.update(child=json.loads(os.read(r, 100)), parent=mapped(buf.address),
           data=bytes(buf.view()[:2]).decode(), where=buf.placement().get(0, 0))
buf.close()
print(json.dumps(out))
"""


@pytest.mark.parametrize("dontfork", [True, False])
def test_fork_does_not_map_a_registered_buffer(standin: dict[str, Path], dontfork: bool) -> None:
    got = run(FORK.format(dontfork=dontfork), standin["libcuda.so.1"])
    assert got["parent"] and got["data"] == "ok" and got["where"] == 256
    assert got["child"] is (not dontfork)


def test_no_driver_auto_skips_with_a_note_and_true_raises(standin: dict[str, Path]) -> None:
    code = """
buf = numabind.host_buffer(1 << 20, node=0)
out.update(registered=buf.registered, reason=buf.register_reason, notes=buf.notes)
buf.close()
before = open("/proc/self/maps").read().count("numabind-host-buffer")
try:
    numabind.host_buffer(1 << 20, node=0, register=True)
except numabind.RegistrationError as err:
    out.update(error=str(err))
out.update(left=open("/proc/self/maps").read().count("numabind-host-buffer") - before)
print(json.dumps(out))
"""
    got = run(code, None)
    assert got["registered"] is False
    assert "libcuda.so.1 does not load" in got["reason"]  # type: ignore[operator]
    assert any("not registered with a GPU driver" in n for n in got["notes"])  # type: ignore[union-attr]
    assert "not registered" in got["error"] and got["left"] == 0  # type: ignore[operator]


def test_cuinit_failing_is_named(standin: dict[str, Path]) -> None:
    code = """
buf = numabind.host_buffer(1 << 20, node=0)
out.update(registered=buf.registered, reason=buf.register_reason)
print(json.dumps(out))
"""
    got = run(code, standin["libcuda.so.1"], STANDIN_INIT_ERROR="100")
    assert got["registered"] is False
    reason = str(got["reason"])
    assert reason.startswith("CUDA driver: cuInit failed: CUDA_ERROR_NO_DEVICE (100); no HIP")


def test_a_registration_failing_half_way_undoes_the_chunks(standin: dict[str, Path]) -> None:
    code = """
driver.CHUNK = 1 << 20
standin()
buf = numabind.host_buffer(3 << 20, node=0)
out.update(registered=buf.registered, reason=buf.register_reason, live=lib.standin_registered(),
           retained=lib.standin_retained(0), depth=lib.standin_ctx_depth(),
           placed=buf.placement().get(0, 0), log=log())
buf.view()[-1] = 7
buf.close()
print(json.dumps(out))
"""
    got = run(code, standin["libcuda.so.1"], STANDIN_FAIL_AT="2")
    assert got["registered"] is False
    assert "CUDA_ERROR_OUT_OF_MEMORY (2)" in got["reason"]  # type: ignore[operator]
    assert "1 of 3 chunks had registered" in got["reason"]  # type: ignore[operator]
    assert got["live"] == 0 and got["retained"] == 0 and got["depth"] == 0
    assert got["placed"] == 768  # kept placed: every page of 3 MiB on node 0
    tail = [line.split()[0] for line in got["log"]][-4:]  # type: ignore[union-attr]
    assert tail == [
        "FAIL",
        "cuMemHostUnregister",
        "cuCtxPopCurrent_v2",
        "cuDevicePrimaryCtxRelease_v2",
    ]


def test_registration_needs_populated_pages(standin: dict[str, Path]) -> None:
    code = """
standin()
buf = numabind.host_buffer(1 << 20, node=0, populate=False)
out.update(registered=buf.registered, reason=buf.register_reason, calls=len(log()))
try:
    numabind.host_buffer(1 << 20, node=0, populate=False, register=True)
except numabind.ConfigError as err:
    out.update(error=str(err))
print(json.dumps(out))
"""
    got = run(code, standin["libcuda.so.1"])
    assert got["registered"] is False and "populate=False" in got["reason"]  # type: ignore[operator]
    assert got["calls"] == 0  # the driver was not even loaded
    assert "needs populate=True" in got["error"]  # type: ignore[operator]


def test_close_while_in_use_keeps_it_registered(standin: dict[str, Path]) -> None:
    code = """
standin()
buf = numabind.host_buffer(1 << 20, node=0)
view = buf.view()
try:
    buf.close()
except BufferError:
    out.update(raised=True)
out.update(live=lib.standin_registered(), registered=buf.registered, closed=buf.closed)
del view
buf.close()
out.update(live_after=lib.standin_registered(), log=[l.split()[0] for l in log()])
print(json.dumps(out))
"""
    got = run(code, standin["libcuda.so.1"])
    assert got["raised"] and got["live"] == 1 and got["registered"] and not got["closed"]
    assert got["live_after"] == 0
    assert not any("ERROR" in line for line in got["log"])  # type: ignore[union-attr]


def test_a_dropped_buffer_is_unregistered_before_it_is_unmapped(standin: dict[str, Path]) -> None:
    code = """
standin()
buf = numabind.host_buffer(1 << 20, node=0)
address = buf.address
del buf
gc.collect()
out.update(live=lib.standin_registered(), mapped=mapped(address), log=log())
print(json.dumps(out))
"""
    got = run(code, standin["libcuda.so.1"])
    assert got["live"] == 0 and not got["mapped"]
    assert not any("ERROR" in line for line in got["log"])  # type: ignore[union-attr]


def test_hip_registers_and_sets_the_callers_device_back(standin: dict[str, Path]) -> None:
    code = """
standin("libamdhip64.so")
lib.hipSetDevice(2)  # the caller's device
buf = numabind.host_buffer(1 << 20, node=0)
dev = ctypes.c_int()
lib.hipGetDevice(ctypes.byref(dev))
out.update(registered=buf.registered, with_=buf.registered_with, device=dev.value,
           live=lib.standin_registered())
buf.close()
out.update(live_after=lib.standin_registered(), log=log())
print(json.dumps(out))
"""
    got = run(code, standin["libamdhip64.so"])
    assert got["registered"] and got["with_"] == "HIP runtime" and got["device"] == 2
    assert got["live"] == 1 and got["live_after"] == 0
    lines = got["log"]
    assert any(
        line.startswith("hipHostRegister") and line.endswith("on device 0") for line in lines
    )  # type: ignore[union-attr]
    assert not any("ERROR" in line for line in lines)  # type: ignore[union-attr]


def test_bad_register_argument() -> None:
    code = """
try:
    numabind.host_buffer(1 << 20, node=0, register="yes")
except numabind.ConfigError as err:
    out.update(error=str(err))
print(json.dumps(out))
"""
    assert "register must be 'auto', True or False" in run(code, None)["error"]  # type: ignore[operator]


@pytest.mark.torch
def test_pinned_empty_is_registered_and_undone_with_its_storage(standin: dict[str, Path]) -> None:
    pytest.importorskip("torch")
    code = """
import torch, numabind.torch as nt
standin()
t = nt.pinned_empty((256, 1024), dtype=torch.float32, node=0)
out.update(live=lib.standin_registered(), shape=list(t.shape), nbytes=t.untyped_storage().nbytes())
t[0, 0] = 1.5
view = t[0]
del t
gc.collect()
out.update(live_view=lib.standin_registered(), value=float(view[0]))
del view
gc.collect()
out.update(live_after=lib.standin_registered(), log=log())
like = nt.pinned_like(torch.arange(6.0).reshape(2, 3), node=0, policy="preferred")
out.update(like=like.tolist())
print(json.dumps(out))
"""
    got = run(code, standin["libcuda.so.1"])
    assert got["live"] == 1 and got["shape"] == [256, 1024] and got["nbytes"] == 1 << 20
    assert got["live_view"] == 1 and got["value"] == 1.5  # a view keeps it registered
    assert got["live_after"] == 0
    assert not any("ERROR" in line for line in got["log"])  # type: ignore[union-attr]
    assert got["like"] == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


@pytest.mark.torch
def test_pinned_empty_on_the_cpu_build_says_it_is_not_registered() -> None:
    pytest.importorskip("torch")
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import numabind.torch as nt; t = nt.pinned_empty(4, node=0); "
            "u = nt.pinned_empty(4, node=0); print(t.is_pinned(), t.numel())",
        ],
        env=clean_env(LD_LIBRARY_PATH="/nonexistent"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "4"]
    lines = [x for x in r.stderr.splitlines() if "not registered" in x]
    assert len(lines) == 1 and "libcuda.so.1 does not load" in lines[0], r.stderr


def test_registration_against_the_real_driver_where_there_is_a_gpu() -> None:
    """The same scenario as the stand-in's, on the machine's own libcuda.so.1 when it has
    an NVIDIA GPU; where it has none, that is what is checked (so a GPU machine cannot
    pass this test without running the scenario)."""
    has_gpu = os.path.exists("/dev/nvidiactl") and os.path.exists("/dev/nvidia0")
    if not has_gpu:
        import ctypes

        try:
            ctypes.CDLL("libcuda.so.1")
            loads = True
        except OSError:
            loads = False
        assert not loads or not os.path.exists("/proc/driver/nvidia/gpus")
        return
    code = """
buf = numabind.host_buffer(64 << 20, node=0)
out.update(registered=buf.registered, with_=buf.registered_with, reason=buf.register_reason)
buf.close()
print(json.dumps(out))
"""
    got = run(code, Path(os.environ.get("LD_LIBRARY_PATH", "/usr/lib/x86_64-linux-gnu")))
    assert got["registered"] and got["with_"] == "CUDA driver", got
