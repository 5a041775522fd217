"""Downloaded file sets: a variant's (or a source's) files fetched, verified and assembled.

A single-file set stays the verified partial download it was, installed by moving it
into the variant's directory (``DeviceCache.install``). A set with files beside its main
file (external data, EP contexts, a GenAI folder's config and tokenizer) is fetched
file by file with the resumable, verified download of ``epfleet.device.fetching`` after
room for the whole set was found (``make_room``, before any byte is fetched), then
assembled in a fresh directory of the cache's scratch (each file hard-linked from its
partial download, nested directories made without following links) and installed by
one rename of that directory (``DeviceCache.place``). A failure at any file leaves
nothing installed; the assembly directory is removed (``close``), and the partial
downloads stay for the next sync to resume, unless a file's bytes were not the
manifest's (the store serves another set), the disk has no room for the set (a partial
download never keeps the disk full) or the set was refused by its checks (``drop``).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from epfleet.device.cache import MODEL_FILE, STATE_DIR, DeviceCache, Installed
from epfleet.device.fetching import Fetcher
from epfleet.errors import DiskFull, IntegrityError
from epfleet.formats.manifest import ArtifactRef, PackageFile


@dataclass(frozen=True)
class SetFile:
    """One file of a set: where it goes in the directory, and what the store holds."""

    path: str
    uri: str
    sha256: str
    size: int


def is_file_set(model_file: str, files: Sequence[object]) -> bool:
    """A set that needs a directory of its own (anything but a lone ``model.onnx``)."""
    return bool(files) or model_file != MODEL_FILE


@dataclass
class Fetched:
    """A set's verified bytes in the cache, not yet installed."""

    cache: DeviceCache
    main: Path
    """The main file, to check and health-check (its files beside it)."""
    parts: list[Path]
    moved: int
    directory: Path | None = None
    """The assembly directory of a multi-file set; None for a single file."""
    installed: bool = field(default=False)

    def install(self, model: str, variant: Installed) -> Installed:
        """Make the set the variant's directory (one rename for a multi-file set)."""
        if self.directory is None:
            done = self.cache.install(model, variant, self.main)
        else:
            done = self.cache.place(model, variant, self.directory)
            self.drop()
        self.installed = True
        return done

    def drop(self) -> None:
        """Remove the set's partial downloads (refused bytes, or bytes no longer needed)."""
        for part in self.parts:
            self.cache.drop_partial(part)

    def close(self) -> None:
        """Remove the assembly directory if the set was not installed."""
        if self.directory is not None and not self.installed:
            shutil.rmtree(self.directory, ignore_errors=True)


def fetch_set(
    fetcher: Fetcher, what: str, main: ArtifactRef, model_file: str, files: Sequence[PackageFile]
) -> Fetched:
    """Download ``main`` (at ``model_file``) and ``files``, each verified; for a multi-file
    set, room for every missing byte is asked first and the files are assembled in a
    scratch directory. ``what`` names the set in messages."""
    cache = fetcher.cache
    if not is_file_set(model_file, files):
        part, moved = fetcher.to_partial(main.uri, main.sha256, main.size)
        return Fetched(cache=cache, main=part, parts=[part], moved=moved)
    wanted = [SetFile(model_file, main.uri, main.sha256, main.size)]
    wanted += [SetFile(f.path, f.uri, f.sha256, f.size) for f in files]
    distinct = {f.sha256: f for f in wanted}  # a file stored once may sit at two paths
    held = {f.sha256: cache.partial(f.sha256) for f in distinct.values()}
    cache.in_use.update(held.values())  # what the set holds is not dropped to make room
    missing = sum(max(0, f.size - cache.held(held[f.sha256])) for f in distinct.values())
    total = sum(f.size for f in distinct.values())
    parts: dict[str, Path] = {}
    moved = 0
    try:
        cache.make_room(
            missing, cache.meta / "partial", f"{what} ({len(wanted)} files, {total} bytes)"
        )
        for f in distinct.values():
            part, got = fetcher.to_partial(f.uri, f.sha256, f.size)
            parts[f.sha256] = part
            moved += got
    except (IntegrityError, DiskFull):
        # The store serves a set that is not the manifest's, or there is no room for it:
        # its partial downloads go (a partial download never keeps the disk full).
        for part in held.values():
            cache.drop_partial(part)
        raise
    directory = Path(tempfile.mkdtemp(dir=cache.scratch(), prefix="set-"))
    fetched = Fetched(
        cache=cache,
        main=directory / model_file,
        parts=list(parts.values()),
        moved=moved,
        directory=directory,
    )
    try:
        for f in wanted:
            slot = cache.file_slot((STATE_DIR, "scratch", directory.name, *f.path.split("/")))
            _link_or_copy(parts[f.sha256], slot)
    except BaseException:
        fetched.close()
        raise
    return fetched


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` with ``source``'s bytes: a hard link (no bytes written), else a copy.

    Only complete, verified partials are linked, and they are dropped as soon as the set
    is installed. One that a crash left linked to an installed file is never written
    again: a download finds it whole and only verifies it (``epfleet.device.download``),
    and one that does not verify is unlinked before a fresh file takes its name."""
    try:
        os.link(source, target, follow_symlinks=False)
    except OSError:
        shutil.copyfile(source, target, follow_symlinks=False)
