"""ngclient's Updater as a device runs it: a refresh staged, judged, then promoted.

python-tuf's ``Updater`` is used as its public API gives it: unmodified, over a store
(``StoreFetcher``), in a *staging* copy of the store's trust directory (its files hard
linked, so a refresh that changes nothing copies nothing; ngclient replaces what it
writes, so the originals are never touched). The rules:

1. ``staged`` makes the copy beside the trust directory (or, when the cache cannot be
   written or its disk is full, in the system's temporary directory), and removes it
   afterwards, whatever happens.
2. The refresh and the target lookups run there (``refresh``, ``get_targetinfo``,
   ``download_target``): what ngclient refuses (bad signatures, a rollback against what
   it cached, expiry, mix-and-match) never reaches the trust directory.
3. ``judge`` holds what the refresh verified to the device's high-water mark of the
   repository (``epfleet.trust.highwater``), read from the staged files alone: the root
   chain from the root the refresh started from (``root.json`` names the newest root it
   trusts) must be the one the device recorded (else ``ForkedRoot``), and no root,
   timestamp or snapshot may be older than the mark (``BelowHighWater``). A refused
   refresh is never promoted: a lost or emptied trust directory does not open the way
   to a rollback.
4. ``promote`` writes the staged files that differ into the trust directory as epfleet
   writes the cache (atomic, never through a link, readable as the umask says; a failure
   is the cache's ``CacheNotWritable`` or ``DiskFull``), root history first, then the
   targets metadata, the snapshot, the timestamp, the targets; a trust directory that
   changed nothing is not written (a read-only cache verifies all the same).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tuf.api import exceptions as tuf_errors
from tuf.ngclient import Updater, UpdaterConfig

from epfleet.disk import cannot_write
from epfleet.fsutil import atomic_write_bytes, fsync_dir
from epfleet.trust.directory import ROOT_HISTORY, TARGETS_DIR, read_file, signed_version
from epfleet.trust.fetcher import STORE_URL, StoreFetcher
from epfleet.trust.highwater import Lineage, TrustMark, below, lineage
from epfleet.trust.layout import METADATA_KEYS, TARGETS_KEYS
from epfleet.trust.roots import signed_sha256

ROOT_LINK = "root.json"
STAGING_PREFIX = ".staging-"


class BelowHighWater(tuf_errors.BadVersionNumberError):
    """Signed metadata older than the device's high-water mark of the repository."""


class ForkedRoot(tuf_errors.RepositoryError):
    """A root version that is not the one the device verified before (same repository)."""


@dataclass(frozen=True)
class Judged:
    """What a staged refresh verified, held to the mark."""

    lineage: Lineage
    chain: dict[int, str]
    """Root version -> sha256 of its signed part, from the root the refresh started from."""
    timestamp: int
    snapshot: int


@contextlib.contextmanager
def staged(directory: Path, *, elsewhere: bool = False) -> Iterator[Path]:
    """A staging copy of the trust directory ``directory`` (see the module's rule 1);
    ``elsewhere``: in the system's temporary directory, copied (the cache's disk is full)."""
    parent = directory.parent
    for left in _leftovers(parent, directory.name):  # a sync that crashed mid-refresh
        shutil.rmtree(left, ignore_errors=True)
    try:
        if elsewhere:
            raise OSError("staged elsewhere")
        parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{directory.name}-", dir=parent))
        linked = True
    except OSError:  # a read-only cache: stage elsewhere, copying
        stage = Path(tempfile.mkdtemp(prefix="epfleet-trust-"))
        linked = False
    try:
        _copy_tree(directory, stage, linked)
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _leftovers(parent: Path, name: str) -> list[Path]:
    try:
        return [p for p in parent.iterdir() if p.name.startswith(f"{STAGING_PREFIX}{name}-")]
    except OSError:
        return []


def _copy_tree(source: Path, stage: Path, linked: bool) -> None:
    """The trust directory's files into ``stage``: regular files hard linked (copied when
    that fails), the root link as a link; anything else (a link planted elsewhere) left."""
    for folder in ("", ROOT_HISTORY, TARGETS_DIR):
        try:
            entries = list(os.scandir(source / folder))
        except OSError:
            continue
        (stage / folder).mkdir(exist_ok=True)
        for entry in entries:
            target = stage / folder / entry.name
            if entry.is_symlink():
                if folder == "" and entry.name == ROOT_LINK:
                    os.symlink(os.readlink(entry.path), target)
                continue
            if not entry.is_file(follow_symlinks=False):
                continue
            try:
                if not linked:
                    raise OSError("copy")
                os.link(entry.path, target)
            except OSError:
                shutil.copyfile(entry.path, target, follow_symlinks=False)


def open_updater(
    fetcher: StoreFetcher, stage: Path, root: bytes, config: UpdaterConfig | None = None
) -> Updater:
    """python-tuf's Updater over ``fetcher``'s store, its metadata in the staging directory
    ``stage``, trusting ``root`` (and the newer roots it finds signed by it)."""
    return Updater(
        str(stage),
        STORE_URL + METADATA_KEYS,
        str(stage / TARGETS_DIR),
        STORE_URL + TARGETS_KEYS,
        fetcher=fetcher,
        config=config or UpdaterConfig(),
        bootstrap=root,
    )


def judge(
    stage: Path,
    started_from: int,
    mark: TrustMark | None,
    state_file: Path,
    *,
    roots_only: bool = False,
) -> Judged:
    """Hold the staged refresh to ``mark`` (see the module's rule 3); ``started_from``: the
    version of the root the refresh was given. ``roots_only``: judge the root chain alone
    (a refresh that failed: a root that forks from the device's record is the cause to
    name, ahead of what failed after it, such as a timestamp its keys did not sign)."""
    newest = _trusted_root_version(stage)
    chain = {}
    for version in range(started_from, newest + 1):
        digest = signed_sha256(read_file(stage / ROOT_HISTORY / f"{version}.root.json") or b"")
        if digest is not None:
            chain[version] = digest
    timestamp = signed_version(read_file(stage / "timestamp.json")) or 0
    snapshot = signed_version(read_file(stage / "snapshot.json")) or 0
    if mark is None:
        return Judged("same", chain, timestamp, snapshot)
    found = lineage(mark, chain)
    if found == "forked":
        raise ForkedRoot(
            "the store's root chain differs from the one this device verified before (the "
            f"sha256 recorded in {state_file}): a root signed by keys the repository retired"
        )
    if found == "same" and not roots_only:
        for role, version in (("root", newest), ("timestamp", timestamp), ("snapshot", snapshot)):
            older = below(mark, role, version)
            if older is not None:
                raise BelowHighWater(
                    f"the store serves {older} (recorded in {state_file}); if the trust "
                    "cache was lost, the store serves older metadata than it had"
                )
    return Judged(found, chain, timestamp, snapshot)


def _trusted_root_version(stage: Path) -> int:
    """The newest root the staged refresh trusts: the one ngclient links ``root.json`` to."""
    try:
        link = os.readlink(stage / ROOT_LINK)
    except OSError:
        link = ""
    name = Path(link).name.removesuffix(".root.json")
    return int(name) if name.isdigit() else 0


def promote(stage: Path, directory: Path) -> None:
    """Write the staged files that differ into ``directory`` (see the module's rule 4)."""
    for relative in _in_order(stage):
        staged_file, dest = stage / relative, directory / relative
        data = read_file(staged_file)
        if data is None or read_file(dest) == data:
            continue
        with _cannot_write(dest):
            atomic_write_bytes(dest, data)
    link = _link_of(stage)
    if link is not None and _link_of(directory) != link:
        temp = directory / f".{ROOT_LINK}.{os.getpid()}.tmp"
        with _cannot_write(directory / ROOT_LINK):
            temp.unlink(missing_ok=True)
            os.symlink(link, temp)
            os.replace(temp, directory / ROOT_LINK)
            fsync_dir(directory)


def _in_order(stage: Path) -> list[Path]:
    def files(folder: str) -> list[Path]:
        with contextlib.suppress(OSError):
            return sorted(
                Path(folder, e.name)
                for e in os.scandir(stage / folder)
                if e.is_file(follow_symlinks=False)
            )
        return []

    roots = sorted(files(ROOT_HISTORY), key=lambda p: signed_version(read_file(stage / p)) or 0)
    top = files("")
    last = [Path("snapshot.json"), Path("timestamp.json")]
    metadata = [p for p in top if p not in last and p.suffix == ".json"]
    return [*roots, *metadata, *(p for p in last if p in top), *files(TARGETS_DIR)]


def _link_of(directory: Path) -> str | None:
    try:
        return os.readlink(directory / ROOT_LINK)
    except OSError:
        return None


@contextlib.contextmanager
def _cannot_write(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise cannot_write(path, exc) from None
