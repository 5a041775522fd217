"""Reads of many small S3 objects and pages of listings, each signed here and sent on a
kept-alive connection: the fleet side's bulk reads of device reports (``S3Store.bulk_read``)
and every listing of an S3 store (``ListObjectsV2``, its pages parsed with ElementTree, keys
URL-encoded on the wire and decoded as botocore decodes them).

botocore's ``get_object`` spends most of its client CPU in its event hooks, parameter
validation, response parsing and retry machinery, not in the request. A read here is
signed by ``epfleet.stores.s3.signing`` (botocore's signature, byte for byte, its signing
key derived once a day) and sent by ``epfleet.stores.s3.wire`` (one buffer written, the
answer read straight from the socket): ``bench/s3_requests.py`` prints its client CPU beside
``get_object``'s and ``list_objects_v2``'s.

What stays S3's and botocore's:

- the URL: botocore presigns one request once (its endpoint, addressing style, region and
  the store's prefix), and each read's URL is that one with its own key, quoted as botocore
  quotes keys;
- the credentials: the client's own, refreshed as botocore refreshes them (each request
  asks for them); a client that signs nothing (``EPFLEET_S3_UNSIGNED``) sends the reads
  unsigned;
- every answer this module does not know how to read (a redirect, a 400: a bucket in
  another region, an expired token, a malformed request) is read again through
  ``get_object``, which knows them; and a client going through an HTTP proxy reads
  everything through ``get_object`` (``usable``).

Errors: 404 ``NoSuchKey`` is no object (None); ``NoSuchBucket``, access denied, a clock too
far off (``RequestTimeTooSkewed``) and the rest of S3's refusals are the store's errors, as
``epfleet.stores.s3.errors`` makes them; transient failures (5xx, 429, S3's throttling
codes, a dropped or refused connection, a silent server) are retried with botocore's
standard mode's backoff (full jitter, at most 20 s) up to the store's attempts
(``AWS_MAX_ATTEMPTS``), then raised as ``TransientStoreError`` (``TransferTooSlow`` for a
silent server). Each attempt's waits are bounded by ``wire`` (the head of an answer must be
in within the stall timeout); a body is timed by a ``TransferGuard``; a document over its
limit (``document_limit``) is refused on its Content-Length or as soon as it streams past
it.
"""

from __future__ import annotations

import functools
import os
import random
import re
import ssl
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import quote, unquote_plus, urlsplit
from xml.etree import ElementTree

from botocore import UNSIGNED
from botocore.httpsession import get_cert_path

from epfleet.errors import StoreError, TransferTooSlow, TransientStoreError
from epfleet.limits import TransferGuard
from epfleet.stores.base import Versioned
from epfleet.stores.documents import document_limit, too_large
from epfleet.stores.s3 import wire
from epfleet.stores.s3.client import parse_s3_timestamp
from epfleet.stores.s3.errors import (
    CLOCK_CODES,
    CREDENTIAL_CODES,
    THROTTLING_CODES,
    clock_skewed,
    missing_bucket,
)
from epfleet.stores.s3.signing import Signer, canonical_query

if TYPE_CHECKING:
    from epfleet.stores.s3.store import S3Store

ERROR_BODY_LIMIT = 65_536
LIST_BODY_LIMIT = 64 << 20  # a page of 1,000 keys of at most 1,024 bytes, each URL-encoded
MAX_BACKOFF = 20.0
_PROBE_KEY = "epfleet-direct-read-probe"
_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")
_DEFAULT_PORTS = {"http": 80, "https": 443}
T = TypeVar("T")


class _Transient(Exception):
    """One attempt failed in a way worth another (the message says how)."""

    def __init__(self, message: str, silent: bool = False) -> None:
        super().__init__(message)
        self.silent = silent


class Fallback(Exception):
    """An answer this module does not read (a redirect, a 400): botocore's turn."""


def usable(store: S3Store) -> bool:
    """Whether reads of ``store`` can go this way: not through an HTTP proxy (botocore's
    proxy settings are its own), and with botocore's internals where this module expects
    them (else ``get_object`` serves, as before)."""
    client: Any = store.client
    config = client.meta.config
    if config.proxies or _env_proxy():
        return False
    signer = getattr(client, "_request_signer", None)
    return config.signature_version is UNSIGNED or hasattr(signer, "_credentials")


def _env_proxy() -> bool:
    return any(
        os.environ.get(n) for n in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")
    )


class DirectReads:
    """The reads of one S3 store (see the module). Thread-safe."""

    def __init__(self, store: S3Store) -> None:
        self.store = store
        client: Any = store.client
        self._client = client
        self._unsigned = client.meta.config.signature_version is UNSIGNED
        probe = store.object_key(_PROBE_KEY)
        url = client.generate_presigned_url(
            "get_object", Params={"Bucket": store.bucket, "Key": probe}, ExpiresIn=60
        )
        parts = urlsplit(url)
        quoted = _quote(probe)
        if not parts.path.endswith(quoted) or parts.scheme not in _DEFAULT_PORTS:
            raise RuntimeError(f"botocore presigned {url!r}, not a URL ending in its key")
        self._path_prefix = parts.path[: -len(quoted)]
        self._list_path = self._path_prefix.rstrip("/") or "/"  # the bucket's own path
        host = _host_header(parts.scheme, parts.hostname or "", parts.port)
        self._host = host
        self._signer = Signer(host, client.meta.region_name)
        attempts, connect, stall = store._settings
        self._attempts, self._stall = attempts, stall
        tls = None
        if parts.scheme == "https":
            tls = ssl.create_default_context(cafile=_ca_bundle())
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
        self._pool = wire.Pool(parts.hostname or "", port, connect, tls)

    def read(self, key: str) -> Versioned | None:
        """The object's bytes and version (still encoded as written), or None when there is
        no such object; the store's errors as ``S3Store.read`` raises them."""
        path = self._path_prefix + _quote(self.store.object_key(key))
        try:
            return self._retried(
                f"reading {self.store.where(key)}", lambda: self._get_object(key, path)
            )
        except Fallback:
            return self.store.read(key)

    def listing(self, prefix: str) -> Iterator[tuple[str, int, datetime]]:
        """The S3 key, size and last modification of each object whose S3 key starts with
        ``prefix`` (``ListObjectsV2``, a page of up to 1,000 at a time), in S3's order;
        ``Fallback`` raised (before the first) for an answer botocore should read instead."""
        what = f"listing {self.store.where(prefix[len(self.store.root) :])}"
        token: str | None = None
        while True:
            params = {"list-type": "2", "prefix": prefix, "encoding-type": "url"}
            if token is not None:
                params["continuation-token"] = token
            query = canonical_query(params)
            try:
                page, token = self._retried(what, functools.partial(self._list_page, what, query))
            except Fallback as exc:
                if "continuation-token" not in params:
                    raise
                raise StoreError(f"{what}: {exc} for a later page of the listing") from None
            yield from page
            if token is None:
                return

    def _list_page(
        self, what: str, query: str
    ) -> tuple[list[tuple[str, int, datetime]], str | None]:
        answer = self._send(self._list_path, query)
        if answer.status != 200:
            self._refused(what, answer)
            raise Fallback(f"S3 answered {answer.status}")  # a 404 that is not NoSuchBucket
        guard = TransferGuard(what, self.store.uri, self.store.limits)
        held: list[bytes] = []
        total = 0
        try:
            for chunk in answer.chunks(self._stall):
                guard.add(len(chunk))
                total += len(chunk)
                if total > LIST_BODY_LIMIT:
                    raise StoreError(f"{what}: a page of the listing over {LIST_BODY_LIMIT} bytes")
                held.append(chunk)
        except wire.Silent:
            raise guard.stalled() from None
        except (wire.Dropped, wire.Malformed) as exc:
            raise _Transient(f"the connection dropped ({exc})") from None
        finally:
            answer.close()
        return parse_listing(b"".join(held), what)

    def _retried(self, what: str, once: Callable[[], T]) -> T:
        for tried in range(1, self._attempts + 1):
            try:
                return once()
            except _Transient as exc:
                if tried == self._attempts:
                    if exc.silent:
                        raise TransferTooSlow(
                            f"{what}: no complete answer within {self._stall:g} s "
                            f"(EPFLEET_STALL_TIMEOUT; {tried} attempts)"
                        ) from None
                    raise TransientStoreError(
                        f"{what}: {exc} ({tried} attempts); retry later"
                    ) from None
                time.sleep(random.uniform(0, min(MAX_BACKOFF, 2.0 ** (tried - 1))))
        raise AssertionError("unreachable")

    def _get_object(self, key: str, path: str) -> Versioned | None:
        answer = self._send(path, "")
        if answer.status == 200:
            return self._body(key, answer)
        self._refused(f"reading {self.store.where(key)}", answer)
        return None

    def _send(self, path: str, query: str) -> wire.Answer:
        """One attempt's request and the head of its answer."""
        headers = self._headers(path, query)
        target = f"{path}?{query}" if query else path
        lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        request = f"GET {target} HTTP/1.1\r\n{lines}\r\n".encode("latin-1")
        try:
            return self._pool.get(request, self._stall)
        except wire.Silent:
            raise _Transient("no complete answer", silent=True) from None
        except (wire.Dropped, wire.Malformed) as exc:
            raise _Transient(f"cannot reach the S3 endpoint ({exc})") from None
        except ssl.SSLError as exc:
            raise StoreError(
                f"reading {self.store.uri}: TLS error ({exc}); check AWS_ENDPOINT_URL and CA "
                "settings"
            ) from None

    def _headers(self, path: str, query: str) -> dict[str, str]:
        if self._unsigned:
            return {"Host": self._host}
        credentials = self._client._request_signer._credentials
        if credentials is None:
            raise StoreError(
                f"reading {self.store.uri}: no usable AWS credentials; check "
                "AWS_ACCESS_KEY_ID / AWS_PROFILE"
            )
        frozen = credentials.get_frozen_credentials()  # refreshed when due, as botocore does
        return self._signer.headers(frozen, path, query, datetime.now(timezone.utc))

    def _body(self, key: str, answer: wire.Answer) -> Versioned:
        etag = answer.headers.get("etag", "")
        limit, _ = document_limit(key)
        length = answer.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            answer.close()
            raise too_large(self.store.where(key), key, int(length), etag)
        guard = TransferGuard(f"read of {key}", self.store.uri, self.store.limits)
        held: list[bytes] = []
        total = 0
        try:
            for chunk in answer.chunks(self._stall):
                guard.add(len(chunk))
                total += len(chunk)
                if total > limit:
                    raise too_large(self.store.where(key), key, None, etag)
                held.append(chunk)
        except wire.Silent:
            raise guard.stalled() from None
        except (wire.Dropped, wire.Malformed) as exc:
            raise TransientStoreError(
                f"read of {key} from {self.store.where(key)}: the connection dropped ({exc})"
            ) from None
        finally:
            answer.close()  # a body not read to its end: its connection is not reused
        return Versioned(b"".join(held), etag)

    def _refused(self, what: str, answer: wire.Answer) -> None:
        """What a status other than 200 means: None returned for 404 ``NoSuchKey``, else
        an error raised (``_Transient`` for another attempt, ``Fallback`` for botocore's)."""
        status = answer.status
        try:
            body = answer.read(ERROR_BODY_LIMIT, self._stall) or b""
        except (wire.Silent, wire.Dropped, wire.Malformed):
            body = b""
        finally:
            answer.close()
        found = _CODE.search(body)
        code = found.group(1).decode("ascii", "replace") if found else ""
        if status >= 500 or status == 429 or code in THROTTLING_CODES:
            raise _Transient(f"S3 answered {status} {code}")
        if code == "NoSuchBucket":
            raise missing_bucket(self.store.uri, self.store.bucket, self._client.meta.endpoint_url)
        action, _, where = what.partition(" ")
        if code in CLOCK_CODES:
            raise clock_skewed(action, where, code)
        if status == 404:
            return
        if status in (403, 401) or code in CREDENTIAL_CODES:
            _refuse(
                f"{what}: access denied ({code or status}); check credentials, "
                "bucket policy and AWS_ENDPOINT_URL"
            )
        raise Fallback(f"S3 answered {status} {code}")


def parse_listing(xml: bytes, what: str) -> tuple[list[tuple[str, int, datetime]], str | None]:
    """A ``ListObjectsV2`` page's objects (key, size, last modification) and the token of
    the next page (None on the last), keys decoded as botocore decodes them when the
    page says they were URL-encoded."""
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as exc:
        raise _Transient(f"a page of the listing that is not XML ({exc})") from None
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    encoded = root.findtext(f"{ns}EncodingType") == "url"
    objects = []
    for item in root.iterfind(f"{ns}Contents"):
        key = item.findtext(f"{ns}Key") or ""
        size = item.findtext(f"{ns}Size") or ""
        modified = item.findtext(f"{ns}LastModified") or ""
        if not size.isdigit() or not modified:
            raise StoreError(f"{what}: S3 listed {key!r} without a size or a date")
        objects.append(
            (unquote_plus(key) if encoded else key, int(size), parse_s3_timestamp(modified))
        )
    truncated = root.findtext(f"{ns}IsTruncated") == "true"
    token = root.findtext(f"{ns}NextContinuationToken") if truncated else None
    if truncated and not token:
        raise StoreError(f"{what}: S3 said the listing goes on but gave no token to go on")
    return objects, token


def _refuse(message: str) -> NoReturn:
    raise StoreError(message)


def _quote(key: str) -> str:
    """A key as botocore puts it in a URL's path."""
    return quote(key, safe="/~")


def _host_header(scheme: str, hostname: str, port: int | None) -> str:
    """The Host header as botocore signs it: lowercase, an IPv6 address in brackets, the
    port unless the scheme's default."""
    host = f"[{hostname}]" if ":" in hostname else hostname
    if port is not None and port != _DEFAULT_PORTS[scheme]:
        host = f"{host}:{port}"
    return host


def _ca_bundle() -> str | None:
    return os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True)
