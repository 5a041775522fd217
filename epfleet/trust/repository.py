"""The publishing side of signed distribution: TUF metadata derived from the store's
``manifest.json`` (layout, roles and expiries in ``epfleet.trust``).

Pure parts: ``model_targets`` (one target per model, its ok variants in the signed custom
field ``epfleet``, plus the ``manifest.json`` target) and ``plan_bins`` (which bins a
manifest changes). I/O parts against a ``Store``: ``init_repository``, ``publish_trust``
(re-signs only the bins whose targets changed, then snapshot and timestamp), ``refresh``
(re-signs timestamp and snapshot, and the bins near expiry), ``rotate_online_key`` and
``rotate_root_keys``.

Compare-and-swap: versioned files are written once (``if_none_match``; a version taken by
another publisher or left by a crashed one is skipped), then ``timestamp.json`` is
replaced with ``if_match``; a publisher that loses re-reads everything and signs again.
The signed state is always derived from the ``manifest.json`` read *after* the timestamp
it replaces, so the last publisher to win signs a manifest at least as new as every
manifest whose publisher lost: racing publishers lose nothing, and a crash between
writing ``manifest.json`` and its metadata is repaired by the next publish or refresh.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError
from securesystemslib.signer import Key, Signer
from tuf.api.metadata import (
    Delegations,
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
from tuf.api.serialization.json import JSONSerializer

from epfleet.errors import BadInputError, PreconditionFailed, StoreError
from epfleet.fsutil import atomic_write_bytes
from epfleet.hashing import sha256_bytes
from epfleet.manifest import Manifest
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.stores.local import local_path
from epfleet.trust.keys import (
    ONLINE_KEY,
    OfflineKeys,
    generate_offline,
    generate_online_file,
    online_signer,
    public_key_of,
)

METADATA_KEYS = "trust/metadata/"
TARGETS_KEYS = "trust/targets/"
TIMESTAMP_KEY = METADATA_KEYS + "timestamp.json"
FIRST_ROOT_KEY = METADATA_KEYS + "1.root.json"
CUSTOM_FIELD = "epfleet"
BIN_PREFIX = "bin"
DEFAULT_BINS = 256
LIFETIME = {
    "root": timedelta(days=365),
    "targets": timedelta(days=365),
    "snapshot": timedelta(days=7),
    "bin": timedelta(days=7),
    "timestamp": timedelta(days=1),
}
"""How long each role's signature is good for. A role is re-signed by the next publish or
refresh once less than half of its lifetime is left."""
OFFLINE_RENEWAL = timedelta(days=30)
ATTEMPTS = 20
VERSION_SKIPS = 100
"""How many taken versions of one file a publisher skips before giving up."""
SERIALIZER = JSONSerializer(compact=True)

logger = logging.getLogger(__name__)
AnySigned = TypeVar("AnySigned", Root, Targets, Snapshot, Timestamp)


def utcnow() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def metadata_key(role: str, version: int | None = None) -> str:
    """``trust/metadata/<version>.<role>.json``, or ``timestamp.json`` (no version)."""
    return (
        f"{METADATA_KEYS}{role}.json"
        if version is None
        else f"{METADATA_KEYS}{version}.{role}.json"
    )


def target_key(path: str, sha256: str) -> str:
    """Where a target's file is stored: consistent snapshots prefix its name with its hash."""
    folder, _, name = path.rpartition("/")
    return f"{TARGETS_KEYS}{folder + '/' if folder else ''}{sha256}.{name}"


def has_trust(store: Store) -> bool:
    """Whether the store has signed metadata (``trust init`` ran on it)."""
    return store.size(FIRST_ROOT_KEY) is not None


# --- pure: what the signed metadata says for a manifest ------------------------------------


@dataclass(frozen=True)
class Target:
    info: TargetFile
    data: bytes


def model_targets(manifest_json: bytes) -> dict[str, Target]:
    """The targets ``manifest_json`` (the store's manifest.json, as stored) signs: one per
    model, ``models/<name>``, whose file and custom field ``epfleet`` are the model's entry
    with only its ok variants, as canonical JSON text (canonical JSON has no floats, so
    the custom field carries the text); and ``manifest.json`` itself."""
    document = json.loads(manifest_json)
    targets = {}
    for name, entry in document.get("models", {}).items():
        variants = entry.get("variants", {})
        ok = {t: v for t, v in variants.items() if v.get("status") == "ok"}
        data = canonical({**entry, "variants": ok})
        info = TargetFile.from_data(f"models/{name}", data, ["sha256"])
        info.unrecognized_fields["custom"] = {CUSTOM_FIELD: data.decode()}
        targets[info.path] = Target(info, data)
    whole = TargetFile.from_data(MANIFEST_KEY, manifest_json, ["sha256"])
    targets[MANIFEST_KEY] = Target(whole, manifest_json)
    return targets


def stale(expires: datetime, lifetime: timedelta, now: datetime) -> bool:
    """Less than half of the signature's lifetime is left."""
    return expires - now < lifetime / 2


def plan_bins(
    succinct: SuccinctRoles,
    current: dict[str, Targets],
    targets: dict[str, Target],
    now: datetime,
    *,
    every_bin: bool = False,
) -> dict[str, dict[str, Target]]:
    """The bins to sign again and their targets: those whose targets differ from what is
    signed (or that are missing), that are stale, or all of them with ``every_bin``."""
    grouped: dict[str, dict[str, Target]] = {name: {} for name in succinct.get_roles()}
    for path, target in targets.items():
        grouped[succinct.get_role_for_target(path)][path] = target
    changed = {}
    for name, wanted in grouped.items():
        signed = current.get(name)
        if (
            every_bin
            or signed is None
            or signed.targets != {p: t.info for p, t in wanted.items()}
            or stale(signed.expires, LIFETIME["bin"], now)
        ):
            changed[name] = wanted
    return changed


# --- reading the repository --------------------------------------------------------------


_immutable: dict[tuple[str, str, str], Metadata[Any]] = {}
"""Versioned metadata files, by (store, first root's hash, key): a store wiped and given a
new repository at the same place has another first root, so nothing stale is reused."""
_immutable_lock = threading.Lock()
CACHE_ENTRIES = 8192


def _parse(store: Store, key: str, data: bytes) -> Metadata[Any]:
    try:
        return Metadata.from_bytes(data)
    except DeserializationError as exc:
        raise StoreError(f"{store.uri}/{key} is not TUF metadata: {exc}") from None


def _load(store: Store, repository: str, key: str, length: int | None = None) -> Metadata[Any]:
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
    metadata = _parse(store, key, data)
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
    return _parse(store, FIRST_ROOT_KEY, found.data), sha256_bytes(found.data)


def _latest_root(store: Store) -> tuple[Metadata[Root], str]:
    root, repository = _first_root(store)
    while True:
        key = metadata_key("root", root.signed.version + 1)
        if store.size(key) is None:
            return root, repository
        following: Metadata[Root] = _load(store, repository, key)
        if following.signed.version != root.signed.version + 1:
            raise StoreError(
                f"{store.uri}/{key} holds root version {following.signed.version}, not "
                f"{root.signed.version + 1}: the root chain is damaged (devices refuse it); "
                "restore that file from a backup"
            )
        root = following


def latest_root(store: Store) -> Metadata[Root]:
    """The newest root version in the store (walking ``<v>.root.json`` from 1)."""
    return _latest_root(store)[0]


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
    root, repository = _latest_root(store)
    found = store.read(TIMESTAMP_KEY)
    if found is None:
        targets: Metadata[Targets] = _load(store, repository, metadata_key("targets", 1))
        return RepositoryState(root, targets, None, None, None)
    timestamp: Metadata[Timestamp] = _parse(store, TIMESTAMP_KEY, found.data)
    snapshot: Metadata[Snapshot] = _load(
        store, repository, metadata_key("snapshot", timestamp.signed.snapshot_meta.version)
    )
    meta = snapshot.signed.meta
    targets = _load(store, repository, metadata_key("targets", meta["targets.json"].version))
    state = RepositoryState(root, targets, snapshot, timestamp, found.etag)
    names = [n for n in state.succinct.get_roles() if f"{n}.json" in meta]
    files = [(metadata_key(n, meta[f"{n}.json"].version), meta[f"{n}.json"].length) for n in names]
    with ThreadPoolExecutor(max_workers=8) as pool:
        loaded = list(pool.map(lambda file: _load(store, repository, *file), files))
    state.bins = {name: md.signed for name, md in zip(names, loaded, strict=True)}
    return state


# --- writing -------------------------------------------------------------------------------


def _signed(signed: AnySigned, signers: Iterable[Signer]) -> bytes:
    metadata = Metadata(signed)
    for signer in signers:
        metadata.sign(signer, append=True)
    return metadata.to_bytes(SERIALIZER)


def _write_versioned(
    store: Store, role: str, signed: AnySigned, signers: Sequence[Signer]
) -> bytes:
    """Sign and write ``<version>.<role>.json`` once, at ``signed.version`` or the first
    later version no one has taken (another publisher's, or one a crash left behind)."""
    for _ in range(VERSION_SKIPS):
        raw = _signed(signed, signers)
        try:
            store.write(metadata_key(role, signed.version), raw, if_none_match=True)
            return raw
        except PreconditionFailed:
            signed.version += 1
    raise StoreError(
        f"{store.uri}/{metadata_key(role, signed.version)}: {VERSION_SKIPS} versions of "
        f"{role} after the signed one are taken; is another publisher stuck?"
    )


def _write_target(store: Store, target: Target) -> None:
    key = target_key(target.info.path, target.info.hashes["sha256"])
    if store.size(key) == target.info.length:
        return
    # Named by its hash: a racing publisher writes the same bytes, so no condition is needed.
    store.write(key, target.data)


@dataclass(frozen=True)
class TrustPublished:
    """What ``publish_trust`` or ``refresh`` did."""

    version: int
    """The signed timestamp's version now."""
    written: bool
    """Whether new metadata was signed (False: it already signed this manifest)."""
    bins: list[str]
    """The bins signed again."""


@dataclass
class _Changes:
    targets: bytes | None = None
    """A new targets role's signed bytes, already written (online-key rotation)."""
    every_bin: bool = False
    renew: bool = False
    """Sign snapshot and timestamp again even when nothing else changed (refresh)."""


def _check_online_key(store: Store, state: RepositoryState, signer: Signer) -> None:
    keyid = signer.public_key.keyid
    roles = state.root.signed.roles
    bins = state.succinct.keyids
    if keyid not in roles["timestamp"].keyids or keyid not in bins:
        raise BadInputError(
            f"EPFLEET_TRUST_SIGNER's key {keyid[:12]} is not the online key of "
            f"{store.uri}/trust (root version {state.root.signed.version}); was it rotated? (a "
            "rotation that stopped half-way is finished by running it again)"
        )


def _manifest(store: Store) -> bytes | None:
    found = store.read(MANIFEST_KEY)
    if found is None:
        return None
    try:
        Manifest.from_json(found.data)
    except ValidationError as exc:
        raise StoreError(
            f"{store.uri}/{MANIFEST_KEY} fails validation, refusing to publish over it or sign it: "
            f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from None
    return found.data


def _publish_once(
    store: Store, state: RepositoryState, signer: Signer, now: datetime, changes: _Changes
) -> TrustPublished | None:
    """One attempt; None when another publisher replaced the timestamp first."""
    manifest = _manifest(store)  # read after the timestamp it is to replace
    targets_md = state.targets
    wanted = model_targets(manifest) if manifest is not None else {}
    bins = plan_bins(state.succinct, state.bins, wanted, now, every_bin=changes.every_bin)
    snapshot, timestamp = state.snapshot, state.timestamp
    due = (
        snapshot is None
        or timestamp is None
        or changes.renew
        or changes.targets is not None
        or stale(snapshot.signed.expires, LIFETIME["snapshot"], now)
        or stale(timestamp.signed.expires, LIFETIME["timestamp"], now)
    )
    if not bins and not due:
        assert timestamp is not None
        return TrustPublished(timestamp.signed.version, written=False, bins=[])
    meta = dict(snapshot.signed.meta) if snapshot is not None else {}
    for name, wanted_here in bins.items():
        for target in wanted_here.values():
            _write_target(store, target)
        previous = meta.get(f"{name}.json")
        signed_bin = Targets(
            version=previous.version + 1 if previous else 1,
            expires=now + LIFETIME["bin"],
            targets={path: t.info for path, t in wanted_here.items()},
        )
        raw = _write_versioned(store, name, signed_bin, [signer])
        meta[f"{name}.json"] = MetaFile(signed_bin.version, length=len(raw))
    if changes.targets is not None:
        meta["targets.json"] = MetaFile(targets_md.signed.version, length=len(changes.targets))
    elif "targets.json" not in meta:
        raw_targets = store.read(metadata_key("targets", targets_md.signed.version))
        meta["targets.json"] = MetaFile(
            targets_md.signed.version, length=len(raw_targets.data) if raw_targets else None
        )
    new_snapshot = Snapshot(
        version=snapshot.signed.version + 1 if snapshot else 1,
        expires=now + LIFETIME["snapshot"],
        meta=meta,
    )
    raw_snapshot = _write_versioned(store, "snapshot", new_snapshot, [signer])
    new_timestamp = Timestamp(
        version=timestamp.signed.version + 1 if timestamp else 1,
        expires=now + LIFETIME["timestamp"],
        snapshot_meta=MetaFile.from_data(new_snapshot.version, raw_snapshot, ["sha256"]),
    )
    raw_timestamp = _signed(new_timestamp, [signer])
    try:
        if state.timestamp_etag is None:
            store.write(TIMESTAMP_KEY, raw_timestamp, if_none_match=True)
        else:
            store.write(TIMESTAMP_KEY, raw_timestamp, if_match=state.timestamp_etag)
    except PreconditionFailed:
        return None
    return TrustPublished(new_timestamp.version, written=True, bins=sorted(bins))


def _publish(
    store: Store, signer: Signer, now: datetime | None, changes: _Changes
) -> TrustPublished:
    for attempt in range(ATTEMPTS):
        state = read_state(store)
        if changes.targets is not None:  # a new targets role, not in the snapshot yet
            state.targets = Metadata.from_bytes(changes.targets)
        _check_online_key(store, state, signer)
        done = _publish_once(store, state, signer, now or utcnow(), changes)
        if done is not None:
            return done
        time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
    raise StoreError(
        f"could not publish the signed metadata of {store.uri}: lost the race for "
        f"{TIMESTAMP_KEY} {ATTEMPTS} times"
    )


def publish_trust(store: Store, online: Signer, *, now: datetime | None = None) -> TrustPublished:
    """Sign the store's current manifest.json: the bins whose targets changed (or that are
    stale), then snapshot and timestamp; nothing when it is signed already."""
    return _publish(store, online, now, _Changes())


def refresh(store: Store, online: Signer, *, now: datetime | None = None) -> TrustPublished:
    """Sign timestamp and snapshot again (and the stale bins, and any the manifest
    changed), so that devices never see expired metadata while publishing is quiet.
    Warns when root or targets, which only the offline keys sign, expire within 30 days."""
    done = _publish(store, online, now, _Changes(renew=True))
    state = read_state(store)
    for role, signed in (("root", state.root.signed), ("targets", state.targets.signed)):
        if signed.expires - (now or utcnow()) < OFFLINE_RENEWAL:
            logger.warning(
                "%s: the signed %s role expires on %s and only the offline keys sign it: "
                "renew it with epfleet trust rotate --keys DIR (--root, or --online-signer "
                "with the current online key)",
                store.uri,
                role,
                f"{signed.expires:%Y-%m-%d}",
            )
    return done


# --- creating and rotating -----------------------------------------------------------------


def bin_bits(bins: int) -> int:
    if bins < 2 or bins > 2**16 or bins & (bins - 1):
        raise BadInputError(f"--bins {bins}: must be a power of two from 2 to 65536")
    return bins.bit_length() - 1


def _delegating_targets(version: int, online: Key, bits: int, now: datetime) -> Targets:
    succinct = SuccinctRoles([online.keyid], 1, bits, BIN_PREFIX)
    return Targets(
        version=version,
        expires=now + LIFETIME["targets"],
        delegations=Delegations(keys={online.keyid: online}, succinct_roles=succinct),
    )


def init_repository(
    store: Store,
    offline: OfflineKeys,
    online: Signer,
    *,
    root_threshold: int = 2,
    bins: int = DEFAULT_BINS,
    now: datetime | None = None,
) -> bytes:
    """Create the signed metadata of ``store`` and sign its manifest.json (if any).
    Returns the root metadata (``1.root.json``) devices are provisioned with."""
    now = now or utcnow()
    bits = bin_bits(bins)
    if not 1 <= root_threshold <= len(offline.root):
        raise BadInputError(
            f"--root-threshold {root_threshold}: must be from 1 to the number of root keys "
            f"({len(offline.root)})"
        )
    if has_trust(store):
        raise BadInputError(
            f"{store.uri} already has trust metadata ({FIRST_ROOT_KEY}); rotate its keys "
            "with epfleet trust rotate instead"
        )
    root = Root(expires=now + LIFETIME["root"], consistent_snapshot=True)
    for signer in offline.root:
        root.add_key(signer.public_key, "root")
    root.roles["root"].threshold = root_threshold
    root.add_key(offline.targets.public_key, "targets")
    for role in ("snapshot", "timestamp"):
        root.add_key(online.public_key, role)
    targets = _delegating_targets(1, online.public_key, bits, now)
    try:
        store.write(
            metadata_key("targets", 1), _signed(targets, [offline.targets]), if_none_match=True
        )
    except PreconditionFailed:
        raise BadInputError(
            f"{store.uri}/{metadata_key('targets', 1)} already exists: a trust init ran "
            "there before (and stopped); remove the store's trust/ folder to start again"
        ) from None
    raw_root = _signed(root, offline.root)
    store.write(FIRST_ROOT_KEY, raw_root, if_none_match=True)
    publish_trust(store, online, now=now)
    return raw_root


def _new_root(store: Store) -> Metadata[Root]:
    current = latest_root(store)
    signed = Metadata.from_bytes(current.to_bytes(SERIALIZER)).signed
    signed.version += 1
    signed.expires = utcnow() + LIFETIME["root"]
    return Metadata(signed)


def check_offline_keys(store: Store, offline: OfflineKeys, *, targets: bool = False) -> None:
    """BadInputError unless ``offline`` holds a threshold of the store's current root keys
    (and, with ``targets``, its targets key): a rotation signed otherwise would be a root
    no device follows."""
    root = latest_root(store).signed
    role = root.roles["root"]
    held = {s.public_key.keyid for s in offline.root} & set(role.keyids)
    if len(held) < role.threshold:
        raise BadInputError(
            f"--keys {offline.directory} holds {len(held)} of the root keys of {store.uri} "
            f"(root version {root.version} needs {role.threshold}); is it this store's "
            "offline key directory?"
        )
    if targets and offline.targets.public_key.keyid not in root.roles["targets"].keyids:
        raise BadInputError(
            f"--keys {offline.directory}: its targets.pem is not the targets key of {store.uri}"
        )


def _write_root(store: Store, root: Root, signers: Sequence[Signer]) -> bytes:
    raw = _signed(root, signers)
    try:
        store.write(metadata_key("root", root.version), raw, if_none_match=True)
    except PreconditionFailed:
        raise StoreError(
            f"{store.uri}/{metadata_key('root', root.version)} appeared meanwhile: another "
            "rotation ran; check epfleet trust status and rotate again"
        ) from None
    return raw


def rotate_online_key(
    store: Store, offline: OfflineKeys, new_online: Signer, *, now: datetime | None = None
) -> TrustPublished:
    """Replace the online key: a new root (signed by the root keys) names it for snapshot
    and timestamp, a new targets role delegates the bins to it, and every bin, the
    snapshot and the timestamp are signed again with it. Devices follow the new root."""
    check_offline_keys(store, offline, targets=True)
    root = _new_root(store)
    keyid = new_online.public_key.keyid
    # A root that names the key already: a rotation to it stopped after writing its root
    # (devices refuse the old key's timestamp from then on), or the key is the current one
    # and only targets is renewed. Either way no new root; targets and the rest follow.
    if any(root.signed.roles[role].keyids != [keyid] for role in ("snapshot", "timestamp")):
        for role in ("snapshot", "timestamp"):
            for old in list(root.signed.roles[role].keyids):
                root.signed.revoke_key(old, role)
            root.signed.add_key(new_online.public_key, role)
        _write_root(store, root.signed, offline.root)
    state = read_state(store)
    bits = state.succinct.bit_length
    targets = _delegating_targets(
        state.targets.signed.version + 1, new_online.public_key, bits, now or utcnow()
    )
    raw_targets = _write_versioned(store, "targets", targets, [offline.targets])
    return _publish(
        store, new_online, now, _Changes(targets=raw_targets, every_bin=True, renew=True)
    )


def rotate_root_keys(
    store: Store, old: OfflineKeys, new_root: list[Signer], *, threshold: int | None = None
) -> bytes:
    """A new root version whose root keys are ``new_root`` (threshold unchanged unless
    given), signed by the old keys and the new ones: devices holding the old root verify
    it with the old threshold, and it verifies itself with the new one."""
    check_offline_keys(store, old)
    root = _new_root(store)
    threshold = threshold or root.signed.roles["root"].threshold
    if not 1 <= threshold <= len(new_root):
        raise BadInputError(
            f"root threshold {threshold}: must be from 1 to the number of new root keys "
            f"({len(new_root)})"
        )
    for keyid in list(root.signed.roles["root"].keyids):
        root.signed.revoke_key(keyid, "root")
    for signer in new_root:
        root.signed.add_key(signer.public_key, "root")
    root.signed.roles["root"].threshold = threshold
    return _write_root(store, root.signed, [*old.root, *new_root])


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


# --- development keys ------------------------------------------------------------------------


def development_keys_dir(store_root: Path) -> Path:
    """Where a local store's development keys live: beside it, never inside it."""
    return store_root.with_name(store_root.name + ".dev-keys")


def development_root(store_uri: str) -> Path | None:
    """The root file a device trusts a local store's development keys with
    (``<store>.dev-keys/root.json``), when ``store_uri`` is a local store that has one."""
    if "://" in store_uri and not store_uri.startswith("file://"):
        return None
    root = development_keys_dir(Path(os.path.abspath(local_path(store_uri)))) / ROOT_COPY
    return root if root.is_file() else None


ROOT_COPY = "root.json"
"""The first root, copied beside the offline keys for provisioning devices."""


def init_with_key_files(
    store: Store,
    keys_dir: Path,
    *,
    online_uri: str | None = None,
    online_public_key: Path | None = None,
    root_keys: int = 3,
    root_threshold: int = 2,
    bins: int = DEFAULT_BINS,
) -> tuple[Path, str]:
    """``init_repository`` with new offline keys written to ``keys_dir``, and a new online
    key file there too unless ``online_uri`` names one. Returns the root file for
    devices (``<keys_dir>/root.json``) and the online signer's URI."""
    if has_trust(store):  # before any key is made
        raise BadInputError(
            f"{store.uri} already has trust metadata ({FIRST_ROOT_KEY}); rotate its keys "
            "with epfleet trust rotate instead"
        )
    bin_bits(bins)
    offline = generate_offline(keys_dir, root_keys)
    if online_uri is None:
        online_uri = generate_online_file(keys_dir / ONLINE_KEY)
    signer = online_signer(online_uri, public_key_of(online_uri, online_public_key))
    raw_root = init_repository(store, offline, signer, root_threshold=root_threshold, bins=bins)
    root_file = keys_dir / ROOT_COPY
    atomic_write_bytes(root_file, raw_root)
    return root_file, online_uri
