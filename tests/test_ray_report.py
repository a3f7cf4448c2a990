"""check --ray: a real Ray cluster of two nodes on this machine, the second in its own
network namespace with its own address (a bridge the test makes, 10.78.0.0/24), each
node's raylet started with its own generated machine (NUMABIND_SYSROOT) and NUMABIND_RAY=1,
fake GPUs (--num-gpus).  Three GPU actors: one per node, and a third on the head that
re-pins a named thread off its plan.  Needs root (network namespaces)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import synth
from support import clean_env

pytestmark = [pytest.mark.ray, pytest.mark.launchers]
BIN = Path(sys.executable).parent
HEAD, OTHER = "10.78.0.1", "10.78.0.2"
NS = "nbr-b"

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sh(*argv: str, check: bool = True) -> None:
    subprocess.run(argv, check=check, capture_output=True, timeout=120)


def _network() -> None:
    for argv in (["ip", "link", "del", "nbray0"], ["ip", "netns", "del", NS]):
        sh(*argv, check=False)
    sh("ip", "link", "add", "nbray0", "type", "bridge")
    sh("ip", "addr", "add", f"{HEAD}/24", "dev", "nbray0")
    sh("ip", "link", "set", "nbray0", "up")
    sh("ip", "netns", "add", NS)
    sh("ip", "link", "add", "nbrv-b", "type", "veth", "peer", "name", "eth0", "netns", NS)
    sh("ip", "link", "set", "nbrv-b", "master", "nbray0")
    sh("ip", "link", "set", "nbrv-b", "up")
    sh("ip", "-n", NS, "addr", "add", f"{OTHER}/24", "dev", "eth0")
    sh("ip", "-n", NS, "link", "set", "eth0", "up")
    sh("ip", "-n", NS, "link", "set", "lo", "up")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("ray.util.state")
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter"):
        if os.environ.get("NUMABIND_REQUIRE_LAUNCHERS") == "1":
            pytest.fail("the two-node Ray cluster needs root, ip and nsenter")
        pytest.skip("the two-node Ray cluster needs root, ip and nsenter")
    where = tmp_path_factory.mktemp("ray-nodes")
    machines = {}
    for name, bus in (("head", 0x17), ("other", 0x3B)):
        spec = synth.Spec(
            nodes=[[0], [1]],
            package_of_node=[0, 1],
            gpus=[synth.Gpu(f"0000:{bus:02x}:00.0", 0), synth.Gpu(f"0000:{bus + 1:02x}:00.0", 1)],
            memory_gib=1,
        )
        machines[name] = synth.write(spec, str(where / name))
    _network()
    port, dash = free_port(), free_port()
    ray = str(BIN / "ray")
    base = clean_env(
        NUMABIND_RAY="1",
        NUMABIND_MEMORY="none",
        RAY_AUTH_MODE="disabled",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    common = ["--disable-usage-stats", "--num-cpus=4"]
    head = [
        ray, "start", "--head", f"--node-ip-address={HEAD}", f"--port={port}", "--num-gpus=2",
        f"--dashboard-host={HEAD}", f"--dashboard-port={dash}", *common,
    ]  # fmt: skip
    other = [
        "nsenter", f"--net=/run/netns/{NS}", ray, "start", f"--address={HEAD}:{port}",
        f"--node-ip-address={OTHER}", "--num-gpus=1", *common,
    ]  # fmt: skip
    try:
        for argv, machine in ((head, machines["head"]), (other, machines["other"])):
            p = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=180,
                env=dict(base, NUMABIND_SYSROOT=machine),
            )
            assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        yield f"{HEAD}:{port}"
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=120, env=base)
        sh("ip", "netns", "del", NS, check=False)
        sh("ip", "link", "del", "nbray0", check=False)


def test_check_ray_reports_every_gpu_actor_with_its_node(cluster: str) -> None:
    env = clean_env(RAY_AUTH_MODE="disabled", PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, cluster],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
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
            [sys.executable, "-m", "numabind", "check", "--ray", cluster, "--deadline", "60"],
            capture_output=True,
            text=True,
            env=env,
            timeout=180,
        )
        print(p.stdout, p.stderr)
        assert p.returncode == 1, p.stdout + p.stderr
        assert "SIGTERM handler" not in p.stderr, p.stderr  # Ray's notice is not ours to print
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
        d = json.loads(
            subprocess.run(
                [sys.executable, "-m", "numabind", "check", "--ray", cluster, "--json"],
                capture_output=True,
                text=True,
                env=env,
                timeout=180,
            ).stdout
        )
        assert sorted(n["host"] for n in d["nodes"]) == [HEAD, OTHER]
        pids = sorted(r["pid"] for n in d["nodes"] for r in n["ranks"])
        assert pids == sorted(a[0] for a in actors)
    finally:
        driver.kill()
        driver.wait()
