"""One driver for the VM scripts' steps: each step is timed, reported as it starts and ends,
and held to a budget, so that a boot which hangs says where instead of running out the VM's
clock with nothing to show.

A CI run once lost a whole boot (scripts/numa-vm's 600 s) to one scenario that never
returned, and all it printed was "timed out": the results file is only read when the boot
succeeds, and the guest wrote nothing on the way.  Now:

* each step's start and end go to stderr at once (scripts/numa-vm prints the guest's
  stderr even when it stops the VM);
* a step past ``budget`` seconds gets where it was, every thread's traceback and a list of
  this driver's descendants (state, kernel wait channel, command line) recorded as its
  error, whatever its own cleanup raised after; the descendants are stopped and killed
  (the driver is their subreaper, so a grandchild orphaned by ``subprocess.run``'s own
  kill is among them), and the next step runs;
* the results file is rewritten after every step, and the host side shows what it holds
  when a boot fails (tests/test_vm.py).
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

Step = Callable[[dict[str, Any]], None]


class StepTimeout(BaseException):
    """Raised in the driver's main thread when a step has run past its budget (a
    BaseException: a step's own ``except Exception`` must not swallow it)."""


def say(text: str) -> None:
    sys.stderr.write(f"[vm {time.strftime('%H:%M:%S')}] {text}\n")
    sys.stderr.flush()


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if len(fields) > 1:
            kids.setdefault(int(fields[1]), []).append(int(name))
    return kids


def descendants(root: int | None = None) -> list[int]:
    """This process's descendants, parents before children."""
    kids = _children()
    out: list[int] = []
    todo = [os.getpid() if root is None else root]
    while todo:
        for pid in kids.get(todo.pop(0), []):
            out.append(pid)
            todo.append(pid)
    return out


def _describe(pid: int) -> str:
    def read(name: str) -> str:
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                return f.read(4096).decode(errors="replace")
        except OSError:
            return "?"

    state = read("stat").rpartition(")")[2].split()[:1]
    cmd = read("cmdline").replace("\0", " ").strip()
    return f"{pid} {''.join(state)} wchan={read('wchan')} {cmd[:300]}"


def _tracebacks() -> str:
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        return f.read()


class _Watch:
    """The alarm's side: it raises only while a step runs (never in the driver's own
    bookkeeping), and keeps what it saw when it fired, since a step's cleanup may replace
    the exception with its own (a ``wait(timeout=...)`` in a ``finally``)."""

    def __init__(self) -> None:
        self.in_step = False
        self.fired = False
        self.seen: list[int] = []
        self.where = ""

    def alarm(self, signum: int, frame: FrameType | None) -> None:
        if not self.in_step or self.fired:
            return
        self.fired = True
        self.seen = descendants()
        self.where = "".join(traceback.format_stack(frame))
        raise StepTimeout


def _subreaper() -> None:
    """Become the reaper of orphans below us (PR_SET_CHILD_SUBREAPER): a grandchild whose
    parent subprocess.run killed at the timeout stays our descendant, to be listed and
    killed, instead of moving to the guest's init and living on into the next step."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _kill(pids: list[int]) -> None:
    # stopped first, so that no parent (torchrun, raylet) starts a new worker meanwhile
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)


def _save(out_path: str, results: dict[str, Any]) -> None:
    text = json.dumps(results, indent=1, default=repr)
    tmp = f"{out_path}.part"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, out_path)


def run_steps(
    out_path: str,
    steps: Iterable[tuple[str, Step]],
    results: dict[str, Any],
    budget: float = 300,
) -> int:
    """Run each step into ``results`` (its failures under ``results["errors"][name]``,
    its time under ``results["time_<name>"]``), saving the file after each."""
    results.setdefault("errors", {})
    _subreaper()
    for name, step in steps:
        say(f"step {name}: start")
        watch = _Watch()
        signal.signal(signal.SIGALRM, watch.alarm)
        t0 = time.time()
        error, timed_out = "", False
        try:
            watch.in_step = True
            signal.setitimer(signal.ITIMER_REAL, budget)
            try:
                step(results)
            finally:
                watch.in_step = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as err:
            if not isinstance(err, Exception | StepTimeout):
                raise
            error, timed_out = traceback.format_exc(), isinstance(err, StepTimeout)
        if watch.fired:
            seen = sorted(set(watch.seen) | set(descendants()))
            error = (
                f"step {name} ran past its {budget:.0f} s budget; it was at:\n"
                + watch.where
                + "threads now:\n"
                + _tracebacks()
                + "processes it had started:\n"
                + "\n".join(_describe(p) for p in seen)
                + (f"\nthen its cleanup raised:\n{error}" if error and not timed_out else "")
            )
            _kill(seen)
        if error:
            results["errors"][name] = error
        results[f"time_{name}"] = round(time.time() - t0, 1)
        say(f"step {name}: {'FAILED' if error else 'done'} in {results[f'time_{name}']} s")
        if error:
            say(error[-4000:])
        _save(out_path, results)
    return 0
