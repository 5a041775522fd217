"""The device cache's lock: one sync at a time, and who holds it when a second is refused.

The lock is an ``flock`` on ``.epfleet/lock``: the kernel releases it when its holder
exits or is killed (worker processes are spawned, so none inherits it), and the next
sync takes it over. The holder writes its pid, host and start time into the file so
that a refused sync can say who holds it. A link, directory or device in the lock's
place is removed first (``CacheFiles.clear``).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from datetime import datetime

from epfleet.device.cache.layout import LOCK_FILE, STATE_DIR
from epfleet.device.cache.nofollow import CacheFiles, lstat_at
from epfleet.disk import WRITE_DENIED, cannot_write
from epfleet.errors import CacheBusy, CacheDamaged, EpfleetError
from epfleet.fsutil import NO_SPACE


@contextmanager
def cache_locked(files: CacheFiles) -> Iterator[None]:
    """Hold the cache for one sync; a second concurrent sync fails fast (CacheBusy)."""
    path = files.path((STATE_DIR, LOCK_FILE))
    try:
        fd = _lock(files)
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise cannot_write(path, exc) from None
        raise EpfleetError(
            f"cannot lock the cache at {path}: {exc.strerror or exc}; check that the "
            "cache directory is writable by this user"
        ) from None
    try:
        _stamp(fd)
        yield
    finally:
        os.close(fd)  # releases the flock


def _lock(files: CacheFiles) -> int:
    meta = files.open_dir((STATE_DIR,))
    parts = (STATE_DIR, LOCK_FILE)
    try:
        for _ in range(5):
            found = lstat_at(meta, LOCK_FILE)
            if found is not None and not stat.S_ISREG(found.st_mode):
                files.clear(meta, parts, "a lock file")
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            try:
                fd = os.open(LOCK_FILE, flags, 0o666, dir_fd=meta)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                    continue  # replaced since the lstat: look again
                if exc.errno not in WRITE_DENIED or found is None:
                    raise
                # A read-only cache: flock works on a file opened for reading, and
                # the sync goes on to report what runs (each write fails by name).
                fd = os.open(LOCK_FILE, flags & ~(os.O_RDWR | os.O_CREAT), dir_fd=meta)
                files.note(
                    f"{files.root} is not writable ({exc.strerror}): nothing in the cache "
                    "can change; the variants active in it stay active"
                )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise CacheBusy(
                    f"another epfleet sync{holder} is using {files.root} (it holds "
                    f"{files.path(parts)}; the lock is released when that sync ends or "
                    "dies)"
                ) from None
            except BaseException:
                os.close(fd)
                raise
            held, now = os.fstat(fd), lstat_at(meta, LOCK_FILE)
            same = now is not None and (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)
            if same and stat.S_ISREG(held.st_mode):
                return fd
            os.close(fd)  # not a regular file, or replaced while we waited: again
    finally:
        os.close(meta)
    raise CacheDamaged(f"{files.path(parts)} keeps changing; is something racing epfleet?")


def _stamp(fd: int) -> None:
    """Write who holds the lock into the lock file (best effort: the lock works without)."""
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time()}
    with suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(holder).encode(), 0)


def _holder(fd: int) -> str:
    """`` (pid N on HOST since HH:MM:SS)`` from a held lock file, or ''."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0))
        since = datetime.fromtimestamp(float(holder["since"])).isoformat(timespec="seconds")
        return f" (pid {int(holder['pid'])} on {holder['host']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""
