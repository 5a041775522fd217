"""The manifest in force on a device: fetched, cached for offline use, trusted under rules.

It is fetched with a conditional GET, and the cached copy is trusted only while its
bytes and epfleet's validation rules are the ones it was validated with.

An unreachable store or an invalid manifest leaves the cached one in force. A manifest
over its size limit (``EPFLEET_MAX_MANIFEST_BYTES``) is not read: the store refuses it
while streaming (``DocumentTooLarge``). A rejected manifest, invalid or too large, makes
the sync fail (exit 1) with the reason in its report, and is remembered by its version
(the state's ``manifest_rejected``): later syncs ask for the manifest only if it changed
since (a conditional GET on that version), so the same body is not downloaded again,
until a day has passed or the rules or the limit have changed.

With a trusted root, the manifest in force comes from the store's signed (TUF) metadata
instead (``epfleet.device.signed_manifest``), cached in the same place with a note in the
trust directory saying it was verified (``VERIFIED_NOTE``).

The caller holds the cache's lock (``DeviceCache.locked``) and passes the state it loaded;
every write of the state here checks that the lock is held (``save_state``).
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import time
from pathlib import Path

from pydantic import ValidationError

from epfleet.device.cache import LOCK_FILE, STATE_FILE, CacheState, DeviceCache
from epfleet.errors import BadInputError, DocumentTooLarge, StoreError
from epfleet.formats.device_report import ManifestStatus
from epfleet.formats.manifest import VALIDATION_RULES, Manifest, ModelEntry
from epfleet.formats.schema_version import validate_python
from epfleet.fsutil import read_nofollow
from epfleet.hashing import sha256_bytes
from epfleet.stores import MANIFEST_KEY, UNCHANGED, Store, document_limit
from epfleet.trust.client import trust_dir

REJECTED_FOR = 24 * 3600.0
"""Seconds a rejected manifest is not fetched again while the store still has it."""
VERIFIED_NOTE = "in-force.json"
"""In the trust directory: the store and sha256 of the cached manifest when it came from
signed metadata (a cached unsigned manifest is never in force for a signed sync)."""


def fetch_manifest(store: Store, cache: DeviceCache, state: CacheState) -> ManifestStatus:
    """Fetch the manifest with a conditional GET on the cached ETag (or on the ETag of the
    manifest last rejected), and keep the last valid one in the cache. A fetched manifest
    is validated whole; ``state`` records what it was validated with and is saved."""
    trusted = cached_manifest(cache, state, store.uri) is not None
    generation = state.manifest_generation if trusted else None
    rejected = rejected_before(state, store.uri)
    try:
        if rejected is not None:
            got = store.read_if_changed(MANIFEST_KEY, rejected["etag"])
        elif trusted and state.manifest_etag:
            got = store.read_if_changed(MANIFEST_KEY, state.manifest_etag)
        else:
            got = store.read(MANIFEST_KEY)
    except DocumentTooLarge as exc:
        return reject(state, store.uri, str(exc), exc.etag, 0, trusted, generation)
    except StoreError as exc:
        return ManifestStatus(
            status="offline", generation=generation, body_bytes=0, reason=str(exc)
        )
    if got == UNCHANGED and rejected is not None:
        return reject(
            state,
            store.uri,
            f"{rejected['reason']} (unchanged since it was rejected at {rejected['at']}: "
            "not downloaded again)",
            None,
            0,
            trusted,
            generation,
        )
    if got == UNCHANGED:
        return ManifestStatus(status="unchanged", generation=generation, body_bytes=0)
    if got is None:
        raise BadInputError(
            f"no manifest at {store.uri}/{MANIFEST_KEY}: publish one with epfleet compile"
        )
    try:
        manifest = Manifest.from_json(got.data, newer_minor="ignore")
    except ValidationError as exc:
        error = exc.errors()[0]
        reason = (
            f"{store.uri}/{MANIFEST_KEY} fails validation at "
            f"{'.'.join(map(str, error['loc']))}: {error['msg']}"
        )
        return reject(state, store.uri, reason, got.etag, len(got.data), trusted, generation)
    cache.save_manifest(got.data)
    state.store, state.manifest_etag = store.uri, got.etag
    state.manifest_generation = manifest.generation
    state.manifest_sha256, state.manifest_rules = sha256_bytes(got.data), VALIDATION_RULES
    state.manifest_rejected = None
    save_state(cache, state)
    return ManifestStatus(
        status="fetched", generation=manifest.generation, body_bytes=len(got.data)
    )


def reject(
    state: CacheState,
    store_uri: str,
    reason: str,
    etag: str | None,
    body_bytes: int,
    trusted: bool,
    generation: int | None,
) -> ManifestStatus:
    """The status of a rejected manifest (the cached one stays in force), remembered by its
    ``etag`` when it is new; StoreError when no valid manifest is cached to fall back on.
    The state is saved with the session's."""
    if etag is not None:
        state.manifest_rejected = {
            "store": store_uri,
            "etag": etag,
            "rules": VALIDATION_RULES,
            "limit": str(document_limit(MANIFEST_KEY)[0]),
            "reason": reason,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "until": str(time.time() + REJECTED_FOR),
        }
    if not trusted:
        raise StoreError(f"{reason}; no valid manifest is cached to fall back on")
    return ManifestStatus(
        status="rejected",
        generation=generation,
        body_bytes=body_bytes,
        reason=f"{reason}; the cached manifest (generation {generation}) stays in force",
    )


def rejected_before(state: CacheState, store_uri: str) -> dict[str, str] | None:
    """The manifest this store had when a sync last rejected it, if that still holds: the
    same store, validation rules and size limit, and not a day ago."""
    memo = state.manifest_rejected
    if not memo:
        return None
    try:
        holds = (
            memo["store"] == store_uri
            and memo["rules"] == VALIDATION_RULES
            and memo["limit"] == str(document_limit(MANIFEST_KEY)[0])
            and time.time() < float(memo["until"])
            and bool(memo["etag"])
        )
    except (KeyError, ValueError):
        holds = False
    if not holds:
        state.manifest_rejected = None
    return memo if holds else None


def cached_manifest(
    cache: DeviceCache, state: CacheState, store_uri: str, *, signed: bool = False
) -> bytes | None:
    """The manifest cached from this store, if it is valid under today's rules: trusted by
    its sha256 when it was validated under them, else validated whole again now (a cache
    from an older epfleet, or a crash between writing it and the state). With ``signed``,
    only one that came from the store's signed metadata."""
    data = cache.cached_manifest() if state.store == store_uri else None
    if data is None:
        return None
    digest = sha256_bytes(data)
    verified = {"store": store_uri, "sha256": digest}
    if signed and verified_note(trust_dir(cache.meta, store_uri)) != verified:
        return None
    if state.manifest_rules == VALIDATION_RULES and state.manifest_sha256 == digest:
        return data
    try:
        manifest = Manifest.from_json(data, newer_minor="ignore")
    except ValidationError:
        return None
    state.manifest_sha256, state.manifest_rules = digest, VALIDATION_RULES
    state.manifest_generation = manifest.generation
    state.manifest_etag = None  # it may be the ETag of another copy: fetch whole next time
    save_state(cache, state)
    return data


def verified_note(directory: Path) -> dict[str, str] | None:
    try:
        note = json.loads(read_nofollow(directory / VERIFIED_NOTE))
    except (OSError, ValueError):
        return None
    return note if isinstance(note, dict) else None


def save_state(cache: DeviceCache, state: CacheState) -> None:
    """Write the state, which only the holder of the cache's lock may do: RuntimeError
    (a bug, not a device's fault) when nobody holds it."""
    if not lock_held(cache):
        raise RuntimeError(
            f"{cache.meta / STATE_FILE} is written only while the cache's lock is held "
            "(DeviceCache.locked)"
        )
    cache.save_state(state)


def lock_held(cache: DeviceCache) -> bool:
    """Someone holds the cache's lock: a second ``flock`` of its file fails (flock locks
    belong to an open file, so this sees this process's own lock too)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(cache.meta / LOCK_FILE, flags)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe's own lock, if it got one
    return False


def manifest_in_force(
    cached: bytes | None, models: list[str] | None, store_uri: str, cache_dir: Path
) -> Manifest:
    """The wanted models' part of the cached manifest (``cached_manifest``'s answer; the
    store and cache are named in errors).

    Only the wanted entries are validated again (the whole manifest was when it was
    fetched): a device that wants 20 models of a 1,000-model manifest should not pay for
    the other 980 on every sync."""
    if cached is None:
        raise StoreError(
            f"no usable manifest: {store_uri} could not be read and no manifest from it is "
            f"cached in {cache_dir}; sync again once the store is reachable"
        )
    gc.disable()  # json.loads of a large manifest makes ~100k objects: no cyclic garbage
    try:
        document = json.loads(cached)
    finally:
        gc.enable()
    entries = document.get("models", {})
    version = document.get("schema_version") or "1.0"  # the entries' schema
    try:
        wanted = {
            name: validate_python(ModelEntry, entries[name], "ignore", version)
            for name in wanted_models(list(entries), models)
        }
    except ValidationError as exc:
        raise StoreError(f"the cached manifest in {cache_dir} is damaged: {exc}") from None
    return Manifest.model_construct(generation=document.get("generation", 0), models=wanted)


def wanted_models(available: list[str], models: list[str] | None) -> list[str]:
    if not models:
        return available
    unknown = [m for m in models if m not in available]
    if unknown:
        raise BadInputError(
            f"model {', '.join(map(repr, unknown))} is not in the manifest; "
            f"it has: {', '.join(available) or 'no models'}"
        )
    return list(dict.fromkeys(models))
