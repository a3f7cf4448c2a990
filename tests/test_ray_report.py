"""check --ray against a real Ray cluster that another user runs (issue 32, attack 2).

Two nodes on this machine, each in its own network namespace (on a bridge the test
makes, 10.78.0.0/24) and its own PID namespace, both run by uid OWNER (an unprivileged
uid the test makes; ``CAP_DAC_READ_SEARCH`` lets it read this checkout's venv wherever
it is), each raylet with its own generated machine (NUMABIND_SYSROOT) and NUMABIND_RAY=1,
fake GPUs (--num-gpus).  Three GPU actors: one per node, and a third on the head that
re-pins a named thread off its plan.  Every Python process of the cluster records its uid
(a sitecustomize on the cluster's PYTHONPATH): root's ``check --ray`` must leave them all
the owner's, its own process must never import ray, and the report must come from the
cluster's own job.  Stopping a node is killing its PID namespace.  Needs root."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import synth
from support import clean_env

pytestmark = [pytest.mark.ray, pytest.mark.launchers]
BIN = Path(sys.executable).parent
HEAD, OTHER, HOST = "10.78.0.1", "10.78.0.2", "10.78.0.254"
NAMESPACES = {"head": "nbr-a", "other": "nbr-b"}
OWNER = 43216
AS_OWNER = [
    "setpriv", f"--reuid={OWNER}", f"--regid={OWNER}", "--clear-groups",
    "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search",
]  # fmt: skip

DRIVER = """
import json, os, sys, threading, time
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy as On

ray.init(address=sys.argv[1], log_to_driver=False)

@ray.remote(num_gpus=1)
class Rank:
    def __init__(self, off):
        if off:
            def spin():
                tid = threading.get_native_id()
                with open(f"/proc/self/task/{tid}/comm", "w") as f:
                    f.write("spinner")
                mine = os.sched_getaffinity(0)
                os.sched_setaffinity(0, ({0, 1} - mine) or mine)
                time.sleep(3600)
            threading.Thread(target=spin, daemon=True).start()
            time.sleep(0.5)
    def where(self):
        return [os.getpid(), sorted(os.sched_getaffinity(0)), ray.get_gpu_ids()]

nodes = {n["NodeManagerAddress"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}
plan = [("%s", False), ("%s", False), ("%s", True)]
ranks = [Rank.options(scheduling_strategy=On(nodes[ip], soft=False)).remote(off)
         for ip, off in plan]
print("READY " + json.dumps(ray.get([r.where.remote() for r in ranks])), flush=True)
time.sleep(3600)
""" % (HEAD, OTHER, HEAD)

# PID 1 of a node's PID namespace: starts the node, says so, then reaps orphans (Ray's
# daemons are reparented to it) until the namespace is killed.
KEEPER = """
import os, subprocess, sys, time
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode
print("STARTED", rc, flush=True)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.5)
"""

# On the cluster's PYTHONPATH: every Python process of the cluster says who it ran as.
WHO_RAN = """
import os
name = "%d-%d" % (os.getuid(), os.getpid())
with open("/proc/self/cmdline", "rb") as cmd:
    argv = cmd.read(300).replace(b"\\0", b" ").decode("utf-8", "replace")
with open(os.path.join(os.environ["CLUSTER_MARKS"], name), "w") as f:
    f.write(argv)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sh(*argv: str, check: bool = True) -> None:
    subprocess.run(argv, check=check, capture_output=True, timeout=120)


def _no_network() -> None:
    sh("ip", "link", "del", "nbray0", check=False)
    for name, ns in NAMESPACES.items():
        sh("ip", "link", "del", f"nbrv-{name}", check=False)
        sh("ip", "netns", "del", ns, check=False)


def _network() -> None:
    _no_network()
    sh("ip", "link", "add", "nbray0", "type", "bridge")
    sh("ip", "addr", "add", f"{HOST}/24", "dev", "nbray0")
    sh("ip", "link", "set", "nbray0", "up")
    for (name, ns), ip in zip(NAMESPACES.items(), (HEAD, OTHER)):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", f"nbrv-{name}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", f"nbrv-{name}", "master", "nbray0")
        sh("ip", "link", "set", f"nbrv-{name}", "up")
        sh("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")


def _in_node(ns: str, argv: list[str]) -> list[str]:
    """``argv`` in a node's network namespace and a PID namespace of its own, as OWNER."""
    return [
        "nsenter", f"--net=/run/netns/{ns}", "unshare", "--pid", "--fork", "--kill-child",
        "--mount-proc", *AS_OWNER, sys.executable, "-c", KEEPER, *argv,
    ]  # fmt: skip


class Cluster:
    """The running cluster: its GCS address, its dashboard, where its processes said who
    they ran as, and each node's PID-namespace init (by its pid here)."""

    def __init__(self, address: str, dashboard: str, marks: Path, inits: list[int]) -> None:
        self.address, self.dashboard, self.marks, self.inits = address, dashboard, marks, inits


def _init_of(keeper: subprocess.Popen[str]) -> int:
    """The pid (here) of the first process in the PID namespace ``unshare`` made (nsenter
    execs unshare, which forks it)."""
    for _ in range(100):
        text = Path(f"/proc/{keeper.pid}/task/{keeper.pid}/children").read_text().split()
        if text:
            return int(text[0])
        time.sleep(0.1)
    raise AssertionError("unshare started no child")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pytest.importorskip("ray.util.state")
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter"):
        if os.environ.get("NUMABIND_REQUIRE_LAUNCHERS") == "1":
            pytest.fail("the two-node Ray cluster needs root, ip and nsenter")
        pytest.skip("the two-node Ray cluster needs root, ip and nsenter")
    where = Path(tempfile.mkdtemp(prefix="numabind-ray-", dir="/tmp"))
    where.chmod(0o755)
    marks, site = where / "marks", where / "site"
    marks.mkdir()
    marks.chmod(0o1777)
    site.mkdir()
    (site / "sitecustomize.py").write_text(WHO_RAN)
    machines = {}
    for name, bus in (("head", 0x17), ("other", 0x3B)):
        spec = synth.Spec(
            nodes=[[0], [1]],
            package_of_node=[0, 1],
            gpus=[synth.Gpu(f"0000:{bus:02x}:00.0", 0), synth.Gpu(f"0000:{bus + 1:02x}:00.0", 1)],
            memory_gib=1,
        )
        machines[name] = synth.write(spec, str(where / name))
        temp = where / f"ray-{name}"
        temp.mkdir()
        os.chown(temp, OWNER, OWNER)
    _network()
    port, dash = free_port(), free_port()
    ray = str(BIN / "ray")
    base = clean_env(
        NUMABIND_RAY="1",
        NUMABIND_MEMORY="none",
        RAY_AUTH_MODE="disabled",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        PYTHONPATH=str(site),
        CLUSTER_MARKS=str(marks),
        HOME=str(where),
    )
    common = ["--disable-usage-stats", "--num-cpus=4"]
    head = [
        ray, "start", "--head", f"--node-ip-address={HEAD}", f"--port={port}", "--num-gpus=2",
        f"--dashboard-host={HEAD}", f"--dashboard-port={dash}", f"--temp-dir={where}/ray-head",
        *common,
    ]  # fmt: skip
    other = [
        ray, "start", f"--address={HEAD}:{port}", f"--node-ip-address={OTHER}", "--num-gpus=1",
        f"--temp-dir={where}/ray-other", *common,
    ]  # fmt: skip
    keepers: list[subprocess.Popen[str]] = []
    inits: list[int] = []
    try:
        for (name, ns), argv in zip(NAMESPACES.items(), (head, other)):
            keeper = subprocess.Popen(
                _in_node(ns, argv),
                stdout=subprocess.PIPE,
                text=True,
                env=dict(base, NUMABIND_SYSROOT=machines[name]),
            )
            keepers.append(keeper)
            assert keeper.stdout is not None
            line = keeper.stdout.readline()
            inits.append(_init_of(keeper))
            assert line.strip() == "STARTED 0", f"ray start on {name}: {line!r}"
        yield Cluster(f"{HEAD}:{port}", f"{HEAD}:{dash}", marks, inits)
    finally:
        # killing a PID namespace's first process kills every process in it (the setuid
        # in setpriv clears --kill-child's death signal, so unshare's end would not)
        for init in inits:
            os.kill(init, signal.SIGKILL)
        for keeper in keepers:
            keeper.send_signal(signal.SIGKILL)
            keeper.wait()
        _no_network()
        shutil.rmtree(where, ignore_errors=True)


def test_check_ray_reports_every_gpu_actor_with_its_node(cluster: Cluster, tmp_path: Path) -> None:
    """The cluster's own user starts three GPU actors (in the head's namespaces); root's
    check --ray, given the dashboard, reports them all with each node's machine, the
    off-plan thread named, from a job of the cluster's own; no process of the cluster
    ran as root, and root's process never imported ray."""
    env = clean_env(RAY_AUTH_MODE="disabled", PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    head = ["nsenter", "-t", str(cluster.inits[0]), "-p", "-m", "-n", *AS_OWNER]
    driver = subprocess.Popen(
        [*head, sys.executable, "-c", DRIVER, cluster.address],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    fake_ray = tmp_path / "fake" / "ray"
    fake_ray.mkdir(parents=True)
    (fake_ray / "__init__.py").write_text(f"open({str(tmp_path / 'IMPORTED')!r}, 'w').close()\n")
    check = [sys.executable, "-m", "numabind", "check", "--ray", cluster.dashboard]
    try:
        assert driver.stdout is not None
        began = time.monotonic()
        line = ""
        while not line.startswith("READY") and time.monotonic() - began < 240:
            line = driver.stdout.readline()
            if not line and driver.poll() is not None:
                break
        assert line.startswith("READY"), "the actors did not start"
        actors = json.loads(line[6:])
        p = subprocess.run(
            [*check, "--deadline", "90"],
            capture_output=True,
            text=True,
            env=dict(env, PYTHONPATH=str(tmp_path / "fake")),
            timeout=180,
            cwd="/",
        )
        print(p.stdout, p.stderr)
        assert not (tmp_path / "IMPORTED").exists(), "root's process imported ray"
        assert p.returncode == 1, p.stdout + p.stderr
        lines = p.stdout.splitlines()
        summary = "3 ranks on 2 nodes: 2 ok, 0 warnings, 1 off plan, 0 unreachable"
        assert lines[0] == f"numabind check --ray: {summary}"
        bad = next(x for x in lines if "OFF PLAN" in x)
        assert bad.split()[0] == HEAD and bad.split()[3] == str(actors[2][0]), bad
        # Ray hands the head's two GPUs out in either order: the spinner sits on the CPU
        # its plan does not have
        spun = re.search(r"'spinner' on CPUs (\d), plan (\d)", p.stdout)
        assert spun is not None and spun.group(1) != spun.group(2), p.stdout
        assert OTHER in p.stdout and "0000:3b:00.0" in p.stdout, "the other node's machine"
        assert f"collected by a Ray job of the cluster's own (uid={OWNER}" in p.stdout
        d = json.loads(
            subprocess.run(
                [*check, "--json"], capture_output=True, text=True, env=env, timeout=180, cwd="/"
            ).stdout
        )
        assert sorted(n["host"] for n in d["nodes"]) == [HEAD, OTHER]
        pids = sorted(r["pid"] for n in d["nodes"] for r in n["ranks"])
        assert pids == sorted(a[0] for a in actors)
    finally:
        driver.kill()
        driver.wait()
    ran = {
        name.split("-")[0]: (cluster.marks / name).read_text() for name in os.listdir(cluster.marks)
    }
    assert set(ran) == {str(OWNER)}, f"a process of the cluster ran as another uid: {ran}"
    drivers = [
        n
        for n in os.listdir(cluster.marks)
        if "numabind.check._raydriver" in (cluster.marks / n).read_text()
    ]
    assert drivers, "the collecting job ran in the cluster, as its owner"
