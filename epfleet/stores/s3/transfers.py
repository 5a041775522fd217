"""Large-object transfers of an S3 store: multipart upload and parallel ranged download.

Both run under the transfer limits (``epfleet.limits``): a link that stalls or crawls
ends the transfer with TransferTooSlow. An upload goes through boto3's transfer manager
in a thread of its own, timed by its progress callback; a download fetches ranges of
the one version its first answer named, and appears at its destination atomically.
"""

from __future__ import annotations

import contextvars
import os
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import botocore.exceptions as bce
from boto3.exceptions import S3UploadFailedError

from epfleet.errors import ObjectMissing, TransferTooSlow, TransientStoreError
from epfleet.limits import TransferGuard
from epfleet.stores.caching import cache_control
from epfleet.stores.s3.errors import is_missing

if TYPE_CHECKING:
    from epfleet.stores.s3.store import S3Store

SHA256_META = "sha256"
"""The user-metadata field every object carries its sha256 in (ETags are not hashes)."""


def upload(store: S3Store, key: str, path: Path, sha256: str) -> None:
    """boto3's transfer manager (multipart above the threshold), under the transfer
    limits. It runs in a thread of its own while this one watches its progress
    callback: a send that blocks (a link that stopped) never calls back, so the
    watchdog times it. Once the guard trips, the caller gets its error at once and
    the upload stops at its next read of the file (every retry too); an upload a
    killed run leaves unfinished is aborted by ``clean_up_incomplete``."""
    guard = TransferGuard(f"upload of {key}", store.uri, store.limits)
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            store.uploader.upload_file(
                str(path),
                store.bucket,
                store.object_key(key),
                ExtraArgs={"Metadata": {SHA256_META: sha256}, "CacheControl": cache_control(key)},
                Config=store.transfer_config,
                Callback=guard.add,
            )
        except BaseException as exc:
            outcome.append(exc)

    worker = threading.Thread(
        target=contextvars.copy_context().run, args=(run,), name=f"upload {key}", daemon=True
    )
    worker.start()
    poll = min(1.0, store.limits.stall_timeout / 4, store.limits.rate_window / 4)
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
        store.raise_error(error, key, f"uploading {path} to")
    raise error


def download(store: S3Store, key: str, dest: Path) -> None:
    """Copy the object to ``dest`` atomically, under the transfer limits: in one GET,
    or above the multipart threshold in ranged GETs of the multipart chunk size,
    ``max_concurrency`` at a time, all of the version the first answer named."""
    try:
        head = store.client.head_object(Bucket=store.bucket, Key=store.object_key(key))
    except bce.ClientError as exc:
        if is_missing(exc):
            raise ObjectMissing(f"{store.where(key)} does not exist") from None
        store.raise_error(exc, key, "downloading")
    except bce.BotoCoreError as exc:
        store.raise_error(exc, key, "downloading")
    size, etag = int(head["ContentLength"]), str(head["ETag"])
    step = store.transfer_config.multipart_chunksize
    if size <= store.transfer_config.multipart_threshold:
        step = max(size, 1)
    parts = [(start, min(start + step, size)) for start in range(0, size, step)]
    guard = TransferGuard(f"download of {key}", store.uri, store.limits)
    stop = threading.Event()
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")

    def fetch(start: int, end: int) -> None:
        offset = start
        for chunk in store.range_of(key, start, end, etag, guard):
            if stop.is_set():
                return
            view = memoryview(chunk)
            while view:
                written = os.pwrite(fd, view, offset)
                view, offset = view[written:], offset + written
        if offset != end:
            raise TransientStoreError(
                f"downloading {store.where(key)}: bytes {start}-{end} ended at {offset}"
            )

    try:
        try:
            with ThreadPoolExecutor(min(len(parts), store.concurrency) or 1) as pool:
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
