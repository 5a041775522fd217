"""Which key signs a store's metadata on a publish: ``EPFLEET_TRUST_SIGNER``, or a local store's
development keys beside it (made on its first publish), or none for a store without trust
metadata (published unsigned, warned)."""

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
    unsigned (warned). BadInputError for a store with trust metadata and no signer."""
    uri = settings().trust_signer
    local = isinstance(store, LocalStore)
    if has_trust(store):
        if uri is None and local:
            uri = _development_signer_uri(store)  # type: ignore[arg-type]
        if uri is None:
            raise BadInputError(
                f"{store.uri} has trust metadata (trust/metadata/1.root.json) and "
                "EPFLEET_TRUST_SIGNER is not set: set it to the online key's signer URI "
                "(epfleet trust init printed it, e.g. "
                "EPFLEET_TRUST_SIGNER=file2:/path/to/keys/online.pem)"
            )
        return online_signer(uri, online_public_key(store), store.uri)
    if local and uri is None:
        return _init_development(store)  # type: ignore[arg-type]
    logger.warning(
        "%s has no trust metadata: publishing manifest.json only, unsigned (devices refuse "
        "it unless --allow-unsigned); create it with: epfleet trust init --store %s --keys DIR",
        store.uri,
        store.uri,
    )
    return None


def check_signer(store: Store) -> None:
    """Refuse now, before anything compiles, what a publish to ``store`` would refuse
    for want of a signer (none set, not a signer URI, another key): a BadInputError with
    the fix. Creates nothing (a local store's development keys come with its first
    publish)."""
    if has_trust(store):
        signer_for(store)


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
    return online_signer(uri, online_public_key(store), store.uri)
