"""A read-only client of torch.distributed's TCPStore, for ``check --job --store``.

The job report's records live in the job's own c10d store (``MASTER_ADDR:MASTER_PORT``).
Reading them from outside with torch's client would trust the store twice: torch reads
whatever length the server announces for a value into memory (a broken or hostile store
makes the reader allocate and zero gigabytes), and it needs torch on the machine that asks.
This client speaks the store's wire protocol for the three requests a reader needs and
bounds everything by its caller: a value longer than ``limit`` is refused from its length
alone, before a byte of it is read, and every wait ends at the caller's deadline.

The protocol (torch/csrc/distributed/c10d/TCPStoreBackend.hpp; the same for the libuv
and the classic server): a request is one byte (:data:`QUERIES`) then its arguments, each
key a native-order 64-bit length and its bytes, prefixed with ``/`` by TCPStore; a new
connection first sends ``VALIDATE`` and the magic number.  ``CHECK`` answers one byte
(0 ready), ``GET`` a 64-bit length and the value.
"""

from __future__ import annotations

import socket
import struct
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ._peer import Listener

QUERIES = {"validate": 0, "get": 3, "check": 5}  # c10d::detail::QueryType
MAGIC = 0x3C85F7CE  # c10d::detail::validationMagicNumber
KEY_PREFIX = "/"  # TCPStore's keyPrefix_: every key on the wire starts with it
READY, NOT_READY = 0, 1  # c10d::detail::CheckResponseType
MAX_KEY = 4096  # bytes of a key this client sends
_SERVERS = ((b"HTTP/", "an HTTP server"), (b"SSH-", "an SSH server"), (b"<", "a web server"))


class StoreError(OSError):
    """The store could not be read: refused, closed, too slow, or a value too long."""


class Refused(StoreError):
    """The store's address is served by a user the check does not expect (root asks
    nothing of it: :mod:`numabind.check._peer`); ``listener`` is who serves it."""

    listener: Listener | None = None


SILENT = 10.0  # seconds a request may go unanswered before the peer is given up on


class StoreClient:
    """One connection to a TCPStore, read only: :meth:`check` and :meth:`get`, each
    ending by ``deadline`` (a ``time.monotonic()`` value).  A value longer than ``limit``
    is refused (:class:`StoreError`) and the connection made anew, since its unread bytes
    would otherwise be taken for the next answer."""

    def __init__(
        self,
        host: str,
        port: int,
        deadline: float,
        limit: int,
        vet: Callable[[Listener], str | None] | None = None,
    ) -> None:
        self.address = (host, port)
        self.deadline = deadline
        self.limit = limit
        self._sock: socket.socket | None = None
        # who listens where the first connection went, when that is this machine; ``vet``
        # is shown it before a byte is sent (a line it returns refuses the store)
        self.listener: Listener | None = None
        self._vet = vet
        self._looked = False
        self._connect()

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise StoreError("no answer from the store before the deadline")
        return left

    def _connect(self) -> None:
        try:
            sock = socket.create_connection(self.address, timeout=self._left())
        except OSError as err:
            raise StoreError(f"cannot connect: {err.strerror or err}") from None
        self._sock = sock
        if not self._looked:
            from ._peer import of_socket

            self._looked = True
            self.listener = of_socket(sock, self.deadline)
            refused = self._vet(self.listener) if self.listener and self._vet else None
            if refused is not None:
                self.close()
                refusal = Refused(refused)
                refusal.listener = self.listener
                raise refusal
        self._send(struct.pack("=BI", QUERIES["validate"], MAGIC))

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    @property
    def usable(self) -> bool:
        """Whether the connection is still open (an error that leaves the protocol's state
        unknown closes it; a value refused for its length reconnects)."""
        return self._sock is not None

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, data: bytes) -> None:
        if self._sock is None:
            raise StoreError("the connection is closed")
        try:
            self._sock.settimeout(self._left())
            self._sock.sendall(data)
        except OSError as err:
            self.close()
            raise StoreError(f"the store did not take a request ({err})") from None

    def _recv(self, n: int) -> bytes:
        """Exactly ``n`` bytes (``n`` is bounded by the caller), or StoreError.  Each wait
        ends within :data:`SILENT`: a c10d store answers in milliseconds, and a peer that
        accepted and says nothing is not one to wait the whole deadline for."""
        if self._sock is None:
            raise StoreError("the connection is closed")
        out = bytearray()
        try:
            while len(out) < n:
                self._sock.settimeout(min(self._left(), SILENT))
                try:
                    chunk = self._sock.recv(min(n - len(out), 1 << 20))
                except TimeoutError:
                    if self.deadline - time.monotonic() <= 0:
                        raise StoreError("no answer from the store before the deadline") from None
                    raise StoreError(
                        f"the peer took the connection and said nothing for {SILENT:g} s; a "
                        "c10d store answers in milliseconds"
                    ) from None
                if not chunk:
                    raise StoreError("the store closed the connection")
                out += chunk
        except StoreError:
            self.close()
            raise
        except OSError as err:
            self.close()
            raise StoreError(f"no answer from the store ({err})") from None
        return bytes(out)

    def _not_a_store(self, first: bytes) -> str:
        """What a peer that does not speak the store's protocol said: the start of its
        answer, shown as text (an HTTP or SSH server names itself in its first bytes)."""
        said = first
        if self._sock is not None:
            try:  # what else it sent at once, without waiting for more
                self._sock.settimeout(0.2)
                said += self._sock.recv(64)
            except OSError:
                pass
        self.close()
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in said[:40])
        guess = ""
        for start, what in _SERVERS:
            if said.startswith(start):
                guess = f": {what}?"
        return f"not a c10d store: it answered {text!r}{guess}"

    @staticmethod
    def _key(key: str) -> bytes:
        raw = (KEY_PREFIX + key).encode()
        if len(raw) > MAX_KEY:
            raise StoreError(f"a key of {len(raw)} bytes")
        return struct.pack("=Q", len(raw)) + raw

    def check(self, keys: list[str]) -> bool:
        """Whether every key is set."""
        self._send(struct.pack("=BQ", QUERIES["check"], len(keys)) + b"".join(map(self._key, keys)))
        answer = self._recv(1)
        if answer[0] not in (READY, NOT_READY):
            raise StoreError(self._not_a_store(answer))
        return answer[0] == READY

    def get(self, key: str) -> bytes:
        """The value of a key that is set (:meth:`check` first: the store's GET of a
        missing key blocks or fails), at most ``limit`` bytes."""
        self._send(bytes([QUERIES["get"]]) + self._key(key))
        raw = self._recv(8)
        (length,) = struct.unpack("=Q", raw)
        if length > self.limit and raw.isascii() and raw.decode().isprintable():
            raise StoreError(self._not_a_store(raw))  # text where a length belongs
        if length > self.limit:
            self.close()
            self._connect()  # the value's bytes are still coming on the old connection
            raise StoreError(f"a value of {length} bytes (at most {self.limit} are read)")
        return self._recv(length)
