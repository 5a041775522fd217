"""Time bounds on the waits of each S3 request that socket timeouts leave open.

How botocore waits for an answer (botocore 1.44, urllib3 2.x, read here and measured):
``URLLib3Session.send`` hands the request to a urllib3 pool, whose connection (botocore's
``AWSHTTPConnection``, an ``http.client.HTTPConnection``) sends it; ``getresponse`` then
reads the status line and headers with ``http.client``'s ``readline`` from a socket whose
timeout is the client's ``read_timeout``. That timeout bounds each socket read, not the
answer: a store, or anything in its path, that sends its headers one byte a second never
trips it, and nothing else bounds the wait (urllib3's ``Timeout(total=...)`` only
shortens the same per-read timeout). So it goes for the wait for a ``100 Continue``
(botocore asks for one on PUTs) and for an answer's body that botocore reads itself (a
listing, an error, a copy's result). A thread blocked in ``recv`` is not woken on Linux
when another closes the socket; ``shutdown`` wakes it.

So each attempt botocore makes runs under a ``Watch``, with one timer per limit:

- the head of an answer (status line and headers, and a ``100 Continue``) must be in
  within the socket's own timeout (the read timeout, which for the store's reads and
  small writes is ``EPFLEET_STALL_TIMEOUT``) of starting to wait for it;
- inside a device sync (``epfleet.limits.current_deadline``), the whole attempt (connect,
  request body, head, and a body botocore reads itself) must end by the sync's deadline,
  and no attempt starts after it, so botocore's retries stop there too.

When a limit passes, the watch shuts the connection's socket down: the read in progress
returns at once, and the attempt fails as a read timeout (which botocore retries, as it
does a silent server) or, past the deadline, with ``DeadlineReached`` (not retried).

What bounds the rest: a body streamed to the caller (``get_object``) is timed by the
caller's ``TransferGuard`` (stall, minimum rate, deadline), an upload by its progress
callback; the TCP connect is one wait, bounded by the connect timeout, and a TLS
handshake is bounded by the same timeout as a whole (CPython's ssl module gives it one
deadline: measured with a handshake trickled a byte at a time). Outside a sync, a body
botocore reads itself is bounded per read only: S3 keeps a long copy's answer alive
with a space every few seconds, so no total fits it.

Why timers and a shutdown rather than anything simpler: botocore exposes neither a total
timeout nor its sockets. ``bound_waits`` therefore gives a client's HTTP session this
module's connection classes (its ``_pool_classes_by_scheme``: checked when installed, so
that a botocore that changes it fails loudly here instead of leaving the waits unbounded)
and sends its requests through the ``before-send`` event, botocore's documented way to
answer a request another way. One ``threading.Timer`` per limit of an attempt costs
about a thread start, little next to a request, and leaves nothing shared to restart
after a fork.
"""

from __future__ import annotations

import functools
import socket
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Any

import botocore.exceptions as bce
from botocore.awsrequest import (
    AWSHTTPConnection,
    AWSHTTPConnectionPool,
    AWSHTTPSConnection,
    AWSHTTPSConnectionPool,
    AWSPreparedRequest,
    AWSResponse,
)
from botocore.httpsession import URLLib3Session

from epfleet.limits import Deadline, current_deadline

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

ANSWER = "answer"
DEADLINE = "deadline"

_current = threading.local()
"""``watch``: the attempt this thread is making, between ``_send_watched``'s start and end."""
_firing = threading.Lock()
"""Held while a watch fires and while a connection changes hands, so that a watch that
fires late never shuts down a connection another attempt has taken since."""


class DeadlineReached(bce.BotoCoreError):
    """An attempt stopped (or not started) because the sync's deadline passed; botocore
    does not retry it, and the store names what was stopped (``s3_errors``)."""

    fmt = "the sync's deadline passed: {method} {url} stopped"

    def __init__(self, deadline: Deadline, request: AWSPreparedRequest) -> None:
        super().__init__(method=request.method, url=request.url)
        self.deadline = deadline


class Watch:
    """The limits of one attempt: a timer each; the first to pass shuts the socket of the
    attempt's connection down and is remembered as ``fired``."""

    def __init__(self) -> None:
        self.connection: _Watched | None = None
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


class _Watched:
    """What botocore's connections get: the attempt's watch knows the connection carrying
    it, and times each wait for the head of an answer."""

    watch: Watch | None = None
    sock: Any
    timeout: Any

    def request(self, *args: Any, **kwargs: Any) -> Any:
        with _firing:  # a new attempt on this connection: an earlier watch lets go of it
            self.watch = getattr(_current, "watch", None)
            if self.watch is not None:
                self.watch.connection = self
        return super().request(*args, **kwargs)  # type: ignore[misc]

    def getresponse(self) -> Any:
        return self._head(super().getresponse)  # type: ignore[misc]

    def _handle_expect_response(self, message_body: Any) -> Any:
        """botocore's read of the answer to ``Expect: 100-continue`` (a private method of its
        connection: were it renamed, that wait would be bounded by the deadline alone, and
        tests/test_s3_waits.py would say so)."""
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


class WatchedHTTPConnection(_Watched, AWSHTTPConnection):  # type: ignore[misc]  # stubs
    pass


class WatchedHTTPSConnection(_Watched, AWSHTTPSConnection):  # type: ignore[misc]  # stubs
    pass


class WatchedHTTPConnectionPool(AWSHTTPConnectionPool):
    ConnectionCls = WatchedHTTPConnection


class WatchedHTTPSConnectionPool(AWSHTTPSConnectionPool):
    ConnectionCls = WatchedHTTPSConnection


BOTOCORE_POOLS = {"http": AWSHTTPConnectionPool, "https": AWSHTTPSConnectionPool}
WATCHED_POOLS = {"http": WatchedHTTPConnectionPool, "https": WatchedHTTPSConnectionPool}


def bound_waits(client: S3Client) -> S3Client:
    """Put every request of ``client`` under a watch (see the module's docstring)."""
    http: Any = client._endpoint.http_session  # type: ignore[attr-defined]
    manager: Any = getattr(http, "_manager", None)
    if (
        type(http) is not URLLib3Session
        or getattr(http, "_pool_classes_by_scheme", None) != BOTOCORE_POOLS
        or getattr(manager, "pool_classes_by_scheme", None) != BOTOCORE_POOLS
    ):
        raise RuntimeError(
            "this botocore's HTTP session is not the one epfleet.stores.s3_bounds knows: "
            "the waits of S3 requests would be unbounded; pin botocore or update s3_bounds"
        )
    # the session makes its proxies' pool managers from the first, its own uses the second
    vars(http)["_pool_classes_by_scheme"] = WATCHED_POOLS
    manager.pool_classes_by_scheme = WATCHED_POOLS
    send: Callable[..., None] = functools.partial(_send_watched, http)  # type: ignore[assignment]
    client.meta.events.register("before-send.s3", send)  # a handler's answer is the response
    return client


def _send_watched(http: URLLib3Session, request: AWSPreparedRequest, **_: Any) -> AWSResponse:
    """Send one attempt under a watch, in place of botocore (a ``before-send`` handler that
    answers the request)."""
    deadline = current_deadline()
    if deadline is not None and deadline.passed():
        raise DeadlineReached(deadline, request)
    watch = Watch()
    if deadline is not None:
        watch.start(DEADLINE, deadline.remaining())
    _current.watch = watch
    try:
        response = http.send(request)
    except Exception as exc:
        fired = watch.end()
        if fired is None:
            raise
        raise _failure(fired, watch, deadline, request) from exc
    finally:
        _current.watch = None
    fired = watch.end()
    if fired is not None:  # what was read may be cut short: the attempt failed all the same
        with suppress(Exception):
            response.raw.close()
            response.raw.release_conn()
        raise _failure(fired, watch, deadline, request)
    return response


def _failure(
    fired: str, watch: Watch, deadline: Deadline | None, request: AWSPreparedRequest
) -> bce.BotoCoreError:
    if fired == DEADLINE and deadline is not None:
        return DeadlineReached(deadline, request)
    return bce.ReadTimeoutError(
        endpoint_url=request.url,
        error=f"no complete answer within {watch.answer_timeout:g} s",
    )
