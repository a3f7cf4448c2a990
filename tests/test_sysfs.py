"""The kernel's CPU-list and mask formats."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numabind._sysfs import format_cpulist, parse_cpulist, parse_cpumask, parse_int, read_text


@given(st.frozensets(st.integers(0, 4096)))
def test_cpulist_round_trips(cpus: frozenset[int]) -> None:
    assert parse_cpulist(format_cpulist(cpus)) == cpus


@given(st.frozensets(st.integers(0, 2048)))
def test_cpumask_matches_cpulist(cpus: frozenset[int]) -> None:
    words = []
    top = max(cpus, default=0) // 32 + 1
    for w in range(top):
        v = sum(1 << (c - 32 * w) for c in cpus if 32 * w <= c < 32 * (w + 1))
        words.append(f"{v:08x}")
    assert parse_cpumask(",".join(reversed(words))) == cpus


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", set()),
        ("0", {0}),
        ("0-3,8", {0, 1, 2, 3, 8}),
        ("0-7:2", {0, 2, 4, 6}),
        (" 1 , 3-4 \n", {1, 3, 4}),
    ],
)
def test_parse_cpulist(text: str, cpus: set[int]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text", ["a", "3-1", "1-", "0-3:0", "-2"])
def test_parse_cpulist_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(text)


def test_cpumask_formats() -> None:
    assert parse_cpumask("0000,00000000,0000ffff") == frozenset(range(16))
    assert parse_cpumask("00000003,") == frozenset({32, 33})  # hwloc: empty word means 0
    assert parse_cpumask("ff000000") == frozenset(range(24, 32))


def test_parse_int() -> None:
    assert parse_int("0x10de") == 0x10DE and parse_int("-1") == -1 and parse_int("010") == 10
    assert parse_int("zz") is None and parse_int(None) is None and parse_int("") is None


def test_read_text_fallback(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert read_text(str(tmp_path / "missing"), None) is None
    with pytest.raises(OSError):
        read_text(str(tmp_path / "missing"))
