"""Where a store's signed (TUF) metadata lives, and how long each role's signature lasts.

The store layout of ``epfleet.trust`` that the publishing side writes and the device side
(``epfleet.trust.client``) reads.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

METADATA_KEYS = "trust/metadata/"
TARGETS_KEYS = "trust/targets/"
TIMESTAMP_KEY = METADATA_KEYS + "timestamp.json"
FIRST_ROOT_KEY = METADATA_KEYS + "1.root.json"
CUSTOM_FIELD = "epfleet"
SCHEMA_FIELD = "epfleet_schema"
"""Beside the entry in a model target's custom field: the manifest schema version the entry
was written under, left out for "1.0" (so stores signed before it stay as they are)."""
FOLDED_FIELD = "epfleet_folded"
"""Beside the entry in a model target's custom field, when the model has variants with
``folded_io`` (schema 1.4): those variants (and the rollout's previous ones), kept out of
``CUSTOM_FIELD``'s entry so that a device of schema 1.3, which would drop ``folded_io`` as
a newer minor's unknown key and feed the variant floats, never sees them
(``epfleet.trust.targets.split_folded``)."""
BIN_PREFIX = "bin"
DEFAULT_BINS = 256
KEY_BIN_PREFIX = "keys"
KEY_BIN_BITS = 9
"""The enrolled device keys' hashed bins (``epfleet.trust.device_keys``): 512 of them,
``keys-000`` .. ``keys-1ff``, fixed for every store (a reader finds a device's bin from
its id alone). At a million devices a bin holds about 2,000 keys (about 1 MB); each bin
costs every device's snapshot about 30 bytes."""
DEVICE_KEY_TARGETS = "device-keys/"
"""Target path prefix of an enrolled device's record: ``device-keys/<device id>``."""
KEY_ID_TARGETS = "device-key-ids/"
"""Target path prefix of a key's claim, the device it was enrolled for:
``device-key-ids/<key id>``."""
LIFETIME = {
    "root": timedelta(days=365),
    "targets": timedelta(days=365),
    "snapshot": timedelta(days=7),
    "bin": timedelta(days=7),
    "keys": timedelta(days=365),
    "timestamp": timedelta(days=1),
}
"""How long each role's signature is good for. A role is re-signed by the next publish or
refresh once less than half of its lifetime is left."""
OFFLINE_RENEWAL = timedelta(days=30)
"""A refresh warns when root or targets (which only the offline keys sign) expire sooner."""
ROOT_COPY = "root.json"
"""The first root, copied beside the offline keys for provisioning devices."""


def development_keys_dir(store_root: Path) -> Path:
    """Where a local store's development keys live: beside it, never inside it."""
    return store_root.with_name(store_root.name + ".dev-keys")


def utcnow() -> datetime:
    """Now in UTC, to the second (as signed expiries are written)."""
    return datetime.now(timezone.utc).replace(microsecond=0)


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
