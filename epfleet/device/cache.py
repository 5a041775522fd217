"""The device cache: a directory that is itself an ONNX Runtime model package.

    DIR/manifest.json                      ORT model package: component per model
    DIR/models/<model>/<variant>/model.onnx
    DIR/.epfleet/state.json                epfleet's own state (written atomically)
    DIR/.epfleet/fleet-manifest.json       the last valid fleet manifest (offline use)
    DIR/.epfleet/partial/<sha256>.part     interrupted downloads, resumed by range
    DIR/.epfleet/last-report.json          the last sync's device report
    DIR/.epfleet/lock                      one sync at a time

An application with no epfleet code runs a model with
``onnxruntime.ModelPackageContext(DIR).select_component(model, options).create_session()``.
Each component lists the active variant first and the previous one (kept for
rollback) after it; ORT's selection prefers the first when the scores tie, and
``write_package`` checks with ORT that it selects the active one.

The state is the record of truth; the package manifest is rendered from it after
every change, so a crash between the two is mended by the next sync. A state that is
missing, damaged or unreadable is rebuilt from the variant directories
(``epfleet.device.repair``), keeping what the package's manifest selects.

Nothing inside DIR is trusted to be what epfleet left there. Directories are opened
one component at a time without following symbolic links; files are opened with
``O_NOFOLLOW`` and replaced by rename, which replaces a link rather than writing
through it. A link, or an entry of the wrong kind, where epfleet keeps one of its own
paths is removed (a link is unlinked, never followed) and the repair is noted in the
device report (``DeviceCache.repairs``); a non-empty directory where a file belongs
is refused with its path. Only what epfleet names is removed: variant directories,
partial downloads, the compile scratch and temporary files of its atomic writes.

Disk space: a download first asks for its size plus ``DISK_MARGIN`` free, dropping
partial downloads of earlier syncs, oldest first, to make room (``make_room``); a
download that finds no room fails its step ("needs N MB, M MB free") and leaves no
partial file behind, and a sync ending short of the margin drops partials too.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import socket
import stat
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from epfleet import ort_version
from epfleet.device.local_eps import ep_versions
from epfleet.errors import BadInputError, EpfleetError
from epfleet.fsutil import (
    NO_SPACE,
    atomic_write_bytes,
    free_bytes,
    is_temp_name,
    read_nofollow,
    sha256_nofollow,
)
from epfleet.manifest import Name
from eps.base import DeviceType

PACKAGE_MANIFEST = "manifest.json"
PACKAGE_NAME = "epfleet-device-cache"
MODEL_FILE = "model.onnx"
STATE_DIR = ".epfleet"
STATE_FILE = "state.json"
FLEET_MANIFEST = "fleet-manifest.json"
LAST_REPORT = "last-report.json"
LOCK_FILE = "lock"
PARTIAL_MAX_AGE = 7 * 24 * 3600.0
MB = 1_000_000
DISK_MARGIN = 16 * MB
"""Free space a download leaves beyond its own bytes: the state, the manifests and the
report are written after it, and the device's other programs need room too."""
VARIANT_DIR = re.compile(r"[a-z0-9][a-z0-9._-]*-[0-9a-f]{12}")
PARTIAL_FILE = re.compile(r"[0-9a-f]{64}\.part(\.progress)?")
_OWN_FILES = {PACKAGE_MANIFEST, STATE_FILE, FLEET_MANIFEST, LAST_REPORT}
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

logger = logging.getLogger(__name__)


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


Origin = Literal["published", "local", "fallback"]


class Installed(BaseModel):
    """A variant present in the cache (made by ``epfleet.device.activation``)."""

    name: str = Field(description="Variant name in the package, and its directory")
    origin: Origin
    target: str | None = Field(description="The fleet target it was published for")
    ep: str
    device: DeviceType
    compatibility_string: str | None
    provider_options: dict[str, str] = Field(default_factory=dict)
    sha256: str
    size: int
    source_sha256: str
    activated_at: datetime
    mtime_ns: int = Field(description="The file's mtime when activated: a cheap tamper check")


class ModelState(BaseModel):
    active: Installed | None = None
    previous: Installed | None = Field(default=None, description="Kept for rollback")
    recompile_failed: dict[str, str] = Field(
        default_factory=dict, description="Local build key -> why it failed; not retried"
    )


class CacheState(BaseModel):
    schema_version: Literal["1"] = "1"
    store: str | None = None
    manifest_etag: str | None = None
    manifest_generation: int | None = None
    manifest_sha256: str | None = Field(
        default=None, description="Of the cached manifest, as validated when it was fetched"
    )
    manifest_rules: str | None = Field(
        default=None, description="epfleet's validation rules it was validated under"
    )
    package_checked_with: str | None = Field(
        default=None, description="ORT and EP versions the package's selection was checked with"
    )
    manifest_rejected: dict[str, str] | None = None  # see epfleet.device.manifest_cache
    models: dict[Name, ModelState] = Field(default_factory=dict)


class DeviceCache:
    def __init__(self, root: Path) -> None:
        if root.exists() and not root.is_dir():
            raise BadInputError(f"cache {root} is a file, not a directory")
        self.root = root.resolve()  # the cache directory itself may be a link: the user's
        self.meta = self.root / STATE_DIR
        self.repairs: list[str] = []
        """What this cache object repaired or could not write, for the device report."""
        self.in_use: set[Path] = set()
        """Partial files this sync still needs: never dropped to make room."""

    def note(self, message: str) -> None:
        """Record a repair (or a write that failed) for the report, and log it."""
        if message not in self.repairs:
            self.repairs.append(message)
            logger.warning("%s", message)

    # --- paths, never through a link -----------------------------------------------------

    def directory(self, *parts: str) -> Path:
        """``DIR/<parts>``, each component made a real directory (see ``_open_dir``)."""
        os.close(self.open_dir(parts))
        return self.root.joinpath(*parts)

    def open_dir(self, parts: tuple[str, ...], *, create: bool = True) -> int:
        """A file descriptor of ``DIR/<parts>``, opened one component at a time without
        following links. A component that is a link or a file is removed and, with
        ``create``, made a directory; without it, FileNotFoundError."""
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
                except OSError as exc:
                    if exc.errno not in WRITE_DENIED:
                        raise
                    raise not_writable(self._path(parts), exc) from None
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                self._clear(parent, parts, "a directory")
                if not create:
                    raise FileNotFoundError(
                        errno.ENOENT, "removed", str(self._path(parts))
                    ) from None
        raise CacheDamaged(f"{self._path(parts)} keeps changing kind; is something racing epfleet?")

    def _path(self, parts: tuple[str, ...]) -> Path:
        return self.root.joinpath(*parts)

    def _clear(self, parent: int, parts: tuple[str, ...], wanted: str) -> None:
        """Remove the entry ``parts`` (in directory ``parent``) that is not ``wanted``: a link
        is unlinked (its target is not touched), a file removed, an empty directory
        removed; a directory that holds something is refused."""
        name, path = parts[-1], self._path(parts)
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

    def _file_slot(self, parts: tuple[str, ...]) -> Path:
        """``DIR/<parts>`` where epfleet keeps a regular file: its directories made real and
        anything but a regular file in its place removed (a rename then replaces it)."""
        fd = self.open_dir(parts[:-1])
        try:
            found = _lstat(fd, parts[-1])
            if found is not None and not stat.S_ISREG(found.st_mode):
                self._clear(fd, parts, "a regular file")
        finally:
            os.close(fd)
        return self._path(parts)

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

    def _write(self, parts: tuple[str, ...], data: bytes) -> None:
        """Write one of epfleet's files atomically. Out of space, partial downloads this
        sync does not need are dropped and the write tried once more; then DiskFull."""
        path = self._file_slot(parts)
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
                f"no disk space to write {path} ({_mb(len(data))} MB): "
                f"{_mb(free_bytes(path.parent))} MB free"
            ) from None

    def _read(self, parts: tuple[str, ...]) -> bytes | None:
        """One of epfleet's files, or None if it is missing or not a regular file."""
        try:
            return read_nofollow(self._path(parts))
        except OSError:
            return None

    # --- locking and state -------------------------------------------------------------

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cache for one sync; a second concurrent sync fails fast.

        The lock is an ``flock`` on ``.epfleet/lock``: the kernel releases it when its
        holder exits or is killed (worker processes are spawned, so none inherits it), and
        the next sync takes it over. The holder writes its pid, host and start time into
        the file so that a refused sync can say who holds it. A link, directory or device
        in the lock's place is removed first (see ``_clear``)."""
        path = self.meta / LOCK_FILE
        try:
            fd = self._lock()
        except OSError as exc:
            raise EpfleetError(
                f"cannot lock the cache at {path}: {exc.strerror or exc}; check that the "
                "cache directory is writable by this user"
            ) from None
        try:
            _stamp(fd)
            yield
        finally:
            os.close(fd)  # releases the flock

    def _lock(self) -> int:
        meta = self.open_dir((STATE_DIR,))
        parts = (STATE_DIR, LOCK_FILE)
        try:
            for _ in range(5):
                found = _lstat(meta, LOCK_FILE)
                if found is not None and not stat.S_ISREG(found.st_mode):
                    self._clear(meta, parts, "a lock file")
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
                    self.note(
                        f"{self.root} is not writable ({exc.strerror}): nothing in the cache "
                        "can change; the variants active in it stay active"
                    )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    holder = _holder(fd)
                    os.close(fd)
                    raise CacheBusy(
                        f"another epfleet sync{holder} is using {self.root} (it holds "
                        f"{self._path(parts)}; the lock is released when that sync ends or "
                        "dies)"
                    ) from None
                except BaseException:
                    os.close(fd)
                    raise
                held, now = os.fstat(fd), _lstat(meta, LOCK_FILE)
                same = now is not None and (held.st_dev, held.st_ino) == (now.st_dev, now.st_ino)
                if same and stat.S_ISREG(held.st_mode):
                    return fd
                os.close(fd)  # not a regular file, or replaced while we waited: again
        finally:
            os.close(meta)
        raise CacheDamaged(f"{self._path(parts)} keeps changing; is something racing epfleet?")

    def check_layout(self) -> None:
        """Repair epfleet's own paths before a sync uses them: a link or an entry of the
        wrong kind in their place is removed (and noted); a directory that is not empty
        where a file belongs is refused (CacheDamaged, naming it)."""
        for parts in ((STATE_DIR, "partial"), (STATE_DIR, "samples"), ("models",)):
            self.directory(*parts)
        for name in (STATE_FILE, FLEET_MANIFEST, LAST_REPORT):
            self._file_slot((STATE_DIR, name))
        self._file_slot((PACKAGE_MANIFEST,))

    def load_state(self) -> CacheState:
        """The cache's state. A state file that is missing while the cache holds models,
        damaged, of another schema or not a regular file is rebuilt from the variant
        directories (``epfleet.device.repair``), with a note for the report."""
        path = self.meta / STATE_FILE
        try:
            data = read_nofollow(path)
        except FileNotFoundError:
            if self.regular_file((PACKAGE_MANIFEST,)) is None and not self._holds_variants():
                return CacheState()  # a new cache
            problem = "is missing"
        except OSError as exc:
            problem = f"cannot be read ({exc.strerror or exc})"
        else:
            try:
                return CacheState.model_validate_json(data)
            except ValidationError as exc:
                error = exc.errors()[0]
                where = ".".join(map(str, error["loc"]))
                problem = f"is damaged ({where + ': ' if where else ''}{error['msg']})"
        from epfleet.device.repair import rebuild_state

        state, kept = rebuild_state(self)
        self.note(
            f"{path} {problem}: rebuilt from the variant directories in the cache "
            f"({', '.join(kept) if kept else 'none could be kept'})"
        )
        return state

    def _holds_variants(self) -> bool:
        try:
            return any(os.scandir(self.root / "models"))
        except OSError:
            return False

    def package_manifest(self) -> bytes | None:
        """The package's manifest.json as it is, or None if it is missing or not a file."""
        return self._read((PACKAGE_MANIFEST,))

    def save_state(self, state: CacheState) -> None:
        data = state.model_dump_json(indent=2).encode()
        if self._read((STATE_DIR, STATE_FILE)) != data:
            self._write((STATE_DIR, STATE_FILE), data)

    def cached_manifest(self) -> bytes | None:
        return self._read((STATE_DIR, FLEET_MANIFEST))

    def save_manifest(self, data: bytes) -> None:
        self._write((STATE_DIR, FLEET_MANIFEST), data)

    def save_last_report(self, data: bytes) -> None:
        self._write((STATE_DIR, LAST_REPORT), data)

    # --- files ---------------------------------------------------------------------------

    def model_file(self, model: str, variant: Installed) -> Path:
        return self.root / "models" / model / variant.name / MODEL_FILE

    def partial(self, sha256: str) -> Path:
        """Where the download of ``sha256`` goes (and resumes), with nothing but a regular
        file in its place or its progress record's."""
        self._file_slot((STATE_DIR, "partial", f"{sha256}.part.progress"))
        return self._file_slot((STATE_DIR, "partial", f"{sha256}.part"))

    def samples_file(self, sha256: str) -> Path:
        """Where a model's golden samples are kept, content-addressed."""
        return self._file_slot((STATE_DIR, "samples", f"{sha256}.npz"))

    def verified(self, path: Path, sha256: str, size: int) -> bool:
        """``path`` is a regular file (not a link) with this sha256 and size."""
        try:
            return sha256_nofollow(path) == (sha256, size)
        except OSError:
            return False

    def scratch(self) -> Path:
        return self.directory(STATE_DIR, "scratch")

    def install(self, model: str, variant: Installed, verified: Path) -> Installed:
        """Move a verified file into the variant's directory and stamp its mtime. The
        directories on the way are opened without following links: a link in their place
        is removed, never written through."""
        fd = self.open_dir(("models", model, variant.name))
        try:
            found = _lstat(fd, MODEL_FILE)
            if found is not None and not stat.S_ISREG(found.st_mode):
                self._clear(fd, ("models", model, variant.name, MODEL_FILE), "a model file")
            try:
                os.replace(verified, MODEL_FILE, dst_dir_fd=fd)
            except OSError as exc:
                if exc.errno not in WRITE_DENIED:
                    raise
                raise not_writable(self.model_file(model, variant), exc) from None
            os.fsync(fd)
            mtime = os.stat(MODEL_FILE, dir_fd=fd, follow_symlinks=False).st_mtime_ns
        finally:
            os.close(fd)
        return variant.model_copy(update={"mtime_ns": mtime})

    def intact(self, model: str, variant: Installed, *, rehash: bool = False) -> bool:
        """The active file is still what was activated: same size and mtime (or, with
        ``rehash``, the same sha256), reached without a link on the way."""
        found = self.regular_file(("models", model, variant.name, MODEL_FILE))
        if found is None or found.st_size != variant.size:
            return False
        if rehash or found.st_mtime_ns != variant.mtime_ns:
            return self.verified(self.model_file(model, variant), variant.sha256, variant.size)
        return True

    def prune(self, model: str, state: ModelState) -> list[str]:
        """Remove the model's variant directories that are neither active nor previous (and
        links, unlinked); anything else in the model's directory is left alone."""
        keep = {v.name for v in (state.active, state.previous) if v is not None}
        try:
            fd = self.open_dir(("models", model), create=False)
        except FileNotFoundError:
            return []
        removed = []
        try:
            with os.scandir(fd) as entries:
                children = [
                    (e.name, e.is_symlink(), e.is_dir(follow_symlinks=False)) for e in entries
                ]
            for name, link, directory in children:
                if name in keep:
                    continue
                if link:
                    os.unlink(name, dir_fd=fd)
                    self.note(f"{self.root / 'models' / model / name} was a symbolic link: removed")
                elif directory and VARIANT_DIR.fullmatch(name):
                    shutil.rmtree(name, dir_fd=fd)  # never follows a link inside
                    removed.append(name)
        finally:
            os.close(fd)
        return removed

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
            self._remove_entry(meta, (STATE_DIR, "scratch"))
            _remove_temp_files(meta, _OWN_FILES)
        finally:
            os.close(meta)
        root = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _remove_temp_files(root, _OWN_FILES)
        finally:
            os.close(root)
        cutoff = time.time() - max_age_seconds
        for path, found in self._partials():
            if is_temp_name(path.name) or found.st_mtime < cutoff:
                path.unlink(missing_ok=True)
        self.relieve(0)

    def _remove_entry(self, parent: int, parts: tuple[str, ...]) -> None:
        """Remove what epfleet keeps at ``parts``: a directory with what it holds (its links
        unlinked, not followed), or a link or file."""
        found = _lstat(parent, parts[-1])
        if found is None:
            return
        if stat.S_ISDIR(found.st_mode):
            shutil.rmtree(parts[-1], dir_fd=parent, ignore_errors=True)
        else:
            os.unlink(parts[-1], dir_fd=parent)

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
                info = _lstat(fd, name)
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

    # --- disk space ----------------------------------------------------------------------

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
                f"not enough disk space for {what}: needs {_mb(wanted)} MB "
                f"({_mb(need)} MB and a {_mb(DISK_MARGIN)} MB margin), "
                f"{_mb(free)} MB free in {where}"
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
                    f"dropped the partial download {path.name} ({_mb(found.st_size)} MB, "
                    f"last written {when}) to make room on a nearly full disk"
                )
            free = free_bytes(where)
        return free

    # --- the ORT model package ----------------------------------------------------------

    def package_json(self, state: CacheState) -> bytes:
        components = {}
        for model, entry in sorted(state.models.items()):
            listed = [entry.active, entry.previous]
            variants = {
                v.name: _package_variant(model, v)
                for v in listed
                if v is not None
                and self.regular_file(("models", model, v.name, MODEL_FILE)) is not None
            }  # a missing directory would make ORT refuse the whole package
            if variants:
                components[model] = {"variants": variants}
        document = {
            "schema_version": "1.0",
            "package_name": PACKAGE_NAME,
            "components": components,
        }
        return (json.dumps(document, indent=2) + "\n").encode()

    def write_package(self, state: CacheState) -> list[str]:
        """Render the package manifest from ``state`` (only if it changed), then check with
        ORT that every component selects its active variant. Where ORT would pick the
        rollback variant instead, the package lists the active one alone. Returns the
        models whose rollback entry had to be left out."""
        data = self.package_json(state)
        runtime = json.dumps([ort_version(), ep_versions()], sort_keys=True)
        if self._read((PACKAGE_MANIFEST,)) == data and state.package_checked_with == runtime:
            return []  # checked with this ORT and these EPs when it was written
        state.package_checked_with = runtime
        self._write((PACKAGE_MANIFEST,), data)
        outvoted = [
            model
            for model, entry in state.models.items()
            if entry.active is not None
            and entry.previous is not None
            and self.selected(model) not in (None, entry.active.name)
        ]
        if outvoted:
            alone = state.model_copy(
                update={
                    "models": {
                        m: e.model_copy(update={"previous": None}) if m in outvoted else e
                        for m, e in state.models.items()
                    }
                }
            )
            self._write((PACKAGE_MANIFEST,), self.package_json(alone))
        return outvoted

    def selected(self, model: str) -> str | None:
        """The variant ORT's model package selection picks for ``model`` here."""
        import onnxruntime as ort

        try:
            context = ort.ModelPackageContext(str(self.root))
            chosen = context.select_component(model, ort.ModelPackageOptions(ort.SessionOptions()))
        except RuntimeError:
            return None
        return str(chosen.get_selected_variant_name())


def _package_variant(model: str, variant: Installed) -> dict[str, object]:
    entry: dict[str, object] = {"ep": variant.ep, "device": variant.device}
    if variant.compatibility_string:
        entry["compatibility_string"] = variant.compatibility_string
    entry["variant_directory"] = f"models/{model}/{variant.name}"
    entry["executor_info"] = {"ort": {"model_file": MODEL_FILE}}
    return entry


def _mb(size: int) -> str:
    return f"{size / MB:.2f}" if 0 < size < MB else f"{size / MB:.1f}"


def _lstat(directory: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=directory, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove_temp_files(directory: int, of: Collection[str]) -> None:
    """Remove the temporary files of atomic writes of ``of`` that a killed sync left."""
    with os.scandir(directory) as entries:
        names = [e.name for e in entries if not e.is_dir(follow_symlinks=False)]
    for name in names:
        if any(is_temp_name(name, own) for own in of):
            with suppress(FileNotFoundError):
                os.unlink(name, dir_fd=directory)


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
