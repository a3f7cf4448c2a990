"""The answers the warm start replays: what the full path read and what it did, kept per
node so that the next process with the same inputs does the same without planning.

The startup hook's full path (:func:`numabind._startup.run`) runs with ``os.environ``
behind a :class:`Recorder`, which notes every variable the planner and the appliers look
at (by value; by presence alone where only ``in`` was asked; or as absent) and every
variable they set.  When it is done, :func:`keep` writes one *answer*: those inputs, the
command line and the CPU mask and memory policy the process started with (the inputs the
planner and the keep/replace rule read), and the outputs (the CPUs, the memory policy, the
pages to look at, the variables, the registry entry, the guard, the plan itself for
numabind to adopt later).  Answers live in the per-user cache directory, one file per
``NUMABIND_SYSROOT`` value, under the machine's key and the witnesses of its changeable
facts (numabind._facts): a machine that changed, or another numabind, is another file.

An answer is kept only where replaying it is exactly what the full path did: a process
that said nothing (no warning, no verbose line), applied cleanly (no refusal, no mask
kept, no main-thread pin), started with one thread and did not read the environment
whole; anything else is planned by the full path every time, as before the cache.  So the
warm start (``_numabind_start``) decides nothing: it compares and replays.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping, MutableMapping

import _numabind_base as base

from . import _cache, _facts, _text
from ._model import POLICIES

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ._apply import Binding
    from ._environ import Config
    from ._topology import Machine

MAX_ANSWERS = base.MAX_ANSWERS  # per file: the oldest go first


class Recorder(MutableMapping[str, str]):
    """``os.environ`` as the full path sees it, noting every name looked at and set."""

    def __init__(self, real: MutableMapping[str, str]) -> None:
        self.real = real
        self.reads: dict[str, str] = {}  # name -> "=value", "-" (absent), "?1"/"?0"
        self.writes: dict[str, str | None] = {}
        self.whole = False  # iterated: every name was an input

    def _saw(self, name: str, value: str | None, presence: bool = False) -> None:
        if name in self.writes:
            return  # its own write, read back
        known = self.reads.get(name)
        if known is not None and known[:1] != "?":
            return
        if value is None:
            self.reads[name] = "-"
        elif presence:
            self.reads.setdefault(name, "?1")
        else:
            self.reads[name] = "=" + value

    def __getitem__(self, name: str) -> str:
        try:
            value = self.real[name]
        except KeyError:
            self._saw(name, None)
            raise
        self._saw(name, value)
        return value

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        value = self.real.get(name)
        self._saw(name, value)
        return default if value is None else value

    def __contains__(self, name: object) -> bool:
        found = name in self.real
        if isinstance(name, str):
            self._saw(name, self.real.get(name) if found else None, presence=True)
        return found

    def __setitem__(self, name: str, value: str) -> None:
        self.real[name] = value
        self.writes[name] = value

    def __delitem__(self, name: str) -> None:
        del self.real[name]
        self.writes[name] = None

    def __iter__(self) -> Iterator[str]:
        self.whole = True
        return iter(self.real)

    def __len__(self) -> int:
        self.whole = True
        return len(self.real)

    def copy(self) -> dict[str, str]:
        self.whole = True
        return dict(self.real)

    @property
    def _data(self) -> object:
        self.whole = True
        return getattr(self.real, "_data", None)


def started_inside(
    current: frozenset[int],
    previous: tuple[int, frozenset[int]] | None,
    home: frozenset[int],
    nodes: frozenset[int],
) -> bool:
    """Whether every page this process has can only be on ``nodes`` already, so that a
    replay need not read numa_maps: it ran only on ``current`` since its exec made its
    memory, one thread, under the policy it inherited.  True when that policy placed pages
    on ``nodes`` only (bind, preferred or interleave there), or on the running CPU's node
    (default, local) and every CPU it may run on is one of ``nodes``' (``home``): a rank
    its launcher confined to its node.  A policy with mode flags (relative nodes) does not
    say where its pages are in node numbers: those are looked at."""
    if previous is None:
        return False
    code, where = previous
    if code & ~0xFF:
        return False
    if code in (0, 4):  # MPOL_DEFAULT, MPOL_LOCAL: where the thread ran
        return bool(current) and current <= home
    return code in (1, 2, 3, 5) and bool(where) and where <= nodes


def _code(policy: str) -> int | None:
    return POLICIES[policy].code


def _lines_in(
    rec: Recorder, start_mask: frozenset[int], policy: tuple[int, frozenset[int]] | None
) -> list[str]:
    # cheapest and most telling first (the warm start stops at the first that differs):
    # the command line, the mask, the names found, those not found (one line, one test),
    # and last the policy (reading it loads _ctypes)
    argv = getattr(sys, "orig_argv", None) or sys.argv
    out = ["argv " + " ".join(base.escape(a) for a in argv), f"mask {base.cpulist(start_mask)}"]
    out += [
        f"i {base.escape(k)} {v if v[:1] != '=' else '=' + base.escape(v[1:])}"
        for k, v in rec.reads.items()
        if v != "-"
    ]
    absent = [base.escape(k) for k, v in rec.reads.items() if v == "-"]
    if absent:
        out.append("absent " + " ".join(absent))
    if policy is not None:
        out.append(f"policy {policy[0]} {base.cpulist(policy[1])}")
    return out


def _lines_out(
    rec: Recorder,
    b: Binding | None,
    cfg: Config,
    machine: Machine | None,
    start_mask: frozenset[int],
) -> list[str] | None:
    out: list[str] = []
    if b is not None and b.plan.bound:
        plan = b.plan
        if b.threads_rebound:
            out.append(f"cpus {base.cpulist(plan.cpus)}")
        if b.policy_applied:
            code = _code(b.policy_applied)
            if code is None:
                return None
            out.append(f"mempolicy {code} {base.cpulist(b.policy_nodes)}")
            if plan.memory_nodes and machine is not None:
                home: set[int] = set()
                for n in plan.memory_nodes:
                    node = machine.node(n)
                    home |= node.cpus if node is not None else set()
                if not started_inside(
                    start_mask, b._previous_policy, frozenset(home), plan.memory_nodes
                ):
                    move_as = POLICIES[b.policy_applied].migrate_as or "bind"
                    dest = min(plan.memory_nodes, key=lambda n: (n != plan.numa_node, n))
                    mask = base.cpulist(plan.memory_mask) or "-"
                    out.append(f"pages {base.cpulist(plan.memory_nodes)} {move_as} {dest} {mask}")
        out.append("plan " + _text.encode(plan, _text.all_records()))
        out.append(f"binding {int(bool(b.threads_rebound))} {b.policy_applied or '~'}")
    for name, value in rec.writes.items():
        out.append(
            f"env {base.escape(name)} " + ("-" if value is None else "=" + base.escape(value))
        )
    if b is not None and b.registered:
        label = b.registered.rpartition("/")[0]
        entry = b.entry().replace(machine="answer").encode()
        # the per-process lines (pid, start) come first: the replay writes its own
        body = entry.split(b"\n", 2)[2] if entry.startswith(b"pid=") else None
        if body is None:
            return None
        out.append(f"entry {base.escape(label)} {base.escape(body.decode('utf-8', 'replace'))}")
    if b is not None and b.plan.bound and cfg.guard:
        out.append("guard")
    return out


def replayable(rec: Recorder, b: Binding | None, cfg: Config | None, said: int) -> bool:
    """Whether replaying what the full path did here is exactly what it did."""
    if cfg is None or rec.whole or said or not cfg.cache or base.unseen:
        return False
    if "pynvml" in sys.modules:  # the driver answered: not an input the warm start can compare
        return False
    if cfg.verbose or cfg.torch or cfg.ray or cfg.report or cfg.omp_places != "off":
        return False
    if any(m in sys.modules for m in ("numabind._handback", "numabind.check._report")):
        return False
    try:
        if len(os.listdir("/proc/self/task")) != 1:
            return False
    except OSError:
        return False
    if b is None:
        return True
    return not (
        b.errors
        or b.refused
        or b.existing
        or b.kept_cpus
        or b.main_thread is not None
        or b.warnings
        or (b.plan.bound and not b.cpus_applied)
    )


def keep(
    rec: Recorder,
    b: Binding | None,
    start_mask: frozenset[int],
    said: int,
    seen: Mapping[str, object],
) -> str | None:
    """Write the answer of this process, when it may be replayed; its file, or None.
    ``seen``: what the full path planned with (its ``cfg``, its ``machine``)."""
    from ._environ import Config
    from ._topology import Machine

    cfg = seen.get("cfg")
    machine = seen.get("machine")
    if not isinstance(cfg, Config) or not replayable(rec, b, cfg, said):
        return None
    m = machine if isinstance(machine, Machine) else None
    source = getattr(m, "source", None)
    if not isinstance(source, _facts.Recording):
        return None
    sysroot = cfg.sysroot
    found = _facts.witnesses(source, sysroot)
    if found is None:
        return None
    outputs = _lines_out(rec, b, cfg, m, start_mask)
    if outputs is None:
        return None
    previous = b._previous_policy if b is not None else None
    answer = ["a", *_lines_in(rec, start_mask, previous), "=", *outputs, "."]
    return _store(rec.real, sysroot, found, answer)


STORE_WAIT = 0.5  # seconds a rank waits for another's write of the answers file


def _store(
    environ: MutableMapping[str, str],
    sysroot: str,
    found: list[tuple[str, str, str]],
    answer: list[str],
) -> str | None:
    raw = environ.get("NUMABIND_SYSROOT")
    if base.no_replay(environ) is not None:
        return None  # never read back: nothing is written
    fd, label, _ = base.open_cache_dir(environ, True)
    if fd is None:
        return None
    name = base.answers_name(raw)
    lock = _cache._Lock(fd, name)  # a node's ranks start at once: no answer lost between them
    try:
        deadline = time.monotonic() + STORE_WAIT
        while not lock.take():
            if lock.fd is None or time.monotonic() >= deadline:
                return None  # the next rank of this shape keeps it
            time.sleep(0.002)
        kept: list[list[str]] = []
        bad, data, _ = base.read_private(fd, name, (os.geteuid(),), base.CACHE_CAP)
        lines, _ = base.unframe(data, "answers") if bad is None else ([], "")
        key = base.machine_key(sysroot)
        held: list[tuple[str, str, str]] = []
        first = base.WITNESSES_FROM["answers"]
        if (
            lines
            and base.answers_sysroot(lines, raw)[0] == sysroot
            and not base.machine_holds(lines, sysroot, first, held, key=key)[1]
        ):
            kept = _answers(lines)  # made under this sysroot, of this machine: kept beside
        # this answer was made under what its witnesses said when it was read: where any
        # says otherwise now (the machine changed while it planned), it is not kept (what
        # the old file's witnesses said just now is not read again)
        now = {(kind, path): said for kind, path, said in held}
        prefix = base.tree(sysroot)
        for kind, path, said in found:
            if (now.get((kind, path)) or base.witness(kind, prefix + path)) != said:
                return None
        # the file's witnesses are those of every answer in it: a rank that read the machine
        # itself (it waited too long for the node's reading) witnesses what its own plan
        # asked, and the answers kept beside its own still need theirs
        merged = {(kind, path): said for kind, path, said in held if kept}
        merged.update({(kind, path): said for kind, path, said in found})
        head = base.answers_head(key, sysroot, raw, [(k, p, v) for (k, p), v in merged.items()])
        kept = [a for a in kept if a[: a.index("=")] != answer[: answer.index("=")]]
        kept = [*kept[-(MAX_ANSWERS - 1) :], answer]
        data = base.frame("answers", [*head, *(line for a in kept for line in a)])
        if len(data) > base.CACHE_CAP:
            return None
        if base.write_private(fd, name, data, "answers") is not None:
            return None
        _cache.prune(fd, name, "answers-")  # one file per sysroot value: the oldest go
    finally:
        lock.close()
        os.close(fd)
    return f"{label}/{name}"


def _answers(lines: list[str]) -> list[list[str]]:
    """The answers of a file's lines (its machine part skipped), each as its lines."""
    out: list[list[str]] = []
    current: list[str] | None = None
    for line in lines:
        if line == "a":
            current = [line]
        elif current is not None:
            current.append(line)
            if line == ".":
                if "=" in current:
                    out.append(current)
                current = None
    return out
