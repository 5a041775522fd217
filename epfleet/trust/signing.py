"""Signing a store's manifest document: bins, snapshot and timestamp, by compare-and-swap.

The signer's input is the last signed state, verified (``epfleet.trust.state``), and the
publisher's own change to it, never a document read back from the store unsigned:
``manifest.json`` is a convenience copy written after signing
(``epfleet.fleet.publishing.publish``), so whoever can write to the store but holds no key
cannot get anything signed.

Versioned files are written once (``if_none_match``; a version taken by another publisher
or left by a crashed one is skipped), then ``timestamp.json`` is replaced with
``if_match``; a publisher that loses re-reads the signed state, applies its change to it
again and signs again: racing publishers lose nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from securesystemslib.signer import Signer
from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, Targets, Timestamp
from tuf.api.serialization.json import JSONSerializer

from epfleet.errors import BadInputError, PreconditionFailed, StoreError, TrustLost, Unverified
from epfleet.formats.manifest import Manifest
from epfleet.formats.schema_version import check_writable
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.trust.device_keys import (
    READ_THREADS,
    KeyBook,
    bins_to_renew,
    every_key_bin,
    keys_rollback,
    listing_entry,
    new_keys_index,
)
from epfleet.trust.layout import (
    KEY_BIN_PREFIX,
    KEYS_INDEX_KEY,
    LIFETIME,
    OFFLINE_RENEWAL,
    TIMESTAMP_KEY,
    metadata_key,
    target_key,
    utcnow,
)
from epfleet.trust.pins import keys_mark_path, read_keys_mark, record_keys_mark
from epfleet.trust.state import RepositoryState, read_state, remember_document
from epfleet.trust.targets import Target, carried_rankings, model_targets, plan_bins, stale

ATTEMPTS = 20
"""How many times a publisher that lost the race for the timestamp signs again."""
VERSION_SKIPS = 100
"""How many taken versions of one file a publisher skips before giving up."""
SERIALIZER = JSONSerializer(compact=True)

logger = logging.getLogger(__name__)
AnySigned = TypeVar("AnySigned", Root, Targets, Snapshot, Timestamp)


def sign_metadata(signed: AnySigned, signers: Iterable[Signer]) -> bytes:
    """The metadata of ``signed``, signed by each of ``signers``, as stored (compact JSON)."""
    metadata = Metadata(signed)
    for signer in signers:
        metadata.sign(signer, append=True)
    return metadata.to_bytes(SERIALIZER)


def write_versioned(store: Store, role: str, signed: AnySigned, signers: Sequence[Signer]) -> bytes:
    """Sign and write ``<version>.<role>.json`` once, at ``signed.version`` or the first
    later version no one has taken (another publisher's, or one a crash left behind)."""
    for _ in range(VERSION_SKIPS):
        raw = sign_metadata(signed, signers)
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
    if target.carried:
        return
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
    document: Manifest | None = None
    """The signed manifest document now in force."""
    changed: bool = False
    """Whether this publish changed the document (False: its change found nothing to do)."""
    healed: dict[str, str] = field(default_factory=dict)
    """Bins that did not verify, signed again from the signed document, and why."""


Change = Callable[[Manifest | None], Manifest | None]
"""A publisher's change to the signed document (None: nothing to change). It may run more
than once (after a lost race, on the newer signed document): it must derive everything
from its argument."""


@dataclass
class Changes:
    change: Change | None = None
    """The publisher's own change to the signed document."""
    targets: bytes | None = None
    """A new targets role's signed bytes, already written (online-key rotation)."""
    every_bin: bool = False
    renew: bool = False
    """Sign snapshot and timestamp again even when nothing else changed (refresh)."""
    rotating: bool = False
    """An online-key rotation: the state in force may be signed by the previous root's key."""
    rankings: dict[str, Target] | None = None
    """The field rankings to sign in place of those signed now (None: keep those)."""
    keys: KeyChange | None = None
    """The publisher's change to the enrolled device keys' bins (``epfleet.trust.device_keys``)."""


KeyChange = Callable[[KeyBook], dict[str, dict[str, Target]]]
"""A change to the device keys: the key bins to sign again, each with its targets, whole,
derived from the signed key bins the ``KeyBook`` reads (it may run more than once, as a
``Change``)."""


def _check_online_key(store: Store, state: RepositoryState, signer: Signer) -> None:
    """The signer's key must be the only key of timestamp, snapshot and the bins: then
    every online-signed file of the state, verified against them, is this key's work."""
    keyid = signer.public_key.keyid
    roles = state.root.signed.roles
    named = [roles["timestamp"].keyids, roles["snapshot"].keyids, state.succinct.keyids]
    if any(keyids != [keyid] for keyids in named):
        raise BadInputError(
            f"EPFLEET_TRUST_SIGNER's key {keyid[:12]} is not the online key of "
            f"{store.uri}/trust (root version {state.root.signed.version}); was it rotated? (a "
            "rotation that stopped half-way is finished by running it again)"
        )


def _publish_once(
    store: Store,
    state: RepositoryState,
    signer: Signer,
    now: datetime,
    changes: Changes,
    document: Manifest | None,
    drop_key_bins: bool,
) -> TrustPublished | None:
    """One attempt at signing ``document``; None when another publisher replaced the
    timestamp first."""
    targets_md = state.targets
    wanted = model_targets(document.to_json()) if document is not None else {}
    rankings = changes.rankings if changes.rankings is not None else carried_rankings(state.bins)
    wanted |= rankings
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
    meta = dict(snapshot.signed.meta) if snapshot is not None else {}
    listed_key_bins = [n for n in meta if n.startswith(KEY_BIN_PREFIX + "-")]
    if drop_key_bins:  # the keys index lists them now
        for name in listed_key_bins:
            del meta[name]
    if not bins and not due and not (drop_key_bins and listed_key_bins):
        assert timestamp is not None
        return TrustPublished(timestamp.signed.version, written=False, bins=[], document=document)
    if document is not None:
        remember_document(store, wanted[MANIFEST_KEY].info.hashes["sha256"], document)
    for name, wanted_here in bins.items():
        for target in wanted_here.values():
            _write_target(store, target)
        previous = meta.get(f"{name}.json")
        signed_bin = Targets(
            version=previous.version + 1 if previous else 1,
            expires=now + LIFETIME["bin"],
            targets={path: t.info for path, t in wanted_here.items()},
        )
        raw = write_versioned(store, name, signed_bin, [signer])
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
    raw_snapshot = write_versioned(store, "snapshot", new_snapshot, [signer])
    new_timestamp = Timestamp(
        version=timestamp.signed.version + 1 if timestamp else 1,
        expires=now + LIFETIME["timestamp"],
        snapshot_meta=MetaFile.from_data(new_snapshot.version, raw_snapshot, ["sha256"]),
    )
    raw_timestamp = sign_metadata(new_timestamp, [signer])
    try:
        if state.timestamp_etag is None:
            store.write(TIMESTAMP_KEY, raw_timestamp, if_none_match=True)
        else:
            store.write(TIMESTAMP_KEY, raw_timestamp, if_match=state.timestamp_etag)
    except PreconditionFailed:
        return None
    return TrustPublished(new_timestamp.version, written=True, bins=sorted(bins), document=document)


def _publish_key_bins(
    store: Store,
    book: KeyBook,
    signer: Signer,
    now: datetime,
    key_bins: dict[str, dict[str, Target]],
    migrating: bool,
) -> Snapshot | bool | None:
    """Sign ``key_bins`` again and the keys index listing them, replaced by compare-and-swap:
    the index signed (None: another publisher replaced it first; False: nothing to sign).
    Writes the index also when the store has none yet while its snapshot lists key bins
    (``migrating``), or when it is stale."""
    index = book.index
    stale_index = index.signed is not None and stale(index.signed.expires, LIFETIME["keys"], now)
    moving = migrating and index.signed is None and bool(book.listing())
    if not key_bins and not moving and not stale_index:
        return False
    meta = dict(book.listing())
    for name, wanted_here in key_bins.items():  # no target file: a record is its custom field
        previous = meta.get(f"{name}.json")
        signed_bin = Targets(
            version=previous.version + 1 if previous else 1,
            expires=now + LIFETIME["keys"],
            targets={path: t.info for path, t in wanted_here.items()},
        )
        raw = write_versioned(store, name, signed_bin, [signer])
        meta[f"{name}.json"] = listing_entry(signed_bin.version, raw, signed_bin.expires)
    version = index.signed.version + 1 if index.signed is not None else 1
    signed_index = new_keys_index(version, now + LIFETIME["keys"], meta)
    raw_index = sign_metadata(signed_index, [signer])
    try:
        if index.etag is None:
            store.write(KEYS_INDEX_KEY, raw_index, if_none_match=True)
        else:
            store.write(KEYS_INDEX_KEY, raw_index, if_match=index.etag)
    except PreconditionFailed:
        return None
    return signed_index


def _check_keys_mark(store: Store, book: KeyBook) -> None:
    """TrustLost when the keys index in the store is older than what this host signed or
    verified (``keys_rollback``): signing over it would launder a rollback."""
    assert book.state is not None
    mark = read_keys_mark(store.uri, book.state.repository)
    index = book.index.signed
    reason = keys_rollback(
        mark.index, mark.bins, index.version if index is not None else None, book.listing()
    )
    if reason is not None:
        path = keys_mark_path(store.uri, book.state.repository)
        raise TrustLost(
            f"{store.uri}/{KEYS_INDEX_KEY} {reason} (recorded in {path}): an older signed "
            "keys index was put back in the store, a rollback that would lose the "
            "enrolments and revocations signed after it and bring revoked keys back; "
            "nothing was signed. Restore the newest keys-index.json and key bins from a "
            "backup of the store; if the store was restored from a backup on purpose, "
            f"remove {path} to sign over it (and revoke again the devices revoked since)"
        )


def _keys_mark_holds(store: Store, book: KeyBook) -> bool:
    """Whether the keys index is no older than this host's mark; when it is, a refresh
    signs the rest (devices must not see expired metadata) and leaves it, warned."""
    try:
        _check_keys_mark(store, book)
    except TrustLost as exc:
        logger.warning("%s; signing the rest", exc)
        return False
    return True


def _bins_to_renew(
    book: KeyBook, now: datetime, signing: dict[str, dict[str, Target]]
) -> dict[str, dict[str, Target]]:
    """The key bins a refresh signs again as they are (``bins_to_renew``), besides those
    ``signing`` already."""
    names = [n for n in bins_to_renew(book.listing(), LIFETIME["keys"], now) if n not in signing]
    with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
        signed_bins = list(pool.map(book.signed_bin, names))
    return {
        name: {p: Target(info, b"", carried=True) for p, info in signed.targets.items()}
        for name, signed in zip(names, signed_bins, strict=True)
        if signed is not None
    }


def _record_keys_mark(store: Store, book: KeyBook, index: Snapshot | None) -> None:
    if book.state is None or index is None:
        return
    bins = {name.removesuffix(".json"): meta.version for name, meta in index.meta.items()}
    record_keys_mark(store.uri, book.state.repository, index.version, bins)


def publish_signed(
    store: Store, signer: Signer, now: datetime | None, changes: Changes
) -> TrustPublished:
    """Apply ``changes`` to the verified signed state and sign the result, again on the
    newer state after each lost race. The key bins and their index are signed first (a
    change to them alone signs no snapshot or timestamp), then, when the document or the
    model bins changed or the snapshot still lists key bins, snapshot and timestamp."""
    keys_signed: list[str] | None = None  # the key bins signed, once the keys index is in
    for attempt in range(ATTEMPTS):
        state = read_state(store, rotating=changes.rotating)
        check_writable(state.document.schema_version if state.document else None, store.uri)
        keys = KeyBook(store, state, state.document, renewing=True)  # verified, expired or not
        signing_keys = keys_signed is None and (changes.keys is not None or changes.every_bin)
        key_bins = every_key_bin(keys) if changes.every_bin and signing_keys else {}
        index_in_force = _index_in_force(keys, must_verify=signing_keys)
        if changes.targets is not None:  # a new targets role, not in the snapshot yet
            state.targets = Metadata.from_bytes(changes.targets)
        _check_online_key(store, state, signer)
        changed = changes.change(state.document) if changes.change is not None else None
        for reason in state.refused.values():
            logger.warning("%s; signing it again from the signed document", reason)
        document = changed if changed is not None else state.document
        when = now or utcnow()
        if keys_signed is None:
            if changes.keys is not None:
                key_bins |= changes.keys(keys)
            renewing_keys = changes.renew and index_in_force and _keys_mark_holds(store, keys)
            if signing_keys or renewing_keys:
                _check_keys_mark(store, keys)
                if changes.renew:
                    key_bins |= _bins_to_renew(keys, when, key_bins)
                written = _publish_key_bins(
                    store, keys, signer, when, key_bins, migrating=changes.keys is not None
                )
                if written is None:
                    _back_off(attempt)
                    continue
                _record_keys_mark(
                    store, keys, written if isinstance(written, Snapshot) else keys.index.signed
                )
                index_in_force = index_in_force or written is not False
            keys_signed = sorted(key_bins)
        done = _publish_once(store, state, signer, when, changes, document, index_in_force)
        if done is not None:
            return dataclasses.replace(
                done,
                bins=sorted([*done.bins, *keys_signed]),
                changed=changed is not None,
                healed=state.refused,
            )
        _back_off(attempt)
    raise StoreError(
        f"could not publish the signed metadata of {store.uri}: lost the race for "
        f"{TIMESTAMP_KEY} or {KEYS_INDEX_KEY} {ATTEMPTS} times"
    )


def _index_in_force(keys: KeyBook, must_verify: bool) -> bool:
    """Whether the store has a keys index that verifies (then the snapshot lists no key
    bin). One that does not verify stops a change to the keys (``must_verify``), not the
    signing of anything else."""
    try:
        return keys.index.signed is not None
    except Unverified as exc:
        if must_verify:
            raise
        logger.warning("%s; signing the rest", exc)
        return False


def _back_off(attempt: int) -> None:
    time.sleep(min(2.0, 0.05 * 2 ** min(attempt, 6)) * random.uniform(0.5, 1.0))


def publish_trust(
    store: Store, online: Signer, change: Change | None = None, *, now: datetime | None = None
) -> TrustPublished:
    """Apply ``change`` to the signed document and sign the result: the bins whose targets
    changed (or that are stale, or did not verify), then snapshot and timestamp; nothing
    when there is nothing to sign."""
    return publish_signed(store, online, now, Changes(change=change))


def refresh(store: Store, online: Signer, *, now: datetime | None = None) -> TrustPublished:
    """Sign timestamp and snapshot again (and the stale bins, and any that did not verify),
    from the signed metadata alone, so that devices never see expired metadata while
    publishing is quiet. Warns when root or targets, which only the offline keys sign,
    expire within 30 days."""
    done = publish_signed(store, online, now, Changes(renew=True))
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
