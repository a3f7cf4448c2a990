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
