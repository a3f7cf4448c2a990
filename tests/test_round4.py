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
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from support import clean_env, started

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
    victim = started(["sleep", "120"], env=env, cwd="/", **_as(VICTIM))
    attacker = started(["sleep", "120"], env=env, cwd="/", **_as(ATTACKER))
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


# --- bounded decoding: the worst shape of each answer -------------------------------------------


class Answers:
    """An HTTP server on 127.0.0.1 that answers each path with prepared bytes (a whole
    answer, status line and all, sent at once) or, for a path in ``drip``, one byte of
    it every ``drip[path]`` seconds; any other path is a 404.  Each connection is read up
    to the end of its request's headers (and its body, by Content-Length) first."""

    def __init__(self, answers: dict[str, bytes], drip: dict[str, float] | None = None) -> None:
        self.answers, self.drip = answers, drip or {}
        self.asked: list[str] = []
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        with conn:
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    got = conn.recv(65536)
                    if not got:
                        return
                    data += got
                head = data.split(b"\r\n", 1)[0].decode()
                path = head.split(" ")[1].split("?")[0]
                self.asked.append(path)
                answer = self.answers.get(path, http_answer(b'{"error": "no such page"}', 404))
                if path in self.drip:
                    for i in range(len(answer)):
                        conn.sendall(answer[i : i + 1])
                        time.sleep(self.drip[path])
                else:
                    conn.sendall(answer)
            except OSError:
                pass  # the client hung up: what a deadline does

    def close(self) -> None:
        self.server.close()


def http_answer(body: bytes, status: int = 200) -> bytes:
    return (
        f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


def chunked_answer(body: bytes) -> bytes:
    """``body`` in chunks of 1 byte, the worst shape: six bytes on the wire for each byte
    of the body (built by strided slices: no object per chunk)."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    n = len(body)
    wire = bytearray(6 * n)
    for i, part in enumerate((b"1" * n, b"\r" * n, b"\n" * n, body, b"\r" * n, b"\n" * n)):
        wire[i::6] = part
    return head + b"Connection: close\r\n\r\n" + bytes(wire) + b"0\r\n\r\n"


VERSION = http_answer(b'{"version": "4", "ray_version": "2.60.0"}')


def _listing_bytes(rows: list[object]) -> bytes:
    data = {"result": True, "msg": "", "data": {"result": {"total": len(rows), "result": rows}}}
    return json.dumps(data).encode()


def test_one_byte_chunks_decode_in_time_linear_in_the_bytes() -> None:
    """Round four: ``_unchunk`` copied the rest of the body for every chunk; 4 MiB of
    1-byte chunks took 323 s.  Decoded in one pass, it is seconds, and the body is the
    one sent."""
    from numabind.cli._ray import Http

    body = _listing_bytes([{"pad": "x" * ((4 << 20) - 100)}])
    answers = Answers({"/api/v0/actors": chunked_answer(body)})
    try:
        began = time.monotonic()
        status, got = Http("http", "127.0.0.1", answers.port, time.monotonic() + 120).request(
            "GET", "/api/v0/actors"
        )
        took = time.monotonic() - began
    finally:
        answers.close()
    print(f"\n{len(body) >> 10} KiB in {len(body):,} chunks of 1 byte: {took:.2f} s")
    assert status == 200 and got == body
    assert took < 60, f"{took:.0f} s for {len(body):,} chunks: not linear"


def test_check_ray_stops_decoding_at_its_deadline() -> None:
    """``check --ray --deadline 8`` was still at full CPU at 30 s on a chunked answer: the
    decoder never looked at the clock.  10 MiB of 1-byte chunks (seconds more to decode
    than the deadline gives) now stop at the deadline with one line, and exit status 3."""
    body = _listing_bytes([{"pad": "x" * (10 << 20)}])
    answers = Answers({"/api/version": VERSION, "/api/v0/actors": chunked_answer(body)})
    try:
        began = time.monotonic()
        p = subprocess.run(
            [sys.executable, "-m", "numabind", "check", "--ray", f"127.0.0.1:{answers.port}",
             "--deadline", "2"],
            capture_output=True, text=True, timeout=120, env=clean_env(), cwd="/",
        )  # fmt: skip
        took = time.monotonic() - began
    finally:
        answers.close()
    print(f"\ncheck --ray --deadline 2 on 10 MiB of 1-byte chunks: {took:.1f} s")
    assert p.returncode == 3 and p.stderr.count("\n") == 1, p.stderr
    assert "no answer from the dashboard before the deadline" in p.stderr, p.stderr
    assert took < 8, took


SHAPES = {
    # a million brackets: refused by the C decoder's recursion bound, at once
    "deep": (b"[" * 1_000_000 + b"]" * 1_000_000, "did not answer JSON"),
    # 200,000 keys, one object: parsed (it is JSON), in one linear pass
    "keys": (
        b"{" + b",".join(b'"k%d":%d' % (i, i) for i in range(200_000)) + b"}",
        "is not Ray's state API",
    ),
    # a 2 MiB number: refused, not converted digit by digit
    "number": (b"[" + b"7" * (2 << 20) + b"]", "did not answer JSON"),
    # a million values: refused by their count before the decoder runs
    "values": (b"[" + b"0," * (1 << 20) + b"0]", "more than 1,048,576 JSON values"),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_worst_json_shapes_in_one_byte_chunks_are_one_bounded_answer(shape: str) -> None:
    """Deep nesting, many keys, a huge number, too many values, each sent in 1-byte
    chunks (the worst shape twice over): each is one line about the answer, in seconds
    (0.3's decoder spent minutes to hours on the chunks before the JSON was looked at;
    sent whole, round three's tests already bound them)."""
    from numabind.cli._ray import Http, HttpError, _rows

    body, says = SHAPES[shape]
    answers = Answers({"/api/v0/nodes": chunked_answer(body)})
    try:
        began = time.monotonic()
        http = Http("http", "127.0.0.1", answers.port, time.monotonic() + 120)
        with pytest.raises(HttpError) as err:
            _rows(http, "nodes", "")
        took = time.monotonic() - began
    finally:
        answers.close()
    print(f"\n{shape}: {len(body):,} bytes in 1-byte chunks: {took:.2f} s")
    assert says in str(err.value), err.value
    assert took < 60, took


# --- know who answers: a dashboard and a store squatted by another uid ---------------------------

NODE = "a" * 56

# Ray's dashboard as check --ray asks it (its version, the state API, the job API), in the
# stdlib alone, run by the attacker; argv: a JSON file of {path: answer}, where the port
# is written
DASHBOARD = r"""
import http.server, json, sys
answers = json.load(open(sys.argv[1]))
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self):
        path = self.path.split("?")[0]
        if self.command == "POST":
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
        key = "/api/jobs/ID/logs" if path.endswith("/logs") else (
            "/api/jobs/ID" if path.startswith("/api/jobs/") and path != "/api/jobs/" else path)
        body = json.dumps(answers.get(key, {"ok": True})).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_DELETE = reply
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"""

# a torch.distributed store as check --store reads it (VALIDATE, CHECK, GET), run by the
# attacker; argv: a JSON file of {key: value}
STORE = r"""
import json, socket, struct, sys, threading
values = {k: v.encode() for k, v in json.load(open(sys.argv[1])).items()}
def exactly(c, n):
    b = b""
    while len(b) < n:
        got = c.recv(n - len(b))
        if not got:
            raise EOFError
        b += got
    return b
def key(c):
    (n,) = struct.unpack("=Q", exactly(c, 8))
    return exactly(c, n).decode()[1:]
def talk(c):
    try:
        exactly(c, 5)
        while True:
            q = exactly(c, 1)[0]
            if q == 5:
                (n,) = struct.unpack("=Q", exactly(c, 8))
                keys = [key(c) for _ in range(n)]
                c.sendall(bytes([0 if all(k in values for k in keys) else 1]))
            elif q == 3:
                v = values[key(c)]
                c.sendall(struct.pack("=Q", len(v)) + v)
    except (EOFError, OSError, KeyError):
        c.close()
s = socket.create_server(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
while True:
    threading.Thread(target=talk, args=(s.accept()[0],), daemon=True).start()
"""


def _record(host: str, pid: int) -> str:
    rank = {
        "pid": pid, "rank": 0, "local_rank": 0, "status": "ok",
        "plan": {"cpus": "0-1", "bound": True},
        "threads": [{"cpus": "0-1", "tids": [pid], "names": ["python"]}],
        "memory_policy": "default",
    }  # fmt: skip
    record = {"schema": "numabind-node/1", "host": host, "facts": {}, "ranks": [rank]}
    return json.dumps(record, separators=(",", ":"))


@pytest.fixture
def squat() -> Iterator[Callable[[str, dict[str, object]], int]]:
    """Start a server of the attacker's (:data:`DASHBOARD` or :data:`STORE`) on
    127.0.0.1 with these answers; returns its port.  Stopped after the test."""
    from support import python_for

    started: list[subprocess.Popen[str]] = []
    top = Path(tempfile.mkdtemp(prefix="numabind-squat-", dir="/var/tmp"))
    top.chmod(0o755)

    def start(code: str, answers: dict[str, object]) -> int:
        script, data = top / f"s{len(started)}.py", top / f"a{len(started)}.json"
        script.write_text(code)
        data.write_text(json.dumps(answers))
        for f in (script, data):
            f.chmod(0o644)
        drop = ["setpriv", f"--reuid={ATTACKER}", f"--regid={ATTACKER}", "--clear-groups"]
        proc = subprocess.Popen(
            [*drop, python_for(ATTACKER), str(script), str(data)],
            stdout=subprocess.PIPE, text=True, cwd="/", env=clean_env(),
        )  # fmt: skip
        started.append(proc)
        assert proc.stdout is not None
        return int(proc.stdout.readline())

    try:
        yield start
    finally:
        for proc in started:
            proc.kill()
            proc.wait()
        shutil.rmtree(top, ignore_errors=True)


def _listing(rows: list[object]) -> dict[str, object]:
    return {"result": True, "msg": "", "data": {"result": {"total": len(rows), "result": rows}}}


DASHBOARD_ANSWERS: dict[str, object] = {
    "/api/version": {"version": "4", "ray_version": "2.60.0"},
    "/api/v0/nodes": _listing([{"node_id": NODE, "node_ip": "10.0.0.1"}]),
    "/api/v0/actors": _listing(
        [{"pid": 4242, "node_id": NODE, "state": "ALIVE", "required_resources": {"GPU": 1}}]
    ),
    "/api/v0/tasks": _listing([]),
    "/api/jobs/": {"submission_id": "x"},
    "/api/jobs/ID": {"status": "SUCCEEDED", "message": "Job finished."},
    "/api/jobs/ID/logs": {
        "logs": "numabind-driver uid=0 ray=2.60.0\n"
        f"numabind-record {NODE} {_record('10.0.0.1', 4242)}\n"
    },
}


@needs_root
def test_root_asks_no_dashboard_another_user_serves(
    squat: Callable[[str, dict[str, object]], int],
) -> None:
    """Round four: a stand-in on the dashboard's port, run by another user with no Ray at
    all, made root's ``check --ray`` HEALTHY, exit 0, crediting "a Ray job of the
    cluster's own".  Now root looks up who listens there (/proc/net/tcp, the socket's
    inode in /proc/PID/fd), refuses a uid it does not expect before a byte is sent, and
    names it; with ``--json`` the listener is a key of its own.  Naming the cluster's
    user (``--job-uid``) is what lets root ask it."""
    port = squat(DASHBOARD, DASHBOARD_ANSWERS)
    argv = [sys.executable, "-m", "numabind", "check", "--ray", f"127.0.0.1:{port}"]
    run = {"capture_output": True, "text": True, "timeout": 120, "env": clean_env(), "cwd": "/"}
    p = subprocess.run([*argv, "--deadline", "20"], **run)  # type: ignore[call-overload]
    assert p.returncode == 3 and "HEALTHY" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert f"the dashboard at 127.0.0.1:{port} is served by uid {ATTACKER}" in p.stderr, p.stderr
    assert "root asks it nothing" in p.stderr and p.stderr.count("\n") == 1, p.stderr
    j = subprocess.run([*argv, "--deadline", "20", "--json"], **run)  # type: ignore[call-overload]
    data = json.loads(j.stdout)
    assert data["listener"]["uid"] == ATTACKER and data["listener"]["pids"], data
    assert "served by uid" in data["refused"]
    named = subprocess.run(  # type: ignore[call-overload]
        [*argv, "--deadline", "20", "--json", "--job-uid", str(ATTACKER)], **run
    )
    report = json.loads(named.stdout)
    assert report["listener"]["uid"] == ATTACKER, report
    assert named.returncode == 0, named.stdout + named.stderr


@needs_root
def test_root_reads_no_store_another_user_serves(
    squat: Callable[[str, dict[str, object]], int],
) -> None:
    """The same for ``check --store``: a store on this machine that another user serves
    (here with a record that would make the report HEALTHY) is refused by root, and
    named."""
    values = {"numabind/latest": "run/0/1", "numabind/run/0/0": _record("hosta", 4242)}
    port = squat(STORE, values)
    argv = [sys.executable, "-m", "numabind", "check", "--store", f"127.0.0.1:{port}"]
    run = {"capture_output": True, "text": True, "timeout": 120, "env": clean_env(), "cwd": "/"}
    p = subprocess.run([*argv, "--deadline", "20"], **run)  # type: ignore[call-overload]
    assert p.returncode == 3 and "HEALTHY" not in p.stdout + p.stderr, p.stdout + p.stderr
    assert f"the store at 127.0.0.1:{port} is served by uid {ATTACKER}" in p.stderr, p.stderr
    named = subprocess.run(  # type: ignore[call-overload]
        [*argv, "--deadline", "20", "--job-uid", str(ATTACKER)], **run
    )
    assert named.returncode == 0 and "HEALTHY" in named.stdout, named.stdout + named.stderr


def test_a_server_of_ones_own_is_named_and_not_refused() -> None:
    """The listener of a server this user runs is found in the kernel's tables, with the
    process that holds it; judged as expected (no line)."""
    from numabind.check._peer import expected_owners, judge, listener

    server = socket.create_server(("127.0.0.1", 0))
    try:
        found = listener("127.0.0.1", server.getsockname()[1], time.monotonic() + 30)
    finally:
        server.close()
    assert found.uid == os.geteuid() and os.getpid() in found.pids, found
    assert judge(found, expected_owners(None), "store") is None


@pytest.mark.parametrize(
    "answer",
    [b"[" * 100_000 + b"]" * 100_000, b'{"pth": ' + b"[" * (1 << 20)],
    ids=["deep", "unclosed"],
)
def test_the_probes_answer_nested_too_deep_is_one_finding(answer: bytes) -> None:
    """``doctor --python``'s probe answers as another user's interpreter: nesting too
    deep for the decoder was a RecursionError out of ``doctor`` (a traceback); now it is
    the ValueError ``doctor`` turns into one finding."""
    from numabind.cli._doctor import parse_probe

    with pytest.raises(ValueError, match="nested too deeply"):
        parse_probe(answer)


@needs_root
def test_a_user_is_warned_of_a_dashboard_another_user_serves(
    squat: Callable[[str, dict[str, object]], int],
) -> None:
    """Not root: the user's own ``check --ray`` still asks (it is their report to make),
    and the report says, in a line and in its ``listener`` key, that another uid
    answered."""
    from support import python_for, readable_src

    port = squat(DASHBOARD, DASHBOARD_ANSWERS)
    drop = ["setpriv", f"--reuid={VICTIM}", f"--regid={VICTIM}", "--clear-groups"]
    argv = [*drop, python_for(VICTIM), "-m", "numabind", "check", "--ray", f"127.0.0.1:{port}"]
    env = clean_env(PYTHONPATH=readable_src(), HOME="/")
    run = {"capture_output": True, "text": True, "timeout": 120, "env": env, "cwd": "/"}
    p = subprocess.run([*argv, "--deadline", "20"], **run)  # type: ignore[call-overload]
    said = f"warning: the dashboard at 127.0.0.1:{port} is served by uid {ATTACKER}"
    assert f"note: {said}" in p.stdout, p.stdout + p.stderr
    j = subprocess.run([*argv, "--deadline", "20", "--json"], **run)  # type: ignore[call-overload]
    report = json.loads(j.stdout)
    assert report["listener"]["uid"] == ATTACKER and any(said in n for n in report["notes"])
