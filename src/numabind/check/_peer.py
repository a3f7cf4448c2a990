"""Who answers on a local port: the owner of the listening socket a connection reached.

``check --ray`` and ``check --store`` ask a server by its address, and whoever listens
there writes the report: on a shared machine any user may bind the dashboard's port
(8265) or a store's before the real one starts, or with none running at all.  For a
peer on this machine (a loopback address, or one of this machine's own) the kernel
says who that is: ``/proc/net/tcp`` and ``/proc/net/tcp6`` list each socket with its
owner's uid and inode, and the process holding it has a ``socket:[INODE]`` link in
``/proc/PID/fd``.  The caller then says whom it expects (:func:`judge`).

Every read is bounded (:data:`TABLE_CAP` bytes of each table, :data:`MAX_LINKS` fd
links) and ends at the caller's deadline; a table that cannot be read, or a peer not
found in it (another network namespace), is an owner not known, said as such.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
import time

from .. import _sysfs
from .._model import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
TABLE_CAP = 64 << 20  # bytes of one table read (a busy host's 100,000 sockets are ~15 MiB)
MAX_LINKS = 1 << 18  # /proc/PID/fd links looked at for the listener's process
LISTEN = "0A"  # the state column of a listening socket


class Listener(Record):
    """The socket that answers at ``address`` (``HOST:PORT`` as reached): its owner's
    uid and name, its inode and the processes that hold it (``pids``, where found);
    ``uid`` None when the kernel's tables do not show it (``how`` says why)."""

    address: str
    uid: int | None
    user: str = ""
    pids: tuple[int, ...] = ()
    how: str = ""

    def said(self) -> str:
        """Who it is, in words: ``uid 43244 (mallory), pid 812``."""
        if self.uid is None:
            return f"an owner not known ({self.how})"
        who = f"uid {self.uid}" + (f" ({self.user})" if self.user else "")
        if self.pids:
            who += ", pid " + ", ".join(str(p) for p in self.pids[:4])
        return who


def is_local(ip: str) -> bool:
    """Whether ``ip`` is this machine's: loopback (127.0.0.0/8, ::1, their IPv4-mapped
    form), unspecified, or an address one of its interfaces has (the kernel lets a
    socket bind only to those)."""
    try:
        addr = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.is_loopback or addr.is_unspecified:
        return True
    family = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((str(addr), 0))
    except OSError:
        return False
    return True


def _address(field: str) -> tuple[bytes, int] | None:
    """A ``/proc/net/tcp[6]`` address column (``0100007F:1F90``): the address's bytes in
    network order and the port; None when it is not one."""
    hexaddr, _, hexport = field.partition(":")
    if len(hexaddr) not in (8, 32) or len(hexport) != 4:
        return None
    try:
        raw, port = bytes.fromhex(hexaddr), int(hexport, 16)
    except ValueError:
        return None
    if sys.byteorder == "little":  # each 32-bit word is written in host order
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return raw, port


def _packed(ip: str) -> tuple[bytes, bytes]:
    """``ip`` as the tables could list it: its IPv4 bytes (or b"") and its IPv6 bytes
    (an IPv4 address as its mapped form, as a dual-stack socket sees it)."""
    addr = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    if addr.version == 4:
        return addr.packed, ipaddress.IPv6Address(f"::ffff:{addr}").packed
    return b"", addr.packed


def _table_rows(path: str, deadline: float) -> tuple[list[list[str]], str]:
    """The rows of one table (its fields), bounded by :data:`TABLE_CAP` and the
    deadline; and why it was not read whole ("" when it was)."""
    rows: list[list[str]] = []
    try:
        with open(path, "rb") as f:
            data = f.read(TABLE_CAP + 1)
    except OSError as err:
        return rows, f"{path}: {err.strerror or err}"
    why = f"{path} is over {TABLE_CAP >> 20} MiB" if len(data) > TABLE_CAP else ""
    for i, line in enumerate(data[:TABLE_CAP].decode("ascii", "replace").splitlines()[1:]):
        if not i & 0xFFF and time.monotonic() > deadline:
            return rows, f"{path}: not read whole before the deadline"
        fields = line.split()
        if len(fields) >= 10:
            rows.append(fields)
    return rows, why


def listener(ip: str, port: int, deadline: float) -> Listener:
    """The socket listening on ``ip``:``port`` of this machine (a socket bound to that
    address, else one bound to every address of its family), from the kernel's tables."""
    where = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
    v4, v6 = _packed(ip)
    exact: list[list[str]] = []
    wildcard: list[list[str]] = []
    problems = []
    for path in TABLES:
        rows, why = _table_rows(path, deadline)
        if why:
            problems.append(why)
        for fields in rows:
            if fields[3] != LISTEN:
                continue
            found = _address(fields[1])
            if found is None or found[1] != port:
                continue
            if found[0] in (v4, v6):
                exact.append(fields)
            elif not found[0].strip(b"\0"):
                wildcard.append(fields)
    chosen = exact or wildcard
    if not chosen:
        how = "; ".join(problems) or "no listening socket on it in this machine's tables"
        return Listener(address=where, uid=None, how=_sysfs.clean_line(how, 200))
    fields = chosen[0]
    uid = int(fields[7]) if fields[7].isdigit() and len(fields[7]) < 11 else None
    inode = fields[9] if fields[9].isdigit() and len(fields[9]) < 21 else "0"
    return Listener(
        address=where,
        uid=uid,
        user=_user(uid),
        pids=_holders(inode, deadline) if inode != "0" else (),
        how="/proc/net/tcp" + ("6" if len(fields[1]) > 13 else ""),
    )


def _user(uid: int | None) -> str:
    if uid is None:
        return ""
    try:
        import pwd

        return _sysfs.clean_line(pwd.getpwuid(uid).pw_name, 32)
    except (KeyError, ImportError):
        return ""


def _holders(inode: str, deadline: float) -> tuple[int, ...]:
    """The processes with a ``socket:[INODE]`` fd (at most :data:`MAX_LINKS` links
    looked at, until the deadline)."""
    target = f"socket:[{inode}]"
    found: list[int] = []
    looked = 0
    for name in _sysfs.listdir("/proc", 1 << 22):
        if not (name.isascii() and name.isdigit()):
            continue
        if looked > MAX_LINKS or time.monotonic() > deadline:
            break
        fds = _sysfs.listdir(f"/proc/{name}/fd", 1 << 16)
        looked += len(fds) + 1
        for fd in fds:
            try:
                if os.readlink(f"/proc/{name}/fd/{fd}") == target:
                    found.append(int(name))
                    break
            except OSError:
                continue
        if len(found) >= 4:
            break
    return tuple(found)


def of_socket(sock: socket.socket, deadline: float) -> Listener | None:
    """Who listens where a connected socket reached, when that is this machine (None:
    a peer elsewhere, whose owner no table here can say)."""
    try:
        peer = sock.getpeername()
    except OSError:
        return None
    ip, port = str(peer[0]), int(peer[1])
    if not is_local(ip):
        return None
    return listener(ip, port, deadline)


def judge(found: Listener, expected: dict[int, str], what: str) -> str | None:
    """None where ``found`` is served by a uid in ``expected`` (uid: who that is, in
    words) or its owner is not known; else the line that says who answers instead."""
    if found.uid is None or found.uid in expected:
        return None
    whom = " or ".join(f"uid {u} ({w})" for u, w in sorted(expected.items()))
    return (
        f"the {what} at {found.address} is served by {found.said()}, not by {whom}: "
        f"whoever listens on a port writes what it answers"
    )


def vetting(job_uid: int | None, what: str, warned: list[str]) -> Callable[[Listener], str | None]:
    """What a check does with the listener of its server on this machine, when a user
    other than the one it expects (:func:`expected_owners`) serves it: for root, the
    line that refuses it (root asks it nothing, the caller raises); for anyone else a
    warning in ``warned``, for the report, and None."""
    expected = expected_owners(job_uid)

    def vet(found: Listener) -> str | None:
        why = judge(found, expected, what)
        if why is None:
            return None
        if os.geteuid() == 0:
            return f"{why}; root asks it nothing (--job-uid names the user it should be)"
        warned.append(f"warning: {why}")
        return None

    return vet


def expected_owners(job_uid: int | None) -> dict[int, str]:
    """Whom a check expects a local server of: this process's user, and the job's user
    where the caller named one (``--job-uid``)."""
    me = os.geteuid()
    out = {me: "root" if me == 0 else "this user"}
    if job_uid is not None:
        out.setdefault(job_uid, "the job's user, --job-uid")
    return out
