"""The documentation a user looks for is there and complete: every public name in the API
reference, every member and parameter described; every knob in the environment page; the
README's commands and claims honest."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import numabind
import numabind.ray
import numabind.torch

ROOT = Path(__file__).resolve().parent.parent
API = (ROOT / "docs" / "api.rst").read_text()
PUBLIC = [n for n in numabind.__all__ if n != "__version__"]


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_is_in_the_api_reference(name: str) -> None:
    assert re.search(rf"\.\. auto\w+:: numabind\.{name}\b", API), name


def _members(obj: object) -> list[tuple[str, object]]:
    out = []
    for name, value in vars(obj).items():
        if name.startswith("_"):
            continue
        if callable(value) or isinstance(value, property):
            out.append((name, value))
    return out


def _documented(obj: object) -> list[tuple[str, object]]:
    targets: list[tuple[str, object]] = []
    for name in PUBLIC:
        value = getattr(numabind, name)
        targets.append((name, value))
        if inspect.isclass(value) and not issubclass(value, BaseException):
            targets += [(f"{name}.{m}", v) for m, v in _members(value)]
    for mod in (numabind.torch, numabind.ray):
        for name in ("install", "uninstall", "install_when_imported"):
            targets.append((f"{mod.__name__}.{name}", getattr(mod, name)))
    return targets


@pytest.mark.parametrize(
    ("name", "obj"), _documented(numabind), ids=lambda x: x if isinstance(x, str) else ""
)
def test_every_public_name_and_member_has_a_docstring(name: str, obj: object) -> None:
    target = obj.fget if isinstance(obj, property) else obj
    doc = inspect.getdoc(target)
    assert doc and len(doc) > 20, f"{name} has no docstring"


def _functions() -> list[tuple[str, object]]:
    out = []
    for name, obj in _documented(numabind):
        target = obj.fget if isinstance(obj, property) else obj
        if inspect.isfunction(target) or inspect.ismethod(target):
            out.append((name, target))
    return out


@pytest.mark.parametrize(
    ("name", "fn"), _functions(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_every_parameter_is_described(name: str, fn: object) -> None:
    doc = inspect.getdoc(fn) or ""
    params = [
        p
        for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
        if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    missing = [p.name for p in params if f"``{p.name}``" not in doc]
    assert not missing, f"{name}: parameters not described: {missing}"


def test_every_knob_is_on_the_environment_page() -> None:
    env = (ROOT / "docs" / "environment.rst").read_text()
    src = "\n".join(p.read_text() for p in (ROOT / "src" / "numabind").glob("*.py"))
    knobs = set(re.findall(r'"(NUMABIND(?:_[A-Z]+)*)"', src))
    missing = sorted(k for k in knobs if f"``{k}``" not in env)
    assert not missing, missing


def test_readme_says_numabind_is_not_on_pypi() -> None:
    readme = (ROOT / "README.md").read_text()
    first_block = readme.split("```")[1]
    first, second = [ln for ln in first_block.splitlines()[1:] if ln.strip()][:2]
    assert "pip install ." in first and "numabind show" in first
    assert second.split()[0] == "./scripts/test"
    assert "not published on PyPI" in readme
    assert "pip install numabind &&" not in readme


CLI = (ROOT / "docs" / "cli.rst").read_text()


def _subcommands() -> dict[str, object]:
    import argparse

    from numabind.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


@pytest.mark.parametrize("command", sorted(_subcommands()))
def test_every_command_and_option_is_on_the_cli_page(command: str) -> None:
    import argparse

    sub = _subcommands()[command]
    assert isinstance(sub, argparse.ArgumentParser)
    parts = re.split(r"\n``numabind ([a-z-]+)``\n-+\n", CLI)
    sections = dict(zip(parts[1::2], parts[2::2]))
    assert command in sections, f"no section for numabind {command} on docs/cli.rst"
    for action in sub._actions:
        for option in action.option_strings:
            if option in ("-h", "--help"):
                continue
            assert option in sections[command], f"numabind {command} {option}: not documented"


def test_the_exit_table_on_the_cli_page_is_the_code_s() -> None:
    from numabind.cli._common import EXITS

    table = CLI.split("Exit status\n-----------", 1)[1]
    codes = [int(m) for m in re.findall(r"^(\d+)\s", table, re.MULTILINE)]
    assert codes == [e.code for e in EXITS]
    flat = " ".join(table.replace("``", "").split())
    for e in EXITS:
        words = [w for w in re.findall(r"[a-z-]+", e.meaning) if len(w) > 4]
        assert all(w in flat for w in words), (e.code, [w for w in words if w not in flat])


@pytest.mark.parametrize(
    "record",
    [
        "ShowReport", "CheckReport", "ProcessCheck", "JobReport", "NodeRow", "RankRow",
        "Summary", "BenchReport", "Measurement", "Verdict", "NodeFree", "GpuReport", "GpuCopy",
    ],
)  # fmt: skip
def test_every_json_key_is_on_the_cli_page(record: str) -> None:
    from numabind.check import _inspect as _check
    from numabind.check import _job
    from numabind.cli import _bench, _show

    modules = (_show, _check, _job, _bench)
    cls = next(getattr(m, record) for m in modules if hasattr(m, record))
    missing = [f for f in cls._fields if f"``{f}``" not in CLI and f"``{f}[]``" not in CLI]
    assert not missing, f"{record}: {missing} not on docs/cli.rst"


def test_the_plan_json_keys_are_on_the_cli_page() -> None:
    plan = numabind.plan_for(local_rank=0, environ={})
    missing = [k for k in plan.to_dict() if f"``{k}``" not in CLI]
    assert not missing, missing


def _doc_commands() -> list[tuple[str, str]]:
    """Every ``numabind SUBCOMMAND ...`` a reader may copy: the inline literals of the
    pages and the README, and the lines of every code block (run or not)."""
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    import doc_examples

    out: list[tuple[str, str]] = []
    texts = [(str(p.relative_to(ROOT)), p.read_text()) for p in (ROOT / "docs").rglob("*.rst")]
    texts.append(("README.md", (ROOT / "README.md").read_text()))
    for where, text in texts:
        flat = " ".join(text.split())
        out += [(where, c) for c in re.findall(r"``(numabind [a-z][^`]*)``", flat)]
        out += [(where, c) for c in re.findall(r"(?<!`)`(numabind [a-z][^`]*)`(?!`)", flat)]
    for b in doc_examples.all_blocks():
        for line in b.text.splitlines():
            for m in re.finditer(r"(?:^|[\s;&|(/])numabind ([a-z][\w-]*(?: [^#;&|)]*)?)", line):
                out.append((b.where, "numabind " + m.group(1).strip()))
    return out


def test_every_numabind_command_in_the_docs_gives_each_option_its_argument() -> None:
    """Issue 46: memory-tiers.rst said ``numabind show --spill`` "shows either", and the
    CLI answers that line with a usage error (``--spill`` takes cpu, any or nodes);
    cores.rst named ``--priority`` bare the same way.  Every command the docs show uses
    options its subcommand has, and gives each one that takes a value its value."""
    import argparse
    import shlex

    from numabind.cli import build_parser

    subs = next(
        a.choices for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)
    )
    bad = []
    for where, command in _doc_commands():
        try:
            words = shlex.split(re.sub(r"[\[\]|{}]", " ", command), comments=True)[1:]
        except ValueError:
            continue  # a quoted fragment spanning lines: not a command line
        if not words or words[0] not in subs:
            continue  # numabind --help, numabind COMMAND, a word of prose
        options = {o: a for a in subs[words[0]]._actions for o in a.option_strings}
        for i, word in enumerate(words[1:], 1):
            if word == "--":
                break
            if not word.startswith("--"):
                continue
            action = options.get(word.split("=")[0])
            if action is None:
                bad.append(f"{where}: {command}: numabind {words[0]} has no {word}")
            elif (
                action.nargs not in (0, "?", "*")
                and "=" not in word
                and (i + 1 >= len(words) or words[i + 1].startswith("-"))
            ):
                bad.append(f"{where}: {command}: {word} needs its value")
    assert not bad, "\n".join(bad)


def _readme_blocks() -> list[object]:
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    import doc_examples

    return list(doc_examples.markdown_blocks((ROOT / "README.md").read_text(), "README.md"))


def test_readme_names_the_one_minute_test_and_what_the_docs_build_needs() -> None:
    """Issue 46: the README named no quick test (only the 25-minute ``./scripts/test``) and
    did not say that building the docs needs Sphinx.  It names the one-minute test, run
    with the venv its first command made, with the extra that brings pytest; and the docs
    build with the extra that brings Sphinx; both extras are the project's."""
    project = (ROOT / "pyproject.toml").read_text()  # no tomllib on 3.10
    extras = {
        m.group(1): re.findall(r'"([^"]+)"', m.group(2))
        for m in re.finditer(r"^(test|docs) = \[(.*?)\]$", project, re.MULTILINE | re.DOTALL)
    }
    lines = [ln for b in _readme_blocks() for ln in b.text.splitlines()]  # type: ignore[attr-defined]
    quick = [ln for ln in lines if "tests/test_first_hour.py" in ln]
    assert quick, "the README names no one-minute test"
    assert (ROOT / "tests" / "test_first_hour.py").is_file()
    assert ".venv/bin/python -m pytest" in quick[0] and "'.[test]'" in quick[0], quick
    assert any(x.startswith("pytest") for x in extras["test"])
    build = [ln for ln in lines if "sphinx" in ln and "-b html docs" in ln]
    assert build and "pip install '.[docs]'" in build[0], build
    assert any(x.startswith("sphinx") for x in extras["docs"])
    first = _readme_blocks()[0].text  # type: ignore[attr-defined]
    assert len([ln for ln in first.splitlines() if ln.strip()]) == 2, "set-up: two commands"


def _rendered() -> list[tuple[str, object]]:
    """What the API page renders, as autodoc does: the docstring objects of the docs'
    finder, less the members api.rst excludes."""
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    import doc_examples

    excluded = {
        f"{cls}.{m.strip()}"
        for cls, members in re.findall(
            r"\.\. autoclass:: ([\w.]+)\n(?:   :.*\n)*?   :exclude-members: (.*)", API
        )
        for m in members.split(",")
    }
    return [(n, o) for n, o in doc_examples.docstring_objects() if n not in excluded]


def test_every_record_a_documented_signature_names_has_an_entry() -> None:
    """Issue 46: ``Binding.entry() -> Entry`` and ``Request(visible: Visible)`` named
    records the API page had no entry for (the build was told to ignore them).  Every
    numabind record that a signature on the page names is on the page, or the member
    that names it is left off."""
    import importlib
    import pkgutil
    import sys

    from numabind._model import Record

    for info in pkgutil.iter_modules(numabind.__path__, "numabind."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)  # every record, not only those loaded so far
    documented = {t.rsplit(".", 1)[-1] for t in re.findall(r"\.\. auto\w+:: ([\w.]+)", API)}
    records = {
        name
        for module_name, module in list(sys.modules.items())
        if module_name.startswith("numabind") and module is not None
        for name, value in vars(module).items()
        if isinstance(value, type) and issubclass(value, Record) and value is not Record
    }
    missing = []
    for name, obj in _rendered():
        try:
            signature = str(inspect.signature(obj))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        for word in set(re.findall(r"\b([A-Z]\w+)\b", signature)):
            if word in records and word not in documented:
                missing.append(f"{name}: {word}")
    assert not missing, missing
    conf = (ROOT / "docs" / "conf.py").read_text()
    ignored = set(re.findall(r'\("py:class", "(\w+)"\)', conf))
    assert not ignored & records, f"conf.py hides records from the build: {ignored & records}"


def test_no_rendered_docstring_links_into_a_private_module() -> None:
    """Issue 46: ``Machine.core_kinds`` linked ``numabind._model.CoreKinds``; a public
    name's docstring links only public names (the records are on the page by name)."""
    links = []
    for name, obj in _rendered():
        target = obj.fget if isinstance(obj, property) else obj
        doc = inspect.getdoc(target) or ""
        links += [f"{name}: {m}" for m in re.findall(r":\w+:`~?([\w.]*\._\w[\w.]*)`", doc)]
    assert not links, links


def test_no_page_speaks_of_its_own_release_in_the_past() -> None:
    """Issue 46: memory-tiers.rst, in 0.3.0's documentation, said "0.3.0 did what any
    does": the release a reader runs, described as a past it is not.  No page (the
    changelog aside) says the version it documents did, was or had something."""
    version = re.escape(numabind.__version__)
    found = [
        f"{p.relative_to(ROOT)}: {m.group(0)}"
        for p in (ROOT / "docs").rglob("*.rst")
        if p.name != "changelog.rst"
        for m in re.finditer(
            rf"\b{version}(?:'s \w+)?\s+(?:did|was|were|had|used to)\b",
            " ".join(p.read_text().split()),
        )
    ]
    assert not found, found


def _show(*args: str) -> str:
    """``numabind show ARGS`` as a reader runs it: a fresh interpreter, no rank variables."""
    import subprocess
    import sys

    from support import clean_env

    r = subprocess.run(
        [sys.executable, "-m", "numabind", "show", *args],
        capture_output=True, text=True, env=clean_env(), timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_reading_explains_every_column_and_line_show_prints() -> None:
    """Issue 46: reading.rst, the page that "explains every column", left out the kind
    and tier columns, the "cores: one kind" line, the adapters table and the "(46)" after
    the priority cores, and said NVLink is in no file while ``--matrix`` of the DGX-2
    export it shows reads NVLinkBandwidth.  Every column header of every table ``show``
    prints for the examples (a DGX with NICs, a B300 with priority cores, a CXL host with
    tiers, a GB200) is explained there, and so are both lines about cores and what the
    matrix says of NVLink."""
    import itertools

    page = " ".join((ROOT / "docs" / "reading.rst").read_text().split())
    missing = []
    for example in ("dgx-h100", "dgx-b300", "cxl", "gb200"):
        lines = _show("--example", example).splitlines()
        for title, header in itertools.pairwise(lines):
            if title[:1].isupper() and header.startswith("  "):
                for column in re.split(r"\s{2,}", header.strip()):
                    if f"``{column}``" not in page:
                        missing.append(f"{example}: {title.split(' (')[0]}: {column}")
    assert not missing, missing
    one = _show("--example", "dgx-h100")
    assert "cores: one kind: no file tells them apart" in one
    assert "``cores: one kind: no file tells them apart (...)``" in page
    (kinds,) = [ln for ln in _show("--example", "dgx-b300").splitlines() if "of node 0:" in ln]
    source = re.search(r"kinds by (\S+):", kinds)
    assert source and f"``{source.group(1)}``" in page, kinds
    values = re.findall(r"\((\d+)\)", kinds)
    assert len(values) == 2, kinds
    assert f"a ``highest_perf`` of {values[0]}, the standard ones {values[1]}" in page
    matrix = _show("--input", str(ROOT / "tests" / "data" / "hwloc" / "nvidiaDGX2.xml"), "--matrix")
    assert "NVLinkBandwidth" in matrix
    assert "``NVLinkBandwidth``" in page and "does not appear in any file" not in page


def test_the_torchrun_and_ray_pages_show_the_whole_job_and_how_ray_is_bound() -> None:
    """Issue 46: torchrun.rst had no "see the whole job" block and ray.rst was one
    sentence.  torchrun.rst shows the report from inside (``NUMABIND_REPORT=1``) and from
    outside (``check --store``, ``check --all``); ray.rst has an example the Ray stage runs
    (``ray.init(num_gpus=...)``, actors bound to their GPU's node, checked by the example's
    own assert) and ``check --ray``.  The commands' flags are checked above, against the
    CLI."""
    import sys

    sys.path.insert(0, str(ROOT / "docs" / "_ext"))
    import doc_examples

    blocks = doc_examples.all_blocks()
    torchrun = "\n".join(b.text for b in blocks if "launchers/torchrun.rst" in b.where)
    for needed in ("NUMABIND_REPORT=1 torchrun", "numabind check --store", "numabind check --all"):
        assert needed in torchrun, needed
    assert "See the whole job" in (ROOT / "docs" / "launchers" / "torchrun.rst").read_text()
    ray = [b for b in blocks if "launchers/ray.rst" in b.where]
    (run,) = [b for b in ray if b.kind == "run"]
    assert run.ray and run.env.get("NUMABIND_RAY") == "1" and run.on == "two-nodes"
    assert "ray.init(num_gpus=" in run.text and "assert cpus == [gpu]" in run.text
    assert any("numabind check --ray" in b.text for b in ray)


def test_the_comparison_has_the_new_features_and_the_engines_with_sources() -> None:
    """Issue 46: comparison.rst had no row for the NIC, memory tiers, priority cores or
    the job report, and no column for rrun, vLLM, SGLang or TRT-LLM.  The feature table
    has them; every numabind cell names test files that exist, and every other tool's
    cell names its source (a file of its code, a pull request or issue) or says that none
    was found."""
    page = (ROOT / "docs" / "comparison.rst").read_text()
    assert "Feature by feature\n" in page, "no table of features by tool"
    table = page.split("Feature by feature\n", 1)[1].split("\nWhere numabind", 1)[0]
    rows: list[list[str]] = []
    for line in table.split(".. list-table::", 1)[1].splitlines():
        if line.startswith("   * - "):
            rows.append([line[len("   * - ") :]])
        elif line.startswith("     - "):
            rows[-1].append(line[len("     - ") :])
        elif line.startswith("       ") and rows:
            rows[-1][-1] += " " + line.strip()
    header, *body = rows
    assert header[:2] == ["feature", "numabind"], header
    for tool in ("rrun", "torchrun", "vLLM", "SGLang", "TRT-LLM"):
        assert any(h.startswith(tool) for h in header), tool
    features = " / ".join(r[0] for r in body)
    for feature in ("NIC", "memory tiers", "priority cores", "job"):
        assert feature in features, feature
    for row in body:
        assert len(row) == len(header), row
        tests = re.findall(r"``(tests/[\w/]+\.py)``", row[1])
        assert tests and all((ROOT / t).is_file() for t in tests), row[1]
        for cell in row[2:]:
            cited = re.search(r"[\w-]+#\d+|``[\w/.-]+\.(?:py|cpp|md)``", cell)
            assert cited or cell.startswith("none found"), f"{row[0]}: {cell}"
