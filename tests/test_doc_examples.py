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
import shlex
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
    marks += [pytest.mark.ray] if b.ray else []
    return pytest.param(b, id=b.where, marks=marks)


def test_every_block_is_run_or_marked() -> None:
    unmarked = [f"{b.where}: {b.marker or 'no marker'}" for b in BLOCKS if b.kind is None]
    assert not unmarked, "blocks neither run nor marked (docs/_ext/doc_examples.py):\n" + (
        "\n".join(unmarked)
    )
    print(doc_examples.summary(BLOCKS))


def _folder(tmp_path: Path) -> Path:
    """A fresh folder laid out as a checkout a reader works in."""
    (tmp_path / "tests").symlink_to(HERE)
    (tmp_path / ".venv").symlink_to(sys.prefix)
    return tmp_path


def _env(cwd: Path) -> dict[str, str]:
    """No rank or device variables, this venv's scripts first; what the block's marker
    asks for (its example machine, its variables) is set by its "Try it" line, run before
    it as the page shows it (``doc_examples.try_it``)."""
    bin_dir = os.path.dirname(sys.executable)
    return clean_env(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", TMPDIR=str(cwd))


def _first(b: doc_examples.Block, command: str) -> str:
    """``command`` after the block's visible "Try it" line, in one shell."""
    line = doc_examples.try_it(b)
    return command if line is None else f"{line}\n{command}"


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
            ["bash", "-e", "-o", "pipefail", "-c", _first(b, b.text)],
            cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert r.returncode == b.exit, f"{b.where}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
        return
    for command, expected in steps:
        r = subprocess.run(
            ["bash", "-o", "pipefail", "-c", _first(b, command)],
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
    command = _first(b, shlex.join(argv))
    r = subprocess.run(
        ["bash", "-e", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=600,
    )  # fmt: skip
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
    block: doc_examples.Block, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if block.torch:
        pytest.importorskip("torch")
    if block.ray:
        pytest.importorskip("ray")
    cwd = _folder(tmp_path)
    env = _env(cwd)
    if block.ray:  # Ray's socket paths under TMPDIR must stay under 107 bytes
        import shutil
        import tempfile

        short = tempfile.mkdtemp(prefix="nbray-")
        env["TMPDIR"] = short
        request.addfinalizer(lambda: shutil.rmtree(short, ignore_errors=True))
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


def test_try_it_lines_are_visible_in_the_built_pages(tmp_path: Path) -> None:
    """Issue 46: the markers are RST comments, which HTML drops, so a reader of the built
    page never learnt that a block runs on the two-nodes example (and prints nothing like
    what it shows on a laptop).  Every block with a machine or a variable in its marker
    has its "Try it" line, the very command the tests run before it, visible in the HTML
    of its page (the pages and the API page's docstrings, built by the docs' own
    extension)."""
    import html

    wanted = [b for b in BLOCKS if doc_examples.try_it(b)]
    pages = sorted({b.where.split(":")[0] for b in wanted if b.where.startswith("docs/")})
    assert pages, "no block runs on an example machine: nothing to check"
    if any("(docstring)" in b.where for b in wanted):
        pages.append("docs/api.rst")
    src = tmp_path / "src"
    for page in pages:
        target = src / page[len("docs/") :]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((ROOT / page).read_text())
    docnames = [p[len("docs/") : -len(".rst")] for p in pages]
    (src / "index.rst").write_text(
        "Pages\n=====\n\n.. toctree::\n\n" + "".join(f"   {d}\n" for d in docnames)
    )
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'docs' / '_ext')!r})\n"
        'extensions = ["sphinx.ext.autodoc", "numabind_examples"]\n'
        'autodoc_typehints = "description"\nexclude_patterns = ["_build"]\n'
    )
    r = subprocess.run(
        [sys.executable, "-m", "sphinx", "-q", "-b", "html", str(src), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=600, env=clean_env(),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    for page in pages:
        built = (tmp_path / "html" / (page[len("docs/") : -len(".rst")] + ".html")).read_text()
        here = [
            b
            for b in wanted
            if b.where.startswith(page + ":")
            or (page == "docs/api.rst" and "(docstring)" in b.where)
        ]
        shown = re.findall(r'<p class="numabind-try-it">(.*?)</p>', built, re.DOTALL)
        assert len(shown) == len(here), f"{page}: {len(here)} try-it markers, {len(shown)} shown"
        text = [html.unescape(re.sub(r"<[^>]+>", "", s)) for s in shown]
        for b in here:
            line = doc_examples.try_it(b) or "?"
            assert any(line in s and s.startswith("Try it") for s in text), (b.where, text)
        assert "example: run" not in built, f"{page}: a marker left as a comment only"


def test_the_readme_try_it_writes_nothing_into_the_checkout(tmp_path: Path) -> None:
    """Issue 46: the README's "try it" wrote ``dgx.svg`` and ``dgx/`` into the checkout,
    untracked files a reader then has to find and remove.  Run as written in a folder laid
    out as the checkout, it leaves that folder as it was, and what it writes (the picture,
    the gathered DGX) is under the temp folder it says."""
    (block,) = [
        b for b in BLOCKS if b.where.startswith("README.md") and "--svg" in b.text and b.kind
    ]
    (tmp_path / "checkout").mkdir()
    cwd = _folder(tmp_path / "checkout")
    temp = tmp_path / "temp"
    temp.mkdir()
    before = sorted(p.name for p in cwd.iterdir())
    env = _env(cwd) | {"TMPDIR": str(temp)}
    r = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block.text],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in cwd.iterdir()) == before, "the try-it wrote into the checkout"
    (made,) = temp.iterdir()  # the one mktemp -d folder
    assert "<svg" in (made / "dgx.svg").read_text()[:500]
    assert (made / "dgx" / "sys").is_dir()


def test_46_the_kv_cache_recipe_prints_a_pool_per_gpu(tmp_path: Path) -> None:
    """Issue 46: the recipe counts the GPUs with ``Machine.from_root()``, which follows
    ``NUMABIND_SYSROOT`` as the rest of the API does: on its machine (after its "Try it"
    line, as a reader runs it) it prints one pool per GPU (before, it read this GPU-less
    host, ran its loop zero times and exited 0)."""
    import json

    (b,) = [x for x in RUN if x.where.startswith("docs/host-memory.rst") and "pool_bytes" in x.text]
    cwd = _folder(tmp_path)
    (cwd / "kv.py").write_text(b.text + "\n")
    py = sys.executable
    both = _first(b, f"{py} kv.py\necho ===\n{py} -m numabind show --json")
    r = subprocess.run(["bash", "-e", "-c", both], cwd=cwd, env=_env(cwd),
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    printed, _, shown = r.stdout.partition("===\n")
    gpus = len(json.loads(shown)["devices"])
    lines = printed.splitlines()
    assert gpus >= 1, shown
    assert len(lines) == gpus and all(x.startswith("HostBuffer(0x") for x in lines), printed
    assert all("268435456 bytes, nodes 0, bind)" in x for x in lines), printed
