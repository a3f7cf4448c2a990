"""Who am I: local rank, local world size and their sources; launchers are never ranks."""

from __future__ import annotations

import pytest

from numabind._environ import detect, launcher_of


@pytest.mark.parametrize(
    ("env", "rank", "size", "source", "size_source"),
    [
        ({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}, 1, 2, "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
        ({"LOCAL_RANK": "3", "LOCAL_SIZE": "8"}, 3, 8, "LOCAL_RANK", "LOCAL_SIZE"),  # DeepSpeed
        (
            {"OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
            1,
            4,
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        (
            {"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},
            0,
            2,
            "MPI_LOCALRANKID",
            "MPI_LOCALNRANKS",
        ),
        (
            {"SLURM_LOCALID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_TASKS_PER_NODE": "2"},
            1,
            2,
            "SLURM_LOCALID",
            "SLURM_STEP_TASKS_PER_NODE",
        ),
        (
            {
                "SLURM_LOCALID": "1",
                "SLURM_STEP_ID": "0",
                "SLURM_STEP_TASKS_PER_NODE": "4(x2),3",
                "SLURM_NODEID": "2",
            },
            1,
            3,
            "SLURM_LOCALID",
            "SLURM_STEP_TASKS_PER_NODE",
        ),
        # srun -n1 torchrun: workers inherit the agent's SLURM_LOCALID=0; LOCAL_RANK wins
        (
            {
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2",
                "SLURM_LOCALID": "0",
                "SLURM_STEP_ID": "0",
            },
            1,
            2,
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
        ),
        ({"LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}, 1, None, "LOCAL_RANK", None),
    ],
)
def test_rank_sources(
    env: dict[str, str], rank: int, size: int | None, source: str, size_source: str | None
) -> None:
    info = detect(env)
    assert (info.local_rank, info.local_world_size, info.rank_source, info.size_source) == (
        rank,
        size,
        source,
        size_source,
    )
    assert info.is_rank


def test_batch_script_is_not_a_task() -> None:
    info = detect(
        {"SLURM_LOCALID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "ENVIRONMENT": "BATCH"}
    )
    assert info.local_rank is None and not info.is_rank


@pytest.mark.parametrize("value", ["abc", "-1", "1.5", "", " ", "0x1"])
def test_garbled_rank_is_a_problem(value: str) -> None:
    info = detect({"LOCAL_RANK": value})
    assert (
        info.local_rank is None
        and info.problem
        and "LOCAL_RANK" in info.problem
        and repr(value) in info.problem
    )


@pytest.mark.parametrize(("rank", "size", "trusted"), [(5, 2, False), (2, 2, False), (1, 2, True)])
def test_inconsistent_size_is_dropped(rank: int, size: int, trusted: bool) -> None:
    """Ranks count from 0: a rank equal to the size (an off-by-one launcher, or a size
    meant for another level) makes the size untrustworthy, said in one note."""
    info = detect({"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(size)})
    assert info.local_rank == rank
    assert info.local_world_size == (size if trusted else None)
    assert bool(info.notes) is not trusted
    if not trusted:
        assert info.notes == (
            f"LOCAL_RANK={rank} is not below LOCAL_WORLD_SIZE={size}: local world size unknown",
        )


@pytest.mark.parametrize(
    ("argv", "launcher"),
    [
        (["python", "/usr/bin/torchrun", "--nproc-per-node", "2", "train.py"], "torchrun"),
        (["python3", "-m", "torch.distributed.run", "train.py"], "torchrun"),
        (
            ["python", "-u", "-m", "deepspeed.launcher.launch", "--world_info=x"],
            "deepspeed launcher",
        ),
        (["python", "/opt/venv/bin/deepspeed", "train.py"], "deepspeed"),
        (["python", "/opt/venv/bin/accelerate", "launch", "train.py"], "accelerate launch"),
        (
            ["python", "-X", "importtime", "-m", "torch.distributed.launch"],
            "torch.distributed.launch",
        ),
        (["python", "train.py", "--torchrun"], None),
        (["python", "/opt/venv/bin/accelerate", "config"], None),
        (["python", "-c", "import torchrun"], None),
        ([], None),
    ],
)
def test_launcher_detection(argv: list[str], launcher: str | None) -> None:
    assert launcher_of(argv) == launcher


def test_launcher_with_rank_vars_is_not_a_rank() -> None:
    info = detect(
        {"SLURM_LOCALID": "0", "SLURM_STEP_ID": "0"}, ["python", "/usr/bin/torchrun", "x.py"]
    )
    assert info.launcher == "torchrun" and not info.is_rank
