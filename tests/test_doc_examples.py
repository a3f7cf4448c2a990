"""Every code block of the documentation runs as written (issue 37): the pages under docs/,
the README and the docstrings the API page renders, found and classified by
docs/_ext/doc_examples.py.

A block marked ``run`` is executed here, in a fresh folder (the checkout's ``tests`` and
this interpreter's venv as ``.venv`` beside it, so the README's ``.venv/bin/numabind``
and ``tests/data/...`` paths hold), with no rank or device variables, on the example
machine its marker names (``numabind gather --example NAME`` made it a sysroot): a shell
block with ``bash -e`` (its ``$`` lines as a transcript whose output is compared), a
Python block as a script (doctest where it shows ``>>>``).  ``with torch`` blocks run in
the torch stage.  A block ``run by`` another stage's script is checked to be the one that
script runs; ``measured by`` a benchmark, that its table's columns are the script's.  A
block without a marker fails here and in the docs build.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import clean_env

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import doc_examples  # noqa: E402

BLOCKS = doc_examples.all_blocks()
RUN = [b for b in BLOCKS if b.kind == "run" and b.by is None]


def _param(b: doc_examples.Block) -> object:
    marks = [pytest.mark.torch] if b.torch else []
    return pytest.param(b, id=b.where, marks=marks)


def test_every_block_is_run_or_marked() -> None:
    unmarked = [f"{b.where}: {b.marker or 'no marker'}" for b in BLOCKS if b.kind is None]
    assert not unmarked, "blocks neither run nor marked (docs/_ext/doc_examples.py):\n" + (
        "\n".join(unmarked)
    )
    print(doc_examples.summary(BLOCKS))


@pytest.fixture(scope="session")
def machines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The example machines the blocks run on, gathered once as sysroots."""
    out: dict[str, str] = {}
    for name in sorted({b.on for b in BLOCKS if b.on}):
        where = tmp_path_factory.mktemp("machines") / name
        subprocess.run(
            [sys.executable, "-m", "numabind", "gather", "--example", name, str(where)],
            check=True,
            capture_output=True,
            env=clean_env(),
        )
        out[name] = str(where)
    return out


def _folder(tmp_path: Path) -> Path:
    """A fresh folder laid out as a checkout a reader works in."""
    (tmp_path / "tests").symlink_to(HERE)
    (tmp_path / ".venv").symlink_to(sys.prefix)
    return tmp_path


def _env(b: doc_examples.Block, machines: dict[str, str]) -> dict[str, str]:
    bin_dir = os.path.dirname(sys.executable)
    env = clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **b.env)
    if b.on:
        env["NUMABIND_SYSROOT"] = machines[b.on]
    return env


def _transcript(text: str) -> list[tuple[str, list[str]]]:
    """``$ command`` lines (with ``\\`` continuations) and the output shown after each."""
    steps: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if steps:
                steps[-1][1].append(line)
            i += 1
            continue
        command = line[2:]
        while command.endswith("\\") and i + 1 < len(lines):
            i += 1
            command = command[:-1] + "\n" + lines[i]
        steps.append((command, []))
        i += 1
    return steps


def _matches(expected: list[str], got: list[str]) -> bool:
    """Line by line, trailing blanks ignored; a ``...`` line matches any lines."""
    pattern = "".join(
        r"(?:.*\n)*?" if line.strip() == "..." else re.escape(line.rstrip()) + r"[ \t]*\n"
        for line in expected
    )
    return re.fullmatch(pattern, "".join(x.rstrip() + "\n" for x in got)) is not None


def _run_shell(b: doc_examples.Block, cwd: Path, env: dict[str, str]) -> None:
    steps = _transcript(b.text)
    if not steps:
        r = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", b.text],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == b.exit, f"{b.where}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        return
    for command, expected in steps:
        r = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == b.exit, f"{b.where}: {command}: exit {r.returncode}\n{r.stderr}"
        got = r.stdout.splitlines()
        while expected and not expected[-1].strip():
            expected = expected[:-1]
        assert _matches(expected, got), (
            f"{b.where}: {command}: the output shown is not what it prints:\n" + "\n".join(got)
        )


def _run_python(b: doc_examples.Block, cwd: Path, env: dict[str, str]) -> None:
    if ">>> " in b.text:
        script = cwd / "example.txt"
        script.write_text(b.text + "\n")
        argv = [sys.executable, "-m", "doctest", "-o", "ELLIPSIS", "-o", "NORMALIZE_WHITESPACE",
                str(script)]  # fmt: skip
    else:
        script = cwd / "example.py"
        script.write_text(b.text + "\n")
        argv = [sys.executable, str(script)]
    r = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == b.exit, f"{b.where}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert "Traceback" not in r.stderr or b.exit, r.stderr


def _run_json(b: doc_examples.Block) -> None:
    """A JSON block is a file numabind reads (a DRA device metadata file): read it as
    numabind does, and it must name a device with no complaint."""
    from numabind._dra import parse

    warn: list[str] = []
    assert parse(b.text, b.where, warn) and not warn, warn


@pytest.mark.parametrize("block", [_param(b) for b in RUN])
def test_the_block_runs_as_written(
    block: doc_examples.Block, machines: dict[str, str], tmp_path: Path
) -> None:
    if block.torch:
        pytest.importorskip("torch")
    cwd = _folder(tmp_path)
    env = _env(block, machines)
    if block.language == "include":
        pytest.fail(f"{block.where}: an include marked run is run by the gallery, not here")
    if block.language == "json":
        _run_json(block)
    elif block.python:
        _run_python(block, cwd, env)
    elif block.shell:
        _run_shell(block, cwd, env)
    else:
        pytest.fail(f"{block.where}: a {block.language} block cannot be run: mark why")


def _commands(text: str) -> list[list[str]]:
    """A shell block's commands, comments left out."""
    return [
        line.split("#", 1)[0].split() for line in text.splitlines() if line.split("#", 1)[0].strip()
    ]


def test_blocks_run_by_other_stages_are_theirs() -> None:
    readme_first = doc_examples.markdown_blocks((ROOT / "README.md").read_text(), "README.md")[0]
    for b in BLOCKS:
        if b.kind != "run" or b.by is None:
            continue
        script = ROOT / b.by
        assert script.is_file(), f"{b.where}: {b.by} does not exist"
        if b.by == "scripts/readme-first-command":
            assert "README.md" in script.read_text()
            assert _commands(b.text) == _commands(readme_first.text), (
                f"{b.where} is not the README's first block, which the script runs"
            )
        if b.by == "docs/_ext/numabind_gallery.py":
            name = b.text.rsplit("/", 1)[-1]
            assert f'"{name}"' in script.read_text(), f"{b.where}: the gallery makes no {name}"


def test_measured_blocks_are_their_benchmark_s() -> None:
    """A measured table's columns are named in the benchmark that prints it: a renamed or
    dropped column fails here (the numbers are one run's; benchmarks/ reruns them)."""
    for b in BLOCKS:
        if b.kind != "measured":
            continue
        assert b.by is not None
        script = ROOT / b.by
        assert script.is_file(), f"{b.where}: {b.by} does not exist"
        source = script.read_text() + (ROOT / "benchmarks" / "_common.py").read_text()
        header = next(line for line in b.text.splitlines() if line.startswith("|"))
        for cell in (c.strip() for c in header.strip("|").split("|")):
            assert cell in source, f"{b.where}: column {cell!r} is not printed by {b.by}"


def test_a_new_block_without_a_marker_is_caught() -> None:
    text = "Try::\n\n    numabind show\n\n.. code-block:: bash\n\n   numabind doctor\n"
    assert [b.kind for b in doc_examples.rst_blocks(text, "new.rst")] == [None, None]
    text = ".. example: run on gb200, exit 1\n\nTry::\n\n    numabind show\n"
    (b,) = doc_examples.rst_blocks(text, "new.rst")
    assert (b.kind, b.on, b.exit) == ("run", "gb200", 1)
    (b,) = doc_examples.rst_blocks(".. example: run sideways\n\nTry::\n\n    x\n", "n.rst")
    assert b.kind is None, "a clause numabind does not read is no marker"


def test_item_8_the_host_memory_recipes_run_and_register_once() -> None:
    """Issue 37 #8: every recipe on host-memory.rst runs (the shared region defines what
    it uses and maps region.fd to find its address); none tells the user to register a
    buffer host_buffer registered already."""
    page = [b for b in BLOCKS if b.where.startswith("docs/host-memory.rst")]
    assert len(page) == 4 and all(b.kind == "run" for b in page), [b.where for b in page]
    assert not any("cudaHostRegister" in b.text for b in page)
    shared = next(b for b in page if "shared=True" in b.text)
    assert "mmap.mmap(fd" in shared.text and "address" in shared.text.split("bind_range")[0]


def test_46_the_kv_cache_recipe_prints_a_pool_per_gpu(
    machines: dict[str, str], tmp_path: Path
) -> None:
    """Issue 46: the recipe counts the GPUs with ``Machine.from_root()``, which follows
    ``NUMABIND_SYSROOT`` as the rest of the API does: on its machine it prints one pool
    per GPU (before, it read this GPU-less host, ran its loop zero times and exited 0)."""
    import json

    (b,) = [x for x in RUN if x.where.startswith("docs/host-memory.rst") and "pool_bytes" in x.text]
    env = _env(b, machines)
    script = _folder(tmp_path) / "kv.py"
    script.write_text(b.text + "\n")
    r = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    shown = subprocess.run([sys.executable, "-m", "numabind", "show", "--json"], env=env,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    gpus = len(json.loads(shown.stdout)["devices"])
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and gpus >= 1, r.stderr
    assert len(lines) == gpus and all(x.startswith("HostBuffer(0x") for x in lines), r.stdout
    assert all("268435456 bytes, nodes 0, bind)" in x for x in lines), r.stdout
