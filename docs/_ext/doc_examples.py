"""Every code block of the documentation, found and classified: what the tests run and how,
and what cannot run here and why.

The blocks are those of every ``docs/**/*.rst`` page, of the README, and of the docstrings
autodoc renders (the public names of ``numabind`` and the ``numabind.torch`` /
``numabind.ray`` modules).  A block is a literal block (a paragraph ending in ``::``), a
``code-block`` directive, a ``literalinclude`` (the gallery's outputs, made by the build
from the code) or, in the README, a fenced block.  Each one carries a marker just before
it, an RST comment (``<!-- ... -->`` in the README)::

    .. example: run                         (a shell or Python block, run as written)
    .. example: run on dgx-h100             (on that example machine, gathered as a sysroot)
    .. example: run with torch, exit 1      (in the torch stage; the exit status expected)
    .. example: run on two-nodes, with ray, env NUMABIND_RAY=1   (in the Ray stage)
    .. example: run by scripts/readme-first-command
    .. example: measured by benchmarks/startup_cost.py
    .. example: not run: needs srun (a Slurm cluster)

``tests/test_doc_examples.py`` runs the ``run`` blocks (a shell block line by line with
``bash -e``, ``$ `` lines as a transcript whose output is compared, ``...`` matching any
lines; a Python block as a script, or with doctest where it has ``>>>``); the Sphinx
extension ``numabind_examples`` fails the docs build on a block without a marker and
prints how many are marked.  A block that runs on an example machine or with a variable
set gets a visible "Try it" line in the built pages (:func:`try_it`, rendered by
``numabind_examples`` in place of the comment, which HTML does not show): the commands that
set up what the block runs on, which are the ones the tests run before it.  This module
imports nothing but the standard library (and numabind, for the docstrings): both use it.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent
ROOT = DOCS.parent
MARKER = re.compile(r"^\s*(?:\.\.|<!--)\s*example:\s*(.*?)\s*(?:-->)?\s*$")
KINDS = ("run", "measured", "not run")


@dataclass
class Block:
    """One code block: where it is, its language, its text, and its marker parsed."""

    where: str  # "docs/cli.rst:42" or "numabind.host_buffer (docstring)"
    language: str  # bash, python, text, yaml, literal, include
    text: str
    marker: str | None
    kind: str | None = None  # run, measured, not run (None: no marker)
    on: str | None = None  # the example machine to run on
    torch: bool = False
    ray: bool = False
    exit: int = 0
    by: str | None = None  # run by another stage's script
    reason: str | None = None  # not run: why
    env: dict[str, str] = field(default_factory=dict)

    @property
    def shell(self) -> bool:
        return self.language in ("bash", "sh", "shell", "console") or (
            self.language == "literal" and not _looks_python(self.text)
        )

    @property
    def python(self) -> bool:
        return self.language in ("python", "pycon") or (
            self.language == "literal" and _looks_python(self.text)
        )


def _looks_python(text: str) -> bool:
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return first.startswith(("import ", "from ", "def ", "with ", ">>> ", "ray.", "numabind."))


def parse_marker(block: Block) -> Block:
    """Fill the block's fields from its marker; a marker that does not parse leaves
    ``kind`` None (the docs build names it)."""
    text = block.marker
    if text is None:
        return block
    if text.startswith("not run:"):
        reason = text[len("not run:") :].strip()
        if reason:
            block.kind, block.reason = "not run", reason
        return block
    if text.startswith("measured by "):
        block.kind, block.by = "measured", text[len("measured by ") :].strip()
        return block
    if text.startswith("run by "):
        block.kind, block.by = "run", text[len("run by ") :].strip()
        return block
    if text != "run" and not text.startswith(("run ", "run,")):
        return block
    for clause in (c.strip() for c in text[3:].split(",")):
        if not clause:
            continue
        if clause.startswith("on "):
            block.on = clause[3:].strip()
        elif clause == "with torch":
            block.torch = True
        elif clause == "with ray":
            block.ray = True
        elif clause.startswith("exit ") and clause[5:].strip().isdigit():
            block.exit = int(clause[5:])
        elif clause.startswith("env ") and "=" in clause:
            key, _, value = clause[4:].partition("=")
            block.env[key.strip()] = value.strip()
        else:
            return block  # an unknown clause: not a marker numabind reads
    block.kind = "run"
    return block


def marker_of_comment(text: str) -> str | None:
    """The marker an RST comment's text carries (``example: run on two-nodes``), or None
    for any other comment: what the docs build sees where the page has ``.. example:``."""
    m = MARKER.match(".. " + text.strip().splitlines()[0]) if text.strip() else None
    return m.group(1) if m else None


def try_it(block: Block) -> str | None:
    """The shell line a reader runs first to try ``block`` as the tests run it: gather its
    example machine into a fresh folder and make numabind read it as this one, and set the
    variables its marker names; None for a block that needs neither."""
    if block.kind != "run" or block.by is not None or not (block.on or block.env):
        return None
    steps = []
    exports = []
    if block.on:
        steps.append(
            f'd=$(mktemp -d)/{block.on} && numabind gather --example {block.on} "$d" >/dev/null'
        )
        exports.append('NUMABIND_SYSROOT="$d"')
    exports += [f"{k}={v}" for k, v in block.env.items()]
    steps.append("export " + " ".join(exports))
    return " && ".join(steps)


def try_it_words(block: Block) -> str | None:
    """The visible line's words after "Try it" and before its command (plain text: the
    extension renders them, then the command as code)."""
    if try_it(block) is None:
        return None
    parts = []
    if block.on:
        parts.append(
            f"on the {block.on} example machine (numabind reads it as this one; the binding "
            "itself is this kernel's)"
        )
    if block.env:
        parts.append("with " + ", ".join(f"{k}={v}" for k, v in block.env.items()))
    needs = " (needs torch)" if block.torch else " (needs Ray)" if block.ray else ""
    return ", ".join(parts) + needs + ": run this first, then the example:"


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _body(lines: list[str], start: int, base: int) -> tuple[str, int]:
    """The indented body after line ``start`` (options of a directive skipped)."""
    i = start + 1
    body: list[str] = []
    while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
        body.append(lines[i])
        i += 1
    while body and (not body[0].strip() or body[0].strip().startswith(":")):
        body.pop(0)
    text = "\n".join(body).rstrip()
    depth = min((_indent(x) for x in text.splitlines() if x.strip()), default=0)
    return "\n".join(x[depth:] for x in text.splitlines()), i


def _marker_before(lines: list[str], i: int) -> str | None:
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    if j >= 0:
        m = MARKER.match(lines[j])
        if m:
            return m.group(1)
    return None


def rst_blocks(text: str, where: str) -> list[Block]:
    """The code blocks of one reStructuredText text (a page or a docstring)."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        directive = re.match(r"^\.\.\s+(code-block|code|sourcecode)::\s*(\S*)", stripped)
        include = re.match(r"^\.\.\s+literalinclude::\s*(\S+)", stripped)
        literal = stripped.endswith("::") and not stripped.startswith("..")
        if not (directive or include or literal):
            i += 1
            continue
        marker = _marker_before(lines, i)
        if include:
            _, end = _body(lines, i, _indent(line))
            block = Block(f"{where}:{i + 1}", "include", include.group(1), marker)
            if marker is None and include.group(1).startswith("_gallery/"):
                # made at every build by numabind_gallery, from the code itself
                block.marker = "run by docs/_ext/numabind_gallery.py"
            out.append(block)
            i = end
            continue
        body, end = _body(lines, i, _indent(line))
        if not body.strip():
            i = end
            continue
        if directive:
            language = directive.group(2) or "literal"
        else:
            language = "literal"
            # "Paragraph::" ending a paragraph: the marker sits before that paragraph
            j = i
            while j > 0 and lines[j - 1].strip():
                j -= 1
            marker = marker if j == i else _marker_before(lines, j)
        out.append(Block(f"{where}:{i + 1}", language, body, marker))
        i = end
    return [parse_marker(b) for b in out]


def markdown_blocks(text: str, where: str) -> list[Block]:
    """The fenced blocks of a Markdown text (the README)."""
    lines = text.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        body = "\n".join(lines[i + 1 : end])
        out.append(
            Block(f"{where}:{i + 1}", m.group(1) or "literal", body, _marker_before(lines, i))
        )
        i = end + 1
    return [parse_marker(b) for b in out]


def docstring_objects() -> list[tuple[str, object]]:
    """The objects whose docstrings the API page renders (autodoc): the public names,
    their members, and the two integration modules with the members api.rst lists."""
    import numabind
    import numabind.ray
    import numabind.torch

    api = (DOCS / "api.rst").read_text()
    out: list[tuple[str, object]] = []
    for name in numabind.__all__:
        if name == "__version__":
            continue
        obj = getattr(numabind, name)
        out.append((f"numabind.{name}", obj))
        if inspect.isclass(obj):
            for member, value in vars(obj).items():
                if isinstance(value, (classmethod, staticmethod)):
                    value = value.__func__  # Machine.here, from_capture, ...
                if not member.startswith("_") and (callable(value) or isinstance(value, property)):
                    target = value.fget if isinstance(value, property) else value
                    out.append((f"numabind.{name}.{member}", target))
    for module in (numabind.torch, numabind.ray):
        out.append((module.__name__, module))
        listed = re.search(rf"automodule:: {module.__name__}\n\s+:members: (.*)", api)
        for member in listed.group(1).split(", ") if listed else []:
            out.append((f"{module.__name__}.{member.strip()}", getattr(module, member.strip())))
    return out


def docstring_blocks() -> list[Block]:
    out: list[Block] = []
    for name, obj in docstring_objects():
        doc = inspect.getdoc(obj) or ""
        if "::" in doc:
            out += rst_blocks(doc, f"{name} (docstring)")
    return out


def all_blocks() -> list[Block]:
    """Every block of the documentation: pages, README, docstrings."""
    out: list[Block] = []
    for page in sorted(DOCS.rglob("*.rst")):
        if "_build" in page.parts or "_gallery" in page.parts:
            continue
        out += rst_blocks(page.read_text(), str(page.relative_to(ROOT)))
    out += markdown_blocks((ROOT / "README.md").read_text(), "README.md")
    out += docstring_blocks()
    return out


def summary(blocks: list[Block]) -> str:
    """One line: how many blocks are run, and how many are marked, by reason."""
    run = sum(b.kind == "run" for b in blocks)
    marked = [b for b in blocks if b.kind in ("not run", "measured")]
    return (
        f"doc examples: {len(blocks)} code blocks, {run} run by the tests "
        f"(tests/test_doc_examples.py), {len(marked)} marked as not run here"
    )
