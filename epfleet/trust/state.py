"""Reading a store's signed metadata: the root chain and the state its timestamp names, verified.

Everything read here is checked as a device would check it, so that whoever can write to
the store but holds no key cannot feed a publisher a state to sign: each root by the
previous one and by itself, timestamp and snapshot by the root's keys (the snapshot also
by the hash the timestamp signs), targets by the root, each bin by the keys the targets
role delegates to and at the version and length the snapshot signs, and the signed
manifest document (the ``manifest.json`` target) by the hash and length its bin signs.
Expiry is not checked: a publisher reads expired metadata in order to renew it.

The rules: a timestamp, snapshot, targets role or root chain that does not verify is a
``StoreError`` (nothing can be signed on top of it); a bin that does not verify is left
out of the state, so the next publish signs it again from the signed document; a signed
document that does not verify, or whose bin does not, is a ``StoreError``.

Versioned metadata files are written once, so they are cached by key (per store and
repository) once verified; only ``timestamp.json`` is read fresh every time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import (
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    SuccinctRoles,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization import DeserializationError

from epfleet.errors import BadInputError, StoreError, Unverified
from epfleet.formats.manifest import Manifest
from epfleet.hashing import sha256_bytes
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.trust.layout import FIRST_ROOT_KEY, TIMESTAMP_KEY, metadata_key, target_key


def has_trust(store: Store) -> bool:
    """Whether the store has signed metadata (``trust init`` ran on it)."""
    return store.size(FIRST_ROOT_KEY) is not None


_immutable: dict[tuple[str, str, str], Metadata[Any]] = {}
"""Verified versioned metadata files, by (store, first root's hash, key): a store wiped and
given a new repository at the same place has another first root, so nothing stale is
reused."""
_documents: dict[tuple[str, str], Manifest] = {}
"""Verified signed documents, by (store, sha256)."""
_immutable_lock = threading.Lock()
CACHE_ENTRIES = 8192
DOCUMENT_CACHE_ENTRIES = 4

Check = Callable[[bytes, Metadata[Any]], None]


def clear_cache() -> None:
    """Forget every verified file this process cached (what a new process starts with)."""
    with _immutable_lock:
        _immutable.clear()
        _documents.clear()


def parse_metadata(store: Store, key: str, data: bytes) -> Metadata[Any]:
    try:
        return Metadata.from_bytes(data)
    except DeserializationError as exc:
        raise Unverified(f"{store.uri}/{key} is not TUF metadata: {exc}") from None


def _verified(store: Store, key: str, check: Check, data: bytes) -> Metadata[Any]:
    metadata = parse_metadata(store, key, data)
    try:
        check(data, metadata)
    except (tuf_errors.RepositoryError, tuf_errors.LengthOrHashMismatchError, ValueError) as exc:
        raise Unverified(
            f"{store.uri}/{key} does not verify ({exc}): someone without the keys changed "
            "it, or it is damaged; nothing is signed on top of it"
        ) from None
    return metadata


def load_versioned(
    store: Store, repository: str, key: str, check: Check, length: int | None = None
) -> Metadata[Any]:
    """A versioned metadata file of ``repository`` (the hash of its first root), verified
    by ``check``: written once, so cached by key once verified. StoreError if missing,
    Unverified if it does not verify. With its signed ``length`` (the snapshot's record of
    a bin) it is read as that many bytes, no further."""
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
            raise Unverified(
                f"{store.uri}/{key} is {len(data)} bytes, not the {length} the snapshot "
                "signed; the repository is damaged or tampered with"
            )
    metadata = _verified(store, key, check, data)
    with _immutable_lock:
        if len(_immutable) >= CACHE_ENTRIES:
            _immutable.clear()
        _immutable[(store.uri, repository, key)] = metadata
    return metadata


def _signed_by(delegator: Metadata[Any], role: str, version: int | None = None) -> Check:
    """A check: signed by a threshold of the keys ``delegator`` names for ``role`` (and at
    ``version``, when given)."""

    def check(data: bytes, metadata: Metadata[Any]) -> None:
        delegator.verify_delegate(role, metadata)
        top_level = role in ("root", "timestamp", "snapshot", "targets")
        if metadata.signed.type != (role if top_level else "targets"):
            raise tuf_errors.RepositoryError(f"it is a {metadata.signed.type}, not {role}")
        if version is not None and metadata.signed.version != version:
            raise tuf_errors.BadVersionNumberError(
                f"it says version {metadata.signed.version}, the signed metadata {version}"
            )

    return check


def _first_root(store: Store) -> tuple[Metadata[Root], str]:
    found = store.read(FIRST_ROOT_KEY)
    if found is None:
        raise BadInputError(
            f"{store.uri} has no trust metadata ({FIRST_ROOT_KEY}); create it with "
            "epfleet trust init"
        )
    root = _verified(
        store, FIRST_ROOT_KEY, lambda _, md: md.verify_delegate("root", md), found.data
    )
    return root, sha256_bytes(found.data)


def root_chain(store: Store) -> tuple[list[Metadata[Root]], str]:
    """Every root version from 1 (each signed by the one before and by itself) and the
    repository's identity (the hash of its first root)."""
    first, repository = _first_root(store)
    chain = [first]
    while True:
        root = chain[-1]
        key = metadata_key("root", root.signed.version + 1)
        if store.size(key) is None:
            return chain, repository

        def check(data: bytes, following: Metadata[Any], root: Metadata[Root] = root) -> None:
            root.verify_delegate("root", following)
            following.verify_delegate("root", following)

        following: Metadata[Root] = load_versioned(store, repository, key, check)
        if following.signed.version != root.signed.version + 1:
            raise StoreError(
                f"{store.uri}/{key} holds root version {following.signed.version}, not "
                f"{root.signed.version + 1}: the root chain is damaged (devices refuse it); "
                "restore that file from a backup"
            )
        chain.append(following)


def latest_root_and_repository(store: Store) -> tuple[Metadata[Root], str]:
    chain, repository = root_chain(store)
    return chain[-1], repository


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
    """The bins that verify (one that does not is left out: the next publish signs it)."""
    refused: dict[str, str] = field(default_factory=dict)
    """Bins the snapshot names that do not verify, and why."""
    document: Manifest | None = None
    """The signed manifest document: every model's entry as last signed."""
    repository: str = ""
    """The repository's identity (the hash of its first root): what verified files are
    cached under (``load_versioned``)."""

    @property
    def succinct(self) -> SuccinctRoles:
        delegations = self.targets.signed.delegations
        if delegations is None or delegations.succinct_roles is None:
            raise StoreError("the signed targets role delegates to no hashed bins")
        return delegations.succinct_roles


def _online_root(
    store: Store, chain: list[Metadata[Root]], timestamp: Metadata[Any], rotating: bool
) -> Metadata[Root]:
    """The root whose keys signed ``timestamp``: the newest, or while an online-key rotation
    is finished (``rotating``), possibly the one before."""
    for root in chain[-2:][::-1] if rotating else chain[-1:]:
        try:
            _signed_by(root, "timestamp")(b"", timestamp)
            return root
        except tuf_errors.RepositoryError:
            continue
    if not rotating and len(chain) > 1 and _online_root(store, chain, timestamp, True):
        raise StoreError(
            f"{store.uri}/{TIMESTAMP_KEY} is signed by the online key of root version "
            f"{chain[-2].signed.version}, which root version {chain[-1].signed.version} "
            "replaced: an online-key rotation stopped half-way; finish it by running it again"
        )
    raise Unverified(
        f"{store.uri}/{TIMESTAMP_KEY} is not signed by the online key the root names: "
        "someone without the keys wrote it, or it is damaged; nothing is signed on top of "
        "it (restore it from a backup of the store)"
    )


def read_state(store: Store, *, rotating: bool = False) -> RepositoryState:
    """The verified signed state (see the module's rules). ``rotating``: an online-key
    rotation is under way, so timestamp and snapshot may be signed by the key of the root
    before the newest."""
    chain, repository = root_chain(store)
    root = chain[-1]
    found = store.read(TIMESTAMP_KEY)
    if found is None:
        targets: Metadata[Targets] = load_versioned(
            store, repository, metadata_key("targets", 1), _signed_by(root, "targets", 1)
        )
        return RepositoryState(root, targets, None, None, None, repository=repository)
    timestamp: Metadata[Timestamp] = parse_metadata(store, TIMESTAMP_KEY, found.data)
    signer_root = _online_root(store, chain, timestamp, rotating)
    snapshot_meta = timestamp.signed.snapshot_meta

    def snapshot_check(data: bytes, metadata: Metadata[Any]) -> None:
        snapshot_meta.verify_length_and_hashes(data)
        _signed_by(signer_root, "snapshot", snapshot_meta.version)(data, metadata)

    snapshot: Metadata[Snapshot] = load_versioned(
        store, repository, metadata_key("snapshot", snapshot_meta.version), snapshot_check
    )
    meta = snapshot.signed.meta
    targets_version = meta["targets.json"].version
    targets = load_versioned(
        store,
        repository,
        metadata_key("targets", targets_version),
        _signed_by(root, "targets", targets_version),
    )
    state = RepositoryState(root, targets, snapshot, timestamp, found.etag, repository=repository)
    _read_bins(store, repository, state, meta)
    state.document = _signed_document(store, state, meta)
    return state


def _read_bins(
    store: Store, repository: str, state: RepositoryState, meta: dict[str, MetaFile]
) -> None:
    names = [n for n in state.succinct.get_roles() if f"{n}.json" in meta]

    def load(name: str) -> Targets | str:
        signed = meta[f"{name}.json"]
        key = metadata_key(name, signed.version)
        check = _signed_by(state.targets, name, signed.version)
        try:
            return load_versioned(store, repository, key, check, signed.length).signed
        except Unverified as exc:
            return str(exc)

    with ThreadPoolExecutor(max_workers=8) as pool:
        loaded = list(pool.map(load, names))
    for name, bin_or_reason in zip(names, loaded, strict=True):
        if isinstance(bin_or_reason, Targets):
            state.bins[name] = bin_or_reason
        else:
            state.refused[name] = bin_or_reason


def _signed_document(
    store: Store, state: RepositoryState, meta: dict[str, MetaFile]
) -> Manifest | None:
    name = state.succinct.get_role_for_target(MANIFEST_KEY)
    if name in state.refused:
        raise Unverified(
            f"{state.refused[name]} (it signs the manifest document, so the signed state "
            "cannot be read; restore it from a backup of the store)"
        )
    info = state.bins[name].targets.get(MANIFEST_KEY) if name in state.bins else None
    if info is None:
        if f"{name}.json" in meta and name not in state.bins:
            raise StoreError(f"{store.uri}: the snapshot names {name} but it was not read")
        return None
    return read_document(store, info)


def read_document(store: Store, info: TargetFile) -> Manifest:
    """The signed manifest document ``info`` (its target in a verified bin) names, checked
    against its signed length and hash; cached by hash."""
    sha256 = info.hashes["sha256"]
    with _immutable_lock:
        cached = _documents.get((store.uri, sha256))
    if cached is not None:
        return cached
    key = target_key(info.path, sha256)
    if store.size(key) is None:
        raise StoreError(
            f"{store.uri}/{key} is missing: it is the signed manifest document; restore it "
            "from a backup of the store"
        )
    data = b"".join(store.read_range(key, 0, info.length + 1))
    try:
        info.verify_length_and_hashes(data)
    except tuf_errors.LengthOrHashMismatchError as exc:
        raise Unverified(
            f"{store.uri}/{key} is not the signed manifest document ({exc}): tampered or "
            "damaged; restore it from a backup of the store"
        ) from None
    try:
        document = Manifest.from_json(data, newer_minor="ignore")  # writers check its version
    except ValidationError as exc:
        raise StoreError(
            f"{store.uri}/{key}: the signed manifest document fails validation: "
            f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from None
    remember_document(store, sha256, document)
    return document


def remember_document(store: Store, sha256: str, document: Manifest) -> None:
    """Cache ``document``, the signed manifest whose bytes hash to ``sha256`` (a publisher
    that just signed it need not read it back). Readers share cached documents: they must
    not change them."""
    with _immutable_lock:
        if len(_documents) >= DOCUMENT_CACHE_ENTRIES:
            _documents.clear()
        _documents[(store.uri, sha256)] = document


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
