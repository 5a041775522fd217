"""Paths inside the device cache reached without following a link, and repaired in place.

Nothing inside the cache is trusted to be what epfleet left there. Directories are
opened one component at a time without following symbolic links; files are opened with
``O_NOFOLLOW`` and replaced by rename, which replaces a link rather than writing
through it. A link, or an entry of the wrong kind, where epfleet keeps one of its own
paths is removed (a link is unlinked, never followed) and the repair is noted for the
device report (``CacheFiles.repairs``); a non-empty directory where a file belongs is
refused with its path.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from collections.abc import Collection
from contextlib import suppress
from pathlib import Path

from epfleet.disk import cannot_write
from epfleet.errors import BadInputError, CacheDamaged
from epfleet.fsutil import is_temp_name, read_nofollow

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

logger = logging.getLogger(__name__)


class CacheFiles:
    """The cache directory's paths, each reached without a link on the way."""

    def __init__(self, root: Path) -> None:
        if root.exists() and not root.is_dir():
            raise BadInputError(f"cache {root} is a file, not a directory")
        self.root = root.resolve()  # the cache directory itself may be a link: the user's
        self.repairs: list[str] = []
        """What this cache object repaired or could not write, for the device report."""

    def note(self, message: str) -> None:
        """Record a repair (or a write that failed) for the report, and log it."""
        if message not in self.repairs:
            self.repairs.append(message)
            logger.warning("%s", message)

    def directory(self, *parts: str) -> Path:
        """``DIR/<parts>``, each component made a real directory (see ``open_dir``)."""
        os.close(self.open_dir(parts))
        return self.root.joinpath(*parts)

    def open_dir(self, parts: tuple[str, ...], *, create: bool = True) -> int:
        """A file descriptor of ``DIR/<parts>``, opened one component at a time without
        following links. A component that is a link or a file is removed and, with
        ``create``, made a directory; without it, FileNotFoundError (the cache directory
        itself included: nothing is made)."""
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            for depth in range(1, len(parts) + 1):
                child = self._open_child(fd, parts[:depth], create)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _open_child(self, parent: int, parts: tuple[str, ...], create: bool) -> int:
        name = parts[-1]
        for _ in range(3):
            try:
                return os.open(name, _DIR_FLAGS, dir_fd=parent)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(name, 0o777, dir_fd=parent)
                except FileExistsError:
                    pass
                except OSError as exc:  # read-only, permissions, a full disk
                    raise cannot_write(self.path(parts), exc) from None
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                self.clear(parent, parts, "a directory")
                if not create:
                    raise FileNotFoundError(
                        errno.ENOENT, "removed", str(self.path(parts))
                    ) from None
        raise CacheDamaged(f"{self.path(parts)} keeps changing kind; is something racing epfleet?")

    def path(self, parts: tuple[str, ...]) -> Path:
        return self.root.joinpath(*parts)

    def clear(self, parent: int, parts: tuple[str, ...], wanted: str) -> None:
        """Remove the entry ``parts`` (in directory ``parent``) that is not ``wanted``: a link
        is unlinked (its target is not touched), a file removed, an empty directory
        removed; a directory that holds something is refused."""
        name, path = parts[-1], self.path(parts)
        try:
            found = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        link = stat.S_ISLNK(found.st_mode)
        if link:
            kind = f"a symbolic link to {os.readlink(name, dir_fd=parent)}"
        elif stat.S_ISDIR(found.st_mode):
            kind = "a directory"
        elif stat.S_ISREG(found.st_mode):
            kind = "a file"
        else:
            kind = "a special file"
        if stat.S_ISDIR(found.st_mode):
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError:
                raise CacheDamaged(
                    f"{path} is a directory that is not empty where epfleet keeps {wanted}; "
                    "epfleet removes only what it created: move it out of the cache and sync "
                    "again"
                ) from None
        else:
            os.unlink(name, dir_fd=parent)
        done = "the link removed (its target untouched)" if link else "removed"
        self.note(f"{path} was {kind}, not {wanted}: {done}")

    def file_slot(self, parts: tuple[str, ...]) -> Path:
        """``DIR/<parts>`` where epfleet keeps a regular file: its directories made real and
        anything but a regular file in its place removed (a rename then replaces it)."""
        fd = self.open_dir(parts[:-1])
        try:
            found = lstat_at(fd, parts[-1])
            if found is not None and not stat.S_ISREG(found.st_mode):
                self.clear(fd, parts, "a regular file")
        finally:
            os.close(fd)
        return self.path(parts)

    def regular_file(self, parts: tuple[str, ...]) -> os.stat_result | None:
        """The ``lstat`` of ``DIR/<parts>`` if every directory on the way is a real one and
        the last is a regular file, else None. Reads only, repairs nothing."""
        path = self.root
        for depth, name in enumerate(parts, 1):
            path = path / name
            try:
                found = os.lstat(path)
            except OSError:
                return None
            wanted = stat.S_ISREG if depth == len(parts) else stat.S_ISDIR
            if not wanted(found.st_mode):
                return None
        return found

    def read(self, parts: tuple[str, ...]) -> bytes | None:
        """One of epfleet's files, or None if it is missing or not a regular file."""
        try:
            return read_nofollow(self.path(parts))
        except OSError:
            return None

    def remove_entry(self, parent: int, parts: tuple[str, ...]) -> None:
        """Remove what epfleet keeps at ``parts``: a directory with what it holds (its links
        unlinked, not followed), or a link or file."""
        found = lstat_at(parent, parts[-1])
        if found is None:
            return
        if stat.S_ISDIR(found.st_mode):
            shutil.rmtree(parts[-1], dir_fd=parent, ignore_errors=True)
        else:
            os.unlink(parts[-1], dir_fd=parent)


def lstat_at(directory: int, name: str) -> os.stat_result | None:
    """``lstat`` of ``name`` in the open ``directory``, or None if it is missing."""
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return None


def remove_temp_files(directory: int, of: Collection[str]) -> None:
    """Remove the temporary files of atomic writes of ``of`` that a killed sync left."""
    with os.scandir(directory) as entries:
        names = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
    for name in names:
        if any(is_temp_name(name, own) for own in of):
            with suppress(FileNotFoundError):
                os.unlink(name, dir_fd=directory)
