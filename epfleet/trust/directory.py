"""A device's trust directory of a store: where it is, the root a refresh starts from.

What is kept there: the store's verified metadata, and what its cached timestamp says.

One directory per store in the device cache (``<cache>/.epfleet/trust/<store>/``):
ngclient's metadata, and every root version it verified in ``root_history/``. Later
syncs start from the newest of those (``provisioned_root``), so a rotated root is
followed and the old keys are not trusted again.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from epfleet.errors import BadInputError
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


def provisioned_root(directory: Path, given: Path | None) -> bytes | None:
    """The root metadata a refresh starts from: the newest root this cache verified
    (``root_history``), or ``given`` (``--trust-root``) when the cache has none yet or
    ``given`` is newer (a device provisioned again). None when there is neither.

    BadInputError when ``given`` cannot be read, is no root metadata, or is another
    repository's root than the one the cache follows."""
    cached = _cached_roots(directory)
    if given is None:
        return cached[max(cached)] if cached else None
    try:
        data = given.read_bytes()
    except OSError as exc:
        raise BadInputError(
            f"--trust-root {given}: cannot read it ({exc.strerror or exc})"
        ) from None
    version = _root_version(data)
    if version is None:
        raise BadInputError(
            f"--trust-root {given} is not TUF root metadata (a root.json written by "
            "epfleet trust init)"
        )
    if not cached or version > max(cached):
        return data
    if cached.get(version) not in (None, data):
        raise BadInputError(
            f"--trust-root {given} (root version {version}) is not the root this device "
            f"already trusts ({directory / ROOT_HISTORY}); to trust another repository, "
            f"remove {directory} and sync again"
        )
    return cached[max(cached)]


def _cached_roots(directory: Path) -> dict[int, bytes]:
    history = directory / ROOT_HISTORY
    try:
        names = [entry.name for entry in os.scandir(history)]
    except OSError:
        return {}
    roots = {}
    for name in names:
        number = name.removesuffix(".root.json")
        if not number.isdigit() or number == name:
            continue
        try:
            data = read_nofollow(history / name)
        except OSError:
            continue
        if _root_version(data) == int(number):
            roots[int(number)] = data
    return roots


def _root_version(data: bytes) -> int | None:
    try:
        signed = json.loads(data)["signed"]
        if signed["_type"] != "root":
            return None
        return int(signed["version"])
    except (ValueError, KeyError, TypeError):
        return None


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
