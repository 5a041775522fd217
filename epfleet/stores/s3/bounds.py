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
- the body of an error answer to a streamed operation (a ``GetObject``'s 404, a 503)
  is read here, under the attempt's watch, at most ``ERROR_BODY_LIMIT`` bytes of it:
  botocore would read it whole after the attempt, where no timer bounds it (measured: a
  404 trickled a byte every 50 ms held a read 17 s past a 1 s deadline, and an endless
  one would fill memory).

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
from botocore.compat import HTTPHeaders
from botocore.httpsession import URLLib3Session

from epfleet.limits import Deadline, current_deadline
from epfleet.stores.watch import DEADLINE, Watch, Watched, attempt

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client


class DeadlineReached(bce.BotoCoreError):
    """An attempt stopped (or not started) because the sync's deadline passed; botocore
    does not retry it, and the store names what was stopped (``errors``)."""

    fmt = "the sync's deadline passed: {method} {url} stopped"

    def __init__(self, deadline: Deadline, request: AWSPreparedRequest) -> None:
        super().__init__(method=request.method, url=request.url)
        self.deadline = deadline


class WatchedHTTPConnection(Watched, AWSHTTPConnection):  # type: ignore[misc]  # stubs
    pass


class WatchedHTTPSConnection(Watched, AWSHTTPSConnection):  # type: ignore[misc]  # stubs
    pass


class WatchedHTTPConnectionPool(AWSHTTPConnectionPool):
    ConnectionCls = WatchedHTTPConnection


class WatchedHTTPSConnectionPool(AWSHTTPSConnectionPool):
    ConnectionCls = WatchedHTTPSConnection


ERROR_BODY_LIMIT = 65_536
"""The most of an error answer's body read (S3's error XML is a few hundred bytes)."""

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
        or "_content" not in vars(AWSResponse("", 200, HTTPHeaders(), None))
    ):
        raise RuntimeError(
            "this botocore's HTTP session is not the one epfleet.stores.s3.bounds knows: "
            "the waits of S3 requests would be unbounded; pin botocore or update that module"
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
    attempt.watch = watch
    try:
        response = http.send(request)
        if request.stream_output and response.status_code >= 300:
            _read_error_body(response)
    except Exception as exc:
        fired = watch.end()
        if fired is None:
            raise
        raise _failure(fired, watch, deadline, request) from exc
    finally:
        attempt.watch = None
    fired = watch.end()
    if fired is not None:  # what was read may be cut short: the attempt failed all the same
        with suppress(Exception):
            response.raw.close()
            response.raw.release_conn()
        raise _failure(fired, watch, deadline, request)
    return response


def _read_error_body(response: AWSResponse) -> None:
    """Read an error answer's body now, under the attempt's watch, for botocore to parse
    (its ``content``); past ``ERROR_BODY_LIMIT`` bytes the rest is left unread and the
    connection closed."""
    raw: Any = response.raw
    data = raw.read(ERROR_BODY_LIMIT + 1)
    if len(data) > ERROR_BODY_LIMIT:
        data = data[:ERROR_BODY_LIMIT]
        raw.close()
    vars(response)["_content"] = data  # what botocore's ``content`` returns once read


def _failure(
    fired: str, watch: Watch, deadline: Deadline | None, request: AWSPreparedRequest
) -> bce.BotoCoreError:
    if fired == DEADLINE and deadline is not None:
        return DeadlineReached(deadline, request)
    return bce.ReadTimeoutError(
        endpoint_url=request.url,
        error=f"no complete answer within {watch.answer_timeout:g} s",
    )
