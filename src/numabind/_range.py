"""The range applier: a memory policy on a range of addresses, the pages already there moved
onto it, and where a range's pages are, asked of the kernel.

One implementation for everything numabind places or measures by address: the pages a
late-bound process placed before its binding (:func:`migrate_private`, called by the
process applier), host buffers and :func:`numabind.bind_range` (:mod:`numabind.memory._memory`),
the bench's buffers and ``check``'s measure of the buffers a rank listed.

* **Placing** (:class:`Mover`): ``mbind`` with ``MPOL_MF_MOVE`` over bounded batches of
  address space (1 GiB each: long migrations have stalled processes for minutes), then
  the pages it left (busy at that instant, or mbind refused) asked and moved page by page
  with ``move_pages``, within a budget of pages in all; every page that did not move is
  counted by its reason, from one table (:data:`numabind._kernel.PAGE_STATUS`).
* **Measuring** (:func:`where_many`): ``move_pages`` in query mode on a sample of each
  range's pages (every k-th page once the ranges together exceed the budget, counts
  scaled back), else, where the call is refused or sees too few pages (NUMA balancing
  unmaps resident pages for its hinting faults), one pass over ``/proc/PID/maps`` and
  ``numa_maps`` for all the ranges together: whatever a range list holds, each file is
  read once.
"""

from __future__ import annotations

import errno
import os

from . import _kernel
from ._model import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

PAGE = os.sysconf("SC_PAGESIZE")
BATCH_BYTES = 1 << 30  # address space per mbind(MPOL_MF_MOVE) call
MOVE_BATCH = 16384  # pages per move_pages call (64 MiB of 4 KiB pages)
QUERY_BUDGET = 1 << 20  # pages asked of move_pages per measurement (4 GiB of 4 KiB pages)
MOVE_BUDGET = 1 << 22  # pages looked at to move leftovers, in all (16 GiB of 4 KiB pages)


def _reason(status: int) -> str:
    return _kernel.PAGE_STATUS.get(-status) or os.strerror(-status)


# --- measuring -----------------------------------------------------------------------------------


def where(start: int, nbytes: int, pid: int = 0) -> dict[int | None, int]:
    """Pages of ``[start, start + nbytes)`` (rounded out to whole pages) per node, and
    under ``None`` those not present; see :func:`where_many`."""
    return where_many([(start, nbytes)], pid)[0]


def where_many(
    ranges: Sequence[tuple[int, int]], pid: int = 0, budget: int = QUERY_BUDGET
) -> list[dict[int | None, int]]:
    """Where the pages of each ``(start, nbytes)`` range are: ``move_pages`` in query mode
    (``pid`` 0: this process), on every k-th page when the ranges hold more than
    ``budget`` pages together (the counts scaled by k), else from numa_maps, read once for
    all the ranges (see the module docstring).  A range numa_maps does not show at all
    counts as not present."""
    spans = [_pages_of(s, n) for s, n in ranges]
    total = sum(count for _, count in spans)
    stride = max(1, -(-total // max(budget, 1)))
    out: list[dict[int | None, int] | None] = []
    refused = False
    for first, count in spans:
        found = None if refused else _query(first, count, stride, pid)
        if found is False:
            refused, found = True, None
        out.append(found if isinstance(found, dict) else None)
    missing = [i for i, found in enumerate(out) if found is None]
    if missing:
        counted = numa_maps_pages([(spans[i][0], spans[i][1] * PAGE) for i in missing], pid)
        for i, pages in zip(missing, counted):
            scale = max(PAGE // 4096, 1)
            found = {node: n // scale for node, n in (pages or {}).items()}
            found[None] = max(spans[i][1] - sum(found.values()), 0)
            out[i] = found
    return [found or {} for found in out]


def _pages_of(start: int, nbytes: int) -> tuple[int, int]:
    first = start // PAGE * PAGE
    return first, (start + max(nbytes, 0) - first + PAGE - 1) // PAGE


def _query(first: int, count: int, stride: int, pid: int) -> dict[int | None, int] | bool | None:
    """move_pages' answer for a range (see :func:`tally`); False when the call is refused
    (EPERM, ESRCH)."""
    statuses: list[int] = []
    for base in range(0, count, MOVE_BATCH * stride):
        pages = [
            first + i * PAGE for i in range(base, min(count, base + MOVE_BATCH * stride), stride)
        ]
        try:
            statuses += _kernel.move_pages(pages, None, pid)
        except OSError as err:
            if err.errno in (errno.EPERM, errno.ESRCH, errno.EACCES):
                return False
            raise
    return tally(statuses, stride, count)


def tally(statuses: list[int], stride: int, count: int) -> dict[int | None, int] | None:
    """Pages per node from move_pages' statuses of every ``stride``-th page of a range of
    ``count`` pages; ``None`` (the key) for pages not present (ENOENT).  A page answered
    EFAULT may be resident and unmapped by NUMA balancing for its hinting faults: those
    are apportioned over the nodes seen, and when fewer than half of the pages are seen
    the answer is None (numa_maps, which counts every resident page, decides)."""
    seen: dict[int, int] = {}
    absent = unknown = 0
    for status in statuses:
        if status >= 0:
            seen[status] = seen.get(status, 0) + 1
        elif status == -errno.ENOENT:
            absent += 1
        else:
            unknown += 1
    if statuses and sum(seen.values()) * 2 < len(statuses) - absent:
        return None
    total = sum(seen.values())
    out: dict[int | None, int] = {}
    for node, n in sorted(seen.items()):
        out[node] = (n + unknown * n // total) * stride if total else 0
    if absent:
        out[None] = absent * stride
    counted = sum(out.values())
    if counted != count and out:  # the sample's rounding: the scaled counts sum to the range
        top = max(out, key=lambda k: (out[k], k is not None))
        out[top] = max(out[top] + count - counted, 0)
    return out


def numa_maps_pages(
    ranges: Sequence[tuple[int, int]], pid: int | str = 0
) -> list[dict[int, int] | None]:
    """Resident pages per node (in 4 KiB units) of the mappings that make up each
    ``(start, nbytes)`` range, from the one pass over ``/proc/PID/maps`` and ``numa_maps``
    (:func:`numabind._kernel.memory_view`: a mapping that began before the range counts
    whole, as numa_maps says no finer); None for a range where nothing is mapped.  Shared
    and huge-page mappings count too."""
    view = _kernel.memory_view("self" if pid == 0 else pid, tuple(ranges))
    return [view.buffers.get(i) for i in range(len(ranges))]


def moved_onto(
    before: dict[int | None, int], after: dict[int | None, int], nodes: Sequence[int]
) -> tuple[int, int]:
    """(pages that left other nodes for ``nodes``, pages still on other nodes) between two
    measurements of one range: a page that could not move (pinned for DMA, locked, shared)
    is still off the nodes afterwards and is never counted as moved."""
    wanted = set(nodes)
    off_before = sum(n for k, n in before.items() if k is not None and k not in wanted)
    off_after = sum(n for k, n in after.items() if k is not None and k not in wanted)
    return max(off_before - off_after, 0), off_after


def share_on(found: dict[int | None, int], nodes: Sequence[int] | frozenset[int]) -> float:
    """The share of all pages of a measurement that are on ``nodes``."""
    total = sum(found.values())
    wanted = set(nodes)
    on = sum(n for k, n in found.items() if k is not None and k in wanted)
    return on / total if total else 0.0


# --- placing -------------------------------------------------------------------------------------


class Migration(Record):
    """What moving pages did: pages moved, pages still elsewhere and why (move_pages'
    answers), the calls refused with EPERM (a seccomp filter: said once by the caller),
    and notes."""

    moved: int = 0
    failed: int = 0
    not_moved: dict[str, int] = {}  # noqa: RUF012 (records are immutable)
    refused: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


class Mover:
    """Places ranges of this process on ``nodes`` under ``policy`` and moves what is
    there (see the module docstring).  Leftover pages go to ``dest`` (one node), or with
    ``spread`` round-robin over ``nodes`` in page order, as interleave places them."""

    def __init__(
        self,
        nodes: frozenset[int] | Sequence[int],
        policy: str,
        *,
        dest: int | None = None,
        spread: bool = False,
        budget: int = MOVE_BUDGET,
        leave: frozenset[int] = frozenset(),
    ) -> None:
        self.leave = leave  # nodes whose pages are never moved (a GPU's own memory)
        self.nodes = tuple(sorted(nodes))
        self.policy = policy
        self.dest = dest if dest is not None else self.nodes[0]
        self.spread = spread
        self.refused: list[str] = []
        self.notes: list[str] = []
        self.not_moved: dict[str, int] = {}
        self.budget = budget

    def _refuse(self, err: OSError, call: str) -> bool:
        if err.errno != errno.EPERM:
            return False
        if call not in self.refused:
            self.refused.append(call)
        return True

    def bind(
        self, start: int, end: int, name: str, *, move: bool = True, clear: bool = False
    ) -> None:
        """``mbind`` the range in batches (with ``move``: MPOL_MF_MOVE); with ``clear`` the
        range policy is set back to default right after each batch (the pages stay; future
        allocations follow the thread's policy, and a later restore() is not contradicted
        by range policies).  Raises what the kernel refuses unless a migration may stop
        (``clear``: a process's own pages, moved as a courtesy)."""
        if "mbind" in self.refused:
            return
        flags = _kernel.MPOL_MF_MOVE if move else 0
        while start < end:
            length = min(BATCH_BYTES, end - start)
            try:
                _kernel.mbind(start, length, self.policy, self.nodes, flags)
            except OSError as err:
                if not clear:
                    raise
                if self._refuse(err, "mbind"):
                    return
                if err.errno not in (errno.EFAULT, errno.EIO):  # unmapped meanwhile; busy
                    self.notes.append(f"migration of {name} stopped: {err}")
                    return
            finally:
                if clear and "mbind" not in self.refused:
                    try:
                        _kernel.mbind(start, length, "default", (), 0)
                    except OSError:
                        pass
            start += length

    def leftovers(self, start: int, end: int, page: int = PAGE) -> None:
        """Ask where each page of the range lives and move those off the nodes; each page
        that stays elsewhere is counted by its reason in ``not_moved``."""
        addr = start
        index = 0  # the page's position in the range: where ``spread`` sends it
        while addr < end and self.budget > 0 and "move_pages" not in self.refused:
            n = min(MOVE_BATCH, (end - addr) // page, self.budget)
            if n <= 0:
                break
            batch = [addr + i * page for i in range(n)]
            self.budget -= n
            try:
                found = _kernel.move_pages(batch)
                off = [
                    i
                    for i, w in enumerate(found)
                    if w >= 0 and w not in self.nodes and w not in self.leave
                ]
                targets = [
                    self.nodes[(index + i) % len(self.nodes)] if self.spread else self.dest
                    for i in off
                ]
                statuses = _kernel.move_pages([batch[i] for i in off], targets) if off else []
            except OSError as err:
                if not self._refuse(err, "move_pages"):
                    self.notes.append(f"move_pages: {err}")
                return
            for status, target in zip(statuses, targets):
                if status < 0:
                    why = _reason(status)
                elif status != target:
                    why = "stayed"
                else:
                    continue
                self.not_moved[why] = self.not_moved.get(why, 0) + 1
            addr += n * page
            index += n

    def result(self, moved: int, failed: int) -> Migration:
        not_moved = dict(self.not_moved)
        if failed and not not_moved:
            not_moved["unknown"] = failed
        return Migration(
            moved=moved,
            failed=failed,
            not_moved=not_moved,
            refused=tuple(self.refused),
            notes=tuple(self.notes),
        )


def _off(regions: list[_kernel.Region], target: frozenset[int], leave: frozenset[int]) -> int:
    return sum(
        c for n, c in _kernel.pages_per_node(regions).items() if n not in target and n not in leave
    )


def migrate_private(
    target: frozenset[int], policy: str, dest: int, mask: frozenset[int] = frozenset()
) -> Migration | None:
    """Move this process's private anonymous pages that lie off ``target`` onto it
    (``policy``: how mbind moves them; ``dest``: where move_pages puts the leftovers).
    With a spill ``mask`` (NUMABIND_SPILL), a page on a node outside it is left where it
    is: a GPU's own memory, far or CXL memory, where the driver or the program put it on
    purpose (``check`` names it); the pages that spilled onto the mask's other CPU-memory
    nodes come home.  None when nothing movable lies elsewhere (the caller looked at
    numa_maps first, cheaply).  File-backed and shared pages are never moved: ranks on
    other nodes use them too."""
    try:
        before = _kernel.private_anon_regions()
    except OSError as err:
        return Migration(notes=(f"page migration skipped: {err}",))
    leave = frozenset(n for r in before for n in r.pages if mask and n not in mask)
    off_before = _off(before, target, leave)
    if off_before == 0:
        return None
    mover = Mover(target, policy, dest=dest, leave=leave)
    for region in before:
        # mbind moves every page of a region off its nodes: a region holding pages to
        # leave is moved page by page below instead
        if any(n not in target for n in region.pages) and not leave & region.pages.keys():
            mover.bind(region.start, region.end, region.name, clear=True)
    try:
        after = _kernel.private_anon_regions()
        if _off(after, target, leave):
            for region in after:
                if any(n not in target and n not in leave for n in region.pages):
                    mover.leftovers(region.start, region.end, region.page_size)
            after = _kernel.private_anon_regions()
    except OSError:
        return mover.result(0, 0)
    off_after = _off(after, target, leave)
    return mover.result(max(off_before - off_after, 0), off_after)
