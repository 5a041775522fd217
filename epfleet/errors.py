"""Errors epfleet raises on purpose, each with a message that names the offending input.

Every error a user or a report may see is here, in one tree::

    EpfleetError                    exit 1 on the command line, unless a BadInputError
    ├── BadInputError               exit 2: the input (spec, URI, option) is wrong;
    │   │                           nothing was compiled or published
    │   ├── MissingExtraError       an extra's pip package (an EP's, S3's, the
    │   │                           compile host's) is not installed (also
    │   │                           eps.base.MissingExtraError; epfleet.extras)
    │   └── StoreMissing            the store itself is not there (also a StoreError)
    ├── CompileError                compiling one model for one target failed
    │   ├── NoDeviceError           the EP enumerates no device on this worker (also
    │   │                           eps.base.NoDeviceError)
    │   └── RejectedBuild           compiled, then refused by its checks (coverage,
    │                               verification): carries its failed entry
    ├── HealthCheckError            a variant did not load or run on its EP here
    ├── WorkerError                 a worker process did not answer a call
    │   ├── WorkerCrashed           it died in native code, named by what it was doing
    │   ├── WorkerDied              it died (the worker pool's own error, before it is
    │   │                           named: WorkerCrashed, a failed verification)
    │   ├── WorkerTimeout           it ran past the call's time limit and was killed
    │   └── TimeLimitExceeded       the same, named by what it was doing
    ├── MetadataRefused             the store's signed metadata did not verify
    ├── DeviceCacheError            the device cache cannot be used as it is
    │   ├── CacheBusy               another sync holds it
    │   ├── CacheDamaged            something in it is in the way, and stays
    │   ├── CacheNotWritable        a path in it cannot be written
    │   └── DiskFull                no room for a download or a write
    └── StoreError                  a store operation failed; retrying will not help
        ├── ObjectMissing           no object at the key read (S3's 404)
        ├── PreconditionFailed      a conditional write lost a race
        ├── IntegrityError          bytes do not match their sha256 or size
        ├── DocumentTooLarge        a document is over its size limit; not read whole
        ├── TrustLost               a store known to be signed lost its signed metadata
        ├── Unverified              a file of its signed metadata does not verify
        └── TransientStoreError     it may go away (network, throttling, 5xx)
            ├── StoreUnreachable    the signed metadata could not be refreshed
            ├── TransferTooSlow     a transfer stalled or fell below the minimum rate
            └── DeadlineExceeded    the device sync's deadline stopped a store read or
                                    write in flight

``DeadlineExceeded`` is raised inside store reads and writes (each checks the sync's
deadline), so every caller that gives up on a store read for now (the manifest fetch
falling back to the cached manifest, the TUF fetcher, a resumable download) gives up
on it the same way; the next sync starts with a fresh deadline.

The EP modules (``eps``) raise their own errors, ``eps.base.MissingExtraError`` and
``eps.base.NoDeviceError``; ``ep_errors()`` turns them into the subclasses above where
an EP call's error leaves for the user or the report (planning, the compile worker, the
health check), so that a missing package is bad input and a missing device fails the
pair alone. Exceptions that never leave their module, or that another library's API
requires (python-tuf's fetcher and updater errors, botocore's, YAML's, ``ValueError``
and ``OSError`` subclasses of the pure rules and the file helpers), stay where they
are raised.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from eps import base as eps_base

if TYPE_CHECKING:
    from epfleet.formats.manifest import VariantEntry


class EpfleetError(Exception):
    """Base class for errors epfleet reports to users."""


class BadInputError(EpfleetError):
    """The user's input (spec, URI, option) is wrong; nothing was compiled or published."""


class MissingExtraError(BadInputError, eps_base.MissingExtraError):
    """A pip package of an extra is not installed: an execution provider's, or a part of
    epfleet's that the device install leaves out (``epfleet.extras``)."""


# --- compiling and running variants ---------------------------------------------------


class CompileError(EpfleetError):
    """Compiling one model for one target failed."""


class NoDeviceError(CompileError, eps_base.NoDeviceError):
    """The EP is installed but enumerates no device on this worker."""


class RejectedBuild(CompileError):
    """A compiled variant refused by its checks (coverage floor, verification): its failed
    entry, with what was measured, and the compile's seconds."""

    def __init__(self, entry: VariantEntry, seconds: float) -> None:
        super().__init__(entry.error)
        self.entry, self.seconds = entry, seconds

    def __reduce__(self) -> tuple[object, ...]:  # crosses processes (Dask) intact
        return (RejectedBuild, (self.entry, self.seconds))


class HealthCheckError(EpfleetError):
    """A variant did not load or run on its EP here."""


class WorkerError(EpfleetError):
    """A call into a worker process got no answer: the worker died or was killed."""


class WorkerCrashed(WorkerError):
    """A worker process died in native code (a compile or a health check)."""


class WorkerDied(WorkerError):
    """The worker process died during the call (native crash, abort, OOM kill)."""


class WorkerTimeout(WorkerError):
    """The call ran past its time limit; its worker was killed."""


class TimeLimitExceeded(WorkerError):
    """A call into a worker ran past its time limit; the worker was killed (the next call
    gets a new one)."""

    def __init__(self, doing: str, seconds: float) -> None:
        super().__init__(f"{doing} ran past its time limit of {seconds:g} s; its worker was killed")
        self.doing, self.seconds = doing, seconds

    def __reduce__(self) -> tuple[object, ...]:
        return (TimeLimitExceeded, (self.doing, self.seconds))


# --- signed metadata and the device cache ------------------------------------------------


class MetadataRefused(EpfleetError):
    """The store's signed metadata did not verify; nothing from it is in force."""


class DeviceCacheError(EpfleetError):
    """The device cache cannot be used as it is; what is active in it stays active."""


class CacheBusy(DeviceCacheError):
    """Another sync holds the cache."""


class CacheDamaged(DeviceCacheError):
    """Something in the cache is in the way and epfleet will not remove it."""


class CacheNotWritable(DeviceCacheError):
    """A path in the cache cannot be written (a read-only file system, or permissions):
    nothing there changes, and what is active stays active."""


class DiskFull(DeviceCacheError):
    """Not enough free disk space for a download or a write; the next sync tries again."""


# --- stores ----------------------------------------------------------------------------


class StoreError(EpfleetError):
    """A store operation failed for a reason that retrying will not fix."""


class StoreMissing(BadInputError, StoreError):
    """The store itself is not there (a bucket that does not exist): the store URI is
    wrong, whichever command and step met it first (one wording, exit 2)."""


class ObjectMissing(StoreError):
    """The store has no object at the key asked for: the answer to the read itself (S3's
    404), so that no second request is needed to tell a missing object from a failure."""


class PreconditionFailed(StoreError):
    """A conditional write lost a race: the object changed since it was read."""


class IntegrityError(StoreError):
    """Downloaded or stored bytes do not match the expected sha256 or size."""


class DocumentTooLarge(StoreError):
    """A document in the store is larger than its limit; it was not read whole. ``etag``
    is the version it was found at, when known, so that a caller can tell the same body
    again without reading it (``read_if_changed``)."""

    def __init__(self, message: str, *, key: str, limit: int, etag: str | None) -> None:
        super().__init__(message)
        self.key, self.limit, self.etag = key, limit, etag

    def __reduce__(self) -> tuple[object, ...]:  # picklable with its fields
        return (_document_too_large, (str(self), self.key, self.limit, self.etag))


def _document_too_large(message: str, key: str, limit: int, etag: str | None) -> DocumentTooLarge:
    return DocumentTooLarge(message, key=key, limit=limit, etag=etag)


class TrustLost(StoreError):
    """A store known to be signed has lost its signed metadata, or holds another or an
    older one: nothing is read from it nor published to it."""


class Unverified(StoreError):
    """A file of the store's signed metadata does not verify: tampered or damaged."""


class TransientStoreError(StoreError):
    """A store operation failed for a reason that may go away (network, throttling, 5xx)."""


class StoreUnreachable(TransientStoreError):
    """The store could not be reached to refresh its signed metadata."""


class TransferTooSlow(TransientStoreError):
    """A transfer stalled or moved less than the minimum rate; it was aborted (a resumable
    download keeps what it has for the next sync)."""


class DeadlineExceeded(TransientStoreError):
    """The sync ran past its deadline; what was in flight was stopped. Transient: the next
    sync starts with a fresh deadline."""


@contextmanager
def ep_errors() -> Iterator[None]:
    """Run calls into an EP module, raising its errors as epfleet's, message unchanged."""
    try:
        yield
    except eps_base.MissingExtraError as exc:
        raise MissingExtraError(str(exc)) from exc
    except eps_base.NoDeviceError as exc:
        raise NoDeviceError(str(exc)) from exc


def summarize(exc: BaseException, limit: int) -> str:
    """An exception's message on one line, cut to ``limit`` characters (native EP errors
    can run to pages)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
