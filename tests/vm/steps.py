"""One driver for the VM scripts' steps: each step is timed, reported as it starts and ends,
and held to a budget, so that a boot which hangs says where instead of running out the VM's
clock with nothing to show.

A CI run once lost a whole boot (scripts/numa-vm's 600 s) to one scenario that never
returned, and all it printed was "timed out": the results file is only read when the boot
succeeds, and the guest wrote nothing on the way.  Now:

* each step's start and end go to stderr at once (scripts/numa-vm prints the guest's
  stderr even when it stops the VM);
* a step past ``budget`` seconds gets every thread's traceback and a list of this driver's
  descendants (state, kernel wait channel, command line) recorded as its error, the
  descendants are killed, and the next step runs;
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


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    raise StepTimeout


def run_steps(
    out_path: str,
    steps: Iterable[tuple[str, Step]],
    results: dict[str, Any],
    budget: float = 240,
) -> int:
    """Run each step into ``results`` (its failures under ``results["errors"][name]``,
    its time under ``results["time_<name>"]``), saving the file after each."""
    results.setdefault("errors", {})
    signal.signal(signal.SIGALRM, _on_alarm)
    for name, step in steps:
        say(f"step {name}: start")
        t0 = time.time()
        signal.setitimer(signal.ITIMER_REAL, budget)
        try:
            step(results)
        except StepTimeout:
            seen = descendants()
            results["errors"][name] = (
                f"step {name} ran past its {budget:.0f} s budget; it was at:\n"
                + traceback.format_exc()
                + "threads:\n"
                + _tracebacks()
                + "processes it had started:\n"
                + "\n".join(_describe(p) for p in seen)
            )
            for pid in reversed(seen):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        except Exception:
            results["errors"][name] = traceback.format_exc()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        results[f"time_{name}"] = round(time.time() - t0, 1)
        say(
            f"step {name}: {'FAILED' if name in results['errors'] else 'done'}"
            f" in {results[f'time_{name}']} s"
        )
        if name in results["errors"]:
            say(results["errors"][name][-4000:])
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0
