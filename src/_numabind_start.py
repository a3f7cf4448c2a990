"""The startup entry: whether numabind has anything to do in this interpreter, and for a
rank whose answer the planner already gave on this node, its replay (the warm start).

``start()`` decides from the environment alone.  It is the one start path of all three
hook forms: the ``.pth`` line (which has already seen a trigger variable, with the
cheapest test Python offers: one dictionary intersection, compiled at every start of every
interpreter), PEP 829's ``_numabind_hook.start`` (Python 3.15+, which has not) and the
``sitecustomize`` form.  ``NUMABIND=0``/``off`` is checked here, before anything else.

**The warm start decides nothing.**  The first time a rank of a given shape starts on a
node, the full path (``numabind._startup``) plans and binds it, and records what it read
(the environment variables it looked at, by value, or by presence alone; the command line;
the CPU mask and memory policy the process started with) and what it did (the CPUs, the
memory policy, the pages to look at, the variables it set, the registry entry, the guard,
the plan), in the per-user answers file of the cache (``numabind._replay`` writes it).  A
later process finds its answer here when every one of those inputs is the same and the
machine has not changed: the key (boot, kernel, mount namespace, user, cgroup, sysroot,
numabind's code) is the same and every witness (the cpuset, the CPUs and nodes online, the
GPUs and their nodes, ...) still says what it said.  It then does exactly what the full path
did, with the one applier (``_numabind_base``), and numabind adopts it later without
planning again.  Anything else (no answer, another input, a damaged file, a changed
machine, a refused call) goes to the full path, with the reason in :data:`handed_over`.

Only ``os``, ``sys``, ``stat`` and ``_numabind_base`` are imported; the package only to
hand over (the full path, the guards at the first import they watch, and the page
migration of a rank that started off its node); it never raises into the interpreter.
"""

import os
import sys

import _numabind_base as base

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

# why this process went to the full path ("" when its answer was replayed)
handed_over = ""
# where the binding came from: "answer" (replayed), else the full path's machine origin
machine_origin = ""
_done: list[bool] = []


def start() -> None:
    try:
        env = os.environ
        if env.get("NUMABIND", "").strip().lower() in ("0", "off"):
            return
        for name in base.TRIGGERS:  # a loop, not any(): a generator is one more code object
            if name in env:
                break
        else:
            return
        if _done:
            return  # a venv processes each .pth twice (CPython #75723)
        _done.append(True)
        _note_stderr()
        global handed_over
        try:
            handed_over = replay(env)
        except Exception as err:  # replay undoes what it applied before it raises
            handed_over = f"the replay failed ({type(err).__name__}: {err})"
        if not handed_over:
            return
        from numabind import _startup

        _startup.run()
    except Exception as err:
        base.failed(err)


def _note_stderr() -> None:
    if sys.__stderr__ is None:
        return
    try:
        st = os.fstat(2)
    except OSError:
        return
    base.stderr_at_start = (st.st_dev, st.st_ino)


class Handover(Exception):
    """The replay cannot do this process: the full path does (the reason is said in
    verbose mode and recorded in the registry entry's ``machine`` field)."""


def _read_answers(env: "os._Environ[str]") -> "list[str]":
    """The lines of this process's answers file, whole and of this format."""
    off = base.no_replay(env)
    if off is not None:
        raise Handover(off)
    data, path, why = base.read_cache(env, base.answers_name(env.get("NUMABIND_SYSROOT")))
    if data is None:
        raise Handover("no answer yet" if why == base.NO_CACHE else why)
    lines, why = base.unframe(data, "answers")
    if not lines:
        raise Handover(f"{path} refused: {why}")
    return lines


def _machine_holds(lines: "list[str]", env: "os._Environ[str]") -> int:
    """Check the file's machine part against this process (the sysroot decision, the key,
    the witnesses); the index of its first answer line."""
    raw = env.get("NUMABIND_SYSROOT")
    sysroot, why = base.answers_sysroot(lines, raw)
    if sysroot is None:
        raise Handover(why)
    if raw and os.geteuid() == 0 and (sysroot == raw) != (base.root_owned_path(raw) is None):
        raise Handover("the sysroot's ownership changed")  # the redirect rule's for root
    i, why = base.machine_holds(lines, sysroot, base.WITNESSES_FROM["answers"])
    if why:
        raise Handover(why)
    return i


def _input_holds(line: str, env: "os._Environ[str]", state: "dict[str, Any]") -> bool:
    """Whether one input line of an answer says what this process has."""
    kind, _, rest = line.partition(" ")
    if kind == "absent":
        return _absent(rest, env)
    if kind == "i":
        name, _, said = rest.partition(" ")
        got = env.get(base.unescape(name))
        if said == "-":
            return got is None
        if said[:1] == "?":
            return (got is not None) == (said == "?1")
        return got is not None and said[:1] == "=" and base.unescape(said[1:]) == got
    if kind == "argv":
        argv = getattr(sys, "orig_argv", None) or sys.argv
        return rest == " ".join(base.escape(a) for a in argv)
    if kind == "mask":
        return rest == base.cpulist(state["mask"])
    if kind == "policy":
        mode, nodes = _policy(state)
        return rest == f"{mode} {base.cpulist(nodes)}"
    return False  # an input of a kind this module does not know: not this answer


def _absent(rest: str, env: "os._Environ[str]") -> bool:
    """Whether none of the names the full path looked up and did not find is set: one set
    test, as the .pth line's, where no name needed escaping."""
    data = getattr(env, "_data", None)
    if isinstance(data, dict) and "%" not in rest:
        return data.keys().isdisjoint(rest.encode("utf-8", "surrogateescape").split(b" "))
    return all(base.unescape(name) not in env for name in rest.split(" "))


def _policy(state: "dict[str, Any]") -> "tuple[int, frozenset[int]]":
    """The memory policy the process started with (read once: it loads ``_ctypes``)."""
    if "calls" not in state:
        state["calls"] = base.Calls()
        state["policy"] = state["calls"].get()
    policy: tuple[int, frozenset[int]] = state["policy"]
    return policy


def _find(
    lines: "list[str]", i: int, env: "os._Environ[str]"
) -> "tuple[list[str], dict[str, Any]]":
    """The output lines of the first answer whose every input holds, and the state read."""
    state: dict[str, Any] = {"mask": frozenset(os.sched_getaffinity(0))}
    seen = 0
    while i < len(lines) and lines[i] == "a":
        seen += 1
        if seen > base.MAX_ANSWERS:
            break
        i += 1
        ok = True
        while i < len(lines) and lines[i] != "=":
            if ok and not _input_holds(lines[i], env, state):
                ok = False
            i += 1
        i += 1
        out = []
        while i < len(lines) and lines[i] != ".":
            out.append(lines[i])
            i += 1
        i += 1
        if ok:
            return out, state
    raise Handover("no answer for this process's inputs yet")


def replay(env: "os._Environ[str]") -> str:
    """Do what the full path did for a process with these inputs on this machine; '' when
    done, else why the full path must (nothing applied is left behind)."""
    try:
        lines = _read_answers(env)
        first = _machine_holds(lines, env)
        out, state = _find(lines, first, env)
        try:
            threads = os.listdir("/proc/self/task")
        except OSError:
            threads = []
        if len(threads) != 1:
            raise Handover("more than one thread at start")
        _apply(out, _after_calls(out), env, state)
    except Handover as h:
        return str(h)
    return ""


def _after_calls(out: "list[str]") -> "list[tuple[str, str, str | None]]":
    """The outputs that follow the calls (the variables, the registry entry, the guards),
    decoded before any call is made: a token escape() cannot have made, or an output of a
    kind this module does not know (a newer writer's), hands over with nothing applied."""
    later: list[tuple[str, str, str | None]] = []
    for line in out:
        kind, _, rest = line.partition(" ")
        if kind not in base.ANSWER_OUTPUTS:
            raise Handover(f"an answer this start module cannot replay ({line[:16]})")
        try:
            if kind == "env":
                name, _, value = rest.partition(" ")
                said = None if value == "-" else base.unescape(value[1:])
                later.append((kind, base.unescape(name), said))
            elif kind == "entry":
                label, _, data = rest.partition(" ")
                later.append((kind, base.unescape(label), base.unescape(data)))
            elif kind == "guard":
                later.append((kind, "", None))
        except ValueError:
            raise Handover(f"a damaged answer ({kind})") from None
    return later


def _apply(
    out: "list[str]",
    later: "list[tuple[str, str, str | None]]",
    env: "os._Environ[str]",
    state: "dict[str, Any]",
) -> None:
    """The answer's outputs, in the full path's order: CPUs, memory policy, pages, then
    ``later`` (:func:`_after_calls`: the variables, the registry entry, the guards).  A
    failed call undoes what was done and hands over (the full path then says what failed)."""
    done: dict[str, object] = {}
    record: dict[str, object] = {"plan": "", "binding": "", "registered": None}
    try:
        for line in out:
            kind, _, rest = line.partition(" ")
            if kind == "cpus":
                cpus = base.parse_cpulist(rest)
                if not cpus:
                    raise Handover("a damaged answer (cpus)")
                os.sched_setaffinity(0, cpus)
                done["previous_cpus"] = state["mask"]
                record["cpus"] = cpus
            elif kind == "mempolicy":
                _set_policy(rest, state, done)
            elif kind == "pages":
                _pages(rest.split(" "))
            elif kind in ("plan", "binding"):
                record[kind] = rest
    except (OSError, ValueError) as err:
        _undo(done)
        raise Handover(f"a call failed ({err})") from None
    except BaseException:
        _undo(done)
        raise
    record.setdefault("cpus", state["mask"])
    record.update(done)
    for kind, name, value in later:  # nothing below can fail in a way that needs an undo
        if kind == "env":
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        elif kind == "entry":
            head = f"pid={os.getpid()}\nstart={base.start_time()}\n"
            if base.register(name, (head + (value or "")).encode()) is None:
                record["registered"] = f"{name}/{os.getpid()}"
                record["registered_label"] = name
        elif kind == "guard":
            sys.meta_path.insert(0, _Armer())
    global machine_origin
    machine_origin = "answer"
    base.applied = record


def _set_policy(rest: str, state: "dict[str, Any]", done: "dict[str, object]") -> None:
    mode, _, nodes = rest.partition(" ")
    parsed = base.parse_cpulist(nodes, base.MAX_NODES)
    if parsed is None or not mode.isdigit():
        raise Handover("a damaged answer (mempolicy)")
    previous = _policy(state)
    calls: base.Calls = state["calls"]
    calls.set(int(mode), parsed)
    done.update(calls=calls, previous_policy=previous, policy_nodes=parsed)


def _pages(args: "list[str]") -> None:
    """A rank that may have run off its node before it was bound: its private pages off
    the plan's nodes are moved there, by the package's one migration (loaded only here)."""
    target = base.parse_cpulist(args[0], base.MAX_NODES) if args else None
    if target is None or len(args) != 4 or not args[2].isdigit():
        raise ValueError("a damaged answer (pages)")
    from numabind._sysfs import anon_pages_outside

    if not anon_pages_outside(target):
        return
    from numabind._range import migrate_private

    mask = base.parse_cpulist(args[3], base.MAX_NODES) or frozenset()
    moved = migrate_private(target, args[1], int(args[2]), mask)
    if moved is not None and moved.refused:
        raise Handover("page migration was refused")


def _undo(done: "dict[str, object]") -> None:
    """Put back what the replay applied before it handed over (pages it moved stay)."""
    cpus = done.get("previous_cpus")
    if isinstance(cpus, frozenset):
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass
    calls, previous = done.get("calls"), done.get("previous_policy")
    if isinstance(calls, base.Calls) and isinstance(previous, tuple):
        try:
            calls.set(previous[0], previous[1])
        except OSError:
            pass


class _Armer:
    """numabind's guards (``numabind._guard.arm``), armed when the first import they watch
    happens rather than at start: until then no numabind module is loaded for them, and
    then only the guards' own (no planner, no machine)."""

    NAMES = ("torch", "numpy", "torch.distributed.distributed_c10d")

    def __init__(self) -> None:
        self.done = False

    def find_spec(
        self, name: str, path: "Sequence[str] | None" = None, target: "ModuleType | None" = None
    ) -> "ModuleSpec | None":
        if self.done or name not in self.NAMES:
            return None
        self.done = True  # stays in sys.meta_path, answering nothing (removing it while the
        # import system walks the list would skip the next finder)
        try:
            from numabind import _guard

            _guard.arm(base.intended_cpus)
            finder = _guard._finder
            return finder.find_spec(name, path, target) if finder is not None else None
        except Exception as err:
            base.failed(err)
            return None
