"""The device side of signed distribution: python-tuf's ngclient over an epfleet store.

``StoreFetcher`` gives ngclient the store's ``trust/`` objects (URLs of the pseudo-scheme
``epfleet-store:///`` are store keys); ``verify`` refreshes the signed metadata into a
directory of the device cache and returns the wanted models' entries from the signed
custom field ``epfleet`` of their targets (``models/<name>``), loading only the bins
responsible for them, or, for every model, the signed ``manifest.json`` target.

Trust starts from a root file the device is provisioned with (``--trust-root``); ngclient
keeps every root version it verified in ``<trust dir>/root_history/``, and later syncs
start from the newest of those (``provisioned_root``), so a rotated root is followed
and the old keys are not trusted again.

Errors: ``MetadataRefused`` when the metadata does not verify (bad or missing
signatures, rollback, expired, mix-and-match, longer than signed, trickled, absent),
``StoreUnreachable`` when the store cannot be reached at all.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pydantic import ValidationError
from tuf.api import exceptions as tuf_errors
from tuf.ngclient import Updater, UpdaterConfig
from tuf.ngclient.fetcher import FetcherInterface

from epfleet.device.cache import not_writable
from epfleet.errors import BadInputError, EpfleetError, StoreError, TransientStoreError
from epfleet.fsutil import atomic_write_bytes, read_nofollow
from epfleet.hashing import sha256_bytes
from epfleet.limits import TransferGuard, TransferTooSlow
from epfleet.manifest import Manifest, ModelEntry
from epfleet.settings import settings
from epfleet.stores import MANIFEST_KEY, Store

STORE_URL = "epfleet-store:///"
METADATA_KEYS = "trust/metadata/"
TARGETS_KEYS = "trust/targets/"
CUSTOM_FIELD = "epfleet"
TRUST_DIR = "trust"
"""The device cache's trust directories: ``<cache>/.epfleet/trust/<store>/``, one per store
(ngclient's metadata and root chain; ``trust_parts``)."""
ROOT_HISTORY = "root_history"
TARGETS_DIR = "targets"

logger = logging.getLogger(__name__)


class MetadataRefused(EpfleetError):
    """The store's signed metadata did not verify; nothing from it is in force."""


class StoreUnreachable(TransientStoreError):
    """The store could not be reached to refresh its signed metadata."""


class _Unreachable(tuf_errors.DownloadError):
    """A fetch found the store unreachable (a ``DownloadError``, as ngclient expects)."""


def model_target(model: str) -> str:
    """The TUF target path of a model's entry."""
    return f"models/{model}"


class StoreFetcher(FetcherInterface):
    """ngclient's downloads from an epfleet store: ``epfleet-store:///<key>`` is the store's
    ``<key>``. Bodies stream (ngclient stops reading past a file's signed or configured
    length) under the store's transfer limits (``EPFLEET_MIN_RATE``, the stall timeout); a
    missing object is HTTP 404 for ngclient, an unreachable store ``_Unreachable``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.bytes = 0
        """Body bytes fetched so far."""
        self.fetched: list[str] = []
        """The keys fetched so far, in order."""

    def _fetch(self, url: str) -> Iterator[bytes]:
        if not url.startswith(STORE_URL):
            raise tuf_errors.DownloadError(f"{url} is not a store URL ({STORE_URL}<key>)")
        key = url.removeprefix(STORE_URL)
        guard = TransferGuard(f"read of {key}", self.store.uri)
        chunks = self.store.read_range(key, 0)
        try:
            first = next(chunks, None)
        except StoreError as exc:
            raise self._error(key, exc) from exc
        self.fetched.append(key)
        return self._stream(chunks, first, key, guard)

    def _stream(
        self, chunks: Iterator[bytes], first: bytes | None, key: str, guard: TransferGuard
    ) -> Generator[bytes, None, None]:
        try:
            if first is None:
                return
            for chunk in _chain(first, chunks):
                self.bytes += len(chunk)
                guard.add(len(chunk))
                yield chunk
        except StoreError as exc:
            raise self._error(key, exc) from exc
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # ngclient stopped reading (past a length): the body is closed

    def _error(self, key: str, exc: StoreError) -> tuf_errors.DownloadError:
        where = f"{self.store.uri}/{key}"
        if isinstance(exc, TransferTooSlow):
            return tuf_errors.SlowRetrievalError(str(exc))
        if isinstance(exc, TransientStoreError):
            return _Unreachable(str(exc))
        try:
            missing = self.store.size(key) is None
        except TransientStoreError as again:
            return _Unreachable(str(again))
        except StoreError:
            missing = False
        if missing:
            return tuf_errors.DownloadHTTPError(f"{where} does not exist", 404)
        return tuf_errors.DownloadError(str(exc))


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest


@dataclass(frozen=True)
class Verified:
    """What a refresh verified: the manifest in force and how the refresh went."""

    document: bytes
    """The manifest in force, as JSON: the wanted models' signed entries (validated), or
    the signed manifest.json as it is (not validated yet)."""
    every_model: bool
    changed: bool
    """Anything but an unchanged timestamp was downloaded."""
    metadata_bytes: int
    version: int
    """The signed timestamp's version."""
    fetched: list[str]


def trust_parts(store_uri: str) -> tuple[str, str]:
    """The trust directory of a store, inside the cache's ``.epfleet``: ``trust/<the first
    16 hex digits of the sha256 of its URI>``. One per store: a root trusted for one
    store says nothing about another."""
    return TRUST_DIR, sha256_bytes(store_uri.encode())[:16]


def trust_dir(cache_meta: Path, store_uri: str) -> Path:
    """The store's trust directory, given the cache's ``.epfleet`` directory."""
    return cache_meta.joinpath(*trust_parts(store_uri))


class _Updater(Updater):
    """ngclient's Updater writing its metadata as epfleet writes the device cache's files
    (atomic, never through a link, readable as the umask says: ngclient's own temporary
    files are 0600, and another user running the package reads the cache)."""

    def _persist_file(self, filename: str, data: bytes) -> None:
        path = Path(filename)
        if _read(path) == data:  # ngclient saves the trusted root on every start
            return
        with _refused_as_not_writable(path):
            atomic_write_bytes(path, data)

    def _update_root_symlink(self) -> None:
        # ngclient points root.json at the trusted root's file in root_history on every
        # start; leave a link that already does (a read-only cache verifies all the same)
        link = Path(self._dir, "root.json")
        current = os.path.join(ROOT_HISTORY, f"{self._trusted_set.root.version}.root.json")
        with contextlib.suppress(OSError):
            if os.readlink(link) == current:
                return
        with _refused_as_not_writable(link):
            super()._update_root_symlink()


@contextlib.contextmanager
def _refused_as_not_writable(path: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise not_writable(path, exc) from None
        raise


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


def verify(store: Store, directory: Path, root: bytes, models: list[str] | None) -> Verified:
    """Refresh the store's signed metadata into ``directory`` (a real directory of the
    device cache) from ``root``, then the entries of ``models`` (their bins only), or the
    signed manifest.json when ``models`` is None or empty.

    MetadataRefused when anything fails verification, StoreUnreachable when the store
    cannot be reached, BadInputError for a wanted model the signed metadata lacks."""
    before = _read(directory / "timestamp.json")
    where = f"{store.uri}/{METADATA_KEYS}"
    fetcher = StoreFetcher(store)
    try:
        updater = open_updater(fetcher, directory, root)
        updater.refresh()
        if models:
            wanted = list(dict.fromkeys(models))
            entries = {m: signed_entry(updater, store, m) for m in wanted}
            document = Manifest.model_construct(models=entries).to_json()
        else:
            document = _signed_manifest(updater, store, directory)
    except _Unreachable as exc:
        raise StoreUnreachable(f"cannot refresh the signed metadata at {where}: {exc}") from None
    except tuf_errors.DownloadHTTPError as exc:
        raise MetadataRefused(
            f"{exc}: the store has no trust metadata there, or not all of it; refused "
            "(publish with trust metadata: epfleet trust init)"
        ) from None
    except (tuf_errors.RepositoryError, tuf_errors.DownloadError) as exc:
        raise MetadataRefused(f"{where}: {describe(exc)}") from None
    after = _read(directory / "timestamp.json")
    version = _version(after)
    others = [k for k in fetcher.fetched if not k.endswith("/timestamp.json")]
    return Verified(
        document=document,
        every_model=not models,
        changed=before != after or bool(others),
        metadata_bytes=fetcher.bytes,
        version=version if version is not None else 0,
        fetched=list(fetcher.fetched),
    )


def open_updater(fetcher: StoreFetcher, directory: Path, root: bytes) -> Updater:
    """ngclient's Updater over ``fetcher``'s store, its metadata in ``directory``, trusting
    ``root`` (and the newer roots it finds signed by it)."""
    return _Updater(
        str(directory),
        STORE_URL + METADATA_KEYS,
        str(directory / TARGETS_DIR),
        STORE_URL + TARGETS_KEYS,
        fetcher=fetcher,
        config=UpdaterConfig(),
        bootstrap=root,
    )


def describe(exc: Exception) -> str:
    """What a TUF failure means for the device, with python-tuf's own words."""
    if isinstance(exc, tuf_errors.ExpiredMetadataError):
        kind = "expired signed metadata (a frozen or unrefreshed repository)"
    elif isinstance(exc, tuf_errors.BadVersionNumberError):
        kind = "signed metadata older than what this device trusts (rollback or mix-and-match)"
    elif isinstance(exc, tuf_errors.UnsignedMetadataError):
        kind = "metadata not signed by the trusted keys"
    elif isinstance(exc, tuf_errors.LengthOrHashMismatchError):
        kind = "metadata that is not the one its signed parent names (mix-and-match or tampered)"
    elif isinstance(exc, tuf_errors.DownloadLengthMismatchError):
        kind = "metadata longer than its signed or allowed length (endless data)"
    elif isinstance(exc, tuf_errors.SlowRetrievalError):
        kind = "metadata retrieval too slow (slow retrieval)"
    elif isinstance(exc, tuf_errors.RepositoryError):
        kind = "metadata that does not verify"
    else:
        kind = "metadata that could not be read"
    cause = exc.__cause__
    detail = f"{exc}: {cause}" if cause is not None and str(cause) not in str(exc) else str(exc)
    return f"{kind}: {detail or type(exc).__name__}; refused"


def signed_entry(updater: Updater, store: Store, model: str) -> ModelEntry:
    """The model's entry from its target's signed custom field (only its bin is loaded),
    validated; BadInputError when the signed metadata has no such model."""
    info = updater.get_targetinfo(model_target(model))
    if info is None:
        raise BadInputError(
            f"model {model!r} is not in the manifest: the signed metadata of {store.uri} "
            f"has no target {model_target(model)}"
        )
    custom = info.custom if isinstance(info.custom, dict) else {}
    value = custom.get(CUSTOM_FIELD)
    try:
        # Canonical JSON, which TUF signs, has no floats (coverage, errors, tolerances): the
        # entry may come as its JSON text, or with its floats as strings (pydantic reads both).
        if isinstance(value, str):
            return ModelEntry.model_validate_json(value)
        return ModelEntry.model_validate(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise MetadataRefused(
            f"the signed entry of {model!r} at {store.uri} fails validation at "
            f"{'.'.join(map(str, error['loc'])) or 'custom.' + CUSTOM_FIELD}: {error['msg']}"
        ) from None


def _signed_manifest(updater: Updater, store: Store, directory: Path) -> bytes:
    info = updater.get_targetinfo(MANIFEST_KEY)
    if info is None:
        raise MetadataRefused(f"the signed metadata of {store.uri} has no {MANIFEST_KEY} target")
    limit = int(settings().max_manifest_bytes)
    if info.length > limit:
        raise MetadataRefused(
            f"the signed {MANIFEST_KEY} of {store.uri} is {info.length} bytes, over the limit "
            f"of {limit} (EPFLEET_MAX_MANIFEST_BYTES); not read"
        )
    path = directory / TARGETS_DIR / MANIFEST_KEY
    _no_link(path)  # ngclient writes the target with open(): never through a link
    found = updater.find_cached_target(info, str(path))
    if found is None:
        updater.download_target(info, str(path))
    return read_nofollow(path)


def _no_link(path: Path) -> None:
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(found.st_mode):
        if stat.S_ISDIR(found.st_mode):
            os.rmdir(path)
        else:
            os.unlink(path)


def _read(path: Path) -> bytes | None:
    try:
        return read_nofollow(path)
    except OSError:
        return None


def _version(data: bytes | None) -> int | None:
    try:
        return int(json.loads(data or b"")["signed"]["version"])
    except (ValueError, KeyError, TypeError):
        return None


def cached_expiry(directory: Path) -> datetime | None:
    """When the cached signed timestamp expires (None without one)."""
    data = _read(directory / "timestamp.json")
    try:
        expires = json.loads(data or b"")["signed"]["expires"]
        return datetime.strptime(expires, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except (ValueError, KeyError, TypeError):
        return None


def cached_version(directory: Path) -> int | None:
    """The cached signed timestamp's version (None without one)."""
    return _version(_read(directory / "timestamp.json"))
