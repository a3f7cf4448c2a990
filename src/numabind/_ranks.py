"""Who am I: this process's local rank and local world size, and where they came from.

Each launcher writes its own variables (docs/launchers lists them, as measured with the
real launchers).  LOCAL_RANK wins over the others: under ``srun -n1 torchrun`` every
worker also inherits the agent's SLURM_LOCALID=0, and only LOCAL_RANK tells the workers
apart.  Launcher processes (the
torchrun agent, ``accelerate launch``, DeepSpeed's runner) are never ranks, whatever they
inherited: binding the agent would pin all of its workers.
"""

from __future__ import annotations

from ._model import Record
from ._sysfs import short

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

# (rank variable, size variables) in priority order.  SLURM_LOCALID is handled apart:
# it names a task only inside a job step (a batch script has it without SLURM_STEP_ID).
RANK_VARIABLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("LOCAL_RANK", ("LOCAL_WORLD_SIZE", "LOCAL_SIZE")),
    ("OMPI_COMM_WORLD_LOCAL_RANK", ("OMPI_COMM_WORLD_LOCAL_SIZE",)),
    ("MPI_LOCALRANKID", ("MPI_LOCALNRANKS",)),
    ("MV2_COMM_WORLD_LOCAL_RANK", ("MV2_COMM_WORLD_LOCAL_SIZE",)),
    ("PALS_LOCAL_RANKID", ("PALS_LOCAL_SIZE",)),
    ("SLURM_LOCALID", ()),
)
RANK_VARIABLE_NAMES = tuple(name for name, _ in RANK_VARIABLES)
SIZE_VARIABLE_NAMES = tuple(s for _, sizes in RANK_VARIABLES for s in sizes)
# Variables that make the startup hook look further: a rank variable, or a request to
# hook a framework's own process starts.  The .pth line spells this list out (it must not
# import anything to decide); a test keeps the two in step.
TRIGGER_VARIABLES = (*RANK_VARIABLE_NAMES, "NUMABIND_TORCH", "NUMABIND_RAY")

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
    for name, size_names in RANK_VARIABLES:
        raw = environ.get(name)
        if raw is None:
            continue
        if name == "SLURM_LOCALID" and "SLURM_STEP_ID" not in environ:
            continue  # an sbatch/salloc shell, not a task of a job step
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
