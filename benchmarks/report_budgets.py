"""What the largest input a job report accepts costs, against the budget it states
(docs/security.rst): each case built at its limit, run in a fresh interpreter, its wall
time and its peak resident memory (the kernel's VmHWM of that process) printed beside the
budget's size.  The attacks of issue 32 are in tests/test_shared_cluster.py (which print
their own costs with ``-s``); this is the honest worst case each budget allows:

* one node record at its byte and value budget (1,024 ranks of 64 thread groups);
* a store report at the report's byte budget (store records of 96 KiB each, read over a
  local c10d store through ``check --store``);
* one dashboard answer at check --ray's cap (64 MiB, a million JSON values).

Run: python benchmarks/report_budgets.py    (NUMABIND_BENCH_SMALL=1: an eighth of each)
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import SMALL, clean_env, table

from numabind.check import _job
from support import StandInStore

SHARE = 8 if SMALL else 1
PEAK = (
    "\nimport sys\n"
    "_h = [l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]\n"
    "sys.stderr.write('PEAK %d\\n' % (int(_h) >> 10))\n"
)


def run(code: str, *args: str) -> tuple[float, int, str]:
    began = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", code + PEAK, *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=900,
    )
    took = time.monotonic() - began
    assert "PEAK " in p.stderr, p.stderr[-2000:]
    return took, int(p.stderr.rsplit("PEAK ", 1)[1]), p.stdout


def group(i: int) -> dict[str, object]:
    """A thread group as large as a collector writes (eight ids and names, an odd mask):
    64 of them fill one rank's budget of bytes and JSON values."""
    cpus = ",".join(f"{100 * k + i}-{100 * k + i + 50}" for k in range(6))
    return {
        "cpus": cpus,
        "tids": list(range(100_000 + 8 * i, 100_008 + 8 * i)),
        "names": ["pt_autograd_worker_%03d" % i] * 8,
        "count": 8,
    }


def rank(r: int, groups: int = 64) -> dict[str, object]:
    return {
        "pid": 1 + r,
        "rank": r,
        "local_rank": 0,
        "status": "ok",
        "plan": {"cpus": "0-16383", "bound": True},
        "threads": [group(i) for i in range(groups)],
        "notes": ["n" * 290] * 4,
    }


def record(ranks: list[dict[str, object]], host: str = "gpu0001") -> bytes:
    d = {"schema": _job.SCHEMA, "host": host, "facts": {}, "ranks": ranks}
    return json.dumps(d, separators=(",", ":")).encode()


def node_record_case(where: Path) -> list[str]:
    ranks = 1024 // SHARE
    text = record([rank(r) for r in range(ranks)])
    path = where / "node.json"
    path.write_bytes(text)
    took, peak, out = run(
        "import sys; from numabind.check import _job\n"
        "row = _job.parse_node(open(sys.argv[1], 'rb').read())\n"
        "print(row.state, len(row.ranks))",
        str(path),
    )
    assert out.split() == ["answered", str(ranks)], out
    return [
        f"one node record, {ranks} ranks x 64 groups",
        f"{len(text) >> 20} MiB, {_job._values(text):,} values",
        f"{_job.RECORD_BYTES >> 20} MiB, {_job.RECORD_VALUES:,} values",
        f"{took:.1f} s",
        f"{peak} MiB",
    ]


def store_case() -> list[str]:
    one = record([rank(0, 48)], "gpu0001")
    while len(one) > _job.STORE_RECORD_BYTES:
        one = record([rank(0, 40)], "gpu0001")
    world = (_job.REPORT_BYTES // len(one) + 40) // SHARE
    values = {"numabind/latest": f"run/0/{world}".encode()}
    for r in range(world):
        values[f"numabind/run/0/{r}"] = record([rank(r, 48)], f"gpu{r // 8:04d}")
    store = StandInStore(values)
    try:
        took, peak, out = run(
            "import sys; from numabind.cli import main\n"
            "status = main(['check', '--store', sys.argv[1], '--deadline', '600'])\n"
            "print(status)",
            f"127.0.0.1:{store.port}",
        )
    finally:
        store.server.close()
    total = sum(len(v) for v in values.values())
    assert out.strip().splitlines()[-1] in ("0", "3"), out[-2000:]
    return [
        f"a store report, {world:,} records of {len(one) >> 10} KiB",
        f"{total >> 20} MiB of records",
        f"{_job.REPORT_BYTES >> 20} MiB, {_job.REPORT_MEMORY >> 20} MiB of rows",
        f"{took:.1f} s",
        f"{peak} MiB",
    ]


def dashboard_case() -> list[str]:
    from numabind.cli import _ray

    count = _ray.VALUES_CAP // SHARE - 16
    item = "x" * (_ray.ANSWER_CAP // _ray.VALUES_CAP - 4)
    body = json.dumps({"data": {"result": {"result": [item] * count}}}).encode()
    assert len(body) <= _ray.ANSWER_CAP, len(body)
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)

    threading.Thread(target=answer, daemon=True).start()
    try:
        took, peak, out = run(
            "import sys, time; from numabind.cli import _ray\n"
            "h = _ray.Http('http', '127.0.0.1', int(sys.argv[1]), time.monotonic() + 300)\n"
            "print(len(h.get_json('/api/v0/actors')['data']['result']['result']))",
            str(server.getsockname()[1]),
        )
    finally:
        server.close()
    assert out.strip() == str(count), out
    return [
        "one dashboard answer at check --ray's cap",
        f"{len(body) >> 20} MiB, {count:,} values",
        f"{_ray.ANSWER_CAP >> 20} MiB, {_ray.VALUES_CAP:,} values",
        f"{took:.1f} s",
        f"{peak} MiB",
    ]


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        rows = [node_record_case(Path(d)), store_case(), dashboard_case()]
    print(
        table(
            ["case (worst a budget allows)", "input", "budget", "time", "peak memory"],
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
