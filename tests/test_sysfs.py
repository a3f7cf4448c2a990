"""The kernel's CPU-list and mask formats."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numabind._sysfs import (
    ReadError,
    clean_line,
    format_cpulist,
    listdir,
    parse_cpulist,
    parse_cpumask,
    parse_int,
    read_bytes,
    read_opt,
    read_text,
)


@given(st.frozensets(st.integers(0, 16383)))
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


# --- hostile input: bounded parsers, non-blocking regular-file reads -----------------------


@pytest.mark.parametrize(
    "text",
    ["0-99999999", "16384", "0-3,99999", "²", "1" * 5000, "0-" + "9" * 5000, "0-7:" + "9" * 50],
)
def test_parse_cpulist_refuses_numbers_beyond_the_ceiling(text: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_cpulist(text)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_parse_cpulist_ceiling_is_a_parameter() -> None:
    assert parse_cpulist("0-3", limit=4) == frozenset(range(4))
    with pytest.raises(ValueError, match="beyond the ceiling of 4"):
        parse_cpulist("4", limit=4)


@pytest.mark.parametrize("text", ["0xzz", "123456789", "-1", "f" * 5000, ",".join(["1"] * 2000)])
def test_parse_cpumask_refuses_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_cpumask(text)


def test_parse_int_refuses_long_and_unicode() -> None:
    assert parse_int("9" * 5000) is None and parse_int("²") is None and parse_int("٣") is None


def test_read_refuses_a_fifo_without_blocking(tmp_path) -> None:  # type: ignore[no-untyped-def]
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ReadError, match="not a regular file"):
        read_bytes(str(fifo))  # O_NONBLOCK: returns at once, then fstat refuses it
    assert read_opt(str(fifo)) is None


def test_read_refuses_devices_and_caps_size(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ReadError):
        read_bytes("/dev/zero")
    big = tmp_path / "big"
    big.write_bytes(b"1" * 5000)
    with pytest.raises(ReadError, match="larger than 4096"):
        read_bytes(str(big), 4096)
    assert read_bytes(str(big), 5000) == b"1" * 5000


def test_listdir_is_capped(tmp_path) -> None:  # type: ignore[no-untyped-def]
    for i in range(50):
        (tmp_path / str(i)).touch()
    assert len(listdir(str(tmp_path), cap=10)) == 10


def test_clean_line_never_splits_a_line() -> None:
    assert clean_line("a\nb\x1b[31mc") == "a b [31mc"
    assert len(clean_line("x" * 10000, 100)) < 120
