"""The roots the fleet side trusts a store's signed metadata with, and the refusal of a
store whose signed metadata is gone, replaced or rolled back.

Devices read a store only through the root they were provisioned with, so the fleet side
(publishers, the rollout gate and moves, enrolment, gc, runtime-watch, ``manifest show``)
reads it the same way, through the roots pinned for it:

- the development keys' ``root.json`` beside a local store (``<store>.dev-keys/``);
- the worker cache's record of the store (``<EPFLEET_CACHE>/signed-stores/<16 hex>.json``):
  written when ``trust init`` creates the store's metadata on this host, when this host
  first reads the store signed, and by ``--trust-root``; every later signed read adds the
  root versions and the highest timestamp version it verified.

A store something pins must have trust metadata whose root chain holds every pinned root
and whose timestamp is no older than the newest this host verified; otherwise nothing is
read from its unsigned ``manifest.json`` and nothing is published (``TrustLost``, naming
what is missing). A store nothing pins and without trust metadata is an unsigned store.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from epfleet.errors import BadInputError, TrustLost
from epfleet.fsutil import atomic_write_bytes
from epfleet.hashing import sha256_bytes
from epfleet.settings import settings
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.stores.local import LocalStore
from epfleet.trust.layout import (
    FIRST_ROOT_KEY,
    ROOT_COPY,
    TIMESTAMP_KEY,
    development_keys_dir,
    metadata_key,
)
from epfleet.trust.roots import examine, root_version, signed_sha256
from epfleet.trust.state import RepositoryState, has_trust, read_state, root_chain

RECORDS_DIR = "signed-stores"

logger = logging.getLogger(__name__)


@dataclass
class Pins:
    """What this host knows of a store's signed metadata."""

    roots: dict[int, str] = field(default_factory=dict)
    """Root version -> sha256 of that root's signed part."""
    timestamp_version: int = 0
    """The highest timestamp version verified here (0: none)."""
    sources: list[str] = field(default_factory=list)
    """Where the pins come from, for messages."""


def record_path(store_uri: str) -> Path:
    """The worker cache's record of a store: one file per store URI."""
    name = sha256_bytes(store_uri.encode())[:16] + ".json"
    return settings().cache / RECORDS_DIR / name


def pins_of(store: Store) -> Pins | None:
    """The roots and timestamp version pinned for ``store`` (None: nothing pins it)."""
    pins = Pins()
    recorded = _read_record(store.uri)
    if recorded is not None:
        pins.roots.update(recorded.roots)
        pins.timestamp_version = recorded.timestamp_version
        pins.sources.append(f"recorded in {record_path(store.uri)}")
    development = _development_root(store)
    if development is not None:
        path, data = development
        version, digest = root_version(data), signed_sha256(data)
        if version is not None and digest is not None and version not in pins.roots:
            pins.roots[version] = digest
        pins.sources.append(f"in the development keys' {path}")
    return pins if pins.sources else None


def signed_store(store: Store) -> bool:
    """Whether ``store`` is read and published signed: True when it has trust metadata,
    False when it has none and nothing pins it. TrustLost when something pins it and its
    trust metadata is gone."""
    if has_trust(store):
        return True
    pins = pins_of(store)
    if pins is None:
        return False
    if has_trust(store):  # made meanwhile: trust init writes the root before it pins it
        return True
    if started_again(store):
        return False
    raise TrustLost(
        f"{store.uri}/{FIRST_ROOT_KEY} is missing, but the store was signed (its root is "
        f"{_where(pins)}): refusing its unsigned manifest.json; restore the store's trust/ "
        "from a backup"
    )


def started_again(store: Store) -> bool:
    """A local store deleted whole (no manifest, no trust metadata, no development keys
    beside it) and about to be created again: its record is dropped, with a warning, so
    that ``rm -rf`` and a new compile start it from nothing. Whoever can delete a local
    store's directory and its keys owns this machine; devices provisioned with its old
    root refuse the new one. Never for a remote store, where a store writer holds no keys."""
    if not isinstance(store, LocalStore) or _development_root(store) is not None:
        return False
    holds = store.root.is_dir() and any(store.root.iterdir())
    if holds or store.size(MANIFEST_KEY) is not None:
        return False
    record_path(store.uri).unlink(missing_ok=True)
    logger.warning(
        "%s was signed before and is gone with its development keys: starting it again "
        "from nothing (devices provisioned with its old root refuse the new one)",
        store.uri,
    )
    return True


def read_pinned_state(store: Store) -> RepositoryState:
    """The store's verified signed state (``read_state``, going on through a key
    rotation), checked against what is pinned for it and then recorded: TrustLost when its
    root chain lacks or replaces a pinned root or its timestamp is older than one verified
    here."""
    pins = pins_of(store) or Pins()
    chain, _ = root_chain(store)
    state = read_state(store, rotating=True)
    chain_roots = {root.signed.version: sha256_bytes(root.signed_bytes) for root in chain}
    timestamp = state.timestamp.signed.version if state.timestamp is not None else None
    problem = pin_problem(pins.roots, pins.timestamp_version, chain_roots, timestamp)
    if problem is not None:
        raise TrustLost(
            f"{store.uri}/{problem} ({_where(pins)}): restore the store's trust/ from a backup"
        )
    _record(store.uri, chain_roots, timestamp or 0, pins)
    return state


def pin_problem(
    pinned_roots: dict[int, str],
    pinned_timestamp: int,
    chain_roots: dict[int, str],
    timestamp: int | None,
) -> str | None:
    """Why a store's signed metadata (its root chain's version -> signed sha256, and its
    timestamp version, None when it has none) is not what was pinned: the key it concerns
    and what is wrong with it; None when it holds every pinned root and a timestamp no
    older than the pinned one."""
    for version, digest in sorted(pinned_roots.items()):
        found = chain_roots.get(version)
        if found is None:
            return (
                f"{metadata_key('root', version)} is missing, but root version {version} is "
                "pinned: the signed metadata was rolled back or damaged"
            )
        if found != digest:
            return (
                f"{metadata_key('root', version)} is not the root version {version} pinned: "
                "the signed metadata was replaced"
            )
    if timestamp is None and pinned_timestamp > 0:
        return (
            f"{TIMESTAMP_KEY} is missing, but version {pinned_timestamp} was verified here: "
            "the signed metadata was damaged"
        )
    if timestamp is not None and timestamp < pinned_timestamp:
        return (
            f"{TIMESTAMP_KEY} is version {timestamp}, older than version {pinned_timestamp} "
            "verified here: the signed metadata was rolled back"
        )
    return None


def record_new_repository(store: Store, first_root: bytes) -> None:
    """Record the first root of a repository ``trust init`` just created here."""
    digest = signed_sha256(first_root)
    if digest is not None:
        _write_record(store.uri, {1: digest}, 0)


def pin_given_root(store: Store, path: Path) -> None:
    """Pin the root in ``path`` (``--trust-root``) for ``store`` in the worker cache:
    BadInputError when it cannot be read, is no valid root, or is not the root of its
    version already pinned."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInputError(
            f"--trust-root {path}: cannot read it ({exc.strerror or exc})"
        ) from None
    problem = examine(data)
    version, digest = root_version(data), signed_sha256(data)
    if problem is not None or version is None or digest is None:
        raise BadInputError(
            f"--trust-root {path} is not valid TUF root metadata ({problem}); pass the "
            "root.json written by epfleet trust init"
        )
    pins = pins_of(store) or Pins()
    if pins.roots.get(version, digest) != digest:
        raise BadInputError(
            f"--trust-root {path} (root version {version}) is not the root pinned for "
            f"{store.uri} ({_where(pins)})"
        )
    recorded = _read_record(store.uri) or Pins()
    _write_record(store.uri, {**recorded.roots, version: digest}, recorded.timestamp_version)


def describe_pins(store: Store) -> str | None:
    """Where the roots pinned for ``store`` come from (None: nothing pins it)."""
    pins = pins_of(store)
    return _where(pins) if pins is not None else None


def _where(pins: Pins) -> str:
    return "; ".join(pins.sources) if pins.sources else "not pinned"


def _development_root(store: Store) -> tuple[Path, bytes] | None:
    if not isinstance(store, LocalStore):
        return None
    path = development_keys_dir(store.root) / ROOT_COPY
    try:
        return path, path.read_bytes()
    except OSError:
        return None


def _read_record(store_uri: str) -> Pins | None:
    path = record_path(store_uri)
    try:
        document = json.loads(path.read_bytes())
        roots = {int(v): str(d) for v, d in document["roots"].items()}
        return Pins(roots, int(document["timestamp_version"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TrustLost(
            f"{path}, this host's record of the signed metadata of {store_uri}, cannot be "
            f"read ({exc}); restore it, or remove it to trust the store's metadata as it is"
        ) from None


def _record(store_uri: str, chain_roots: dict[int, str], timestamp: int, pins: Pins) -> None:
    recorded = _read_record(store_uri)
    if (
        recorded is not None
        and recorded.roots == chain_roots
        and recorded.timestamp_version >= timestamp
    ):
        return
    _write_record(store_uri, chain_roots, max(timestamp, pins.timestamp_version))


def _write_record(store_uri: str, roots: dict[int, str], timestamp: int) -> None:
    document = {
        "store": store_uri,
        "roots": {str(v): d for v, d in sorted(roots.items())},
        "timestamp_version": timestamp,
    }
    path = record_path(store_uri)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(document, indent=1).encode())
    except OSError as exc:
        logger.warning(
            "could not record the signed metadata of %s in %s (%s): this host will not "
            "notice if it is later removed or rolled back",
            store_uri,
            path,
            exc.strerror or exc,
        )


@dataclass
class KeysMark:
    """The newest keys index (and key bin versions) this host signed or verified from a
    store, as a publisher (``epfleet.trust.device_keys.keys_rollback``)."""

    index: int = 0
    bins: dict[str, int] = field(default_factory=dict)


def keys_mark_path(store_uri: str, repository: str) -> Path:
    """Beside the worker cache's record of the store, one file per repository (a store
    given a new repository at the same place starts with no mark)."""
    name = f"{sha256_bytes(store_uri.encode())[:16]}-{repository[:16]}.keys-index.json"
    return settings().cache / RECORDS_DIR / name


def read_keys_mark(store_uri: str, repository: str) -> KeysMark:
    """What this host's publishers signed or verified of ``store_uri``'s keys index
    (nothing yet: version 0). TrustLost, naming the file, when it cannot be read."""
    path = keys_mark_path(store_uri, repository)
    try:
        document = json.loads(path.read_bytes())
        return KeysMark(
            int(document["index"]), {str(n): int(v) for n, v in document["bins"].items()}
        )
    except FileNotFoundError:
        return KeysMark()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TrustLost(
            f"{path}, this host's record of the keys index of {store_uri} it signed, cannot "
            f"be read ({exc}); restore it, or remove it to trust the store's keys index as "
            "it is"
        ) from None


def record_keys_mark(store_uri: str, repository: str, index: int, bins: dict[str, int]) -> None:
    """Raise this host's mark of ``store_uri``'s keys index to ``index`` and ``bins``
    (each version the higher of the two; never lowered)."""
    mark = read_keys_mark(store_uri, repository)
    merged = dict(mark.bins)
    for name, version in bins.items():
        merged[name] = max(version, merged.get(name, 0))
    if index <= mark.index and merged == mark.bins:
        return
    document = {
        "store": store_uri,
        "repository": repository,
        "index": max(index, mark.index),
        "bins": dict(sorted(merged.items())),
    }
    path = keys_mark_path(store_uri, repository)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(document, indent=1).encode())
    except OSError as exc:
        logger.warning(
            "could not record the keys index of %s in %s (%s): this host's publishers will "
            "not notice if it is later rolled back",
            store_uri,
            path,
            exc.strerror or exc,
        )
