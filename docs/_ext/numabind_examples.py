"""Sphinx extension: no code block goes unrun without saying why.

At every build it finds the documentation's code blocks (:mod:`doc_examples`: the pages,
the README and the docstrings autodoc renders), fails the build (a warning, an error
under ``-W``) for a block that carries no marker, or a marker it does not read, and prints
how many blocks the tests run and how many are marked as not run here, with the reasons.
It also counts the literal blocks of every page as Sphinx parsed them: a page with more
than the finder saw has a block of a form the finder does not know, which would go unrun
and unmarked, and fails the build as well.  ``tests/test_doc_examples.py`` runs the blocks.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import doc_examples

_FOUND: dict[str, int] = {}


def _docname(where: str) -> str | None:
    path = where.split(":", 1)[0]
    if path.startswith("docs/") and path.endswith(".rst"):
        return path[len("docs/") : -len(".rst")]
    if "(docstring)" in where:
        return "api"
    return None


def check(app: Any) -> None:
    from sphinx.util import logging

    log = logging.getLogger(__name__)
    blocks = doc_examples.all_blocks()
    for b in blocks:
        if b.kind is None:
            what = f"marker {b.marker!r} is not one numabind reads" if b.marker else "no marker"
            log.warning(
                f"{b.where}: a code block neither run nor marked ({what}): put "
                "'.. example: run' (or 'not run: WHY') before it (docs/_ext/doc_examples.py)"
            )
    counts = Counter(_docname(b.where) for b in blocks)
    _FOUND.clear()
    _FOUND.update({k: v for k, v in counts.items() if k is not None})
    reasons = Counter(
        b.reason or f"measured by {b.by}" for b in blocks if b.kind in ("not run", "measured")
    )
    print(doc_examples.summary(blocks))
    for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"  {n} x {reason}")


def count(app: Any, doctree: Any) -> None:
    from docutils import nodes
    from sphinx.util import logging

    docname = app.env.docname
    seen = sum(1 for _ in doctree.findall(nodes.literal_block))
    found = _FOUND.get(docname, 0)
    if seen > found:
        logging.getLogger(__name__).warning(
            f"docs/{docname}.rst: Sphinx sees {seen} literal blocks, the examples finder "
            f"{found}: a block of a form docs/_ext/doc_examples.py does not know would go "
            "unrun and unmarked"
        )


def visible_markers(app: Any, doctree: Any) -> None:
    """Replace each marker comment that names an example machine or a variable with a
    paragraph a reader sees (class ``numabind-try-it``): "Try it on the two-nodes example
    machine ...: ``d=$(mktemp -d)/two-nodes && numabind gather ...``"."""
    from docutils import nodes

    for comment in list(doctree.findall(nodes.comment)):
        marker = doc_examples.marker_of_comment(comment.astext())
        if marker is None:
            continue
        block = doc_examples.parse_marker(doc_examples.Block("", "", "", marker))
        line, words = doc_examples.try_it(block), doc_examples.try_it_words(block)
        if line is None or words is None:
            continue
        para = nodes.paragraph(classes=["numabind-try-it"])
        para += [nodes.strong(text="Try it"), nodes.Text(f" {words} "), nodes.literal(text=line)]
        comment.replace_self(para)


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", check)
    app.connect("doctree-read", count)
    app.connect("doctree-read", visible_markers)
    return {"version": "1", "parallel_read_safe": True}
