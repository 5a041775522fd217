"""A store in an S3 bucket (or anything that speaks S3): ``s3://bucket/prefix``.

This module holds the store's reads, conditional writes and listings; beside it, in
this package, ``client`` (the shared boto3 clients), ``bounds`` (time bounds on each
request), ``errors`` (boto3 failures as epfleet errors), ``transfers`` (multipart upload,
parallel ranged download), ``multipart`` (incomplete multipart uploads) and ``aging``
(touch, delete if older).

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

import threading
import uuid
from collections.abc import Generator, Iterator
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn
from urllib.parse import urlparse

import botocore.exceptions as bce
import urllib3.exceptions as u3e
from boto3.s3.transfer import TransferConfig

from epfleet.errors import BadInputError, PreconditionFailed, TransientStoreError
from epfleet.hashing import sha256_bytes
from epfleet.limits import TransferGuard, TransferLimits, current_deadline, stalled
from epfleet.stores.base import (
    UNCHANGED,
    StoredObject,
    Versioned,
    check_key,
    check_prefix,
    is_hidden,
    within_range,
)
from epfleet.stores.caching import cache_control
from epfleet.stores.documents import OverLimit, document_limit, read_bounded, too_large
from epfleet.stores.s3 import aging, direct, multipart, transfers
from epfleet.stores.s3.client import env_attempts, shared_client
from epfleet.stores.s3.errors import code_of, is_missing, raise_store_error, status_of
from epfleet.stores.s3.transfers import SHA256_META

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client

MiB = 1 << 20
STREAM_CHUNK = 1 * MiB
WRITE_ID_META = "epfleet-write-id"


class S3Store:
    """The store (``epfleet.stores.base.Store``). Beside the store's methods, the other
    modules of this package use its internal surface, and nothing else of it: ``client``
    and ``uploader`` (the boto3 clients), ``limits``, ``transfer_config`` and
    ``concurrency`` (how transfers run), ``root``, ``object_key`` and ``where`` (an
    object's S3 key and its URI), ``raise_error`` (a boto3 failure as an epfleet error)
    and ``range_of`` (a ranged read of one version under a guard)."""

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
        attempts = max_attempts or env_attempts()
        # The read timeout is how long a socket may wait for a byte, and how long the head
        # of an answer (status line and headers) may take as a whole (``bounds``). For
        # reads (and small writes) it is the stall timeout: a request nobody answers, or
        # answers a byte at a time, and a body that stops all end there. Uploads keep the
        # longer one: once a part is handed to the kernel, the answer waits until its send
        # buffer (megabytes) drains on a slow link; their progress is timed by their
        # callback instead (``upload``). A connect waits no longer than a stall either,
        # except an upload's: urllib3 sends a request's body under the connect timeout, and
        # an upload's callback should be what says its link stalled.
        self.limits = TransferLimits.from_settings()
        stall = self.limits.stall_timeout
        self._settings = (attempts, min(connect_timeout, stall), stall)
        self._upload_settings = (attempts, connect_timeout, max(read_timeout, stall))
        self._client: S3Client | None = None
        self._uploader: S3Client | None = None
        self._client_lock = threading.Lock()
        self._direct: direct.DirectReads | None = None
        self._direct_checked = False
        self._direct_lock = threading.Lock()
        self.concurrency = max_concurrency
        self.transfer_config = TransferConfig(
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
                self._client = shared_client(self._settings)
            return self._client

    @property
    def uploader(self) -> S3Client:
        """The client of ``upload``: the same, with the longer read timeout."""
        with self._client_lock:
            if self._uploader is None:
                self._uploader = shared_client(self._upload_settings)
            return self._uploader

    @property
    def root(self) -> str:
        """The S3 key prefix of the store's objects: its prefix and a slash, or nothing."""
        return f"{self.prefix}/" if self.prefix else ""

    def object_key(self, key: str) -> str:
        """The S3 key of the store's ``key`` (checked)."""
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def where(self, key: str) -> str:
        """The URI of the store's ``key`` for messages (the store's own for "")."""
        if not key:  # the whole store (a listing of its root)
            return f"{self.uri}/"
        return f"s3://{self.bucket}/{self.object_key(key)}"

    def raise_error(self, exc: BaseException, key: str, action: str) -> NoReturn:
        """Turn a boto3/botocore failure into TransientStoreError or StoreError."""
        attempts, _, stall = self._settings
        raise_store_error(
            exc,
            where=self.where(key),
            action=action,
            bucket=self.bucket,
            attempts=attempts,
            stall_timeout=stall,
            store_uri=self.uri,
            endpoint=self.client.meta.endpoint_url,
        )

    def _get(
        self, key: str, if_none_match: str | None = None
    ) -> tuple[Versioned, dict[str, str]] | Literal["unchanged"] | None:
        """A document, read whole within its limit (``document_limit``): refused on its
        Content-Length before a byte of the body is read, or as soon as a body without
        one goes past the limit; and under the transfer limits while it streams."""
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self.object_key(key)}
        if if_none_match is not None:
            args["IfNoneMatch"] = if_none_match
        try:
            resp = self.client.get_object(**args)
        except bce.ClientError as exc:
            if is_missing(exc):
                return None
            if status_of(exc) == 304:
                return UNCHANGED
            self.raise_error(exc, key, "reading")
        except bce.BotoCoreError as exc:
            self.raise_error(exc, key, "reading")
        etag = str(resp["ETag"])
        limit, _ = document_limit(key)
        length = resp.get("ContentLength")
        guard = TransferGuard(f"read of {key}", self.uri, self.limits)
        chunks = self._chunks(resp, key, guard)
        try:
            if length is not None and length > limit:
                raise too_large(self.where(key), key, length, etag)
            data = read_bounded(chunks, limit)
        except OverLimit:
            raise too_large(self.where(key), key, None, etag) from None
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
                f"{what} from {self.where(key)}: the connection dropped ({exc})"
            ) from exc
        finally:
            body.close()
        if length is not None and got < length:  # urllib3 leaves this check to botocore
            raise TransientStoreError(
                f"{what} from {self.where(key)}: the connection dropped after {got} of "
                f"{length} bytes"
            )

    def read(self, key: str) -> Versioned | None:
        got = self._get(key)
        assert got != UNCHANGED
        return None if got is None else got[0]

    def bulk_read(self, key: str) -> Versioned | None:
        """``read``, for a reader of many small documents (the fleet side's reads of device
        reports): signed here and sent on a kept-alive connection, at about a seventh of
        ``get_object``'s client CPU (``epfleet.stores.s3.direct``); through ``get_object``
        when the client goes through an HTTP proxy."""
        reads = self._direct_reads()
        return reads.read(key) if reads is not None else self.read(key)

    def _direct_reads(self) -> direct.DirectReads | None:
        with self._direct_lock:
            if not self._direct_checked:
                self._direct = direct.DirectReads(self) if direct.usable(self) else None
                self._direct_checked = True
            return self._direct

    def read_if_changed(self, key: str, etag: str) -> Versioned | Literal["unchanged"] | None:
        got = self._get(key, if_none_match=etag)
        return got if got is None or got == UNCHANGED else got[0]

    def read_range(self, key: str, start: int, end: int | None = None) -> Iterator[bytes]:
        """The bytes as they arrive (see ``_chunks``): the caller counts them against the
        transfer limits (``epfleet.device.download``); a stall raises TransferTooSlow."""
        return self.range_of(key, start, end, None, None)

    def range_of(
        self,
        key: str,
        start: int,
        end: int | None,
        if_match: str | None,
        guard: TransferGuard | None,
    ) -> Iterator[bytes]:
        """``read_range`` of the version ``if_match`` names (any when None), each chunk
        counted by ``guard`` (``transfers.download`` fetches its parts with it)."""
        args: dict[str, Any] = {"Bucket": self.bucket, "Key": self.object_key(key)}
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
                yield from within_range(chunks, skip, left)
        except (bce.BotoCoreError, bce.ClientError) as exc:
            self.raise_error(exc, key, f"reading (from byte {start})")

    def write(
        self,
        key: str,
        data: bytes,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        content_encoding: str | None = None,
    ) -> str:
        sha256 = sha256_bytes(data)
        write_id = uuid.uuid4().hex
        args: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self.object_key(key),
            "Body": data,
            "Metadata": {SHA256_META: sha256, WRITE_ID_META: write_id},
            "CacheControl": cache_control(key),
        }
        if if_match is not None:
            args["IfMatch"] = if_match
        if if_none_match:
            args["IfNoneMatch"] = "*"
        if content_encoding is not None:
            args["ContentEncoding"] = content_encoding
            if key.endswith(".json"):
                args["ContentType"] = "application/json"
        try:
            return str(self.client.put_object(**args)["ETag"])
        except bce.ClientError as exc:
            status, code = status_of(exc), code_of(exc)
            if status == 412:
                return self._after_412(key, sha256, write_id, exc)
            if status == 409:
                raise PreconditionFailed(
                    f"{self.where(key)}: a concurrent conditional write conflicted ({code})"
                ) from exc
            if if_match is not None and code == "NoSuchKey":
                raise PreconditionFailed(
                    f"{self.where(key)} no longer exists (it was deleted since it was read)"
                ) from exc
            self.raise_error(exc, key, "writing")
        except bce.BotoCoreError as exc:
            self.raise_error(exc, key, "writing")

    def _after_412(self, key: str, sha256: str, write_id: str, exc: bce.ClientError) -> str:
        """A 412 may answer the retry of a PUT that already succeeded: read back and see."""
        got = self._get(key)
        if got is not None and got != UNCHANGED:
            current, meta = got
            if meta.get(WRITE_ID_META) == write_id and sha256_bytes(current.data) == sha256:
                return current.etag
        raise PreconditionFailed(
            f"{self.where(key)} changed since it was read (or already exists)"
        ) from exc

    def size(self, key: str) -> int | None:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.object_key(key))
            return int(head["ContentLength"])
        except bce.ClientError as exc:
            if is_missing(exc):
                return None
            self.raise_error(exc, key, "checking")
        except bce.BotoCoreError as exc:
            self.raise_error(exc, key, "checking")

    def upload(self, key: str, path: Path, sha256: str) -> None:
        transfers.upload(self, key, path, sha256)

    def download(self, key: str, dest: Path) -> None:
        transfers.download(self, key, dest)

    def list_keys(self, prefix: str) -> list[str]:
        root = len(self.root)
        keys = (key[root:] for key, _, _ in self._listing(prefix))
        # folder markers (keys ending in "/") are not objects a store wrote
        return sorted(key for key in keys if not key.endswith("/") and not is_hidden(key))

    def _listing(self, prefix: str) -> Iterator[tuple[str, int, datetime]]:
        """The S3 key, size and last modification of each object under the store's
        ``prefix``: through ``direct`` (a third of botocore's client CPU a page) unless the
        client goes through an HTTP proxy, S3 answers what only botocore reads, or a device
        sync's deadline runs (``bounds`` holds each of botocore's attempts to it)."""
        full = self.root + check_prefix(prefix)
        reads = self._direct_reads() if current_deadline() is None else None
        if reads is not None:
            try:
                yield from reads.listing(full)
                return
            except direct.Fallback:
                pass  # before the first page: nothing was yielded
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            )
            for page in pages:
                for item in page.get("Contents", []):
                    yield item["Key"], int(item["Size"]), item["LastModified"]
        except (bce.BotoCoreError, bce.ClientError) as exc:
            self.raise_error(exc, prefix, "listing")

    def list_objects(self, prefix: str, *, hidden: bool = False) -> list[StoredObject]:
        return sorted(self.iter_objects(prefix, hidden=hidden), key=lambda o: o.key)

    def iter_objects(self, prefix: str, *, hidden: bool = False) -> Iterator[StoredObject]:
        root = len(self.root)
        for full, size, modified in self._listing(prefix):
            key = full[root:]
            if key.endswith("/") or (is_hidden(key) and not hidden):
                continue
            yield StoredObject(key, size, modified)

    def incomplete_uploads(self) -> list[StoredObject]:
        return multipart.incomplete_uploads(self)

    def delete(self, key: str) -> None:
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self.object_key(key))
        except (bce.BotoCoreError, bce.ClientError) as exc:
            if not is_missing(exc):
                self.raise_error(exc, key, "deleting")

    def touch(self, key: str, min_age: float = 0.0) -> bool:
        return aging.touch(self, key, min_age)

    def delete_if_older(self, key: str, cutoff: datetime) -> bool:
        return aging.delete_if_older(self, key, cutoff)

    def clean_up_incomplete(self, older_than: float | None = None) -> list[str]:
        return multipart.clean_up_incomplete(self, older_than)


def from_uri(uri: str) -> S3Store:
    """The backend table's entry point: ``s3://bucket`` or ``s3://bucket/prefix``."""
    parsed = urlparse(uri)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise BadInputError(f"store URI {uri!r} names no bucket; write s3://bucket/prefix")
    return S3Store(parsed.netloc, parsed.path)
