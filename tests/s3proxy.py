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

``counts`` tallies requests by method; ``log`` records every request as a ``Seen``
(method, path, Range header, status, body bytes sent). Loopback only; bodies are bounded.
"""

from __future__ import annotations

import http.client
import socket
import threading
from collections import Counter
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

MAX_BODY = 256 << 20
HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding"})
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
        self.ignore_range = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _make_handler(self))
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

    def seen(self, path_suffix: str, method: str = "GET") -> list[Seen]:
        with self._lock:
            return [s for s in self.log if s.method == method and s.path.endswith(path_suffix)]

    def close(self) -> None:
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

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _read_body(self) -> bytes:
            """The request body exactly as sent (raw chunked framing included)."""
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
            body = self._read_body()
            path = unquote(urlsplit(self.path).path)
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
            full_length = len(data)
            cut = proxy._take_cut(self.command, path)
            if cut is not None:
                data = data[:cut]
            sent = 0 if self.command == "HEAD" else len(data)
            proxy._record(Seen(self.command, path, self.headers.get("Range"), status, sent))
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
            if self.command != "HEAD":
                self.wfile.write(data)
            if cut is not None:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _proxy

    return Handler
