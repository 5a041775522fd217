"""Writing where the disk may refuse: a full disk or quota, a read-only or foreign-owned
path, each turned into one clear error (``DiskFull``, ``CacheNotWritable``) naming the path."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from epfleet.errors import CacheNotWritable, DiskFull
from epfleet.fsutil import NO_SPACE, free_space
from epfleet.text import mb

WRITE_DENIED = (errno.EROFS, errno.EACCES, errno.EPERM)


def not_writable(path: Path, exc: OSError) -> CacheNotWritable:
    return CacheNotWritable(
        f"cannot write {path}: {exc.strerror or exc}; the device cache must be writable by "
        f"this user (uid {os.getuid()}), or sync into another --cache"
    )


def cannot_write(path: Path, exc: OSError) -> CacheNotWritable | DiskFull:
    """The error of a failed write in the cache: DiskFull when no room was left (a full
    disk, a quota), CacheNotWritable otherwise (read-only, permissions, an I/O error)."""
    if exc.errno in NO_SPACE:
        return DiskFull(
            f"no disk space to write {path}: {exc.strerror or exc} "
            f"({mb(free_space(path) or 0)} MB free); the next sync tries again"
        )
    if exc.errno in WRITE_DENIED:
        return not_writable(path, exc)
    return CacheNotWritable(f"cannot write {path}: {exc.strerror or exc}")
