"""Publishing to the store's manifest: read the one in force, and change it with
compare-and-swap.

A store with trust metadata: the manifest in force is the signed document (verified,
``epfleet.trust.state``); a publish applies its change to it and signs the result with
the online key ``EPFLEET_TRUST_SIGNER`` (checked before anything is written), the
timestamp's compare-and-swap being the commit point (``epfleet.trust.signing``). Only then
is ``manifest.json`` written, as a copy of the signed document: it is never read back to be
signed, so whoever can write to the store but holds no key gets nothing signed. Every
publish and refresh puts the copy right; entries someone changed in it are named
(``Published.tampered``) and logged. A local store with no trust metadata and no signer
configured gets development keys beside it (``<store>.dev-keys/``).

A store known to have been signed (a root pinned for it, ``epfleet.trust.pins``) is read
and published only through its signed metadata: when that is gone, replaced or rolled back
nothing is read from ``manifest.json`` and nothing is published. Any other store without
trust metadata is published unsigned, with a warning (refused when ``EPFLEET_TRUST_SIGNER``
is set: this host signs): its ``manifest.json`` is the manifest in force, changed with
compare-and-swap.

Retry layer of this module (see ``epfleet.fleet.runs.retries`` for the others): a publish re-reads,
re-applies its change and re-writes when its conditional write loses a race to another
publisher (``PreconditionFailed``), up to ``PUBLISH_ATTEMPTS`` times with jittered
backoff. That is the only fault retried here; a store that cannot be reached raises
through (the store's client and the Prefect task above it handle those)."""

from __future__ import annotations

import logging
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError
from securesystemslib.signer import Signer

from epfleet.errors import PreconditionFailed, StoreError
from epfleet.fleet.publishing.delta_rules import with_deltas
from epfleet.fleet.publishing.deltas import deltas_for_run
from epfleet.fleet.publishing.merge_rules import ModelFacts, merge
from epfleet.fleet.publishing.rules import Published
from epfleet.formats.manifest import (
    Manifest,
    SourceEntry,
    VariantEntry,
    delta_keys,
    referenced_keys,
    utcnow,
)
from epfleet.formats.schema_version import SCHEMA_VERSION, check_writable
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.trust.layout import TIMESTAMP_KEY
from epfleet.trust.model_signatures import model_signer_for, signing_new_variants
from epfleet.trust.pins import read_pinned_state, signed_store
from epfleet.trust.repository import RepositoryState, publish_trust, read_state
from epfleet.trust.signers import signer_for

logger = logging.getLogger(__name__)


PUBLISH_ATTEMPTS = 20


def read_manifest(store: Store) -> tuple[Manifest | None, str | None]:
    """The store's ``manifest.json`` and its etag; (None, None) when it has none.
    StoreError when it fails validation. On a store with trust metadata it is only a copy:
    read the manifest in force with ``read_in_force``."""
    found = store.read(MANIFEST_KEY)
    if found is None:
        return None, None
    try:
        return Manifest.from_json(found.data, newer_minor="ignore"), found.etag
    except ValidationError as exc:
        raise StoreError(
            f"{store.uri}/{MANIFEST_KEY} fails validation, refusing to publish over it: "
            f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from None


@dataclass(frozen=True)
class InForce:
    """The manifest in force in a store, and how to tell when a publish replaces it."""

    manifest: Manifest | None
    key: str
    """The object a publish replaces: timestamp.json on a signed store, else manifest.json."""
    etag: str | None
    """``key``'s etag when read (None: no such object)."""
    state: RepositoryState | None = None
    """The verified signed state it was read from (None: an unsigned store)."""


def read_in_force(store: Store) -> InForce:
    """The manifest in force: the signed document on a store with trust metadata (verified
    against the store's root chain and the roots pinned for it, ``epfleet.trust.pins``),
    else ``manifest.json``. TrustLost for a store pinned as signed whose signed metadata is
    gone, replaced or rolled back: its ``manifest.json`` is never read instead."""
    if signed_store(store):
        state = read_pinned_state(store)  # readers go on through a key rotation
        return InForce(state.document, TIMESTAMP_KEY, state.timestamp_etag, state)
    manifest, etag = read_manifest(store)
    return InForce(manifest, MANIFEST_KEY, etag)


def update_manifest(
    store: Store, change: Callable[[Manifest | None], Manifest | None]
) -> Published:
    """Apply ``change`` to the manifest in force (None: nothing to change) with
    compare-and-swap, starting again on a lost race; on a signed store, sign the result and
    then write ``manifest.json`` as its copy. ``change`` may run more than once: it must
    derive everything from its argument."""
    if not signed_store(store):  # before a local store's development keys are made for it
        current, _ = read_manifest(store)
        check_writable(current.schema_version if current else None, store.uri)
    signer = signer_for(store)  # before anything is written: a store it cannot sign is refused
    model_signer = model_signer_for(store)
    change = _writable(store, change)
    if model_signer is not None:
        change = signing_new_variants(store, model_signer, change)
    if signer is not None:
        return _publish_signed(store, signer, change)
    result = None
    for attempt in range(PUBLISH_ATTEMPTS):
        current, etag = read_manifest(store)
        changed = change(current)
        if changed is None:
            result = Published(manifest=current, published=False)
            break
        check_present(store, published_keys(changed) - published_keys(current))
        data = changed.to_json()
        try:
            if etag is None:
                store.write(MANIFEST_KEY, data, if_none_match=True)
            else:
                store.write(MANIFEST_KEY, data, if_match=etag)
            result = Published(manifest=changed, published=True)
            break
        except PreconditionFailed:
            time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
    if result is None:
        raise StoreError(
            f"could not publish {store.uri}/{MANIFEST_KEY}: lost the race {PUBLISH_ATTEMPTS} times"
        )
    return result


def _writable(
    store: Store, change: Callable[[Manifest | None], Manifest | None]
) -> Callable[[Manifest | None], Manifest | None]:
    """``change``, refused on a manifest of a newer schema than this epfleet writes, its
    result declaring the schema this epfleet writes."""

    def writable(current: Manifest | None) -> Manifest | None:
        check_writable(current.schema_version if current else None, store.uri)
        changed = change(current)
        if changed is None or changed.schema_version == SCHEMA_VERSION:
            return changed
        return changed.model_copy(update={"schema_version": SCHEMA_VERSION})

    return writable


def _publish_signed(
    store: Store, signer: Signer, change: Callable[[Manifest | None], Manifest | None]
) -> Published:
    def checked(current: Manifest | None) -> Manifest | None:
        changed = change(current)
        if changed is not None:
            check_present(store, published_keys(changed) - published_keys(current))
        return changed

    tampered = tampered_entries(store)  # before this publish changes the signed manifest
    done = publish_trust(store, signer, checked)
    write_copy(store)
    return Published(
        manifest=done.document,
        published=done.changed,
        signed_version=done.version,
        tampered=tampered,
    )


def put_copy_right(store: Store) -> list[str]:
    """Check ``manifest.json`` against the signed manifest (``tampered_entries``) and make
    it its copy; returns the models someone without the keys changed in it."""
    tampered = tampered_entries(store)
    write_copy(store)
    return tampered


def tampered_entries(store: Store) -> list[str]:
    """The models whose entries in ``manifest.json`` differ from the signed ones although
    the copy claims the signed generation (or a later one): changed by someone without the
    keys, logged as such. An older copy is only late: a publisher signs, then copies."""
    found = store.read(MANIFEST_KEY)  # before the signed state: no copy is newer than it
    document = read_state(store, rotating=True).document
    check_writable(document.schema_version if document else None, store.uri)
    if found is None or document is None or found.data == document.to_json():
        return []
    tampered = _tampered_entries(found.data, document)
    if tampered:
        logger.warning(
            "%s/%s differs from the signed manifest (generation %d) in %s: changed by "
            "someone without the keys; devices never trusted it, nothing is signed from it, "
            "and it is made the copy of the signed manifest again",
            store.uri,
            MANIFEST_KEY,
            document.generation,
            ", ".join(tampered),
        )
    return tampered


def write_copy(store: Store) -> None:
    """Make ``manifest.json`` the copy of the signed manifest in force, by compare-and-swap
    (a copy of a newer signed manifest written meanwhile by another publisher wins)."""
    for attempt in range(PUBLISH_ATTEMPTS):
        found = store.read(MANIFEST_KEY)
        document = read_state(store, rotating=True).document
        if document is None:
            return
        data = document.to_json()
        if found is not None and found.data == data:
            return
        try:
            if found is None:
                store.write(MANIFEST_KEY, data, if_none_match=True)
            else:
                store.write(MANIFEST_KEY, data, if_match=found.etag)
            return
        except PreconditionFailed:
            time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
    raise StoreError(
        f"could not write {store.uri}/{MANIFEST_KEY}, the copy of the signed manifest: lost "
        f"the race {PUBLISH_ATTEMPTS} times"
    )


def _tampered_entries(stored: bytes, signed: Manifest) -> list[str]:
    try:
        copy = Manifest.from_json(stored)
    except ValidationError:
        return [f"{MANIFEST_KEY} as a whole (it fails validation)"]
    if copy.generation < signed.generation:
        return []  # a copy not yet replaced
    names = sorted(set(copy.models) | set(signed.models))
    differing = [n for n in names if copy.models.get(n) != signed.models.get(n)]
    return differing or ["its generation or date"]


REUSE_TOUCH_AGE = 600.0


"""Seconds after which an object a publish newly references is touched (younger ones were
just uploaded, and gc keeps them for its grace period anyway)."""


def published_keys(manifest: Manifest | None) -> set[str]:
    """What a manifest names in the store: ``referenced_keys`` and its deltas."""
    return referenced_keys(manifest) | delta_keys(manifest)


def check_present(store: Store, keys: set[str]) -> None:
    """Refuse to publish a manifest naming objects the store no longer has, and touch the
    older ones it names: a run that found an object already stored skips its upload, and
    ``epfleet gc`` may remove that object (unreferenced, past its grace period) while the
    run compiles. gc deletes only objects older than its cutoff (``delete_if_older``),
    so a touched object is kept."""
    missing = sorted(key for key in keys if not store.touch(key, REUSE_TOUCH_AGE))
    if missing:
        raise StoreError(
            f"not published: {', '.join(missing)} in {store.uri} was removed while this run "
            "compiled (epfleet gc?); nothing was published, run the compile again"
        )


def publish(
    store: Store,
    sources: dict[str, SourceEntry],
    planned_on: dict[str, SourceEntry | None],
    variants: dict[tuple[str, str], VariantEntry],
    facts: ModelFacts | None = None,
) -> Published:
    """Merge a run into the manifest with ``update_manifest`` (see ``merge`` for what a run
    may change), its new variants listing the deltas made to them from the files they
    replace (``epfleet.fleet.publishing.delta_rules``)."""
    conflicts: list[str] = []
    deltas = deltas_for_run(store, lambda: read_in_force(store).manifest, variants)
    seed = secrets.token_hex(16)

    def change(current: Manifest | None) -> Manifest | None:
        merged = merge(
            current,
            sources,
            planned_on,
            variants,
            facts,
            present=lambda ref: store.size(ref.uri) == ref.size,
            now=utcnow(),
            seed=seed,
        )
        conflicts[:] = merged.conflicts
        if merged.manifest is None or not deltas:
            return merged.manifest
        return with_deltas(merged.manifest, deltas, set(variants))

    published = update_manifest(store, change)
    published.conflicts = conflicts
    return published
