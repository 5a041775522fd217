"""Disk space in the device cache: partial downloads, making room, and writes that need it.

A download first asks for its size plus ``DISK_MARGIN`` free, dropping partial
downloads of earlier syncs, oldest first, to make room (``make_room``); a download that
finds no room fails its step ("needs N MB, M MB free") and leaves no partial file
behind, and a sync ending short of the margin drops partials too (``tidy``).
"""

from __future__ import annotations

import os
import stat
import threading
import time
from datetime import datetime
from pathlib import Path

from epfleet.device.cache.layout import (
    DISK_MARGIN,
    OWN_FILES,
    PARTIAL_FILE,
    PARTIAL_MAX_AGE,
    STATE_DIR,
)
from epfleet.device.cache.nofollow import CacheFiles, lstat_at, remove_temp_files
from epfleet.disk import WRITE_DENIED, not_writable
from epfleet.errors import DiskFull
from epfleet.fsutil import NO_SPACE, atomic_write_bytes, free_bytes, is_temp_name
from epfleet.text import mb


class CacheSpace(CacheFiles):
    """The cache's partial downloads and the free space its downloads and writes need."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.meta = self.root / STATE_DIR
        self.in_use: set[Path] = set()
        """Partial files this sync still needs: never dropped to make room."""
        self.room_lock = threading.Lock()
        """Held while a download asks for room and marks its partial file in use: a
        download running ahead (``epfleet.device.prefetch``) and the sync's own never drop
        each other's partial file to make room."""

    def write(self, parts: tuple[str, ...], data: bytes) -> None:
        """Write one of epfleet's files atomically. Out of space, partial downloads this
        sync does not need are dropped and the write tried once more; then DiskFull."""
        path = self.file_slot(parts)
        try:
            atomic_write_bytes(path, data)
            return
        except OSError as exc:
            if exc.errno in WRITE_DENIED:
                raise not_writable(path, exc) from None
            if exc.errno not in NO_SPACE:
                raise
        self.relieve(len(data))
        try:
            atomic_write_bytes(path, data)
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            raise DiskFull(
                f"no disk space to write {path} ({mb(len(data))} MB): "
                f"{mb(free_bytes(path.parent))} MB free"
            ) from None

    def partial(self, sha256: str) -> Path:
        """Where the download of ``sha256`` goes (and resumes), with nothing but a regular
        file in its place or its progress record's."""
        self.file_slot((STATE_DIR, "partial", f"{sha256}.part.progress"))
        return self.file_slot((STATE_DIR, "partial", f"{sha256}.part"))

    def held(self, part: Path) -> int:
        """Bytes a partial download already holds."""
        found = self.regular_file((STATE_DIR, "partial", part.name))
        return found.st_size if found is not None else 0

    def drop_partial(self, part: Path) -> None:
        """Remove a partial download and its progress record."""
        part.unlink(missing_ok=True)
        part.with_name(part.name + ".progress").unlink(missing_ok=True)
        self.in_use.discard(part)

    def make_room(self, need: int, where: Path, what: str) -> None:
        """Make sure ``need`` bytes and ``DISK_MARGIN`` are free on ``where``'s filesystem,
        dropping partial downloads this sync does not use, oldest first; DiskFull (naming
        ``what``) when that is not enough."""
        wanted = need + DISK_MARGIN
        free = free_bytes(where)
        if free < wanted:
            free = self._drop_partials(wanted, where)
        if free < wanted:
            raise DiskFull(
                f"not enough disk space for {what}: needs {mb(wanted)} MB "
                f"({mb(need)} MB and a {mb(DISK_MARGIN)} MB margin), "
                f"{mb(free)} MB free in {where}"
            )

    def relieve(self, need: int) -> None:
        """Drop partial downloads this sync does not use, oldest first, until ``need``
        bytes and ``DISK_MARGIN`` are free (or none is left)."""
        self._drop_partials(need + DISK_MARGIN, self.root)

    def _drop_partials(self, wanted: int, where: Path) -> int:
        free = free_bytes(where)
        in_use = {p.name for p in self.in_use} | {p.name + ".progress" for p in self.in_use}
        for path, found in self._partials():
            if free >= wanted:
                break
            if path.name in in_use:
                continue
            path.unlink(missing_ok=True)
            if not is_temp_name(path.name) and not path.name.endswith(".progress"):
                when = datetime.fromtimestamp(found.st_mtime).isoformat(timespec="seconds")
                self.note(
                    f"dropped the partial download {path.name} ({mb(found.st_size)} MB, "
                    f"last written {when}) to make room on a nearly full disk"
                )
            free = free_bytes(where)
        return free

    def _partials(self) -> list[tuple[Path, os.stat_result]]:
        """The partial downloads (and their temporary files), oldest first. Links found
        there are unlinked; a link in the partial directory's own place is removed."""
        try:
            fd = self.open_dir((STATE_DIR, "partial"), create=False)
        except FileNotFoundError:
            return []
        directory = self.meta / "partial"
        found = []
        try:
            with os.scandir(fd) as entries:
                names = [e.name for e in entries]
            for name in names:
                info = lstat_at(fd, name)
                if info is None:
                    continue
                if stat.S_ISLNK(info.st_mode):
                    os.unlink(name, dir_fd=fd)
                    self.note(f"{directory / name} was a symbolic link: removed")
                elif stat.S_ISREG(info.st_mode) and (
                    PARTIAL_FILE.fullmatch(name) or is_temp_name(name)
                ):
                    found.append((directory / name, info))
        finally:
            os.close(fd)
        return sorted(found, key=lambda item: item[1].st_mtime)

    def tidy(self, max_age_seconds: float = PARTIAL_MAX_AGE) -> None:
        """Remove compile scratch, temporary files of writes a killed sync left, partial
        downloads nobody resumed for a while, and more partials, oldest first, while the
        disk is short of ``DISK_MARGIN``."""
        self.in_use.clear()  # the sync is over
        try:
            meta = self.open_dir((STATE_DIR,), create=False)
        except FileNotFoundError:
            return
        try:
            self.remove_entry(meta, (STATE_DIR, "scratch"))
            remove_temp_files(meta, OWN_FILES)
        finally:
            os.close(meta)
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            remove_temp_files(root, OWN_FILES)
        finally:
            os.close(root)
        cutoff = time.time() - max_age_seconds
        for path, found in self._partials():
            if is_temp_name(path.name) or found.st_mtime < cutoff:
                path.unlink(missing_ok=True)
        self.relieve(0)
