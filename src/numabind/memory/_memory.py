"""Host memory next to the GPU: buffers placed on a node, existing ranges moved there, and
the placement measured from the kernel.

The startup binding places what a rank's bound threads fault in.  What it cannot place is
memory whose node is not the faulting thread's: a pool one process fills for every GPU, a
region shared by ranks of both sockets, torch's pinned cache handing a block made for one
device to another.  No CUDA allocation API takes "the caller's node"
(``CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT`` is refused by ``cuMemCreate`` and the memory
pools), so the node is resolved here and the pages placed before anyone registers them:

* :func:`host_buffer` maps fresh memory (private, or a ``memfd`` another process can map),
  sets the range's policy with ``mbind`` (placement does not depend on the calling
  thread's binding), checks that the node (and the cgroup) can hold it, and populates it
  in parallel from threads bound to the node's CPUs with ``MADV_POPULATE_WRITE`` through
  ``syscall`` (which releases the GIL), touching where the kernel lacks it;
* :func:`bind_range` does the same for memory that exists (a tensor's storage, a slice of
  a shared region): whole pages inside the range, ``mbind`` with ``MPOL_MF_MOVE``, then
  ``move_pages`` for what mbind left, every page that did not move counted by reason;
* :func:`placement` says where the pages of a range are, asked of the kernel
  (``move_pages`` in query mode; ``numa_maps`` where a seccomp profile refuses it).

Where the memory-policy calls are refused (seccomp without CAP_SYS_NICE), placement falls
back to first touch from threads bound to the node's CPUs, and the measured placement is
reported.  Nothing here runs at startup: the module is imported by the functions only.

A populated buffer is then registered with the GPU driver where there is one
(:mod:`numabind.memory._driver`: page-locked and mapped for DMA, so that copies run at full
speed), strictly after populating (registration faults missing pages in on the
registering thread), and marked ``MADV_DONTFORK``: since Linux 5.9 ``fork`` copies pages
pinned for DMA into the child, so a 100 GiB pool would be copied into every forked
DataLoader worker.  :meth:`HostBuffer.close` unregisters before it unmaps.
"""

from __future__ import annotations

import contextvars
import errno
import mmap
import os
import threading
import weakref

from .. import _kernel, _sysfs
from .._errors import ConfigError, DriverError, NumabindError, RegistrationError
from .._model import Record
from .._pin import pin_cpus
from .._range import Mover, moved_onto, where
from .._sysfs import format_cpulist

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .._model import Accelerator
    from .._topology import Machine
    from ._driver import Registration

# the public function the user called (numabind.torch's tensors are host buffers too):
# what every message of a host buffer names
CALLER: contextvars.ContextVar[str] = contextvars.ContextVar(
    "numabind_host_buffer_caller", default="numabind.host_buffer()"
)
PAGE = mmap.PAGESIZE
HUGE = 2 << 20  # the huge page size numabind uses (x86-64 and arm64 with 4 KiB pages)
MAP_HUGETLB = 0x40000
MFD_CLOEXEC, MFD_HUGETLB = 1, 4
MAX_THREADS = 64  # populating threads, whatever the node's size
CHUNK = 16 << 20  # populate work items: large enough to amortise, small enough to balance
BUFFER_POLICIES = ("bind", "preferred", "interleave")


class PlacementError(NumabindError, MemoryError):
    """A buffer that cannot be placed as asked (the node or the cgroup cannot hold it, or
    populating it failed); the message gives the figures.  Nothing is left mapped."""


class RangeBinding(Record):
    """What :func:`bind_range` did: the whole pages it covered (``start``, ``nbytes``),
    the bytes at the edges left out (not whole pages), pages moved onto the target nodes,
    pages that stayed elsewhere by reason, and the placement afterwards."""

    start: int
    nbytes: int
    left_out: int
    nodes: tuple[int, ...]
    policy: str
    moved: int
    not_moved: dict[str, int]
    placement: dict[int | None, int]
    notes: tuple[str, ...] = ()


# --- where the pages are -----------------------------------------------------------------------


def placement(address: int, nbytes: int) -> dict[int | None, int]:
    """Where the pages of a range are, asked of the kernel now.

    ``address`` and ``nbytes`` give the range (rounded out to whole pages).  Returns
    pages per node, and under ``None`` those not present (never touched, or swapped
    out); from ``move_pages`` in query mode (on a sample of the pages beyond 4 GiB), or
    from ``numa_maps`` where a seccomp profile refuses that call (the range applier,
    ``numabind._range.where``, measures every range numabind measures)."""
    return where(address, nbytes)


# --- which node ---------------------------------------------------------------------------------


def _machine() -> Machine:
    from .._topology import Machine

    return Machine.here()


def target_nodes(
    machine: Machine, device: int | str | None, node: int | Sequence[int] | None, caller: str
) -> tuple[int, ...]:
    """The nodes a buffer goes to: ``node`` as given, else the node the planner binds
    ``device``'s ranks to, else the node of this process's binding.  With both, the
    memory goes to ``node`` and ``device`` is the one it is registered for."""
    return target(machine, device, node, caller).nodes


class Target(Record):
    """Where a buffer goes (``nodes``) and for which device, when one is known (named, or
    the device of this process's binding): the device registration makes current."""

    nodes: tuple[int, ...]
    device: Accelerator | None = None
    index: int | None = None


def target(
    machine: Machine, device: int | str | None, node: int | Sequence[int] | None, caller: str
) -> Target:
    """:func:`target_nodes`, with the device it was resolved from."""
    from .._apply import bound_plan

    bound = bound_plan()
    own = Target(
        nodes=(),
        device=bound.device if bound is not None else None,
        index=bound.device_index if bound is not None else None,
    )
    if device is not None:
        from .._devices import find_device, resolve

        visible = resolve(machine, os.environ)
        found, why = find_device(device, visible, machine)
        if found is None:
            raise ConfigError(f"{caller}: device {device!r}: {why}")
        index = visible.devices.index(found) if found in visible.devices else None
        own = Target(nodes=(), device=found, index=index)
    if node is not None:
        nodes = (node,) if isinstance(node, int) else tuple(node)
        if not nodes or any(not isinstance(n, int) or isinstance(n, bool) for n in nodes):
            raise ConfigError(
                f"{caller}: node= takes a node number or a list of them, not {node!r}"
            )
        for n in nodes:
            if machine.node(n) is None:
                raise ConfigError(
                    f"{caller}: node {n} does not exist (nodes: {format_cpulist(machine.node_ids)})"
                )
        return own.replace(nodes=tuple(sorted(set(nodes))))
    if device is not None and own.device is not None:
        from .._plan import device_node

        where = device_node(machine, own.device)
        if where.node is None:
            raise ConfigError(
                f"{caller}: the NUMA node of device {device!r} ({own.device.pci}) is unknown; "
                "give node= instead"
            )
        return own.replace(nodes=(where.node,))
    if bound is not None and bound.numa_node is not None:
        return own.replace(nodes=(bound.numa_node,))
    raise ConfigError(
        f"{caller}: give device= (an index, PCI address or UUID) or node=; this process "
        "has no binding to take the node from"
    )


def _kernel_policy(machine: Machine, policy: str, nodes: tuple[int, ...]) -> tuple[str, str | None]:
    """The kernel policy for a buffer policy over ``nodes``, and a note when it differs."""
    if policy not in BUFFER_POLICIES:
        raise ConfigError(f"policy={policy!r}: use one of {', '.join(BUFFER_POLICIES)}")
    if policy == "preferred" and len(nodes) > 1:
        from .._plan import preferred_over

        chosen, _, note = preferred_over(machine, frozenset(nodes), nodes[0])
        return chosen, note
    return policy, None


def _spill_mask(machine: Machine, kpolicy: str, nodes: tuple[int, ...]) -> frozenset[int]:
    """The nodes a buffer's memory may spill onto under ``NUMABIND_SPILL`` (the rank's
    rule, :func:`numabind._plan.spill_mask`): empty where the kernel's fallback already
    stays on CPU memory (or the setting is ``any``).  Nodes the caller named are always
    in it: naming a node is asking for it."""
    from .._environ import Config
    from .._plan import spill_mask

    mask, _ = spill_mask(machine, frozenset(nodes), kpolicy, Config.from_env().spill)
    return mask


def _spill_note(mask: frozenset[int], nodes: tuple[int, ...]) -> str:
    extra = mask - set(nodes)
    where = (
        f"then only node{'s' if len(extra) > 1 else ''} {format_cpulist(extra)}"
        if extra
        else "no other node"
    )
    return (
        f"spills onto CPU memory only ({where}: MPOL_BIND over {format_cpulist(mask)}, "
        "NUMABIND_SPILL)"
    )


def node_free_bytes(node: int) -> int | None:
    """MemFree of a node (live sysfs), None when unknown."""
    text = _sysfs.read_opt(f"/sys/devices/system/node/node{node}/meminfo")
    for line in (text or "").splitlines():
        if "MemFree:" in line:
            value = _sysfs.parse_int(line.split()[-2])
            return value * 1024 if value is not None else None
    return None


UNLIMITED = 1 << 62  # cgroup v1 writes "no limit" as a page-rounded 2^63 - 1


def cgroup_room() -> tuple[int, str] | None:
    """Bytes this process's memory cgroup may still charge, for the tightest limit from
    its cgroup up, and that cgroup's directory; None when nothing limits it.  cgroup v2
    (``memory.max - memory.current``) and v1 (``memory.limit_in_bytes -
    memory.usage_in_bytes``, under the memory controller's own hierarchy)."""
    text = _sysfs.read_opt("/proc/self/cgroup") or ""
    best: tuple[int, str] | None = None
    for line in text.splitlines()[:64]:
        ident, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if ident == "0" and controllers == "":
            base, files = "/sys/fs/cgroup", ("memory.max", "memory.current")
        elif "memory" in controllers.split(","):
            base, files = (
                "/sys/fs/cgroup/memory",
                ("memory.limit_in_bytes", "memory.usage_in_bytes"),
            )
        else:
            continue
        parts = [p for p in path.strip().split("/") if p and p != ".."][:64]
        for depth in range(len(parts), -1, -1):
            d = "/".join([base, *parts[:depth]])
            limit = _sysfs.parse_int((_sysfs.read_opt(f"{d}/{files[0]}") or "").strip())
            used = _sysfs.parse_int(_sysfs.read_opt(f"{d}/{files[1]}"))
            if limit is None or used is None or limit >= UNLIMITED:
                continue
            room = max(limit - used, 0)
            if best is None or room < best[0]:
                best = (room, d)
    return best


def _huge_free(node: int) -> int:
    text = _sysfs.read_opt(
        f"/sys/devices/system/node/node{node}/hugepages/hugepages-{HUGE >> 10}kB/free_hugepages"
    )
    return _sysfs.parse_int(text) or 0


# --- populating ---------------------------------------------------------------------------------


def _fill_cpus(machine: Machine, nodes: tuple[int, ...]) -> frozenset[int]:
    """The CPUs that fault the pages in: the target nodes' own (those this process may
    use), else the nearest node with CPUs (a memory-only target: a GPU's HBM node)."""
    allowed = machine.allowed.cpus
    cpus: set[int] = set()
    for n in nodes:
        found = machine.node(n)
        if found is not None:
            cpus |= found.cpus & allowed
    if cpus:
        return frozenset(cpus)
    full = machine.node(nodes[0], full=True)
    dist = dict(zip(machine.node_ids, full.distances)) if full and full.distances else {}
    near = sorted(
        (n for n in machine.cpu_nodes if n.cpus & allowed),
        key=lambda n: (dist.get(n.id, 999), n.id),
    )
    return frozenset(near[0].cpus & allowed) if near else allowed


def _cores(machine: Machine, cpus: frozenset[int]) -> int:
    seen: set[int] = set()
    cores = 0
    for c in sorted(cpus):
        if c not in seen:
            seen |= machine.siblings_of(c) | {c}
            cores += 1
    return max(cores, 1)


def populate(address: int, nbytes: int, cpus: frozenset[int], threads: int) -> tuple[str, int]:
    """Fault every page of the range in from ``threads`` threads bound to ``cpus``
    (``MADV_POPULATE_WRITE``; touching on kernels before 5.14).  Returns (how, threads
    used).  Raises the first failure (the caller unmaps)."""
    chunks = [
        (a, min(CHUNK, address + nbytes - a)) for a in range(address, address + nbytes, CHUNK)
    ]
    threads = max(1, min(threads, len(chunks), MAX_THREADS))
    how = ["MADV_POPULATE_WRITE"]
    failures: list[BaseException] = []
    lock = threading.Lock()

    def fill(start: int, length: int) -> None:
        if how[0] == "MADV_POPULATE_WRITE":
            try:
                _kernel.madvise(start, length, _kernel.MADV_POPULATE_WRITE)
                return
            except OSError as err:
                if err.errno != errno.EINVAL:
                    raise
                how[0] = "touch"
        import ctypes

        ctypes.memset(start, 0, length)  # a foreign call: the GIL is released

    def worker() -> None:
        pin_cpus(cpus)  # this thread only, which ends here (refused: faults from anywhere)
        while True:
            with lock:
                if not chunks or failures:
                    return
                start, length = chunks.pop()
            try:
                fill(start, length)
            except BaseException as err:
                with lock:
                    failures.append(err)
                return

    pool = [threading.Thread(target=worker, name=f"numabind-populate-{i}") for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if failures:
        raise failures[0]
    return how[0], threads


# --- the buffer ---------------------------------------------------------------------------------


class HostBuffer:
    """Host memory placed on NUMA nodes (see :func:`numabind.host_buffer`).

    ``address``, ``nbytes`` (exactly what was asked), ``mapped_bytes`` (the mapping, whole
    pages or huge pages), ``nodes``, ``policy`` (the kernel policy set, or ``first-touch``
    where memory-policy calls are refused), ``huge`` (``hugetlb``, ``thp`` or None),
    ``fd`` (a memfd another process can map, when ``shared``), ``populated`` (how:
    ``MADV_POPULATE_WRITE``, ``touch`` or None), ``registered`` (with the GPU driver:
    ``registered_with`` names it; ``register_reason`` says why not when False) and
    ``notes``.  A context manager; :meth:`close` unregisters, then unmaps, and raises
    ``BufferError`` while a view or a tensor still uses the memory, as ``mmap`` does (the
    buffer stays registered then).  A buffer dropped without ``close()`` is unregistered
    and unmapped when it is collected, if nothing else uses its memory.
    """

    def __init__(
        self,
        mapping: mmap.mmap,
        address: int,
        nbytes: int,
        nodes: tuple[int, ...],
        policy: str,
        fd: int | None,
        huge: str | None,
    ) -> None:
        self.address = address
        self.nbytes = nbytes
        self.mapped_bytes = len(mapping)
        self.nodes = nodes
        self.policy = policy
        self.fd = fd
        self.huge = huge
        self.populated: str | None = None
        self.threads = 0
        self.notes: list[str] = []
        self.registered = False
        self.registered_with: str | None = None
        self.register_reason: str | None = None
        self.dontfork = False
        # what the finalizer releases: the mapping and its registration, held in one place
        self._held = _Held(mapping)
        self._finalizer = weakref.finalize(self, _release, self._held, True)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` unmapped the buffer."""
        return self._held.mapping.closed

    def view(self) -> memoryview:
        """A writable view of exactly ``nbytes`` (it keeps the mapping alive)."""
        if self.closed:
            raise ValueError("the host buffer is closed")
        return memoryview(self._held.mapping)[: self.nbytes]

    def placement(self) -> dict[int | None, int]:
        """Pages of the buffer per node (``None``: not present), measured now."""
        if self.closed:
            raise ValueError("the host buffer is closed")
        return placement(self.address, self.mapped_bytes)

    def close(self) -> None:
        """Unmap the buffer (and close its memfd).  Raises ``BufferError``, changing
        nothing, while a view or a tensor still uses the memory.  Closing twice is fine."""
        if self.closed:
            return
        try:
            _release(self._held, False)  # BufferError while exported: still open, registered
        except BufferError:
            raise BufferError(
                "numabind.HostBuffer.close(): a view or a tensor still uses the memory: "
                "release the view (view.release(), or take it as 'with buf.view() as view:') "
                "or delete the tensor first; the buffer stays mapped and registered"
            ) from None
        self._finalizer.detach()
        self.registered = False
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        _forget(self)

    def __enter__(self) -> HostBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"0x{self.address:x}"
        return (
            f"HostBuffer({state}, {self.nbytes} bytes, nodes {format_cpulist(self.nodes)}, "
            f"{self.policy})"
        )


class _Held:
    """A host buffer's mapping and its registration with the driver: what its finalizer
    releases (it must not hold the buffer itself, or the buffer would never be collected)."""

    __slots__ = ("mapping", "registration")

    def __init__(self, mapping: mmap.mmap) -> None:
        self.mapping = mapping
        self.registration: Registration | None = None


def _release(held: _Held, collected: bool) -> None:
    """Unregister (if registered), then unmap.  When the memory is still in use (a view, a
    tensor: ``BufferError``), register it again as it was and raise (``collected``: in a
    finalizer, where there is no one to raise to: keep it registered and mapped)."""
    reg = held.registration
    if held.mapping.closed:
        return
    if reg is not None:
        reg.unregister()
    try:
        held.mapping.close()
    except BufferError:
        if reg is not None:
            try:
                held.registration = reg.driver.register(reg.address, reg.nbytes, reg.device)
            except DriverError:
                held.registration = None
        if not collected:
            raise
        return
    held.registration = None


def _remember(buf: HostBuffer) -> None:
    """List the buffer in this process's registry entry, so ``check`` measures it."""
    from .. import _apply, _registry

    _registry.list_buffer(id(buf), (buf.address, buf.mapped_bytes, buf.nodes, buf.policy))
    _apply.reregister()


def _forget(buf: HostBuffer) -> None:
    from .. import _apply, _registry

    _registry.list_buffer(id(buf), None)
    _apply.reregister()


def _map(mapped: int, shared: bool, hugetlb: bool) -> tuple[mmap.mmap, int | None]:
    flags = MAP_HUGETLB if hugetlb else 0
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    if not shared:
        return mmap.mmap(-1, mapped, flags=mmap.MAP_PRIVATE | flags, prot=prot), None
    fd = os.memfd_create("numabind-host-buffer", MFD_CLOEXEC | (MFD_HUGETLB if hugetlb else 0))
    try:
        os.ftruncate(fd, mapped)
        return mmap.mmap(fd, mapped, flags=mmap.MAP_SHARED, prot=prot), fd
    except BaseException:
        os.close(fd)
        raise


def _own_mapping(address: int, length: int) -> str | None:
    """Keep a private buffer a mapping of its own (not merged with its neighbours), so
    that numa_maps, where move_pages is refused, measures the buffer alone: named
    ``[anon:numabind-host-buffer]`` where the kernel can (5.17+), else left out of core
    dumps (a flag the neighbours lack; a pool of many GiB in a core file helps no one).
    Returns a note for the second case."""
    try:
        if _kernel.name_mapping(address, length, "numabind-host-buffer"):
            return None
        _kernel.madvise(address, length, _kernel.MADV_DONTDUMP)
    except OSError:
        return None
    return "left out of core dumps (keeps it a mapping of its own on this kernel)"


def _address(mapping: mmap.mmap) -> int:
    import ctypes

    cell = ctypes.c_char.from_buffer(mapping)
    try:
        return ctypes.addressof(cell)
    finally:
        del cell  # release the export: close() must work


def _check_room(nbytes: int, nodes: tuple[int, ...], caller: str) -> None:
    """Refuse, with the figures, a buffer the target nodes or the cgroup cannot hold
    (before anything is mapped: a bound fault on a full node is the OOM killer's)."""
    free = [node_free_bytes(n) for n in nodes]
    if all(f is not None for f in free):
        total = sum(f for f in free if f is not None)
        if nbytes > total:
            raise PlacementError(
                f"{caller}: {nbytes / (1 << 20):.0f} MiB do not fit on node"
                f"{'s' if len(nodes) > 1 else ''} {format_cpulist(nodes)} "
                f"({total / (1 << 20):.0f} MiB free); nothing was mapped"
            )
    room = cgroup_room()
    if room is not None and nbytes > room[0]:
        raise PlacementError(
            f"{caller}: {nbytes / (1 << 20):.0f} MiB exceed what the cgroup {room[1]} may "
            f"still charge ({room[0] / (1 << 20):.0f} MiB); nothing was mapped"
        )


def host_buffer(
    nbytes: int,
    *,
    device: int | str | None = None,
    node: int | Sequence[int] | None = None,
    policy: str = "bind",
    populate: bool = True,
    huge: bool = False,
    shared: bool = False,
    threads: int | None = None,
    register: bool | str = "auto",
    dontfork: bool = True,
) -> HostBuffer:
    """Map ``nbytes`` of host memory on a GPU's NUMA node, populated, registered with the
    GPU driver and verifiable.

    For the memory the GPU reads and writes (pinned staging buffers, KV-cache offload
    pools, activation offload): the startup binding places what a rank's threads fault
    in, but a pool filled by one process for several GPUs, or by a thread bound
    elsewhere, lands wherever that thread runs.  Here the node is resolved and the pages
    are placed by the range's own policy, whatever the calling thread's binding:

    .. example: run on one-node

    ::

        import numabind

        with numabind.host_buffer(64 << 20, device=0) as buf:  # on GPU 0's node
            with buf.view() as view:                            # exactly 64 MiB
                view[:5] = b"hello"                             # released at the end
            assert buf.placement().get(None, 0) == 0            # every page present

    ``device`` is what :func:`numabind.apply` accepts (an index among the visible devices,
    a PCI address or a UUID) and resolves to the node the planner binds that GPU's ranks
    to; ``node`` names the node(s) directly (an int or a list; a GPU's own memory node on
    GH200/GB200 only this way); neither: the node of this process's binding, else a
    :class:`~numabind.ConfigError` naming both ways.  A node outside this process's
    ``cpuset.mems`` is a ``ConfigError`` too.  ``policy`` is ``bind`` (only there),
    ``preferred`` (there while it has room; over several nodes MPOL_PREFERRED_MANY on
    Linux >= 5.15, else the first node, said in ``notes``; once full, only the CPU-memory
    nodes a rank may spill onto: ``NUMABIND_SPILL``, MPOL_BIND over them where the machine
    has GPU memory, HBM or CXL nodes) or ``interleave`` (page by
    page over the nodes, for a pool GPUs on several sockets read).  ``populate`` (default
    True) faults every page in now: the nodes' free memory and the cgroup's limit are
    checked first (a :class:`PlacementError` with the figures, nothing mapped), then
    ``threads`` threads (default: one per physical core of the node, at most 64) bound
    to the node's CPUs populate it in parallel with ``MADV_POPULATE_WRITE`` (touching on
    kernels before 5.14); a failure unmaps and raises.  ``huge`` maps huge pages when
    the node has enough free (hugetlb), else asks for transparent huge pages
    (``madvise``), said in ``notes``.  ``shared`` backs the buffer with a ``memfd``
    (``.fd``) another process can map.  Where the container refuses memory-policy calls,
    the pages are placed by first touch from threads on the node's CPUs (``policy`` is
    then ``first-touch``) and :meth:`HostBuffer.placement` says where they are.

    ``register`` (default ``"auto"``) registers the populated buffer with the GPU driver
    (page-locked and mapped for DMA, visible to every context: CUDA's driver API or HIP by
    ctypes, see ``numabind.memory._driver``) where a driver is present, and otherwise skips with
    one note (``registered`` False, ``register_reason`` why); ``True`` raises
    :class:`~numabind.RegistrationError` (nothing left mapped) when it cannot, ``False``
    never registers.  Registration needs ``populate`` (it would fault the pages in on the
    registering thread).  A registered buffer is marked ``MADV_DONTFORK`` unless
    ``dontfork=False``: since Linux 5.9 ``fork`` copies pages pinned for DMA into the
    child, so every forked DataLoader worker would get a copy of the pool; with
    ``dontfork`` the child does not map the range at all.

    A bound rank that registered for ``numabind check`` lists its buffers there, and
    ``check`` measures each one's placement.
    """
    caller = CALLER.get()
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ConfigError(f"{caller}: nbytes must be a positive integer, not {nbytes!r}")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ConfigError(f"{caller}: threads must be a positive integer, not {threads!r}")
    if register not in ("auto", True, False):
        raise ConfigError(f"{caller}: register must be 'auto', True or False, not {register!r}")
    if register is True and not populate:
        raise ConfigError(
            f"{caller}: register=True needs populate=True (registering would fault the "
            "pages in on the registering thread, wherever it runs)"
        )
    machine = _machine()
    try:
        where = target(machine, device, node, caller)
        nodes = where.nodes
        allowed = machine.allowed.mems
        if allowed is not None and set(nodes) - allowed:
            raise ConfigError(
                f"{caller}: node {format_cpulist(set(nodes) - allowed)} is outside this "
                f"process's cpuset.mems ({format_cpulist(allowed)}): the kernel would not "
                "place memory there"
            )
        kpolicy, note = _kernel_policy(machine, policy, nodes)
        if note:
            nodes = nodes[:1]
        mask = _spill_mask(machine, kpolicy, nodes)
        if mask:  # preferred would spill onto a GPU's memory or CXL once the nodes are full
            kpolicy = "bind"
        if populate:
            _check_room(nbytes, nodes, caller)
        hugetlb = (
            huge and all(_huge_free(n) * HUGE >= nbytes for n in nodes[:1]) and len(nodes) == 1
        )
        unit = HUGE if huge else PAGE
        mapped = (nbytes + unit - 1) // unit * unit
        try:
            mapping, fd = _map(mapped, shared, hugetlb)
        except OSError as err:
            if err.errno != errno.ENOMEM:
                raise
            from .._limits import mapping_refused

            raise PlacementError(mapping_refused(caller, nbytes, err)) from None
        buf = HostBuffer(
            mapping,
            _address(mapping),
            nbytes,
            nodes,
            kpolicy,
            fd,
            "hugetlb" if hugetlb else ("thp" if huge else None),
        )
        try:
            _place(buf, machine, kpolicy, note, huge and not hugetlb, populate, threads, mask)
            if register is not False:
                _register_with_driver(buf, where, register is True, populate, dontfork)
        except BaseException:
            buf.close()
            raise
    finally:
        machine.close()
    _remember(buf)
    return buf


def _register_with_driver(
    buf: HostBuffer, where: Target, required: bool, populated: bool, dontfork: bool
) -> None:
    """Register a placed, populated buffer with its device's driver; mark it DONTFORK."""
    from ._driver import driver_for

    why = None
    driver = None
    if not populated:
        why = "populate=False (registering would fault the pages in on the registering thread)"
    else:
        driver, why = driver_for(where.device)
    if driver is not None:
        try:
            handle = driver.device(where.device, where.index)
            buf._held.registration = driver.register(buf.address, buf.mapped_bytes, handle)
        except DriverError as err:
            why = str(err)
        else:
            buf.registered, buf.registered_with = True, driver.name
            if dontfork:
                _kernel.madvise(buf.address, buf.mapped_bytes, _kernel.MADV_DONTFORK)
                buf.dontfork = True
            return
    if required:
        raise RegistrationError(f"{CALLER.get()}: not registered: {why}")
    buf.register_reason = why
    buf.notes.append(f"not registered with a GPU driver: {why}")


def _place(
    buf: HostBuffer,
    machine: Machine,
    kpolicy: str,
    note: str | None,
    thp: bool,
    fill: bool,
    threads: int | None,
    mask: frozenset[int] = frozenset(),
) -> None:
    if note:
        buf.notes.append(note)
    if mask:
        buf.notes.append(_spill_note(mask, buf.nodes))
    separate = _own_mapping(buf.address, buf.mapped_bytes) if buf.fd is None else None
    if thp:
        try:
            _kernel.madvise(buf.address, buf.mapped_bytes, _kernel.MADV_HUGEPAGE)
            buf.notes.append("no free huge pages on the node: transparent huge pages (madvise)")
        except OSError as err:
            buf.notes.append(f"transparent huge pages not available ({err}): normal pages")
            buf.huge = None
    try:
        Mover(mask or buf.nodes, kpolicy).bind(
            buf.address, buf.address + buf.mapped_bytes, "host buffer", move=False
        )
    except OSError as err:
        if err.errno != errno.EPERM:
            raise
        buf.policy = "first-touch"
        buf.notes.append(
            f"{err}: placed by first touch from threads on node "
            f"{format_cpulist(buf.nodes)}'s CPUs instead"
        )
    if separate:
        buf.notes.append(separate)
    if not fill:
        return
    cpus = _fill_cpus(machine, buf.nodes)
    want = threads if threads is not None else _cores(machine, cpus)
    try:
        buf.populated, buf.threads = populate(buf.address, buf.mapped_bytes, cpus, want)
    except OSError as err:
        raise PlacementError(
            f"{CALLER.get()}: populating {buf.nbytes / (1 << 20):.0f} MiB on node "
            f"{format_cpulist(buf.nodes)} failed ({err}); nothing was left mapped"
        ) from err


# --- memory that exists -------------------------------------------------------------------------


def bind_range(
    address: int,
    nbytes: int,
    node: int | Sequence[int],
    *,
    policy: str = "bind",
    move: bool = True,
) -> RangeBinding:
    """Place memory that exists already (a tensor's storage, one rank's slice of a shared
    region) on ``node``: its policy set and its present pages moved.

    ``address`` and ``nbytes`` give the range; only whole pages inside it are bound, and
    the bytes at the edges that are not are counted in ``left_out`` and said in
    ``notes``.  ``node`` is a node number or a list of them; ``policy`` is ``bind``,
    ``preferred`` or ``interleave`` as for :func:`host_buffer`.  With ``move`` (default
    True) the present pages are moved (``mbind`` with ``MPOL_MF_MOVE``, then
    ``move_pages`` for what it left); pages that cannot move (pinned for DMA, locked,
    shared with another process) are counted by reason in ``not_moved`` and never as
    moved.  Returns a :class:`RangeBinding` with the placement afterwards.  Raises
    :class:`~numabind.KernelError` when the kernel refuses the policy (a seccomp profile:
    EPERM).
    """
    caller = "numabind.bind_range()"
    if isinstance(address, bool) or not isinstance(address, int) or address < 0:
        raise ConfigError(f"{caller}: address must be a non-negative integer, not {address!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes <= 0:
        raise ConfigError(f"{caller}: nbytes must be a positive integer, not {nbytes!r}")
    machine = _machine()
    try:
        nodes = target_nodes(machine, None, node, caller)
        kpolicy, note = _kernel_policy(machine, policy, nodes)
        mask = _spill_mask(machine, kpolicy, nodes)
    finally:
        machine.close()
    if note:
        nodes = nodes[:1]
    start = (address + PAGE - 1) // PAGE * PAGE
    end = (address + nbytes) // PAGE * PAGE
    notes = [note] if note else []
    if end <= start:
        raise ConfigError(
            f"{caller}: [0x{address:x}, +{nbytes}) holds no whole page ({PAGE} bytes): "
            "nothing to bind"
        )
    left_out = nbytes - (end - start)
    if left_out:
        notes.append(f"{left_out} bytes at the edges are not whole pages: left as they are")
    before = where(start, end - start)
    if mask:
        # moved onto the nodes under MPOL_BIND (what does not fit stays where it is, never
        # onto a GPU's memory), then the range may spill onto its mask only
        kpolicy = "bind"
        notes.append(_spill_note(mask, nodes))
    mover = Mover(nodes, kpolicy, spread=True)
    mover.bind(start, end, "the range", move=move)
    not_moved: dict[str, int] = {}
    if move:
        mover.leftovers(start, end)
        not_moved = dict(mover.not_moved)
    if mask:
        Mover(mask, "bind").bind(start, end, "the range", move=False)
    after = where(start, end - start)
    moved, off_after = moved_onto(before, after, nodes)
    if move and off_after and not not_moved:
        not_moved["unknown"] = off_after
    return RangeBinding(
        start=start,
        nbytes=end - start,
        left_out=left_out,
        nodes=nodes,
        policy=kpolicy,
        moved=moved,
        not_moved=not_moved,
        placement=after,
        notes=tuple(notes),
    )
