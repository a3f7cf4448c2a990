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
DEFAULT_SIZE, QUICK_SIZE = 64 << 20, 16 << 20


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
        d = super().to_dict()
        d["trusted"] = self.trusted
        d["value"] = round(self.value, 3)
        d["pages_verified_on_node"] = round(self.pages_verified_on_node, 4)
        d["samples"] = [round(v, 3) for v in self.samples]
        return d


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
            saved = os.sched_getaffinity(0)
            try:
                if node_cpus:
                    os.sched_setaffinity(0, node_cpus)
                self._touch(view)
            finally:
                os.sched_setaffinity(0, saved)
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
        return _verify_range(self.addr, self.size, node, every=1)  # page by page

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
    saved_cpus = os.sched_getaffinity(0)
    try:
        saved_policy: tuple[str, frozenset[int]] | None = _kernel.get_mempolicy()
    except OSError:
        saved_policy = None
    rounds = 3 if quick else 7
    steps = 20_000 if quick else 400_000
    # the chase's working set; --quick walks 8 MiB (a check of the structure, and its
    # latencies are marked untrusted: caches answer much of such a chase)
    span = (8 << 20) if quick else size
    try:
        os.sched_setaffinity(0, cpus)
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
    finally:
        os.sched_setaffinity(0, saved_cpus)
        if saved_policy is not None:
            try:
                _kernel.set_mempolicy(*saved_policy)
            except OSError:
                pass
    return out


def gpu_copies(
    machine: Machine, device_index: int, gpu_node: int | None, size: int = 256 << 20
) -> list[Measurement] | str:
    """Pinned host->device and device->host bandwidth, the pinned buffer on the GPU's node
    against the farthest CPU node; a reason string when there is no GPU to measure."""
    try:
        import torch
    except ImportError:
        return "no GPU (torch is not installed)"
    if not torch.cuda.is_available():
        return "no GPU (torch sees no CUDA device)"
    cpu_nodes = [n for n in machine.cpu_nodes]
    if gpu_node is None or not cpu_nodes:
        return "no GPU node known"
    local = machine.node(gpu_node, full=True)
    far = max(
        cpu_nodes,
        key=lambda n: (local.distance_to(n.id) or 0) if local is not None else 0,
    )
    out: list[Measurement] = []
    saved = os.sched_getaffinity(0)
    try:
        for node in {gpu_node: None, far.id: None}:
            n = machine.node(node)
            if n is None or not n.cpus:
                continue
            os.sched_setaffinity(0, n.cpus)
            try:
                _kernel.set_mempolicy("bind", {node})
            except OSError:
                pass
            host = torch.empty(size, dtype=torch.uint8, pin_memory=True)
            host.fill_(1)
            try:
                _kernel.set_mempolicy("default")
            except OSError:
                pass
            # about 4096 pages sampled: enough to tell the node, cheap for a big pinned buffer
            verified = _verify_range(host.data_ptr(), size, node, max(size // PAGE // 4096, 1))
            dev = torch.empty(size, dtype=torch.uint8, device=f"cuda:{device_index}")
            for kind in ("h2d", "d2h"):
                best = float("inf")
                for attempt in range(6):  # the first one warms up
                    t0 = time.perf_counter()
                    if kind == "h2d":
                        dev.copy_(host, non_blocking=True)
                    else:
                        host.copy_(dev, non_blocking=True)
                    torch.cuda.synchronize(device_index)
                    if attempt:
                        best = min(best, time.perf_counter() - t0)
                out.append(
                    Measurement(
                        from_cpus=n.cpus,
                        from_node=node,
                        memory_node=node,
                        kind=kind,
                        value=size / best / 1e9,
                        unit="GB/s",
                        pages_verified_on_node=verified,
                        placement="mbind",
                    )
                )
            del host, dev
    finally:
        os.sched_setaffinity(0, saved)
    return out


def _verify_range(addr: int, size: int, node: int, every: int) -> float:
    """The share of the range's pages (every ``every``-th) that are on ``node``: asked of
    move_pages, else read from numa_maps."""
    first = addr // PAGE * PAGE
    pages = [first + i * PAGE for i in range(0, size // PAGE, every)]
    try:
        where: list[int] = []
        for i in range(0, len(pages), 16384):
            where += _kernel.move_pages(pages[i : i + 16384])
    except OSError:
        where = []
    share = _share_on(where, node)
    return share if share is not None else _share_from_numa_maps(first, node)


def _share_on(where: list[int], node: int) -> float | None:
    """The share of pages on ``node`` among those move_pages could see; None when it saw
    fewer than half.  (With NUMA balancing on it answers EFAULT for resident pages the
    kernel has unmapped for hinting faults; numa_maps still counts those.)"""
    seen = [w for w in where if w >= 0]
    if not where or len(seen) * 2 < len(where):
        return None
    return sum(1 for w in seen if w == node) / len(seen)


def _share_from_numa_maps(addr: int, node: int) -> float:
    """The share of the pages of the mapping holding ``addr`` that are on ``node``."""
    from .._kernel import private_anon_regions

    try:
        regions = private_anon_regions()
    except OSError:
        return 0.0
    for r in regions:
        if r.start <= addr < r.end:
            total = sum(r.pages.values())
            return r.pages.get(node, 0) / total if total else 0.0
    return 0.0


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
    gpu: tuple[Measurement, ...] | str


def run(
    machine: Machine,
    plans: list[Any],
    *,
    rank: int | None = None,
    node: int | None = None,
    size: int = 64 << 20,
    share: float = 0.25,
    quick: bool = False,
) -> BenchReport:
    """Measure from every place the plans bind to (or one rank's, or one node's) and
    return the report ``numabind bench --json`` prints."""
    places: dict[tuple[int | None, frozenset[int]], list[int]] = {}
    allowed = machine.allowed.cpus
    if node is not None:
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
    gpu: tuple[Measurement, ...] | str = "no GPU (no plan binds a GPU here)"
    first = next((p for p in plans if p.bound and p.device is not None), None)
    if first is not None and first.device.vendor == "nvidia":
        got_gpu = gpu_copies(machine, first.device_index or 0, first.numa_node)
        if isinstance(got_gpu, str):
            gpu = got_gpu
        else:
            gpu = tuple(got_gpu)
            measurements += got_gpu
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
        for node_id, kinds in sorted(table.items()):
            c, lat = kinds.get("copy"), kinds.get("latency")
            ref = c or lat or {}
            mark = "" if ref.get("trusted") else " (untrusted)"
            rows.append(
                [
                    f"{node_id}{' (local)' if node_id == v['from_node'] else ''}",
                    f"{c['value']:.2f}" if c else "-",
                    f"{lat['value']:.0f}" if lat else "-",
                    f"{ref.get('pages_verified_on_node', 0):.3f}{mark}",
                    str(ref.get("placement", "-")),
                ]
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            out.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        out.append(f"  verdict: {v['verdict']}")
    gpu = report["gpu"]
    if isinstance(gpu, str):
        out += ["", f"Pinned host<->device copies: {gpu}"]
    else:
        out += ["", "Pinned host<->device copies (GB/s)"]
        for m in gpu:
            out.append(
                f"  {m['kind']} with the buffer on node {m['memory_node']}: {m['value']:.1f}"
            )
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
            machine, os.environ, None, args.mode or cfg.mode, cfg.memory, cfg.reserve, cfg.smt
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
