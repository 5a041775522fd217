"""The errors a device cache raises: busy, damaged, not writable, disk full."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from epfleet.errors import EpfleetError


class CacheBusy(EpfleetError):
    """Another sync holds the cache."""


class CacheDamaged(EpfleetError):
    """Something in the cache is in the way and epfleet will not remove it."""


class CacheNotWritable(EpfleetError):
    """A path in the cache cannot be written (a read-only file system, or permissions):
    nothing there changes, and what is active stays active."""


WRITE_DENIED = (errno.EROFS, errno.EACCES, errno.EPERM)


def not_writable(path: Path, exc: OSError) -> CacheNotWritable:
    return CacheNotWritable(
        f"cannot write {path}: {exc.strerror or exc}; the device cache must be writable by "
        f"this user (uid {os.getuid()}), or sync into another --cache"
    )


class DiskFull(EpfleetError):
    """Not enough free disk space for a download or a write; the next sync tries again."""
