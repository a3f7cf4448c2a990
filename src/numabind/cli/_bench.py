"""``numabind bench``: what remote memory costs on this machine, measured, not assumed.

From the CPUs a rank would be bound to, it measures copy bandwidth and access latency to
each NUMA node's memory and reports remote against local as a ratio, with a verdict
("binding pays" / "no measurable difference").  The published effects are bimodal (3x
copy bandwidth on GB200, nothing for GPU-bound serving); this is how a user finds out
which case their machine is.

How, without compiled code:

* A buffer is placed on a node with ``mbind(MPOL_BIND)`` before it is first touched, and
  its placement is verified page by page (``move_pages`` asks where each page is) before a
  number is trusted: below 0.99 of its pages on the node, the measurement is reported as
  untrusted.  Where a seccomp filter refuses ``mbind``/``move_pages``, pages are placed by
  first touch from the node's own CPUs and verified from ``/proc/self/numa_maps``.
* Copy bandwidth: ``memoryview`` slice assignment, which is one ``memcpy`` in C.
* Latency: a random cyclic pointer chase over cache lines (each step depends on the last),
  timed against the same chase over a buffer that fits in the L1 cache: the difference per
  step is the memory latency, the interpreter's own cost per step subtracted.  Reported as
  the median of the rounds: a difference of two noisy timings can come out at zero, and
  the smallest round would then report noise as the latency (copies report the best).
* Pinned host<->device copies (when torch with a CUDA GPU is present): a pinned buffer on
  the GPU's node against one on the farthest CPU node.

It uses at most a stated share of each node's free memory (default 25%), restores the
caller's CPU mask and memory policy, and never prints an estimated number.
"""

from __future__ import annotations

import os
import random
import statistics
import time

from .. import _kernel, _sysfs
from .._errors import CaptureError, UsageError
from .._model import Record
from .._pin import ThreadPin
from .._plan import Placement
from ._common import OK, OutputFile, one_stdout, write_json, write_lines

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from typing import Any

    from .._topology import Machine

PAGE = 4096
LINE = 64
TRUSTED = 0.99
# remote/local below this is within what these methods tell apart on a noisy machine (real
# remote/local ratios are 1.3x and up: docs/when-binding-matters.rst)
NO_DIFFERENCE = 1.20
# a latency chase over less than this is answered by the larger last-level caches (AMD
# parts have up to 1 GiB of 3D V-Cache per socket; 64 MiB covers most): not memory latency
MIN_LATENCY_SPAN = 64 << 20
UNTRUSTED = (
    f"(untrusted): under {TRUSTED:.0%} of the buffer's pages verified on the node, or a "
    f"latency chase through less than {MIN_LATENCY_SPAN >> 20} MiB (--quick: the caches "
    "answer much of it); not used in the verdict"
)
DEFAULT_SIZE, QUICK_SIZE = 64 << 20, 16 << 20


def _rounded(d: dict[str, Any], m: Measurement | GpuCopy) -> dict[str, Any]:
    """A measured row's JSON: values rounded as far as they mean anything, and whether
    the row is to be trusted."""
    d["trusted"] = m.trusted
    d["value"] = round(m.value, 3)
    d["pages_verified_on_node"] = round(m.pages_verified_on_node, 4)
    d["samples"] = [round(v, 3) for v in m.samples]
    return d


class Measurement(Record):
    """One number: ``kind`` copy (GB/s), latency (ns), h2d/d2h (GB/s, pinned copies)."""

    from_cpus: frozenset[int]
    from_node: int | None
    memory_node: int
    kind: str
    value: float
    unit: str
    pages_verified_on_node: float
    placement: str  # "mbind" or "first touch"
    # the value of each round; rounds run interleaved over the nodes, so sample i of every
    # node was taken at about the same time (what the verdict pairs up)
    samples: tuple[float, ...] = ()
    span_bytes: int = 0  # latency: the memory the chase walks through

    @property
    def trusted(self) -> bool:
        """Its pages were verified on the node and, for a latency, the chase spanned
        enough memory that caches do not answer most loads (``--quick`` does not)."""
        if self.kind == "latency" and self.span_bytes < MIN_LATENCY_SPAN:
            return False
        return self.pages_verified_on_node >= TRUSTED

    def to_dict(self) -> dict[str, Any]:
        return _rounded(super().to_dict(), self)


class _Buffer:
    """An anonymous mapping placed on one node and verified there."""

    def __init__(self, size: int, node: int, cpus: frozenset[int], machine: Machine) -> None:
        import ctypes
        import mmap

        self.size = size
        self.map = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        anchor = ctypes.c_char.from_buffer(self.map)
        self.addr = ctypes.addressof(anchor)
        del anchor  # an exported pointer would keep the mapping from closing
        self.placement = "mbind"
        try:
            _kernel.mbind(self.addr, size, "bind", {node})
        except OSError:
            # refused (seccomp) or not permitted: place by first touch from the node's CPUs
            self.placement = "first touch"
        view = memoryview(self.map)
        if self.placement == "first touch":
            found = machine.node(node)
            node_cpus = found.cpus if found is not None else frozenset()
            with ThreadPin(Placement(cpus=node_cpus)):  # no CPUs: touched from anywhere
                self._touch(view)
        else:
            self._touch(view)
        self.view = view
        self.verified = self._verify(node)

    @staticmethod
    def _touch(view: memoryview) -> None:
        chunk = b"\x01" * (1 << 20)
        for off in range(0, len(view), len(chunk)):
            n = min(len(chunk), len(view) - off)
            view[off : off + n] = chunk[:n]

    def _verify(self, node: int) -> float:
        return _verify_range(self.addr, self.size, node)

    def close(self) -> None:
        self.view.release()
        self.map.close()


def _copy_seconds(src: _Buffer, dst: memoryview) -> float:
    t0 = time.perf_counter()
    dst[: src.size] = src.view
    return time.perf_counter() - t0


def _chain(view: memoryview, lines: int, seed: int) -> None:
    """A random single cycle over ``lines`` cache lines: slot k holds the next index."""
    order = list(range(lines))
    random.Random(seed).shuffle(order)
    words = view.cast("q")
    step = LINE // 8
    for a, b in zip(order, order[1:] + order[:1]):
        words[a * step] = b * step
    words.release()


def _chase(words: memoryview, steps: int) -> float:
    i = 0
    t0 = time.perf_counter()
    for _ in range(steps):
        i = words[i]
    return time.perf_counter() - t0


def _chase_ns(words: memoryview, near: memoryview, steps: int) -> float:
    """Nanoseconds per dependent load, less the interpreter's own cost per step (the same
    chase over a small, cached buffer)."""
    far = _chase(words, steps)
    return max((far - _chase(near, steps)) / steps, 0.0) * 1e9


def free_bytes(machine: Machine, node: int) -> int | None:
    """MemFree of a node from its meminfo (the source's root), None when unknown."""
    root = getattr(machine.source, "root", None)
    text = root.opt(f"/sys/devices/system/node/node{node}/meminfo") if root is not None else None
    for line in (text or "").splitlines():
        if "MemFree:" in line:
            value = _sysfs.parse_int(line.split()[-2])
            return value * 1024 if value is not None else None
    return None


def _rounds(
    bufs: list[tuple[int, _Buffer]],
    dst: _Buffer,
    small: memoryview,
    cpus: frozenset[int],
    local_node: int | None,
    rounds: int,
    steps: int,
    span: int,
) -> list[Measurement]:
    """Every round copies from and chases through every node's buffer in turn (the order
    reversed each round), so a burst of load elsewhere on the machine slows all nodes'
    samples of that round alike instead of one node's whole measurement."""
    copies: dict[int, list[float]] = {n: [] for n, _ in bufs}
    lats: dict[int, list[float]] = {n: [] for n, _ in bufs}
    words = {}
    for n, buf in bufs:
        _chain(buf.view, min(buf.size, span) // LINE, 1)
        words[n] = buf.view.cast("q")
    near = small.cast("q")
    try:
        for r in range(rounds):
            order = bufs if r % 2 == 0 else bufs[::-1]
            for n, buf in order:
                copies[n].append(buf.size / _copy_seconds(buf, dst.view) / 1e9)
            for n, _ in order:
                lats[n].append(_chase_ns(words[n], near, steps))
    finally:
        for w in words.values():
            w.release()
        near.release()
    out = []
    for n, buf in bufs:
        for kind, samples, unit, best in (
            ("copy", copies[n], "GB/s", max),
            ("latency", lats[n], "ns", statistics.median),
        ):
            out.append(
                Measurement(
                    from_cpus=cpus,
                    from_node=local_node,
                    memory_node=n,
                    kind=kind,
                    value=best(samples),
                    unit=unit,
                    pages_verified_on_node=buf.verified,
                    placement=buf.placement,
                    samples=tuple(samples),
                    span_bytes=min(buf.size, span) if kind == "latency" else 0,
                )
            )
    return out


def measure(
    machine: Machine,
    cpus: frozenset[int],
    from_node: int | None,
    *,
    size: int = 64 << 20,
    share: float = 0.25,
    quick: bool = False,
) -> list[Measurement]:
    """Copy bandwidth and latency from ``cpus`` to every node with memory."""
    out: list[Measurement] = []
    rounds = 3 if quick else 7
    steps = 20_000 if quick else 400_000
    # the chase's working set; --quick walks 8 MiB (a check of the structure, and its
    # latencies are marked untrusted: caches answer much of such a chase)
    span = (8 << 20) if quick else size
    with ThreadPin(Placement(cpus=cpus)):
        local_node = from_node if from_node is not None else machine.node_of_cpu(min(cpus))
        # the destination of copies and the small chase live on the CPUs' own node
        dst = _Buffer(size, local_node if local_node is not None else 0, cpus, machine)
        small = memoryview(bytearray(16 << 10))
        _chain(small, len(small) // LINE, 2)
        bufs: list[tuple[int, _Buffer]] = []
        try:
            for node in machine.nodes:
                free = free_bytes(machine, node.id)
                this = size
                if free is not None:
                    this = min(size, int(free * share) // PAGE * PAGE)
                if this < 4 << 20:
                    continue  # too little free memory to measure without crowding the node
                bufs.append((node.id, _Buffer(this, node.id, cpus, machine)))
            out = _rounds(bufs, dst, small, cpus, local_node, rounds, steps, span)
        finally:
            for _, buf in bufs:
                buf.close()
            dst.close()
    return out


# --- pinned host<->device copies -----------------------------------------------------------------

GPU_ROUNDS, QUICK_GPU_ROUNDS = 5, 3
AT_ONCE_COPIES = 3  # copies per GPU per round when every GPU copies at once


class GpuCopy(Record):
    """Pinned copies between registered host buffers and device memory, timed through
    the driver's own calls: one GPU alone (``devices`` has one index) or every GPU at
    once (``value`` is then all GPUs' bytes over the wall time from the first copy's start
    to the last one's end)."""

    devices: tuple[int, ...]  # the GPUs copying (visible indices)
    gpu_nodes: tuple[int, ...]  # each GPU's node
    host: str  # "local": each buffer on its GPU's node; "remote": on the farthest node
    memory_nodes: tuple[int, ...]  # where each GPU's buffer is
    kind: str  # "h2d" or "d2h"
    value: float  # GB/s, the best round
    samples: tuple[float, ...]  # one per round; rounds alternate local and remote
    pages_verified_on_node: float  # the lowest share of a buffer's pages on its node
    bytes: int  # per copy

    @property
    def trusted(self) -> bool:
        return self.pages_verified_on_node >= TRUSTED

    def to_dict(self) -> dict[str, Any]:
        return _rounded(super().to_dict(), self)


class GpuReport(Record):
    """What the pinned-copy part of ``numabind bench`` measured and what it says."""

    driver: str
    bytes: int
    copies: tuple[GpuCopy, ...]
    verdict: str
    ratio: float | None
    notes: tuple[str, ...] = ()  # GPUs or remote buffers left out, and why

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["ratio"] = None if self.ratio is None else round(self.ratio, 3)
        return d


class _Lane:
    """One GPU's part: its buffers (local, and remote where there is another node), its
    device memory and stream, and the CPUs its copies are issued from (its ranks')."""

    def __init__(self, index: int, acc: Any, node: int, cpus: frozenset[int]) -> None:
        self.index = index
        self.acc = acc
        self.node = node
        self.cpus = cpus
        self.remote: int | None = None
        self.buffers: dict[str, Any] = {}  # "local"/"remote" -> HostBuffer
        self.copies: Any = None  # numabind.memory._driver.DeviceCopies

    def pin(self) -> ThreadPin:
        """Issue this GPU's copies from its ranks' CPUs (the calling thread only; CPUs this
        process may not use, a cgroup's, leave the copies issued from anywhere)."""
        return ThreadPin(Placement(cpus=self.cpus))

    def close(self) -> None:
        if self.copies is not None:
            self.copies.close()
        for buf in self.buffers.values():
            buf.close()


def _lanes(machine: Machine, plans: list[Any], rank: int | None, node: int | None) -> list[_Lane]:
    """One lane per GPU of the plans (the first plan's CPUs for a GPU several ranks share;
    a GPU's node and its CPUs where the plan does not bind, as on a one-node machine), its
    remote node the farthest other node with CPUs and memory this process may
    place memory on."""
    from .._plan import device_node

    lanes: dict[str, _Lane] = {}
    for p in plans:
        if p.device is None or (rank is not None and p.local_rank != rank):
            continue
        gpu_node, cpus = p.numa_node, frozenset(p.cpus)
        if not p.bound:  # one node (nothing to bind), or a rank left as it is: the GPU's own
            gpu_node = device_node(machine, p.device).node
            if gpu_node is None and len(machine.cpu_nodes) == 1:
                gpu_node = machine.cpu_nodes[0].id
            found = machine.node(gpu_node) if gpu_node is not None else None
            cpus = (found.cpus & machine.allowed.cpus) if found is not None else frozenset()
        if gpu_node is None or (node is not None and gpu_node != node):
            continue
        key = p.device.pci or str(p.device_index)
        if key not in lanes:
            lanes[key] = _Lane(p.device_index or 0, p.device, gpu_node, cpus)
    mems = machine.allowed.mems
    for lane in lanes.values():
        here = machine.node(lane.node, full=True)
        others = []
        for n in machine.cpu_nodes:
            full = machine.node(n.id, full=True)
            has_memory = full is None or full.memory_bytes != 0
            if n.id != lane.node and (mems is None or n.id in mems) and has_memory:
                others.append(n.id)
        if others:
            lane.remote = max(
                others, key=lambda n: ((here.distance_to(n) or 0) if here is not None else 0, -n)
            )
    return list(lanes.values())


def _buffer_bytes(machine: Machine, lanes: list[_Lane], size: int, share: float) -> int:
    """One size for every buffer (so that local and remote compare like for like): at most
    ``size``, and the buffers on a node together at most ``share`` of its free memory."""
    count: dict[int, int] = {}
    for lane in lanes:
        for n in (lane.node, lane.remote):
            if n is not None:
                count[n] = count.get(n, 0) + 1
    nbytes = size
    for n, k in count.items():
        free = free_bytes(machine, n)
        if free is not None:
            nbytes = min(nbytes, int(free * share) // k // PAGE * PAGE)
    return nbytes


def _alone(lane: _Lane, nbytes: int, rounds: int) -> dict[tuple[str, str], list[float]]:
    """One GPU copying alone, from its ranks' CPUs: each round copies both ways from each
    of its buffers, local and remote in turn (the order reversed each round)."""
    out: dict[tuple[str, str], list[float]] = {}
    hosts = list(lane.buffers)
    with lane.pin():
        for host in hosts:  # the first copy of each kind sets up the driver's paths
            for kind in ("h2d", "d2h"):
                lane.copies.copy(kind, lane.buffers[host].address, nbytes)
        for r in range(rounds):
            for host in hosts if r % 2 == 0 else hosts[::-1]:
                for kind in ("h2d", "d2h"):
                    seconds = lane.copies.copy(kind, lane.buffers[host].address, nbytes)
                    out.setdefault((host, kind), []).append(nbytes / seconds / 1e9)
    return out


def _at_once(lanes: list[_Lane], host: str, kind: str, nbytes: int) -> float:
    """Every GPU copies :data:`AT_ONCE_COPIES` times from its ``host`` buffer, started
    together (one thread per GPU, on its ranks' CPUs; the driver's calls release the GIL):
    all the bytes over the wall time from the first start to the last end, GB/s."""
    import threading

    start = threading.Barrier(len(lanes))
    spans: list[tuple[float, float]] = []
    failures: list[BaseException] = []

    def work(lane: _Lane) -> None:
        lane.pin().apply()  # a thread of its own, ending here: nothing to put back
        try:
            start.wait(timeout=60)
            t0 = time.perf_counter()
            for _ in range(AT_ONCE_COPIES):
                lane.copies.copy(kind, lane.buffers[host].address, nbytes)
            spans.append((t0, time.perf_counter()))
        except BaseException as err:  # reported by the caller
            failures.append(err)
            start.abort()

    threads = [threading.Thread(target=work, args=(lane,), daemon=True) for lane in lanes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    real = [f for f in failures if not isinstance(f, threading.BrokenBarrierError)]
    if real or failures:
        raise (real or failures)[0]
    wall = max(end for _, end in spans) - min(begin for begin, _ in spans)
    return len(lanes) * AT_ONCE_COPIES * nbytes / wall / 1e9


def gpu_copies(
    machine: Machine,
    plans: list[Any],
    *,
    rank: int | None = None,
    node: int | None = None,
    size: int = DEFAULT_SIZE,
    share: float = 0.25,
    quick: bool = False,
) -> GpuReport | str:
    """Pinned host->device and device->host bandwidth from a registered host buffer on
    each GPU's node against one on the farthest node: each GPU alone, then every GPU at
    once (one copy on a PCIe link is often bound by the link; the host memory's node
    shows under concurrency, when the sockets' interconnect carries every GPU's traffic).
    A reason string when there is nothing to measure."""
    from .._errors import NumabindError
    from ..memory import _driver

    lanes = _lanes(machine, plans, rank, node)
    if not lanes:
        return "no GPU (no plan binds a GPU here)"
    driver, why = _driver.driver_for(lanes[0].acc)
    if driver is None:
        return f"no GPU driver ({why})"
    if not driver.can_copy:
        return f"not measured: numabind times copies only through the driver ({driver.name})"
    nbytes = _buffer_bytes(machine, lanes, size, share)
    if nbytes < 4 << 20:
        return "not measured: too little free memory for a buffer of 4 MiB per GPU and node"
    rounds = QUICK_GPU_ROUNDS if quick else GPU_ROUNDS
    try:
        verified, notes = _open(lanes, driver, nbytes)
        if not lanes:
            return "not measured: " + "; ".join(notes)
        alone = [_alone(lane, nbytes, rounds) for lane in lanes]
        together: dict[tuple[str, str], list[float]] = {}
        if len(lanes) > 1:
            hosts = ["local"]
            if all(lane.remote is not None for lane in lanes):
                hosts.append("remote")
            for r in range(rounds):
                for host in hosts if r % 2 == 0 else hosts[::-1]:
                    for kind in ("h2d", "d2h"):
                        together.setdefault((host, kind), []).append(
                            _at_once(lanes, host, kind, nbytes)
                        )
    except (NumabindError, OSError) as err:
        return f"not measured: {err}"
    finally:
        for lane in lanes:
            lane.close()
    out = _gpu_rows(lanes, alone, together, verified, nbytes)
    text_, ratio = gpu_verdict(out)
    return GpuReport(
        driver=driver.name,
        bytes=nbytes,
        copies=tuple(out),
        verdict=text_,
        ratio=ratio,
        notes=tuple(notes),
    )


def _open(
    lanes: list[_Lane], driver: Any, nbytes: int
) -> tuple[dict[tuple[int, str], float], list[str]]:
    """Each GPU's registered buffers (local, remote) and device memory, and the share of
    each buffer's pages on its node.  A GPU whose own buffer or device memory cannot be
    had is left out, and one whose remote buffer cannot is measured locally only (a
    container's cpuset.mems, a node short of memory): each said in a note.  Removes the
    lanes left out from ``lanes``."""
    from .._errors import NumabindError
    from .._range import share_on
    from ..memory import _driver
    from ..memory._memory import host_buffer

    verified: dict[tuple[int, str], float] = {}
    notes: list[str] = []
    for lane in list(lanes):
        try:
            for host, where in (("local", lane.node), ("remote", lane.remote)):
                if where is None:
                    continue
                try:
                    buf = host_buffer(nbytes, node=where, device=lane.acc.pci or lane.index,
                                      register=True)  # fmt: skip
                except (NumabindError, OSError) as err:
                    if host == "local":
                        raise
                    notes.append(f"GPU {lane.index}: no remote buffer on node {where}: {err}")
                    lane.remote = None
                    continue
                lane.buffers[host] = buf
                verified[(lane.index, host)] = share_on(buf.placement(), [where])
            handle = driver.device(lane.acc, lane.index)
            lane.copies = _driver.DeviceCopies(driver, handle, nbytes)
        except (NumabindError, OSError) as err:
            notes.append(f"GPU {lane.index}: not measured: {err}")
            lane.close()
            lanes.remove(lane)
    return verified, notes


def _gpu_rows(
    lanes: list[_Lane],
    alone: list[dict[tuple[str, str], list[float]]],
    together: dict[tuple[str, str], list[float]],
    verified: dict[tuple[int, str], float],
    nbytes: int,
) -> list[GpuCopy]:
    out: list[GpuCopy] = []
    for lane, got in zip(lanes, alone):
        for (host, kind), samples in got.items():
            where = lane.node if host == "local" else lane.remote
            out.append(
                GpuCopy(
                    devices=(lane.index,),
                    gpu_nodes=(lane.node,),
                    host=host,
                    memory_nodes=(where if where is not None else -1,),
                    kind=kind,
                    value=max(samples),
                    samples=tuple(samples),
                    pages_verified_on_node=verified[(lane.index, host)],
                    bytes=nbytes,
                )
            )
    for (host, kind), samples in together.items():
        nodes = [lane.node if host == "local" else lane.remote for lane in lanes]
        out.append(
            GpuCopy(
                devices=tuple(lane.index for lane in lanes),
                gpu_nodes=tuple(lane.node for lane in lanes),
                host=host,
                memory_nodes=tuple(n if n is not None else -1 for n in nodes),
                kind=kind,
                value=max(samples),
                samples=tuple(samples),
                pages_verified_on_node=min(verified[(lane.index, host)] for lane in lanes),
                bytes=nbytes,
            )
        )
    return out


def gpu_verdict(copies: list[GpuCopy] | tuple[GpuCopy, ...]) -> tuple[str, float | None]:
    """One line on whether a pinned buffer's node matters here, and the local/remote
    bandwidth ratio it rests on: from every GPU at once where there are several (the case
    that loads the sockets' interconnect), else from the one GPU; the ratio is the smaller
    of the best values' and the round-by-round median's, as for memory copies."""
    trusted = [c for c in copies if c.trusted]
    if copies and not trusted:
        return "no trusted measurement: the buffers' pages could not be placed where asked", None
    width = max((len(c.devices) for c in trusted), default=0)
    rows = [c for c in trusted if len(c.devices) == width]
    best: tuple[float, str, str] | None = None
    for kind in ("h2d", "d2h"):
        groups: dict[tuple[int, ...], dict[str, GpuCopy]] = {}
        for c in rows:
            if c.kind == kind:
                groups.setdefault(c.devices, {})[c.host] = c
        for devices, pair in groups.items():
            local, remote = pair.get("local"), pair.get("remote")
            if local is None or remote is None or remote.value <= 0:
                continue
            ratio = local.value / remote.value
            paired = _paired(local.samples, remote.samples)
            if paired is not None:
                ratio = min(ratio, paired)
            who = f"{len(devices)} GPUs at once" if len(devices) > 1 else f"GPU {devices[0]}"
            if best is None or ratio > best[0]:
                best = (ratio, kind, who)
    if best is None:
        return "one NUMA node near the GPUs: no remote host memory to compare", None
    ratio, kind, who = best
    if ratio < NO_DIFFERENCE:
        return (
            f"no measurable difference (local/remote {ratio:.2f}x, {kind}, {who}): "
            "a pinned buffer's node does not limit copies here",
            ratio,
        )
    return (
        f"copies from a remote host buffer are {ratio:.1f}x slower ({kind}, {who}): "
        "place pinned buffers on the GPU's node (numabind.host_buffer)",
        ratio,
    )


def _verify_range(addr: int, size: int, node: int) -> float:
    """The share of the range's pages that are on ``node``, asked of the kernel (the range
    applier's one measurement)."""
    from .._range import share_on, where

    return share_on(where(addr, size), [node])


def verdict(results: list[Measurement]) -> tuple[str, float | None]:
    """One line for a set of measurements from one place, and the remote/local copy-time
    ratio it rests on (None when there is nothing to compare)."""
    trusted = [m for m in results if m.trusted]
    copies = {m.memory_node: m.value for m in trusted if m.kind == "copy"}
    lat = {m.memory_node: m.value for m in trusted if m.kind == "latency"}
    samples = {(m.memory_node, m.kind): m.samples for m in trusted}
    local = results[0].from_node if results else None
    if local is None or local not in copies or len(copies) < 2:
        if results and not trusted:
            return "no trusted measurement: the pages could not be placed where asked", None
        return "one NUMA node with memory here: nothing to compare", None
    remote = {n: v for n, v in copies.items() if n != local}
    worst = min(remote, key=lambda n: remote[n])
    ratio = copies[local] / remote[worst] if remote[worst] > 0 else None
    lat_ratio = (lat[worst] / lat[local]) if lat.get(local) and lat.get(worst) else None
    if ratio is None:
        return "no measurable difference: copies to every node took the same time", None
    # the best values can come from different moments; the same comparison made round by
    # round (samples taken side by side) must agree before binding is said to pay
    paired_copy = _paired(samples.get((local, "copy")), samples.get((worst, "copy")))
    paired_lat = _paired(samples.get((worst, "latency")), samples.get((local, "latency")))
    if paired_copy is not None:
        ratio = min(ratio, paired_copy)
    if lat_ratio is not None and paired_lat is not None:
        lat_ratio = min(lat_ratio, paired_lat)
    worst_ratio = max(ratio, lat_ratio or 0.0)
    if worst_ratio < NO_DIFFERENCE:
        return (
            f"no measurable difference (remote/local {ratio:.2f}x copy, "
            f"{(lat_ratio or 1.0):.2f}x latency): this machine does not need binding",
            ratio,
        )
    what = f"remote copies are {ratio:.1f}x slower" if ratio >= NO_DIFFERENCE else ""
    if lat_ratio is not None and lat_ratio >= NO_DIFFERENCE:
        what += ("; " if what else "") + f"remote accesses take {lat_ratio:.1f}x as long"
    return f"{what} here (node {worst} from node {local}): binding pays", ratio


def _paired(num: tuple[float, ...] | None, den: tuple[float, ...] | None) -> float | None:
    """Median of the round-by-round ratios num[i] / den[i]; None without samples."""
    if not num or not den or len(num) != len(den):
        return None
    ratios = sorted(a / b for a, b in zip(num, den) if b > 0)
    if not ratios:
        return None
    mid = len(ratios) // 2
    return ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2


# --- the command -------------------------------------------------------------------------------


class Verdict(Record):
    """What one place measured from says: binding pays here, or not."""

    from_node: int | None
    from_cpus: frozenset[int]
    ranks: tuple[int, ...]
    verdict: str
    ratio: float | None

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["ratio"] = None if self.ratio is None else round(self.ratio, 3)
        return d


class NodeFree(Record):
    id: int
    cpus: frozenset[int]
    free_bytes: int | None


class BenchReport(Record):
    """What ``numabind bench --json`` prints (docs/cli.rst documents every key)."""

    machine: str
    nodes: tuple[NodeFree, ...]
    share: float
    size_bytes: int
    measurements: tuple[Measurement, ...]
    verdicts: tuple[Verdict, ...]
    gpu: GpuReport | str


def run(
    machine: Machine,
    plans: list[Any],
    *,
    rank: int | None = None,
    node: int | None = None,
    size: int = 64 << 20,
    share: float = 0.25,
    quick: bool = False,
    only: str | None = None,
) -> BenchReport:
    """Measure from every place the plans bind to (or one rank's, or one node's) and
    return the report ``numabind bench --json`` prints; ``only`` is ``memory`` (no GPU
    copies) or ``gpu`` (only those)."""
    places: dict[tuple[int | None, frozenset[int]], list[int]] = {}
    allowed = machine.allowed.cpus
    if only == "gpu":
        pass
    elif node is not None:
        n = machine.node(node)
        cpus = (n.cpus & allowed) if n is not None else frozenset()
        if cpus:
            places[(node, cpus)] = []
    else:
        for p in plans:
            if rank is not None and p.local_rank != rank:
                continue
            if p.bound:
                key = (p.numa_node, frozenset(p.cpus))
                places.setdefault(key, []).append(p.local_rank)
        if not places and rank is None:
            for n in machine.cpu_nodes:  # nothing bound (one node, no GPU): each node as is
                cpus = n.cpus & allowed
                if cpus:
                    places[(n.id, cpus)] = []
    measurements: list[Measurement] = []
    verdicts: list[Verdict] = []
    for (from_node, cpus), ranks in places.items():
        try:
            got = measure(machine, cpus, from_node, size=size, share=share, quick=quick)
            text_, ratio = verdict(got)
        except OSError as err:  # CPUs this process may not run on (a cgroup, a capture)
            got, ratio = [], None
            text_ = f"not measured: cannot run on CPUs {_sysfs.format_cpulist(cpus)} ({err})"
        measurements += got
        verdicts.append(
            Verdict(
                from_node=from_node,
                from_cpus=cpus,
                ranks=tuple(ranks),
                verdict=text_,
                ratio=ratio,
            )
        )
    gpu: GpuReport | str = "not measured (--only memory)"
    if only != "memory":
        gpu = gpu_copies(machine, plans, rank=rank, node=node, size=size, share=share, quick=quick)
    return BenchReport(
        machine=machine.description,
        nodes=tuple(
            NodeFree(id=n.id, cpus=n.cpus, free_bytes=free_bytes(machine, n.id))
            for n in machine.nodes
        ),
        share=share,
        size_bytes=size,
        measurements=tuple(measurements),
        verdicts=tuple(verdicts),
        gpu=gpu,
    )


def text(data: dict[str, Any]) -> list[str]:
    """The text report of ``data`` (a :class:`BenchReport`'s ``to_dict()``), one line per
    item."""
    report = data
    fmt = _sysfs.format_cpulist
    count = len(report["nodes"])
    out = [f"numabind bench: {report['machine']} ({count} NUMA node{'s' if count != 1 else ''})"]
    by_place: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for m in report["measurements"]:
        if m["kind"] in ("copy", "latency"):
            by_place.setdefault((m["from_node"], tuple(m["from_cpus"])), []).append(m)
    for v in report["verdicts"]:
        key = (v["from_node"], tuple(v["from_cpus"]))
        ranks = f"; ranks {fmt(v['ranks'])}" if v["ranks"] else ""
        out += ["", f"From node {v['from_node']} (CPUs {fmt(v['from_cpus'])}{ranks})"]
        rows = [["memory node", "copy GB/s", "latency ns", "pages on node", "placed by"]]
        table: dict[int, dict[str, Any]] = {}
        for m in by_place.get(key, []):
            table.setdefault(m["memory_node"], {})[m["kind"]] = m
        untrusted = False
        for node_id, kinds in sorted(table.items()):
            c, lat = kinds.get("copy"), kinds.get("latency")
            ref = c or lat or {}
            cells = []
            for m, shown in ((c, "{:.2f}"), (lat, "{:.0f}")):
                if m is None:
                    cells.append("-")
                    continue
                untrusted = untrusted or not m["trusted"]
                cells.append(shown.format(m["value"]) + ("" if m["trusted"] else " (untrusted)"))
            rows.append(
                [
                    f"{node_id}{' (local)' if node_id == v['from_node'] else ''}",
                    *cells,
                    f"{ref.get('pages_verified_on_node', 0):.3f}",
                    str(ref.get("placement", "-")),
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            out.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        if untrusted:
            out.append(f"  note: {UNTRUSTED}")
        out.append(f"  verdict: {v['verdict']}")
    out += ["", *gpu_text(report["gpu"])]
    return out


def gpu_text(gpu: dict[str, Any] | str) -> list[str]:
    """The pinned-copy table: a row per GPU alone, a row for every GPU at once, GB/s."""
    if isinstance(gpu, str):
        return [f"Pinned host<->device copies: {gpu}"]
    mib = gpu["bytes"] >> 20
    out = [f"Pinned host<->device copies through the {gpu['driver']} ({mib} MiB registered host "
           "buffers; GB/s, the best round)"]  # fmt: skip
    rows = [["GPU", "node", "h2d local", "h2d remote", "d2h local", "d2h remote"]]
    table: dict[tuple[int, ...], dict[tuple[str, str], dict[str, Any]]] = {}
    for c in gpu["copies"]:
        table.setdefault(tuple(c["devices"]), {})[(c["kind"], c["host"])] = c
    for devices, cells in sorted(table.items(), key=lambda kv: (len(kv[0]), kv[0])):
        first = next(iter(cells.values()))
        label = str(devices[0]) if len(devices) == 1 else f"all {len(devices)} at once"
        node = str(first["gpu_nodes"][0]) if len(devices) == 1 else "-"
        row = [label, node]
        for kind in ("h2d", "d2h"):
            for host in ("local", "remote"):
                c = cells.get((kind, host))
                if c is None:
                    row.append("-")
                    continue
                where = ""
                if host == "remote" and len(devices) == 1:
                    where = f" (node {c['memory_nodes'][0]})"
                mark = "" if c["trusted"] else " (untrusted)"
                row.append(f"{c['value']:.2f}{where}{mark}")
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        out.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    out += [f"  note: {note}" for note in gpu.get("notes", ())]
    out.append(f"  verdict: {gpu['verdict']}")
    return out


def run_bench(args: argparse.Namespace) -> int:
    """``numabind bench``: check the outputs first (a bad --svg must not cost a whole
    benchmark), then plan and measure."""
    from .._environ import Config
    from .._topology import Machine
    from ._show import plans_for

    if not 0 < args.share <= 0.9:
        raise UsageError("numabind bench: --share must be in (0, 0.9]")
    svg = OutputFile(args.svg, "--svg", "bench", args.force).check() if args.svg else None
    one_stdout((("--json", args.json), ("--svg -", svg is not None and svg.stdout)), "bench")
    try:
        cfg = Config.from_env()
    except ValueError as err:
        raise UsageError(f"numabind bench: {err}") from err
    try:
        machine = Machine.from_root(cfg.sysroot)
    except CaptureError as err:
        raise UsageError(f"numabind bench: {err}") from err
    size = args.size << 20 if args.size else (QUICK_SIZE if args.quick else DEFAULT_SIZE)
    try:
        if args.node is not None and machine.node(args.node) is None:
            raise UsageError(f"numabind bench: --node {args.node}: no such node")
        _, plans, _ = plans_for(
            machine,
            os.environ,
            None,
            args.mode or cfg.mode,
            cfg.memory,
            cfg.reserve,
            cfg.smt,
            priority=cfg.priority,
            spill=cfg.spill,
        )
        if args.rank is not None and not any(p.local_rank == args.rank for p in plans):
            raise UsageError(f"numabind bench: --rank {args.rank}: no such local rank")
        report = run(
            machine,
            plans,
            rank=args.rank,
            node=args.node,
            size=size,
            share=args.share,
            quick=args.quick,
            only=args.only,
        )
    finally:
        machine.close()
    data = report.to_dict()
    if svg is not None:
        from ._svg import render_bench

        svg.write(render_bench(data))
    if args.json:
        write_json(data)
    elif svg is None or not svg.stdout:
        write_lines(text(data))
    return OK
