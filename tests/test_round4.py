"""Safe on a shared machine, round four (issue 42): who is a job's process, what a peer's
answer may cost, who answers on a port, and how much DRA metadata is read.

Each attack is played for real: an unprivileged uid made by the test (``user=`` on the
child, as ``setpriv`` would), a cgroup it owns under a delegated ``user@UID.service``
in a cgroup hierarchy of this machine, answers from servers on 127.0.0.1 that this test
starts (1-byte chunks, deep nesting, many keys, a slow drip), a dashboard and a store run
by that uid, and 2,048 DRA metadata files in a capture.  What each costs is printed for
the record (``-s``); the assertions are on what is counted, said and refused, and on time
only where time is the attack (a bound many times what the fixed code takes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import clean_env

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
ATTACKER = 43244  # the user who forges
VICTIM = 43245  # the job's own user
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="plays other uids (root only)")


def _as(uid: int) -> dict[str, object]:
    """Popen arguments that start a child as ``uid``, with no supplementary group."""
    return {"user": uid, "group": uid, "extra_groups": []}


# --- membership only from what the user cannot forge ---------------------------------------------


def _hierarchy() -> Path:
    """A cgroup hierarchy of this machine where root can make a child and move a process
    into it: the v2 one first (where systemd delegates ``user@UID.service``)."""
    for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/pids"):
        probe = Path(base, f"numabind-probe-{os.getpid()}")
        child = subprocess.Popen(["sleep", "30"])
        try:
            probe.mkdir()
            (probe / "cgroup.procs").write_text(f"{child.pid}\n")
            return Path(base)
        except OSError:
            continue
        finally:
            child.kill()
            child.wait()
            time.sleep(0.05)
            try:
                probe.rmdir()
            except OSError:
                pass
    raise AssertionError("no cgroup hierarchy here lets root make a child and move a process")


CLAIM = {"SLURM_JOB_ID": "4711", "SLURM_STEP_ID": "0", "SLURMD_NODENAME": "nodea"}

# (the forged path below the hierarchy, the folder handed to the attacker, the uid the
# collector is told the job runs as, whether the real rank is in that cgroup too (a real
# job's cgroup, where the attacker's process got in), what the report says of it)
FORGERIES = {
    "delegated": (
        f"user.slice/user-{ATTACKER}.slice/user@{ATTACKER}.service/slurm/job_4711",
        f"user.slice/user-{ATTACKER}.slice/user@{ATTACKER}.service",
        VICTIM,
        False,
        f"through a cgroup not on Slurm's own path ('/user.slice/user-{ATTACKER}.slice/",
    ),
    "owned": (
        f"slurm_numabind4b{os.getpid()}/uid_{VICTIM}/job_4711/step_0",
        f"slurm_numabind4b{os.getpid()}/uid_{VICTIM}",
        VICTIM,
        False,
        f"is owned by uid {ATTACKER}: not counted",
    ),
    "other uid": (
        f"slurm_numabind4b{os.getpid()}/uid_{VICTIM}/job_4711/step_0",
        "",
        VICTIM,
        True,
        f"runs as uid [{ATTACKER}] and the job as {VICTIM}: not counted",
    ),
}


@needs_root
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_cgroup_a_user_could_make_is_not_the_job(forgery: str) -> None:
    """Round four's attack: with no ``scontrol listpids``, membership came from a
    process's cgroup name, and any logged-in user may create
    ``.../user@UID.service/slurm/job_4711`` in the cgroup systemd delegates to them.
    Root's collector took the attacker's process for the job's rank and lost the real
    one.  Now a cgroup counts only on Slurm's own path, owned by root all the way down,
    with a process of the job's uid; the forged one is named in a note and not counted,
    and the real rank (found by the job's uid) stays."""
    path, handed, job_uid, shared, says = FORGERIES[forgery]
    base = _hierarchy()
    forged = base / path
    forged.mkdir(parents=True)
    if handed:
        for d in [base / handed, *(p for p in forged.parents if base / handed in p.parents)]:
            os.chown(d, ATTACKER, ATTACKER)
        os.chown(forged, ATTACKER, ATTACKER)
    env = clean_env(**CLAIM, SLURM_LOCALID="0")
    victim = subprocess.Popen(["sleep", "120"], env=env, cwd="/", **_as(VICTIM))  # type: ignore[call-overload]
    attacker = subprocess.Popen(["sleep", "120"], env=env, cwd="/", **_as(ATTACKER))  # type: ignore[call-overload]
    try:
        # root places the attacker's process there, as systemd places a user's session in
        # the subtree it delegates to them; the name below is the attacker's own choice
        (forged / "cgroup.procs").write_text(f"{attacker.pid}\n")
        if shared:
            (forged / "cgroup.procs").write_text(f"{victim.pid}\n")
        p = subprocess.run(
            [sys.executable, "-m", "numabind", "check", "--all", "--job-id", "4711",
             "--job-uid", str(job_uid), "--deadline", "60"],
            capture_output=True, text=True, timeout=120,
            env=clean_env(SLURMD_NODENAME="nodea", PATH="/usr/bin:/bin"),
        )  # fmt: skip
    finally:
        for child in (victim, attacker):
            child.kill()
            child.wait()
        time.sleep(0.1)
        top = base / path.split("/")[0]
        for d in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
            d.rmdir()
        top.rmdir()
    record = json.loads(p.stdout)
    assert [r["pid"] for r in record["ranks"]] == [victim.pid], (record, p.stderr)
    said = [n for n in record["notes"] if n.startswith(f"pid {attacker.pid} claim(s) job 4711")]
    assert said and says in said[0], record["notes"]
    told = (
        "the kernel's cgroup of the job (job_4711)" if shared else f"the job owner's uid {VICTIM}"
    )
    assert told in record["notes"][0], record["notes"]


def test_slurm_paths_are_fixed_at_the_top_of_the_hierarchy() -> None:
    from numabind.check._inspect import slurm_path

    assert slurm_path("/slurm/uid_1000/job_42/step_0/task_1") == (
        "42",
        "/slurm/uid_1000/job_42",
        1000,
    )
    assert slurm_path("/system.slice/slurmstepd.scope/job_7/step_batch") == (
        "7", "/system.slice/slurmstepd.scope/job_7", None
    )  # fmt: skip
    assert slurm_path("/system.slice/nodea_slurmstepd.scope/job_8/x")[0] == "8"  # type: ignore[index]
    for forged in (
        "/user.slice/user-1000.slice/user@1000.service/slurm/job_4711",
        "/user.slice/slurm/uid_1000/job_4711",
        "/slurm/job_4711",
        "/system.slice/user@1000.service/slurmstepd.scope/job_4711",
        "/slurm/uid_x/job_1",
    ):
        assert slurm_path(forged) is None, forged
