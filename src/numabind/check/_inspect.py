"""Is a process where its plan says, and is its memory there too? (``numabind check``,
the job collector, and the job report from inside a framework.)

For each process: its rank and device, the plan it should have (from its registry entry,
else planned from its initial environment), every thread's CPU mask and name, its memory
policy (as /proc/PID/numa_maps reports it), its private anonymous pages per node (pages it
still shares copy-on-write with a fork parent reported apart: they are the parent's
placement, not this process's), the thread settings it was given, the GPU it holds open,
who it is in its job, and each mismatch with its likely cause.  The result is a typed
:class:`ProcessCheck` per process and one :class:`CheckReport`, whose ``to_dict()`` is the
documented JSON schema (docs/cli.rst); :func:`numabind.check._job.node_record` is the job
collector's compact form of it, written beside its parser.

Everything read about another process is input: read from /proc with per-process caps
(numabind._kernel), and a process that vanishes mid-check is reported as such, never a
traceback.  :func:`check` stops at its deadline: processes not reached by then are listed
as skipped.  Nothing here prints: numabind.cli._check and numabind.check._report do.
"""

from __future__ import annotations

import errno
import os
import time

from .. import _kernel, _registry, _sysfs
from .._binders import binder_of
from .._environ import debugging, detect
from .._kernel import Region, locality, pages_per_node, shared_pages
from .._model import (
    DEVICE_FILES,
    GLOBAL_RANK_VARIABLES,
    HELPER_PROCESS_ROLES,
    JOB_VARIABLES,
    NODE_KINDS,
    POLICIES,
    RANK_VARIABLE_NAMES,
    THREAD_ROLES,
    Record,
)
from .._sysfs import normalize_pci
from .._threads import AFFINITY_VARIABLES
from .._threads import VARIABLES as THREAD_VARIABLES

_SETTINGS = (*THREAD_VARIABLES, *AFFINITY_VARIABLES)  # what check reports of a rank's pools
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from .._kernel import Region
    from .._model import Accelerator, NicChoice
    from .._plan import Plan
    from .._registry import Entry, Scan
    from .._topology import Machine

fmt = _sysfs.format_cpulist
MIN_LOCALITY = 0.9


class Vanished(Exception):
    """The process exited (or became a zombie) while it was being checked."""


class PlanView(Record):
    """The plan a process is checked against, with the keys of ``Plan.to_dict()`` whether
    it came from the registry (what numabind applied) or was planned from the process's
    environment."""

    local_rank: int | None = None
    rank_source: str | None = None
    local_world_size: int | None = None
    size_source: str | None = None
    device_index: int | None = None
    device_pci: str | None = None
    numa_node: int | None = None
    node_how: str | None = None
    cpus: frozenset[int] = frozenset()
    memory_nodes: frozenset[int] = frozenset()
    memory_policy: str = "none"
    mode: str = "node"
    status: str = "bound"
    skip: str | None = None
    reason: str = ""
    notes: tuple[str, ...] = ()
    problem: str | None = None
    threads: int | None = None
    helpers: frozenset[int] = frozenset()  # reserved for helpers: on plan too
    # nodes of ``memory_nodes`` that are only where memory may spill (``memory_policy`` is
    # then the kernel's: MPOL_BIND over the spill mask, NUMABIND_SPILL=cpu); locality is
    # measured on the others
    spill_nodes: frozenset[int] = frozenset()
    # threads bound to one device of a multi-device process (numabind.bind_thread): thread
    # id -> (that device's PCI address, its plan's CPUs), judged against those CPUs
    thread_plans: dict[int, tuple[str, frozenset[int]]] = {}  # noqa: RUF012 (immutable)
    # NUMABIND_PRIORITY: the priority cores the plan drew from; under "main" the thread put
    # on one (None: the process's first thread) and that core's CPUs
    priority_cpus: frozenset[int] = frozenset()
    main_thread: int | None = None
    main_cpus: frozenset[int] = frozenset()
    nics: tuple[NicChoice, ...] = ()  # the RDMA adapter ports planned for it

    @classmethod
    def of_plan(cls, p: Plan) -> PlanView:
        d = p.to_dict()
        sets = ("thread_plans", "priority_cpus", "main_cpus", "nics")
        policy, nodes = p.placement.kernel_policy if p.bound else (p.memory_policy, p.memory_nodes)
        return cls(**{k: d[k] for k in cls._fields if k in d and k not in sets}).replace(
            cpus=p.cpus,
            memory_nodes=nodes,
            memory_policy=policy,
            notes=p.notes,
            helpers=p.helpers,
            priority_cpus=p.priority_cpus,
            main_cpus=p.main_cpus,
            nics=p.nics,
            spill_nodes=nodes - p.memory_nodes,
        )

    @property
    def home_nodes(self) -> frozenset[int]:
        """Where its memory belongs: the policy's nodes less those it may only spill onto."""
        return self.memory_nodes - self.spill_nodes

    @classmethod
    def of_entry(cls, e: Entry) -> PlanView:
        return cls(
            local_rank=e.local_rank,
            rank_source=e.rank_source or None,
            local_world_size=e.local_world_size,
            device_index=e.device_index,
            device_pci=e.device or None,
            numa_node=e.numa_node,
            cpus=e.cpus,
            memory_nodes=e.memory_nodes,
            memory_policy=e.memory_policy,
            mode=e.mode,
            reason=_sysfs.clean_line(e.reason, 500),
            threads=e.threads,
            helpers=e.helpers,
            spill_nodes=e.spill,
            thread_plans={
                tid: (e.device_plans[i][0], e.device_plans[i][1]) for tid, i in e.thread_devices
            },
            priority_cpus=e.priority_cpus,
            main_thread=e.main_thread,
            main_cpus=e.main_cpus,
            nics=e.nics,
        )

    def allowed_for(self, tid: int, main: int | None) -> frozenset[int]:
        """The CPUs thread ``tid`` belongs on: its own device's plan, else the compute set
        (the main thread) or the compute set and the helper cores (any other)."""
        own = self.thread_plans.get(tid)
        if own is not None:
            return own[1]
        return self.cpus if tid == main else self.cpus | self.helpers

    @property
    def bound(self) -> bool:
        return self.status == "bound"


class SharedPages(Record):
    """Pages a process still shares copy-on-write with another (a fork parent), per node,
    and how they were found."""

    pages: int = 0
    nodes: dict[int, int] = {}  # noqa: RUF012 (records are immutable)
    how: str = "none"


BUFFER_LOCALITY = 0.99  # a host buffer under this share on its nodes is a warning


class BufferCheck(Record):
    """One host buffer a rank made (from its registry entry), measured in its numa_maps:
    ``locality`` is the share of its resident pages on ``nodes`` (None: nothing resident
    or the mapping is gone), ``ok`` False under 99%."""

    address: int
    nbytes: int
    nodes: tuple[int, ...]
    policy: str
    pages: dict[int, int]
    locality: float | None
    ok: bool


def check_buffers(
    entry: Entry | None, found: dict[int, dict[int, int] | None], notes: list[str]
) -> tuple[BufferCheck, ...]:
    """Judge each host buffer the process listed from its pages per node (``found``, by
    buffer index, measured in the one pass over its numa_maps:
    :func:`numabind._kernel.memory_view`); a warning note for one off its nodes."""
    if entry is None or not entry.buffers:
        return ()
    out = []
    for i, (address, nbytes, nodes, policy) in enumerate(entry.buffers):
        pages = found.get(i)
        share = locality(pages, frozenset(nodes)) if pages else None
        ok = share is None or share >= BUFFER_LOCALITY
        if pages is None:
            notes.append(f"host buffer 0x{address:x} ({nbytes >> 20} MiB) is no longer mapped")
        elif not ok:
            notes.append(
                f"warning: host buffer 0x{address:x} ({nbytes >> 20} MiB, {policy} on node "
                f"{fmt(nodes)}) has {share:.1%} of its pages there"
            )
        out.append(
            BufferCheck(
                address=address,
                nbytes=nbytes,
                nodes=tuple(nodes),
                policy=policy,
                pages=pages or {},
                locality=share,
                ok=ok,
            )
        )
    return tuple(out)


class RoleGroup(Record):
    """A rank's threads (or child processes) of one role, told by their names
    (:data:`numabind._model.THREAD_ROLES`): how many, the first ids, the CPUs they may run
    on together, and whether those lie in the plan's sets (the compute CPUs; a helper, the
    reserved cores too)."""

    role: str
    kind: str  # "threads" or "processes"
    count: int
    ids: tuple[int, ...]
    cpus: frozenset[int]
    on_plan: bool | None  # None: no plan to compare with

    def text(self) -> str:
        one = {"threads": "thread", "processes": "process"}.get(self.kind, self.kind)
        what = f"{self.role} ({self.count} {one if self.count == 1 else self.kind})"
        flag = "" if self.on_plan is not False else " OFF PLAN"
        return f"{what} {fmt(self.cpus) or '-'}{flag}"


ROLE_IDS = 8  # ids listed per role


def role_of(name: str) -> str:
    """The role a thread's or process's own name says (``other`` when none)."""
    low = name.lower()
    return next((role for role, word in THREAD_ROLES if word in low), "other")


def roles_of(
    pid: int,
    threads: dict[int, frozenset[int]],
    names: Mapping[int, str],
    expected: PlanView | None,
) -> tuple[RoleGroup, ...]:
    """Group a rank's threads and child processes by role, with their CPUs, so that an
    off-node helper is visible at a glance; ``names`` are the threads' names, read once
    by the caller; nothing is signalled."""
    found: dict[tuple[str, str], list[tuple[int, frozenset[int]]]] = {}
    own = expected.thread_plans if expected is not None else {}
    for tid, cpus in threads.items():
        role = "main" if tid == pid else role_of(names.get(tid, ""))
        if tid in own and tid != pid:
            role = f"device {own[tid][0]}"  # a thread bound to one device of several
        found.setdefault((role, "threads"), []).append((tid, cpus))
    for child in _kernel.child_pids(pid, sorted(threads)):
        mask = _kernel.cpus_allowed(child, child)
        if mask is None:
            continue
        role = role_of(_kernel.thread_name(child, child))
        role = role if role in HELPER_PROCESS_ROLES else "child"
        found.setdefault((role, "processes"), []).append((child, mask))
    out = []
    for (role, kind), members in found.items():
        cpus = frozenset().union(*(c for _, c in members))
        on_plan = None
        if expected is not None and expected.bound:
            main = pid if kind == "threads" else None
            on_plan = all(c <= expected.allowed_for(i, main) for i, c in members)
        ids = tuple(sorted(i for i, _ in members)[:ROLE_IDS])
        out.append(
            RoleGroup(role=role, kind=kind, count=len(members), ids=ids, cpus=cpus, on_plan=on_plan)
        )
    return tuple(sorted(out, key=lambda g: (g.kind != "threads", g.role != "main", g.role)))


class Identity(Record):
    """Who a rank is in its job, from its initial environment (:data:`numabind._model.
    JOB_VARIABLES`): what a job report groups and names it by; None where not set."""

    host: str | None = None  # the Slurm node name it was started on
    rank: int | None = None  # its global rank
    job_id: str | None = None
    step_id: str | None = None
    step_nodes: str | None = None  # the step's nodes (a hostlist expression)
    step_tasks: str | None = None  # tasks per node of the step (``2(x3),1``)

    @classmethod
    def of_environ(cls, env: Mapping[str, str]) -> Identity:
        def text(name: str, limit: int = 200) -> str | None:
            value = env.get(name)
            return _sysfs.clean_line(value, limit) if value else None

        rank = None
        for name in GLOBAL_RANK_VARIABLES:
            value = env.get(name, "")
            if value.isascii() and value.isdigit() and len(value) < 8:
                rank = int(value)
                break
        v = JOB_VARIABLES
        return cls(
            host=text(v["host"]),
            rank=rank,
            job_id=text(v["job"], 40),
            step_id=text(v["step"], 40),
            step_nodes=text(v["step_nodes"], 4000),
            step_tasks=text(v["step_tasks"], 1000),
        )


class GpuSeen(Record):
    """The accelerator a rank uses, as far as /proc tells: the device files it holds open
    (``open``: their PCI addresses), narrowed to one by its plan where it holds several
    (CUDA opens every visible GPU's file); ``index`` is the machine's (PCI order, as
    ``nvidia-smi`` counts), ``numa_node`` that GPU's node, ``source`` how it was told."""

    index: int | None = None
    pci: str | None = None
    numa_node: int | None = None
    source: str = "none"
    open: tuple[str, ...] = ()
    uuid: str | None = None  # the GPU's own (NVIDIA ``GPU-...``): what DCGM labels it by


class ProcessCheck(Record):
    """One process checked: ``status`` is ``bound``, ``skipped`` (its plan does not bind)
    or ``unknown`` (no plan to check against); ``ok`` is False when it is off its plan or
    cannot be checked, and ``problems`` say why."""

    pid: int
    ok: bool
    status: str
    problems: tuple[str, ...]
    notes: tuple[str, ...]
    plan: PlanView | None
    plan_source: str
    threads: dict[int, frozenset[int]]
    memory_policy: dict[str, Any] | None
    pages: dict[int, int]
    shared_pages: SharedPages
    locality: float | None = None
    thread_settings: dict[str, str] = {}  # noqa: RUF012 (records are immutable)
    maps_truncated: bool = False
    host_buffers: tuple[BufferCheck, ...] = ()
    roles: tuple[RoleGroup, ...] = ()
    identity: Identity = Identity()
    gpu: GpuSeen = GpuSeen()
    thread_names: dict[int, str] = {}  # noqa: RUF012 (records are immutable)
    mems_allowed: frozenset[int] | None = None  # its cpuset's memory nodes (/proc status)
    # the priority cores of the rank's node (its plan's, else the machine's), and whether
    # its main thread (the one NUMABIND_PRIORITY=main pinned, else its first) runs on them;
    # None where its node has none
    priority_cpus: frozenset[int] = frozenset()
    main_on_priority: bool | None = None
    # where the machine the rank planned from came from (its registry entry): "sysfs",
    # "cache", or "sysfs (cache: why not)"; "" when it did not say
    machine: str = ""
    # its private memory per node kind (NODE_KINDS: cpu, gpu, hbm, far, memory), in bytes
    tiers: dict[str, int] = {}  # noqa: RUF012 (records are immutable)
    # the RDMA adapter ports chosen for its GPU, and the transport variables it runs with
    # (what numabind set, from its registry entry, and the rest of its initial
    # environment); nic_set names those numabind set
    nics: tuple[NicChoice, ...] = ()
    nic_settings: dict[str, str] = {}  # noqa: RUF012 (records are immutable)
    nic_set: tuple[str, ...] = ()
    # the ids of the threads the CPU rule judged off the plan (a bound rank's; the problem
    # line names the first five): what the exporter counts
    off_plan_threads: tuple[int, ...] = ()
    # the other binders active in it (numabind._binders.BINDER_TABLE names), each said in
    # a note with what it will do to numabind's binding and the fix
    binders: tuple[str, ...] = ()


class NodeFacts(Record):
    """What holds for every rank of this machine: its name, NUMA balancing, the memory
    nodes this (the checking) process's cpuset allows, whether memory-policy calls are
    permitted here (a seccomp filter), the kernel."""

    host: str
    numa_balancing: bool | None
    cpuset_mems: frozenset[int] | None
    mempolicy_permitted: bool
    kernel: str | None


class CheckReport(Record):
    """What ``numabind check --json`` prints (docs/cli.rst documents every key)."""

    processes: tuple[ProcessCheck, ...]
    ok: bool
    problems: tuple[str, ...]
    shared_pages: SharedPages
    vanished: tuple[int, ...]
    skipped: tuple[int, ...]  # --all: not reached before --deadline
    registry_ignored: dict[str, int]
    numa_balancing: bool | None
    notes: tuple[str, ...]
    node: NodeFacts | None = None


# --- the plan a process should have ------------------------------------------------------------


def expected_plan(
    pid: int,
    machine: Machine,
    environ: Mapping[str, str] | OSError,
    source: str,
    settings: Mapping[str, str] | None = None,
) -> tuple[PlanView | None, str, Entry | None]:
    """The plan a process should have: its registry entry (under ``settings``'
    ``NUMABIND_REGISTRY``, default this process's), else planned from ``environ`` (its
    initial environment, or the error reading it; ``source`` says which).  Returns (plan,
    where it came from, entry)."""
    entry = _registry.read(pid, settings)
    if entry is not None:
        return PlanView.of_entry(entry), "registry", entry
    if isinstance(environ, OSError):
        return None, f"cannot read /proc/{pid}/environ ({environ.strerror or environ})", None
    from .._devices import resolve
    from .._environ import Config
    from .._plan import plan, request_from

    info = detect(environ)
    if info.local_rank is None and info.problem is None:
        return None, "no local rank in its initial environment and not registered by numabind", None
    try:
        cfg = Config.from_env(environ)
    except ValueError as err:
        return None, str(err), None
    visible = resolve(machine, environ)
    request = request_from(info, visible, cfg, nic=True)
    p = plan(machine, request)
    return PlanView.of_plan(p), source, None


def _thread_settings(entry: Entry | None, env: Mapping[str, str] | OSError) -> dict[str, str]:
    """The thread variables a rank was given: what numabind set (its registry entry; the
    hook sets them after start, so /proc/PID/environ cannot show them), else its initial
    environment."""
    if entry is not None and entry.thread_env:
        return {k: v for k, v in entry.thread_env if k in _SETTINGS}
    if isinstance(env, OSError):
        return {}
    return {k: env[k] for k in _SETTINGS if k in env}


def nic_facts(
    machine: Machine,
    expected: PlanView,
    entry: Entry | None,
    env: Mapping[str, str] | OSError,
    notes: list[str],
) -> dict[str, Any]:
    """The RDMA adapters of a rank (its plan's, else the machine's choice for its GPU) and
    the transport variables it runs with; a variable that names an adapter farther than
    the nearest, or none that may be used, is a ``warning:`` note."""
    gpu = machine.accelerator(expected.device_pci) if expected.device_pci else None
    if gpu is None:
        return {}
    from .. import _transports
    from .._nics import assign, same_vendor
    from .._plan import device_node

    chosen = expected.nics
    if not chosen:
        found = assign(machine, same_vendor(machine, gpu), lambda d: device_node(machine, d).node)
        chosen = found.per_device.get(gpu.pci, ())
    ours = dict(entry.nic_env) if entry is not None else {}
    settings = dict(ours)
    if not isinstance(env, OSError):
        for var in _transports.VARIABLES:
            if var.name in env and var.name not in settings:
                settings[var.name] = _sysfs.clean_line(env[var.name], _transports.MAX_VALUE)
    who = f"GPU {expected.device_index}" if expected.device_index is not None else f"GPU {gpu.pci}"
    for name, value in settings.items():
        if name in ours:
            continue  # numabind's own choice
        why = _transports.judge(
            machine, gpu, who, name, value, chosen, lambda d: device_node(machine, d).node
        )
        if why:
            notes.append(f"warning: {why}")
    if "NVSHMEM_HCA_LIST" in settings and settings.get(
        "NVSHMEM_ENABLE_NIC_PE_MAPPING", ""
    ).strip().lower() not in ("1", "y", "yes", "t", "true"):
        notes.append(
            "warning: NVSHMEM_HCA_LIST is set without NVSHMEM_ENABLE_NIC_PE_MAPPING=1: NVSHMEM "
            "ignores the list and picks by its own distance"
        )
    return {"nics": chosen, "nic_settings": settings, "nic_set": tuple(sorted(ours))}


def initial_environ(pid: int) -> Mapping[str, str] | OSError:
    """A process's initial environment, or the error reading it; raises
    :class:`Vanished` when the process is gone."""
    try:
        return _kernel.read_environ(pid)
    except FileNotFoundError as err:
        raise Vanished(pid) from err
    except OSError as err:
        return err


def gpu_in_use(pid: int, machine: Machine, expected: PlanView | None) -> GpuSeen:
    """The accelerator a process uses, told from the device files it holds open
    (:data:`numabind._model.DEVICE_FILES`), else from its plan."""
    accs = machine.accelerators
    by_minor: dict[tuple[str, int], str] = {}
    opened: list[str] = []
    for major, minor in sorted(_kernel.char_devices(pid)):
        for row in DEVICE_FILES:
            if row.major != major or not row.minors[0] <= minor <= row.minors[1]:
                continue
            if row.lookup == "minor":
                if not by_minor:
                    for a in machine.all_accelerators:
                        if a.minor is not None:
                            by_minor[(a.vendor, a.minor)] = a.pci
                pci = by_minor.get((row.vendor, minor))
            else:
                pci = _render_pci(machine, row.vendor, row.name.format(n=minor), minor)
            if pci is not None and pci not in opened:
                opened.append(pci)
    planned = expected.device_pci if expected is not None else None
    if len(opened) == 1:
        pci, source = opened[0], "the device file it holds open"
    elif opened and planned in opened:
        pci, source = planned, f"its plan (one of the {len(opened)} device files it holds open)"
    elif opened:
        pci, source = None, f"{len(opened)} device files open, none its plan's"
    elif planned:
        pci, source = planned, "its plan (no device file open yet)"
    else:
        return GpuSeen()
    acc = machine.accelerator(pci) if pci else None
    index = None
    if acc is not None:
        same = [a.pci for a in accs if a.vendor == acc.vendor]
        index = same.index(acc.pci) if acc.pci in same else None
        acc = machine.located(acc)
    return GpuSeen(
        index=index,
        pci=pci,
        numa_node=acc.numa_node if acc is not None and acc.numa_node != -1 else None,
        source=source,
        open=tuple(opened[:16]),
        uuid=_uuid_of(machine, acc),
    )


def _uuid_of(machine: Machine, acc: Accelerator | None) -> str | None:
    """The GPU's UUID (read with its details: one GPU's driver file), or None."""
    if acc is None:
        return None
    uuid = machine.detailed(acc).uuid
    return _sysfs.clean_line(uuid, 80) if uuid else None


def _render_pci(machine: Machine, vendor: str, name: str, minor: int) -> str | None:
    """The PCI address of the GPU behind DRM render node ``name``: its ``device`` link;
    for a compute partition (whose render node is a platform device, amdgpu_xcp) the GPU
    the partition topology names."""
    pci = _drm_pci(name)
    if pci is not None and normalize_pci(pci) == pci:
        return pci
    devs = tuple(a for a in machine.accelerators if a.vendor == vendor)
    return next((d.pci for d in machine.with_partitions(devs) if d.render_minor == minor), None)


def _drm_pci(name: str) -> str | None:
    """The PCI address of a DRM render node (live /sys only: its ``device`` link)."""
    try:
        target = os.readlink(f"/sys/class/drm/{name}/device")
    except OSError:
        return None
    last = target.rsplit("/", 1)[-1]
    return last if _sysfs.clean_line(last, 32) == last else None


def _permitted() -> bool:
    """Whether this process may make memory-policy calls (a seccomp filter says EPERM)."""
    try:
        _kernel.get_mempolicy()
    except OSError as err:
        return err.errno != errno.EPERM
    return True


# --- one process -------------------------------------------------------------------------------


def check_pid(
    pid: int,
    machine: Machine,
    min_locality: float = MIN_LOCALITY,
    environ: Mapping[str, str] | None = None,
    deadline: float | None = None,
    settings: Mapping[str, str] | None = None,
) -> ProcessCheck:
    """Check one process; raises :class:`Vanished` if it is gone or a zombie.  Each of its
    /proc files is read a fixed number of times (maps and numa_maps once, whatever its
    entry lists); reading its memory stops at ``deadline``.  ``settings``: where its
    registry is (``NUMABIND_REGISTRY``; default this process's environment)."""
    if not _kernel.alive(pid):
        raise Vanished(pid)
    env = environ if environ is not None else initial_environ(pid)
    expected, source, entry = expected_plan(
        pid,
        machine,
        env,
        "its environment" if environ is not None else "its initial environment",
        settings,
    )
    threads = _kernel.thread_masks(pid)
    if not threads and not _kernel.alive(pid):
        raise Vanished(pid)
    unreadable: list[str] = []
    listed = tuple((a, n) for a, n, _, _ in entry.buffers) if entry is not None else ()
    try:
        view = _kernel.memory_view(pid, listed, deadline)
    except OSError as err:
        if not _kernel.alive(pid):
            raise Vanished(pid) from None
        view = _kernel.MemoryView(policy=None, regions=(), buffers={}, truncated=False)
        unreadable += [f"memory policy ({err.strerror})", f"memory maps ({err.strerror})"]
    policy = view.policy
    maps = _kernel.Maps(list(view.regions), view.truncated)
    regions = maps.regions
    pages = pages_per_node(regions)
    shared = _shared(pid, regions)
    own = {n: c - shared.nodes.get(n, 0) for n, c in pages.items()}
    own = {n: c for n, c in own.items() if c > 0}
    problems: list[str] = []
    notes: list[str] = []
    if view.late:
        notes.append(f"/proc/{pid}: its memory maps were read only in part: the deadline passed")
    if maps.truncated:
        notes.append(
            f"/proc/{pid}/maps or numa_maps is larger than numabind reads "
            f"({_sysfs.MAPS_BYTES_CAP >> 20} MiB, {_sysfs.MAPS_LINES_CAP} lines): its pages "
            "are counted from the part read"
        )
    if machine.numa_balancing:
        notes.append(_balancing_note(expected))
    if unreadable:
        notes.append(
            f"/proc/{pid}: {' and '.join(unreadable)} not readable by this user: memory not "
            "checked (run check as the process's user or as root)"
        )
    names = {tid: _sysfs.clean_line(_kernel.thread_name(pid, tid), 32) for tid in threads}
    status = _kernel.status(pid) or {}
    try:
        mems = _sysfs.parse_cpulist(status.get("Mems_allowed_list", "-"), what="node")
    except ValueError:
        mems = None
    tiers = _tiers(machine, own, expected, entry, policy, notes)
    base: dict[str, Any] = {
        "tiers": tiers,
        "pid": pid,
        "identity": Identity() if isinstance(env, OSError) else Identity.of_environ(env),
        "gpu": gpu_in_use(pid, machine, expected),
        "thread_names": names,
        "mems_allowed": mems,
        "plan": expected,
        "plan_source": source,
        "threads": threads,
        "memory_policy": None
        if policy is None
        else {"policy": policy[0], "nodes": sorted(policy[1])},
        "pages": pages,
        "shared_pages": shared,
        "maps_truncated": maps.truncated,
        "roles": roles_of(pid, threads, names, expected),
        "binders": _binders_in(machine, env, entry, expected, notes),
    }
    if expected is None:
        problems.append(f"no plan to check against: {source}")
        return ProcessCheck(
            ok=False, status="unknown", problems=tuple(problems), notes=tuple(notes), **base
        )
    settings = _thread_settings(entry, env)
    base["thread_settings"] = settings
    base.update(nic_facts(machine, expected, entry, env, notes))
    base["host_buffers"] = check_buffers(entry, view.buffers, notes)
    if not expected.bound:
        _why_skipped(expected, env, machine, problems, notes)
        return ProcessCheck(
            ok=not problems,
            status="skipped",
            problems=tuple(problems),
            notes=tuple(notes),
            **base,
        )
    # a helper process (a forked DataLoader worker: its environment names the rank too)
    # may run on the reserved cores with its first thread
    helper = role_of(names.get(pid, "")) in HELPER_PROCESS_ROLES
    main = None if helper else pid
    # locality is of its CPU memory: pages on a GPU's or far memory are in ``tiers`` and
    # said in a note (the GPU driver migrates memory to GPU nodes by itself)
    cpu_own = {n: c for n, c in own.items() if n not in wrong_tier_nodes(machine)}
    off: list[int] = []
    share = _judge(
        expected,
        source,
        main,
        threads,
        policy,
        cpu_own,
        min_locality,
        problems,
        notes,
        names,
        off,
        _vendor_of(machine, expected),
    )
    if shared.pages:
        notes.append(
            f"{shared.pages * 4 // 1024} MiB of its pages are still shared copy-on-write with "
            f"another process (a fork parent), on node(s) "
            f"{', '.join(str(n) for n in shared.nodes)}: not counted against its plan; start "
            "children with spawn or forkserver where it matters"
        )
    _thread_notes(settings, expected, notes)
    base.update(_core_facts(pid, expected, entry, threads, machine, problems, notes))
    return ProcessCheck(
        ok=not problems,
        status="bound",
        problems=tuple(problems),
        notes=tuple(notes),
        locality=share,
        off_plan_threads=tuple(off),
        **base,
    )


def _core_facts(
    pid: int,
    expected: PlanView,
    entry: Entry | None,
    threads: dict[int, frozenset[int]],
    machine: Machine,
    problems: list[str],
    notes: list[str],
) -> dict[str, Any]:
    """The ProcessCheck fields of which cores: the priority check, and where the rank's
    machine came from (said as a note)."""
    prio, on = _priority_check(pid, expected, threads, machine, problems, notes)
    where = entry.machine if entry is not None else ""
    if where and debugging():  # numabind's own note (NUMABIND_DEBUG); --json always has it
        notes.append(f"machine: {where}")
    return {"priority_cpus": prio, "main_on_priority": on, "machine": where}


def _priority_check(
    pid: int,
    expected: PlanView,
    threads: dict[int, frozenset[int]],
    machine: Machine,
    problems: list[str],
    notes: list[str],
) -> tuple[frozenset[int], bool | None]:
    """Whether the rank's main thread runs on a priority core of its node: the one
    NUMABIND_PRIORITY=main pinned (a problem when it left that core), else its first
    thread, against the plan's priority cores or, for a rank planned without the role, the
    machine's (a note: the role is off).  Returns (those cores, the answer or None)."""
    prio = expected.priority_cpus
    if not prio and expected.numa_node is not None:
        prio = machine.priority_cpus(expected.numa_node)
    if not prio:
        return frozenset(), None
    tid = expected.main_thread if expected.main_thread in threads else pid
    mask = threads.get(tid)
    if mask is None:
        return prio, None
    on = bool(mask) and mask <= prio
    where = f"main thread {tid} on CPUs {fmt(mask)}"
    if on:
        notes.append(f"{where}: a priority core")
    elif expected.main_cpus:
        problems.append(f"{where}: left its priority core {fmt(expected.main_cpus)}")
    else:
        role = "" if expected.priority_cpus else " (NUMABIND_PRIORITY=main or rank puts it there)"
        notes.append(
            f"{where}: not a priority core; node {expected.numa_node}'s: {fmt(prio)}{role}"
        )
    return prio, on


def _tiers(
    machine: Machine,
    own: dict[int, int],
    expected: PlanView | None,
    entry: Entry | None,
    policy: tuple[str, frozenset[int]] | None,
    notes: list[str],
) -> dict[str, int]:
    """A rank's private memory per node kind, and the notes about its tiers: memory on a
    GPU's or far node it did not ask for (its plan's nodes and spill mask, its host
    buffers' nodes), and a policy that interleaves a GPU rank over every node."""
    asked = (expected.memory_nodes if expected is not None else frozenset()) | frozenset(
        n for b in (entry.buffers if entry is not None else ()) for n in b[2]
    )
    notes.extend(wrong_tier_notes(machine, own, asked, expected))
    notes.extend(_interleave_notes(policy, expected))
    return memory_by_kind(machine, own)


def wrong_tier_nodes(machine: Machine) -> frozenset[int]:
    """The machine's GPU-memory and far nodes (none are looked for when every node has
    CPUs)."""
    return frozenset(
        n
        for n in machine.memory_only_ids
        if (kind := NODE_KINDS.get(machine.node_kind(n) or "")) is not None and kind.wrong_tier
    )


def memory_by_kind(machine: Machine, pages: Mapping[int, int]) -> dict[str, int]:
    """Bytes of ``pages`` (4 KiB units per node) per node kind; only nodes with pages are
    looked at, and a machine's nodes are classified only when one of them has no CPUs."""
    out: dict[str, int] = {}
    memory_only = machine.memory_only_ids
    for node, count in sorted(pages.items()):
        kind = (machine.node_kind(node) or "memory") if node in memory_only else "cpu"
        out[kind] = out.get(kind, 0) + count * 4096
    return out


def wrong_tier_notes(
    machine: Machine, pages: Mapping[int, int], asked: frozenset[int], plan: PlanView | None
) -> list[str]:
    """A warning for each GPU-memory or far node holding some of a rank's memory that it
    did not ask for (``asked``: its plan's nodes and spill mask, its host buffers' nodes).
    A note, never a problem: the GPU driver itself migrates memory to GPU nodes on
    coherent systems, and a rank may have placed it there on purpose."""
    memory_only = machine.memory_only_ids
    out = []
    for node, count in sorted(pages.items()):
        if node not in memory_only or node in asked or count <= 0:
            continue
        kind = NODE_KINDS.get(machine.node_kind(node) or "")
        if kind is None or not kind.wrong_tier:
            continue
        gpu = machine.gpu_memory().get(node)
        if gpu is not None:
            same = [a.pci for a in machine.accelerators if a.vendor == gpu[0].vendor]
            index = same.index(gpu[0].pci) if gpu[0].pci in same else None
            what = f"GPU {index}'s memory" if index is not None else f"the memory of {gpu[0].pci}"
        else:
            what = kind.label
        size = count * 4096
        amount = f"{size / 2**30:.1f} GiB" if size >= 1 << 30 else f"{max(size >> 20, 1)} MiB"
        why = "not a node its plan uses" if plan is not None and plan.bound else "it has no plan"
        out.append(f"warning: {amount} of this rank's memory is on node {node}, {what} ({why})")
    return out


def _interleave_notes(
    policy: tuple[str, frozenset[int]] | None, plan: PlanView | None
) -> list[str]:
    """A GPU rank whose memory policy interleaves over several nodes (``numactl
    --interleave=all``, kept where the rule keeps a deliberate binding): the pinned
    staging buffers it allocates are spread over every one of them (colibri#82: the
    host-to-device path 10x slower)."""
    if policy is None or policy[0] != "interleave" or len(policy[1]) < 2:
        return []
    if plan is None or not plan.device_pci:
        return []
    return [
        f"its memory policy interleaves over nodes {fmt(policy[1])}: pinned staging "
        "buffers it allocates (torch pin_memory, cudaHostAlloc) are spread over all of "
        "them (one report: the host-to-device path 10x slower); numabind.host_buffer and "
        "numabind.torch.pinned_empty take a policy of their own, NUMABIND_TORCH=1 gives "
        "the DataLoader's pin thread the rank's"
    ]


def _escaped_text(
    tid: int, mask: frozenset[int], expected: PlanView, names: Mapping[int, str], vendor: str = ""
) -> str:
    """``thread 812 'uccl_proxy' on CPUs 0-223 OFF PLAN (UCCL's, by its name)``."""
    name = names.get(tid, "")
    text = f"thread {tid}" + (f" {name!r}" if name else "") + f" on CPUs {fmt(mask)} OFF PLAN"
    own = expected.thread_plans.get(tid)
    if own is not None:
        text += f" (its device {own[0]}: CPUs {fmt(own[1])})"
    who = binder_of(name, vendor)
    return text + (f", re-pinned by {who}? (its name says so)" if who else "")


def _vendor_of(machine: Machine, expected: PlanView | None) -> str:
    """The vendor key of the rank's planned device ("" when unknown)."""
    pci = expected.device_pci if expected is not None else None
    return next((a.vendor for a in machine.accelerators if pci and a.pci == pci), "")


def _binders_in(
    machine: Machine,
    env: Mapping[str, str] | OSError,
    entry: Entry | None,
    expected: PlanView | None,
    notes: list[str],
) -> tuple[str, ...]:
    """The other binders active in a rank (numabind._binders.BINDER_TABLE): each variable
    of its initial environment that makes a library re-pin it, an active sched_ext
    scheduler, and the CPU mask it started with where only that is left (an exec wrapper);
    each said in ``notes`` with what it will do and the fix."""
    from .. import _binders

    found: list[str] = []
    if not isinstance(env, OSError):
        for b, value in _binders.env_binders(env):
            found.append(b.name)
            notes.append(_binders.say(b, f"{b.key}={value}"))
    scheduler = machine.sched_ext
    if scheduler is not None:
        found.append("sched_ext")
        notes.append(_binders.sched_ext_line(scheduler))
    if entry is not None and entry.start_mask and entry.start_action:
        found.append("numactl")
        notes.append(_binders.mask_line(fmt(entry.start_mask), entry.start_action, fmt(entry.cpus)))
    return tuple(dict.fromkeys(found))


def _why_skipped(
    expected: PlanView,
    env: Mapping[str, str] | OSError,
    machine: Machine,
    problems: list[str],
    notes: list[str],
) -> None:
    """A plan that does not bind: its problem, and for a cpuset off the GPU's node the fix
    where the process runs (Kubernetes, Slurm: numabind._advice)."""
    if expected.problem:
        cause = "cgroup too narrow" if expected.skip == "cgroup" else "bad input"
        problems.append(f"{cause}: {expected.reason}")
    if expected.skip == "cgroup":
        from .._advice import cpuset_fix

        own: Mapping[str, str] = {} if isinstance(env, OSError) else env
        notes.append(f"to bind it: {cpuset_fix(own, machine.allowed)}")


def _judge(
    expected: PlanView,
    source: str,
    main: int | None,
    threads: dict[int, frozenset[int]],
    policy: tuple[str, frozenset[int]] | None,
    own: dict[int, int],
    min_locality: float,
    problems: list[str],
    notes: list[str],
    names: Mapping[int, str] | None = None,
    off: list[int] | None = None,
    vendor: str = "",
) -> float | None:
    """Compare a bound process with its plan: CPUs of every thread, memory policy, where
    its own pages are; the main thread belongs on the compute CPUs, any other thread may
    also run on the plan's helper cores (NUMABIND_RESERVE), and a thread bound to one
    device of a multi-device process on that device's CPUs.  A thread off its plan is
    named, with its name and who moved it where its name tells; their ids go into ``off``.
    Returns the share of its pages on the plan's nodes."""
    names = names or {}
    cpus = expected.cpus
    mem_nodes = expected.memory_nodes
    escaped = {t: c for t, c in threads.items() if not c <= expected.allowed_for(t, main)}
    if not cpus and not expected.thread_plans:
        escaped = {}  # a plan for memory alone (one node with CPUs): CPUs are not its promise
    if off is not None:
        off.extend(sorted(escaped))
    if escaped and len(escaped) == len(threads) and not expected.thread_plans:
        sample = next(iter(escaped.values()))
        problems.append(
            f"bound by someone else: every thread runs on CPUs {fmt(sample)}, plan {fmt(cpus)}"
        )
    elif escaped:
        shown = [
            _escaped_text(t, c, expected, names, vendor) for t, c in sorted(escaped.items())[:5]
        ]
        problems.append(
            f"threads that left the plan's CPUs {fmt(cpus)}: {'; '.join(shown)}"
            + (f"; and {len(escaped) - 5} more" if len(escaped) > 5 else "")
        )
    want = expected.memory_policy
    if want not in ("none", "not-permitted") and source != "registry" and not _permitted():
        want = "not-permitted"  # this container refuses the calls: so it did for the rank
    if want == "not-permitted":
        notes.append(
            "memory policy: not permitted (a seccomp filter refused the memory-policy calls); "
            "locality is from /proc/PID/numa_maps"
        )
        mem_nodes = frozenset()
    elif policy is not None and want != "none":
        got_name, got_nodes = policy
        if got_name != want or (want != "local" and got_nodes != mem_nodes):
            problems.append(
                f"memory policy is {got_name} {fmt(got_nodes) or '(no nodes)'}, plan "
                f"{want} {fmt(mem_nodes)}".rstrip()
            )
    home = mem_nodes - expected.spill_nodes if mem_nodes else mem_nodes
    check_nodes = home or (
        frozenset({expected.numa_node}) if expected.numa_node is not None else frozenset()
    )
    share = locality(own, check_nodes) if check_nodes else None
    if share is not None and share < min_locality:
        remote = {n: c for n, c in own.items() if n not in check_nodes}
        worst = max(remote, key=lambda n: remote[n])
        text = (
            f"pages left remote: {share:.1%} on node(s) {fmt(check_nodes)}, "
            f"{remote[worst] * 4 // 1024} MiB on node {worst}"
        )
        if mem_nodes:
            problems.append(text)
        else:  # the plan set no memory policy: where pages are is not its promise
            notes.append(f"{text} (no memory policy was planned)")
    return share


def _shared(pid: int, regions: list[Region]) -> SharedPages:
    """Pages shared copy-on-write, per node: pagemap's exclusive bit finds them, move_pages
    (querying, moving nothing) says where they are; where either is refused, numa_maps'
    per-region ``mapmax`` gives an upper bound instead.

    With automatic NUMA balancing on (the default of most distributions), the kernel
    unmaps a running process's pages for hinting faults, and move_pages then answers
    EFAULT for those pages although they are resident (seen on Linux 6.1 in the VM: 25,089
    of 26,042 shared pages after 3 s of CPU time).  Such pages are given the nodes of
    their region's other unexplained pages, in proportion, from numa_maps, which still
    counts them; for a region shared as a whole (a fork child's inherited buffers) that
    is exact."""
    if not any(r.mapmax > 1 for r in regions):
        return SharedPages()
    addrs, _ = shared_pages(regions, pid)
    if addrs:
        try:
            where: list[int] = []
            for i in range(0, len(addrs), 16384):
                where.extend(_kernel.move_pages(addrs[i : i + 16384], None, pid))
        except OSError:
            pass
        else:
            return _place_shared(regions, addrs, where)
    nodes: dict[int, int] = {}
    for r in regions:
        if r.mapmax > 1:
            for n, c in r.pages.items():
                nodes[n] = nodes.get(n, 0) + c
    return SharedPages(
        pages=sum(nodes.values()),
        nodes=dict(sorted(nodes.items())),
        how="numa_maps mapmax (upper bound)",
    )


def _place_shared(regions: list[Region], addrs: list[int], where: list[int]) -> SharedPages:
    """Shared pages per node from move_pages' answers; the pages it could not see are
    placed from their region's numa_maps counts (see ``_shared``)."""
    import bisect

    order = sorted(range(len(regions)), key=lambda i: regions[i].start)
    starts = [regions[i].start for i in order]
    known: dict[int, dict[int, int]] = {}  # region index -> node -> shared pages
    unseen: dict[int, int] = {}  # region index -> shared pages move_pages did not see
    for a, w in zip(addrs, where):
        k = bisect.bisect_right(starts, a) - 1
        if k < 0 or a >= regions[order[k]].end:
            continue
        idx = order[k]
        if w >= 0:
            per = known.setdefault(idx, {})
            per[w] = per.get(w, 0) + 1
        else:
            unseen[idx] = unseen.get(idx, 0) + 1
    nodes: dict[int, int] = {}
    for per in known.values():
        for n, c in per.items():
            nodes[n] = nodes.get(n, 0) + c
    for idx, count in unseen.items():
        rest = {n: max(c - known.get(idx, {}).get(n, 0), 0) for n, c in regions[idx].pages.items()}
        for n, c in _apportion(count, rest).items():
            nodes[n] = nodes.get(n, 0) + c
    hidden = sum(unseen.values())
    how = "pagemap"
    if hidden:
        how += (
            f"; {hidden} pages placed from numa_maps (move_pages could not see them: "
            "NUMA balancing had unmapped them)"
        )
    return SharedPages(pages=sum(nodes.values()), nodes=dict(sorted(nodes.items())), how=how)


def _apportion(count: int, weights: dict[int, int]) -> dict[int, int]:
    """``count`` split over ``weights``' keys in proportion (largest remainders), never
    more per key than its weight."""
    total = sum(weights.values())
    if total <= 0 or count <= 0:
        return {}
    count = min(count, total)
    share = {n: count * w // total for n, w in weights.items()}
    left = count - sum(share.values())
    for n in sorted(weights, key=lambda n: (-(count * weights[n] % total), n))[:left]:
        share[n] += 1
    return {n: c for n, c in share.items() if c}


def _balancing_note(expected: PlanView | None) -> str:
    policy = POLICIES.get(expected.memory_policy) if expected is not None else None
    if policy is not None and policy.task and policy.code is not None:
        return (
            "automatic NUMA balancing is on: this rank's private memory is under a task "
            "memory policy, which the kernel does not scan; its shared and file pages still are"
        )
    return (
        "automatic NUMA balancing is on: the kernel scans this process's memory and may move "
        "pages and stall it (DeepEP measured 16-31 ms); a memory policy (NUMABIND_MEMORY="
        "preferred) spares private memory"
    )


def _thread_notes(settings: dict[str, str], expected: PlanView, notes: list[str]) -> None:
    cpus = len(expected.cpus)
    budget = expected.threads
    omp = settings.get("OMP_NUM_THREADS", "")
    if omp.isascii() and omp.isdigit() and len(omp) < 7:
        n = int(omp)
        if n > cpus:
            notes.append(
                f"OMP_NUM_THREADS={n} oversubscribes its {cpus} CPUs"
                + (f" (budget {budget})" if budget else "")
            )
        elif budget and n < budget:
            notes.append(
                f"OMP_NUM_THREADS={n} uses fewer threads than its budget of {budget} "
                "(NUMABIND_THREADS=auto sizes it)"
            )
    elif any(k in settings for k in THREAD_VARIABLES):
        notes.append(
            "thread settings: "
            + ", ".join(f"{k}={v}" for k, v in settings.items() if k in THREAD_VARIABLES)
        )
    places = [f"{k}={_sysfs.short(v, 60)}" for k, v in settings.items() if k in AFFINITY_VARIABLES]
    if places:
        notes.append(f"its OpenMP runtime was given {', '.join(places)}")


# --- which processes ---------------------------------------------------------------------------


def rank_pids(
    keep: Callable[[Mapping[str, str]], bool] | None = None,
    members: frozenset[int] | None = None,
    settings: Mapping[str, str] | None = None,
) -> tuple[list[int], Scan]:
    """Processes on this machine that are ranks: a rank variable in their initial
    environment, or an entry in numabind's registry (``settings``' ``NUMABIND_REGISTRY``,
    default this process's); with ``members``, only those (a job's processes, as the
    kernel or Slurm says: :func:`job_members`), and with ``keep``, only those whose
    initial environment it accepts too (what they claim narrows, never widens)."""
    scan = _registry.scan(settings, all_users=True)
    registered = set(scan.entries)
    found = set(registered) if keep is None and members is None else set()
    me = os.getpid()
    names = _sysfs.listdir("/proc", 1 << 22) if members is None else [str(p) for p in members]
    for name in names:
        if not (name.isascii() and name.isdigit()):
            continue
        pid = int(name)
        if pid == me or pid in found:
            continue
        try:
            env = _kernel.read_environ(pid)
        except OSError:
            continue
        if keep is not None and not keep(env):
            continue
        if pid in registered or (
            any(v in env for v in RANK_VARIABLE_NAMES) and detect(env, _kernel.cmdline(pid)).is_rank
        ):
            found.add(pid)
    return sorted(found), scan


class Membership(Record):
    """Which processes of this node belong to a job, and who said so (``source``): Slurm's
    own process tracking, the job's cgroup, or, failing both, the job owner's uid.  Never
    what a process's environment claims: anyone can start a process with
    ``SLURM_JOB_ID=J``; nor a cgroup's name alone (``notes``: what was not counted)."""

    pids: frozenset[int]
    source: str
    notes: tuple[str, ...] = ()


LISTPIDS_CAP = 4 << 20  # bytes of ``scontrol listpids`` read
MAX_MEMBER_NOTES = 8  # processes named in the notes on cgroups not counted (the rest counted)


def job_members(job: str, owner: int | None, timeout: float = 10.0) -> Membership:
    """The processes of job ``job`` on this node, from the first source that knows:

    1. ``scontrol listpids JOB`` (slurmstepd's own list of the processes of each step,
       whatever the process tracking plugin);
    2. the cgroup the kernel puts each process in, counted only where no user could
       have made it (:func:`_cgroup_members`: on Slurm's own path, owned by root, a
       process of ``owner``);
    3. ``owner``, the uid the job runs as (from ``scontrol show job``): a process of
       another uid is never a rank of the job, whatever its environment says.
    """
    base = job.split("_", 1)[0]
    listed = _listpids(base, timeout)
    if listed is not None:
        return Membership(pids=listed, source="Slurm's process tracking (scontrol listpids)")
    in_cgroup, notes = _cgroup_members(base, owner)
    if in_cgroup is not None:
        return Membership(
            pids=in_cgroup, source=f"the kernel's cgroup of the job (job_{base})", notes=notes
        )
    if owner is not None:
        pids = []
        for name in _sysfs.listdir("/proc", 1 << 22):
            if name.isascii() and name.isdigit():
                uids = _kernel.process_uids(int(name))
                if uids is not None and uids == {owner}:
                    pids.append(int(name))
        return Membership(
            pids=frozenset(pids),
            source=f"the job owner's uid {owner} (no Slurm process tracking or job cgroup here)",
            notes=notes,
        )
    return Membership(
        pids=frozenset(),
        source="unknown: no Slurm process tracking, no job cgroup and no owner uid "
        "(--job-uid): no process counted",
        notes=notes,
    )


def _listpids(job: str, timeout: float) -> frozenset[int] | None:
    """``scontrol listpids JOB``'s pids, or None where it cannot answer here."""
    import shutil
    import subprocess

    from ._isolated import loose

    scontrol = shutil.which("scontrol")
    if scontrol is None or loose(scontrol, {0, os.geteuid()}) is not None:
        return None  # not here, or a program another user could change: not run
    try:
        p = subprocess.run(
            [scontrol, "listpids", job],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            cwd="/",
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if p.returncode != 0:
        return None
    pids = set()
    for line in p.stdout[:LISTPIDS_CAP].decode("ascii", "replace").splitlines()[: 1 << 20]:
        fields = line.split()
        if len(fields) >= 2 and fields[1] == job and fields[0].isdigit() and len(fields[0]) < 11:
            pids.add(int(fields[0]))
    return frozenset(pids) if pids else None


def slurm_jobs(cgroup: str) -> set[str]:
    """The Slurm jobs a ``/proc/PID/cgroup`` text puts a process in, by the path alone
    (:func:`slurm_path`).  Linear in the text: components are compared, no pattern
    backtracks."""
    out = set()
    for line in cgroup.splitlines()[:64]:
        found = slurm_path(line.split(":", 2)[-1])
        if found is not None:
            out.add(found[0])
    return out


def slurm_path(path: str) -> tuple[str, str, int | None] | None:
    """Where a cgroup path is a Slurm job's on Slurm's own path: (the job, the job's
    directory, the uid the path names or None), else None.  Slurm's paths are fixed at
    the top of the hierarchy: v1 ``/slurm[_NODE]/uid_U/job_N/...``, v2
    ``/system.slice/[NODE_]slurmstepd.scope/job_N/...`` (or ``/slurmstepd.scope/...``
    seen from a cgroup namespace).  A ``job_N`` anywhere else (below a user's delegated
    ``user@UID.service``, which that user may fill with any names) is not one."""
    parts = path.split("/", 5)[1:5]
    if len(parts) >= 3 and parts[0].startswith("slurm") and parts[1].startswith("uid_"):
        uid, job = parts[1][4:], parts[2]
        if not (uid.isascii() and uid.isdigit() and len(uid) < 11):
            return None
        at, named = 3, int(uid)
    elif len(parts) >= 3 and parts[0] == "system.slice" and parts[1].endswith("slurmstepd.scope"):
        job, at, named = parts[2], 3, None
    elif len(parts) >= 2 and parts[0].endswith("slurmstepd.scope"):
        job, at, named = parts[1], 2, None
    else:
        return None
    number = job[4:]
    if not (job.startswith("job_") and number.isascii() and number.isdigit() and len(number) < 20):
        return None
    return number, "/" + "/".join(parts[:at]), named


def _claims(path: str, job: str) -> bool:
    """Whether a cgroup path names job ``job`` anywhere (``.../job_J/...``): a claim,
    counted only on Slurm's own path.  Linear: one split, components compared."""
    return f"job_{job}" in path.split("/")[: 1 << 12]


def _cgroup_mounts() -> list[tuple[frozenset[str] | None, str, str]]:
    """Where each cgroup hierarchy is mounted here: (None for the v2 one, else its mount
    options, which hold its controllers as ``/proc/PID/cgroup`` names them: ``cpu``,
    ``name=systemd``; the mount point; the hierarchy's path there)."""
    out: list[tuple[frozenset[str] | None, str, str]] = []
    text = _sysfs.read_opt("/proc/self/mountinfo", 1 << 22) or ""
    for line in text.splitlines()[: 1 << 16]:
        fields = line.split(" ", 64)
        if "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < sep + 4 or fields[sep + 1] not in ("cgroup", "cgroup2"):
            continue
        options = None if fields[sep + 1] == "cgroup2" else frozenset(fields[sep + 3].split(","))
        out.append((options, _unescape(fields[4]), _unescape(fields[3])))
    return out


def _mount_of(
    mounts: list[tuple[frozenset[str] | None, str, str]], controllers: str
) -> tuple[str, str] | None:
    """The mount (point, its path in the hierarchy) of the hierarchy a
    ``/proc/PID/cgroup`` line names by its controllers (``""``: the v2 one)."""
    wanted = frozenset(controllers.split(",")) if controllers else None
    for options, point, root in mounts:
        if (wanted is None and options is None) or (
            wanted is not None and options is not None and wanted <= options
        ):
            return point, root
    return None


def _unescape(field: str) -> str:
    """A mountinfo field as a path (the kernel writes a space, tab, newline or
    backslash as an octal escape)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def _root_owned(mount: tuple[str, str], directory: str, seen: dict[str, str | None]) -> str | None:
    """None where ``directory`` (a hierarchy's path) and every folder above it in its
    mount are owned by root, else why not (``seen``: the answers so far, by path)."""
    point, root = mount
    if root != "/" and not (directory == root or directory.startswith(root.rstrip("/") + "/")):
        return "is not in this machine's mount of its hierarchy"
    rel = directory[len(root.rstrip("/")) :].strip("/")
    path = point
    for part in ["", *rel.split("/")] if rel else [""]:
        path = f"{path}/{part}" if part else path
        if path not in seen:
            try:
                st = os.lstat(path)
            except OSError:
                seen[path] = "cannot be looked at"
            else:
                seen[path] = None if st.st_uid == 0 else f"is owned by uid {st.st_uid}"
        why = seen[path]
        if why is not None:
            return f"{_sysfs.short(path, 160)} {why}"
    return None


def _cgroup_members(job: str, owner: int | None) -> tuple[frozenset[int] | None, tuple[str, ...]]:
    """Processes whose cgroup (any hierarchy) is job ``job``'s, or None when no process
    here, this one included, is in a Slurm job cgroup at all (no cgroup tracking); and
    what was not counted.  A cgroup counts only if nobody but root could have made it:
    on Slurm's own path (:func:`slurm_path`), with the job's folder and every folder
    above it owned by root, and its process of the job's uid ``owner`` (where known; the
    uid a v1 path names too).  A process that names the job otherwise is said, not
    counted: any logged-in user may create ``.../user@UID.service/slurm/job_J``."""
    tracked = False
    pids: set[int] = set()
    refused: dict[str, list[int]] = {}
    mounts: list[tuple[frozenset[str] | None, str, str]] | None = None
    seen: dict[str, str | None] = {}
    for name in _sysfs.listdir("/proc", 1 << 22):
        if not (name.isascii() and name.isdigit()):
            continue
        pid = int(name)
        text = _sysfs.read_opt(f"/proc/{name}/cgroup", 1 << 16) or ""
        for line in text.splitlines()[:64]:
            _, _, rest = line.partition(":")
            controllers, _, path = rest.partition(":")
            found = slurm_path(path)
            if found is None:
                if _claims(path, job):
                    why = f"a cgroup not on Slurm's own path ({_sysfs.short(path, 120)})"
                    refused.setdefault(why, []).append(pid)
                continue
            if mounts is None:
                mounts = _cgroup_mounts()
            mount = _mount_of(mounts, controllers)
            unsafe = (
                "is in a cgroup hierarchy not mounted here"
                if mount is None
                else _root_owned(mount, found[1], seen)
            )
            if unsafe is not None:
                if found[0] == job:
                    refused.setdefault(f"a cgroup that {unsafe}", []).append(pid)
                continue
            tracked = True
            if found[0] != job:
                continue
            uids = _kernel.process_uids(pid)
            if uids == {0} and owner != 0:
                continue  # slurmstepd, Slurm's own process in the job's cgroup: not a rank
            if owner is not None and (uids != {owner} or found[2] not in (None, owner)):
                refused.setdefault(f"its cgroup, but it runs as uid {sorted(uids or [])[:2]} "
                                   f"and the job as {owner}", []).append(pid)  # fmt: skip
                continue
            pids.add(pid)
            break
    pids -= {p for ps in refused.values() for p in ps}
    notes = []
    for why, who in sorted(refused.items())[:MAX_MEMBER_NOTES]:
        shown = ", ".join(str(p) for p in sorted(set(who))[:MAX_MEMBER_NOTES])
        more = len(set(who)) - MAX_MEMBER_NOTES
        notes.append(
            f"pid {shown}{f' and {more} more' if more > 0 else ''} claim(s) job {job} "
            f"through {_sysfs.clean_line(why, 300)}: not counted"
        )
    return (frozenset(pids) if tracked else None), tuple(notes)


def node_facts(machine: Machine) -> NodeFacts:
    """What holds for every rank here (the job report's per-node line)."""
    import socket

    host = os.environ.get(JOB_VARIABLES["host"]) or socket.gethostname()
    return NodeFacts(
        host=_sysfs.clean_line(host, 255),
        numa_balancing=machine.numa_balancing,
        cpuset_mems=machine.allowed.mems,
        mempolicy_permitted=_permitted(),
        kernel=machine.kernel_release,
    )


def check(
    pids: list[int],
    machine: Machine,
    *,
    own_env: Mapping[str, str] | None = None,
    deadline: float | None = None,
    named: bool = False,
    scan: Scan | None = None,
    verbose: bool = False,
    settings: Mapping[str, str] | None = None,
) -> CheckReport:
    """Check ``pids`` until ``deadline`` (a ``time.monotonic()`` value; reading one
    process's memory stops there too); ``named``: the pids were given by the user (a
    vanished one is a note and exit status 3); ``settings``: where the registry is."""
    results: list[ProcessCheck] = []
    vanished: list[int] = []
    skipped: list[int] = []
    notes: list[str] = list(scan.notes) if scan is not None else []
    for i, pid in enumerate(pids):
        if deadline is not None and time.monotonic() > deadline:
            skipped = pids[i:]
            break
        try:
            results.append(
                check_pid(pid, machine, environ=own_env, deadline=deadline, settings=settings)
            )
        except Vanished:
            vanished.append(pid)
    if vanished and named:
        notes.extend(f"no process {pid} (it exited, or is a zombie)" for pid in vanished)
    elif vanished:
        notes.append(f"{len(vanished)} rank(s) exited while being checked: left out")
    if skipped:
        notes.append(
            f"{len(skipped)} process(es) not reached before the deadline: "
            + ", ".join(str(p) for p in skipped[:20])
            + (" ..." if len(skipped) > 20 else "")
        )
    ignored = scan.ignored if scan is not None else {}
    if verbose and ignored:
        notes.append(
            "registry entries ignored: " + ", ".join(f"{n} {k}" for k, n in sorted(ignored.items()))
        )
    shared_nodes: dict[int, int] = {}
    for r in results:
        for n, c in r.shared_pages.nodes.items():
            shared_nodes[n] = shared_nodes.get(n, 0) + c
    return CheckReport(
        processes=tuple(results),
        ok=all(r.ok for r in results) and not (vanished and named),
        problems=tuple(f"pid {r.pid}: {p}" for r in results for p in r.problems),
        shared_pages=SharedPages(
            pages=sum(shared_nodes.values()), nodes=dict(sorted(shared_nodes.items())), how=""
        ),
        vanished=tuple(vanished),
        skipped=tuple(skipped),
        registry_ignored=dict(ignored),
        numa_balancing=machine.numa_balancing,
        notes=tuple(notes),
        node=node_facts(machine),
    )


# --- the job collector's record ----------------------------------------------------------------

COLLECTOR = "NUMABIND_COLLECTOR"  # in a collector's environment: never one of the ranks


def job_filter(job: str, own: Mapping[str, str]) -> Callable[[Mapping[str, str]], bool]:
    """Whether a process's initial environment makes it a rank of ``job`` on this node and
    not one of this collector's own step."""
    v = JOB_VARIABLES
    host = own.get(v["host"])
    step = own.get(v["step"]) if own.get(v["job"]) == job else None

    def keep(env: Mapping[str, str]) -> bool:
        if env.get(v["job"]) != job or COLLECTOR in env:
            return False
        if step is not None and env.get(v["step"]) == step:
            return False
        return host is None or env.get(v["host"]) == host

    return keep
