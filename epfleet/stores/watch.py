"""Time bounds on the waits of one HTTP request that socket timeouts leave open, for any
``http.client``-based connection (botocore's and urllib3's alike).

A socket timeout bounds each read, not an answer: a server, or anything in its path,
that sends its status line and headers one byte a second never trips it. A ``Watch``
holds the limits of one attempt, a timer each: the head of an answer must be in within
the connection's own timeout of starting to wait for it (``ANSWER``), and, inside a
device sync, the attempt must end by the sync's deadline (``DEADLINE``). When one
passes, the watch shuts the connection's socket down, which wakes the read in progress
(closing it does not, on Linux), and the caller sees which limit ``fired``.

Connections mix in ``Watched``; the code sending a request sets ``attempt.watch`` for
its thread around the send (``epfleet.stores.s3.bounds`` for botocore,
``epfleet.stores.https`` for the mirror store).
"""

from __future__ import annotations

import socket
import threading
from contextlib import suppress
from typing import Any

from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

ANSWER = "answer"
DEADLINE = "deadline"

attempt = threading.local()
"""``watch``: the attempt this thread is making, between ``_send_watched``'s start and end."""
_firing = threading.Lock()
"""Held while a watch fires and while a connection changes hands, so that a watch that
fires late never shuts down a connection another attempt has taken since."""


class Watch:
    """The limits of one attempt: a timer each; the first to pass shuts the socket of the
    attempt's connection down and is remembered as ``fired``."""

    def __init__(self) -> None:
        self.connection: Watched | None = None
        self.fired: str | None = None
        self.answer_timeout: float | None = None
        self._timers: dict[str, threading.Timer] = {}
        self._ended = False

    def start(self, limit: str, seconds: float) -> None:
        timer = threading.Timer(max(seconds, 0.0), self._fire, (limit,))
        timer.daemon = True
        with _firing:
            if self._ended:
                return
            self._timers[limit] = timer
        timer.start()

    def stop(self, limit: str) -> None:
        with _firing:
            timer = self._timers.pop(limit, None)
        if timer is not None:
            timer.cancel()

    def end(self) -> str | None:
        """Stop every timer; the limit that fired, if one did."""
        with _firing:
            self._ended = True
            timers, self._timers = list(self._timers.values()), {}
        for timer in timers:
            timer.cancel()
        return self.fired

    def _fire(self, limit: str) -> None:
        with _firing:
            if self._ended or self.fired or limit not in self._timers:
                return  # stopped as it came due
            self.fired = limit
            connection = self.connection
            if connection is None or connection.watch is not self:
                return  # no connection yet (the connect is bounded on its own), or reused
            sock = connection.sock
            if sock is not None:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


class Watched:
    """What botocore's connections get: the attempt's watch knows the connection carrying
    it, and times each wait for the head of an answer."""

    watch: Watch | None = None
    sock: Any
    timeout: Any

    def request(self, *args: Any, **kwargs: Any) -> Any:
        with _firing:  # a new attempt on this connection: an earlier watch lets go of it
            self.watch = getattr(attempt, "watch", None)
            if self.watch is not None:
                self.watch.connection = self
        return super().request(*args, **kwargs)  # type: ignore[misc]

    def getresponse(self) -> Any:
        return self._head(super().getresponse)  # type: ignore[misc]

    def _handle_expect_response(self, message_body: Any) -> Any:
        """botocore's read of the answer to ``Expect: 100-continue`` (a private method of its
        connection: were it renamed, that wait would be bounded by the deadline alone, and
        tests/stores/test_s3_waits.py would say so)."""
        return self._head(super()._handle_expect_response, message_body)  # type: ignore[misc]

    def _head(self, read: Any, *args: Any) -> Any:
        watch = self.watch
        if watch is None or not isinstance(self.timeout, (int, float)):
            return read(*args)
        if watch.fired:  # it came due while the connection had no socket yet: no wait now
            raise TimeoutError(f"the attempt's {watch.fired} has passed")
        watch.answer_timeout = float(self.timeout)
        watch.start(ANSWER, float(self.timeout))
        try:
            return read(*args)
        finally:
            watch.stop(ANSWER)


class _WatchedHTTP(Watched, HTTPConnection):
    pass


class _WatchedHTTPS(Watched, HTTPSConnection):
    pass


class _WatchedPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTP


class _WatchedTLSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPS


WATCHED_POOLS: dict[str, type[HTTPConnectionPool]] = {
    "http": _WatchedPool,
    "https": _WatchedTLSPool,
}
"""urllib3's pool classes by scheme, their connections ``Watched`` (for a PoolManager's
``pool_classes_by_scheme``: the https:// store's and the S3 bulk reads')."""
