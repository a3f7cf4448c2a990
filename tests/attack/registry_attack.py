"""A hostile neighbour against the registry, run as root by tests/test_security.py.

Usage: python registry_attack.py SRC BASE SYSROOT OUT.json ATTACKER_UID

SRC is a world-readable copy of numabind's source, BASE the registry base (/dev/shm in a
private mount namespace, or a private directory with mode 1777 where unshare is not
permitted), SYSROOT a generated two-node machine.  The attacker is an unprivileged uid
(setpriv --reuid), planting with shell tools; root ranks and ``numabind check --all`` are
real processes.  Every child runs under a timeout: a hang is a recorded failure, not a
stuck test.  Results go to OUT.json for the test to assert on.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

SRC, BASE, SYSROOT, OUT, ATTACKER = sys.argv[1:6]
UID = int(ATTACKER)
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
results: dict[str, object] = {}


def as_attacker(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "BASE": BASE},
    )


def env(**extra: str) -> dict[str, str]:
    e = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": SRC,
        "NUMABIND_SYSROOT": SYSROOT,
        "NUMABIND_MEMORY": "none",
        "NUMABIND": "force",
        "NUMABIND_REGISTRY": BASE,
    }
    e.update(extra)
    return e


RANK = (
    "import sys, os, time\n"
    "from numabind import _startup\n"
    "b = _startup.run()\n"
    "where = b.registered if b else None\n"
    "print('USER CODE RAN', where, sorted(os.sched_getaffinity(0)), flush=True)\n"
    "if len(sys.argv) > 1: time.sleep(float(sys.argv[1]))\n"
)


def rank(
    local_rank: str, *args: str, uid: int | None = None, **extra: str
) -> subprocess.Popen[str]:
    argv = [PY, "-c", RANK, *args]
    if uid is not None:
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    return subprocess.Popen(
        argv,
        env=env(LOCAL_RANK=local_rank, LOCAL_WORLD_SIZE="2", **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(p: subprocess.Popen[str], timeout: float = 60) -> dict[str, object]:
    t0 = time.time()
    try:
        out, err = p.communicate(timeout=timeout)
        rc: int | str = p.returncode
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        rc = "hung"
    return {"rc": rc, "stdout": out, "stderr": err, "seconds": round(time.time() - t0, 2)}


def check_all() -> dict[str, object]:
    t0 = time.time()
    try:
        p = subprocess.run(
            [PY, "-m", "numabind", "check", "--all", "--json", "--verbose"],
            env=env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    except subprocess.TimeoutExpired:
        return {"rc": "hung"}
    try:
        data = json.loads(p.stdout)
    except ValueError:
        data = None
    return {
        "rc": p.returncode,
        "json": data,
        "stderr": p.stderr,
        "seconds": round(time.time() - t0, 2),
    }


def victim() -> str:
    path = "/var/tmp/numabind-victim"
    with open(path, "w") as f:
        f.write("precious\n")
    os.chmod(path, 0o644)
    return path


VICTIM = victim()
VICTIM_DIR = "/var/tmp/numabind-victim-dir"
shutil.rmtree(VICTIM_DIR, ignore_errors=True)
os.mkdir(VICTIM_DIR, 0o755)
mine = f"{BASE}/numabind-0"

# 1. before any root rank after boot, the attacker squats root's registry path: a link to
# a root directory, then a FIFO, then a directory of their own full of links.
for name, plant in (
    ("symlink", f"ln -s {VICTIM_DIR} $BASE/numabind-0"),
    ("fifo", "mkfifo $BASE/numabind-0"),
    (
        "own_dir",
        "mkdir $BASE/numabind-0 && chmod 777 $BASE/numabind-0 && "
        + " ".join(f"ln -s {VICTIM} $BASE/numabind-0/{p};" for p in range(1, 400))
        + f" ln -s {VICTIM} $BASE/numabind-0/.tmp",
    ),
):
    planted = as_attacker(plant)
    p = rank("1")
    r = finish(p)
    r["plant_rc"] = planted.returncode
    r["plant_err"] = planted.stderr
    with open(VICTIM) as f:
        r["victim"] = f.read()
    r["victim_dir"] = sorted(os.listdir(VICTIM_DIR))
    r["squat_entries"] = sorted(os.listdir(mine)) if os.path.isdir(mine) else None
    results[f"squat_{name}"] = r
    as_attacker("rm -rf $BASE/numabind-0")
    if os.path.lexists(mine) and not os.path.isdir(mine):
        os.unlink(mine)

# 2. no squat: the root rank registers; the attacker fills their own directory with forged,
# garbage and special entries, including one that claims the root rank's pid.
root_rank = rank("1", "60")
line = root_rank.stdout.readline() if root_rank.stdout else ""
results["root_rank_line"] = line
pid = root_rank.pid
# the forgery is careful: the real start time (anyone can read /proc/PID/stat)
forged = (
    f"pid={pid}\\nstart=$(awk '{{print $22}}' /proc/{pid}/stat)\\nlocal_rank=0\\n"
    "rank_source=LOCAL_RANK\\ncpus=0\\nmemory_policy=bind\\nmemory_nodes=0\\nmode=node\\n"
    "reason=forged\\n"
)
as_attacker(
    "mkdir -p $BASE/numabind-" + str(UID) + " && cd $BASE/numabind-" + str(UID) + " && "
    f'printf "{forged}" > {pid} && '
    f"cp {pid} 99999 && "
    "printf 'pid=1\\nstart=1\\ncpus=0-99999999\\n' > 1 && "
    "head -c 100000 /dev/urandom > 2 && "
    "printf 'garbage' > 3 && "
    "mkfifo 4 && ln -s /dev/zero 5 && ln -s /etc/shadow 6 && ln -s /proc/self/mem 7 && "
    "printf 'x' > \"$(printf 'name\\nwith newline')\" && "
    "printf 'x' > \"$(printf '\\342\\200\\256evil')\" && "
    "i=0; while [ $i -lt 3000 ]; do : > junk$i; i=$((i+1)); done"
)
results["check_all"] = check_all()
results["root_entry"] = sorted(os.listdir(mine)) if os.path.isdir(mine) else None

# 3. a non-root rank after root has run registers as reliably as root's
user_rank = rank("0", uid=UID, XDG_RUNTIME_DIR="")
results["user_rank"] = finish(user_rank)
results["user_dir"] = sorted(
    n for n in os.listdir(f"{BASE}/numabind-{UID}") if not n.startswith("junk")
)
root_rank.kill()
results["root_rank"] = finish(root_rank)
with open(VICTIM) as f:
    results["victim_end"] = f.read()
with open(OUT, "w") as f:
    json.dump(results, f, indent=1)
