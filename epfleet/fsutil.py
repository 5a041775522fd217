"""Atomic file writes: a reader sees the old file or the new one, never a torn one."""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from epfleet.errors import IntegrityError


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Write ``path`` through a temporary file that replaces it only once complete and
    synced; on any error the temporary file is removed and ``path`` is untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)  # the rename itself survives a power cut


def fsync_dir(path: Path) -> None:
    """Make the entries of directory ``path`` (a rename into it, say) durable."""
    directory = os.open(path, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    with atomic_file(path) as f:
        f.write(data)


def atomic_copy(src: Path, dst: Path, sha256: str | None = None) -> None:
    """Copy ``src`` to ``dst`` atomically; with ``sha256``, only if the bytes match it."""
    digest = hashlib.sha256()
    with atomic_file(dst) as out, open(src, "rb") as inp:
        while chunk := inp.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
        if sha256 is not None and digest.hexdigest() != sha256:
            raise IntegrityError(f"{src} has sha256 {digest.hexdigest()}, expected {sha256}")
