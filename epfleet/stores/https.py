"""A read-only store served over HTTPS (``https://host/path``; ``http://`` for loopback): a CDN
or a mirror in front of the bucket, from which devices that hold no cloud credentials sync.

Devices trust only the signed metadata, never the transport, so a mirror need not be
trusted: what it serves is verified as what the store serves is. It is read with
urllib3 (already a dependency through botocore): a ranged GET for resumable downloads,
a conditional GET (``If-None-Match``) for documents, HEAD for sizes; 404 is a missing
object. Every wait is bounded as the S3 store's are: connect and per-read timeouts of
``EPFLEET_STALL_TIMEOUT``, the head of an answer as a whole within it, a body under the
transfer limits (``epfleet.limits.TransferGuard``) and the sync's deadline
(``epfleet.stores.watch``), documents under their size limits. Redirects are followed
up to ``MAX_REDIRECTS`` times, never from ``https`` down to ``http``. Transient answers
(connection errors, 429, 5xx) are retried ``ATTEMPTS`` times with backoff, as a
``Retry-After`` asks. Anything that would write is refused: publish to the store behind
the mirror.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Generator, Iterator
from contextlib import suppress
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, NoReturn
from urllib.parse import urljoin, urlparse

import urllib3

from epfleet.errors import (
    BadInputError,
    DeadlineExceeded,
    ObjectMissing,
    StoreError,
    TransientStoreError,
)
from epfleet.fsutil import atomic_file
from epfleet.limits import TransferGuard, TransferLimits, current_deadline
from epfleet.stores.base import UNCHANGED, StoredObject, Versioned, check_key, within_range
from epfleet.stores.documents import OverLimit, document_limit, read_bounded, too_large
from epfleet.stores.watch import DEADLINE, WATCHED_POOLS, Watch, attempt

ATTEMPTS = 4
MAX_REDIRECTS = 5
CHUNK = 256 * 1024
TRANSIENT = {408, 425, 429, 500, 502, 503, 504}
READ_ONLY = (
    "is a read-only mirror (https://): publish to the store behind it (s3:// or a "
    "directory), and send device reports elsewhere (EPFLEET_REPORT_TO)"
)


class HttpsStore:
    """Reads a store's keys under ``base`` (``https://cdn.example.com/fleet/``)."""

    read_only = True

    def __init__(self, uri: str, limits: TransferLimits | None = None) -> None:
        self.uri = uri.rstrip("/")
        self.base = self.uri + "/"
        self._limits = limits
        stall = self.limits.stall_timeout
        self._http = urllib3.PoolManager(
            num_pools=4,
            maxsize=8,
            timeout=urllib3.Timeout(connect=min(stall, 10.0), read=stall),
            retries=False,
        )
        self._http.pool_classes_by_scheme = dict(WATCHED_POOLS)

    @property
    def limits(self) -> TransferLimits:
        return self._limits or TransferLimits.from_settings()

    def _url(self, key: str) -> str:
        return urljoin(self.base, check_key(key))

    # --- one request ------------------------------------------------------------------------

    def _send(self, method: str, key: str, headers: dict[str, str]) -> Any:
        """The answer to ``method`` on ``key`` (its body not read yet), after redirects and
        retries of transient answers; TransientStoreError when it stays out of reach."""
        url = self._url(key)
        for tried in range(1, ATTEMPTS + 1):
            try:
                response = self._follow(method, url, headers)
            except TransientStoreError as exc:
                if isinstance(exc, DeadlineExceeded) or tried == ATTEMPTS:
                    raise
                self._back_off(tried, None)
                continue
            if response.status not in TRANSIENT or tried == ATTEMPTS:
                return response
            retry_after = response.headers.get("Retry-After")
            _discard(response)
            self._back_off(tried, retry_after)
        raise AssertionError("unreachable")

    def _back_off(self, tried: int, retry_after: str | None) -> None:
        wait = min(8.0, 0.5 * 2 ** (tried - 1))
        asked = retry_after is not None and retry_after.isdigit()
        if asked:
            wait = min(float(retry_after or 0), 30.0)
        deadline = current_deadline()
        if deadline is not None and deadline.remaining() < wait:
            left = max(0.0, deadline.remaining())
            why = (
                f"asked to retry after {retry_after} s (Retry-After)"
                if asked
                else (f"still failing after {tried} attempts (the next in {wait:g} s)")
            )
            raise DeadlineExceeded(
                f"{self.uri} {why}, later than the sync's deadline of {deadline.seconds:g} s "
                f"(EPFLEET_SYNC_DEADLINE) allows ({left:.1f} s left): stopped retrying; the "
                "next sync tries again"
            )
        time.sleep(wait)

    def _follow(self, method: str, url: str, headers: dict[str, str]) -> Any:
        for _ in range(MAX_REDIRECTS + 1):
            response = self._once(method, url, headers)
            location = response.headers.get("Location")
            if response.status not in (301, 302, 303, 307, 308) or not location:
                return response
            _discard(response)
            target = urljoin(url, location)
            if urlparse(url).scheme == "https" and urlparse(target).scheme != "https":
                raise StoreError(f"{url} redirects to {target}: refused (https to http)")
            url = target
        raise StoreError(f"{url}: more than {MAX_REDIRECTS} redirects")

    def _once(self, method: str, url: str, headers: dict[str, str]) -> Any:
        deadline = current_deadline()
        if deadline is not None and deadline.passed():
            raise deadline.exceeded(f"{method} {url} not started")
        watch = Watch()
        if deadline is not None:
            watch.start(DEADLINE, deadline.remaining())
        attempt.watch = watch
        try:
            response = self._http.request(
                method, url, headers=headers, preload_content=False, redirect=False
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            fired = watch.end()
            self._unreachable(url, fired, exc)
        finally:
            attempt.watch = None
        if watch.end() is not None:
            _discard(response)
            self._unreachable(url, watch.fired, None)
        return response

    def _unreachable(self, url: str, fired: str | None, exc: BaseException | None) -> NoReturn:
        deadline = current_deadline()
        if fired == DEADLINE and deadline is not None:
            raise deadline.exceeded(f"reading {url} stopped")
        silent = isinstance(exc, (TimeoutError, urllib3.exceptions.ReadTimeoutError))
        if fired is not None or silent:
            raise TransientStoreError(
                f"reading {url}: no complete answer within {self.limits.stall_timeout:g} s "
                "(EPFLEET_STALL_TIMEOUT)"
            )
        raise TransientStoreError(f"cannot reach {url}: {exc}") from None

    def _refused(self, response: Any, key: str, action: str) -> NoReturn:
        status = response.status
        _discard(response)
        where = self._url(key)
        if status in (401, 403):
            raise StoreError(f"{action} {where}: the mirror answered {status} (not allowed)")
        if status in TRANSIENT:
            raise TransientStoreError(f"{action} {where}: the mirror answered {status}")
        raise StoreError(f"{action} {where}: the mirror answered {status}")

    def _body(self, response: Any, key: str, guard: TransferGuard) -> Generator[bytes, None, None]:
        """The body as it arrives, counted by ``guard``; a stall raises TransferTooSlow and a
        body cut short TransientStoreError."""
        length = response.headers.get("Content-Length")
        got, whole = 0, False
        try:
            while chunk := response.read1(CHUNK):
                got += len(chunk)
                guard.add(len(chunk))
                yield chunk
            whole = True
        except (TimeoutError, urllib3.exceptions.ReadTimeoutError):
            raise guard.stalled() from None
        except (urllib3.exceptions.ProtocolError, OSError) as exc:
            raise TransientStoreError(
                f"{guard.what} from {self._url(key)}: the connection dropped ({exc})"
            ) from None
        finally:
            if whole:
                _discard(response)
            else:  # aborted (a guard, the reader stopping early): nothing more is read
                response.close()
        if length is not None and length.isdigit() and got < int(length):
            raise TransientStoreError(
                f"{guard.what} from {self._url(key)}: the connection dropped after {got} of "
                f"{length} bytes"
            )

    # --- reads ------------------------------------------------------------------------------

    def _get(self, key: str, if_none_match: str | None) -> Versioned | Literal["unchanged"] | None:
        headers = {"Accept-Encoding": "identity"}
        if if_none_match is not None:
            headers["If-None-Match"] = if_none_match
        response = self._send("GET", key, headers)
        if response.status == 404:
            _discard(response)
            return None
        if response.status == 304:
            _discard(response)
            return UNCHANGED
        if response.status != 200:
            self._refused(response, key, "reading")
        etag = response.headers.get("ETag") or ""
        limit, _ = document_limit(key)
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            _discard(response)
            raise too_large(self._url(key), key, int(length), etag)
        guard = TransferGuard(f"read of {key}", self.uri, self.limits)
        chunks = self._body(response, key, guard)
        try:
            data = read_bounded(chunks, limit)
        except OverLimit:
            raise too_large(self._url(key), key, None, etag) from None
        finally:
            chunks.close()
        return Versioned(data, etag)

    def read(self, key: str) -> Versioned | None:
        got = self._get(key, None)
        assert got != UNCHANGED
        return got

    def read_if_changed(self, key: str, etag: str) -> Versioned | Literal["unchanged"] | None:
        return self._get(key, etag)

    def read_range(self, key: str, start: int, end: int | None = None) -> Iterator[bytes]:
        headers = {"Accept-Encoding": "identity"}
        if start or end is not None:
            headers["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        response = self._send("GET", key, headers)
        if response.status == 404:
            _discard(response)
            raise ObjectMissing(f"{self._url(key)} does not exist")
        if response.status not in (200, 206):
            self._refused(response, key, f"reading (from byte {start})")
        # A mirror that ignores Range sends the whole object: skip to ``start``.
        skip = start if response.status == 200 else 0
        left = None if end is None else end - start
        guard = TransferGuard(f"download of {key}", self.uri, self.limits)
        yield from within_range(self._body(response, key, guard), skip, left)

    def size(self, key: str) -> int | None:
        response = self._send("HEAD", key, {"Accept-Encoding": "identity"})
        _discard(response, bodiless=True)
        if response.status == 404:
            return None
        if response.status != 200:
            self._refused(response, key, "looking up")
        length = response.headers.get("Content-Length")
        if length is None or not length.isdigit():
            raise StoreError(f"{self._url(key)}: the mirror gives no Content-Length")
        return int(length)

    def download(self, key: str, dest: Path) -> None:
        with atomic_file(dest) as out:
            for chunk in self.read_range(key, 0):
                out.write(chunk)

    # --- what a mirror cannot do ------------------------------------------------------------

    def _read_only(self, what: str) -> NoReturn:
        raise StoreError(f"{what}: {self.uri} {READ_ONLY}")

    def write(
        self,
        key: str,
        data: bytes,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        content_encoding: str | None = None,
    ) -> str:
        self._read_only(f"writing {key}")

    def upload(self, key: str, path: Path, sha256: str) -> None:
        self._read_only(f"uploading {key}")

    def delete(self, key: str) -> None:
        self._read_only(f"deleting {key}")

    def touch(self, key: str, min_age: float = 0.0) -> bool:
        self._read_only(f"touching {key}")

    def delete_if_older(self, key: str, cutoff: datetime) -> bool:
        self._read_only(f"deleting {key}")

    def list_keys(self, prefix: str) -> list[str]:
        self._read_only(f"listing {prefix or 'the store'} (a mirror serves files, not listings)")

    def list_objects(self, prefix: str, *, hidden: bool = False) -> list[StoredObject]:
        self._read_only(f"listing {prefix or 'the store'} (a mirror serves files, not listings)")

    def iter_objects(self, prefix: str, *, hidden: bool = False) -> Iterator[StoredObject]:
        self._read_only(f"listing {prefix or 'the store'} (a mirror serves files, not listings)")

    def incomplete_uploads(self) -> list[StoredObject]:
        return []

    def clean_up_incomplete(self, older_than: float | None = None) -> list[str]:
        return []


DRAIN_SECONDS = 1.0
"""The most time a short body's rest is read for (to keep its connection): never past the
sync's deadline, so that a mirror sending a byte at a time holds nothing."""


def _discard(response: Any, *, bodiless: bool = False) -> None:
    """Done with ``response``: a short rest of its body is read so that its connection
    serves the next request, within ``DRAIN_SECONDS`` and the sync's deadline (its socket is
    shut down when they pass, waking the read); a long or endless one closes the connection
    instead. ``bodiless``: an answer to HEAD, which has none whatever its Content-Length
    says."""
    length = response.headers.get("Content-Length")
    try:
        if bodiless or response.status in (204, 304):
            response.release_conn()
        elif length is not None and length.isdigit() and int(length) <= 65536:
            if _drained_in_time(response):
                response.release_conn()
            else:
                response.close()
        else:
            response.close()
    except Exception:
        response.close()


def _drained_in_time(response: Any) -> bool:
    """Read the rest of ``response``'s body within its time (see ``_discard``); False when
    that ran out (its connection is then unusable)."""
    budget = DRAIN_SECONDS
    deadline = current_deadline()
    if deadline is not None:
        budget = min(budget, deadline.remaining())
    if budget <= 0:
        return False
    state = {"done": False, "fired": False}
    lock = threading.Lock()

    def shut() -> None:
        with lock:
            if state["done"]:
                return
            state["fired"] = True
        sock = getattr(getattr(response, "connection", None), "sock", None)
        if sock is not None:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(budget, shut)
    timer.daemon = True
    timer.start()
    try:
        response.drain_conn()
    finally:
        with lock:
            state["done"] = True
        timer.cancel()
    return not state["fired"]


def from_uri(uri: str) -> HttpsStore:
    parsed = urlparse(uri)
    if not parsed.netloc:
        raise BadInputError(f"store URI {uri!r} names no host")
    if parsed.query or parsed.fragment:
        raise BadInputError(f"store URI {uri!r}: a mirror's URI takes no query or fragment")
    return HttpsStore(uri)
