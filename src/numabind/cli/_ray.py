"""``numabind check --ray DASHBOARD``: every Ray actor and task holding a GPU, on every node
of the cluster, in the job report (numabind.check._job), without joining the cluster.

A Ray cluster is its owner's: joining it as a driver (``ray.init``) runs the cluster's
code in this process and unpickles what its workers return, and ``address="auto"`` joins
whatever cluster ``RAY_ADDRESS``, ``/tmp/ray`` or the process table names, whoever owns
it.  So nothing of Ray is imported here, and only the cluster the caller names is asked:

* Ray's state (its nodes, the live actors and running tasks with the resources they
  hold) is read over the dashboard's HTTP API as JSON, through :class:`Http`, a client
  that bounds everything by the caller: each answer's size (announced or read), its
  JSON values, its headers, and every wait, which ends at ``--deadline``; a redirect is
  not followed.
* The checking itself is a Ray job of the cluster's own (the dashboard's job API: its
  supervisor starts ``python -m numabind.check._raydriver`` as the cluster's user), which runs
  numabind's collector on each node holding a GPU and prints each node record as one
  line of text; its log is read over HTTP, bounded, and each record parsed as input.
  The records are the cluster's word: the report says who wrote them.

A node whose record did not come back is a row that says why; the job is stopped at the
deadline and removed afterwards.
"""

from __future__ import annotations

import json
import re
import secrets
import socket
import sys
import time
from typing import Any

from .. import _sysfs
from ..check import _job, _raydriver
from ..check._peer import Listener, of_socket, vetting
from ._common import UNREACHABLE, USAGE, write_json, write_lines

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

DEFAULT_PORT = 8265  # the dashboard's
ANSWER_CAP = 64 << 20  # bytes of one HTTP answer (10,000 actors in detail are ~20 MiB)
HEADER_CAP = 64 << 10  # bytes of an answer's status line and headers
VALUES_CAP = 1 << 20  # JSON values in one answer (counted before it is parsed)
SIZE_LINE = 1024  # bytes of one chunk's size line (with its extensions) at most
_HEX = b"0123456789abcdefABCDEF"
POLL = 0.5  # seconds between looks at the job's status
DONE = ("SUCCEEDED", "FAILED", "STOPPED")


class HttpError(OSError):
    """The dashboard could not be asked, or its answer is not one (one line)."""


class Refused(HttpError):
    """The dashboard's address is served by a user the check does not expect (root asks
    nothing of it: :mod:`numabind.check._peer`)."""


class Http:
    """A minimal HTTP/1.1 client for one host, bounded by its caller: one connection per
    request (``Connection: close``), every ``recv`` given the time left before
    ``deadline`` (a ``time.monotonic()`` value), at most ``cap`` bytes of body (a larger
    announced length is refused before a byte of it is read) and :data:`HEADER_CAP` of
    headers; chunked bodies decoded; redirects not followed.  https is TLS with the
    system's certificates."""

    def __init__(self, scheme: str, host: str, port: int, deadline: float) -> None:
        self.scheme, self.host, self.port, self.deadline = scheme, host, port, deadline
        # who listens where the first connection went, when that is this machine; ``vet``
        # is shown it before a byte is sent (it raises Refused to stop there)
        self.listener: Listener | None = None
        self.vet: Callable[[Listener], str | None] | None = None
        self._looked = False

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise HttpError("no answer from the dashboard before the deadline")
        return left

    def request(
        self, method: str, path: str, body: Any = None, cap: int = ANSWER_CAP
    ) -> tuple[int, bytes]:
        data = b"" if body is None else json.dumps(body).encode()
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Accept: application/json\r\nConnection: close\r\nUser-Agent: numabind\r\n"
        )
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self._left())
        except OSError as err:
            raise HttpError(f"cannot connect: {err.strerror or err}") from None
        try:
            if not self._looked:
                self._looked = True
                self.listener = of_socket(sock, self.deadline)
                refused = self.vet(self.listener) if self.listener and self.vet else None
                if refused is not None:
                    raise Refused(refused)
            if self.scheme == "https":
                import ssl

                context = ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self._left())
            sock.sendall(head.encode() + b"\r\n" + data)
            return self._answer(sock, cap)
        except HttpError:
            raise
        except OSError as err:
            raise HttpError(f"no answer from the dashboard ({err})") from None
        finally:
            sock.close()

    def _head(self, sock: socket.socket) -> tuple[bytes, bytes]:
        """The answer's status line and headers, and the body's bytes that came with them;
        the end of the headers is looked for in the new bytes only (linear in a drip)."""
        buf = bytearray()
        seen = 0
        while buf.find(b"\r\n\r\n", seen) < 0:
            seen = max(len(buf) - 3, 0)
            if len(buf) > HEADER_CAP:
                raise HttpError(f"an answer whose headers pass {HEADER_CAP >> 10} KiB")
            chunk = self._recv(sock)
            if not chunk:
                raise HttpError("the dashboard closed the connection before its headers")
            buf += chunk
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        return head, rest

    def _answer(self, sock: socket.socket, cap: int) -> tuple[int, bytes]:
        head, rest = self._head(sock)
        lines = head.decode("latin-1").split("\r\n")
        m = re.fullmatch(r"HTTP/1\.[01] (\d{3})(?: .*)?", lines[0])
        if m is None:
            raise HttpError(f"not an HTTP answer ({_sysfs.short(lines[0], 40)})")
        headers = {}
        for line in lines[1:]:
            key, sep, value = line.partition(":")
            if sep:
                headers[key.strip().lower()] = value.strip()
        status = int(m.group(1))
        length = headers.get("content-length")
        if length is not None:
            if not (length.isascii() and length.isdigit() and len(length) < 20):
                raise HttpError(f"a Content-Length of {_sysfs.short(length, 30)}")
            if int(length) > cap:
                raise HttpError(f"an answer of {int(length)} bytes (at most {cap} are read)")
            body = bytearray(rest)
            while len(body) < int(length):
                chunk = self._recv(sock)
                if not chunk:
                    raise HttpError("the dashboard closed the connection mid-answer")
                body += chunk
            return status, bytes(body[: int(length)])
        body = bytearray(rest)
        while True:  # until the connection closes (Connection: close), chunked or not
            if len(body) > cap + HEADER_CAP:
                raise HttpError(f"an answer over {cap} bytes")
            chunk = self._recv(sock)
            if not chunk:
                break
            body += chunk
        if "chunked" in headers.get("transfer-encoding", "").lower():
            return status, _unchunk(bytes(body), cap, self.deadline)
        return status, bytes(body)

    def _recv(self, sock: socket.socket) -> bytes:
        sock.settimeout(self._left())
        try:
            return sock.recv(1 << 16)
        except TimeoutError:
            raise HttpError("no answer from the dashboard before the deadline") from None

    def get_json(self, path: str, cap: int = ANSWER_CAP) -> Any:
        """GET ``path``: its JSON, or HttpError naming what was wrong."""
        status, body = self.request("GET", path, cap=cap)
        return _json(status, body, path, self.deadline)

    def send_json(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self.request(method, path, body, cap=1 << 20)
        return _json(status, answer, path, self.deadline)


def _unchunk(data: bytes, cap: int, deadline: float) -> bytes:
    """A chunked body decoded in one pass over ``data``: each chunk's size line is found
    from where the last chunk ended (never searched past :data:`SIZE_LINE` bytes) and
    its bytes copied once, so the cost is linear in the bytes read whatever the chunks'
    sizes (0.3's decoder copied the rest of the body for every chunk: 4 MiB of 1-byte
    chunks took 323 s); the deadline is checked inside the loop."""
    out = bytearray()
    view = memoryview(data)
    at, end, count = 0, len(data), 0
    while at < end:
        count += 1
        if not count & 0x3FF and time.monotonic() > deadline:  # every 1,024 chunks
            raise HttpError("no answer from the dashboard before the deadline")
        eol = data.find(b"\r\n", at, at + SIZE_LINE)
        token = data[at:eol].split(b";", 1)[0].strip() if eol >= 0 else b""
        if not token or len(token) > 16 or token.translate(None, _HEX):
            raise HttpError("a chunked answer that is not well formed")
        n = int(token, 16)
        if n == 0:
            break
        if len(out) + n > cap:
            raise HttpError(f"an answer over {cap} bytes")
        out += view[eol + 2 : eol + 2 + n]
        at = eol + 4 + n
    return bytes(out)


def _json(status: int, body: bytes, path: str, deadline: float) -> Any:
    """An answer's JSON: counted (:data:`VALUES_CAP`) and parsed by the C decoder, each
    one linear pass over at most the answer's cap; not begun past the deadline.  Nesting
    too deep for the decoder is a RecursionError it raises at once, a refusal here."""
    if time.monotonic() > deadline:
        raise HttpError("no answer from the dashboard before the deadline")
    if status != 200:
        said = _sysfs.clean_line(body[:200].decode("utf-8", "replace"), 120)
        raise HttpError(
            f"HTTP {status} for {path.split('?', maxsplit=1)[0]}" + (f": {said}" if said else "")
        )
    if _job._values(body) > VALUES_CAP:
        raise HttpError(f"an answer of more than {VALUES_CAP:,} JSON values")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise HttpError(f"{path.split('?', maxsplit=1)[0]} did not answer JSON") from None


def parse_address(text: str) -> tuple[str, str, int]:
    """``HOST[:PORT]`` or ``http[s]://HOST[:PORT][/]`` of the dashboard (port 8265 by
    default; ``[::1]`` for an IPv6 address); ValueError otherwise."""
    m = re.fullmatch(r"(?:(https?)://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(\d{1,5}))?/?", text)
    if m is None or len(text) > 300:
        raise ValueError(f"{_sysfs.short(text)} is not HOST[:PORT] or http://HOST:PORT")
    port = int(m.group(3) or DEFAULT_PORT)
    if not 0 < port < 65536:
        raise ValueError(f"port {port} is not a port")
    return m.group(1) or "http", m.group(2).strip("[]"), port


def _rows(http: Http, kind: str, query: str) -> list[dict[str, Any]]:
    """One list of the state API (``/api/v0/KIND``): its rows that are objects."""
    answer = http.get_json(f"/api/v0/{kind}?limit={_raydriver.LIMIT}&detail=1{query}")
    data = answer.get("data") if isinstance(answer, dict) else None
    inner = data.get("result") if isinstance(data, dict) else None
    rows = inner.get("result") if isinstance(inner, dict) else None
    if not isinstance(rows, list):
        why = answer.get("msg") if isinstance(answer, dict) else None
        raise HttpError(f"/api/v0/{kind} is not Ray's state API" + (
            f" ({_sysfs.clean_line(str(why), 200)})" if why else ""))  # fmt: skip
    return [r for r in rows[: _raydriver.LIMIT] if isinstance(r, dict)]


def cluster_state(http: Http) -> tuple[str, dict[str, list[int]], dict[str, str]]:
    """Ray's version, the GPU holders per node id and each node's name (its IP)."""
    version = http.get_json("/api/version", cap=1 << 16)
    ray_version = version.get("ray_version") if isinstance(version, dict) else None
    if not isinstance(ray_version, str):
        raise HttpError("/api/version did not name a Ray version: is it Ray's dashboard?")
    alive = "&filter_keys=state&filter_predicates=%3D&filter_values=ALIVE"
    running = "&filter_keys=state&filter_predicates=%3D&filter_values=RUNNING"
    holders = _raydriver.gpu_holders(_rows(http, "actors", alive), _rows(http, "tasks", running))
    names: dict[str, str] = {}
    for n in _rows(http, "nodes", ""):
        nid = _raydriver._node_id(n.get("node_id"))
        ip = _sysfs.clean_line(str(n.get("node_ip") or ""), 64)
        if nid is not None:
            names[nid] = ip if _job._good_name(ip) else nid[:12]
    return _sysfs.clean_line(ray_version, 40), holders, names


def _entrypoint(python: str, seconds: float) -> str:
    import shlex

    return f"{shlex.quote(python)} -m numabind.check._raydriver {seconds:.0f}"


def run_job(http: Http, python: str, seconds: float) -> tuple[str, str, str]:
    """Submit the collecting job, wait for it until the deadline (then stop it), and read
    its log; returns (its status, its message, the log text).  The job is removed after."""
    ident = f"numabind-check-{secrets.token_hex(6)}"
    body = {
        "entrypoint": _entrypoint(python, seconds),
        "submission_id": ident,
        "entrypoint_num_cpus": 0,
        "metadata": {"numabind": "check --ray"},
    }
    http.send_json("POST", "/api/jobs/", body)
    status, message = "PENDING", ""
    try:
        while True:
            info = http.get_json(f"/api/jobs/{ident}", cap=1 << 20)
            if isinstance(info, dict):
                status = _sysfs.clean_line(str(info.get("status") or "?"), 20)
                message = _sysfs.clean_line(str(info.get("message") or ""), 200)
            if status in DONE or http.deadline - time.monotonic() < 2 * POLL + 1:
                break
            time.sleep(POLL)
        if status not in DONE:
            http.deadline = max(http.deadline, time.monotonic() + 2)
            http.send_json("POST", f"/api/jobs/{ident}/stop")
        logs = http.get_json(f"/api/jobs/{ident}/logs")
        text = logs.get("logs") if isinstance(logs, dict) else None
        if not isinstance(text, str):
            raise HttpError(f"/api/jobs/{ident}/logs did not hold a log")
        return status, message, text
    finally:
        _remove(http, ident)


def _remove(http: Http, ident: str) -> None:
    """Best effort: the finished job's entry out of the dashboard's list."""
    http.deadline = max(http.deadline, time.monotonic() + 2)
    for _ in range(3):
        try:
            http.request("DELETE", f"/api/jobs/{ident}", cap=1 << 16)
            return
        except HttpError:
            time.sleep(0.3)


def parse_log(
    text: str, holders: dict[str, list[int]], names: dict[str, str], budget: _job.Budget
) -> tuple[dict[str, _job.NodeRow], list[str]]:
    """The job's lines: each node's record (parsed as input, for a node that holds a GPU
    and under the name the dashboard gives it), and notes."""
    rows: dict[str, _job.NodeRow] = {}
    notes: list[str] = []
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == _raydriver.DRIVER:
            who = _sysfs.clean_line(rest, 80)
            notes.append(
                f"collected by a Ray job of the cluster's own ({who}): its records are "
                "the cluster's word"
            )
        elif word == _raydriver.FAILED:
            notes.append(f"the cluster's job failed: {_sysfs.clean_line(rest, 300)}")
        elif word in (_raydriver.RECORD, _raydriver.LATE):
            node, _, record = rest.partition(" ")
            if node not in holders or names.get(node, node[:12]) in rows:
                continue  # a node not asked for, or said twice: not evidence of anything
            host = names.get(node, node[:12])
            if word == _raydriver.LATE:
                rows[host] = _job.NodeRow(
                    host=host, state="unreachable", reason="no record before the deadline"
                )
            else:
                rows[host] = _job.parse_node(record, host, budget=budget)
    return rows, notes[: _job.MAX_NOTES]


def run_ray(args: argparse.Namespace) -> int:
    """``check --ray DASHBOARD``: read, collect through the cluster's own job, report."""
    from .._errors import UsageError

    said = "numabind check --ray"
    if not args.ray:
        raise UsageError(
            f"{said}: name the cluster's dashboard, HOST[:PORT] (default port {DEFAULT_PORT}): "
            "check --ray never joins a cluster it finds (RAY_ADDRESS, /tmp/ray)"
        )
    try:
        scheme, host, port = parse_address(args.ray)
    except ValueError as err:
        raise UsageError(f"{said}: {err}") from None
    started = time.monotonic()
    budget = _job.Budget(started + args.deadline)
    http = Http(scheme, host, port, started + min(args.deadline, 30.0))
    where = f"{said} {_sysfs.clean_line(args.ray, 80)}"
    warned: list[str] = []
    http.vet = vetting(args.job_uid, "dashboard", warned)
    try:
        version, holders, names = cluster_state(http)
        if not holders:
            write_lines([f"{where}: no actor or task holds a GPU in this cluster (Ray {version})"])
            return UNREACHABLE
        http.deadline = started + args.deadline
        left = max(args.deadline - (time.monotonic() - started) - 3.0, 2.0)
        status, message, log = run_job(http, args.python or "python", left)
    except HttpError as err:
        line = f"{where}: {_sysfs.clean_line(str(err), 300)}"
        if args.json and isinstance(err, Refused) and http.listener is not None:
            write_json({"title": said, "refused": line, "listener": http.listener.to_dict()})
        write_lines([line], sys.stderr)
        return UNREACHABLE
    rows, notes = parse_log(log, holders, names, budget)
    notes = [*warned, *notes]
    for node in holders:
        host = names.get(node, node[:12])
        if host not in rows:
            why = f"no record from the cluster's job (it {status.lower()}"
            why += f": {message})" if message else ")"
            rows[host] = _job.NodeRow(host=host, state="unreachable", reason=why)
    hosts = [names.get(n, n[:12]) for n in holders]
    report = _job.merge(None, hosts, rows, tuple(notes), budget=budget).replace(title=said)
    if args.json:
        data = report.to_dict()
        if http.listener is not None:
            data["listener"] = http.listener.to_dict()
        write_json(data)
    else:
        write_lines(_job.report_lines(report))
    return _job.exit_status(report)


__all__ = ["USAGE", "run_ray"]
