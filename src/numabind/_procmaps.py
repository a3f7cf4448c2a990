"""A process's memory as the kernel reports it: /proc/PID/maps and /proc/PID/numa_maps.

numabind only ever moves and measures *private anonymous* memory (heap, anonymous mmaps,
thread stacks).  File-backed pages (shared libraries, the interpreter) and shared mappings
are used by every rank on the machine: moving them towards one rank's node would have the
ranks on other nodes pull them back and forth.

Both files are read with a cap (a process with a million mappings has a numa_maps of
hundreds of MiB) and parsed defensively: a line that does not parse is skipped.
"""

from __future__ import annotations

import os

from . import _sysfs
from ._model import Record

MAPS_CAP = 256 << 20
_SPECIAL = ("[vdso]", "[vvar]", "[vsyscall]", "[vectors]", "[sigpage]", "[uprobes]")

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator


class Region(Record):
    """One private anonymous mapping and its resident pages per node (in its own page
    size; ``anon`` pages counted as the kernel's ``anon=``)."""

    start: int
    end: int
    name: str
    page_size: int
    pages: dict[int, int]
    mapmax: int = 1  # the most processes mapping one of its pages (> 1: some are shared)

    def __hash__(self) -> int:
        return hash((self.start, self.end))


def _read(path: str) -> str:
    return _sysfs.read_bytes(path, MAPS_CAP).decode("utf-8", "replace")


def _hex(text: str) -> int | None:
    if not text or len(text) > 16:
        return None
    try:
        return int(text, 16)
    except ValueError:
        return None


def _node_counts(fields: list[str]) -> Iterator[tuple[int, int]]:
    for f in fields:
        if f[:1] == "N" and "=" in f:
            node, _, count = f[1:].partition("=")
            if node.isdigit() and count.isdigit() and len(node) < 5 and len(count) < 16:
                yield int(node), int(count)


def private_anon_regions(pid: int | str = "self") -> list[Region]:
    """Private anonymous mappings of ``pid`` with their resident pages per NUMA node."""
    ranges: dict[int, tuple[int, str]] = {}
    for line in _read(f"/proc/{pid}/maps").splitlines():
        fields = line.split(None, 5)
        if len(fields) < 5:
            continue
        name = fields[5].strip() if len(fields) == 6 else ""
        perms = fields[1]
        if len(perms) < 4 or perms[3] != "p":
            continue
        if name and not (name in ("[heap]", "[stack]") or name.startswith(("[anon:", "[stack:"))):
            continue
        if name in _SPECIAL:
            continue
        a, _, b = fields[0].partition("-")
        start, end = _hex(a), _hex(b)
        if start is None or end is None or end <= start:
            continue
        ranges[start] = (end, name or "[anon]")
    out: list[Region] = []
    for line in _read(f"/proc/{pid}/numa_maps").splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        start = _hex(fields[0])
        if start is None or start not in ranges or any(f.startswith("file=") for f in fields):
            continue
        page_kb = 4
        mapmax = 1
        for f in fields[2:]:
            if f.startswith("kernelpagesize_kB="):
                page_kb = _sysfs.parse_int(f.split("=", 1)[1]) or 4
            elif f.startswith("mapmax="):
                mapmax = _sysfs.parse_int(f[7:]) or 1
        end, name = ranges[start]
        out.append(
            Region(
                start=start,
                end=end,
                name=name,
                page_size=page_kb * 1024,
                pages=dict(_node_counts(fields[2:])),
                mapmax=mapmax,
            )
        )
    return out


def anon_pages_outside(nodes: frozenset[int], pid: int | str = "self") -> int:
    """Resident pages of anonymous mappings outside ``nodes``, from numa_maps alone: a cheap
    first look that lets the startup hook skip the full walk when nothing is remote."""
    count = 0
    for line in _read(f"/proc/{pid}/numa_maps").splitlines():
        if "file=" in line:
            continue
        for node, n in _node_counts(line.split()[2:]):
            if node not in nodes:
                count += n
    return count


_PAGEMAP_PRESENT = 1 << 63
_PAGEMAP_EXCLUSIVE = 1 << 56  # "page exclusively mapped" (Linux 4.2+)
PAGEMAP_BUDGET = 1 << 22  # pages looked at in all (16 GiB of 4 KiB pages; 32 MiB read)


def shared_pages(
    regions: list[Region], pid: int | str = "self", budget: int = PAGEMAP_BUDGET
) -> tuple[list[int], bool]:
    """Addresses of the resident pages that another process maps too (a fork child's
    copy-on-write pages still shared with its parent), from /proc/PID/pagemap's
    "exclusively mapped" bit, in regions whose numa_maps ``mapmax`` is above 1.  Returns
    (addresses, whether the budget cut the scan short)."""
    out: list[int] = []
    cut = False
    try:
        fd = os.open(f"/proc/{pid}/pagemap", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return out, False
    try:
        for r in regions:
            if r.mapmax <= 1 or r.page_size != 4096:
                continue  # (huge pages are not shared copy-on-write in practice)
            size = 4096
            addr = r.start
            while addr < r.end:
                n = min((r.end - addr) // size, 65536, budget)
                if n <= 0:
                    cut = addr < r.end
                    break
                budget -= n
                try:
                    data = os.pread(fd, n * 8, (addr // 4096) * 8)
                except OSError:
                    break
                for i in range(len(data) // 8):
                    word = int.from_bytes(data[i * 8 : i * 8 + 8], "little")
                    if word & _PAGEMAP_PRESENT and not word & _PAGEMAP_EXCLUSIVE:
                        out.append(addr + i * 4096)
                addr += n * size
            if budget <= 0:
                cut = True
                break
    finally:
        os.close(fd)
    return out, cut


def pages_per_node(regions: list[Region]) -> dict[int, int]:
    """Resident private anonymous memory per node, in 4 KiB page units."""
    total: dict[int, int] = {}
    for r in regions:
        factor = max(r.page_size // 4096, 1)
        for node, count in r.pages.items():
            total[node] = total.get(node, 0) + count * factor
    return dict(sorted(total.items()))


def locality(per_node: dict[int, int], nodes: frozenset[int]) -> float | None:
    """Share of pages on ``nodes`` (0..1), None when there are no pages."""
    total = sum(per_node.values())
    if total == 0:
        return None
    return sum(c for n, c in per_node.items() if n in nodes) / total
