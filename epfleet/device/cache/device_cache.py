"""The device cache: a directory that is itself an ONNX Runtime model package.

Beside it in this package: its layout in ``layout``; its state (the record of truth) in
``state``; the package manifest, rendered from the state after every change, in
``package`` (a crash between the two is mended by the next sync). A state that is
missing, damaged or unreadable is rebuilt from the variant directories (``repair``),
keeping what the package's manifest selects.

Every path is reached without following a link (``nofollow``); disk space and partial
downloads are ``space``'s, the lock ``lock``'s (its errors: ``epfleet.errors``). Only what
epfleet names is removed: variant directories, partial downloads, the compile scratch and temporary
files of its atomic writes.
"""

from __future__ import annotations

import os
import shutil
import stat
from contextlib import AbstractContextManager
from pathlib import Path

from pydantic import ValidationError

from epfleet.device.cache import package
from epfleet.device.cache.layout import (
    FLEET_MANIFEST,
    LAST_REPORT,
    MODEL_FILE,
    PACKAGE_MANIFEST,
    REPORT_SENT,
    STATE_DIR,
    STATE_FILE,
    VARIANT_DIR,
)
from epfleet.device.cache.lock import cache_locked
from epfleet.device.cache.nofollow import lstat_at
from epfleet.device.cache.space import CacheSpace
from epfleet.device.cache.state import CacheState, Installed, ModelState
from epfleet.disk import WRITE_DENIED, not_writable
from epfleet.fsutil import read_nofollow, sha256_nofollow


class DeviceCache(CacheSpace):
    """One device cache directory: its lock, state, variant files and package manifest."""

    # --- locking and state -------------------------------------------------------------

    def locked(self) -> AbstractContextManager[None]:
        """Hold the cache for one sync; a second concurrent sync fails fast (see
        ``epfleet.device.cache.lock``)."""
        return cache_locked(self)

    def check_layout(self) -> None:
        """Repair epfleet's own paths before a sync uses them: a link or an entry of the
        wrong kind in their place is removed (and noted); a directory that is not empty
        where a file belongs is refused (CacheDamaged, naming it)."""
        for parts in ((STATE_DIR, "partial"), (STATE_DIR, "samples"), ("models",)):
            self.directory(*parts)
        for name in (STATE_FILE, FLEET_MANIFEST, LAST_REPORT, REPORT_SENT):
            self.file_slot((STATE_DIR, name))
        self.file_slot((PACKAGE_MANIFEST,))

    def load_state(self) -> CacheState:
        """The cache's state. A state file that is missing while the cache holds models,
        damaged, of another schema or not a regular file is rebuilt from the variant
        directories (``epfleet.device.cache.repair``), with a note for the report."""
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
        from epfleet.device.cache.repair import rebuild_state

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
        return self.read((PACKAGE_MANIFEST,))

    def save_state(self, state: CacheState) -> None:
        data = state.model_dump_json(indent=2).encode()
        if self.read((STATE_DIR, STATE_FILE)) != data:
            self.write((STATE_DIR, STATE_FILE), data)

    def cached_manifest(self) -> bytes | None:
        return self.read((STATE_DIR, FLEET_MANIFEST))

    def save_manifest(self, data: bytes) -> None:
        self.write((STATE_DIR, FLEET_MANIFEST), data)

    def save_last_report(self, data: bytes) -> None:
        self.write((STATE_DIR, LAST_REPORT), data)

    def report_sent(self) -> bytes | None:
        """The record of the last report the store received (``epfleet.device.reporting``)."""
        return self.read((STATE_DIR, REPORT_SENT))

    def save_report_sent(self, data: bytes) -> None:
        self.write((STATE_DIR, REPORT_SENT), data)

    # --- variant files -----------------------------------------------------------------

    def model_file(self, model: str, variant: Installed) -> Path:
        """The variant's main file (``model.onnx`` unless its set names another)."""
        return self.path(variant_parts(model, variant, variant.model_file))

    def samples_file(self, sha256: str) -> Path:
        """Where a model's golden samples are kept, content-addressed."""
        return self.file_slot((STATE_DIR, "samples", f"{sha256}.npz"))

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
            found = lstat_at(fd, MODEL_FILE)
            if found is not None and not stat.S_ISREG(found.st_mode):
                self.clear(fd, ("models", model, variant.name, MODEL_FILE), "a model file")
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

    def place(self, model: str, variant: Installed, assembled: Path) -> Installed:
        """Move a verified, assembled directory of the cache's scratch into place as the
        variant's directory, in one rename, and stamp its files' mtimes. What was at the
        variant's name (never an active variant: a variant is kept, not fetched again,
        while it is intact) is removed first, a link unlinked."""
        fd = self.open_dir(("models", model))
        try:
            found = lstat_at(fd, variant.name)
            if found is not None:
                self.remove_entry(fd, ("models", model, variant.name))
                if stat.S_ISLNK(found.st_mode):
                    self.note(f"{self.path(('models', model, variant.name))} was a link: removed")
            try:
                os.rename(assembled, variant.name, dst_dir_fd=fd)
            except OSError as exc:
                if exc.errno not in WRITE_DENIED:
                    raise
                raise not_writable(self.path(("models", model, variant.name)), exc) from None
            os.fsync(fd)
        finally:
            os.close(fd)
        return variant.model_copy(
            update={
                "mtime_ns": self._mtime(model, variant, variant.model_file),
                "files": [
                    f.model_copy(update={"mtime_ns": self._mtime(model, variant, f.path)})
                    for f in variant.files
                ],
            }
        )

    def _mtime(self, model: str, variant: Installed, path: str) -> int:
        found = self.regular_file(variant_parts(model, variant, path))
        if found is None:
            raise FileNotFoundError(f"{self.path(variant_parts(model, variant, path))} is gone")
        return found.st_mtime_ns

    def intact(self, model: str, variant: Installed, *, rehash: bool = False) -> bool:
        """Every file of the variant is still what was activated: same size and mtime (or,
        with ``rehash``, the same sha256), reached without a link on the way."""
        listing = [(variant.model_file, variant.sha256, variant.size, variant.mtime_ns)]
        listing += [(f.path, f.sha256, f.size, f.mtime_ns) for f in variant.files]
        for path, sha256, size, mtime_ns in listing:
            parts = variant_parts(model, variant, path)
            found = self.regular_file(parts)
            if found is None or found.st_size != size:
                return False
            changed = rehash or found.st_mtime_ns != mtime_ns
            if changed and not self.verified(self.path(parts), sha256, size):
                return False
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

    def drop_model(self, model: str) -> None:
        """Remove ``models/<model>`` and what it holds (links unlinked, not followed)."""
        try:
            fd = self.open_dir(("models",), create=False)
        except FileNotFoundError:
            return
        try:
            self.remove_entry(fd, ("models", model))
        finally:
            os.close(fd)

    # --- the ORT model package ----------------------------------------------------------

    def package_json(self, state: CacheState) -> bytes:
        return package.package_json(self, state)

    def write_package(self, state: CacheState) -> list[str]:
        """See ``epfleet.device.cache.package.write_package``."""
        return package.write_package(self, state)

    def selected(self, model: str) -> str | None:
        """The variant ORT's model package selection picks for ``model`` here."""
        return package.selected(self.root, model)


def variant_parts(model: str, variant: Installed, path: str) -> tuple[str, ...]:
    """The cache path of the file at ``path`` in the variant's directory, as parts."""
    return ("models", model, variant.name, *path.split("/"))
