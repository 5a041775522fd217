"""Atomic file writes: a reader sees the old file or the new one, never a torn one.

Files are created with mode 0666 less the process umask (0644 under the usual 022), as
``open`` would: an application running as another user can read what epfleet writes.
The temporary file of a write is ``.<name>.<8 random characters>.tmp`` beside the file
(``is_temp_name``), so that a run killed mid-write leaves something the next run can
recognise and remove.

Also here: reading a file without following a symbolic link (``read_nofollow``), the
free space of a filesystem (``free_bytes``), for the device cache, and the one line that
says which disk a write found full (``no_room``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from epfleet.errors import IntegrityError
from epfleet.formats.keys import is_temp_name as is_temp_name  # where it was first defined

_TEMP_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789_"
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""The errnos of a write that found no room (a full disk, a quota, a file size limit)."""


def temp_name(name: str) -> str:
    token = "".join(secrets.choice(_TEMP_ALPHABET) for _ in range(8))
    return f".{name}.{token}.tmp"


def _create_temp(directory: Path, name: str) -> tuple[int, Path]:
    """A new temporary file beside ``name``, mode 0666 less the umask (``mkstemp`` makes
    0600 whatever the umask), never through a symbolic link."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(100):
        tmp = directory / temp_name(name)
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary file name", str(directory))


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """Write ``path`` through a temporary file that replaces it only once complete and
    synced; on any error the temporary file is removed and ``path`` is untouched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _create_temp(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
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


class NotRegularFile(OSError):
    """A path that should be a regular file is a link, a directory or a device."""


@contextmanager
def open_nofollow(path: Path) -> Iterator[BinaryIO]:
    """Open a regular file for reading without following a symbolic link or blocking on
    a FIFO: FileNotFoundError if it is missing, NotRegularFile if it is anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            raise NotRegularFile(exc.errno, "not a regular file", str(path)) from None
        raise
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
        os.set_blocking(fd, True)
        yield f


def read_nofollow(path: Path) -> bytes:
    """The bytes of the regular file ``path`` (see ``open_nofollow``)."""
    with open_nofollow(path) as f:
        return f.read()


def sha256_nofollow(path: Path) -> tuple[str, int]:
    """(hex digest, size) of the regular file ``path`` (see ``open_nofollow``)."""
    digest = hashlib.sha256()
    size = 0
    with open_nofollow(path) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem holding ``path``."""
    found = os.statvfs(path)
    return found.f_bavail * found.f_frsize


def free_space(path: Path) -> int | None:
    """``free_bytes`` of the filesystem holding ``path`` or its nearest existing parent."""
    for where in (path, *path.parents):
        try:
            return free_bytes(where)
        except OSError:
            continue
    return None


def no_room(exc: OSError, places: dict[str, Path]) -> str:
    """One line for a write that found no room (``exc.errno`` in ``NO_SPACE``): the file
    when the error names it, and the place among ``places`` (what it is -> its path)
    with the least free space, with what is free there."""
    free = {what: free_space(path) for what, path in places.items()}
    known = {what: room for what, room in free.items() if room is not None}
    line = f"no disk space left ({exc.strerror or exc})"
    if exc.filename:
        line += f" writing {exc.filename}"
    if known:
        fullest = min(known, key=lambda what: known[what])
        line += f"; {fullest} {places[fullest]} has {known[fullest] / 1e6:.1f} MB free"
    return line + ": free space there and run again"
