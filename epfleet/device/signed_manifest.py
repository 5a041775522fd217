"""The manifest in force from a store's signed (TUF) metadata, held to the device's high-water mark.

With a trusted root, ``fetch_signed_manifest`` refreshes the store's signed metadata
(``epfleet.trust.client``) and makes the wanted models' signed entries, or the signed
manifest.json when every model is wanted, the manifest in force: cached where
``epfleet.device.manifest_cache`` keeps the fleet manifest, with a note in the trust
directory saying it was verified. Metadata that does not verify leaves the last verified
one in force and fails the sync (exit 1).

The state keeps the high-water mark of what the device accepted from each repository
(``CacheState.trust``, ``epfleet.trust.highwater``): signed metadata older than it, or a
signed manifest.json of an older generation, is refused the same way, even when the
trust directory was lost.

The caller holds the cache's lock and passes the state it loaded.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError

from epfleet.device.cache import STATE_DIR, CacheState, DeviceCache
from epfleet.device.manifest_cache import VERIFIED_NOTE, cached_manifest, save_state
from epfleet.errors import MetadataRefused, StoreUnreachable
from epfleet.formats.device_report import ManifestStatus
from epfleet.formats.field_ranking import ModelRanking
from epfleet.formats.manifest import VALIDATION_RULES, Manifest
from epfleet.hashing import sha256_bytes
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.trust.client import (
    ROOT_HISTORY,
    TARGETS_DIR,
    Verified,
    cached_expiry,
    cached_version,
    trust_parts,
    verify,
)
from epfleet.trust.highwater import generation_below, with_generation

NOTHING_VERIFIED = (
    "; no signed manifest is cached to fall back on: no model is synced, and the variants "
    "active on this device, if any, stay active"
)


def fetch_signed_manifest(
    store: Store,
    cache: DeviceCache,
    state: CacheState,
    root: bytes,
    models: list[str] | None,
    rankings: dict[str, ModelRanking | str] | None = None,
) -> ManifestStatus:
    """Refresh the store's signed metadata from ``root`` and make the wanted models' signed
    entries (every model's: the signed manifest.json) the manifest in force, and put their
    signed field rankings (or why each was refused) in ``rankings``. An
    unreachable store leaves the last verified one in force (offline, saying when its
    signed metadata expires); metadata that does not verify leaves it in force too and is
    ``rejected`` (the sync fails; with none ever verified, no manifest is in force)."""
    parts = (STATE_DIR, *trust_parts(store.uri))
    directory = cache.directory(*parts)
    for sub in (ROOT_HISTORY, TARGETS_DIR):  # ngclient writes there: real directories
        cache.directory(*parts, sub)
    trusted = cached_manifest(cache, state, store.uri, signed=True) is not None
    generation = state.manifest_generation if trusted else None
    mark = state.trust.get(parts[-1])
    try:
        verified = verify(store, directory, root, models, mark)
    except StoreUnreachable as exc:
        return ManifestStatus(
            status="offline",
            generation=generation,
            body_bytes=0,
            reason=f"{exc}{expiry_note(directory)}",
            signed=True,
            signed_version=cached_version(directory),
        )
    except MetadataRefused as exc:
        if not trusted:
            return _none_in_force(f"{exc}", cached_version(directory))
        return ManifestStatus(
            status="rejected",
            generation=generation,
            body_bytes=0,
            reason=f"{exc}; the manifest last verified stays in force",
            signed=True,
            signed_version=cached_version(directory),
        )
    if rankings is not None:
        rankings.update(verified.rankings)
    data = verified.document
    digest = sha256_bytes(data)
    replaced = not (trusted and state.manifest_sha256 == digest)
    if replaced:
        taken = _validated_generation(store, data, verified)
        if isinstance(taken, str):
            if not trusted:
                return _none_in_force(taken, verified.version)
            return ManifestStatus(
                status="rejected",
                generation=generation,
                body_bytes=verified.metadata_bytes,
                reason=f"{taken}; the manifest last verified stays in force",
                signed=True,
                signed_version=verified.version,
            )
        if cache.cached_manifest() != data:
            cache.save_manifest(data)
        note = json.dumps({"store": store.uri, "sha256": digest}).encode()
        cache.write((*parts, VERIFIED_NOTE), note)
        state.store, state.manifest_etag = store.uri, None
        state.manifest_generation = taken
        state.manifest_sha256, state.manifest_rules = digest, VALIDATION_RULES
        state.manifest_rejected = None
    _keep_mark(cache, state, parts[-1], verified, store.uri)
    return ManifestStatus(
        status="fetched" if verified.changed or replaced else "unchanged",
        generation=state.manifest_generation if verified.every_model else None,
        body_bytes=verified.metadata_bytes,
        signed=True,
        signed_version=verified.version,
    )


def _validated_generation(store: Store, data: bytes, verified: Verified) -> int | str:
    """The generation of a newly verified manifest, validated whole; or why it is refused:
    it fails validation, or (taken whole) it is older than the high-water mark."""
    try:
        generation = Manifest.from_json(data, newer_minor="ignore").generation
    except ValidationError as exc:
        error = exc.errors()[0]
        return (
            f"the signed {MANIFEST_KEY} of {store.uri} fails validation at "
            f"{'.'.join(map(str, error['loc']))}: {error['msg']}"
        )
    older = generation_below(verified.mark, generation) if verified.every_model else None
    if older is not None:
        return f"the signed {MANIFEST_KEY} of {store.uri}: a rollback: {older}; refused"
    return generation


def _keep_mark(
    cache: DeviceCache, state: CacheState, key: str, verified: Verified, store_uri: str
) -> None:
    """Record what the device accepted in its high-water mark of the repository (the
    manifest's generation when it took the signed manifest.json whole)."""
    mark = verified.mark
    if verified.every_model:
        mark = with_generation(mark, state.manifest_generation)
    if verified.lineage == "new":
        cache.note(
            f"the signed metadata of {store_uri} is another repository's than the one this "
            "device trusted before (its root differs from the one recorded): what the device "
            "accepted from the old repository no longer applies"
        )
    state.trust[key] = mark
    save_state(cache, state)


def expiry_note(directory: Path) -> str:
    """``; the cached signed metadata expired at ...`` when it has (else '')."""
    expires = cached_expiry(directory)
    if expires is None or expires > datetime.now(timezone.utc):
        return ""
    return f"; the signed metadata cached here expired at {expires.isoformat()}"


def untrusted(store: Store, cache: DeviceCache, state: CacheState, problem: str) -> ManifestStatus:
    """The status of a sync that has no root to verify the store with although the device
    trusts signed metadata only (``epfleet.device.provisioning``): the signed manifest
    last verified stays in force and the sync fails with ``problem`` (with none cached, no
    manifest is in force)."""
    if cached_manifest(cache, state, store.uri, signed=True) is None:
        return _none_in_force(problem, None)
    return ManifestStatus(
        status="rejected",
        generation=state.manifest_generation,
        body_bytes=0,
        reason=f"{problem}; the manifest last verified stays in force",
        signed=True,
        signed_version=cached_version(cache.meta.joinpath(*trust_parts(store.uri))),
    )


def _none_in_force(problem: str, signed_version: int | None) -> ManifestStatus:
    """A refusal on a device that never verified a signed manifest of this store (or lost
    it): the sync fails and reports it like any refusal, with no manifest in force."""
    return ManifestStatus(
        status="rejected",
        generation=None,
        body_bytes=0,
        reason=problem + NOTHING_VERIFIED,
        signed=True,
        signed_version=signed_version,
    )
