"""The job report from inside torch.distributed (NUMABIND_REPORT=1, numabind.report()):
real torchrun agents (two of them, each in its own UTS namespace so that they are two
hosts), the real c10d store, and check --job --store reading it from outside.  Garbage
and forged records go into a real TCPStore."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from support import StandInStore, clean_env, need

HERE = Path(__file__).resolve().parent
WORKER = str(HERE / "launchers" / "report_worker.py")
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_store(address: str, *more: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "numabind", "check", "--job", "--store", address, *more],
        capture_output=True,
        text=True,
        env=clean_env(**env),
        timeout=120,
    )


def test_a_store_announcing_a_huge_value_is_refused_unread() -> None:
    """torch's own client would allocate whatever length the store announces (1 TiB
    here); numabind's refuses it from the length, having read none of it."""
    store = StandInStore(announce=1 << 40)
    try:
        began = time.monotonic()
        p = check_store(f"127.0.0.1:{store.port}", "--deadline", "10")
    finally:
        store.close()
    assert p.returncode == 3 and time.monotonic() - began < 10, p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "cannot read the store: a value of 1099511627776 bytes (at most" in p.stderr


def test_a_record_longer_than_a_record_can_be_is_an_invalid_row() -> None:
    from numabind.check import _job, _report
    from numabind.check._store import StoreClient

    store = StandInStore(announce=_job.RECORD_BYTES + 1)
    try:
        with StoreClient("127.0.0.1", store.port, time.monotonic() + 10, _job.RECORD_BYTES) as c:
            report = _report.read_report(c, "numabind/run/0", 2, None, time.monotonic() + 10)
    finally:
        store.close()
    text = "\n".join(_job.report_lines(report))
    assert text.count(f"not read: a value of {_job.RECORD_BYTES + 1} bytes") == 2, text
    assert _job.exit_status(report) == 3


def test_every_key_on_the_wire_carries_the_stores_prefix() -> None:
    """TCPStore prefixes every key with ``/`` (its keyPrefix_): a client that sends the
    bare key asks for a key no rank wrote, and the whole job reads as missing.  Checked
    here against a store that records what it was asked (the torch stage checks it
    against the real one)."""
    from numabind.check import _job, _report
    from numabind.check._store import KEY_PREFIX, StoreClient

    store = StandInStore(announce=8)
    try:
        with StoreClient("127.0.0.1", store.port, time.monotonic() + 10, _job.RECORD_BYTES) as c:
            _report.read_report(c, "numabind/run7/0", 2, None, time.monotonic() + 10)
    finally:
        store.close()
    assert KEY_PREFIX == "/" and store.keys, store.keys
    assert all(k.startswith(b"/numabind/run7/0") for k in store.keys), store.keys


def test_a_store_that_never_answers_ends_at_the_deadline() -> None:
    store = StandInStore(silent=True)
    try:
        began = time.monotonic()
        p = check_store(f"127.0.0.1:{store.port}", "--deadline", "3")
        took = time.monotonic() - began
    finally:
        store.close()
    assert p.returncode == 3 and took < 8, (took, p.stderr)
    assert p.stderr.count("\n") == 1 and "cannot read the store: no answer" in p.stderr


def test_46_a_silent_peer_is_given_up_on_within_10_s() -> None:
    """A peer that accepts and never answers (not a c10d store, which answers in ms) is
    given up on within 10 s, not at the 60 s deadline; the line has no doubled
    parentheses."""
    store = StandInStore(silent=True)
    try:
        began = time.monotonic()
        p = check_store(f"127.0.0.1:{store.port}")
        took = time.monotonic() - began
    finally:
        store.close()
    # took: the 10 s, plus starting numabind on a loaded machine (the point: not the 60 s)
    assert p.returncode == 3 and 9 < took < 30, (took, p.stderr)
    (line,) = p.stderr.splitlines()
    assert line.endswith(
        ": cannot read the store: the peer took the connection and said nothing for 10 s; a "
        "c10d store answers in milliseconds"
    ), line
    assert "((" not in line and "))" not in line, line


def test_a_store_that_is_not_there_is_one_line_at_once() -> None:
    began = time.monotonic()
    p = check_store(f"127.0.0.1:{free_port()}", "--deadline", "5")
    assert p.returncode == 3 and time.monotonic() - began < 10
    assert p.stderr.count("\n") == 1 and "cannot reach the store (Connection refused)" in p.stderr
    assert p.stdout == ""
    p = check_store("nohost", "--deadline", "5")
    assert p.returncode == 2 and "is not HOST:PORT" in p.stderr


# --- records in a real store ---------------------------------------------------------------


def record(rank: int, host: str, **over: Any) -> bytes:
    r: dict[str, Any] = {
        "pid": 1000 + rank,
        "rank": rank,
        "local_rank": rank % 2,
        "status": "ok",
        "plan": None,
        "threads": [{"cpus": "0-1", "tids": [1000 + rank], "names": ["python"]}],
        "memory_policy": "default",
    }
    r.update(over)
    return json.dumps(
        {"schema": "numabind-node/1", "host": host, "job": None, "facts": {}, "ranks": [r]}
    ).encode()


@pytest.mark.torch
def test_garbage_forged_and_missing_records_are_rows(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from datetime import timedelta

    import torch.distributed as dist

    from numabind.check import _job, _report

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=30))
    prefix = "numabind/run7/0"
    store.set(f"{prefix}/0", record(0, "hosta"))
    store.set(f"{prefix}/1", b"\x00garbage" * 1000)
    store.set(f"{prefix}/2", record(5, "hostb"))  # rank 2's key, rank 5's record
    store.set(f"{prefix}/4", record(4, "hostb\x1b[2J"))
    store.set(f"{prefix}/5", record(5, "hostb"))
    store.set(_report.LATEST, "run7/0/6")
    report = _report.read_report(store, prefix, 6, 5.0)
    text = "\n".join(_job.report_lines(report))
    assert report.missing == "3"
    assert text.splitlines()[0] == (
        "numabind job report (torchrun run run7, restart 0): 6 ranks on 3 nodes: 2 ok, "
        "0 warnings, 0 off plan, 1 unreachable, 3 unknown or invalid"
    )
    assert "a record under rank 2's key names rank 5" in text
    assert "invalid record: not JSON" in text and "is not a host name" in text
    assert "NOT POSTED: rank 3" in text and "\x1b" not in text
    assert _job.exit_status(report) == 3
    # from outside, through numabind's own client: the same report, and no torch needed
    # (an importable 'torch' that refuses to load stands in for a machine without it)
    blocked = tmp_path / "no-torch" / "torch"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('torch is not here')\n")
    p = check_store(f"127.0.0.1:{port}", PYTHONPATH=str(blocked.parent))
    assert p.returncode == 3, p.stderr
    assert p.stdout.splitlines()[0] == text.splitlines()[0]
    d = json.loads(check_store(f"127.0.0.1:{port}", "--json").stdout)
    assert d["missing"] == "3" and d["summary"]["unknown"] == 3
    assert d["schema"] == "numabind-job/2"
    assert any("store records are self-reported" in n for n in d["notes"])
    late = _report.read_report(store, prefix, 6, None, time.monotonic() - 1)
    assert late.missing == "" and late.unread == 6
    assert late.notes[-1] == "6 rank(s) not read: the deadline passed"
    assert late.summary.unreachable == 6
    del store


# --- real torchrun -------------------------------------------------------------------------


def agent(
    host: str | None, port: int, nnodes: int, nproc: int, env: dict[str, str], *more: str
) -> list[str]:
    rdzv = [
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=numabind-report",
        "--local-addr=127.0.0.1",
    ]
    if port == 0:  # one agent: a standalone rendezvous (its restarts work with gloo here)
        rdzv = ["--standalone"]
    torchrun = [need("torchrun"), f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", *rdzv]
    torchrun += [*more, WORKER]
    if host is None:
        return torchrun
    # its own UTS namespace: another host name, as a second machine has
    return ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "agent", *torchrun]


def report_of(text: str) -> list[str]:
    return [
        line[len("numabind: ") :] for line in text.splitlines() if line.startswith("numabind: ")
    ]


@pytest.mark.torch
@pytest.mark.launchers
def test_torchrun_two_hosts_one_table_and_the_store_from_outside(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if os.geteuid() != 0 or not shutil.which("unshare"):
        if os.environ.get("NUMABIND_REQUIRE_LAUNCHERS") == "1":
            pytest.fail("two torchrun hosts need root and unshare (UTS namespaces)")
        pytest.skip("two torchrun hosts need root and unshare (UTS namespaces)")
    port = free_port()
    env = clean_env(
        NUMABIND_REPORT="1",
        NUMABIND_REPORT_WAIT="30",
        REPORT_DIR=str(tmp_path),
        HOLD="8",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        TORCH_CPP_LOG_LEVEL="ERROR",
    )
    agents = {
        h: subprocess.Popen(
            agent(h, port, 2, 2, env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=str(tmp_path),
        )
        for h in ("hosta", "hostb")
    }
    outside = None
    for _ in range(300):  # the report is printed while the workers hold for 8 s
        written = list(tmp_path.glob("worker-0-*.json"))
        if len(written) == 4:
            time.sleep(2)
            outside = check_store(json.loads(written[0].read_text())["store"])
            break
        time.sleep(0.1)
    outs = {h: a.communicate(timeout=180)[0] for h, a in agents.items()}
    assert all(a.returncode == 0 for a in agents.values()), outs
    printed = [report_of(o) for o in outs.values()]
    table = next(t for t in printed if t)
    assert [t for t in printed if t] == [table], "one rank prints, once"
    print("\n".join(table))
    assert table[0].endswith("4 ranks on 2 nodes: 4 ok, 0 warnings, 0 off plan, 0 unreachable")
    assert "2 identical nodes: hosta, hostb: 4 ranks ok" in table[3]
    pids = sorted(json.loads(p.read_text())["pid"] for p in tmp_path.glob("worker-0-*.json"))
    shown = sorted(int(line.split()[3]) for line in table if line.startswith("  hosta "))
    assert set(shown) <= set(pids) and len(shown) == 2
    assert outside is not None and outside.returncode == 0, (outside, outs)
    assert outside.stdout.splitlines()[0] == table[0]


@pytest.mark.torch
@pytest.mark.launchers
def test_a_rank_that_never_posts_is_named_after_the_wait(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = clean_env(
        REPORT_API="1",
        REPORT_SKIP_RANK="2",
        REPORT_WAIT="10",
        REPORT_DIR=str(tmp_path),
        HOLD="1",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    p = subprocess.run(
        agent(None, 0, 1, 3, env),
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        cwd=str(tmp_path),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    table = report_of(p.stderr + p.stdout)
    print("\n".join(table))
    assert table[0].endswith("3 ranks on 1 node: 2 ok, 0 warnings, 0 off plan, 1 unreachable")
    assert "NOT POSTED: rank 2 (no record before the wait ended)" in table
    assert "note: 1 rank(s) posted no record within 10 s" in table


@pytest.mark.torch
@pytest.mark.launchers
def test_an_elastic_restart_reports_the_new_generation_only(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    env = clean_env(
        NUMABIND_REPORT="1",
        NUMABIND_REPORT_WAIT="20",
        REPORT_CRASH_RANK="1",
        REPORT_DIR=str(tmp_path),
        HOLD="4",
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
    )
    p = subprocess.run(
        agent(None, 0, 1, 2, env, "--max-restarts=1"),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=str(tmp_path),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    table = report_of(p.stderr + p.stdout)
    print("\n".join(table))
    heads = [line for line in table if line.startswith("numabind job report")]
    second = [h for h in heads if "restart 1)" in h]
    assert second and second[-1].endswith(
        "2 ranks on 1 node: 2 ok, 0 warnings, 0 off plan, 0 unreachable"
    )
    new = {json.loads(f.read_text())["pid"] for f in tmp_path.glob("worker-1-*.json")}
    old = {json.loads(f.read_text())["pid"] for f in tmp_path.glob("worker-0-*.json")}
    last = table[table.index(second[-1]) :]
    shown = {
        int(line.split()[3]) for line in last if line.startswith("  ") and line.split()[3].isdigit()
    }
    assert shown == new and not shown & old, (shown, new, old)
