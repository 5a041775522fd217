"""Bytes from the store into the device cache for one sync: verified downloads, counted.

Every download goes through ``Fetcher.download`` (resumable, parallel ranged GETs,
verified: ``epfleet.device.download``) so that the sync knows the bytes it moved,
failed attempts included. A model's golden samples are downloaded once and kept,
content-addressed.

Disk space: a download first asks the cache for room (``DeviceCache.make_room``: its
missing bytes and a margin, dropping other partial downloads oldest first), and one
that finds none, or runs out of space on the way, removes its partial file and fails
with ``DiskFull``: a partial download never keeps the disk full.
"""

from __future__ import annotations

import os
from pathlib import Path

from epfleet.clock import SYSTEM_CLOCK, Clock
from epfleet.device.cache import DeviceCache
from epfleet.device.download import Transfer
from epfleet.errors import DiskFull, TransientStoreError
from epfleet.formats.manifest import ModelEntry
from epfleet.fsutil import NO_SPACE, free_bytes
from epfleet.stores import Store
from epfleet.text import MB


class Fetcher:
    def __init__(
        self, store: Store, cache: DeviceCache, offline: bool, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.store = store
        self.clock = clock
        self.cache = cache
        self.offline = offline
        """The manifest fetch found the store unreachable: steps needing it fail at once."""
        self.moved = 0
        """Bytes downloaded so far by this sync, failed attempts included."""

    def require_store(self) -> None:
        """Each step checks this where it first needs the store, after what the cache alone
        can do (a rollback, an already active fallback)."""
        if self.offline:
            raise TransientStoreError("the store is unreachable (offline)")

    def download(self, key: str, sha256: str, size: int, part: Path) -> int:
        """Download ``key`` into ``part`` (resumable, parallel ranged GETs) and verify size
        and sha256 (see ``epfleet.device.download``). Returns the bytes moved."""
        transfer = Transfer(self.store, key, sha256, size, part, self.clock)
        try:
            return transfer.run()
        finally:
            self.moved += transfer.moved

    def to_partial(self, key: str, sha256: str, size: int) -> tuple[Path, int]:
        """Download into the cache's partial file for ``sha256`` (resuming what an earlier
        sync left there); the file and the bytes moved."""
        part = self.cache.partial(sha256)
        with self.cache.room_lock:
            try:
                self.cache.make_room(max(0, size - self.cache.held(part)), part.parent, key)
            except DiskFull:
                self.cache.drop_partial(part)
                raise
            self.cache.in_use.add(part)
        try:
            return part, self.download(key, sha256, size, part)
        except OSError as exc:
            if exc.errno not in NO_SPACE:
                raise
            self.cache.drop_partial(part)
            raise DiskFull(
                f"ran out of disk space downloading {key} ({size / MB:.2f} MB): "
                f"{free_bytes(part.parent) / MB:.1f} MB free in {part.parent} once its "
                "partial download was removed"
            ) from None

    def golden(self, entry: ModelEntry) -> Path | None:
        """The model's golden samples in the cache, downloaded and verified once."""
        samples = entry.samples
        if samples is None:
            return None
        path = self.cache.samples_file(samples.sha256)
        if self.cache.verified(path, samples.sha256, samples.size):
            return path
        self.require_store()
        part, _ = self.to_partial(samples.uri, samples.sha256, samples.size)
        os.replace(part, self.cache.samples_file(samples.sha256))
        self.cache.in_use.discard(part)
        return path
