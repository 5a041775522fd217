"""The S3 bulk read as it was before ``epfleet.stores.s3.direct`` signed and sent its own
requests (botocore's ``S3SigV4Auth``, a urllib3 pool, a timer thread per request): kept
unchanged here so that ``bench/s3_requests.py`` measures it beside the path that replaced
it. Not used by epfleet."""

# ruff: noqa
# mypy: ignore-errors
from __future__ import annotations

import os
import random
import re
import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote, urlsplit

import urllib3
from botocore import UNSIGNED
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.httpsession import get_cert_path

from epfleet.errors import StoreError, TransferTooSlow, TransientStoreError
from epfleet.limits import TransferGuard
from epfleet.stores.base import Versioned
from epfleet.stores.documents import OverLimit, document_limit, read_bounded, too_large
from epfleet.stores.s3.errors import CREDENTIAL_CODES, THROTTLING_CODES, missing_bucket
from epfleet.stores.watch import WATCHED_POOLS, Watch, attempt

if TYPE_CHECKING:
    from epfleet.stores.s3.store import S3Store

CHUNK = 1 << 20
ERROR_BODY_LIMIT = 65_536
MAX_BACKOFF = 20.0
_PROBE_KEY = "epfleet-direct-read-probe"
_CODE = re.compile(rb"<Code>([^<]{1,100})</Code>")


class _Transient(Exception):
    """One attempt failed in a way worth another (the message says how)."""

    def __init__(self, message: str, silent: bool = False) -> None:
        super().__init__(message)
        self.silent = silent


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
        self._region = client.meta.region_name
        self._unsigned = client.meta.config.signature_version is UNSIGNED
        probe = store.object_key(_PROBE_KEY)
        url = client.generate_presigned_url(
            "get_object", Params={"Bucket": store.bucket, "Key": probe}, ExpiresIn=60
        )
        parts = urlsplit(url)
        quoted = _quote(probe)
        if not parts.path.endswith(quoted):
            raise RuntimeError(f"botocore presigned {url!r}, not a URL ending in its key")
        self._origin = f"{parts.scheme}://{parts.netloc}"
        self._path_prefix = parts.path[: -len(quoted)]
        attempts, connect, stall = store._settings
        self._attempts, self._stall = attempts, stall
        ca = _ca_bundle()
        self._http = urllib3.PoolManager(
            num_pools=4,
            maxsize=32,
            timeout=urllib3.Timeout(connect=connect, read=stall),
            retries=False,
            ca_certs=ca,
        )
        self._http.pool_classes_by_scheme = dict(WATCHED_POOLS)

    def read(self, key: str) -> Versioned | None:
        """The object's bytes and version (still encoded as written), or None when there is
        no such object; the store's errors as ``S3Store.read`` raises them."""
        url = self._origin + self._path_prefix + _quote(self.store.object_key(key))
        for tried in range(1, self._attempts + 1):
            try:
                return self._once(key, url)
            except _Transient as exc:
                if tried == self._attempts:
                    what = f"reading {self.store.where(key)}"
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

    def _once(self, key: str, url: str) -> Versioned | None:
        headers = self._signed(url)
        watch = Watch()
        attempt.watch = watch
        try:
            response = self._http.request(
                "GET",
                url,
                headers=headers,
                preload_content=False,
                decode_content=False,
                redirect=False,
            )
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            fired = watch.end()
            silent = fired is not None or isinstance(
                exc, (TimeoutError, urllib3.exceptions.ReadTimeoutError)
            )
            raise _Transient(f"cannot reach the S3 endpoint ({exc})", silent) from None
        finally:
            attempt.watch = None
        if watch.end() is not None:
            response.close()
            raise _Transient("no complete answer", silent=True)
        if response.status == 200:
            return self._body(key, response)
        return self._refused(key, response)

    def _signed(self, url: str) -> dict[str, str]:
        if self._unsigned:
            return {"Accept-Encoding": "identity"}
        credentials = self._client._request_signer._credentials
        if credentials is None:
            raise StoreError(
                f"reading {self.store.uri}: no usable AWS credentials; check "
                "AWS_ACCESS_KEY_ID / AWS_PROFILE"
            )
        request = AWSRequest("GET", url, headers={"Accept-Encoding": "identity"})
        S3SigV4Auth(credentials.get_frozen_credentials(), "s3", self._region).add_auth(request)
        return dict(request.headers.items())

    def _body(self, key: str, response: Any) -> Versioned:
        etag = response.headers.get("ETag", "")
        limit, _ = document_limit(key)
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) > limit:
            response.close()
            raise too_large(self.store.where(key), key, int(length), etag)
        guard = TransferGuard(f"read of {key}", self.store.uri, self.store.limits)
        chunks = self._chunks(key, response, guard)
        try:
            data = read_bounded(chunks, limit)
        except OverLimit:
            raise too_large(self.store.where(key), key, None, etag) from None
        finally:
            chunks.close()
        if length is not None and length.isdigit() and len(data) < int(length):
            raise TransientStoreError(
                f"read of {key} from {self.store.where(key)}: the connection dropped after "
                f"{len(data)} of {length} bytes"
            )
        return Versioned(data, etag)

    def _chunks(self, key: str, response: Any, guard: TransferGuard) -> Generator[bytes]:
        whole = False
        try:
            while chunk := response.read1(CHUNK):
                guard.add(len(chunk))
                yield chunk
            whole = True
        except (TimeoutError, urllib3.exceptions.ReadTimeoutError):
            raise guard.stalled() from None
        except (urllib3.exceptions.ProtocolError, OSError) as exc:
            raise TransientStoreError(
                f"read of {key} from {self.store.where(key)}: the connection dropped ({exc})"
            ) from None
        finally:
            if whole:
                response.release_conn()
            else:
                response.close()

    def _refused(self, key: str, response: Any) -> Versioned | None:
        status = response.status
        try:
            body = response.read(ERROR_BODY_LIMIT + 1, decode_content=False)
        except (urllib3.exceptions.HTTPError, OSError):
            body = b""
        if len(body) > ERROR_BODY_LIMIT:
            response.close()
        else:
            response.release_conn()
        found = _CODE.search(body)
        code = found.group(1).decode("ascii", "replace") if found else ""
        if status >= 500 or status == 429 or code in THROTTLING_CODES:
            raise _Transient(f"S3 answered {status} {code}")
        where = self.store.where(key)
        if code == "NoSuchBucket":
            raise missing_bucket(self.store.uri, self.store.bucket, self._client.meta.endpoint_url)
        if status == 404:
            return None
        if status in (403, 401) or code in CREDENTIAL_CODES:
            _refuse(
                f"reading {where}: access denied ({code or status}); check credentials, "
                "bucket policy and AWS_ENDPOINT_URL"
            )
        return self.store.read(key)  # a redirect, a 400: botocore knows what to do


def _refuse(message: str) -> NoReturn:
    raise StoreError(message)


def _quote(key: str) -> str:
    """A key as botocore puts it in a URL's path."""
    return quote(key, safe="/~")


def _ca_bundle() -> str | None:
    return os.environ.get("AWS_CA_BUNDLE") or get_cert_path(True)
