"""The one small interface every store backend implements (its keys, objects and methods)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal, Protocol

MANIFEST_KEY = "manifest.json"
DEFAULT_STORE = "./epfleet-store"
"""The store a run publishes to, and a device syncs from, when none is given."""
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
        where they stopped. ObjectMissing (a StoreError) when there is no such object: the
        read's own answer, so that nobody asks again to tell missing from failing."""
        ...

    def write(
        self,
        key: str,
        data: bytes,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        content_encoding: str | None = None,
    ) -> str:
        """Write atomically and return the new version. With ``if_match`` the write happens
        only if the object is still at that version, with ``if_none_match`` only if there
        is no object yet; otherwise PreconditionFailed, and nothing is written.
        ``content_encoding`` (``gzip``) says how ``data`` is encoded, for other HTTP
        clients of the store (S3's ``Content-Encoding``); ``read`` returns ``data`` as
        written, still encoded."""
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
        but never the store's lock file. For the garbage collector (``epfleet.lifecycle.gc``)."""
        ...

    def touch(self, key: str, min_age: float = 0.0) -> bool:
        """Mark the object as just used (its modification time becomes now, content
        unchanged) so that ``epfleet gc`` does not collect it, unless it was modified less
        than ``min_age`` seconds ago; False when it is missing. A publish touches every
        stored object it newly references."""
        ...

    def delete_if_older(self, key: str, cutoff: datetime) -> bool:
        """Delete the object only if it was last modified before ``cutoff``; True when it
        is gone (or was missing), False when it is newer (touched since gc planned). The
        local store does the check and the removal under its lock, so no ``touch``
        falls between them; on S3 they are a HEAD and a DELETE."""
        ...

    def iter_objects(self, prefix: str, *, hidden: bool = False) -> Iterator[StoredObject]:
        """``list_objects``' objects in no particular order, as the listing arrives (a page
        of up to 1,000 at a time from S3): for listings too large to hold, such as a large
        fleet's device reports."""
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


def bulk_reader(store: Store) -> Callable[[str], Versioned | None]:
    """How to read many small documents of ``store``: its type's ``bulk_read`` when it has
    one (S3: signed and sent without botocore's per-request machinery), else ``read``. The
    type's, not the object's: a wrapper that reads its own way keeps its ``read``."""
    method = getattr(type(store), "bulk_read", None)
    if method is None:
        return store.read
    return functools.partial(method, store)


def within_range(chunks: Iterable[bytes], skip: int, left: int | None) -> Iterator[bytes]:
    """The bytes of ``chunks`` past the first ``skip`` and no more than ``left`` of them (all
    when None): a ranged read from an answer that may hold the whole object (a server or
    mirror that ignores Range sends it from byte 0)."""
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
