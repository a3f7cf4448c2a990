"""The guard: masks that an import moves off the plan are put back, with one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import synth
from support import clean_env, two_cpus

pytestmark = two_cpus


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """Rank 1 of a generated two-node machine (node 1 = CPU 1), and a stand-in 'numpy'
    whose import rebinds the importing thread to CPU 0 as libgomp does with OMP_PROC_BIND."""
    root = synth.write(synth.two_nodes(), str(tmp_path / "root"))
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "numpy.py").write_text("import os\nos.sched_setaffinity(0, {0})\n")
    e = clean_env()
    e.update(
        LOCAL_RANK="1",
        NUMABIND_SYSROOT=root,
        NUMABIND_MEMORY="none",
        NUMABIND="force",
        PYTHONPATH=str(fake),
        OMP_PROC_BIND="true",
    )
    return e


CODE = (
    "import os; a = sorted(os.sched_getaffinity(0)); import numpy; "
    "print(a, sorted(os.sched_getaffinity(0)))"
)


def test_guard_restores_and_says_once(env: dict[str, str]) -> None:
    p = subprocess.run(
        [sys.executable, "-c", CODE + "; import numpy"], capture_output=True, text=True, env=env
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[1] [1]"
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert "import numpy with OMP_PROC_BIND='true'" in lines[0] and "put them back" in lines[0]
    assert "NUMABIND_GUARD=0" in lines[0]


def test_guard_off(env: dict[str, str]) -> None:
    env["NUMABIND_GUARD"] = "0"
    p = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env)
    assert p.stdout.strip() == "[1] [0]" and p.stderr == ""


def test_guard_costs_nothing_until_the_import(env: dict[str, str]) -> None:
    code = (  # numabind's own finder, or the startup fast path's that arms it on the import
        "import sys; names = [type(f).__name__ for f in sys.meta_path]; "
        "print('_Finder' in names or '_Armer' in names, 'numpy' in sys.modules)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert p.stdout.strip() == "True False", "a finder waits; nothing was imported"
