"""A device's trust directory of a store: where it is, and what its cached timestamp says.

One directory per store in the device cache (``<cache>/.epfleet/trust/<store>/``):
ngclient's metadata, and every root version it verified in ``root_history/``. Later
syncs start from the newest of those (``epfleet.trust.roots``), so a rotated root is
followed and the old keys are not trusted again.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from epfleet.fsutil import read_nofollow
from epfleet.hashing import sha256_bytes

TRUST_DIR = "trust"
"""The device cache's trust directories: ``<cache>/.epfleet/trust/<store>/``, one per store
(ngclient's metadata and root chain; ``trust_parts``)."""
ROOT_HISTORY = "root_history"
TARGETS_DIR = "targets"


def trust_parts(store_uri: str) -> tuple[str, str]:
    """The trust directory of a store, inside the cache's ``.epfleet``: ``trust/<the first
    16 hex digits of the sha256 of its URI>``. One per store: a root trusted for one
    store says nothing about another."""
    return TRUST_DIR, sha256_bytes(store_uri.encode())[:16]


def trust_dir(cache_meta: Path, store_uri: str) -> Path:
    """The store's trust directory, given the cache's ``.epfleet`` directory."""
    return cache_meta.joinpath(*trust_parts(store_uri))


def ever_trusted(cache_meta: Path) -> bool:
    """Some trust directory of the cache holds a root file (``<version>.root.json``, intact
    or not): the cache trusted a root once, for some store. What a sync killed during its
    first refresh leaves (a staging copy ``.staging-*`` of a trust directory, a temporary
    file) is no root: that device trusted nothing yet."""
    try:
        stores = [
            e.name
            for e in os.scandir(cache_meta / TRUST_DIR)
            if e.is_dir(follow_symlinks=False) and not e.name.startswith(".")
        ]
    except OSError:
        return False
    for store in stores:
        try:
            with os.scandir(cache_meta / TRUST_DIR / store / ROOT_HISTORY) as entries:
                if any(is_root_name(entry.name) for entry in entries):
                    return True
        except OSError:
            continue
    return False


def is_root_name(name: str) -> bool:
    """``name`` is a root history file's: ``<version>.root.json``."""
    number = name.removesuffix(".root.json")
    return number != name and number.isdigit()


def read_file(path: Path) -> bytes | None:
    """The file's bytes (never through a link), or None when it cannot be read."""
    try:
        return read_nofollow(path)
    except OSError:
        return None


def signed_version(data: bytes | None) -> int | None:
    """The ``signed.version`` of a metadata file's bytes (None when there is none)."""
    try:
        return int(json.loads(data or b"")["signed"]["version"])
    except (ValueError, KeyError, TypeError):
        return None


def cached_expiry(directory: Path) -> datetime | None:
    """When the cached signed timestamp expires (None without one)."""
    data = read_file(directory / "timestamp.json")
    try:
        expires = json.loads(data or b"")["signed"]["expires"]
        return datetime.strptime(expires, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except (ValueError, KeyError, TypeError):
        return None


def cached_version(directory: Path) -> int | None:
    """The cached signed timestamp's version (None without one)."""
    return signed_version(read_file(directory / "timestamp.json"))
