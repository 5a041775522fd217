"""Reading a store's signed metadata: the root chain and the state its timestamp names.

Versioned metadata files are written once, so they are cached by key (per store and
repository); only ``timestamp.json`` is read fresh every time.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tuf.api.metadata import Metadata, Root, Snapshot, SuccinctRoles, Targets, Timestamp
from tuf.api.serialization import DeserializationError

from epfleet.errors import BadInputError, StoreError
from epfleet.hashing import sha256_bytes
from epfleet.stores import Store
from epfleet.trust.layout import FIRST_ROOT_KEY, TIMESTAMP_KEY, metadata_key


def has_trust(store: Store) -> bool:
    """Whether the store has signed metadata (``trust init`` ran on it)."""
    return store.size(FIRST_ROOT_KEY) is not None


_immutable: dict[tuple[str, str, str], Metadata[Any]] = {}
"""Versioned metadata files, by (store, first root's hash, key): a store wiped and given a
new repository at the same place has another first root, so nothing stale is reused."""
_immutable_lock = threading.Lock()
CACHE_ENTRIES = 8192


def parse_metadata(store: Store, key: str, data: bytes) -> Metadata[Any]:
    try:
        return Metadata.from_bytes(data)
    except DeserializationError as exc:
        raise StoreError(f"{store.uri}/{key} is not TUF metadata: {exc}") from None


def load_versioned(
    store: Store, repository: str, key: str, length: int | None = None
) -> Metadata[Any]:
    """A versioned metadata file of ``repository`` (the hash of its first root): written
    once, so cached by key; StoreError if missing. With its signed ``length`` (the
    snapshot's record of a bin) it is read as that many bytes, no further."""
    with _immutable_lock:
        found = _immutable.get((store.uri, repository, key))
    if found is not None:
        return found
    missing = StoreError(
        f"{store.uri}/{key} is missing: the signed metadata refers to it; the "
        "repository is damaged (restore it from a backup, or trust init a new one)"
    )
    if length is None:
        read = store.read(key)
        if read is None:
            raise missing
        data = read.data
    else:
        if store.size(key) is None:
            raise missing
        data = b"".join(store.read_range(key, 0, length + 1))
        if len(data) != length:
            raise StoreError(
                f"{store.uri}/{key} is {len(data)} bytes, not the {length} the snapshot "
                "signed; the repository is damaged"
            )
    metadata = parse_metadata(store, key, data)
    with _immutable_lock:
        if len(_immutable) >= CACHE_ENTRIES:
            _immutable.clear()
        _immutable[(store.uri, repository, key)] = metadata
    return metadata


def _first_root(store: Store) -> tuple[Metadata[Root], str]:
    found = store.read(FIRST_ROOT_KEY)
    if found is None:
        raise BadInputError(
            f"{store.uri} has no trust metadata ({FIRST_ROOT_KEY}); create it with "
            "epfleet trust init"
        )
    return parse_metadata(store, FIRST_ROOT_KEY, found.data), sha256_bytes(found.data)


def latest_root_and_repository(store: Store) -> tuple[Metadata[Root], str]:
    root, repository = _first_root(store)
    while True:
        key = metadata_key("root", root.signed.version + 1)
        if store.size(key) is None:
            return root, repository
        following: Metadata[Root] = load_versioned(store, repository, key)
        if following.signed.version != root.signed.version + 1:
            raise StoreError(
                f"{store.uri}/{key} holds root version {following.signed.version}, not "
                f"{root.signed.version + 1}: the root chain is damaged (devices refuse it); "
                "restore that file from a backup"
            )
        root = following


def latest_root(store: Store) -> Metadata[Root]:
    """The newest root version in the store (walking ``<v>.root.json`` from 1)."""
    return latest_root_and_repository(store)[0]


@dataclass
class RepositoryState:
    """The signed metadata as the store's timestamp says (no timestamp yet: only root and
    targets version 1, as ``init_repository`` leaves them before its first publish)."""

    root: Metadata[Root]
    targets: Metadata[Targets]
    snapshot: Metadata[Snapshot] | None
    timestamp: Metadata[Timestamp] | None
    timestamp_etag: str | None
    bins: dict[str, Targets] = field(default_factory=dict)

    @property
    def succinct(self) -> SuccinctRoles:
        delegations = self.targets.signed.delegations
        if delegations is None or delegations.succinct_roles is None:
            raise StoreError("the signed targets role delegates to no hashed bins")
        return delegations.succinct_roles


def read_state(store: Store) -> RepositoryState:
    root, repository = latest_root_and_repository(store)
    found = store.read(TIMESTAMP_KEY)
    if found is None:
        targets: Metadata[Targets] = load_versioned(store, repository, metadata_key("targets", 1))
        return RepositoryState(root, targets, None, None, None)
    timestamp: Metadata[Timestamp] = parse_metadata(store, TIMESTAMP_KEY, found.data)
    snapshot: Metadata[Snapshot] = load_versioned(
        store, repository, metadata_key("snapshot", timestamp.signed.snapshot_meta.version)
    )
    meta = snapshot.signed.meta
    targets = load_versioned(
        store, repository, metadata_key("targets", meta["targets.json"].version)
    )
    state = RepositoryState(root, targets, snapshot, timestamp, found.etag)
    names = [n for n in state.succinct.get_roles() if f"{n}.json" in meta]
    files = [(metadata_key(n, meta[f"{n}.json"].version), meta[f"{n}.json"].length) for n in names]
    with ThreadPoolExecutor(max_workers=8) as pool:
        loaded = list(pool.map(lambda file: load_versioned(store, repository, *file), files))
    state.bins = {name: md.signed for name, md in zip(names, loaded, strict=True)}
    return state


@dataclass(frozen=True)
class RoleStatus:
    role: str
    version: int
    expires: datetime


def status(store: Store) -> tuple[list[RoleStatus], int]:
    """Each role's signed version and expiry (bins: the one expiring first), and the
    number of bins."""
    state = read_state(store)
    rows = [
        RoleStatus("root", state.root.signed.version, state.root.signed.expires),
        RoleStatus("targets", state.targets.signed.version, state.targets.signed.expires),
    ]
    if state.snapshot is not None and state.timestamp is not None:
        rows.append(
            RoleStatus("snapshot", state.snapshot.signed.version, state.snapshot.signed.expires)
        )
        rows.append(
            RoleStatus("timestamp", state.timestamp.signed.version, state.timestamp.signed.expires)
        )
    if state.bins:
        first = min(state.bins.items(), key=lambda item: item[1].expires)
        rows.append(
            RoleStatus(f"bins (first to expire: {first[0]})", first[1].version, first[1].expires)
        )
    return rows, state.succinct.number_of_bins
