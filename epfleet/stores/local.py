"""A store in a local directory: the embedded default.

Writes are atomic (temp file, fsync, rename). Conditional writes hold an
exclusive ``flock`` on ``.epfleet.lock`` across compare and swap, so concurrent
publishers on one machine (or on a shared filesystem with working locks)
serialise. The version token is the content's sha256.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO, Literal
from urllib.parse import unquote, urlparse

from epfleet.errors import BadInputError, ObjectMissing, PreconditionFailed, StoreError
from epfleet.fsutil import NO_SPACE, atomic_copy, atomic_file, atomic_write_bytes, no_room
from epfleet.hashing import CHUNK, sha256_bytes
from epfleet.stores.base import (
    UNCHANGED,
    StoredObject,
    Versioned,
    check_key,
    check_prefix,
    is_hidden,
)
from epfleet.stores.documents import OverLimit, document_limit, read_bounded, too_large

LOCK_NAME = ".epfleet.lock"


class LocalStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / LOCK_NAME, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def read(self, key: str) -> Versioned | None:
        found = self._read_document(key, None)
        assert found != UNCHANGED
        return found

    def read_if_changed(self, key: str, etag: str) -> Versioned | Literal["unchanged"] | None:
        return self._read_document(key, etag)

    @contextmanager
    def _open_object(self, key: str) -> Iterator[BinaryIO]:
        """The object's file, open for reading (links are followed): FileNotFoundError when
        it is missing, StoreError when it is anything but a regular file. Opened without
        blocking, then checked: a FIFO planted at a key would hold its reader (a device
        sync, and its cache's lock) until someone wrote to it, a terminal until a key was
        pressed."""
        fd = os.open(self._path(key), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StoreError(f"{self.uri}/{key} is not a regular file; not read")
            os.set_blocking(fd, True)
            yield f

    def _read_document(self, key: str, etag: str | None) -> Versioned | Literal["unchanged"] | None:
        """The document at ``key`` within its limit (``document_limit``), or UNCHANGED when
        its sha256 is ``etag``. A file over the limit is never held: its size says so before
        a byte is read (and it is hashed in chunks, for its version), and a file that grows
        while read is cut off at the limit."""
        where = f"{self.uri}/{key}"
        limit, _ = document_limit(key)
        with self._os_errors("reading", key):
            try:
                with self._open_object(key) as f:
                    info = os.fstat(f.fileno())
                    if info.st_size > limit:
                        digest = _sha256_stream(f)
                        if digest == etag:
                            return UNCHANGED
                        raise too_large(where, key, info.st_size, digest)
                    try:
                        data = read_bounded(iter(lambda: f.read(CHUNK), b""), limit)
                    except OverLimit:
                        raise too_large(where, key, None, None) from None
            except FileNotFoundError:
                return None
        digest = sha256_bytes(data)
        return UNCHANGED if digest == etag else Versioned(data, digest)

    def read_range(self, key: str, start: int, end: int | None = None) -> Iterator[bytes]:
        path = self._path(key)
        if not path.exists():
            raise ObjectMissing(f"{self.uri}/{key} does not exist")
        with self._os_errors("reading", key), self._open_object(key) as f:
            f.seek(start)
            left = None if end is None else end - start
            while left is None or left > 0:
                chunk = f.read(CHUNK if left is None else min(CHUNK, left))
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk

    def write(
        self,
        key: str,
        data: bytes,
        *,
        if_match: str | None = None,
        if_none_match: bool = False,
        content_encoding: str | None = None,
    ) -> str:
        """(A file has no content encoding: the bytes say it, as a gzip stream's magic does.)"""
        with self._os_errors("writing", key):
            return self._write(key, data, if_match, if_none_match)

    def _write(self, key: str, data: bytes, if_match: str | None, if_none_match: bool) -> str:
        path = self._path(key)
        if if_match is None and not if_none_match:
            atomic_write_bytes(path, data)
            return sha256_bytes(data)
        with self._locked():
            current = self.read(key)
            if if_none_match and current is not None:
                raise PreconditionFailed(f"{self.uri}/{key} already exists")
            if if_match is not None and (current is None or current.etag != if_match):
                raise PreconditionFailed(f"{self.uri}/{key} changed since it was read")
            atomic_write_bytes(path, data)
        return sha256_bytes(data)

    def size(self, key: str) -> int | None:
        with self._os_errors("checking", key):
            try:
                return self._path(key).stat().st_size
            except FileNotFoundError:
                return None

    def upload(self, key: str, path: Path, sha256: str) -> None:
        with self._os_errors("uploading to", key):
            atomic_copy(path, self._path(key), sha256)

    def download(self, key: str, dest: Path) -> None:
        src = self._path(key)
        if not src.exists():
            raise ObjectMissing(f"{self.uri}/{key} does not exist")
        with (
            self._os_errors("downloading", key),
            self._open_object(key) as inp,
            atomic_file(dest) as out,
        ):
            shutil.copyfileobj(inp, out, CHUNK)

    def list_keys(self, prefix: str) -> list[str]:
        folder = self.root / check_prefix(prefix)
        with self._os_errors("listing", prefix):
            if not folder.is_dir():
                return []
            keys = (p.relative_to(self.root).as_posix() for p in folder.rglob("*") if p.is_file())
            return sorted(key for key in keys if not is_hidden(key))

    def list_objects(self, prefix: str, *, hidden: bool = False) -> list[StoredObject]:
        return sorted(self.iter_objects(prefix, hidden=hidden), key=lambda o: o.key)

    def iter_objects(self, prefix: str, *, hidden: bool = False) -> Iterator[StoredObject]:
        folder = self.root / check_prefix(prefix)
        with self._os_errors("listing", prefix):
            if not folder.is_dir():
                return
            start = len(os.fspath(self.root)) + 1
            pending = [os.fspath(folder)]
            while pending:  # os.scandir: one stat a file, none for a directory's entries
                try:
                    with os.scandir(pending.pop()) as entries:
                        for entry in entries:
                            if not hidden and entry.name.startswith("."):
                                continue  # a temporary or lock file, or under one
                            if entry.is_dir(follow_symlinks=False):
                                pending.append(entry.path)
                                continue
                            key = entry.path[start:]
                            if key == LOCK_NAME:
                                continue
                            try:
                                info = entry.stat(follow_symlinks=False)
                            except FileNotFoundError:  # removed while listed
                                continue
                            if stat.S_ISREG(info.st_mode):
                                modified = datetime.fromtimestamp(info.st_mtime, timezone.utc)
                                yield StoredObject(key, info.st_size, modified)
                except FileNotFoundError:  # a directory removed while listed
                    continue

    def incomplete_uploads(self) -> list[StoredObject]:
        """None: a local store's writes are a temporary file renamed into place (its
        leftovers are listed by ``list_objects(..., hidden=True)``)."""
        return []

    def delete(self, key: str) -> None:
        with self._os_errors("deleting", key):
            self._path(key).unlink(missing_ok=True)

    def touch(self, key: str, min_age: float = 0.0) -> bool:
        with self._os_errors("touching", key), self._locked():
            try:
                if time.time() - self._path(key).stat().st_mtime >= min_age:
                    os.utime(self._path(key))
            except FileNotFoundError:
                return False
            return True

    def delete_if_older(self, key: str, cutoff: datetime) -> bool:
        path = self._path(key)
        with self._os_errors("deleting", key), self._locked():
            try:
                modified = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc)
            except FileNotFoundError:
                return True
            if modified >= cutoff:
                return False
            path.unlink(missing_ok=True)
            return True

    def clean_up_incomplete(self, older_than: float | None = None) -> list[str]:
        """A local store has no multipart uploads: its writes are a temporary file renamed
        into place (``epfleet.fsutil``)."""
        return []

    @contextmanager
    def _os_errors(self, action: str, key: str) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            if exc.errno in NO_SPACE:
                raise StoreError(f"{action} {self.uri}/{key}: {no_room(exc, self._disk)}") from exc
            raise StoreError(
                f"{action} {self.uri}/{key}: {exc.strerror or exc} "
                f"({exc.filename or self.root}); check the store directory and its permissions"
            ) from exc

    @property
    def _disk(self) -> dict[str, Path]:
        return {"the store": self.root}


def _sha256_stream(f: BinaryIO) -> str:
    digest = hashlib.sha256()
    while chunk := f.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


def local_path(uri: str) -> Path:
    """The path a ``file://`` URI or plain path names (``file://localhost/x`` included)."""
    if not uri.startswith("file://"):
        return Path(uri).expanduser()
    parsed = urlparse(uri)
    if parsed.netloc not in ("", "localhost"):
        raise BadInputError(f"{uri!r}: file:// URIs must be local (file:///abs/path)")
    return Path(unquote(parsed.path))


def from_uri(uri: str) -> LocalStore:
    root = Path(os.path.abspath(local_path(uri)))
    if root.exists() and not root.is_dir():
        raise BadInputError(f"store {uri!r} is a file, not a directory")
    for parent in root.parents:  # the first that exists must be a directory to hold it
        if parent.exists():
            if not parent.is_dir():
                raise BadInputError(f"store {uri!r}: {parent} is a file, not a directory")
            break
    return LocalStore(root)
