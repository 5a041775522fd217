"""Bodiless HTTP/1.1 GETs over kept-alive connections to one S3 endpoint, for
``epfleet.stores.s3.direct``: the request written as one buffer, the answer read straight
from the socket, each wait bounded by a socket timeout.

Why not urllib3 or ``http.client``: on a small read, their request and header machinery
(``email``'s header parser, urllib3's pool manager and URL parsing) cost more client CPU
than the request itself, and their wait for an answer's head is bounded per socket read
only (a head trickled a byte a second never trips it), which took a timer thread per
request to bound (``epfleet.stores.watch``). Here the reader owns every read, so the head's
wait is bounded as a whole by giving each read only what is left of it.

Bounds: the TCP connect (and a TLS handshake) by the connect timeout; the request's send
and every read of a body by the stall timeout (the caller's ``TransferGuard`` adds the
minimum rate); the whole head (status line and headers) by the stall timeout of starting
to wait for it; a head by ``HEAD_LIMIT`` bytes, a body by the caller's limit.

A connection goes back to the pool only when its answer was read to its end and the
server keeps it alive; one found closed by the server when taken from the pool (or that
answers nothing at all to a reused connection's request) is replaced by a new one, once,
as a server closing an idle keep-alive connection is not a failure of the request.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator

HEAD_LIMIT = 65_536
RECV = 65_536
MAX_IDLE = 32


class Silent(Exception):
    """No (complete) head within the stall timeout, or a body read that waited that long."""


class Dropped(Exception):
    """The connection failed or closed before the answer was whole (the message says how)."""


class Malformed(Exception):
    """The answer is not HTTP/1.x as this reader knows it."""


class Answer:
    """The status and headers of one answer (names lowercased), its body still to read
    with ``chunks`` (or left by ``close``)."""

    def __init__(self, connection: Connection, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers
        self._connection = connection
        self._done = False

    def chunks(self, stall: float) -> Iterator[bytes]:
        """The body's bytes as they arrive, each socket read waiting at most ``stall``
        seconds (else ``Silent``); the connection goes back to its pool at the end."""
        yield from self._connection.body(self.headers, stall)
        self._done = True
        self._connection.release(self.headers)

    def read(self, limit: int, stall: float) -> bytes | None:
        """The whole body, or None when it is over ``limit`` bytes (left unread)."""
        held: list[bytes] = []
        total = 0
        for chunk in self.chunks(stall):
            total += len(chunk)
            if total > limit:
                self.close()
                return None
            held.append(chunk)
        return b"".join(held)

    def close(self) -> None:
        """Let go of an answer not read to its end: its connection is closed."""
        if not self._done:
            self._done = True
            self._connection.close()


class Connection:
    def __init__(self, sock: socket.socket, pool: Pool) -> None:
        self.sock, self.pool = sock, pool
        self.pid = os.getpid()
        self.buffer = bytearray()

    def exchange(self, request: bytes, stall: float) -> Answer | None:
        """Send ``request`` and read the head of its answer; None when a reused connection
        turns out closed before any of the answer came (the caller sends it again on a
        new one)."""
        sock = self.sock
        end = time.monotonic() + stall
        try:
            sock.settimeout(stall)
            sock.sendall(request)
            while (at := self.buffer.find(b"\r\n\r\n")) < 0:
                if len(self.buffer) > HEAD_LIMIT:
                    raise Malformed(f"an answer's head longer than {HEAD_LIMIT} bytes")
                left = end - time.monotonic()
                if left <= 0:
                    raise Silent
                sock.settimeout(left)
                data = sock.recv(RECV)
                if not data:
                    if not self.buffer:
                        return None
                    raise Dropped("the connection closed in the middle of an answer's head")
                self.buffer += data
        except TimeoutError:
            raise Silent from None
        except (ConnectionResetError, BrokenPipeError) as exc:
            if not self.buffer:
                return None
            raise Dropped(str(exc)) from None
        head = bytes(self.buffer[:at])
        del self.buffer[: at + 4]
        status, headers = _parse_head(head)
        if 100 <= status < 200:  # an interim answer: the real one follows
            return self.exchange(b"", max(end - time.monotonic(), 0.0))
        return Answer(self, status, headers)

    def body(self, headers: dict[str, str], stall: float) -> Iterator[bytes]:
        self.sock.settimeout(stall)
        if headers.get("transfer-encoding", "").lower() == "chunked":
            yield from self._chunked()
            return
        length = headers.get("content-length")
        if length is None:  # until the server closes the connection
            if self.buffer:
                yield bytes(self.buffer)
                self.buffer.clear()
            while data := self._recv():
                yield data
            return
        if not length.isdigit():
            raise Malformed(f"Content-Length {length!r}")
        left = int(length)
        while left:
            if not self.buffer:
                data = self._recv()
                if not data:
                    raise Dropped(f"the connection closed with {left} bytes of the body unsent")
                self.buffer += data
            piece = bytes(self.buffer[:left])
            del self.buffer[: len(piece)]
            left -= len(piece)
            yield piece

    def _chunked(self) -> Iterator[bytes]:
        while True:
            line = self._line()
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise Malformed(f"a chunk size {line[:40]!r}") from None
            if size == 0:
                while self._line():  # trailers, up to the empty line
                    pass
                return
            left = size
            while left:
                if not self.buffer:
                    self._fill()
                piece = bytes(self.buffer[:left])
                del self.buffer[: len(piece)]
                left -= len(piece)
                yield piece
            if self._line():
                raise Malformed("a chunk longer than its size")

    def _line(self) -> bytes:
        while (at := self.buffer.find(b"\r\n")) < 0:
            if len(self.buffer) > HEAD_LIMIT:
                raise Malformed("a chunk line too long")
            self._fill()
        line = bytes(self.buffer[:at])
        del self.buffer[: at + 2]
        return line

    def _fill(self) -> None:
        data = self._recv()
        if not data:
            raise Dropped("the connection closed in the middle of a chunked body")
        self.buffer += data

    def _recv(self) -> bytes:
        try:
            return self.sock.recv(RECV)
        except TimeoutError:
            raise Silent from None
        except OSError as exc:
            raise Dropped(str(exc)) from None

    def release(self, headers: dict[str, str]) -> None:
        """The answer was read whole: back to the pool if the server keeps it alive."""
        if self.buffer or "close" in headers.get("connection", "").lower():
            self.close()
        else:
            self.pool.put(self)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def fresh(self) -> bool:
        """Whether an idle connection is still open: a server that closed it (or sent
        anything unasked) has made it readable."""
        if self.pid != os.getpid():  # inherited through a fork: the parent's socket
            return False
        poll = select.poll()
        poll.register(self.sock, select.POLLIN)
        try:
            return not poll.poll(0)
        except OSError:
            return False


class Pool:
    """Idle connections to one endpoint (thread-safe)."""

    def __init__(
        self, host: str, port: int, connect_timeout: float, tls: ssl.SSLContext | None
    ) -> None:
        self.host, self.port = host, port
        self.connect_timeout, self.tls = connect_timeout, tls
        self._idle: list[Connection] = []
        self._lock = threading.Lock()

    def get(self, request: bytes, stall: float) -> Answer:
        """Send ``request`` (a whole bodiless HTTP/1.1 request) on a kept-alive connection
        (or a new one) and read its answer's head; the body is the caller's to read or
        close."""
        while (reused := self._take()) is not None:
            answer = reused.exchange(request, stall)
            if answer is not None:
                return answer
            reused.close()  # the server had closed it: as with a stale one, a new one
        answer = self._connect().exchange(request, stall)
        if answer is None:
            raise Dropped("the server closed the connection without an answer")
        return answer

    def put(self, connection: Connection) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(connection)
                return
        connection.close()

    def _take(self) -> Connection | None:
        while True:
            with self._lock:
                if not self._idle:
                    return None
                connection = self._idle.pop()
            if connection.fresh():
                return connection
            connection.close()

    def _connect(self) -> Connection:
        try:
            sock = socket.create_connection((self.host, self.port), self.connect_timeout)
        except OSError as exc:
            raise Dropped(f"cannot connect to {self.host}:{self.port} ({exc})") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            try:
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            except ssl.SSLError:
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                raise Dropped(f"TLS with {self.host}:{self.port} failed ({exc})") from None
        return Connection(sock, self)


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise Malformed(f"a status line {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise Malformed(f"a header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    if version == "HTTP/1.0" and "keep-alive" not in headers.get("connection", "").lower():
        headers["connection"] = "close"
    return int(code), headers
