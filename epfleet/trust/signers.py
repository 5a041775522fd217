"""Which key signs a store's metadata on a publish: ``EPFLEET_TRUST_SIGNER``, or a local store's
development keys beside it (made on its first publish), or none for a store without trust
metadata that nothing pins as signed and no signer is set for (published unsigned, warned)."""

from __future__ import annotations

import fcntl
import logging

from securesystemslib.signer import Key, Signer

from epfleet.errors import BadInputError
from epfleet.fsutil import atomic_write_bytes
from epfleet.settings import settings
from epfleet.stores import Store
from epfleet.stores.local import LocalStore
from epfleet.trust.keys import ONLINE_KEY, file_uri, load_offline, online_signer, public_key_of
from epfleet.trust.layout import FIRST_ROOT_KEY
from epfleet.trust.pins import read_pinned_state, signed_store
from epfleet.trust.repository import (
    DEFAULT_BINS,
    ROOT_COPY,
    development_keys_dir,
    has_trust,
    init_repository,
    init_with_key_files,
    latest_root,
)

DEVELOPMENT_LOCK = ".lock"
"""Held while one publisher creates a local store's development keys."""

logger = logging.getLogger(__name__)


def signer_for(store: Store) -> Signer | None:
    """The online signer to sign ``store``'s metadata with; None for a store published
    unsigned (warned). BadInputError for a store with trust metadata and no signer, or
    without trust metadata and a signer set; TrustLost (``epfleet.errors``) for a store
    pinned as signed whose signed metadata is gone, replaced or rolled back."""
    uri = settings().trust_signer
    signed = signed_store(store)  # a store pinned as signed without its metadata is refused
    if signed:
        read_pinned_state(store)  # and so is one whose signed metadata was replaced
    if (
        uri is None
        and isinstance(store, LocalStore)
        and (not signed or development_keys_dir(store.root).is_dir())
    ):
        return _development_signer(store)
    if signed:
        if uri is None:
            raise _no_signer(store)
        return online_signer(uri, online_public_key(store), store.uri)
    if uri is not None:
        raise BadInputError(
            f"{store.uri} has no trust metadata ({FIRST_ROOT_KEY} is missing) and "
            "EPFLEET_TRUST_SIGNER is set: refusing to publish it unsigned; if it was signed, "
            "restore its trust/ from a backup; if it never was, create its metadata with "
            f"epfleet trust init --store {store.uri} --keys DIR"
        )
    logger.warning(
        "%s has no trust metadata: publishing manifest.json only, unsigned (devices refuse "
        "it unless --allow-unsigned); create it with: epfleet trust init --store %s --keys DIR",
        store.uri,
        store.uri,
    )
    return None


def check_signer(store: Store) -> None:
    """Refuse now, before anything compiles, what a publish to ``store`` would refuse
    for want of a signer (none set, not a signer URI, another key, a signer set for a store
    without trust metadata) or of its signed metadata (``signed_store``): a BadInputError
    or TrustLost with the fix. Creates nothing (a local store's development keys come with
    its first publish)."""
    if signed_store(store) or settings().trust_signer is not None:
        signer_for(store)


def online_public_key(store: Store) -> Key:
    """The online key the store's newest root names for the timestamp role."""
    root = latest_root(store).signed
    return root.get_key(root.roles["timestamp"].keyids[0])


def _no_signer(store: Store) -> BadInputError:
    return BadInputError(
        f"{store.uri} has trust metadata (trust/metadata/1.root.json) and "
        "EPFLEET_TRUST_SIGNER is not set: set it to the online key's signer URI "
        "(epfleet trust init printed it, e.g. "
        "EPFLEET_TRUST_SIGNER=file2:/path/to/keys/online.pem)"
    )


def _development_signer(store: LocalStore) -> Signer:
    """The online key of a local store's development keys, beside it, made with its trust
    metadata on its first publish: one publisher makes them (a lock beside the keys), the
    others wait for it and use what it made. A publisher that finds the metadata but no key
    takes the lock too: the metadata is written before the keys are moved in (all or
    nothing), so the keys may be on their way."""
    keys_dir = development_keys_dir(store.root)
    online = keys_dir / ONLINE_KEY
    if has_trust(store) and online.is_file():  # made before: no lock needed
        return online_signer(file_uri(online), online_public_key(store), store.uri)
    keys_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(keys_dir / DEVELOPMENT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not has_trust(store):
            if online.is_file():  # keys of an earlier store at this path
                offline = load_offline(keys_dir)
                uri = file_uri(online)
                signer = online_signer(uri, public_key_of(uri))
                root = init_repository(store, offline, signer, bins=DEFAULT_BINS, adopt=True)
                atomic_write_bytes(keys_dir / ROOT_COPY, root)
            else:
                init_with_key_files(store, keys_dir, bins=DEFAULT_BINS, adopt=True)
            logger.warning(
                "created development keys for %s in %s: not for production (the private "
                "keys are plain files). Devices trust it with --trust-root %s",
                store.uri,
                keys_dir,
                keys_dir / ROOT_COPY,
            )
        if not online.is_file():
            raise _no_signer(store)
    return online_signer(file_uri(online), online_public_key(store), store.uri)
