"""Model values as text: the one codec of numabind's cache files.

A machine file holds every answer a reading gave (numabind._cache), an answers file the
plan a rank was bound by (numabind._replay); both are lines of space-separated tokens
that :func:`encode` writes and :func:`decode` reads back, for None, bools, numbers,
strings (escaped by ``_numabind_base.escape``), sets of ints (the kernel's list form),
tuples and records of the classes a reader names, and nothing else (``ValueError``).
"""

from __future__ import annotations

import _numabind_base as base

from . import _sysfs
from ._model import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import TypeVar

    R = TypeVar("R", bound=Record)


def encode(value: object, records: Mapping[str, type[Record]]) -> str:
    """A value an answer holds (None, bool, int, float, str, a set of ints, a tuple, a
    record) as space-separated tokens; :func:`decode` reads them back."""
    if value is None:
        return "~"
    if isinstance(value, bool):
        return "T" if value else "F"
    if isinstance(value, int):
        return f"i{value}"
    if isinstance(value, float):
        return f"f{value!r}"
    if isinstance(value, str):
        return "s" + base.escape(value)
    if isinstance(value, frozenset):
        return "c" + _sysfs.format_cpulist(value)
    if isinstance(value, (tuple, list)):
        return " ".join(["(", *(encode(v, records) for v in value), ")"])
    if isinstance(value, Record) and type(value).__name__ in records:
        fields = (encode(getattr(value, n), records) for n in value._fields)
        return " ".join([f"R{type(value).__name__}", "(", *fields, ")"])
    raise TypeError(f"not cached: {type(value).__name__}")


class Tokens:
    """The tokens of one line, read in order (``ValueError`` past the end)."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.at = 0

    def next(self) -> str:
        if self.at >= len(self.tokens):
            raise ValueError("the line ends inside a value")
        self.at += 1
        return self.tokens[self.at - 1]

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    @property
    def done(self) -> bool:
        return self.at >= len(self.tokens)


def decode(tokens: Tokens, records: Mapping[str, type[Record]]) -> object:
    """The value :func:`encode` wrote (``ValueError`` on anything else)."""
    token = tokens.next()
    head, rest = token[:1], token[1:]
    if token == "~":
        return None
    if token in ("T", "F"):
        return token == "T"
    if head == "i":
        return int(rest)
    if head == "f":
        return float(rest)
    if head == "s":
        return base.unescape(rest)
    if head == "c":
        return _set(rest)
    if token == "(":
        return tuple(_items(tokens, records))
    if head == "R":
        cls = records.get(rest)
        if cls is None or tokens.next() != "(":
            raise ValueError(f"not a cached record: {rest[:40]!r}")
        values = _items(tokens, records)
        if len(values) != len(cls._fields):
            raise ValueError(f"{rest}: {len(values)} fields, not {len(cls._fields)}")
        return cls(**dict(zip(cls._fields, values)))
    raise ValueError(f"not a value: {token[:40]!r}")


def _items(tokens: Tokens, records: Mapping[str, type[Record]]) -> list[object]:
    """The values up to the closing parenthesis (consumed)."""
    items: list[object] = []
    while tokens.peek() != ")":
        items.append(decode(tokens, records))
    tokens.next()
    return items


def _set(text: str) -> frozenset[int]:
    found = _SETS.get(text)
    if found is None:
        found = base.parse_cpulist(text, _sysfs.MAX_CPUS)
        if found is None:
            raise ValueError(f"a bad set {text[:40]!r}")
        if len(_SETS) < 1 << 16:
            _SETS[text] = found  # one object per distinct list, as the live reader keeps
    return found


# the sets decoded so far, by their text: a machine repeats the same lists (every CPU of a
# core, every GPU of a node), and a crafted file repeating a 16,384-CPU list costs one set
_SETS: dict[str, frozenset[int]] = {}


def all_records() -> dict[str, type[Record]]:
    """Every record class loaded, by name: what a replayed answer's plan may hold."""
    out: dict[str, type[Record]] = {}
    todo = list(Record.__subclasses__())
    while todo:
        cls = todo.pop()
        out.setdefault(cls.__name__, cls)
        todo.extend(cls.__subclasses__())
    return out


def decode_record(text: str, cls: type[R]) -> R:
    """The one record of ``cls`` a line holds (a replayed answer's plan, which
    numabind._replay wrote), decoded by every record class loaded (``ValueError`` when the
    line is not exactly one)."""
    tokens = Tokens(text.split(" "))
    value = decode(tokens, all_records())
    if not isinstance(value, cls) or not tokens.done:
        raise ValueError(f"not a {cls.__name__}")
    return value
