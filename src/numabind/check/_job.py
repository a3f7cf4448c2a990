"""The job report: every rank of a distributed job in one table, from one collector record
per node.

A collector (``numabind check --all --job-id J``, run on each node) writes a *node record*:
the node's facts and, per rank of the job on it, who it is (host, global and local rank,
job and step), its GPU and that GPU's NUMA node, its plan and the CPUs of every thread
(grouped by mask, with their names), its memory policy, the share of its private pages on
its plan's nodes and its host buffers.  :func:`parse_node` turns such a record, which came
over a launcher's pipe or a store and is therefore input, into typed rows: every field is
type-checked, bounded and cleaned, and a record or rank that does not pass is a row that
says so, never an exception.  :func:`merge` adds the nodes that never answered and the
ranks they should have had (the step's layout, from the ranks that did answer), and
:func:`report_lines` prints one screen: the ranks that are not healthy first, identical
healthy nodes collapsed into one block, and one summary line.

What a report may cost is stated, and counted, not implied by caps on single items (the
threat model in docs/security.rst):

* **CPU and node sets stay text.**  ``"0-16383"`` is 7 bytes and 16,384 CPUs, so a set
  expanded into numbers is no multiple of its record's size.  Every set in a row is an
  :class:`IdList`: its canonical list text, compared, joined and tested for inclusion
  range by range, never expanded.
* **A budget per record** (:data:`RECORD_BYTES` and :data:`RECORD_VALUES` for a node
  record, :data:`STORE_RECORD_BYTES` and one rank for a store record), checked before
  the structure it bounds is built: a store record listing a second rank is refused
  before any rank is parsed.
* **A budget per report** (:class:`Budget`): bytes of records parsed, an estimate of the
  memory the rows keep, host names expanded from every step layout together, and the
  caller's deadline.  Once spent, what is left is one line, not one row each.
* Hostlists are expanded without recursion and with at most :data:`MAX_BRACKETS` bracket
  groups per name.

Everything here is pure: no /proc, no subprocess (numabind.cli._job runs the collectors).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from typing import Any

from .. import _sysfs
from .._model import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._inspect import CheckReport, ProcessCheck

SCHEMA = "numabind-node/1"
JOB_SCHEMA = "numabind-job/2"  # /2: sets as list text ("0-3,8"), missing as a list text
MAX_HOSTS = 100_000  # nodes one report may name (the largest jobs are ~10,000 nodes)
MAX_RANKS = 1024  # ranks one node record may hold (8 GPUs x many ranks is far below)
MAX_GROUPS = 64  # thread groups (one CPU mask each) kept per rank
MAX_TIDS = 4096  # thread ids one rank's groups may list in all
TIDS_KEPT = 8  # thread ids (and names) kept per group: the report names the first 4
MAX_NOTES = 32  # problems or notes kept per rank or node
MAX_BUFFERS = 64  # host buffers kept per rank
MAX_BRACKETS = 8  # bracket groups in one hostlist name (Slurm's dimensions: 1 to 4)
TEXT = 300  # characters kept of one piece of text
RANK_BYTES = 32 << 10  # one rank of a record, as the collector writes it (it fits itself in)
RECORD_BYTES = MAX_RANKS * RANK_BYTES + (64 << 10)  # one node record (32 MiB and its facts)
STORE_RECORD_BYTES = RANK_BYTES + (64 << 10)  # one store record: one rank and its node's facts
RANK_VALUES = 2048  # JSON values one rank may spend (64 groups of tids and names)
RECORD_VALUES = MAX_RANKS * RANK_VALUES + 4096
LIST_TEXT = RANK_BYTES  # characters of one CPU or node list
REPORT_BYTES = 256 << 20  # bytes of records one report parses in all
REPORT_MEMORY = 512 << 20  # bytes its rows may keep (an estimate: :func:`_row_cost`)
MAX_INVALID = 1024  # invalid records kept as rows; the others are counted
STATUSES = ("off plan", "invalid", "unknown", "warning", "ok")  # the order rows are shown in
HEALTHY = ("ok",)


class InvalidRecord(ValueError):
    """A node record (or one rank of it) that is not what a collector writes."""


# --- sets of numbers, kept as text -------------------------------------------------------------


def _ranges(text: str, limit: int, what: str) -> list[tuple[int, int]]:
    """The kernel's list form (``0-3,8``, no strides: the collector never writes them) as
    sorted, merged ``(first, last)`` pairs; ValueError past ``limit`` or when malformed.
    Linear in the text: no number range is walked."""
    if len(text) > LIST_TEXT:
        raise ValueError(f"{what} list of {len(text)} characters (at most {LIST_TEXT})")
    pairs: list[tuple[int, int]] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo_s, sep, hi_s = part.partition("-")
        for token in (lo_s, hi_s) if sep else (lo_s,):
            token = token.strip()
            if not (token.isascii() and token.isdigit() and len(token) < 7):
                raise ValueError(f"bad {what} list {_sysfs.short(text)}")
        lo = int(lo_s)
        hi = int(hi_s) if sep else lo
        if hi < lo or hi >= limit:
            raise ValueError(f"{what} list {_sysfs.short(text)}: beyond {limit - 1} or reversed")
        pairs.append((lo, hi))
    return _merged(pairs)


def _merged(pairs: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(pairs):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


class IdList(str):
    """A set of CPU, node or rank numbers kept as its canonical list text (``0-3,8``).

    The text is what a record spent on it, so a set can never cost more than its text:
    inclusion, union and size work on its ranges.  It *is* the string (JSON writes it as
    the kernel's list form); ``len()`` is the text's length, :attr:`size` the count."""

    __slots__ = ()

    @classmethod
    def parse(cls, text: str, limit: int = _sysfs.MAX_CPUS, what: str = "CPU") -> IdList:
        return cls.of_ranges(_ranges(text, limit, what))

    @classmethod
    def of_ranges(cls, pairs: Iterable[tuple[int, int]]) -> IdList:
        return cls(",".join(str(a) if a == b else f"{a}-{b}" for a, b in pairs))

    @classmethod
    def of(cls, numbers: Iterable[int]) -> IdList:
        return cls(_sysfs.format_cpulist(numbers))

    def ranges(self) -> list[tuple[int, int]]:
        """Its pairs (canonical already: parsed without checks)."""
        out = []
        for part in self.split(",") if self else ():
            lo, _, hi = part.partition("-")
            out.append((int(lo), int(hi or lo)))
        return out

    @property
    def size(self) -> int:
        return sum(b - a + 1 for a, b in self.ranges())

    def within(self, other: IdList) -> bool:
        """Whether every number of this set is in ``other`` (a merge of the two range
        lists: linear in their texts)."""
        theirs = other.ranges()
        i = 0
        for lo, hi in self.ranges():
            while i < len(theirs) and theirs[i][1] < lo:
                i += 1
            if i == len(theirs) or theirs[i][0] > lo or theirs[i][1] < hi:
                return False
        return True

    def union(self, *others: IdList) -> IdList:
        pairs = list(self.ranges())
        for o in others:
            pairs += o.ranges()
        return IdList.of_ranges(_merged(pairs))

    def first(self, n: int) -> list[int]:
        """Its first ``n`` numbers (for a line that names a few)."""
        out: list[int] = []
        for a, b in self.ranges():
            out.extend(range(a, min(b, a + n - len(out) - 1) + 1))
            if len(out) >= n:
                break
        return out


EMPTY = IdList("")


# --- what one report may spend ------------------------------------------------------------------


class Budget:
    """One report's budget: bytes of records parsed, the memory its rows keep (estimated
    by :func:`_row_cost`), host names expanded from step layouts (all steps together), and
    the deadline (a ``time.monotonic()`` value).  :attr:`spent` says what ran out first;
    a caller stops reading there and says so in one line."""

    def __init__(
        self,
        deadline: float | None = None,
        nbytes: int = REPORT_BYTES,
        memory: int = REPORT_MEMORY,
        hosts: int = MAX_HOSTS,
    ) -> None:
        self.deadline = deadline
        self.bytes_left = nbytes
        self.memory_left = memory
        self.hosts_left = hosts
        self.limits = (nbytes, memory, hosts)
        self.spent: str | None = None

    def late(self) -> bool:
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.spent = self.spent or "the deadline passed"
            return True
        return False

    def take_bytes(self, n: int) -> bool:
        if n > self.bytes_left:
            self.spent = self.spent or f"the report's {self.limits[0] >> 20} MiB of records"
            return False
        self.bytes_left -= n
        return True

    def take_memory(self, n: int) -> bool:
        if n > self.memory_left:
            self.spent = self.spent or f"the report's {self.limits[1] >> 20} MiB for its rows"
            return False
        self.memory_left -= n
        return True

    def take_hosts(self, n: int) -> bool:
        if n > self.hosts_left:
            self.spent = self.spent or f"the report's {self.limits[2]:,} host names"
            return False
        self.hosts_left -= n
        return True

    @property
    def exhausted(self) -> bool:
        return self.spent is not None


# --- hostlists ---------------------------------------------------------------------------------


def expand_hostlist(text: str, limit: int = MAX_HOSTS, budget: Budget | None = None) -> list[str]:
    """Slurm's hostlist expression (``gpu[01-03,07],login1``, several bracket groups in one
    name too) as names, in order and without repeats; raises :class:`InvalidRecord` past
    ``limit`` names (or what ``budget`` has left), past :data:`MAX_BRACKETS` groups in one
    name, or on a malformed expression.  No recursion: a name of a thousand groups costs
    one refusal, not a RecursionError."""
    names: list[str] = []
    seen: set[str] = set()
    for item in _split_top(text):
        if not item:
            continue
        for name in _expand_one(item, limit - len(names)):
            if name not in seen:
                seen.add(name)
                names.append(name)
        if len(names) > limit:
            raise InvalidRecord(f"hostlist names more than {limit} hosts")
    if budget is not None and not budget.take_hosts(len(names)):
        raise InvalidRecord(f"hostlist of {len(names)} hosts: {budget.spent} are spent")
    return names


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets."""
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i])
            start = i + 1
        if depth not in (0, 1):
            raise InvalidRecord(f"hostlist {_sysfs.short(text)}: unbalanced brackets")
    if depth:
        raise InvalidRecord(f"hostlist {_sysfs.short(text)}: unbalanced brackets")
    out.append(text[start:])
    return [s.strip() for s in out]


_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def _expand_one(item: str, budget: int) -> list[str]:
    """One name with its bracket groups, expanded left to right into at most ``budget``
    names (one list per group, built iteratively)."""
    groups = list(_BRACKET.finditer(item))
    if len(groups) > MAX_BRACKETS:
        raise InvalidRecord(
            f"host name {_sysfs.short(item)} has {len(groups)} bracket groups "
            f"(at most {MAX_BRACKETS})"
        )
    texts = [""]
    at = 0
    for m in groups:
        head = item[at : m.start()]
        at = m.end()
        numbers: list[str] = []
        for part in m.group(1).split(","):
            lo, sep, hi = part.partition("-")
            if not (lo.isascii() and lo.isdigit() and len(lo) < 10):
                raise InvalidRecord(f"hostlist range {_sysfs.short(part)} is not a number range")
            if sep and not (hi.isascii() and hi.isdigit() and len(hi) < 10):
                raise InvalidRecord(f"hostlist range {_sysfs.short(part)} is not a number range")
            first, last = int(lo), int(hi) if sep else int(lo)
            if last < first or last - first >= budget:
                raise InvalidRecord(f"hostlist range {_sysfs.short(part)} is too large or reversed")
            numbers.extend(f"{n:0{len(lo)}d}" for n in range(first, last + 1))
            if len(numbers) > budget:
                raise InvalidRecord(f"hostlist names more than {budget} hosts")
        if len(texts) * len(numbers) > budget:
            raise InvalidRecord(f"hostlist names more than {budget} hosts")
        texts = [f"{t}{head}{n}" for t in texts for n in numbers]
    tail = item[at:]
    out = [t + tail for t in texts]
    for name in out:
        if not _good_name(name):
            raise InvalidRecord(f"host name {_sysfs.short(name)} is not a host name")
    return out


def _good_name(name: str) -> bool:
    return 0 < len(name) <= 255 and name.isascii() and all(c.isalnum() or c in "-_." for c in name)


def expand_tasks(text: str, limit: int = MAX_HOSTS) -> list[int]:
    """Slurm's tasks-per-node list (``2(x3),1``) as one count per node."""
    out: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d{1,6})(?:\(x(\d{1,6})\))?", part.strip())
        if m is None:
            raise InvalidRecord(f"tasks per node {_sysfs.short(text)} is malformed")
        count, times = int(m.group(1)), int(m.group(2) or 1)
        if len(out) + times > limit:
            raise InvalidRecord(f"tasks per node names more than {limit} nodes")
        out.extend([count] * times)
    return out


# --- rows --------------------------------------------------------------------------------------


class ThreadGroup(Record):
    """Threads of a rank that share one CPU mask: the first few ids and names
    (:data:`TIDS_KEPT`), how many there are, and whether that mask lies within the plan
    (None: no plan)."""

    cpus: IdList
    tids: tuple[int, ...]
    names: tuple[str, ...]
    count: int
    on_plan: bool | None


class BufferRow(Record):
    nbytes: int
    nodes: IdList
    locality: float | None


class RankRow(Record):
    """One rank as the report shows it (``status``: one of :data:`STATUSES`)."""

    host: str
    pid: int | None
    rank: int | None = None
    local_rank: int | None = None
    job_id: str | None = None
    step_id: str | None = None
    status: str = "ok"
    gpu_index: int | None = None
    gpu_pci: str | None = None
    gpu_node: int | None = None
    gpu_source: str = ""
    gpu_uuid: str | None = None
    plan_cpus: IdList | None = None
    plan_helpers: IdList = EMPTY
    plan_node: int | None = None
    plan_policy: str | None = None
    plan_mems: IdList = EMPTY
    plan_source: str = ""
    threads: tuple[ThreadGroup, ...] = ()
    memory_policy: str | None = None
    memory_nodes: IdList = EMPTY
    locality: float | None = None
    mems_allowed: IdList | None = None
    buffers: tuple[BufferRow, ...] = ()
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    step_nodes: str | None = None
    step_tasks: str | None = None

    @property
    def cpus(self) -> IdList:
        """Every CPU its threads may run on."""
        return EMPTY.union(*(g.cpus for g in self.threads))

    @property
    def off_plan_threads(self) -> tuple[ThreadGroup, ...]:
        return tuple(g for g in self.threads if g.on_plan is False)


class NodeRow(Record):
    """One node of the job: ``state`` ``answered``, ``unreachable`` (no record before the
    deadline, or numabind not run there; ``reason`` says why) or ``invalid`` (a record
    that did not parse); ``expected`` the ranks the step layout puts on it (None:
    unknown)."""

    host: str
    state: str
    reason: str = ""
    ranks: tuple[RankRow, ...] = ()
    facts: dict[str, Any] = {}  # noqa: RUF012 (records are immutable)
    notes: tuple[str, ...] = ()
    expected: int | None = None


class Summary(Record):
    ranks: int
    nodes: int
    ok: int
    warnings: int
    off_plan: int
    unreachable: int
    unknown: int
    unreachable_nodes: int

    def text(self) -> str:
        line = (
            f"{self.ranks} rank{'' if self.ranks == 1 else 's'} on {self.nodes} "
            f"node{'' if self.nodes == 1 else 's'}: {self.ok} ok, {self.warnings} warnings, "
            f"{self.off_plan} off plan, {self.unreachable} unreachable"
        )
        if self.unknown:
            line += f", {self.unknown} unknown or invalid"
        return line


class JobReport(Record):
    """The whole report: ``missing`` are the global ranks that posted nothing (a report
    from a framework's store, where hosts are known only from what was posted), as a list
    text; ``unread`` the ranks a store held that were not read (its budget or deadline
    ran out, or the store stopped answering): counted, not listed."""

    job: str | None
    nodes: tuple[NodeRow, ...]
    summary: Summary
    notes: tuple[str, ...] = ()
    missing: IdList = EMPTY
    unread: int = 0
    title: str = ""  # the first line's start (default: numabind check --job JOB)

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["schema"] = JOB_SCHEMA
        d["summary"]["text"] = self.summary.text()
        return d


# --- parsing one node record (input) -----------------------------------------------------------


def _text(value: object, what: str, limit: int = TEXT, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise InvalidRecord(f"{what} is not text")
    if not value and not empty:
        raise InvalidRecord(f"{what} is empty")
    return _sysfs.clean_line(value, limit)


def _opt_text(d: dict[str, Any], key: str, limit: int = TEXT) -> str | None:
    value = d.get(key)
    return None if value is None else _text(value, key, limit)


def _int(value: object, what: str, lo: int = 0, hi: int = 1 << 31) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise InvalidRecord(f"{what} is not a whole number from {lo} to {hi}")
    return value


def _opt_int(d: dict[str, Any], key: str, lo: int = 0, hi: int = 1 << 31) -> int | None:
    value = d.get(key)
    return None if value is None else _int(value, key, lo, hi)


def _cpus(value: object, what: str, limit: int = _sysfs.MAX_CPUS) -> IdList:
    """A CPU or node list in the kernel's text form (``0-3,8``), kept as text."""
    if not isinstance(value, str):
        raise InvalidRecord(f"{what} is not text")
    try:
        return IdList.parse(value, limit, "node" if limit == _sysfs.MAX_NODES else "CPU")
    except ValueError as err:
        raise InvalidRecord(f"{what}: {err}") from None


def _share(value: object, what: str) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not 0.0 <= float(value) <= 1.0:  # type: ignore[arg-type]
        raise InvalidRecord(f"{what} is not a share from 0 to 1")
    return float(value)  # type: ignore[arg-type]


def _list(value: object, what: str, limit: int) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidRecord(f"{what} is not a list")
    return value[:limit]


def _dict(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidRecord(f"{what} is not an object")
    return value


def _texts(value: object, what: str) -> tuple[str, ...]:
    return tuple(_text(v, what) for v in _list(value or [], what, MAX_NOTES))


def parse_rank(obj: object, host: str) -> RankRow:
    """One rank of a node record; raises :class:`InvalidRecord`."""
    d = _dict(obj, "rank")
    pid = _int(d.get("pid"), "pid", 1, 1 << 22)
    plan = d.get("plan")
    plan_d = _dict(plan, "plan") if plan is not None else None
    plan_cpus = _cpus(plan_d.get("cpus"), "plan cpus") if plan_d else None
    helpers = _cpus(plan_d.get("helpers", ""), "plan helpers") if plan_d else EMPTY
    allowed_main = plan_cpus
    allowed_other = plan_cpus.union(helpers) if plan_cpus is not None else None
    bound = plan_d is not None and plan_d.get("bound", True) is not False
    groups = []
    listed = 0
    for g in _list(d.get("threads", []), "threads", MAX_GROUPS):
        gd = _dict(g, "thread group")
        cpus = _cpus(gd.get("cpus"), "thread cpus")
        raw = _list(gd.get("tids"), "tids", MAX_TIDS)
        listed += len(raw)
        if listed > MAX_TIDS:
            raise InvalidRecord(f"more than {MAX_TIDS} thread ids")
        tids = [_int(t, "thread id", 1, 1 << 22) for t in raw]
        names = tuple(
            _text(n, "thread name", 32) for n in _list(gd.get("names", []), "names", TIDS_KEPT)
        )
        count = _int(gd.get("count", len(tids)), "thread count", len(tids), 1 << 22)
        on_plan = None
        if allowed_main is not None and allowed_other is not None and bound:
            on_plan = cpus.within(allowed_main if pid in tids else allowed_other)
        groups.append(
            ThreadGroup(
                cpus=cpus,
                tids=tuple(tids[:TIDS_KEPT]),
                names=names[:TIDS_KEPT],
                count=count,
                on_plan=on_plan,
            )
        )
    gpu = _dict(d.get("gpu") or {}, "gpu")
    buffers = []
    for b in _list(d.get("host_buffers", []), "host_buffers", MAX_BUFFERS):
        bd = _dict(b, "host buffer")
        buffers.append(
            BufferRow(
                nbytes=_int(bd.get("nbytes"), "buffer size", 0, 1 << 50),
                nodes=_cpus(bd.get("nodes"), "buffer nodes", _sysfs.MAX_NODES),
                locality=_share(bd.get("locality"), "buffer locality"),
            )
        )
    status = _text(d.get("status"), "status", 20)
    if status not in STATUSES:
        raise InvalidRecord(f"status {status!r} is not one of {', '.join(STATUSES)}")
    mems = d.get("mems_allowed")
    policy = d.get("memory_policy")
    return RankRow(
        host=host,
        pid=pid,
        rank=_opt_int(d, "rank", 0, 1 << 24),
        local_rank=_opt_int(d, "local_rank", 0, 1 << 16),
        job_id=_opt_text(d, "job", 40),
        step_id=_opt_text(d, "step", 40),
        status=status,
        gpu_index=_opt_int(gpu, "index", 0, 4096),
        gpu_pci=_opt_text(gpu, "pci", 40),
        gpu_node=_opt_int(gpu, "numa_node", 0, _sysfs.MAX_NODES),
        gpu_source=_opt_text(gpu, "source", 120) or "",
        gpu_uuid=_opt_text(gpu, "uuid", 80),
        plan_cpus=plan_cpus,
        plan_helpers=helpers,
        plan_node=_opt_int(plan_d, "numa_node", 0, _sysfs.MAX_NODES) if plan_d else None,
        plan_policy=_opt_text(plan_d, "memory_policy", 20) if plan_d else None,
        plan_mems=_cpus(plan_d.get("memory_nodes", ""), "plan memory nodes", _sysfs.MAX_NODES)
        if plan_d
        else EMPTY,
        plan_source=_opt_text(plan_d, "source", 120) or "" if plan_d else "",
        threads=tuple(groups),
        memory_policy=None if policy is None else _text(policy, "memory policy", 20),
        memory_nodes=_cpus(d.get("memory_nodes", ""), "memory nodes", _sysfs.MAX_NODES),
        locality=_share(d.get("locality"), "locality"),
        mems_allowed=None if mems is None else _cpus(mems, "mems", _sysfs.MAX_NODES),
        buffers=tuple(buffers),
        problems=_texts(d.get("problems"), "problems"),
        notes=_texts(d.get("notes"), "notes"),
        step_nodes=_opt_text(d, "step_nodes", 4000),
        step_tasks=_opt_text(d, "step_tasks", 1000),
    )


def _row_cost(r: RankRow) -> int:
    """About the bytes a rank row keeps (its objects and texts), for the report's memory
    budget: a fixed part per row, group and buffer, and every text's length."""
    cost = 1200 + sum(len(t) + 64 for t in (*r.problems, *r.notes))
    cost += len(r.step_nodes or "") + len(r.step_tasks or "") + len(r.gpu_source)
    for s in (r.plan_cpus or "", r.plan_helpers, r.plan_mems, r.memory_nodes, r.mems_allowed):
        cost += len(s or "")
    for g in r.threads:
        cost += 300 + len(g.cpus) + 40 * len(g.tids) + sum(len(n) + 56 for n in g.names)
    return cost + 200 * len(r.buffers)


def _values(text: str | bytes) -> int:
    """A bound on the JSON values a text holds (each needs a separator or a bracket),
    counted before it is parsed: what ``json.loads`` would build is then bounded too."""
    if isinstance(text, str):
        return sum(text.count(c) for c in ",:[{")
    return sum(text.count(c) for c in (b",", b":", b"[", b"{"))


# --- the node record: its writer (the collector's side), then its parser -------------------


_fmt = _sysfs.format_cpulist


def rank_status(r: ProcessCheck) -> str:
    if r.status == "unknown":
        return "unknown"
    if not r.ok:
        return "off plan"
    warned = any(n.startswith("warning") for n in r.notes) or any(not b.ok for b in r.host_buffers)
    return "warning" if warned else "ok"


def rank_record(r: ProcessCheck) -> dict[str, object]:
    """One rank of the node record: what the job report shows of it, compact (CPU sets in
    the kernel's list form, threads grouped by mask, the first few ids and names of
    each), and never more than the budget of one rank (:data:`RANK_BYTES` and
    RANK_VALUES): a rank with many odd masks on a large machine drops its last groups and
    says so."""
    record = _rank_record(r)
    threads: list[object] = record["threads"]  # type: ignore[assignment]
    dropped = 0
    while threads:
        text = json.dumps(record, separators=(",", ":"))
        if len(text) <= RANK_BYTES - 512 and _values(text) <= RANK_VALUES - 64:
            break
        threads.pop()
        dropped += 1
    if dropped:
        notes: list[str] = record["notes"]  # type: ignore[assignment]
        notes[MAX_NOTES - 1 :] = [
            f"{dropped} thread group(s) left out: the rank's record would exceed "
            f"{RANK_BYTES >> 10} KiB"
        ]
    return record


def _rank_record(r: ProcessCheck) -> dict[str, object]:
    p = r.plan
    groups: dict[frozenset[int], list[int]] = {}
    for tid, cpus in r.threads.items():
        groups.setdefault(cpus, []).append(tid)
    threads = []
    for cpus, tids in sorted(groups.items(), key=lambda kv: min(kv[1]))[:MAX_GROUPS]:
        tids.sort()
        threads.append(
            {
                "cpus": _fmt(cpus),
                "tids": tids[:TIDS_KEPT],
                "names": [r.thread_names.get(t, "") for t in tids[:TIDS_KEPT]],
                "count": len(tids),
            }
        )
    policy = r.memory_policy or {}
    ident = r.identity
    plan = None
    if p is not None:
        plan = {
            "cpus": _fmt(p.cpus),
            "helpers": _fmt(p.helpers),
            "numa_node": p.numa_node,
            "memory_policy": p.memory_policy,
            "memory_nodes": _fmt(p.memory_nodes),
            "bound": p.bound,
            "source": r.plan_source,
        }
    return {
        "pid": r.pid,
        "rank": ident.rank,
        "local_rank": p.local_rank if p is not None else None,
        "job": ident.job_id,
        "step": ident.step_id,
        "step_nodes": ident.step_nodes,
        "step_tasks": ident.step_tasks,
        "status": rank_status(r),
        "gpu": r.gpu.to_dict(),
        "plan": plan,
        "threads": threads,
        "memory_policy": policy.get("policy"),
        "memory_nodes": _fmt(policy.get("nodes", ())),
        "locality": r.locality,
        "mems_allowed": None if r.mems_allowed is None else _fmt(r.mems_allowed),
        "host_buffers": [
            {"nbytes": b.nbytes, "nodes": _fmt(b.nodes), "locality": b.locality}
            for b in r.host_buffers
        ],
        "problems": [_sysfs.clean_line(t, TEXT) for t in r.problems[:MAX_NOTES]],
        "notes": [_sysfs.clean_line(t, TEXT) for t in r.notes[:MAX_NOTES]],
    }


def node_record(
    report: CheckReport, job: str | None, notes_first: tuple[str, ...] = ()
) -> dict[str, object]:
    """The collector's output (:data:`SCHEMA`): the node's facts and its ranks;
    ``notes_first`` lead its notes (how the job's processes were told)."""
    facts = report.node
    assert facts is not None
    notes = [*notes_first, *report.notes]
    if report.skipped:
        notes.append(f"{len(report.skipped)} rank(s) not reached before the deadline")
    return {
        "schema": SCHEMA,
        "host": facts.host,
        "job": job,
        "facts": {
            "numa_balancing": facts.numa_balancing,
            "cpuset_mems": None if facts.cpuset_mems is None else _fmt(facts.cpuset_mems),
            "mempolicy_permitted": facts.mempolicy_permitted,
            "kernel": facts.kernel,
        },
        "ranks": [rank_record(r) for r in report.processes],
        "notes": notes[:MAX_NOTES],
    }


def parse_node(
    text: str | bytes,
    expect_host: str | None = None,
    job: str | None = None,
    *,
    max_ranks: int = MAX_RANKS,
    budget: Budget | None = None,
) -> NodeRow:
    """A collector's node record as a row; never raises: what does not parse is a row of
    state ``invalid`` (a whole record) or a rank row of status ``invalid``.  A record that
    names a host other than ``expect_host``, or ranks of another job, is invalid too: a
    forged record cannot speak for another node.

    ``max_ranks`` 1 is a store record (one rank posts its own): its size is then
    :data:`STORE_RECORD_BYTES`, and a record listing more than one rank is refused before
    any rank is parsed.  A node record listing more than :data:`MAX_RANKS` keeps the first
    ones (and says so): an over-full node still shows what it can.  ``budget`` is the
    whole report's (:class:`Budget`): the record's bytes and its rows' memory come out of
    it, and a record it cannot afford is an ``invalid`` row that says so."""
    where = expect_host or "?"
    limit = STORE_RECORD_BYTES if max_ranks == 1 else RECORD_BYTES
    values = RANK_VALUES + 4096 if max_ranks == 1 else RECORD_VALUES
    if len(text) > limit:
        return NodeRow(host=where, state="invalid", reason=f"record over {_size(limit)}")
    if budget is not None and not budget.take_bytes(len(text)):
        return NodeRow(host=where, state="invalid", reason=f"not read: {budget.spent} are spent")
    if _values(text) > values:
        return NodeRow(
            host=where, state="invalid", reason=f"invalid record: more than {values:,} values"
        )
    try:
        head = _node_head(_dict(json.loads(text), "record"), expect_host, max_ranks)
    except (InvalidRecord, ValueError, RecursionError) as err:
        why = err if isinstance(err, InvalidRecord) else "not JSON"
        return NodeRow(host=where, state="invalid", reason=f"invalid record: {why}")
    if isinstance(head, NodeRow):
        return head
    host, facts, notes, raw = head
    ranks = []
    for i, r in enumerate(raw):
        try:
            row = parse_rank(r, host)
            if job is not None and row.job_id not in (None, job):
                raise InvalidRecord(f"rank of job {row.job_id}, not {job}")
        except (InvalidRecord, RecursionError) as err:
            why = err if isinstance(err, InvalidRecord) else "nested too deep"
            row = RankRow(
                host=host, pid=None, status="invalid", problems=(f"invalid record: {why}",)
            )
            row = row.replace(notes=(f"rank record {i} of {host}",))
        if budget is not None and not budget.take_memory(_row_cost(row)):
            notes = (*notes[: MAX_NOTES - 1], f"{len(raw) - i} rank(s) not kept: {budget.spent}")
            break
        ranks.append(row)
    return NodeRow(host=host, state="answered", ranks=tuple(ranks), facts=facts, notes=notes)


def _node_head(
    d: dict[str, Any], expect_host: str | None, max_ranks: int
) -> NodeRow | tuple[str, dict[str, Any], tuple[str, ...], list[Any]]:
    """A record's host, facts, notes and (not yet parsed) ranks; or the row of a node
    whose launcher refused to start numabind; raises :class:`InvalidRecord`."""
    if d.get("schema") != SCHEMA:
        raise InvalidRecord(f"schema is not {SCHEMA}")
    host = _text(d.get("host"), "host", 255, empty=False)
    if not _good_name(host):
        raise InvalidRecord(f"host {host!r} is not a host name")
    if expect_host is not None and host != expect_host:
        raise InvalidRecord(f"record of host {host!r} where {expect_host!r} was asked")
    refused = d.get("refused")
    if refused is not None:  # the node would not start numabind (numabind.check._isolated)
        return NodeRow(
            host=host, state="unreachable", reason=f"not run: {_text(refused, 'refused')}"
        )
    facts_d = _dict(d.get("facts") or {}, "facts")
    mems = facts_d.get("cpuset_mems")
    facts = {
        "numa_balancing": _opt_bool(facts_d, "numa_balancing"),
        "cpuset_mems": None if mems is None else _cpus(mems, "cpuset_mems", _sysfs.MAX_NODES),
        "mempolicy_permitted": _opt_bool(facts_d, "mempolicy_permitted"),
        "kernel": _opt_text(facts_d, "kernel", 80),
    }
    notes = _texts(d.get("notes"), "notes")
    raw = d.get("ranks", [])
    if not isinstance(raw, list):
        raise InvalidRecord("ranks is not a list")
    if len(raw) > max_ranks and max_ranks == 1:
        raise InvalidRecord(f"a store record holds one rank, this one {len(raw)}")
    if len(raw) > max_ranks:
        kept = f"{len(raw)} ranks listed: the first {max_ranks} kept"
        notes, raw = (*notes[: MAX_NOTES - 1], kept), raw[:max_ranks]
    return host, facts, notes, raw


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def _opt_bool(d: dict[str, Any], key: str) -> bool | None:
    value = d.get(key)
    if value is not None and type(value) is not bool:
        raise InvalidRecord(f"{key} is not true or false")
    return value


# --- merging -----------------------------------------------------------------------------------


def layout(
    nodes: list[NodeRow], budget: Budget | None = None, notes: list[str] | None = None
) -> dict[str, int]:
    """Ranks per host from the step layouts the answering ranks carry (one per step).

    Every step's hostlist comes out of one host budget (``budget``'s, else
    :data:`MAX_HOSTS` for the call): a thousand fake steps cost no more than one real one
    of that size, and the same text is expanded once.  Past the budget or the deadline the
    remaining steps are left out, with a note in ``notes``."""
    budget = budget if budget is not None else Budget()
    per_host: dict[str, int] = {}
    steps: dict[tuple[str | None, str | None], RankRow] = {}
    for node in nodes:
        for r in node.ranks:
            if r.step_nodes and r.step_tasks:
                steps.setdefault((r.job_id, r.step_id), r)
    done: set[tuple[str, str]] = set()
    left = 0
    for r in steps.values():
        key = (r.step_nodes or "", r.step_tasks or "")
        if key in done:
            continue
        if budget.exhausted or budget.late():
            left += 1
            continue
        done.add(key)
        try:
            counts = expand_tasks(key[1])
            hosts = expand_hostlist(key[0], MAX_HOSTS, budget)  # at most one over the budget
        except InvalidRecord:
            if budget.exhausted:
                left += 1
            continue
        if len(hosts) != len(counts):
            continue
        for h, c in zip(hosts, counts):
            per_host[h] = per_host.get(h, 0) + c
    if left and notes is not None:
        notes.append(f"{left} step layout(s) not read: {budget.spent}")
    return per_host


def merge(
    job: str | None,
    hosts: list[str],
    answered: dict[str, NodeRow],
    notes: tuple[str, ...] = (),
    missing: IdList = EMPTY,
    budget: Budget | None = None,
    unread: int = 0,
) -> JobReport:
    """The report of ``hosts``: the rows that answered, an ``unreachable`` row (with the
    reason given in ``answered``'s placeholder, if any) for each that did not, the ranks
    that posted nothing (``missing``) or were not read (``unread``), and the summary.
    Linear in the rows; the step layouts come out of ``budget``."""
    rows: list[NodeRow] = []
    for h in hosts:
        rows.append(answered.get(h) or NodeRow(host=h, state="unreachable", reason="no answer"))
    for h, row in answered.items():
        if h not in hosts:
            rows.append(row)
    more: list[str] = []
    per_host = layout([r for r in rows if r.state == "answered"], budget, more)
    rows = [r.replace(expected=per_host.get(r.host)) for r in rows]
    counts = dict.fromkeys(STATUSES, 0)
    for node in rows:
        for rank in node.ranks:
            counts[rank.status] += 1
    gone = [n for n in rows if n.state != "answered"]
    lost = missing.size + unread + sum(n.expected or 0 for n in gone)
    summary = Summary(
        ranks=sum(counts.values()) + lost,
        nodes=len(rows),
        ok=counts["ok"],
        warnings=counts["warning"],
        off_plan=counts["off plan"],
        unreachable=lost + sum(1 for n in gone if n.expected is None),
        unknown=counts["unknown"] + counts["invalid"],
        unreachable_nodes=len(gone),
    )
    return JobReport(
        job=job,
        nodes=tuple(rows),
        summary=summary,
        notes=(*notes, *more),
        missing=missing,
        unread=unread,
    )


def exit_status(report: JobReport) -> int:
    """1 if a rank is off plan, else 3 if a node or rank could not be read, else 0."""
    s = report.summary
    if s.off_plan:
        return 1
    if s.unreachable_nodes or s.unknown or s.unreachable:
        return 3
    return 0


# --- the table ---------------------------------------------------------------------------------

HEADER = (
    "HOST",
    "RANK",
    "LOCAL",
    "PID",
    "GPU",
    "GPU NODE",
    "CPUS PLAN",
    "CPUS NOW",
    "MEMORY",
    "LOCAL MEM",
    "STATUS",
)


def _num(v: int | None) -> str:
    return "-" if v is None else str(v)


def _cells(r: RankRow) -> list[str]:
    gpu = "-" if r.gpu_pci is None else f"{_num(r.gpu_index)} {r.gpu_pci}"
    now = r.cpus or "-"
    if r.off_plan_threads:
        now += " !"
    plan = "-" if r.plan_cpus is None else r.plan_cpus or "-"
    mem = "-"
    if r.memory_policy is not None:
        mem = f"{r.memory_policy} {r.memory_nodes}".strip()
        if r.plan_policy not in (None, "none", "not-permitted") and (
            r.memory_policy != r.plan_policy
            or (r.plan_policy != "local" and r.memory_nodes != r.plan_mems)
        ):
            mem += " !"
    local = "-" if r.locality is None else f"{r.locality:.1%}"
    return [
        r.host,
        _num(r.rank),
        _num(r.local_rank),
        _num(r.pid),
        gpu,
        _num(r.gpu_node),
        str(plan),
        str(now),
        mem,
        local,
        r.status.upper(),
    ]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]


def _details(r: RankRow) -> list[str]:
    out = []
    for g in r.off_plan_threads:
        who = ", ".join(
            f"{t} {n!r}" if n else str(t) for t, n in zip(g.tids[:4], [*g.names, *[""] * 4])
        )
        more = f" and {g.count - len(g.tids[:4])} more" if g.count > len(g.tids[:4]) else ""
        allowed = (r.plan_cpus or EMPTY).union(EMPTY if r.pid in g.tids else r.plan_helpers)
        out.append(f"    - thread {who}{more} on CPUs {g.cpus}, plan {allowed}")
    shown = bool(r.off_plan_threads)  # check's own line says the same, without names
    out += [f"    - {p}" for p in r.problems if not (shown and p.startswith("threads that"))]
    out += [f"    note: {n}" for n in r.notes]
    for b in r.buffers:
        if b.locality is not None and b.locality < 0.99:
            share = f"{b.locality:.1%} on node {b.nodes}"
            out.append(f"    - host buffer of {b.nbytes >> 20} MiB: {share}")
    return out


def _signature(node: NodeRow) -> tuple[Any, ...]:
    """What makes two healthy nodes identical in the report (not their names or pids)."""
    return (
        tuple(
            (
                r.local_rank,
                r.gpu_index,
                r.gpu_node,
                r.plan_cpus,
                r.cpus,
                r.memory_policy,
                r.memory_nodes,
            )
            for r in sorted(node.ranks, key=lambda r: (r.local_rank or 0, r.rank or 0))
        ),
        tuple(sorted((k, str(v)) for k, v in node.facts.items())),
    )


def _facts(node: NodeRow) -> str:
    f = node.facts
    bits = []
    if f.get("numa_balancing") is not None:
        bits.append(f"NUMA balancing {'on' if f['numa_balancing'] else 'off'}")
    if f.get("cpuset_mems") is not None:
        bits.append(f"cpuset mems {f['cpuset_mems']}")
    if f.get("mempolicy_permitted") is False:
        bits.append("memory-policy calls NOT permitted (seccomp)")
    elif f.get("mempolicy_permitted"):
        bits.append("memory-policy calls permitted")
    if f.get("kernel"):
        bits.append(f"kernel {f['kernel']}")
    return ", ".join(bits)


def _hosts(names: list[str]) -> str:
    shown = ", ".join(names[:6])
    return shown + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def report_lines(report: JobReport) -> list[str]:
    """One screen: the summary, the ranks that are not healthy (and the nodes that did
    not answer) with what is wrong, then each group of identical healthy nodes once."""
    head = f"numabind check --job {report.job}: " if report.job else "numabind check: "
    if report.title:
        head = f"{report.title}: "
    lines = [head + report.summary.text()]
    lines += _unhealthy_lines(report)
    groups: dict[tuple[Any, ...], list[NodeRow]] = {}
    for n in report.nodes:
        if n.state == "answered":
            groups.setdefault(_signature(n), []).append(n)
    healthy = [g for g in groups.values() if all(r.status in HEALTHY for r in g[0].ranks)]
    if healthy:
        lines += ["", "HEALTHY"]
        for g in healthy:
            lines += _group_lines(g)
    for g in groups.values():
        if g in healthy:
            continue
        for n in g:
            ok = [r for r in n.ranks if r.status in HEALTHY]
            text = f"{n.host}: {len(ok)} of {len(n.ranks)} rank(s) ok; {_facts(n)}"
            lines.append(text.rstrip("; "))
    for n in report.nodes:
        lines += [f"note: {n.host}: {x}" for x in n.notes]
    lines += [f"note: {x}" for x in report.notes]
    return lines


def _unhealthy_lines(report: JobReport) -> list[str]:
    """``NOT HEALTHY``: ranks worst first with what is wrong, silent nodes, unposted ranks,
    and one line for the ranks a store held that were not read."""
    order = {s: i for i, s in enumerate(STATUSES)}
    bad = sorted(
        (r for n in report.nodes for r in n.ranks if r.status not in HEALTHY),
        key=lambda r: (order[r.status], r.host, r.rank if r.rank is not None else -1),
    )
    gone = [n for n in report.nodes if n.state != "answered"]
    if not (bad or gone or report.missing or report.unread):
        return []
    lines = ["", "NOT HEALTHY"]
    if bad:
        table = _table([list(HEADER)] + [_cells(r) for r in bad])
        lines.append(table[0])
        for r, text in zip(bad, table[1:]):
            lines.append(text)
            lines += _details(r)
    for n in gone:
        exp = f" ({n.expected} ranks expected)" if n.expected else ""
        lines.append(f"{n.host}  {n.state.upper()}: {n.reason}{exp}")
    if report.missing:
        size = report.missing.size
        shown = ", ".join(str(r) for r in report.missing.first(32))
        more = f" and {size - 32} more" if size > 32 else ""
        lines.append(f"NOT POSTED: rank {shown}{more} (no record before the wait ended)")
    if report.unread:
        lines.append(f"NOT READ: {report.unread} rank(s) (see the note below)")
    return lines


def _group_lines(group: list[NodeRow]) -> list[str]:
    """Identical healthy nodes: one title line and the first node's ranks."""
    first = group[0]
    names = [n.host for n in group]
    title = first.host if len(group) == 1 else f"{len(group)} identical nodes: {_hosts(names)}"
    ranks = sum(len(n.ranks) for n in group)
    lines = [f"{title}: {ranks} rank{'' if ranks == 1 else 's'} ok; {_facts(first)}".rstrip("; ")]
    if first.ranks:
        ordered = sorted(first.ranks, key=lambda r: (r.local_rank or 0, r.pid or 0))
        lines += ["  " + t for t in _table([list(HEADER)] + [_cells(r) for r in ordered])]
        if len(group) > 1:
            lines.append(f"  (the ranks of {first.host}; the other nodes' are the same)")
    return lines
