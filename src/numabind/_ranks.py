"""Who am I: this process's local rank and local world size, and where they came from.

Each launcher writes its own variables (../shared/LAUNCHERS.md measured them).  LOCAL_RANK
wins over the others: under ``srun -n1 torchrun`` every worker also inherits the agent's
SLURM_LOCALID=0, and only LOCAL_RANK tells the workers apart.  Launcher processes (the
torchrun agent, ``accelerate launch``, DeepSpeed's runner) are never ranks, whatever they
inherited: binding the agent would pin all of its workers.
"""

from __future__ import annotations

from ._model import Record, _set

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
# Every variable whose presence makes the startup hook look further (the .pth line
# repeats this list: it must not import anything to decide).
TRIGGER_VARIABLES = tuple(name for name, _ in RANK_VARIABLES)

_LAUNCHER_MODULES = {
    "torch.distributed.run": "torchrun",
    "torch.distributed.launch": "torch.distributed.launch",
    "deepspeed.launcher.launch": "deepspeed launcher",
    "deepspeed.launcher.runner": "deepspeed",
    "accelerate.commands.launch": "accelerate launch",
}
_LAUNCHER_SCRIPTS = {"torchrun": "torchrun", "deepspeed": "deepspeed", "ds": "deepspeed"}


class RankInfo(Record):
    """The local rank as found in the environment.  ``problem`` is set when a variable was
    present but unusable; the plan then skips with that message instead of guessing."""

    __slots__ = (
        "local_rank",
        "local_world_size",
        "rank_source",
        "size_source",
        "launcher",
        "problem",
    )
    local_rank: int | None
    local_world_size: int | None
    rank_source: str | None
    size_source: str | None
    launcher: str | None
    problem: str | None

    def __init__(
        self,
        local_rank: int | None = None,
        local_world_size: int | None = None,
        rank_source: str | None = None,
        size_source: str | None = None,
        launcher: str | None = None,
        problem: str | None = None,
    ) -> None:
        _set(self, "local_rank", local_rank)
        _set(self, "local_world_size", local_world_size)
        _set(self, "rank_source", rank_source)
        _set(self, "size_source", size_source)
        _set(self, "launcher", launcher)
        _set(self, "problem", problem)

    @property
    def is_rank(self) -> bool:
        return self.local_rank is not None and self.launcher is None and self.problem is None


def _parse_index(value: str) -> int | None:
    value = value.strip()
    if not value.isdigit():  # isdigit: no sign, no spaces, no "0x"
        return None
    return int(value)


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
    SLURM_NODEID."""
    for var in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        text = environ.get(var)
        if not text:
            continue
        counts: list[int] = []
        try:
            for part in text.split(","):
                if "(x" in part:
                    n, _, rep = part.partition("(x")
                    counts.extend([int(n)] * int(rep.rstrip(")")))
                else:
                    counts.append(int(part))
        except ValueError:
            continue
        node = _parse_index(environ.get("SLURM_NODEID", "0")) or 0
        if node < len(counts):
            return counts[node], var
    return None, None


def detect(environ: Mapping[str, str], argv: Sequence[str] | None = None) -> RankInfo:
    """Find this process's local rank.  Never raises: a garbled value becomes ``problem``."""
    launcher = launcher_of(argv)
    for name, size_names in RANK_VARIABLES:
        raw = environ.get(name)
        if raw is None:
            continue
        if name == "SLURM_LOCALID" and "SLURM_STEP_ID" not in environ:
            continue  # an sbatch/salloc shell, not a task of a job step
        rank = _parse_index(raw)
        if rank is None:
            return RankInfo(
                rank_source=name,
                launcher=launcher,
                problem=f"{name}={raw!r} is not a non-negative integer, so this process's "
                "local rank is unknown; numabind left it unbound",
            )
        size: int | None = None
        size_source: str | None = None
        if name == "SLURM_LOCALID":
            size, size_source = _slurm_tasks_on_node(environ)
        for size_name in size_names:
            value = environ.get(size_name)
            if value is not None:
                parsed = _parse_index(value)
                if parsed is not None and parsed > 0:
                    size, size_source = parsed, size_name
                    break
        if size is not None and rank >= size:
            # Keep the rank (it still picks a device) but do not trust the size.
            size, size_source = None, None
        return RankInfo(rank, size, name, size_source, launcher)
    return RankInfo(launcher=launcher)
