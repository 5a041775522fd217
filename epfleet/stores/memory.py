"""The in-memory store: ``memory://NAME``, objects held in this process, shared by every
store opened on the same name until ``forget(NAME)``. What fsspec's memory filesystem is
to fsspec: for unit tests of publishing, signing, gc and sync that need a store's
semantics (versions, conditional writes, listings, missing objects) but not its I/O,
and for trying a spec without a directory. Nothing survives the process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal
from urllib.parse import urlparse

from epfleet.errors import BadInputError, ObjectMissing, PreconditionFailed
from epfleet.fsutil import atomic_write_bytes
from epfleet.hashing import sha256_bytes
from epfleet.stores.base import (
    UNCHANGED,
    StoredObject,
    Versioned,
    check_key,
    check_prefix,
    is_hidden,
)
from epfleet.stores.documents import document_limit, too_large


@dataclass
class _Object:
    data: bytes
    etag: str
    modified: datetime


@dataclass
class _Space:
    objects: dict[str, _Object] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_SPACES: dict[str, _Space] = {}
_SPACES_LOCK = threading.Lock()


def forget(name: str) -> None:
    """Drop every object of ``memory://name``."""
    with _SPACES_LOCK:
        _SPACES.pop(name, None)


def _now() -> datetime:
    return datetime.now(timezone.utc)


class MemoryStore:
    def __init__(self, name: str) -> None:
        self.uri = f"memory://{name}"
        with _SPACES_LOCK:
            self._space = _SPACES.setdefault(name, _Space())

    def _get(self, key: str) -> _Object | None:
        with self._space.lock:
            return self._space.objects.get(check_key(key))

    def read(self, key: str) -> Versioned | None:
        found = self._get(key)
        if found is None:
            return None
        limit, _ = document_limit(key)
        if len(found.data) > limit:
            raise too_large(f"{self.uri}/{key}", key, len(found.data), found.etag)
        return Versioned(found.data, found.etag)

    def read_if_changed(self, key: str, etag: str) -> Versioned | Literal["unchanged"] | None:
        found = self._get(key)
        if found is not None and found.etag == etag:
            return UNCHANGED
        return self.read(key)

    def read_range(self, key: str, start: int, end: int | None = None) -> Iterator[bytes]:
        found = self._get(key)
        if found is None:
            raise ObjectMissing(f"{self.uri}/{key} does not exist")
        yield found.data[start:end]

    def write(
        self,
        key: str,
        data: bytes,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        content_encoding: str | None = None,
    ) -> str:
        check_key(key)
        with self._space.lock:
            current = self._space.objects.get(key)
            if if_none_match and current is not None:
                raise PreconditionFailed(f"{self.uri}/{key} exists")
            if if_match is not None and (current is None or current.etag != if_match):
                raise PreconditionFailed(f"{self.uri}/{key} changed since it was read")
            etag = sha256_bytes(data)  # as the local store's: the content's digest
            self._space.objects[key] = _Object(bytes(data), etag, _now())
            return etag

    def size(self, key: str) -> int | None:
        found = self._get(key)
        return None if found is None else len(found.data)

    def upload(self, key: str, path: Path, sha256: str) -> None:
        self.write(key, path.read_bytes())

    def download(self, key: str, dest: Path) -> None:
        found = self._get(key)
        if found is None:
            raise ObjectMissing(f"{self.uri}/{key} does not exist")
        atomic_write_bytes(dest, found.data)

    def iter_objects(self, prefix: str, *, hidden: bool = False) -> Iterator[StoredObject]:
        check_prefix(prefix)
        with self._space.lock:
            listed = [
                StoredObject(key, len(found.data), found.modified)
                for key, found in self._space.objects.items()
                if key.startswith(prefix) and (hidden or not is_hidden(key))
            ]
        yield from listed

    def list_objects(self, prefix: str, *, hidden: bool = False) -> list[StoredObject]:
        return sorted(self.iter_objects(prefix, hidden=hidden), key=lambda o: o.key)

    def list_keys(self, prefix: str) -> list[str]:
        return [found.key for found in self.list_objects(prefix)]

    def touch(self, key: str, min_age: float = 0.0) -> bool:
        with self._space.lock:
            found = self._space.objects.get(check_key(key))
            if found is None:
                return False
            if (_now() - found.modified).total_seconds() >= min_age:
                found.modified = _now()
            return True

    def delete_if_older(self, key: str, cutoff: datetime) -> bool:
        with self._space.lock:
            found = self._space.objects.get(check_key(key))
            if found is not None and found.modified >= cutoff:
                return False
            self._space.objects.pop(key, None)
            return True

    def delete(self, key: str) -> None:
        with self._space.lock:
            self._space.objects.pop(check_key(key), None)

    def incomplete_uploads(self) -> list[StoredObject]:
        return []

    def clean_up_incomplete(self, older_than: float | None = None) -> list[str]:
        return []


def from_uri(uri: str) -> MemoryStore:
    parsed = urlparse(uri)
    name = (parsed.netloc + parsed.path).strip("/")
    if not name:
        raise BadInputError(f"store URI {uri!r} needs a name: memory://NAME")
    return MemoryStore(name)
