"""The other binders: the libraries and schedulers that move a rank's CPU mask themselves,
one table (:data:`BINDER_TABLE`) of who they are, how numabind tells that one is active in
a rank, what it will do to numabind's binding, the fix, and where that is documented.

How a row is detected (``detect``):

* ``env``: a variable in the rank's environment with one of ``values`` (its initial
  environment, ``/proc/PID/environ``, for ``check --pid``; the shell's for ``doctor``).
  A library that reads a variable says by it that it will re-pin, before it has run.
* ``thread``: a word in the name of a thread whose mask moved (``comm``, case-insensitive;
  the first row whose word is in the name wins).  ``vendor`` narrows a row to ranks of
  one accelerator vendor (RCCL's threads carry NCCL's names).
* ``sysfs``: a file of the machine (read under ``NUMABIND_SYSROOT`` by the machine's
  source: ``Machine.sched_ext``): an active sched_ext scheduler places tasks in the
  kernel, whatever their masks say.
* ``mask``: nothing is left but a CPU mask the rank started with (an exec wrapper:
  torchrun ``--numa-binding`` and vLLM ``--numa-bind`` exec the rank through numactl); the
  registry entry records that mask and whether the keep/replace rule kept it.

``keep`` is the value ``NUMABIND_BINDERS=keep`` writes into an ``env`` row's variable where
numabind binds a rank and the variable is unset (a value the user set is never
overwritten): it turns that library's own pinning off.  A row without one is named, never
set: ``NCCL_IGNORE_CPU_AFFINITY=1`` makes NCCL ignore the process's mask, which *is*
numabind's binding, so setting it would undo what it keeps.

This module is imported by ``check``, ``doctor``, a second ``apply()`` that finds threads
moved, and the applier only under ``NUMABIND_BINDERS``: never on the plain hook's path.
"""

from __future__ import annotations

from ._environ import TRUE
from ._model import BINDERS_MODES, Record
from ._sources import SCHED_EXT_STATE
from ._sysfs import clean_line

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping


class Binder(Record):
    """One row of :data:`BINDER_TABLE` (the module docstring says what each field means)."""

    name: str  # short id, what check --json lists
    label: str  # who, in a sentence: "HIP (ROCm)"
    detect: str  # "env", "thread", "sysfs" or "mask"
    key: str  # the variable, the thread-name word, or the sysfs file
    does: str  # what it will do to numabind's binding
    fix: str
    source: str
    values: tuple[str, ...] = ()  # env: the values that make it active
    vendor: str = ""  # thread: only for ranks of this accelerator vendor ("" any)
    keep: str = ""  # env: what NUMABIND_BINDERS=keep sets ("" never set)


_NCCL_THREADS = (
    "NCCL pins its own proxy and service threads to the GPU's local CPUs; up to 2.29 it "
    "left the thread that called ncclCommInitRank there too (numabind's guard puts that "
    "one back), from 2.30 it restores the caller's mask, numabind's binding"
)
BINDER_TABLE: tuple[Binder, ...] = (
    Binder(
        name="hip",
        label="HIP (ROCm)",
        detect="env",
        key="AMD_CPU_AFFINITY",
        values=TRUE,
        keep="0",
        does="the HIP runtime narrows the main thread of every process that calls into "
        "HIP (hipGetDeviceCount() is enough) to the CPUs of GPU 0's nearest node, "
        "replacing numabind's mask on any other GPU's rank",
        fix="AMD_CPU_AFFINITY=0 (or unset: the default again since the revert), or "
        "NUMABIND_BINDERS=keep",
        source="ROCm/rocm-systems#6134 (default on), ROCm/rocm-systems#6712 (reverted, 2026-06-02)",
    ),
    Binder(
        name="trtllm",
        label="TensorRT-LLM",
        detect="env",
        key="TLLM_NUMA_AWARE_WORKER_AFFINITY",
        values=("1",),
        keep="0",
        does="TensorRT-LLM sets its workers' affinity to its own NUMA choice, process-wide "
        "and never restored (every thread since #18701), over numabind's binding; unset "
        "means auto, which does the same where it detects NUMA",
        fix="TLLM_NUMA_AWARE_WORKER_AFFINITY=0 (any value but 1 disables it), as srt-slurm "
        "does with its own binding, or NUMABIND_BINDERS=keep",
        source="TensorRT-LLM tensorrt_llm envs (TLLM_NUMA_AWARE_WORKER_AFFINITY: unset=auto, "
        "'1'=force enable, any other value=disable); NVIDIA/TensorRT-LLM#18847; srt-slurm "
        "numa_cpu_bind",
    ),
    Binder(
        name="nccl-ignore",
        label="NCCL",
        detect="env",
        key="NCCL_IGNORE_CPU_AFFINITY",
        values=("1",),
        does="NCCL ignores the process's CPU mask (numabind's binding) and pins its threads "
        "to the GPU's whole local CPU set only, over the rank's share of it",
        fix="unset NCCL_IGNORE_CPU_AFFINITY (numabind's mask already lies on the GPU's node); "
        "numabind never sets it",
        source="NCCL user guide, Environment Variables (NCCL_IGNORE_CPU_AFFINITY)",
    ),
    Binder(
        name="sched_ext",
        label="a sched_ext scheduler",
        detect="sysfs",
        key=SCHED_EXT_STATE,
        values=("enabled",),
        does="the kernel places tasks by the BPF scheduler's own policy, whatever their masks "
        "allow (scx_cosmos --gpu keeps a GPU's tasks on its node itself); masks and check's "
        "view of them say less than where threads run",
        fix="nothing to undo where it keeps the GPU's node (numabind's node too); to judge "
        "placement by masks alone, stop the scheduler (scx_* exits, the kernel falls back)",
        source="sched-ext/scx#3377 (scx_cosmos --gpu); kernel Documentation/scheduler/"
        "sched-ext.rst (/sys/kernel/sched_ext/state, root/ops)",
    ),
    Binder(
        name="numactl",
        label="an exec wrapper (numactl: torchrun --numa-binding, vllm --numa-bind)",
        detect="mask",
        key="start_mask",
        does="the rank was exec'd with a CPU mask and nothing else to tell who set it; "
        "numabind's keep/replace rule keeps it where it lies inside the GPU's node and "
        "replaces it otherwise",
        fix="drop the wrapper's option and let numabind bind, or NUMABIND=respect to keep "
        "any such mask",
        source="pytorch torch/numa/binding.py (numactl wrap); vLLM --numa-bind",
    ),
    # by thread name: who moved a thread whose mask changed since numabind bound it
    # (TensorRT-LLM#18848: a second configure_cpu_affinity() put every pinned thread back
    # on all CPUs; UCCL's proxies pin their own threads, uccl#1030)
    Binder(
        name="trtllm-thread",
        label="TensorRT-LLM",
        detect="thread",
        key="trtllm",
        does="TensorRT-LLM re-pins its threads (a second configure_cpu_affinity() put every "
        "pinned thread back on all CPUs)",
        fix="TLLM_NUMA_AWARE_WORKER_AFFINITY=0, or NUMABIND_BINDERS=keep",
        source="NVIDIA/TensorRT-LLM#18848",
    ),
    Binder(
        name="trtllm-thread",
        label="TensorRT-LLM",
        detect="thread",
        key="tensorrt",
        does="TensorRT-LLM re-pins its threads",
        fix="TLLM_NUMA_AWARE_WORKER_AFFINITY=0, or NUMABIND_BINDERS=keep",
        source="NVIDIA/TensorRT-LLM#18848",
    ),
    Binder(
        name="uccl",
        label="UCCL",
        detect="thread",
        key="uccl",
        does="UCCL's proxies pin their own threads",
        fix="none needed where they stay on the GPU's node",
        source="uccl-project/uccl#1030",
    ),
    Binder(
        name="rccl",
        label="RCCL",
        detect="thread",
        key="nccl",
        vendor="amd",
        does="RCCL re-applies the GPU-local mask after ncclCommInitRank on purpose (restoring "
        "the caller's costs 5-6% in hipHostMalloc/hipHostFree): the calling thread keeps "
        "the GPU's whole local CPU set, not numabind's share",
        fix="numabind's guard puts the calling thread back after init_process_group "
        "(NUMABIND_GUARD=1, the default); NUMABIND_GUARD=0 keeps RCCL's mask",
        source="ROCm/rocm-systems#9404 (kept mask), #10057",
    ),
    Binder(
        name="nccl",
        label="NCCL",
        detect="thread",
        key="nccl",
        does=_NCCL_THREADS,
        fix="none for its own threads; numabind's guard puts the calling thread back",
        source="NVIDIA/nccl#2033",
    ),
    Binder(
        name="openmp",
        label="an OpenMP runtime",
        detect="thread",
        key="omp",
        does="OMP_PROC_BIND/OMP_PLACES bind the importing thread to the first place",
        fix="NUMABIND_OMP_PLACES=cores (places inside the rank's CPUs)",
        source="pytorch#101850",
    ),
    Binder(
        name="openmp",
        label="an OpenMP runtime",
        detect="thread",
        key="gomp",
        does="OMP_PROC_BIND/OMP_PLACES bind the importing thread to the first place",
        fix="NUMABIND_OMP_PLACES=cores (places inside the rank's CPUs)",
        source="pytorch#101850",
    ),
    Binder(
        name="openblas",
        label="OpenBLAS",
        detect="thread",
        key="openblas",
        does="OpenBLAS pins its threads",
        fix="NUMABIND_THREADS=auto, or OPENBLAS_MAIN_FREE=1",
        source="OpenBLAS USAGE.md (NO_AFFINITY)",
    ),
)
__all__ = ["BINDERS_MODES", "BINDER_TABLE"]
MAX_VALUE = 64  # longest value compared (a longer one is no value a library documents)


def binder_of(name: str, vendor: str = "") -> str | None:
    """Who a thread's own name says moved it (the ``thread`` rows), if any."""
    row = thread_binder(name, vendor)
    return row.label if row is not None else None


def thread_binder(name: str, vendor: str = "") -> Binder | None:
    """The ``thread`` row a thread's name matches (``vendor``: the rank's accelerator's)."""
    low = name.lower()
    return next(
        (
            b
            for b in BINDER_TABLE
            if b.detect == "thread" and b.key in low and b.vendor in ("", vendor)
        ),
        None,
    )


def env_binders(environ: Mapping[str, str]) -> list[tuple[Binder, str]]:
    """The ``env`` rows active in ``environ``, each with the value found."""
    out = []
    for b in BINDER_TABLE:
        raw = environ.get(b.key) if b.detect == "env" else None
        if raw is not None and len(raw) <= MAX_VALUE and raw.strip().lower() in b.values:
            out.append((b, raw.strip()))
    return out


def say(b: Binder, what: str) -> str:
    """One line: ``AMD_CPU_AFFINITY=1 (HIP (ROCm)): it will ...; fix: ...; source``."""
    return f"{what} ({b.label}): {b.does}; fix: {b.fix} [{b.source}]"


def env_lines(environ: Mapping[str, str]) -> list[str]:
    """What :func:`say` says of each ``env`` row active in ``environ``."""
    return [say(b, f"{b.key}={value}") for b, value in env_binders(environ)]


def sched_ext_line(name: str) -> str:
    """What :func:`say` says of an active sched_ext scheduler."""
    return say(BINDER_TABLE_BY_NAME["sched_ext"], f"sched_ext scheduler {name} active")


def mask_line(start: str, action: str, now: str) -> str:
    """What the ``mask`` row says of a rank that started with ``start`` (a cpulist)."""
    b = BINDER_TABLE_BY_NAME["numactl"]
    if action == "kept":
        verdict = f"numabind's keep/replace rule kept it (inside the GPU's node): CPUs {now}"
    else:
        verdict = f"numabind's keep/replace rule replaced it with CPUs {now}"
    return say(b, f"it started with CPU mask {start}, {verdict}")


class KeepResult(Record):
    """What :func:`keep_env` did: the variables it set, those it found set and kept."""

    set: tuple[tuple[str, str], ...] = ()
    kept: tuple[tuple[str, str], ...] = ()

    def notes(self) -> list[str]:
        out = []
        if self.set:
            out.append("NUMABIND_BINDERS: set " + ", ".join(f"{k}={v}" for k, v in self.set))
        if self.kept:
            shown = ", ".join(f"{k}={clean_line(v, 40)!r}" for k, v in self.kept)
            out.append(f"NUMABIND_BINDERS: left as set: {shown}")
        return out


def keep_env(environ: MutableMapping[str, str]) -> KeepResult:
    """``NUMABIND_BINDERS=keep`` for a rank numabind bound: each ``env`` row with a
    ``keep`` value gets it where its variable is unset; a value already there (the
    user's, the launcher's) is never overwritten."""
    done: list[tuple[str, str]] = []
    kept: list[tuple[str, str]] = []
    for b in BINDER_TABLE:
        if b.detect != "env" or not b.keep:
            continue
        have = environ.get(b.key)
        if have is None:
            environ[b.key] = b.keep
            done.append((b.key, b.keep))
        else:
            kept.append((b.key, have))
    return KeepResult(set=tuple(done), kept=tuple(kept))


BINDER_TABLE_BY_NAME = {b.name: b for b in BINDER_TABLE}
