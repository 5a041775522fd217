"""Publishing to the store's manifest: read it, and change it with compare-and-swap, then
sign it (the store's TUF metadata, ``epfleet.trust.repository``).

Retry layer of this module (see ``epfleet.retries`` for the others): ``update_manifest``
re-reads, re-applies its change and re-writes when its conditional write loses a race to
another publisher (``PreconditionFailed``), up to ``PUBLISH_ATTEMPTS`` times with jittered
backoff; ``publish_trust`` does the same for the signed metadata. That is the only fault
they retry; a store that cannot be reached raises through (the store's client and the
Prefect task above it handle those).

Signing: a store with trust metadata is signed with the online key
``EPFLEET_TRUST_SIGNER`` (checked before anything is written); every publish also
reconciles, so metadata left behind by a crash after a manifest write is signed by the
next one. A local store with no trust metadata and no signer configured gets development
keys beside it (``<store>.dev-keys/``); any other store without trust metadata is
published unsigned, with a warning.
"""

from __future__ import annotations

import fcntl
import logging
import random
import time
from collections.abc import Callable

from pydantic import BaseModel, Field, ValidationError
from securesystemslib.signer import Key, Signer

from epfleet.errors import BadInputError, PreconditionFailed, StoreError
from epfleet.fsutil import atomic_write_bytes
from epfleet.manifest import (
    Manifest,
    SamplesRef,
    SourceEntry,
    VariantEntry,
    merge,
    referenced_keys,
)
from epfleet.settings import settings
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.stores.local import LocalStore
from epfleet.trust.keys import ONLINE_KEY, file_uri, load_offline, online_signer, public_key_of
from epfleet.trust.repository import (
    DEFAULT_BINS,
    ROOT_COPY,
    development_keys_dir,
    has_trust,
    init_repository,
    init_with_key_files,
    latest_root,
    publish_trust,
)

logger = logging.getLogger(__name__)

DEVELOPMENT_LOCK = ".lock"
"""Held while one publisher creates a local store's development keys."""

PUBLISH_ATTEMPTS = 20


def read_manifest(store: Store) -> tuple[Manifest | None, str | None]:
    """The store's manifest and its etag; (None, None) when it has none. StoreError when
    the manifest there fails validation."""
    found = store.read(MANIFEST_KEY)
    if found is None:
        return None, None
    try:
        return Manifest.from_json(found.data), found.etag
    except ValidationError as exc:
        raise StoreError(
            f"{store.uri}/{MANIFEST_KEY} fails validation, refusing to publish over it: "
            f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from None


class Published(BaseModel):
    manifest: Manifest | None = Field(description="The manifest now in the store")
    published: bool = Field(description="Whether this call changed it")
    conflicts: list[str] = Field(
        default_factory=list, description="Models left alone: their source changed meanwhile"
    )
    signed_version: int | None = Field(
        default=None,
        description="The version of the store's signed timestamp now; None for a store "
        "published unsigned (no trust metadata)",
    )


def update_manifest(
    store: Store, change: Callable[[Manifest | None], Manifest | None]
) -> Published:
    """Compare-and-swap the store's manifest: read it, apply ``change`` (None: nothing to
    change), write it only if it is still the version read, and start again on a lost race.
    Then sign it (or reconcile the signed metadata with it, when ``change`` changed nothing).
    ``change`` may run more than once: it must derive everything from its argument."""
    signer = signer_for(store)  # before anything is written: a store it cannot sign is refused
    result = None
    for attempt in range(PUBLISH_ATTEMPTS):
        current, etag = read_manifest(store)
        changed = change(current)
        if changed is None:
            result = Published(manifest=current, published=False)
            break
        check_present(store, referenced_keys(changed) - referenced_keys(current))
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
    if signer is not None:
        result.signed_version = publish_trust(store, signer).version
    return result


REUSE_TOUCH_AGE = 600.0
"""Seconds after which an object a publish newly references is touched (younger ones were
just uploaded, and gc keeps them for its grace period anyway)."""


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
    samples: dict[str, SamplesRef | None] | None = None,
) -> Published:
    """Merge a run into the manifest with ``update_manifest`` (see ``merge`` for what a run
    may change)."""
    conflicts: list[str] = []

    def change(current: Manifest | None) -> Manifest | None:
        merged = merge(
            current,
            sources,
            planned_on,
            variants,
            samples,
            present=lambda ref: store.size(ref.uri) == ref.size,
        )
        conflicts[:] = merged.conflicts
        return merged.manifest

    published = update_manifest(store, change)
    published.conflicts = conflicts
    return published


def signer_for(store: Store) -> Signer | None:
    """The online signer to sign ``store``'s metadata with; None for a store published
    unsigned (warned). BadInputError for a store with trust metadata and no signer."""
    uri = settings().trust_signer
    local = isinstance(store, LocalStore)
    if has_trust(store):
        if uri is None and local:
            uri = _development_signer_uri(store)  # type: ignore[arg-type]
        if uri is None:
            raise BadInputError(
                f"{store.uri} has trust metadata (trust/metadata/1.root.json) and "
                "EPFLEET_TRUST_SIGNER is not set: nothing published; set it to the online "
                "key's signer URI (epfleet trust init printed it)"
            )
        return online_signer(uri, online_public_key(store))
    if local and uri is None:
        return _init_development(store)  # type: ignore[arg-type]
    logger.warning(
        "%s has no trust metadata: publishing manifest.json only, unsigned (devices refuse "
        "it unless --allow-unsigned); create it with: epfleet trust init --store %s --keys DIR",
        store.uri,
        store.uri,
    )
    return None


def online_public_key(store: Store) -> Key:
    """The online key the store's newest root names for the timestamp role."""
    root = latest_root(store).signed
    return root.get_key(root.roles["timestamp"].keyids[0])


def _development_signer_uri(store: LocalStore) -> str | None:
    online = development_keys_dir(store.root) / ONLINE_KEY
    return file_uri(online) if online.is_file() else None


def _init_development(store: LocalStore) -> Signer:
    """Development keys for a local store, beside it, and its trust metadata: one
    publisher does it (a lock beside the keys), the others use what it made."""
    keys_dir = development_keys_dir(store.root)
    keys_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(keys_dir / DEVELOPMENT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not has_trust(store):
            if (keys_dir / ONLINE_KEY).is_file():  # keys of an earlier store at this path
                offline = load_offline(keys_dir)
                uri = file_uri(keys_dir / ONLINE_KEY)
                signer = online_signer(uri, public_key_of(uri))
                root = init_repository(store, offline, signer, bins=DEFAULT_BINS)
                atomic_write_bytes(keys_dir / ROOT_COPY, root)
            else:
                init_with_key_files(store, keys_dir, bins=DEFAULT_BINS)
            logger.warning(
                "created development keys for %s in %s: not for production (the private "
                "keys are plain files). Devices trust it with --trust-root %s",
                store.uri,
                keys_dir,
                keys_dir / ROOT_COPY,
            )
    uri = file_uri(keys_dir / ONLINE_KEY)
    return online_signer(uri, online_public_key(store))
