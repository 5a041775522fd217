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
from dataclasses import dataclass, field
from datetime import datetime
from typing import TypeVar

from securesystemslib.signer import Signer
from tuf.api.metadata import Metadata, MetaFile, Root, Snapshot, Targets, Timestamp
from tuf.api.serialization.json import JSONSerializer

from epfleet.errors import BadInputError, PreconditionFailed, StoreError
from epfleet.formats.manifest import Manifest
from epfleet.formats.schema_version import check_writable
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.trust.device_keys import KeyBook, every_key_bin
from epfleet.trust.layout import (
    LIFETIME,
    OFFLINE_RENEWAL,
    TIMESTAMP_KEY,
    metadata_key,
    target_key,
    utcnow,
)
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
    key_bins: dict[str, dict[str, Target]],
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
    if not bins and not key_bins and not due:
        assert timestamp is not None
        return TrustPublished(timestamp.signed.version, written=False, bins=[], document=document)
    meta = dict(snapshot.signed.meta) if snapshot is not None else {}
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
    for name, wanted_here in key_bins.items():  # no target file: a record is its custom field
        previous = meta.get(f"{name}.json")
        signed_bin = Targets(
            version=previous.version + 1 if previous else 1,
            expires=now + LIFETIME["keys"],
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
    return TrustPublished(
        new_timestamp.version, written=True, bins=sorted([*bins, *key_bins]), document=document
    )


def publish_signed(
    store: Store, signer: Signer, now: datetime | None, changes: Changes
) -> TrustPublished:
    """Apply ``changes`` to the verified signed state and sign the result, again on the
    newer state after each lost race."""
    for attempt in range(ATTEMPTS):
        state = read_state(store, rotating=changes.rotating)
        check_writable(state.document.schema_version if state.document else None, store.uri)
        keys = KeyBook(store, state, state.document)  # verified against the targets in force
        key_bins = every_key_bin(keys) if changes.every_bin else {}
        if changes.targets is not None:  # a new targets role, not in the snapshot yet
            state.targets = Metadata.from_bytes(changes.targets)
        _check_online_key(store, state, signer)
        changed = changes.change(state.document) if changes.change is not None else None
        for reason in state.refused.values():
            logger.warning("%s; signing it again from the signed document", reason)
        document = changed if changed is not None else state.document
        if changes.keys is not None:
            key_bins |= changes.keys(keys)
        done = _publish_once(store, state, signer, now or utcnow(), changes, document, key_bins)
        if done is not None:
            return dataclasses.replace(done, changed=changed is not None, healed=state.refused)
        time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
    raise StoreError(
        f"could not publish the signed metadata of {store.uri}: lost the race for "
        f"{TIMESTAMP_KEY} {ATTEMPTS} times"
    )


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
