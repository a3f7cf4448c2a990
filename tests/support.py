"""Helpers the tests and benchmarks share: one clean environment for child processes."""

from __future__ import annotations

import os
import subprocess
import sys

# Variables that would make a child a rank, point it at another machine or change what
# numabind does; a test sets the ones it wants on top of this.
_DROPPED = (
    "NUMABIND",
    "LOCAL_",
    "OMPI_",
    "MPI_",
    "MV2_",
    "PALS_",
    "SLURM_",
    "PMI",
    "CUDA_",
    "ROCR_",
    "HIP_",
    "ZE_",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "TORCHELASTIC",
    "PYTHONWARN",
    "PYTHONPATH",
    "PYTHONSTARTUP",
    "PYTHONDEVMODE",
)


def clean_env(**extra: str) -> dict[str, str]:
    """``os.environ`` without rank, device, thread and numabind variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    env.update(extra)
    return env


def py(code: str, env: dict[str, str], *pre: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in ``env``, behind an optional wrapper (``setpriv ...``,
    ``unshare ...``, the seccomp launcher)."""
    return subprocess.run(
        [*pre, sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
