"""The one small interface every store backend implements, and the size limit of the
documents a store reads whole."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol

from epfleet.errors import StoreError
from epfleet.limits import format_size

MANIFEST_KEY = "manifest.json"
UNCHANGED: Literal["unchanged"] = "unchanged"


@dataclass(frozen=True)
class Versioned:
    """An object's bytes and the opaque version token a conditional write compares."""

    data: bytes
    etag: str


@dataclass(frozen=True)
class StoredObject:
    """One object as a listing sees it: its key, size, and when it was last written (UTC).
    For an incomplete multipart upload: the key it was meant for, the bytes of the parts
    uploaded so far, and when it was started."""

    key: str
    size: int
    modified: datetime


class Store(Protocol):
    uri: str
    """Where the store's root is, as the user wrote it (``file:///dir``, ``s3://bucket/prefix``)."""

    def read(self, key: str) -> Versioned | None:
        """The object's bytes and version, or None when there is no such object. For
        documents (a manifest, a report, a hand-over file): ``DocumentTooLarge`` when it is
        over ``document_limit(key)``, found while streaming, before it is held whole."""
        ...

    def read_if_changed(self, key: str, etag: str) -> Versioned | Literal["unchanged"] | None:
        """Like ``read``, but ``UNCHANGED`` (and no body transferred) when the object is
        still at version ``etag``: a conditional GET."""
        ...

    def read_range(self, key: str, start: int, end: int | None = None) -> Iterator[bytes]:
        """The object's bytes from offset ``start`` up to ``end`` (exclusive; default its
        end), in chunks: a ranged GET, so downloads run in parallel segments and resume
        where they stopped. StoreError when missing."""
        ...

    def write(
        self, key: str, data: bytes, *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        """Write atomically and return the new version. With ``if_match`` the write happens
        only if the object is still at that version, with ``if_none_match`` only if there
        is no object yet; otherwise PreconditionFailed, and nothing is written."""
        ...

    def size(self, key: str) -> int | None:
        """The object's size in bytes, or None when there is no such object."""
        ...

    def upload(self, key: str, path: Path, sha256: str) -> None:
        """Store a local file under ``key`` atomically (readers never see a partial object)."""
        ...

    def download(self, key: str, dest: Path) -> None:
        """Copy the object to ``dest`` atomically; StoreError when there is no such object."""
        ...

    def list_keys(self, prefix: str) -> list[str]:
        """The keys under ``prefix`` (``""`` or a folder ending in ``/``), sorted, without
        hidden names (a part starting with ``.``); [] when none."""
        ...

    def list_objects(self, prefix: str, *, hidden: bool = False) -> list[StoredObject]:
        """Like ``list_keys``, with each object's size and modification time; with
        ``hidden``, also the hidden names (temporary files of interrupted local writes),
        but never the store's lock file. For the garbage collector (``epfleet.gc``)."""
        ...

    def incomplete_uploads(self) -> list[StoredObject]:
        """The multipart uploads under the store's root that were started and never
        completed nor aborted (what ``clean_up_incomplete`` aborts); [] for a backend
        without them."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object; nothing happens when there is no such object."""
        ...

    def clean_up_incomplete(self, older_than: float | None = None) -> list[str]:
        """Remove what interrupted writes left under the store's root more than
        ``older_than`` seconds ago (default ``EPFLEET_MULTIPART_GRACE``): S3's incomplete
        multipart uploads. Best effort: a failure is logged, never raised. Returns what
        was removed."""
        ...


def check_key(key: str) -> str:
    """Keys are relative POSIX paths that stay inside the store. (String tests, not PurePath:
    a device checks every key of a manifest with thousands of them.)"""
    if not key or key.startswith("/") or "\\" in key or ".." in key.split("/"):
        raise ValueError(f"store key {key!r} must be a relative POSIX path inside the store")
    return key


def check_prefix(prefix: str) -> str:
    """A listing prefix is the whole store (``""``) or a folder (``reports/devices/``)."""
    if prefix and not prefix.endswith("/"):
        raise ValueError(f"list prefix {prefix!r} must be empty or end with '/'")
    return check_key(prefix) if prefix else prefix


def is_hidden(key: str) -> bool:
    """Temporary and lock files of the local backend; never listed by either backend."""
    return any(part.startswith(".") for part in key.split("/"))


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


def document_limit(key: str) -> tuple[int, str]:
    """The largest object ``read`` returns whole for ``key``, and the variable that sets
    it: ``EPFLEET_MAX_MANIFEST_BYTES`` for a manifest, ``EPFLEET_MAX_DOCUMENT_BYTES`` for
    anything else (device reports, hand-over files)."""
    manifest, document = _limits(
        os.environ.get("EPFLEET_MAX_MANIFEST_BYTES"), os.environ.get("EPFLEET_MAX_DOCUMENT_BYTES")
    )
    if key.rsplit("/", 1)[-1] == MANIFEST_KEY:
        return manifest, "EPFLEET_MAX_MANIFEST_BYTES"
    return document, "EPFLEET_MAX_DOCUMENT_BYTES"


@functools.lru_cache(maxsize=8)
def _limits(manifest: str | None, document: str | None) -> tuple[int, int]:
    """The two limits for these values of their variables: building the settings takes
    milliseconds, and a publish of signed metadata reads hundreds of documents."""
    from epfleet.settings import settings  # not at import: settings imports this package

    s = settings()
    return int(s.max_manifest_bytes), int(s.max_document_bytes)


def too_large(where: str, key: str, size: int | None, etag: str | None) -> DocumentTooLarge:
    """The error for ``key`` (at ``where``) over its limit: ``size`` when known (a
    Content-Length, a file's size), else it was found streaming past the limit."""
    limit, variable = document_limit(key)
    kind = "a manifest" if key.rsplit("/", 1)[-1] == MANIFEST_KEY else "a store document"
    held = f"is {format_size(size)}, over" if size is not None else "goes on past"
    return DocumentTooLarge(
        f"{where} {held} the limit of {format_size(limit)} for {kind} ({variable}); not read",
        key=key,
        limit=limit,
        etag=etag,
    )


class OverLimit(Exception):
    """``read_bounded`` found more than its limit (the caller says which document)."""


def read_bounded(chunks: Iterator[bytes], limit: int) -> bytes:
    """The bytes of ``chunks`` when they total at most ``limit``; else ``OverLimit`` as
    soon as they pass it, having held no more than ``limit`` bytes."""
    held: list[bytes] = []
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > limit:
            raise OverLimit
        held.append(chunk)
    return b"".join(held)
