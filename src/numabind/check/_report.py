"""The job report from inside torch.distributed (``NUMABIND_REPORT=1``, ``numabind.report()``).

After ``init_process_group`` each rank checks itself (numabind.check._inspect: every thread's
CPUs, memory policy and placement, its GPU, who it is) and writes that record, one node
record with one rank, into the job's own key-value store: the store of the default process
group, under ``numabind/<run id>/<restart count>/<rank>``, so that an elastic restart
never mixes generations.  Nothing else is exchanged: no collective the user did not ask
for, no daemon.  One rank (``NUMABIND_REPORT_RANK``, default 0) waits in a background
thread until every rank has posted, or ``NUMABIND_REPORT_WAIT`` seconds (default 60), and
prints the job table (numabind.check._job) on stderr, naming the ranks that did not post;
training is never blocked by it.  The records are input there: validated like a
collector's (schema, bounds, cleaned text), a record under another rank's key or naming
another rank is an invalid row, never a crash.

The keys go into the store under any prefix the process group adds (torchrun's
``default_pg``), so ``numabind check --job --store HOST:PORT`` reads them from outside the
job with a client of the same store (``MASTER_ADDR:MASTER_PORT``), read only.
"""

from __future__ import annotations

import os
import re
import threading
import time
from typing import Any

from .._output import say, say_lines
from . import _job

PREFIX = "numabind"
LATEST = f"{PREFIX}/latest"  # "<run id>/<restart>/<world size>" of the newest generation
MAX_WAIT = 3600.0
MAX_WORLD = 1 << 20
POLL = 0.2  # seconds between looks at the posted count
READ_SECONDS = 30.0  # reading the records, after the wait


def _generation() -> str:
    """``<run id>/<restart count>`` of this torchrun generation (``none/0`` outside it)."""
    run = os.environ.get("TORCHELASTIC_RUN_ID", "") or "none"
    run = re.sub(r"[^A-Za-z0-9_.-]", "_", run)[:64]
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if not (restart.isascii() and restart.isdigit() and len(restart) < 7):
        restart = "0"
    return f"{run}/{int(restart)}"


def _number(raw: str, name: str, default: float, top: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= top:
        say(f"{name}={raw[:40]!r} is not a number from 0 to {top:g}; using {default:g}")
        return default
    return value


def base_store(store: Any) -> Any:
    """The store under the process group's prefixes (``default_pg``, torchrun's attempt):
    the one ``MASTER_ADDR:MASTER_PORT`` serves, where an outside reader finds the keys."""
    for _ in range(16):
        under = getattr(store, "underlying_store", None)
        if under is None:
            break
        store = under
    return store


def own_record() -> bytes:
    """This process checked, as a node record holding one rank."""
    import json

    from .._environ import Config
    from .._topology import Machine
    from . import _inspect

    machine = Machine.from_root(Config.from_env().sysroot)
    try:
        report = _inspect.check([os.getpid()], machine, own_env=os.environ)
    finally:
        machine.close()
    record = _job.node_record(report, None)
    return json.dumps(record, separators=(",", ":")).encode()


def report(*, wait: float | None = None, rank: int | None = None) -> threading.Thread | None:
    """Post this rank's record to the default process group's store and, on the reporting
    rank (``rank``, else ``NUMABIND_REPORT_RANK``, else 0), start the thread that prints
    the job table once every rank has posted or after ``wait`` seconds (else
    ``NUMABIND_REPORT_WAIT``, else 60).  Returns that thread (None on other ranks).  Call it
    after ``init_process_group``, on every rank; it enters no collective.  Raises
    :class:`~numabind.IntegrationError` (``FrameworkMissing``, an ``ImportError`` too)
    where torch is not installed."""
    from .._errors import require

    require("torch", "torch", "pip install torch", "numabind.report()")
    import torch.distributed as dist

    from .._environ import Config

    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("numabind.report(): call it after torch.distributed.init_process_group")
    store = base_store(dist.distributed_c10d._get_default_store())
    me, world = dist.get_rank(), dist.get_world_size()
    cfg = Config.from_env()
    if wait is None:
        wait = _number(cfg.report_wait, "NUMABIND_REPORT_WAIT", 60.0, MAX_WAIT)
    if rank is None:
        rank = int(_number(cfg.report_rank, "NUMABIND_REPORT_RANK", 0, MAX_WORLD))
        if rank >= world:
            say(f"NUMABIND_REPORT_RANK={rank} is not a rank of this job ({world} ranks); using 0")
            rank = 0
    gen = _generation()
    prefix = f"{PREFIX}/{gen}"
    store.set(f"{prefix}/{me}", own_record())
    store.add(f"{prefix}/posted", 1)
    if me != rank:
        return None
    store.set(LATEST, f"{gen}/{world}")
    thread = threading.Thread(
        target=_print_when_posted,
        args=(store, prefix, world, float(wait)),
        name="numabind-report",
        daemon=True,
    )
    thread.start()
    return thread


def _print_when_posted(store: Any, prefix: str, world: int, wait: float) -> None:
    try:
        deadline = time.monotonic() + wait
        while int(store.add(f"{prefix}/posted", 0)) < world and time.monotonic() < deadline:
            time.sleep(POLL)
        reader, close = _bounded_reader(store, time.monotonic() + READ_SECONDS)
        try:
            report = read_report(reader, prefix, world, wait, time.monotonic() + READ_SECONDS)
        finally:
            close()
        say_lines(_job.report_lines(report))
    except Exception as err:  # the user's training must never see this thread fail
        say(f"job report: not printed ({type(err).__name__}: {err})")


def _bounded_reader(store: Any, deadline: float) -> tuple[Any, Any]:
    """The records are read through numabind's own client where the store is a TCPStore
    (torch's client allocates whatever length a value announces, and any peer that
    reaches the store may have set one); another kind of store (a FileStore, a HashStore)
    through its own ``get``.  Returns (reader, close)."""
    from ._store import StoreClient, StoreError

    host, port = getattr(store, "host", None), getattr(store, "port", None)
    if isinstance(host, str) and isinstance(port, int) and 0 < port < 65536:
        try:
            client = StoreClient(host, port, deadline, _job.STORE_RECORD_BYTES)
        except StoreError:
            return store, lambda: None
        return client, client.close
    return store, lambda: None


def read_report(
    store: Any,
    prefix: str,
    world: int,
    wait: float | None,
    deadline: float | None = None,
    budget: _job.Budget | None = None,
) -> _job.JobReport:
    """The records under ``prefix`` (ranks 0..world-1), merged: one node row per host the
    records name, an invalid row per record that does not pass (the first
    :data:`numabind.check._job.MAX_INVALID`; the others counted), the ranks with none listed as
    not posted.  Each record is a store record (one rank, :data:`numabind.check._job.
    STORE_RECORD_BYTES`); all of them come out of one report budget.  Once the store
    stops answering, the deadline (a ``time.monotonic()`` value) passes or the budget is
    spent, the ranks left are one line, whatever ``world`` claims."""
    budget = budget if budget is not None else _job.Budget(deadline)
    hosts: dict[str, _job.NodeRow] = {}
    invalid: list[_job.RankRow] = []
    more_invalid = 0
    missing: list[tuple[int, int]] = []
    unread, stopped = 0, ""
    world = min(world, MAX_WORLD)
    for r in range(world):
        if budget.exhausted or budget.late():
            unread, stopped = world - r, f"{budget.spent}"
            break
        try:
            row, absent = _read_one(store, f"{prefix}/{r}", budget)
        except _Unreadable as err:
            unread = world - r
            stopped = f"the store stopped answering at rank {r} ({err})"
            if budget.late():  # the wait ended inside a request
                stopped = f"{budget.spent}"
            break
        if absent:
            if missing and missing[-1][1] == r - 1:
                missing[-1] = (missing[-1][0], r)
            else:
                missing.append((r, r))
            continue
        problem = _problem(row, r)
        if problem:
            if len(invalid) < _job.MAX_INVALID:
                invalid.append(
                    _job.RankRow(host="?", pid=None, rank=r, status="invalid", problems=(problem,))
                )
            else:
                more_invalid += 1
            continue
        have = hosts.get(row.host)
        hosts[row.host] = row if have is None else have.replace(ranks=have.ranks + row.ranks)
    if invalid:
        hosts["?"] = _job.NodeRow(host="?", state="answered", ranks=tuple(invalid))
    posted_none = sum(b - a + 1 for a, b in missing)
    notes: list[str] = [SELF_REPORTED]
    if posted_none and wait is not None:
        notes.append(f"{posted_none} rank(s) posted no record within {wait:g} s")
    if more_invalid:
        notes.append(f"{more_invalid} more invalid record(s), not listed")
    if unread:
        notes.append(f"{unread} rank(s) not read: {stopped}")
    run, _, restart = prefix.removeprefix(f"{PREFIX}/").rpartition("/")
    report = _job.merge(
        run,
        list(hosts),
        hosts,
        tuple(notes),
        _job.IdList.of_ranges(missing),
        budget,
        unread + more_invalid,
    )
    return report.replace(title=f"numabind job report ({_where(run, restart)})")


# what the elastic agent sets in every worker, whatever the rendezvous (LAUNCHERS.md)
_TORCHRUN_SIGNS = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "ROLE_NAME", "GROUP_RANK")


def _where(run: str, restart: str) -> str:
    """The job the records are of, for the title.  torchrun's run id defaults to "none"
    (a static rendezvous, --rdzv-id unset), and a reader outside the job sees no torchrun
    variable at all: neither means the job is not torchrun's, so no title says that."""
    if run != "none":
        return f"torchrun run {run}, restart {restart}"
    if any(os.environ.get(name) for name in _TORCHRUN_SIGNS):
        return f"torchrun, static rendezvous: no run id, restart {restart}"
    return "no torchrun run id"


def _problem(row: _job.NodeRow, r: int) -> str:
    """Why rank ``r``'s record is not a row of its own ("" when it is)."""
    problem = row.reason if row.state != "answered" else ""
    if not problem and (len(row.ranks) != 1 or row.ranks[0].status == "invalid"):
        problem = row.ranks[0].problems[0] if row.ranks else "a record without a rank"
    if not problem and row.ranks[0].rank != r:
        problem = f"a record under rank {r}'s key names rank {row.ranks[0].rank}"
    return problem


SELF_REPORTED = (
    "store records are self-reported: each rank wrote its own, and anyone who can reach "
    "the store could have written one (a c10d store has no authentication)"
)


class _Unreadable(Exception):
    """The store can no longer be read (closed, silent, or not speaking its protocol)."""


def _read_one(store: Any, key: str, budget: _job.Budget) -> tuple[_job.NodeRow, bool]:
    """One rank's record as a row, or (_, True) when it has none; a value refused for its
    length is an invalid row; raises :class:`_Unreadable` when the store is gone."""
    from ._store import StoreError

    try:
        if not store.check([key]):
            return _job.NodeRow(host="?", state="invalid"), True
        value = store.get(key)
    except StoreError as err:  # numabind's own client: too long (and reconnected), or gone
        if getattr(store, "usable", False):
            return _job.NodeRow(host="?", state="invalid", reason=f"not read: {err}"), False
        raise _Unreadable(str(err)) from None
    except Exception as err:  # torch's client (in-job, a store of another kind)
        raise _Unreadable(f"{type(err).__name__}: {err}") from None
    raw = bytes(value[: _job.STORE_RECORD_BYTES + 1])
    return _job.parse_node(raw, max_ranks=1, budget=budget), False


# --- NUMABIND_REPORT=1: after init_process_group ------------------------------------------------


def arm() -> None:
    """Post (and print) the report after the first ``init_process_group``: watch the
    import of torch's c10d (nothing is imported before)."""
    from .._guard import after_import

    after_import("torch.distributed.distributed_c10d", wrap)


def wrap(c10d: Any) -> None:
    """Post the report after ``init_process_group`` returns (and the name
    ``torch.distributed`` re-exports), through the guard's one wrapper."""
    from .._guard import around_init_process_group

    around_init_process_group(c10d, "report", _after_init)


def _after_init(call: Any) -> Any:
    result = call()
    try:
        report()
    except Exception as err:  # the report is never worth a failed start
        say(f"job report: not posted ({type(err).__name__}: {err})")
    return result
