"""The architecture, checked: no import cycle anywhere, counting the imports that run late
(inside functions) and those only type checkers follow (``TYPE_CHECKING``); every module
says why it exists; the startup path imports only what it needs."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "numabind"


def _module_name(path: Path) -> str:
    if path.is_relative_to(PACKAGE):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = [p for p in rel.parts if p != "__init__"]
        return ".".join(["numabind", *parts])
    return f"{path.parent.name}/{path.stem}"


def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a ``from ... import`` names, from the importing package."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Every module ``path`` imports, anywhere in its body (functions and TYPE_CHECKING
    blocks included), as absolute names; ``from . import x`` names the submodule x (and
    the package only for a name that is not a submodule, such as ``__version__``)."""
    tree = ast.parse(path.read_text(), str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _from_target(node, package)
            subs = [f"{target}.{a.name}" for a in node.names]
            out.update(s for s in subs if s in modules)
            if node.module is not None or any(s not in modules for s in subs):
                out.add(target)
    local_top = (
        {p.stem for p in path.parent.glob("*.py")} if not path.is_relative_to(PACKAGE) else set()
    )
    resolved = set()
    for name in out:
        if name.split(".")[0] in START_MODULES:  # the top-level start modules, from anywhere
            resolved.add(f"src/{name.split('.')[0]}")
        elif name.split(".")[0] in local_top:  # benchmarks/_common, scripts' helpers
            resolved.add(f"{path.parent.name}/{name.split('.')[0]}")
        else:
            resolved.add(name)
    return resolved


# the modules beside the package that the startup hook runs before numabind is loaded
START_MODULES = frozenset(p.stem for p in (ROOT / "src").glob("*.py"))


def _graph() -> dict[str, set[str]]:
    files = [
        *(ROOT / "src").glob("*.py"),
        *PACKAGE.rglob("*.py"),
        *(ROOT / "benchmarks").glob("*.py"),
        *(ROOT / "scripts").glob("*.py"),
    ]
    names = {_module_name(f): f for f in files}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        graph[name] = {n for n in _imports(path, set(names)) if n in names and n != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                found.append([*stack[stack.index(m) :], m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return found


def test_the_graph_is_read() -> None:
    g = _graph()
    assert "numabind._apply" in g["numabind._startup"], "in-function imports are counted"
    assert "numabind._topology" in g["numabind._plan"], "TYPE_CHECKING imports are counted"
    assert "benchmarks/_common" in g["benchmarks/startup"]


def test_no_import_cycle_anywhere() -> None:
    cycles = _cycles(_graph())
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_cycles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_start_modules_are_counted_and_a_circle_through_them_fails() -> None:
    """The start modules are in the graph, edges into them from the package are seen, and
    a package module importing the start module back (the circle of a50e42a) is found."""
    g = _graph()
    assert {"src/_numabind_base", "src/_numabind_start"} <= set(g)
    assert "src/_numabind_base" in g["numabind._cache"], "imports of the start modules count"
    assert "numabind._startup" in g["src/_numabind_start"], "its hand-over counts"
    circled = {k: set(v) for k, v in g.items()}
    circled["numabind._sysfs"].add("src/_numabind_start")  # what _sysfs did on a50e42a
    assert _cycles(circled), "a circle through a start module must fail the layout test"


def test_the_start_modules_keep_their_layers() -> None:
    """``_numabind_base`` is a leaf (nothing of numabind's); no package module imports the
    start module ``_numabind_start`` (it imports the package only to hand over)."""
    g = _graph()
    assert not {m for m in g["src/_numabind_base"] if m in g}, g["src/_numabind_base"]
    importers = [m for m, deps in g.items() if "src/_numabind_start" in deps]
    assert importers == ["numabind._site.sitecustomize"], importers  # a hook form of its own


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: p.name)
def test_every_module_says_why_it_exists(path: Path) -> None:
    doc = ast.get_docstring(ast.parse(path.read_text()))
    assert doc and len(doc) > 60, f"{path.name} has no docstring worth the name"


def test_leaf_modules_stay_leaves() -> None:
    """_sysfs and _output are imported by everything, including the .pth's first steps:
    they import nothing of numabind's but each other."""
    g = _graph()
    base = "src/_numabind_base"  # the start path's leaf, which imports nothing at all
    assert g["numabind._sysfs"] <= {"numabind._errors", base}
    assert g["numabind._errors"] == set()
    assert g["numabind._output"] <= {"numabind._sysfs", base}
    assert g["numabind._model"] <= {base}


def test_no_test_double_ships_in_src() -> None:
    text = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    for name in ("RecordedNvml", "nvml_osdevs", "recorded_from_hwloc"):
        assert name not in text, f"{name} is a test double: it lives in tests/"


def test_no_stale_references_in_docstrings() -> None:
    text = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    for stale in ("docs/how-it-works.md", "../shared/", "tests/data/nvml-"):
        assert stale not in text, stale
    assert sys.version_info >= (3, 10)


# The pipeline, lowest first: a module may import its own layer and the ones before it,
# never one after.  docs/how-it-works.rst draws the same map.  A new module must be placed.
LAYERS: dict[str, tuple[str, ...]] = {
    "leaf": ("_errors", "_sysfs", "_output", "_model", "_text"),
    "read the machine": (
        "capture",
        "_sources",
        "_roots",
        "capture._tarroot",
        "capture._hwloc",
        "capture._capture",
        "_topology",
        "capture._examples",
        "_dra",
        "_facts",
        "_rdma",
    ),
    "who am I": ("_environ", "_devices", "_nvml", "_advice"),
    "plan": ("_plan", "_cache", "_nics"),
    "bind": (
        "memory",
        "_kernel",
        "_pin",
        "_range",
        "_apply",
        "_registry",
        "_threads",
        "_guard",
        "_handback",
        "memory._driver",
        "memory._memory",
        "_limits",
        "_transports",
        "_binders",
    ),
    "entry points": (
        "check",
        "_startup",
        "_api",
        "_children",
        "torch",
        "ray",
        "vllm",
        "check._job",
        "check._inspect",
        "check._store",
        "check._report",
        "check._isolated",
        "check._raydriver",
        "_replay",
        "",
        "_site.sitecustomize",
    ),
    "cli": ("cli", "__main__"),
}


def _layer(module: str) -> int | None:
    names = list(LAYERS)
    rest = module.removeprefix("numabind").removeprefix(".")
    for i, layer in enumerate(names):
        for m in LAYERS[layer]:
            if rest == m or (m and rest.startswith(m + ".")):
                return i
    return None


def test_every_module_has_its_place_in_the_pipeline() -> None:
    unplaced = [m for m in _graph() if m.startswith("numabind") and _layer(m) is None]
    assert not unplaced, f"place these in LAYERS (and docs/how-it-works.rst): {unplaced}"


def test_no_layer_imports_a_later_one() -> None:
    """read the machine -> who am I -> plan -> bind -> entry points -> cli: the machine
    layer never imports the planner, the planner never the binder, nothing imports cli."""
    names = list(LAYERS)
    wrong = []
    for module, imports in _graph().items():
        here = _layer(module)
        if here is None:
            continue
        for target in imports:
            there = _layer(target)
            if there is not None and there > here:
                wrong.append(f"{module} ({names[here]}) imports {target} ({names[there]})")
    assert not wrong, wrong


def test_the_layer_rule_can_fail() -> None:
    assert _layer("numabind._sources") == 1 and _layer("numabind.cli._show") == 6
    assert _layer("numabind") == 5 and _layer("numabind._nope") is None


def test_the_module_map_in_the_docs_is_this_one() -> None:
    doc = (ROOT / "docs" / "how-it-works.rst").read_text()
    for layer, modules in LAYERS.items():
        assert layer in doc, layer
        for m in modules:
            if m and not m.startswith("_site"):
                assert f"``{m}``" in doc, f"{m} ({layer}) is not on docs/how-it-works.rst"


WINGS = ("numabind.capture", "numabind.check", "numabind.memory")


def _module_level_imports(path: Path) -> set[str]:
    """What a module imports when it is imported: its top-level statements (and those in
    top-level ``try``/``if`` blocks), not functions' bodies and not ``TYPE_CHECKING``."""
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
                    walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)
                for h in node.handlers:
                    walk(h.body)
            elif isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                target = _from_target(node, package)
                out.add(target)
                out.update(f"{target}.{a.name}" for a in node.names)

    walk(ast.parse(path.read_text(), str(path)).body)
    return out


def test_the_core_imports_no_wing() -> None:
    """capture/, check/ and memory/ hold what a rank never loads at start: no module of
    the core (anything outside them and the CLI) imports one when it is imported; a door
    into a wing is an import inside the function that needs it."""
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if name.startswith((*WINGS, "numabind.cli")) or name == "numabind.__main__":
            continue
        for target in _module_level_imports(path):
            if target.startswith(WINGS):
                wrong.append(f"{name} imports {target} when imported")
    assert not wrong, wrong


def test_the_wing_rule_can_fail(tmp_path: Path) -> None:
    core = tmp_path / "core.py"
    core.write_text("from numabind.check import _job\n\ndef door():\n    import numabind.memory\n")
    assert _module_level_imports(core) >= {"numabind.check", "numabind.check._job"}
    assert not any(t.startswith("numabind.memory") for t in _module_level_imports(core))
