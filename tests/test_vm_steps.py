"""The VM scripts' step driver (tests/vm/steps.py), run on the host: a step that hangs is
stopped at its budget with where it was and what it had started, its processes are gone,
and the steps after it still run, each reported on stderr as it goes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DRIVER = """
import subprocess, sys, time
sys.path.insert(0, {vm!r})
from steps import run_steps

def quick(results):
    results["quick"] = 1

def hangs(results):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    results["hung_child"] = child.pid
    with open({pidfile!r}, "w") as f:
        f.write(str(child.pid))
    try:
        child.wait()
    except Exception:  # a step's own handler must not swallow the budget
        results["swallowed"] = True
        time.sleep(600)

def orphans(results):
    # subprocess.run kills its child at the budget; the grandchild must not live on
    try:
        subprocess.run(["sh", "-c", "sleep 601 & echo $! > {grandfile}; wait"],
                       capture_output=True)
    finally:
        raise RuntimeError("a cleanup that fails too")

def fails(results):
    raise ValueError("a step that fails")

def after(results):
    results["after"] = 1

sys.exit(run_steps({out!r}, [("quick", quick), ("hangs", hangs), ("orphans", orphans),
                             ("fails", fails), ("after", after)], {{}}, budget=2))
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def test_a_hung_step_is_stopped_reported_and_the_rest_run(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    pidfile, grandfile = tmp_path / "pid", tmp_path / "grandchild"
    code = DRIVER.format(
        vm=str(ROOT / "tests" / "vm"), out=str(out), pidfile=str(pidfile), grandfile=grandfile
    )
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    assert proc.returncode == 0, proc.stderr
    assert elapsed < 60
    data = json.loads(out.read_text())
    assert data["quick"] == 1 and data["after"] == 1
    assert "swallowed" not in data
    assert set(data["errors"]) == {"hangs", "orphans", "fails"}
    hung = data["errors"]["hangs"]
    assert "ran past its 2 s budget" in hung
    assert ", in hangs" in hung and "in wait" in hung  # where the step was
    assert "time.sleep(600)" in hung  # the process it had started, listed
    assert "ValueError: a step that fails" in data["errors"]["fails"]
    assert 1.5 <= data["time_hangs"] < 30
    orphaned = data["errors"]["orphans"]
    assert "ran past its 2 s budget" in orphaned and "sleep 601" in orphaned
    assert "RuntimeError: a cleanup that fails too" in orphaned  # said after, not instead
    for pid in (int(pidfile.read_text()), int(grandfile.read_text())):
        assert not _alive(pid), pid  # killed and reaped by the driver
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("[vm ")]
    said = [ln.split("] ", 1)[1] for ln in lines]
    assert said[0] == "step quick: start"
    assert any(s.startswith("step hangs: FAILED in") for s in said)
    assert said[-1].startswith("step after: done in")
