"""A small fault-injecting HTTP reverse proxy for S3 tests (stdlib only).

It listens on 127.0.0.1 (an ephemeral port) in front of an upstream S3 server on
loopback (moto) and forwards every request as received: method, path and query,
headers (Host included, so SigV4 signatures still match) and body; the response's
status, headers and body come back unchanged (a chunked response body is re-framed
with Content-Length). Faults, armed at runtime by the test:

- ``conflict_next_conditional_puts(n)``: the next ``n`` PUTs carrying ``If-Match``
  or ``If-None-Match`` are answered 409 ``ConditionalRequestConflict`` (an S3 XML
  error) without being forwarded.
- ``lose_next_put_responses(path, n)``: the next ``n`` PUTs to ``path``
  (``/bucket/key``) are forwarded, so they take effect, and then the client
  connection is closed without a response, as if the network dropped it.

- ``cut_next_get_responses(path, after, n)``: the next ``n`` GETs of ``path`` send the
  status line, headers and the first ``after`` body bytes, then close the connection,
  as a network drop mid-download does.

- ``ignore_range = True``: forward GETs without their Range header, as a server or
  cache that does not do ranges answers them (200 and the whole object).

- ``trickle_next_get_responses(path, interval, after, n)``: the next ``n`` GETs of
  ``path`` send the status line, headers and first ``after`` body bytes at once, then one
  byte every ``interval`` seconds (a store on a link that barely moves).
- ``trickle_next_response_heads(path, method, interval, n)``: the next ``n`` ``method``
  requests of ``path`` are forwarded (so a PUT takes effect), then the response's status
  line and headers are sent one byte every ``interval`` seconds, the body at once after
  them (a store, or something in its path, that never finishes answering).
- ``trickle_next_continues(path, interval, n)``: the next ``n`` requests to ``path``
  that ask ``Expect: 100-continue`` get their ``100 Continue`` one byte every
  ``interval`` seconds.
- ``heal()``: disarms the trickled heads and continues not yet taken.
- ``stall_next_get_responses(path, after, n)``: the next ``n`` GETs of ``path`` send the
  status line, headers and first ``after`` body bytes, then nothing, holding the
  connection open until the client gives up.
- ``serve_endless(path, content_length)``: every GET of ``path`` is answered 200 by the
  proxy itself (not forwarded) with a body of zeros that never ends: chunked, or under a
  ``Content-Length`` of ``content_length`` bytes that it would take forever to send.
- ``trickle_next_request_bodies(path, rate, n)``: the next ``n`` PUTs or POSTs to
  ``path`` (a prefix of the request path) have their body read at ``rate`` bytes per
  second before being forwarded, through a receive buffer of 4 KiB (a slow uplink).

- ``slow_down_next(path, n, method)``: the next ``n`` ``method`` requests of ``path`` (a
  prefix of the request path) are answered 503 ``SlowDown`` by the proxy (not forwarded),
  as S3 answers a prefix asked more than about 5,500 GETs a second.

- ``uploads_initiated = datetime``: answers to ListMultipartUploads give every upload
  that start time (moto reports a fixed one from 2010).

``counts`` tallies requests by method; ``log`` records every request as a ``Seen``
(method, path, Range header, status, body bytes sent). Loopback only; bodies are bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import select
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from email.message import Message
from http.server import BaseHTTPRequestHandler
from urllib.parse import unquote, urlsplit

from tests.support.quiet_server import QuietHTTPServer

MAX_BODY = 256 << 20
HOLD_MAX = 120.0  # seconds a stalled or endless response is held at most
SLOW_RCVBUF = 4096
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding"})
SLOW_DOWN_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<RequestId>s3proxy</RequestId></Error>"
)
CONFLICT_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>ConditionalRequestConflict</Code>"
    b"<Message>A conflicting operation occurred. If using PutObject you can retry the "
    b"request.</Message><RequestId>s3proxy</RequestId></Error>"
)


@dataclass(frozen=True)
class Seen:
    method: str
    path: str
    range: str | None
    status: int
    body_bytes: int
    signed: bool = True
    """The request carried an Authorization header (SigV4); False for an unsigned one."""


class FaultProxy:
    def __init__(self, upstream_port: int, *, upstream_host: str = "127.0.0.1") -> None:
        if upstream_host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("s3proxy only forwards to loopback")
        self.upstream = (upstream_host, upstream_port)
        self.counts: Counter[str] = Counter()
        self.lost: list[str] = []  # paths whose response was dropped, in order
        self.log: list[Seen] = []
        self._lock = threading.Lock()
        self._conflicts = 0
        self._lose: dict[str, int] = {}
        self._cut: dict[str, tuple[int, int]] = {}
        self._slow_get: dict[str, tuple[str, float, int, int]] = {}
        self._endless: dict[str, int | None] = {}
        self._slow_body: dict[str, tuple[float, int]] = {}
        self._slow_head: dict[tuple[str, str], tuple[float, int]] = {}
        self._slow_continue: dict[str, tuple[float, int]] = {}
        self._slow_down: dict[tuple[str, str], int] = {}
        self._closing = threading.Event()
        self.ignore_range = False
        self.uploads_initiated: datetime | None = None
        self._server = QuietHTTPServer(("127.0.0.1", 0), _make_handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), daemon=True
        )
        self._thread.start()

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def conflict_next_conditional_puts(self, n: int = 1) -> None:
        with self._lock:
            self._conflicts = n

    def lose_next_put_responses(self, path: str, n: int = 1) -> None:
        with self._lock:
            self._lose[path] = n

    def cut_next_get_responses(self, path: str, after: int, n: int = 1) -> None:
        with self._lock:
            self._cut[path] = (after, n)

    def trickle_next_get_responses(
        self, path: str, *, interval: float = 1.0, after: int = 0, n: int = 1
    ) -> None:
        with self._lock:
            self._slow_get[path] = ("trickle", interval, after, n)

    def trickle_next_response_heads(
        self, path: str, *, method: str = "GET", interval: float = 1.0, n: int = 1
    ) -> None:
        with self._lock:
            self._slow_head[(method, path)] = (interval, n)

    def trickle_next_continues(self, path: str, *, interval: float = 1.0, n: int = 1) -> None:
        with self._lock:
            self._slow_continue[path] = (interval, n)

    def stall_next_get_responses(self, path: str, *, after: int = 0, n: int = 1) -> None:
        with self._lock:
            self._slow_get[path] = ("stall", 0.0, after, n)

    def serve_endless(self, path: str, *, content_length: int | None = None) -> None:
        with self._lock:
            self._endless[path] = content_length

    def trickle_next_request_bodies(self, path: str, *, rate: float, n: int = 1) -> None:
        with self._lock:
            self._slow_body[path] = (rate, n)

    def slow_down_next(self, path: str, n: int = 1, method: str = "GET") -> None:
        with self._lock:
            self._slow_down[(method, path)] = n

    def heal(self) -> None:
        """Disarm the trickled heads and continues not yet taken."""
        with self._lock:
            self._slow_head.clear()
            self._slow_continue.clear()

    def seen(self, path_suffix: str, method: str = "GET") -> list[Seen]:
        with self._lock:
            return [s for s in self.log if s.method == method and s.path.endswith(path_suffix)]

    def close(self) -> None:
        self._closing.set()  # ends held and endless responses
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    # Decisions, made under the lock so concurrent requests each take one fault.

    def _take_conflict(self, method: str, headers: Message) -> bool:
        conditional = "If-Match" in headers or "If-None-Match" in headers
        with self._lock:
            self.counts[method] += 1
            if method == "PUT" and conditional and self._conflicts > 0:
                self._conflicts -= 1
                return True
            return False

    def _take_cut(self, method: str, path: str) -> int | None:
        if method != "GET":
            return None
        with self._lock:
            after, n = self._cut.get(path, (0, 0))
            if n <= 0:
                return None
            self._cut[path] = (after, n - 1)
            return after

    def _take_slow_get(self, method: str, path: str) -> tuple[str, float, int] | None:
        if method != "GET":
            return None
        with self._lock:
            mode, interval, after, n = self._slow_get.get(path, ("", 0.0, 0, 0))
            if n <= 0:
                return None
            self._slow_get[path] = (mode, interval, after, n - 1)
            return mode, interval, after

    def _take_slow_head(self, method: str, path: str) -> float | None:
        return self._take_one(self._slow_head, (method, path))

    def _take_slow_continue(self, path: str) -> float | None:
        return self._take_one(self._slow_continue, path)

    def _take_one(self, armed: dict, key: object) -> float | None:
        with self._lock:
            interval, n = armed.get(key, (0.0, 0))
            if n <= 0:
                return None
            armed[key] = (interval, n - 1)
            return interval

    def _take_endless(self, method: str, path: str) -> tuple[bool, int | None]:
        with self._lock:
            if method == "GET" and path in self._endless:
                return True, self._endless[path]
            return False, None

    def _take_slow_body(self, method: str, path: str) -> float | None:
        if method not in ("PUT", "POST"):
            return None
        with self._lock:
            for prefix, (rate, n) in self._slow_body.items():
                if path.startswith(prefix) and n > 0:
                    self._slow_body[prefix] = (rate, n - 1)
                    return rate
            return None

    def _take_slow_down(self, method: str, path: str) -> bool:
        with self._lock:
            for (armed, prefix), n in self._slow_down.items():
                if armed == method and path.startswith(prefix) and n > 0:
                    self._slow_down[(armed, prefix)] = n - 1
                    self.counts[method] += 1
                    return True
            return False

    def _record(self, seen: Seen) -> None:
        with self._lock:
            self.log.append(seen)

    def _take_lose(self, method: str, path: str) -> bool:
        if method != "PUT":
            return False
        with self._lock:
            if self._lose.get(path, 0) > 0:
                self._lose[path] -= 1
                self.lost.append(path)
                return True
            return False


def _make_handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, and Expect: 100-continue like S3
        timeout = 30  # idle keep-alive connections do not hold a thread for long
        # a head and its body go out as two writes: with Nagle's algorithm the second
        # waits for the client's delayed ACK of the first (40 ms a request on loopback)
        disable_nagle_algorithm = True

        head_interval: float | None = None  # set: the next head goes one byte at a time

        def log_message(self, format: str, *args: object) -> None:
            pass

        def handle_expect_100(self) -> bool:
            self.head_interval = proxy._take_slow_continue(unquote(urlsplit(self.path).path))
            return super().handle_expect_100()

        def flush_headers(self) -> None:
            """Send the buffered status line and headers, one byte per ``head_interval``
            when armed (until the client gives up), else at once."""
            interval, self.head_interval = self.head_interval, None
            head = b"".join(getattr(self, "_headers_buffer", []))
            self._headers_buffer: list[bytes] = []
            if interval is None:
                self.wfile.write(head)
                return
            self.close_connection = True
            for i in range(len(head)):
                if i and not self._hold(interval):
                    raise ConnectionError("the client gave up on the head")
                self.wfile.write(head[i : i + 1])
                self.wfile.flush()

        def handle(self) -> None:
            with contextlib.suppress(ConnectionError):  # a client that gave up on us
                super().handle()

        def _read_body(self, rate: float | None = None) -> bytes:
            """The request body exactly as sent (raw chunked framing included); at ``rate``
            bytes per second when given."""
            if rate is not None:
                return self._read_slowly(rate)
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                raw = bytearray()
                while True:
                    line = self.rfile.readline(1024)
                    raw += line
                    size = int(line.split(b";")[0].strip() or b"0", 16)
                    if size == 0:
                        while (trailer := self.rfile.readline(1024)) not in (b"\r\n", b"\n", b""):
                            raw += trailer
                        raw += b"\r\n"
                        break
                    if len(raw) + size > MAX_BODY:
                        raise ValueError("request body too large")
                    raw += self.rfile.read(size + 2)
                return bytes(raw)
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise ValueError("request body too large")
            return self.rfile.read(length)

        def _read_slowly(self, rate: float) -> bytes:
            """Read the body (Content-Length framed, or chunked until its last chunk) a
            piece at a time at ``rate`` bytes per second, through a small receive buffer so
            that the client's sends block as on a slow uplink."""
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
            piece = max(1, int(rate / 10))
            chunked = self.headers.get("Transfer-Encoding", "").lower() == "chunked"
            length = None if chunked else int(self.headers.get("Content-Length") or 0)
            raw = bytearray()
            while length is None or len(raw) < length:
                if proxy._closing.is_set():
                    raise ConnectionError("proxy closing")
                want = piece if length is None else min(piece, length - len(raw))
                got = self.rfile.read1(want)
                if not got:
                    raise ConnectionError("client went away")
                raw += got
                if chunked and raw.endswith(b"0\r\n\r\n"):
                    break
                time.sleep(len(got) / rate)
            return bytes(raw)

        def _hold(self, seconds: float) -> bool:
            """Wait up to ``seconds``; False when the client closed its end (or the proxy
            is closing)."""
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if proxy._closing.is_set():
                    return False
                readable, _, _ = select.select([self.connection], [], [], min(0.05, seconds))
                if readable:
                    try:
                        if not self.connection.recv(1, socket.MSG_PEEK):
                            return False
                    except OSError:
                        return False
                    time.sleep(0.05)  # a pipelined request waits: we are busy
            return True

        def _send_endless(self, path: str, content_length: int | None) -> None:
            proxy._record(
                Seen(
                    self.command,
                    path,
                    self.headers.get("Range"),
                    200,
                    -1,
                    "Authorization" in self.headers,
                )
            )
            self.send_response_only(200, "OK")
            self.send_header("Content-Type", "application/json")
            self.send_header("ETag", '"endless"')
            self.send_header("Last-Modified", "Thu, 01 Jan 2026 00:00:00 GMT")
            if content_length is None:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Content-Length", str(content_length))
            self.end_headers()
            block = b"0" * 65536
            frame = b"%x\r\n%s\r\n" % (len(block), block) if content_length is None else block
            self.close_connection = True
            deadline = time.monotonic() + HOLD_MAX
            try:
                while not proxy._closing.is_set() and time.monotonic() < deadline:
                    self.wfile.write(frame)
            except OSError:
                pass  # the client refused the rest

        def _send_slowly(self, data: bytes, mode: str, interval: float, after: int) -> None:
            """Send ``data`` (a response body): ``after`` bytes, then one byte per
            ``interval`` (trickle) or nothing (stall), until the client gives up."""
            self.close_connection = True
            try:
                self.wfile.write(data[:after])
                self.wfile.flush()
                if mode == "stall":
                    self._hold(HOLD_MAX)
                    return
                for i in range(after, len(data)):
                    if not self._hold(interval):
                        return
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
            except OSError:
                pass

        def _forward(self, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=30)
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() == "range" and proxy.ignore_range:
                        continue
                    conn.putheader(name, value)
                conn.endheaders()
                if body:
                    conn.send(body)
                resp = conn.getresponse()
                return resp.status, resp.reason, resp.getheaders(), resp.read()
            finally:
                conn.close()

        def _proxy(self) -> None:
            path = unquote(urlsplit(self.path).path)
            endless, content_length = proxy._take_endless(self.command, path)
            if endless:
                self._send_endless(path, content_length)
                return
            try:
                body = self._read_body(proxy._take_slow_body(self.command, path))
            except ConnectionError:
                self.close_connection = True
                return
            if proxy._take_slow_down(self.command, path):
                proxy._record(
                    Seen(
                        self.command,
                        path,
                        self.headers.get("Range"),
                        503,
                        0,
                        "Authorization" in self.headers,
                    )
                )
                self.send_response_only(503, "Slow Down")
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(SLOW_DOWN_XML)))
                self.end_headers()
                self.wfile.write(SLOW_DOWN_XML)
                return
            if proxy._take_conflict(self.command, self.headers):
                self.send_response_only(409, "Conflict")
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(CONFLICT_XML)))
                self.end_headers()
                self.wfile.write(CONFLICT_XML)
                return
            status, reason, headers, data = self._forward(body)
            if proxy._take_lose(self.command, path):
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            stamp = proxy.uploads_initiated
            if stamp is not None and self.command == "GET" and "uploads" in self.path:
                initiated = stamp.strftime("%Y-%m-%dT%H:%M:%S.000Z").encode()
                data = re.sub(
                    rb"<Initiated>[^<]*</Initiated>",
                    b"<Initiated>" + initiated + b"</Initiated>",
                    data,
                )
            full_length = len(data)
            slow = proxy._take_slow_get(self.command, path)
            cut = proxy._take_cut(self.command, path)
            if cut is not None:
                data = data[:cut]
            sent = 0 if self.command == "HEAD" else len(data)
            proxy._record(
                Seen(
                    self.command,
                    path,
                    self.headers.get("Range"),
                    status,
                    sent,
                    "Authorization" in self.headers,
                )
            )
            self.head_interval = proxy._take_slow_head(self.command, path)
            self.send_response_only(status, reason)
            chunked = False
            for name, value in headers:
                if name.lower() in HOP_BY_HOP:
                    chunked |= name.lower() == "transfer-encoding"
                    continue
                self.send_header(name, value)
            if chunked:
                self.send_header("Content-Length", str(full_length))
            self.end_headers()
            if slow is not None:
                self._send_slowly(data, *slow)
                return
            if self.command != "HEAD":
                self.wfile.write(data)
            if cut is not None:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _proxy

    return Handler
