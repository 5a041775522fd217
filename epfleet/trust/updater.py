"""ngclient's Updater as a device runs it: epfleet's own writes, held to a high-water mark.

``open_updater`` gives python-tuf's ``Updater`` over a store (``StoreFetcher``) and a
trust directory of the device cache. Its files are written as epfleet writes the cache
(atomic, never through a link, readable as the umask says; a write that fails is the
cache's ``CacheNotWritable`` or ``DiskFull``), and each refresh is held to the device's
high-water mark of the repository (``epfleet.trust.highwater``): a root chain that forks
from the roots the device recorded (``ForkedRoot``), or a root, timestamp or snapshot
older than the mark (``BelowHighWater``), is refused before it is written. Its files are
loaded by ``load_verified``: ngclient's load with the canonical JSON of what is signed
made once, in C (a device decides on 20 models of a 1,000-model fleet from ~19 bins).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from securesystemslib.signer import Signature
from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import Metadata, Root, T, Targets
from tuf.ngclient import Updater, UpdaterConfig
from tuf.ngclient._internal.trusted_metadata_set import _load_from_metadata

from epfleet.disk import cannot_write
from epfleet.fsutil import atomic_write_bytes
from epfleet.trust.directory import ROOT_HISTORY, TARGETS_DIR, read_file, signed_version
from epfleet.trust.fetcher import STORE_URL, StoreFetcher
from epfleet.trust.highwater import Lineage, TrustMark, below, lineage
from epfleet.trust.layout import METADATA_KEYS, TARGETS_KEYS
from epfleet.trust.roots import signed_sha256


class BelowHighWater(tuf_errors.BadVersionNumberError):
    """Signed metadata older than the device's high-water mark of the repository."""


class ForkedRoot(tuf_errors.RepositoryError):
    """A root version that is not the one the device verified before (same repository)."""


class HeldUpdater(Updater):
    """ngclient's Updater writing its metadata as epfleet writes the device cache's files
    (atomic, never through a link, readable as the umask says: ngclient's own temporary
    files are 0600, and another user running the package reads the cache), and holding
    every refresh to the device's high-water mark ``mark`` of the repository."""

    def __init__(self, *args: Any, mark: TrustMark | None, state_file: Path, **kwargs: Any):
        self.mark = mark
        self.state_file = state_file
        self.lineage: Lineage = "same"
        self.chain: dict[int, str] = {}
        """Root version -> sha256 of its signed part, for every root this refresh verified."""
        self._started = False
        super().__init__(*args, **kwargs)
        if self._trusted_set._load_data is _load_from_metadata:  # the envelope ngclient reads
            self._trusted_set._load_data = load_verified
        self._started = True
        self.started_from = self._trusted_set.root.version
        self.chain = self._root_chain()
        self._judge_roots()

    def refresh(self) -> None:
        """ngclient's refresh (root, timestamp, snapshot, targets), held to the mark: the
        root chain must be the repository's the device trusted, and no role older."""
        self._load_root()
        self.chain = self._root_chain()
        self._judge_roots()
        self._refuse_below("root", self._trusted_set.root.version)
        self._load_timestamp()
        self._load_snapshot()
        self._load_targets(Targets.type, Root.type)
        # a cached timestamp or snapshot older than the mark is loaded, not written again
        self._refuse_below("timestamp", self._trusted_set.timestamp.version)
        self._refuse_below("snapshot", self._trusted_set.snapshot.version)

    def _root_chain(self) -> dict[int, str]:
        chain = {}
        for version in range(self.started_from, self._trusted_set.root.version + 1):
            data = read_file(Path(self._dir, ROOT_HISTORY, f"{version}.root.json"))
            digest = signed_sha256(data) if data is not None else None
            if digest is not None:
                chain[version] = digest
        return chain

    def _judge_roots(self) -> None:
        if self.mark is None:
            return
        self.lineage = lineage(self.mark, self.chain)
        if self.lineage == "forked":
            raise ForkedRoot(self._forked())

    def _forked(self) -> str:
        return (
            "the store's root chain differs from the one this device verified before (the "
            f"sha256 recorded in {self.state_file}): a root signed by keys the repository "
            "retired"
        )

    def _refuse_below(self, role: str, version: int) -> None:
        if self.mark is None or self.lineage != "same":
            return
        older = below(self.mark, role, version)
        if older is not None:
            raise BelowHighWater(
                f"the store serves {older} (recorded in {self.state_file}); if the trust "
                f"cache {self._dir} was lost, the store serves older metadata than it had"
            )

    def _persist_file(self, filename: str, data: bytes) -> None:
        path = Path(filename)
        if path.parent == Path(self._dir) and path.name in ("timestamp.json", "snapshot.json"):
            self._refuse_below(path.stem, signed_version(data) or 0)  # never written
        if path.parent.name == ROOT_HISTORY and self._started and self._forks(data):
            raise ForkedRoot(self._forked())  # a root the store serves: never written
        if read_file(path) == data:  # ngclient saves the trusted root on every start
            return
        with _cannot_write(path):
            atomic_write_bytes(path, data)

    def _forks(self, data: bytes) -> bool:
        """A root from the store, of a version the mark records, is not the one recorded
        (the mark applying: the refresh started from a root the device trusted)."""
        if self.mark is None or self.lineage != "same":
            return False
        recorded = self.mark.roots.get(signed_version(data) or 0)
        return recorded is not None and recorded != signed_sha256(data)

    def _update_root_symlink(self) -> None:
        # ngclient points root.json at the trusted root's file in root_history on every
        # start; leave a link that already does (a read-only cache verifies all the same)
        link = Path(self._dir, "root.json")
        current = os.path.join(ROOT_HISTORY, f"{self._trusted_set.root.version}.root.json")
        with contextlib.suppress(OSError):
            if os.readlink(link) == current:
                return
        with _cannot_write(link):
            super()._update_root_symlink()


def load_verified(
    role: type[T],
    data: bytes,
    delegator: Root | Targets | None = None,
    role_name: str | None = None,
) -> tuple[T, bytes, dict[str, Signature]]:
    """ngclient's load of a metadata file (``_load_from_metadata``: parse, check the type,
    verify the signatures with the delegator's keys), with the signed part's canonical
    JSON made once, by the C JSON encoder, instead of twice by securesystemslib's pure
    Python one: two thirds of the time a device spends loading a bin.

    The two encoders give the same bytes unless a string holds a control character (the
    C encoder escapes it, canonical JSON does not): when the fast bytes do not verify, the
    canonical ones are tried. Either way the signature is checked over an injective
    encoding of the parsed document, so nothing verifies that the keys did not sign."""
    md = Metadata[T].from_bytes(data)
    if md.signed.type != role.type:
        raise tuf_errors.RepositoryError(f"Expected '{role.type}', got '{md.signed.type}'")
    if delegator is None:
        return md.signed, md.signed_bytes, md.signatures
    name = role_name or role.type
    fast = json.dumps(
        md.signed.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()
    try:
        delegator.verify_delegate(name, fast, md.signatures)
        return md.signed, fast, md.signatures
    except tuf_errors.UnsignedMetadataError:
        canonical = md.signed_bytes
        if canonical == fast:
            raise
    delegator.verify_delegate(name, canonical, md.signatures)
    return md.signed, canonical, md.signatures


@contextlib.contextmanager
def _cannot_write(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise cannot_write(path, exc) from None


def open_updater(
    fetcher: StoreFetcher, directory: Path, root: bytes, mark: TrustMark | None = None
) -> HeldUpdater:
    """ngclient's Updater over ``fetcher``'s store, its metadata in ``directory``, trusting
    ``root`` (and the newer roots it finds signed by it), held to the high-water ``mark``
    (the trust directory's is in the cache's state, ``.epfleet/state.json``)."""
    return HeldUpdater(
        str(directory),
        STORE_URL + METADATA_KEYS,
        str(directory / TARGETS_DIR),
        STORE_URL + TARGETS_KEYS,
        fetcher=fetcher,
        config=UpdaterConfig(),
        bootstrap=root,
        mark=mark,
        state_file=directory.parent.parent / "state.json",
    )
