"""A real HTTP server on loopback serving a store directory as a mirror (CDN) would: GET with
single ``Range`` requests (206 and ``Content-Range``), strong ``ETag``s and
``If-None-Match`` (304), HEAD, 404 for what is missing. For the tests of the read-only
``https://`` store and of devices syncing through a mirror.

Faults a hostile or broken mirror shows, armed per path suffix: headers trickled a byte at
a time, an endless body, a body that stalls, Range ignored, a redirect, transient
status codes. Every request is counted (method, path).
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import unquote, urlparse

from tests.support.quiet_server import QuietHTTPServer


@dataclass
class Faults:
    trickle_head: set[str] = field(default_factory=set)
    """Send the status line and headers one byte every ``trickle_every`` seconds."""
    trickle_every: float = 1.0
    endless: set[str] = field(default_factory=set)
    """Answer with a body that never ends (no Content-Length)."""
    stall: set[str] = field(default_factory=set)
    """Send the headers and half the body, then nothing."""
    ignore_range: bool = False
    redirect: dict[str, str] = field(default_factory=dict)
    """Path suffix -> Location (absolute or relative)."""
    status: dict[str, list[int]] = field(default_factory=dict)
    """Path suffix -> status codes to answer first, one per request (then serve)."""
    retry_after: str = "0"
    """The Retry-After those answers carry."""
    slow_missing: bool = False
    """Answer a missing object's 404 with a 60,000-byte body sent a byte every
    ``trickle_every`` seconds (a body the client would read to reuse the connection)."""


class Mirror:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.faults = Faults()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.bytes_sent = 0
        self._lock = threading.Lock()
        mirror = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                mirror.serve(self, body=False)

            def do_GET(self) -> None:
                mirror.serve(self, body=True)

        self.server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def heal(self) -> None:
        self.faults = Faults()

    def count(self, method: str, suffix: str = "") -> int:
        with self._lock:
            return sum(
                n for (m, p), n in self.requests.items() if m == method and p.endswith(suffix)
            )

    # --- serving -----------------------------------------------------------------------------

    def serve(self, handler: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = unquote(urlparse(handler.path).path)
        with self._lock:
            self.requests[(handler.command, path)] += 1
        faults = self.faults
        for suffix, codes in faults.status.items():
            if path.endswith(suffix) and codes:
                self._send(
                    handler,
                    codes.pop(0),
                    {"Content-Length": "0", "Retry-After": faults.retry_after},
                    b"",
                )
                return
        for suffix, location in faults.redirect.items():
            if path.endswith(suffix):
                self._send(handler, 302, {"Location": location, "Content-Length": "0"}, b"")
                return
        file = (self.root / path.lstrip("/")).resolve()
        if not file.is_relative_to(self.root.resolve()) or not file.is_file():
            if faults.slow_missing and body:
                self._trickle_body(handler, 404, 60_000)
                return
            self._send(handler, 404, {"Content-Length": "0"}, b"")
            return
        data = file.read_bytes()
        etag = '"' + hashlib.sha256(data).hexdigest() + '"'
        if handler.headers.get("If-None-Match") == etag:
            self._send(handler, 304, {"ETag": etag}, b"")
            return
        if any(path.endswith(s) for s in faults.endless) and body:
            self._endless(handler)
            return
        status, headers, chunk = 200, {"ETag": etag, "Accept-Ranges": "bytes"}, data
        wanted = handler.headers.get("Range")
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted or "")
        if match and not faults.ignore_range:
            start = int(match.group(1))
            end = int(match.group(2)) + 1 if match.group(2) else len(data)
            if start >= len(data):
                self._send(handler, 416, {"Content-Range": f"bytes */{len(data)}"}, b"")
                return
            chunk = data[start:end]
            status = 206
            headers["Content-Range"] = f"bytes {start}-{start + len(chunk) - 1}/{len(data)}"
        headers["Content-Length"] = str(len(chunk))
        slow_head = any(path.endswith(s) for s in faults.trickle_head)
        stall = any(path.endswith(s) for s in faults.stall)
        if stall and body:
            self._send(handler, status, headers, chunk[: len(chunk) // 2])
            time.sleep(3600)  # the client gives up first; daemon thread
            return
        self._send(handler, status, headers, chunk if body else b"", trickle=slow_head)

    def _send(
        self,
        handler: BaseHTTPRequestHandler,
        status: int,
        headers: dict[str, str],
        body: bytes,
        trickle: bool = False,
    ) -> None:
        head = f"HTTP/1.1 {status} {handler.responses.get(status, ('',))[0]}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        raw = head.encode()
        try:
            if trickle:
                for byte in raw:
                    handler.wfile.write(bytes([byte]))
                    handler.wfile.flush()
                    time.sleep(self.faults.trickle_every)
            else:
                handler.wfile.write(raw)
            handler.wfile.write(body)
            handler.wfile.flush()
        except OSError:
            return
        with self._lock:
            self.bytes_sent += len(raw) + len(body)

    def _trickle_body(self, handler: BaseHTTPRequestHandler, status: int, size: int) -> None:
        try:
            handler.wfile.write(
                f"HTTP/1.1 {status} Not Found\r\nContent-Length: {size}\r\n\r\n".encode()
            )
            handler.wfile.flush()
            for _ in range(size):
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(self.faults.trickle_every)
        except OSError:
            return

    def _endless(self, handler: BaseHTTPRequestHandler) -> None:
        try:
            handler.wfile.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            block = b"\0" * 65536
            while True:
                handler.wfile.write(block)
        except OSError:
            return
