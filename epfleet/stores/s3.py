"""A store in an S3 bucket (or anything that speaks S3): ``s3://bucket/prefix``.

Consistency rules:

- Every PUT is atomic: readers see the old object or the new one, never a part.
  ``upload`` goes through boto3's transfer manager (multipart above a threshold);
  a multipart object appears only when the upload completes.
- Conditional writes use S3's own compare-and-swap: ``If-Match: <etag>`` (replace
  only that version) or ``If-None-Match: *`` (create only). S3 answers 412 when the
  condition fails and 409 ``ConditionalRequestConflict`` when a concurrent
  conditional write to the same key raced ours; both raise PreconditionFailed and
  the caller re-reads and retries.
- A retried PUT whose first attempt succeeded but whose response was lost gets 412
  (the object is no longer at the version it names). So on 412 we read the object
  back: if it is our write -- same sha256 and the same random write id, which every
  retry of one ``write`` call carries -- the write succeeded. Comparing bytes alone
  is not enough: two writers racing to store identical bytes would both "succeed"
  and one compare-and-swap would be lost.
- ETags are opaque version tokens, not content hashes (multipart uploads and
  SSE-KMS change them), so every object carries its sha256 in user metadata.
"""

from __future__ import annotations

import contextvars
import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Generator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn
from urllib.parse import urlparse

import boto3
import botocore.exceptions as bce
import urllib3.exceptions as u3e
from boto3.exceptions import RetriesExceededError, S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from epfleet.errors import BadInputError, PreconditionFailed, StoreError, TransientStoreError
from epfleet.hashing import sha256_bytes
from epfleet.limits import TransferGuard, TransferLimits, TransferTooSlow, stalled
from epfleet.stores.base import (
    UNCHANGED,
    OverLimit,
    StoredObject,
    Versioned,
    check_key,
    check_prefix,
    document_limit,
    is_hidden,
    read_bounded,
    too_large,
)

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

logger = logging.getLogger(__name__)

MiB = 1 << 20
STREAM_CHUNK = 1 * MiB
DEFAULT_REGION = "us-east-1"
DEFAULT_MAX_ATTEMPTS = 5
SHA256_META = "sha256"
WRITE_ID_META = "epfleet-write-id"

THROTTLING_CODES = frozenset(
    {
        "SlowDown",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "InternalError",
        "ServiceUnavailable",
    }
)
MISSING_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
CREDENTIAL_CODES = frozenset(
    {"AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch"}
)


def _status(exc: bce.ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def _code(exc: bce.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3Store:
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        max_attempts: int | None = None,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        multipart_threshold: int = 64 * MiB,
        multipart_chunksize: int = 16 * MiB,
        max_concurrency: int = 4,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        attempts = max_attempts or _env_attempts()
        # The read timeout is how long a socket may wait for a byte. For reads (and small
        # writes) it is the stall timeout: a request nobody answers and a body that stops
        # both end there. Uploads keep the longer one: once a part is handed to the
        # kernel, the answer waits until its send buffer (megabytes) drains on a slow
        # link; their progress is timed by their callback instead (``upload``).
        self._limits = TransferLimits.from_settings()
        stall = self._limits.stall_timeout
        self._settings = (attempts, connect_timeout, stall)
        self._upload_settings = (attempts, connect_timeout, max(read_timeout, stall))
        self._client: S3Client | None = None
        self._uploader: S3Client | None = None
        self._client_lock = threading.Lock()
        self._concurrency = max_concurrency
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_concurrency=max_concurrency,
            preferred_transfer_client="classic",
        )

    @property
    def client(self) -> S3Client:
        """A client made on first use and shared by every store of this process with the same
        settings and AWS environment: making one costs ~0.1 s (botocore loads its S3 model),
        and a device sync opens the store several times. Clients are thread-safe."""
        with self._client_lock:
            if self._client is None:
                self._client = _shared_client(self._settings)
            return self._client

    @property
    def uploader(self) -> S3Client:
        """The client of ``upload``: the same, with the longer read timeout."""
        with self._client_lock:
            if self._uploader is None:
                self._uploader = _shared_client(self._upload_settings)
            return self._uploader

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _where(self, key: str) -> str:
        if not key:  # the whole store (a listing of its root)
            return f"{self.uri}/"
        return f"s3://{self.bucket}/{self._key(key)}"

    def _raise(self, exc: BaseException, key: str, action: str) -> NoReturn:
        """Turn a boto3/botocore failure into TransientStoreError or StoreError."""
        where = self._where(key)
        if isinstance(exc, S3UploadFailedError) and isinstance(exc.__context__, bce.ClientError):
            exc = exc.__context__
        if isinstance(exc, RetriesExceededError):
            exc = getattr(exc, "last_exception", None) or exc
        if isinstance(exc, bce.SSLError):
            raise StoreError(
                f"{action} {where}: TLS error ({exc}); check AWS_ENDPOINT_URL and CA settings"
            ) from exc
        if isinstance(exc, bce.ReadTimeoutError):
            raise TransferTooSlow(
                f"{action} {where}: no answer within {self._settings[2]:g} s "
                f"(EPFLEET_STALL_TIMEOUT; {self._settings[0]} attempts)"
            ) from exc
        if isinstance(exc, (bce.ConnectionError, bce.HTTPClientError)):
            raise TransientStoreError(
                f"{action} {where}: cannot reach the S3 endpoint ({exc}); "
                "check network and AWS_ENDPOINT_URL"
            ) from exc
        if isinstance(exc, bce.IncompleteReadError):
            raise TransientStoreError(f"{action} {where}: the connection dropped ({exc})") from exc
        if isinstance(exc, (bce.NoCredentialsError, bce.PartialCredentialsError)):
            raise StoreError(
                f"{action} {where}: no usable AWS credentials ({exc}); "
                "check AWS_ACCESS_KEY_ID / AWS_PROFILE"
            ) from exc
        if isinstance(exc, bce.ClientError):
            status, code = _status(exc), _code(exc)
            if status >= 500 or status == 429 or code in THROTTLING_CODES:
                raise TransientStoreError(
                    f"{action} {where}: S3 answered {status} {code}; retry later"
                ) from exc
            if code == "NoSuchBucket":
                raise StoreError(
                    f"{action} {where}: bucket {self.bucket!r} does not exist; "
                    "check the store URI and AWS_ENDPOINT_URL"
                ) from exc
            if code in MISSING_CODES:
                raise StoreError(
                    f"{action} {where}: no such object (check the key and that "
                    f"bucket {self.bucket!r} exists)"
                ) from exc
            if code in CREDENTIAL_CODES:
                raise StoreError(
                    f"{action} {where}: access denied ({code}); check credentials, "
                    "bucket policy and AWS_ENDPOINT_URL"
                ) from exc
            raise StoreError(f"{action} {where}: S3 answered {status} {code}: {exc}") from exc
        if isinstance(exc, bce.BotoCoreError):
            raise StoreError(f"{action} {where}: {exc}") from exc
        raise exc

    def _get(
        self, key: str, if_none_match: str | None = None
    ) -> tuple[Versioned, dict[str, str]] | Literal["unchanged"] | None:
        """A document, read whole within its limit (``document_limit``): refused on its
        Content-Length before a byte of the body is read, or as soon as a body without
        one goes past the limit; and under the transfer limits while it streams."""
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if if_none_match is not None:
            args["IfNoneMatch"] = if_none_match
        try:
            resp = self.client.get_object(**args)
        except bce.ClientError as exc:
            if _code(exc) in MISSING_CODES:
                return None
            if _status(exc) == 304:
                return UNCHANGED
            self._raise(exc, key, "reading")
        except bce.BotoCoreError as exc:
            self._raise(exc, key, "reading")
        etag = str(resp["ETag"])
        limit, _ = document_limit(key)
        length = resp.get("ContentLength")
        guard = TransferGuard(f"read of {key}", self.uri, self._limits)
        chunks = self._chunks(resp, key, guard)
        try:
            if length is not None and length > limit:
                raise too_large(self._where(key), key, length, etag)
            data = read_bounded(chunks, limit)
        except OverLimit:
            raise too_large(self._where(key), key, None, etag) from None
        finally:
            chunks.close()  # closes the body: a refused one is not read to its end
        return Versioned(data, etag), resp.get("Metadata", {})

    def _chunks(
        self, resp: Any, key: str, guard: TransferGuard | None
    ) -> Generator[bytes, None, None]:
        """A response body's bytes as they arrive, each counted by ``guard``. Read with
        ``read1`` (one socket read, at most STREAM_CHUNK bytes): a body that trickles still
        yields every few bytes, where ``read(n)`` would wait for all ``n``. A body that
        sends nothing for the stall timeout (the socket's read timeout) raises
        TransferTooSlow; one that ends before its Content-Length, TransientStoreError.
        The body is closed when the generator is."""
        body = resp["Body"]
        length = resp.get("ContentLength")
        raw = getattr(body, "_raw_stream", None)
        read = getattr(raw, "read1", None) or body.read
        what = guard.what if guard else f"download of {key}"
        got = 0
        try:
            while chunk := read(STREAM_CHUNK):
                got += len(chunk)
                if guard is not None:
                    guard.add(len(chunk))
                yield chunk
        except (TimeoutError, u3e.ReadTimeoutError, bce.ReadTimeoutError):
            error = guard.stalled() if guard else None
            raise error or stalled(self.uri, what, self._settings[2]) from None
        except (u3e.ProtocolError, bce.ResponseStreamingError, bce.IncompleteReadError) as exc:
            raise TransientStoreError(
                f"{what} from {self._where(key)}: the connection dropped ({exc})"
            ) from exc
        finally:
            body.close()
        if length is not None and got < length:  # urllib3 leaves this check to botocore
            raise TransientStoreError(
                f"{what} from {self._where(key)}: the connection dropped after {got} of "
                f"{length} bytes"
            )

    def read(self, key: str) -> Versioned | None:
        got = self._get(key)
        assert got != UNCHANGED
        return None if got is None else got[0]

    def read_if_changed(self, key: str, etag: str) -> Versioned | Literal["unchanged"] | None:
        got = self._get(key, if_none_match=etag)
        return got if got is None or got == UNCHANGED else got[0]

    def read_range(self, key: str, start: int, end: int | None = None) -> Iterator[bytes]:
        """The bytes as they arrive (see ``_chunks``): the caller counts them against the
        transfer limits (``epfleet.device.download``); a stall raises TransferTooSlow."""
        return self._range(key, start, end, None, None)

    def _range(
        self,
        key: str,
        start: int,
        end: int | None,
        if_match: str | None,
        guard: TransferGuard | None,
    ) -> Iterator[bytes]:
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self._key(key)}
        if start or end is not None:
            args["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        if if_match is not None:
            args["IfMatch"] = if_match
        try:
            resp = self.client.get_object(**args)
            # A server or proxy that ignores Range sends the whole object: skip to `start`.
            skip = start if start and not resp.get("ContentRange") else 0
            left = None if end is None else end - start
            chunks = self._chunks(resp, key, guard)
            with closing(chunks):
                for chunk in chunks:
                    if skip:
                        dropped = min(skip, len(chunk))
                        chunk, skip = chunk[dropped:], skip - dropped
                    if left is not None:
                        chunk = chunk[:left]
                        left -= len(chunk)
                    if chunk:
                        yield chunk
                    if left == 0:
                        return
        except (bce.BotoCoreError, bce.ClientError) as exc:
            self._raise(exc, key, f"reading (from byte {start})")

    def write(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        sha256 = sha256_bytes(data)
        write_id = uuid.uuid4().hex
        args: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._key(key),
            "Body": data,
            "Metadata": {SHA256_META: sha256, WRITE_ID_META: write_id},
        }
        if if_match is not None:
            args["IfMatch"] = if_match
        if if_none_match:
            args["IfNoneMatch"] = "*"
        try:
            return str(self.client.put_object(**args)["ETag"])
        except bce.ClientError as exc:
            status, code = _status(exc), _code(exc)
            if status == 412:
                return self._after_412(key, sha256, write_id, exc)
            if status == 409:
                raise PreconditionFailed(
                    f"{self._where(key)}: a concurrent conditional write conflicted ({code})"
                ) from exc
            if if_match is not None and code == "NoSuchKey":
                raise PreconditionFailed(
                    f"{self._where(key)} no longer exists (it was deleted since it was read)"
                ) from exc
            self._raise(exc, key, "writing")
        except bce.BotoCoreError as exc:
            self._raise(exc, key, "writing")

    def _after_412(self, key: str, sha256: str, write_id: str, exc: bce.ClientError) -> str:
        """A 412 may answer the retry of a PUT that already succeeded: read back and see."""
        got = self._get(key)
        if got is not None and got != UNCHANGED:
            current, meta = got
            if meta.get(WRITE_ID_META) == write_id and sha256_bytes(current.data) == sha256:
                return current.etag
        raise PreconditionFailed(
            f"{self._where(key)} changed since it was read (or already exists)"
        ) from exc

    def size(self, key: str) -> int | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
            return int(head["ContentLength"])
        except bce.ClientError as exc:
            if _code(exc) in MISSING_CODES:
                return None
            self._raise(exc, key, "checking")
        except bce.BotoCoreError as exc:
            self._raise(exc, key, "checking")

    def upload(self, key: str, path: Path, sha256: str) -> None:
        """boto3's transfer manager (multipart above the threshold), under the transfer
        limits. It runs in a thread of its own while this one watches its progress
        callback: a send that blocks (a link that stopped) never calls back, so the
        watchdog times it. Once the guard trips, the caller gets its error at once and
        the upload stops at its next read of the file (every retry too); an upload a
        killed run leaves unfinished is aborted by ``clean_up_incomplete``."""
        guard = TransferGuard(f"upload of {key}", self.uri, self._limits)
        outcome: list[BaseException] = []

        def run() -> None:
            try:
                self.uploader.upload_file(
                    str(path),
                    self.bucket,
                    self._key(key),
                    ExtraArgs={"Metadata": {SHA256_META: sha256}},
                    Config=self._transfer,
                    Callback=guard.add,
                )
            except BaseException as exc:
                outcome.append(exc)

        worker = threading.Thread(
            target=contextvars.copy_context().run, args=(run,), name=f"upload {key}", daemon=True
        )
        worker.start()
        poll = min(1.0, self._limits.stall_timeout / 4, self._limits.rate_window / 4)
        try:
            while worker.is_alive():
                worker.join(poll)
                if worker.is_alive():
                    guard.check()
        except BaseException as exc:
            guard.cancel(TransferTooSlow(f"upload of {key} cancelled ({type(exc).__name__})"))
            raise
        if not outcome:
            return
        if guard.failure is not None:
            raise guard.failure from None
        error = outcome[0]
        if isinstance(error, (bce.BotoCoreError, bce.ClientError, S3UploadFailedError)):
            self._raise(error, key, f"uploading {path} to")
        raise error

    def download(self, key: str, dest: Path) -> None:
        """Copy the object to ``dest`` atomically, under the transfer limits: in one GET,
        or above the multipart threshold in ranged GETs of the multipart chunk size,
        ``max_concurrency`` at a time, all of the version the first answer named."""
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except bce.ClientError as exc:
            if _code(exc) in MISSING_CODES:
                raise StoreError(f"{self._where(key)} does not exist") from None
            self._raise(exc, key, "downloading")
        except bce.BotoCoreError as exc:
            self._raise(exc, key, "downloading")
        size, etag = int(head["ContentLength"]), str(head["ETag"])
        step = self._transfer.multipart_chunksize
        if size <= self._transfer.multipart_threshold:
            step = max(size, 1)
        parts = [(start, min(start + step, size)) for start in range(0, size, step)]
        guard = TransferGuard(f"download of {key}", self.uri, self._limits)
        stop = threading.Event()
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")

        def fetch(start: int, end: int) -> None:
            offset = start
            for chunk in self._range(key, start, end, etag, guard):
                if stop.is_set():
                    return
                view = memoryview(chunk)
                while view:
                    written = os.pwrite(fd, view, offset)
                    view, offset = view[written:], offset + written
            if offset != end:
                raise TransientStoreError(
                    f"downloading {self._where(key)}: bytes {start}-{end} ended at {offset}"
                )

        try:
            try:
                with ThreadPoolExecutor(min(len(parts), self._concurrency) or 1) as pool:
                    fetches = [pool.submit(fetch, start, end) for start, end in parts]
                    for done in fetches:
                        try:
                            done.result()
                        except BaseException:
                            stop.set()
                            raise
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def list_keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        root = f"{self.prefix}/" if self.prefix else ""
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=root + check_prefix(prefix)
            )
            for page in pages:
                keys.extend(item["Key"][len(root) :] for item in page.get("Contents", []))
        except (bce.BotoCoreError, bce.ClientError) as exc:
            self._raise(exc, prefix, "listing")
        # folder markers (keys ending in "/") are not objects a store wrote
        return sorted(key for key in keys if not key.endswith("/") and not is_hidden(key))

    def list_objects(self, prefix: str, *, hidden: bool = False) -> list[StoredObject]:
        found: list[StoredObject] = []
        root = f"{self.prefix}/" if self.prefix else ""
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=root + check_prefix(prefix)
            )
            for page in pages:
                for item in page.get("Contents", []):
                    key = item["Key"][len(root) :]
                    if key.endswith("/") or (is_hidden(key) and not hidden):
                        continue
                    found.append(StoredObject(key, int(item["Size"]), item["LastModified"]))
        except (bce.BotoCoreError, bce.ClientError) as exc:
            self._raise(exc, prefix, "listing")
        return sorted(found, key=lambda o: o.key)

    def incomplete_uploads(self) -> list[StoredObject]:
        """Each with the bytes of its parts so far (one ListParts per upload)."""
        root = f"{self.prefix}/" if self.prefix else ""
        found: list[StoredObject] = []
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=root
            )
            uploads = [upload for page in pages for upload in page.get("Uploads", [])]
        except (bce.BotoCoreError, bce.ClientError) as exc:
            self._raise(exc, "", "listing the incomplete multipart uploads of")
        for upload in uploads:
            key = upload["Key"][len(root) :]
            try:
                parts = self.client.get_paginator("list_parts").paginate(
                    Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                size = sum(int(p["Size"]) for page in parts for p in page.get("Parts", []))
            except (bce.BotoCoreError, bce.ClientError) as exc:
                if isinstance(exc, bce.ClientError) and _code(exc) == "NoSuchUpload":
                    continue  # completed or aborted since it was listed
                self._raise(exc, key, "listing the parts of the multipart upload of")
            found.append(StoredObject(key, size, upload["Initiated"]))
        return sorted(found, key=lambda o: (o.key, o.modified))

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (bce.BotoCoreError, bce.ClientError) as exc:
            if not isinstance(exc, bce.ClientError) or _code(exc) not in MISSING_CODES:
                self._raise(exc, key, "deleting")

    def clean_up_incomplete(self, older_than: float | None = None) -> list[str]:
        """Abort the incomplete multipart uploads under the store's prefix started more than
        ``older_than`` seconds ago (default ``EPFLEET_MULTIPART_GRACE``, a day): a killed
        upload leaves its parts stored, and billed, until someone does. Younger ones may
        be a concurrent run's, still going. The bucket's ``AbortIncompleteMultipartUpload``
        lifecycle rule is the operator's backstop (README)."""
        if older_than is None:
            from epfleet.settings import settings

            older_than = settings().multipart_grace
        cutoff = datetime.now(timezone.utc) - timedelta(seconds=older_than)
        root = f"{self.prefix}/" if self.prefix else ""
        aborted: list[str] = []
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=root
            )
            stale = [
                upload
                for page in pages
                for upload in page.get("Uploads", [])
                if upload["Initiated"] <= cutoff
            ]
        except (bce.BotoCoreError, bce.ClientError) as exc:
            logger.warning("%s: cannot list incomplete multipart uploads: %s", self.uri, exc)
            return aborted
        for upload in stale:
            try:
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
            except (bce.BotoCoreError, bce.ClientError) as exc:
                if not isinstance(exc, bce.ClientError) or _code(exc) != "NoSuchUpload":
                    logger.warning(
                        "%s: cannot abort the multipart upload of %s: %s",
                        self.uri,
                        upload["Key"],
                        exc,
                    )
                continue
            aborted.append(upload["Key"][len(root) :])
        if aborted:
            logger.info(
                "%s: aborted %d incomplete multipart upload(s) older than %g s: %s",
                self.uri,
                len(aborted),
                older_than,
                ", ".join(aborted),
            )
        return aborted


_clients: dict[tuple[object, ...], S3Client] = {}
_clients_lock = threading.Lock()
_CLIENT_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_REGION",
    "AWS_REGION",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
)
MAX_SHARED_CLIENTS = 8  # rotating session tokens must not grow the cache without bound


def _shared_client(settings: tuple[int, float, float]) -> S3Client:
    """The client for (attempts, connect timeout, read timeout) in this AWS environment."""
    key = (tuple(os.environ.get(name) for name in _CLIENT_ENV), settings)
    attempts, connect_timeout, read_timeout = settings
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            if len(_clients) >= MAX_SHARED_CLIENTS:
                _clients.clear()
            config = Config(
                retries={"mode": "standard", "max_attempts": attempts},
                connect_timeout=connect_timeout,
                read_timeout=read_timeout,
                # one shared client serves threaded reads (runtime-watch reads 16 reports
                # at a time, a download 4 segments): botocore's default keeps 10 connections
                max_pool_connections=32,
            )
            session = boto3.session.Session()
            region = session.region_name or DEFAULT_REGION
            client = _clients[key] = session.client("s3", region_name=region, config=config)
        return client


def _env_attempts() -> int:
    """AWS_MAX_ATTEMPTS, as boto3 reads it, else 5 (a device on a flaky link may want fewer)."""
    value = os.environ.get("AWS_MAX_ATTEMPTS", "")
    if not value.isdigit() or int(value) < 1:
        return DEFAULT_MAX_ATTEMPTS
    return int(value)


def from_uri(uri: str) -> S3Store:
    """The backend table's entry point: ``s3://bucket`` or ``s3://bucket/prefix``."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise BadInputError(f"store URI {uri!r} names no bucket; write s3://bucket/prefix")
    return S3Store(parsed.netloc, parsed.path)
