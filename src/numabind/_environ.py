"""What the environment says: the ``NUMABIND_*`` knobs (:class:`Config`) and who this
process is (its local rank: :func:`detect`).

Both are read once per entry, and both are input: every value is bounded and quoted with
``repr`` in messages (a newline or an escape sequence cannot forge a line), and no value
makes the work grow beyond what the machine's own sizes cost.

**Configuration.**  Every ``NUMABIND_*`` variable is one row of :data:`KNOBS`, read into
one :class:`Config`, with one vocabulary for true and false.  A bad value of a *binding*
knob raises :class:`~numabind.ConfigError` naming the variable, the value and what is
accepted (the hook then leaves the process unbound: a typo in ``NUMABIND_MODE`` must not
bind in a way nobody asked for).  A bad value of any other knob only changes what is said
or which optional part runs, so it becomes a warning in ``Config.warnings`` and the
default is used.

Two variables redirect where numabind reads and writes, and an interpreter does not take
them from its environment blindly (docs/security.rst):

* under ``python -I`` or ``-E`` (which promise to ignore the environment's redirections)
  ``NUMABIND_SYSROOT`` and ``NUMABIND_REGISTRY`` are ignored; the rank variables still
  bind, as the launchers intend;
* for euid 0, ``NUMABIND_SYSROOT`` is honoured only when every directory of the path is
  owned by root and not writable by group or others (a sticky directory such as /tmp
  counts as not writable: nobody else can replace root's entry in it), and
  ``NUMABIND_REGISTRY`` only when it names such a directory on a regular file system
  (not proc, sysfs, cgroup, devtmpfs or another kernel pseudo file system).

Otherwise the default applies and ``Config.warnings`` says why (one line, verbose or not:
a path set and not used looks like a plausible answer from the wrong machine).

**Who am I.**  Each launcher writes its own rank variables (the table
:data:`numabind._model.RANK_VARIABLES`; docs/launchers has them as measured).
LOCAL_RANK wins over the others: under ``srun -n1 torchrun`` every worker also inherits
the agent's SLURM_LOCALID=0, and only LOCAL_RANK tells the workers apart.  Launcher
processes (the torchrun agent, ``accelerate launch``, DeepSpeed's runner) are never
ranks, whatever they inherited: binding the agent would pin all of its workers.
"""

from __future__ import annotations

import os

import _numabind_base

from ._model import (
    BINDERS_MODES,
    MODE_NAMES,
    NIC_MODES,
    NIC_TRANSPORTS,
    NO_RESERVE,
    OMP_PLACES_VALUES,
    PRIORITY_ROLES,
    RANK_VARIABLES,
    RESERVE_SCOPES,
    SMT_LEVELS,
    SPILL_ANY,
    SPILL_CPU,
    USER_POLICIES,
    WORKER_PLACEMENTS,
    Record,
    Reserve,
    Spill,
)
from ._sysfs import parse_nodelist, redirect, short

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

    from ._errors import ConfigError

TRUE = _numabind_base.FLAG_TRUE
FALSE = _numabind_base.FLAG_FALSE
ENABLE_VALUES = ("auto", "force", "respect", "0", "off")
MAX_RESERVE = 4096  # cores: no node has more (x86_64 MAXSMP is 8192 CPUs in all)
MAX_THREADS = 1 << 16


class Knob(Record):
    """One ``NUMABIND_*`` variable: the :class:`Config` field it sets, what it accepts,
    its default, whether a bad value refuses to bind (``binding``) or is a warning, and
    what it does (docs/environment.rst and ``--help`` are checked against this)."""

    name: str
    field: str
    kind: (
        str  # "choice", "flag", "threads", "reserve", "spill", "devices", "transports", "rate", ...
    )
    default: str
    help: str
    values: tuple[str, ...] = ()
    binding: bool = False


KNOBS: tuple[Knob, ...] = (
    Knob(
        name="NUMABIND",
        field="enable",
        kind="choice",
        values=ENABLE_VALUES,
        default="auto",
        binding=True,
        help="auto: bind, replacing launchers' default masks; respect: keep any mask "
        "already set; force: apply the plan exactly; 0/off: numabind does nothing",
    ),
    Knob(
        name="NUMABIND_MODE",
        field="mode",
        kind="choice",
        values=MODE_NAMES,
        default="node",
        binding=True,
        help="which of the GPU's node's CPUs a rank gets (node, socket, exclusive, core-complex)",
    ),
    Knob(
        name="NUMABIND_MEMORY",
        field="memory",
        kind="choice",
        values=USER_POLICIES,
        default="preferred",
        binding=True,
        help="the memory policy a rank gets",
    ),
    Knob(
        name="NUMABIND_SPILL",
        field="spill",
        kind="spill",
        default="cpu",
        binding=True,
        help="where a rank's memory goes once its nodes are full: cpu (the other CPU-memory "
        "nodes, nearest first, then the allocation fails), any (the kernel's fallback: any "
        "node, a GPU's memory and CXL included), or cpu,N / N: nodes named besides or "
        "instead of CPU memory",
    ),
    Knob(
        name="NUMABIND_RESERVE",
        field="reserve",
        kind="reserve",
        default="0",
        binding=True,
        help="n, n/node or n/rank: keep n physical cores of each node (or n per local rank "
        "on it) out of every rank's compute set, for the system and helper processes",
    ),
    Knob(
        name="NUMABIND_SMT",
        field="smt",
        kind="choice",
        values=SMT_LEVELS,
        default="all",
        binding=True,
        help="all: every hardware thread of a rank's cores; 1: one per core (the thread "
        "budget follows)",
    ),
    Knob(
        name="NUMABIND_PRIORITY",
        field="priority",
        kind="choice",
        values=PRIORITY_ROLES,
        default="off",
        binding=True,
        help="rank: each rank's compute set is its fair share of its node's priority cores "
        "(the fastest kind the CPU files tell apart); main: only the thread that launches GPU "
        "work goes on one, and what it starts gets the rank's whole set; off (default)",
    ),
    Knob(
        name="NUMABIND_DEVICES",
        field="devices",
        kind="devices",
        default="",
        binding=True,
        help="all, or a list of devices (indices, PCI addresses or UUIDs): bind a process that "
        "drives several GPUs to the union of their nodes; each thread then takes its own "
        "device's share (numabind.bind_thread, torch.cuda.set_device with numabind.torch)",
    ),
    Knob(
        name="NUMABIND_NIC",
        field="nic",
        kind="transports",
        values=NIC_TRANSPORTS,
        default="",
        help="a list of transports (ucx, nvshmem, nixl, uccl, mooncake, nccl, vllm): tell "
        "each the RDMA adapter nearest to the rank's GPU (UCX_NET_DEVICES, NVSHMEM_HCA_LIST, "
        "...) before any import; vllm: vLLM's GPU-to-NIC map (VLLM_GPU_NIC_PCIE_MAPPING, "
        "VLLM_NIC_SELECTION_VARS), from which vLLM sets the others' variables per worker; "
        "a value already set is kept",
    ),
    Knob(
        name="NUMABIND_NIC_MODE",
        field="nic_mode",
        kind="choice",
        values=NIC_MODES,
        default="nearest",
        help="nearest: each GPU's nearest adapters, shared evenly among the GPUs that tie; "
        "exclusive: never one adapter for two GPUs while another is idle (farther if need be)",
    ),
    Knob(
        name="NUMABIND_NIC_MIN_RATE",
        field="nic_min_rate",
        kind="rate",
        default="auto",
        help="ports slower than this many Gb/s are never chosen (0: any); auto: half the "
        "fastest port of the machine",
    ),
    Knob(
        name="NUMABIND_STRICT",
        field="strict",
        kind="flag",
        default="0",
        binding=True,
        help="1: a binding that fails exits the rank with status 1 before user code (the "
        "API raises BindingError); a benign skip (one NUMA node) is not a failure",
    ),
    Knob(
        name="NUMABIND_THREADS",
        field="threads",
        kind="threads",
        default="off",
        binding=True,
        help="auto or N: size OpenMP/BLAS thread pools to the rank's cores (or N); the "
        "user's own values are kept",
    ),
    Knob(
        name="NUMABIND_OMP_PLACES",
        field="omp_places",
        kind="choice",
        values=OMP_PLACES_VALUES,
        default="off",
        binding=True,
        help="cores or threads: set OMP_PLACES to it and OMP_PROC_BIND=close where neither "
        "is set, and keep the main thread (and what it starts) on the rank's CPUs",
    ),
    Knob(
        name="NUMABIND_WORKERS",
        field="workers",
        kind="choice",
        values=WORKER_PLACEMENTS,
        default="share",
        binding=True,
        help="with numabind.torch, where DataLoader workers run: share the rank's CPUs, "
        "spread (one disjoint core set each) or reserved (the rank's reserved cores)",
    ),
    Knob(
        name="NUMABIND_BINDERS",
        field="binders",
        kind="choice",
        values=BINDERS_MODES,
        default="off",
        help="keep: where numabind binds a rank, set AMD_CPU_AFFINITY=0 and "
        "TLLM_NUMA_AWARE_WORKER_AFFINITY=0 so that HIP and TensorRT-LLM do not re-pin it "
        "(a value already set is kept; NCCL_IGNORE_CPU_AFFINITY is never set); off (default)",
    ),
    Knob(
        name="NUMABIND_VERBOSE",
        field="verbose",
        kind="flag",
        default="0",
        help="1: print the binding of every rank (failures are always printed)",
    ),
    Knob(
        name="NUMABIND_DEBUG",
        field="debug",
        kind="flag",
        default="0",
        help="1: also say numabind's own notes, for a bug report: where a rank's machine came "
        "from (cache or sysfs), why the warm start handed over, and the kernel call and thread "
        "behind a refusal",
    ),
    Knob(
        name="NUMABIND_GUARD",
        field="guard",
        kind="flag",
        default="1",
        help="0: do not put back masks that imports or init_process_group moved",
    ),
    Knob(
        name="NUMABIND_TORCH",
        field="torch",
        kind="flag",
        default="0",
        help="1: hook torch's process starts and device selection when torch is imported",
    ),
    Knob(
        name="NUMABIND_TORCH_SET_DEVICE",
        field="torch_set_device",
        kind="flag",
        default="1",
        help="0: with NUMABIND_TORCH, do not bind on torch.cuda.set_device and friends",
    ),
    Knob(
        name="NUMABIND_RAY",
        field="ray",
        kind="flag",
        default="0",
        help="1: bind Ray workers when Ray assigns them GPUs",
    ),
    Knob(
        name="NUMABIND_REPORT",
        field="report",
        kind="flag",
        default="0",
        help="1: after torch.distributed.init_process_group every rank posts its check "
        "record to the job's store and one rank prints the job report (numabind.report())",
    ),
    Knob(
        name="NUMABIND_REPORT_RANK",
        field="report_rank",
        kind="raw",
        default="0",
        help="the global rank that prints the job report (NUMABIND_REPORT)",
    ),
    Knob(
        name="NUMABIND_REPORT_WAIT",
        field="report_wait",
        kind="raw",
        default="60",
        help="seconds the reporting rank waits for every rank's record before it prints, "
        "naming the ranks that did not post (NUMABIND_REPORT)",
    ),
    Knob(
        name="NUMABIND_CACHE",
        field="cache",
        kind="flag",
        default="1",
        help="0: read the machine from sysfs in every rank instead of the per-node cache "
        "(one reading per node and boot, shared by the node's ranks)",
    ),
    Knob(
        name="NUMABIND_SYSROOT",
        field="sysroot",
        kind="path",
        default="/",
        help="read the machine from this directory laid out like / (tests, diagnosis); "
        "ignored under python -I/-E, and for root unless root owns the whole path",
    ),
    Knob(
        name="NUMABIND_REGISTRY",
        field="registry",
        kind="path",
        default="/dev/shm",
        help="the base directory of the per-user registry numabind check --all reads; "
        "ignored under python -I/-E, and for root unless a root-owned directory on a "
        "regular file system",
    ),
    Knob(
        name="NUMABIND_NIC_SET",
        field="nic_set",
        kind="raw",
        default="",
        help="set by numabind: the NIC variables it set itself (a child rank replaces them "
        "with its own adapter's; a value anyone else set is kept)",
    ),
    Knob(
        name="NUMABIND_STATE",
        field="state",
        kind="raw",
        default="",
        help="set by numabind: the binding a process passed to its children",
    ),
    Knob(
        name="NUMABIND_MAIN_CPUS",
        field="main_cpus",
        kind="raw",
        default="",
        help="set by numabind (NUMABIND_PRIORITY=main): the pinned thread's priority core and "
        "the rank's whole set, so that a child started from that thread takes the whole set",
    ),
)
BY_NAME = {k.name: k for k in KNOBS}
# the variables that make the startup hook look further besides a rank variable (their home
# is the start path's: the hook tests them before numabind is loaded)
SWITCHES = _numabind_base.SWITCHES


def _invalid(message: str) -> ConfigError:
    # numabind._errors is imported only when a value is bad: the hook's path stays short
    from ._errors import ConfigError

    return ConfigError(message)


def parse_flag(name: str, raw: str | None, default: bool) -> bool:
    """One vocabulary for true and false, everywhere: 1/true/yes/on, 0/false/no/off."""
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise _invalid(f"{name}={short(raw)} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def parse_threads(raw: str | None, name: str = "NUMABIND_THREADS") -> str:
    """``off`` (default), ``auto`` or a positive integer, as a string."""
    if raw is None or raw.strip() == "":
        return "off"
    value = raw.strip().lower()
    if value == "auto":
        return "auto"
    if value in FALSE:
        return "off"
    if value.isascii() and value.isdigit() and len(value) < 6 and 0 < int(value) < MAX_THREADS:
        return str(int(value))
    raise _invalid(f"{name}={short(raw)} is not off, auto or a thread count below {MAX_THREADS}")


def parse_reserve(raw: str | None, name: str = "NUMABIND_RESERVE") -> Reserve:
    """``n``, ``n/node`` or ``n/rank`` (n physical cores; 0, empty, ``off`` or ``none``
    for none) as a :class:`~numabind._model.Reserve`: the one parser of a reservation."""
    if raw is None:
        return NO_RESERVE
    value = raw.strip().lower()
    if value in ("", *FALSE, "none"):
        return NO_RESERVE
    count, sep, scope = value.partition("/")
    scope = scope.strip() if sep else "node"
    count = count.strip()
    if (
        scope in RESERVE_SCOPES
        and count.isascii()
        and count.isdigit()
        and len(count) < 6
        and int(count) <= MAX_RESERVE
    ):
        return Reserve(count=int(count), scope=scope) if int(count) else NO_RESERVE
    raise _invalid(
        f"{name}={short(raw)} is not n, n/node or n/rank (n physical cores, 0 to {MAX_RESERVE})"
    )


def parse_spill(raw: str | None, name: str = "NUMABIND_SPILL") -> Spill:
    """``cpu`` (or empty: the default), ``any``, or comma-separated words each ``cpu`` or
    a node number or range (``cpu,4``, ``2-3``), as a :class:`~numabind._model.Spill`: the
    one parser of the setting.  Whether the named nodes exist is the planner's question."""
    if raw is None or not raw.strip():
        return SPILL_CPU
    value = raw.strip().lower()
    if value == "any":
        return SPILL_ANY
    words = [w.strip() for w in value.split(",", 65)]
    cpu = "cpu" in words
    nodes = ",".join(w for w in words if w != "cpu")
    try:
        named = parse_nodelist(nodes) if nodes else frozenset()
    except ValueError:
        named = None
    if len(value) > 4096 or len(words) > 64 or named is None or (not cpu and not named):
        raise _invalid(
            f"{name}={short(raw)} is not cpu, any, or a comma list of cpu and node numbers "
            "(cpu,4; 2-3)"
        )
    return Spill(cpu=cpu, nodes=named)


MAX_DEVICE_TEXT = 4096  # a list of 64 UUIDs with their prefixes


def parse_devices(raw: str | None, name: str = "NUMABIND_DEVICES") -> str:
    """``""`` (off), ``all``, or a comma list of device tokens (indices, PCI addresses,
    UUIDs: resolved against the machine later), stripped and bounded, as one string."""
    if raw is None or not raw.strip():
        return ""
    value = raw.strip()
    if value.lower() == "all":
        return "all"
    tokens = [t.strip() for t in value.split(",", 65)]
    if (
        len(value) > MAX_DEVICE_TEXT
        or len(tokens) > 64
        or not all(t and len(t) <= 128 and t.isascii() and t.isprintable() for t in tokens)
    ):
        raise _invalid(
            f"{name}={short(raw)} is not all or a list of up to 64 devices (indices, PCI "
            "addresses or UUIDs, comma-separated)"
        )
    return ",".join(tokens)


def parse_transports(raw: str | None, name: str = "NUMABIND_NIC") -> str:
    """``""`` (off) or the transports named, in the table's order, comma-joined."""
    if raw is None or raw.strip().lower() in ("", *FALSE, "none"):
        return ""
    words = {w.strip().lower() for w in raw.split(",", 16)}
    words.discard("")
    unknown = sorted(w for w in words if w not in NIC_TRANSPORTS)
    if unknown or len(raw) > 200:
        raise _invalid(
            f"{name}={short(raw)} is not a list of {', '.join(NIC_TRANSPORTS)} ("
            + (f"{', '.join(map(short, unknown))}: not one of them)" if unknown else "too long)")
        )
    return ",".join(t for t in NIC_TRANSPORTS if t in words)


def parse_rate(raw: str | None, name: str = "NUMABIND_NIC_MIN_RATE") -> str:
    """``auto`` or a rate in Gb/s (``0``: no minimum), as a canonical string."""
    if raw is None or raw.strip().lower() in ("", "auto"):
        return "auto"
    value = raw.strip().lower().removesuffix("gb/s").removesuffix("g").strip()
    if len(value) <= 10 and value.replace(".", "", 1).isdigit() and float(value) <= 100_000:
        return f"{float(value):g}"
    raise _invalid(f"{name}={short(raw)} is not auto or a rate in Gb/s (0 to 100000)")


def _choice(knob: Knob, raw: str | None) -> str:
    if raw is None or raw.strip() == "":
        return knob.default
    value = raw.strip().lower()
    if value not in knob.values:
        raise _invalid(f"{knob.name}={short(raw)} is not one of {', '.join(knob.values)}")
    return value


def path_setting(knob: Knob, raw: str | None, own: bool) -> tuple[str, list[str]]:
    """A path knob's value under the redirection rules, and the line that says it was set
    and is not used (said like a typo, verbose or not: what the default place gives looks
    plausible, and nothing else gives it away).  ``doctor`` reads it from here too."""
    why: list[str] = []
    value = _redirect(knob, raw, own, why)
    return value, [f"{n}; using {knob.default}" for n in why]


def _redirect(knob: Knob, raw: str | None, own: bool, notes: list[str]) -> str:
    return redirect(
        knob.name, raw, knob.default, own=own, registry=knob.field == "registry", notes=notes
    )


class Config(Record):
    """The ``NUMABIND_*`` settings of one entry, read once (see :data:`KNOBS`).

    ``warnings`` are what was set and is not used: bad values of non-binding knobs and
    redirections not taken (each said once, on its own line, verbose or not); ``notes``
    are smaller findings (said in verbose mode; none at present)."""

    enable: str = "auto"
    mode: str = "node"
    memory: str = "preferred"
    spill: Spill = SPILL_CPU
    reserve: Reserve = NO_RESERVE
    smt: str = "all"
    priority: str = "off"  # NUMABIND_PRIORITY: off, rank, main
    devices: str = ""  # "", "all" or a comma list of device tokens
    nic: str = ""  # "" or the transports NUMABIND_NIC names, comma-joined in table order
    nic_mode: str = "nearest"
    nic_min_rate: str = "auto"
    strict: bool = False
    threads: str = "off"  # "off", "auto" or a decimal count
    omp_places: str = "off"
    workers: str = "share"
    binders: str = "off"  # NUMABIND_BINDERS: off, keep
    verbose: bool = False
    debug: bool = False
    guard: bool = True
    torch: bool = False
    torch_set_device: bool = True
    ray: bool = False
    report: bool = False
    report_rank: str = "0"
    report_wait: str = "60"
    cache: bool = True
    sysroot: str = "/"
    registry: str = "/dev/shm"
    state: str = ""
    main_cpus: str = ""
    nic_set: str = ""
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def disabled(self) -> bool:
        return self.enable in ("0", "off")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Read every knob from ``environ`` (default ``os.environ``, whose redirections
        follow the rules in the module docstring).  Raises :class:`ConfigError` for a bad
        binding knob."""
        env = os.environ if environ is None else environ
        own = env is os.environ
        values: dict[str, Any] = {}
        warnings: list[str] = []
        notes: list[str] = []
        for knob in KNOBS:
            raw = env.get(knob.name)
            try:
                if knob.kind == "choice":
                    value: object = _choice(knob, raw)
                elif knob.kind == "flag":
                    value = parse_flag(knob.name, raw, knob.default in TRUE)
                elif knob.kind == "threads":
                    value = parse_threads(raw, knob.name)
                elif knob.kind == "reserve":
                    value = parse_reserve(raw, knob.name)
                elif knob.kind == "spill":
                    value = parse_spill(raw, knob.name)
                elif knob.kind == "devices":
                    value = parse_devices(raw, knob.name)
                elif knob.kind == "transports":
                    value = parse_transports(raw, knob.name)
                elif knob.kind == "rate":
                    value = parse_rate(raw, knob.name)
                elif knob.kind == "path":
                    value, unused = path_setting(knob, raw, own)
                    warnings += unused
                else:
                    value = raw or knob.default
            except ValueError as err:  # a ConfigError: the parsers raise nothing else
                if knob.binding:
                    raise
                warnings.append(f"{err}; using {knob.default or 'none'}")
                value = knob.default in TRUE if knob.kind == "flag" else knob.default
            values[knob.field] = value
        return cls(**values, warnings=tuple(warnings), notes=tuple(notes))


def debugging(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``NUMABIND_DEBUG`` asks for numabind's own notes (a bad value: no; the
    hook and the commands say the typo)."""
    raw = (os.environ if environ is None else environ).get("NUMABIND_DEBUG")
    return raw is not None and raw.strip().lower() in TRUE


def registry_base(environ: Mapping[str, str]) -> str:
    """The registry's base directory (``NUMABIND_REGISTRY`` under the rules above)."""
    knob = BY_NAME["NUMABIND_REGISTRY"]
    return _redirect(knob, environ.get(knob.name), environ is os.environ, [])


def sysroot(environ: Mapping[str, str]) -> str:
    """Where the machine is read from (``NUMABIND_SYSROOT`` under the rules above)."""
    knob = BY_NAME["NUMABIND_SYSROOT"]
    return _redirect(knob, environ.get(knob.name), environ is os.environ, [])


# --- who am I ----------------------------------------------------------------------------------

# Variables that make the startup hook look further: a rank variable, or a request to
# hook a framework's own process starts (the .pth line is this list rendered: a test
# renders it from _numabind_base and compares).
TRIGGER_VARIABLES = _numabind_base.TRIGGERS

# No machine has a million local ranks: a value beyond this is a typo or an attack, and
# no work numabind does may grow with it.
MAX_LOCAL = 1 << 20
_TEXT_CAP = 4096  # longest environment value parsed (a Slurm task list of 1000 nodes)

_LAUNCHER_MODULES = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torch.distributed.launch",
    "deepspeed.launcher.launch": "deepspeed launcher",
    "deepspeed.launcher.runner": "deepspeed",
    "accelerate.commands.launch": "accelerate launch",
}
_LAUNCHER_SCRIPTS = {"torchrun": "torchrun", "deepspeed": "deepspeed", "ds": "deepspeed"}


class RankInfo(Record):
    """The local rank as found in the environment.  ``problem`` is set when the rank
    variable was present but unusable: the plan then skips with that message instead of
    guessing.  ``notes`` are smaller findings (a garbled size, treated as unknown)."""

    local_rank: int | None = None
    local_world_size: int | None = None
    rank_source: str | None = None
    size_source: str | None = None
    launcher: str | None = None
    problem: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def is_rank(self) -> bool:
        return self.local_rank is not None and self.launcher is None and self.problem is None


def parse_count(name: str, raw: str) -> tuple[int | None, str | None]:
    """A local rank or size: ASCII digits below :data:`MAX_LOCAL`, else (None, why).

    ``isdigit`` alone would accept '²' and '٣' (int() then fails), and int() of a
    5000-digit value raises; both get this message instead."""
    value = raw.strip()
    if not (value and value.isascii() and value.isdigit()):
        return None, f"{name}={short(raw)} is not a non-negative integer"
    if len(value) > 7 or int(value) >= MAX_LOCAL:
        return None, f"{name}={short(raw)} is beyond numabind's ceiling of {MAX_LOCAL} local ranks"
    return int(value), None


def launcher_of(argv: Sequence[str] | None) -> str | None:
    """Name the launcher when ``argv`` (``sys.orig_argv``: the interpreter's own command
    line) starts one, else None."""
    if not argv:
        return None
    args = list(argv[1:])
    i = 0
    while i < len(args):
        a = args[i]
        if a == "-m" and i + 1 < len(args):
            return _LAUNCHER_MODULES.get(args[i + 1])
        if a.startswith("-m") and len(a) > 2:
            return _LAUNCHER_MODULES.get(a[2:])
        if a == "-c" or a.startswith("-c"):
            return None
        if a in ("-W", "-X"):
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        base = a.rsplit("/", 1)[-1]
        if base.endswith(".py"):
            base = base[:-3]
        if base in _LAUNCHER_SCRIPTS:
            return _LAUNCHER_SCRIPTS[base]
        if base == "accelerate" and "launch" in args[i + 1 :]:
            return "accelerate launch"
        return None
    return None


def _slurm_tasks_on_node(environ: Mapping[str, str]) -> tuple[int | None, str | None]:
    """Tasks of this step on this node from SLURM_STEP_TASKS_PER_NODE ("2(x3),1") and
    SLURM_NODEID, without expanding the repetitions: '1(x1000000000)' costs one step."""
    node, _ = parse_count("SLURM_NODEID", environ.get("SLURM_NODEID", "0"))
    node = node or 0
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        text = environ.get(var)
        if not text or len(text) > _TEXT_CAP:
            continue
        seen = 0
        for part in text.split(","):
            count_text, _, rep = part.partition("(x")
            count, bad = parse_count(var, count_text)
            repeat, bad_rep = parse_count(var, rep.rstrip(")")) if rep else (1, None)
            if bad or bad_rep or count is None or repeat is None:
                break
            seen += repeat
            if node < seen:
                return count, var
    return None, None


def detect(environ: Mapping[str, str], argv: Sequence[str] | None = None) -> RankInfo:
    """Find this process's local rank.  Never raises: a garbled value becomes ``problem``
    (the rank variable) or a note (a size variable, then treated as unknown)."""
    launcher = launcher_of(argv)
    for var in RANK_VARIABLES:
        name, size_names = var.name, var.sizes
        raw = environ.get(name)
        if raw is None:
            continue
        if var.requires is not None and var.requires not in environ:
            continue  # SLURM_LOCALID in an sbatch/salloc shell: not a task of a job step
        rank, why = parse_count(name, raw)
        if rank is None:
            return RankInfo(
                rank_source=name,
                launcher=launcher,
                problem=f"{why}, so this process's local rank is unknown; numabind left it unbound",
            )
        notes: list[str] = []
        size: int | None = None
        size_source: str | None = None
        if name == "SLURM_LOCALID":
            size, size_source = _slurm_tasks_on_node(environ)
        for size_name in size_names:
            value = environ.get(size_name)
            if value is None:
                continue
            parsed, why = parse_count(size_name, value)
            if parsed is not None and parsed > 0:
                size, size_source = parsed, size_name
                break
            notes.append(f"{why or f'{size_name}=0 is not a size'}: local world size unknown")
        if size is not None and rank >= size:
            # Keep the rank (it still picks a device) but do not trust the size.
            notes.append(
                f"{name}={rank} is not below {size_source}={size}: local world size unknown"
            )
            size, size_source = None, None
        return RankInfo(
            local_rank=rank,
            local_world_size=size,
            rank_source=name,
            size_source=size_source,
            launcher=launcher,
            notes=tuple(notes),
        )
    return RankInfo(launcher=launcher)
