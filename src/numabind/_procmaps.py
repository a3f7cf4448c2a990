"""A process's memory as the kernel reports it: /proc/PID/maps and /proc/PID/numa_maps.

numabind only ever moves and measures *private anonymous* memory (heap, anonymous mmaps,
thread stacks).  File-backed pages (shared libraries, the interpreter) and shared mappings
are used by every rank on the machine: moving them towards one rank's node would have the
ranks on other nodes pull them back and forth.
"""

from __future__ import annotations

from ._model import Record, _set

_SPECIAL = ("[vdso]", "[vvar]", "[vsyscall]", "[vectors]", "[sigpage]", "[uprobes]")


class Region(Record):
    """One private anonymous mapping and its resident pages per node."""

    __slots__ = ("start", "end", "name", "page_size", "pages")
    start: int
    end: int
    name: str
    page_size: int
    pages: dict[int, int]

    def __init__(
        self, start: int, end: int, name: str, page_size: int, pages: dict[int, int]
    ) -> None:
        _set(self, "start", start)
        _set(self, "end", end)
        _set(self, "name", name)
        _set(self, "page_size", page_size)
        _set(self, "pages", pages)

    def __hash__(self) -> int:
        return hash((self.start, self.end))


def _read(path: str) -> str:
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


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
        ranges[int(a, 16)] = (int(b, 16), name or "[anon]")
    out: list[Region] = []
    for line in _read(f"/proc/{pid}/numa_maps").splitlines():
        fields = line.split()
        if len(fields) < 2:
            continue
        start = int(fields[0], 16)
        if start not in ranges or any(f.startswith("file=") for f in fields):
            continue
        pages: dict[int, int] = {}
        page_kb = 4
        for f in fields[2:]:
            if f[0] == "N" and "=" in f:
                node, _, count = f[1:].partition("=")
                if node.isdigit():
                    pages[int(node)] = int(count)
            elif f.startswith("kernelpagesize_kB="):
                page_kb = int(f.split("=", 1)[1])
        end, name = ranges[start]
        out.append(Region(start, end, name, page_kb * 1024, pages))
    return out


def anon_pages_outside(nodes: frozenset[int], pid: int | str = "self") -> int:
    """Resident pages of anonymous mappings outside ``nodes``, from numa_maps alone: a cheap
    first look that lets the startup hook skip the full walk when nothing is remote."""
    count = 0
    for line in _read(f"/proc/{pid}/numa_maps").splitlines():
        if "file=" in line:
            continue
        for f in line.split()[2:]:
            if f[0] == "N" and "=" in f:
                node, _, n = f[1:].partition("=")
                if node.isdigit() and int(node) not in nodes:
                    count += int(n)
    return count


def pages_per_node(regions: list[Region]) -> dict[int, int]:
    """Resident private anonymous memory per node, in 4 KiB page units."""
    total: dict[int, int] = {}
    for r in regions:
        factor = r.page_size // 4096
        for node, count in r.pages.items():
            total[node] = total.get(node, 0) + count * factor
    return dict(sorted(total.items()))


def locality(per_node: dict[int, int], nodes: frozenset[int]) -> float | None:
    """Share of pages on ``nodes`` (0..1), None when there are no pages."""
    total = sum(per_node.values())
    if total == 0:
        return None
    return sum(c for n, c in per_node.items() if n in nodes) / total
