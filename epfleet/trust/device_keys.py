"""Enrolled device keys as signed hashed-bin targets of their own, apart from the manifest.

Each enrolled device has a target ``device-keys/<device id>`` whose signed custom field
``epfleet`` is its record (``DeviceRecord``: the key in force, if any, and the keys revoked
from it), and each key ever enrolled a target ``device-key-ids/<key id>`` naming the
device it was enrolled for (``KeyClaim``: one key belongs to one device, for good). They
live in succinct hashed bins ``keys-000`` .. ``keys-1ff`` (``KEY_BIN_BITS``) signed by the
online key, the key the ``targets`` role delegates the model bins to (re-read from the
signed ``targets`` every time, so an online-key rotation carries them over).

The bins are listed in a signed index of their own, ``trust/metadata/keys-index.json``
(``KeysIndex``: each bin's version, length and sha256, the index's version and expiry,
signed by the same key), not in the snapshot devices download: enrolling or revoking a
device signs again its one bin (and, for a key new to the store, the bin of its claim)
and the index, replaced by compare-and-swap, and leaves the snapshot and timestamp
devices poll as they are. A reader verifies a key bin through root, timestamp, snapshot
and ``targets`` (its key) and the index (its version, length and hash); it refuses an
index older than the newest it verified from that store (kept in memory and in its local
folder), so an older index put back is refused as a rollback, and so is an older bin;
and an expired index or bin (``epfleet trust refresh`` signs them again at half their
life: the index lists each bin's expiry). A publisher refuses to sign over an index older
than what its host signed or verified (``keys_rollback``, the mark kept beside the worker
cache's record of the store: ``epfleet.trust.pins``).
Devices never load them: nothing ``targets`` delegates leads to them, and a device asks
only for the targets of models, field rankings and ``manifest.json``. A standard TUF
client cannot resolve ``device-keys/...`` paths: the fleet side's reader (``KeyBook``)
verifies them.

A store whose signed manifest still carries ``device_keys`` / ``revoked_device_keys``
(written before the keys moved) is read through both (``KeyBook``); the next enrol or
revoke, or ``epfleet device migrate-keys``, moves them into the bins in the same signed
publish that drops them from the manifest. A store whose snapshot lists the key bins
(written before the keys index) is read through its snapshot until the next enrol,
revoke or ``migrate-keys`` writes the index and signs a snapshot without them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tuf.api import exceptions as tuf_errors
from tuf.api.metadata import (
    DelegatedRole,
    Delegations,
    Metadata,
    MetaFile,
    Snapshot,
    SuccinctRoles,
    TargetFile,
    Targets,
)

from epfleet.errors import StoreError, Unverified
from epfleet.formats.manifest import DeviceKey, KeyId, Manifest, Name, RevokedKey
from epfleet.fsutil import atomic_write_bytes
from epfleet.hashing import sha256_bytes
from epfleet.stores import Store
from epfleet.trust.layout import (
    CUSTOM_FIELD,
    DEVICE_KEY_TARGETS,
    KEY_BIN_BITS,
    KEY_BIN_PREFIX,
    KEY_ID_TARGETS,
    KEYS_INDEX,
    KEYS_INDEX_KEY,
    metadata_key,
    utcnow,
)
from epfleet.trust.state import (
    Check,
    RepositoryState,
    RoleStatus,
    _signed_by,
    index_marks,
    load_versioned,
    parse_metadata,
)
from epfleet.trust.targets import Target, canonical

READ_THREADS = 8
INDEX_FIELD = "epfleet_keys_index"
"""Set in the signed part of a keys index: what tells it from a snapshot (both are signed
by the online key), so that no snapshot, listing key bins of another time, passes for one."""

EXPIRES_FIELD = "epfleet_expires"
"""Beside a key bin's version, length and hash in the keys index: when that bin's signature
expires, so that a refresh finds the bins to sign again without reading them."""
RENEW = "epfleet trust refresh"

_marks_lock = threading.Lock()

logger = logging.getLogger(__name__)


class DeviceRecord(BaseModel):
    """What the signed key bins say of one device."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: Name
    key: DeviceKey | None = Field(default=None, description="The key in force (None: revoked)")
    revoked: dict[KeyId, datetime] = Field(
        default_factory=dict, description="Keys revoked from this device, and when"
    )


class KeyClaim(BaseModel):
    """The device a key was enrolled for (it stays that device's, revoked or not)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    keyid: KeyId
    device: Name


def device_target(device: str) -> str:
    return DEVICE_KEY_TARGETS + device


def claim_target(keyid: str) -> str:
    return KEY_ID_TARGETS + keyid


def key_succinct(state: RepositoryState) -> SuccinctRoles:
    """The key bins, delegated to the key the signed ``targets`` delegates its bins to."""
    return SuccinctRoles(state.succinct.keyids, 1, KEY_BIN_BITS, KEY_BIN_PREFIX)


def _delegator(state: RepositoryState) -> Metadata[Targets]:
    """An unsigned stand-in for the role delegating the key bins, built from verified
    parts only (the keys ``targets`` names for its bins), for ``Metadata.verify_delegate``."""
    delegations = state.targets.signed.delegations
    assert delegations is not None  # state.succinct raised otherwise
    keyids = state.succinct.keyids
    keys = {k: v for k, v in delegations.keys.items() if k in keyids}
    return Metadata(Targets(delegations=Delegations(keys, succinct_roles=key_succinct(state))))


def _index_delegator(state: RepositoryState) -> Metadata[Targets]:
    """An unsigned stand-in delegating the keys index to the key ``targets`` delegates its
    bins to (as ``_delegator``), for ``Metadata.verify_delegate``."""
    delegations = state.targets.signed.delegations
    assert delegations is not None
    keyids = list(state.succinct.keyids)
    keys = {k: v for k, v in delegations.keys.items() if k in keyids}
    role = DelegatedRole(KEYS_INDEX, keyids, 1, True, paths=[KEYS_INDEX])
    return Metadata(Targets(delegations=Delegations(keys, roles={KEYS_INDEX: role})))


class KeysIndex:
    """The signed keys index as read (``signed`` None: the store has none yet) and the
    store's version of it, for the compare-and-swap that replaces it."""

    def __init__(self, signed: Snapshot | None, etag: str | None):
        self.signed = signed
        self.etag = etag


def new_keys_index(version: int, expires: datetime, meta: dict[str, MetaFile]) -> Snapshot:
    return Snapshot(
        version=version, expires=expires, meta=meta, unrecognized_fields={INDEX_FIELD: True}
    )


def read_keys_index(
    store: Store,
    state: RepositoryState,
    local: Path | None,
    now: datetime,
    *,
    renewing: bool = False,
) -> KeysIndex:
    """The keys index, verified: signed by the key of the key bins, marked as a keys index,
    not expired (unless ``renewing``: a publisher reads it to sign it again), and no older
    than the newest this process (or, with ``local``, this machine) verified from the
    store; Unverified, naming it, otherwise."""
    where = f"{store.uri}/{KEYS_INDEX_KEY}"
    found = store.read(KEYS_INDEX_KEY)
    if found is None:
        highest = _highest_index(store, state, local)
        if highest > 0:
            raise Unverified(
                f"{where} is missing, but this reader verified version {highest} of it: the "
                "signed keys index was deleted (without it no device key can be read); "
                "restore it from a backup of the store"
            )
        return KeysIndex(None, None)
    metadata = parse_metadata(store, KEYS_INDEX_KEY, found.data)
    signed = metadata.signed
    try:
        _index_delegator(state).verify_delegate(KEYS_INDEX, metadata)
        if (
            not isinstance(signed, Snapshot)
            or signed.unrecognized_fields.get(INDEX_FIELD) is not True
        ):
            raise ValueError("it is not a keys index")
    except (tuf_errors.RepositoryError, ValueError) as exc:
        raise Unverified(
            f"{where} does not verify ({exc}): the signed keys index, which lists the key "
            "bins, was written by someone without the online key, or is damaged; restore "
            "it from a backup of the store"
        ) from None
    highest = _highest_index(store, state, local)
    if signed.version < highest:
        raise Unverified(
            f"{where} is version {signed.version}, older than version {highest} this reader "
            "verified already: an older signed keys index was put back (a rollback, which "
            "would bring back revoked keys); restore the newest from a backup of the store"
        )
    if signed.expires < now and not renewing:
        raise Unverified(
            f"{where} expired on {signed.expires:%Y-%m-%d %H:%M} UTC: the signed keys index "
            "lists the key bins, so no device key can be read; sign it again (and the key "
            f"bins near expiry) with {RENEW} --store {store.uri} (EPFLEET_TRUST_SIGNER set "
            "to the online key)"
        )
    _remember_index(store, state, local, signed.version)
    return KeysIndex(signed, found.etag)


def keys_rollback(
    marked_index: int,
    marked_bins: Mapping[str, int],
    index_version: int | None,
    listing: Mapping[str, MetaFile],
) -> str | None:
    """Why a keys index (its version, None: the store has none, and the key bins it lists)
    is older than what a publisher signed or verified before (the highest index version,
    and each key bin's highest version), or None when it is not. A key bin listed at a
    lower version than seen before means an index was signed over an older one by a
    publisher that did not know the newer (a rollback laundered by another host)."""
    if index_version is None:
        if marked_index == 0:
            return None
        return f"is missing, but version {marked_index} of it was signed or verified here"
    if index_version < marked_index:
        return (
            f"is version {index_version}, older than version {marked_index} signed or verified here"
        )
    older = {
        name: (listed.version if listed is not None else 0, seen)
        for name, seen in marked_bins.items()
        if (listed := listing.get(f"{name}.json")) is None or listed.version < seen
    }
    if not older:
        return None
    name, (listed_version, seen) = min(older.items())
    what = (
        f"lists key bin {name} at version {listed_version}"
        if listed_version
        else f"does not list key bin {name}"
    )
    more = f" (and {len(older) - 1} more key bins)" if len(older) > 1 else ""
    return (
        f"is version {index_version} but {what}, whose version {seen} was signed or "
        f"verified here{more}: another publisher signed it over an older keys index put "
        "back in the store"
    )


def _mark_file(store: Store, state: RepositoryState, local: Path) -> Path:
    store_id = sha256_bytes(store.uri.encode())[:16]
    return local / f"{store_id}-{state.repository[:16]}" / "keys-index.version"


def _highest_index(store: Store, state: RepositoryState, local: Path | None) -> int:
    with _marks_lock:
        highest = index_marks.get((store.uri, state.repository), 0)
    if local is not None:
        with contextlib.suppress(OSError, ValueError):  # no mark kept: the one in memory
            highest = max(highest, int(_mark_file(store, state, local).read_text()))
    return highest


def _remember_index(store: Store, state: RepositoryState, local: Path | None, version: int) -> None:
    with _marks_lock:
        key = (store.uri, state.repository)
        index_marks[key] = max(version, index_marks.get(key, 0))
    if local is not None and _highest_index(store, state, local) <= version:
        path = _mark_file(store, state, local)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, str(version).encode())
        except OSError as exc:  # only a cost: the mark in memory still holds for this process
            logger.info("keys index version not kept in %s: %s", path.parent, exc)


def _read_local_copy(path: Path) -> tuple[dict[str, Any], datetime] | None:
    """The records and expiry of a key bin a reader verified and kept (None: none kept, or
    kept in an older form: the bin is verified again)."""
    try:
        copy = json.loads(path.read_bytes())
        records, expires = copy["records"], datetime.fromisoformat(copy["expires"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(records, dict) or expires.tzinfo is None:
        return None
    return records, expires


def listed_expiry(meta: MetaFile) -> datetime | None:
    """When the key bin the keys index lists as ``meta`` expires (None: not listed, as an
    index signed before listed no expiry)."""
    text = meta.unrecognized_fields.get(EXPIRES_FIELD)
    try:
        return datetime.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def listing_entry(version: int, raw: bytes, expires: datetime) -> MetaFile:
    """A key bin's entry in the keys index: its version, length, sha256 and expiry."""
    meta = MetaFile.from_data(version, raw, ["sha256"])
    meta.unrecognized_fields[EXPIRES_FIELD] = expires.strftime("%Y-%m-%dT%H:%M:%SZ")
    return meta


def bins_to_renew(listing: Mapping[str, MetaFile], lifetime: timedelta, now: datetime) -> list[str]:
    """The key bins a refresh signs again: those with less than half their lifetime left,
    and those whose expiry the keys index does not list (it is listed once they are)."""
    found = []
    for file, meta in listing.items():
        expires = listed_expiry(meta)
        if expires is None or expires - now < lifetime / 2:
            found.append(file.removesuffix(".json"))
    return sorted(found)


def record_target(record: DeviceRecord | KeyClaim) -> Target:
    """The signed target of ``record``: its file and custom field its canonical JSON."""
    path = (
        device_target(record.device)
        if isinstance(record, DeviceRecord)
        else claim_target(record.keyid)
    )
    data = canonical(record.model_dump(mode="json", exclude_defaults=True))
    info = TargetFile.from_data(path, data, ["sha256"])
    info.unrecognized_fields["custom"] = {CUSTOM_FIELD: data.decode()}
    return Target(info, data)


def _parse(store: Store, name: str, path: str, text: Any) -> DeviceRecord | KeyClaim:
    """The record ``text`` (a target's signed custom field) of target ``path``."""
    where = f"{store.uri}: signed key bin {name}, target {path}"
    try:
        if not isinstance(text, str):
            raise TypeError("its custom field carries no record")
        if path.startswith(DEVICE_KEY_TARGETS):
            record: DeviceRecord | KeyClaim = DeviceRecord.model_validate_json(text)
            if device_target(record.device) != path:
                raise ValueError(f"it is the record of device {record.device!r}")
        elif path.startswith(KEY_ID_TARGETS):
            record = KeyClaim.model_validate_json(text)
            if claim_target(record.keyid) != path:
                raise ValueError(f"it is the claim of key {record.keyid}")
        else:
            raise ValueError("not a device key's target")
    except (TypeError, ValueError, ValidationError) as exc:
        raise StoreError(f"{where} is not a device key record: {exc}") from None
    return record


def _listed(meta: MetaFile, check: Check) -> Check:
    """``check``, and the bin is the one the keys index lists (its length and hash)."""

    def listed(data: bytes, metadata: Metadata[Any]) -> None:
        meta.verify_length_and_hashes(data)
        check(data, metadata)

    return listed


class KeyBook:
    """The enrolled device keys of a signed state, read bin by bin as asked (each bin
    verified once, then kept), and those its manifest still carries from before the keys
    had bins of their own (``legacy``). Safe to use from several threads."""

    def __init__(
        self,
        store: Store,
        state: RepositoryState | None,
        legacy: Manifest | None,
        local: Path | None = None,
        *,
        renewing: bool = False,
    ):
        self.store = store
        self.state = state
        self.renewing = renewing
        """A publisher's book: expired key bins and keys index are read, to be signed again."""
        self.local = local
        """A folder of this machine's where readers keep the records of the key bins they
        verified, by version (signed versions are never rewritten): a later process reads
        and verifies again only the bins that changed. None for publishers, who sign from
        what they verify."""
        self.legacy_keys: dict[str, DeviceKey] = dict(legacy.device_keys) if legacy else {}
        self.legacy_revoked: dict[str, RevokedKey] = (
            dict(legacy.revoked_device_keys) if legacy else {}
        )
        self.succinct = key_succinct(state) if state is not None else None
        self._texts: dict[str, dict[str, Any]] = {}
        self._parsed: dict[str, DeviceRecord | KeyClaim] = {}
        self._signed: dict[str, Targets | None] = {}
        self._expires: dict[str, datetime] = {}
        self._lock = threading.Lock()
        self._index: KeysIndex | None = None
        self.bins_read = 0

    @property
    def index(self) -> KeysIndex:
        """The signed keys index (read and verified once per book)."""
        with self._lock:
            if self._index is not None:
                return self._index
        found = (
            read_keys_index(self.store, self.state, self.local, utcnow(), renewing=self.renewing)
            if self.state is not None and self.state.snapshot is not None
            else KeysIndex(None, None)
        )
        with self._lock:
            if self._index is None:
                self._index = found
            return self._index

    def listing(self) -> dict[str, MetaFile]:
        """Key bin file name -> its signed version (and length, hash): from the keys index,
        or, on a store that has none yet, from the snapshot that listed them before."""
        if self.state is None or self.state.snapshot is None:
            return {}
        index = self.index.signed
        if index is not None:
            return index.meta
        assert self.succinct is not None
        meta = self.state.snapshot.signed.meta
        return {
            f"{n}.json": meta[f"{n}.json"] for n in self.succinct.get_roles() if f"{n}.json" in meta
        }

    def bin_of(self, path: str) -> str:
        assert self.succinct is not None
        return self.succinct.get_role_for_target(path)

    def existing_bins(self) -> list[str]:
        """The key bins the keys index names (a bin no key was ever put in does not exist)."""
        if self.succinct is None:
            return []
        meta = self.listing()
        return [n for n in self.succinct.get_roles() if f"{n}.json" in meta]

    def signed_bin(self, name: str) -> Targets | None:
        """Key bin ``name`` verified through the TUF chain and the keys index (None: the
        index names no such bin). Unverified, naming it, when it does not verify."""
        with self._lock:
            if name in self._signed:
                return self._signed[name]
        state = self.state
        signed: Targets | None = None
        meta = self._meta(name)
        if state is not None and meta is not None:
            key = metadata_key(name, meta.version)
            check = _listed(meta, _signed_by(_delegator(state), name, meta.version))
            try:
                signed = load_versioned(
                    self.store, state.repository, key, check, meta.length
                ).signed
            except Unverified as exc:
                raise Unverified(
                    f"{exc}. It is the signed key bin {name}: the keys of the devices in it "
                    "cannot be read, so their reports are not judged; restore it from a "
                    "backup of the store"
                ) from None
        texts = {}
        for path, info in (signed.targets if signed is not None else {}).items():
            if self.bin_of(path) != name:
                raise StoreError(f"{self.store.uri}: signed key bin {name} holds {path}")
            texts[path] = info.unrecognized_fields.get("custom", {}).get(CUSTOM_FIELD)
        with self._lock:
            self._signed[name] = signed
            self._texts[name] = texts
            if signed is not None:
                self._expires[name] = signed.expires
            self.bins_read += signed is not None
        return signed

    def _meta(self, name: str) -> MetaFile | None:
        return self.listing().get(f"{name}.json")

    def _local_file(self, name: str) -> Path | None:
        """Where this machine keeps the records of key bin ``name`` at the version the
        keys index signs, once verified (None: no local copy for this book)."""
        meta = self._meta(name)
        if self.local is None or self.state is None or meta is None:
            return None
        store_id = sha256_bytes(self.store.uri.encode())[:16]
        folder = self.local / f"{store_id}-{self.state.repository[:16]}"
        return folder / f"{meta.version}.{name}.{meta.length}.json"

    def _records(self, name: str) -> dict[str, Any]:
        """Target path -> its record's text, for key bin ``name``: from this machine's copy
        of it at the signed version, else read and verified (and then copied)."""
        with self._lock:
            if name in self._texts:
                return self._texts[name]
        local = self._local_file(name)
        if local is not None:
            kept = _read_local_copy(local)
            if kept is not None:
                texts, expires = kept
                self._check_expiry(name, expires)
                with self._lock:
                    self._texts[name] = texts
                return texts
        self.signed_bin(name)
        texts = self._texts[name]
        signed_expiry = self._expires.get(name)
        if signed_expiry is not None:
            self._check_expiry(name, signed_expiry)
        if local is not None and signed_expiry is not None:
            copy = {"expires": signed_expiry.isoformat(), "records": texts}
            try:
                local.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(local, json.dumps(copy).encode())
            except OSError as exc:  # only a cost: the next run verifies this bin again
                logger.info("key bin %s not kept in %s: %s", name, local.parent, exc)
        return texts

    def _check_expiry(self, name: str, expires: datetime) -> None:
        """Unverified, naming the bin and how to renew it, when key bin ``name`` expired
        (a publisher's book reads it anyway, to sign it again)."""
        if self.renewing or expires >= utcnow():
            return
        meta = self._meta(name)
        version = f" (version {meta.version})" if meta is not None else ""
        raise Unverified(
            f"{self.store.uri}: the signed key bin {name}{version} expired on "
            f"{expires:%Y-%m-%d %H:%M} UTC: the keys of the devices in it cannot be read, so "
            f"their reports are not judged; sign it again with {RENEW} --store "
            f"{self.store.uri} (EPFLEET_TRUST_SIGNER set to the online key)"
        )

    def _record(self, name: str, path: str) -> DeviceRecord | KeyClaim | None:
        text = self._records(name).get(path)
        if path not in self._texts[name]:
            return None
        parsed = self._parsed.get(path)
        if parsed is None:
            parsed = self._parsed[path] = _parse(self.store, name, path, text)
        return parsed

    def record(self, device: str) -> DeviceRecord | None:
        """The device's record: from its bin, else from the legacy manifest fields."""
        if self.succinct is not None:
            path = device_target(device)
            found = self._record(self.bin_of(path), path)
            if found is not None:
                assert isinstance(found, DeviceRecord)
                return found
        key = self.legacy_keys.get(device)
        revoked = {k: r.revoked_at for k, r in self.legacy_revoked.items() if r.device == device}
        if key is None and not revoked:
            return None
        return DeviceRecord(device=device, key=key, revoked=revoked)

    def claim(self, keyid: str) -> str | None:
        """The device key ``keyid`` was enrolled for (None: never enrolled here)."""
        if self.succinct is not None:
            path = claim_target(keyid)
            found = self._record(self.bin_of(path), path)
            if found is not None:
                assert isinstance(found, KeyClaim)
                return found.device
        revoked = self.legacy_revoked.get(keyid)
        if revoked is not None:
            return revoked.device
        return next((d for d, k in self.legacy_keys.items() if k.keyid == keyid), None)

    def key(self, device: str) -> DeviceKey | None:
        record = self.record(device)
        return record.key if record is not None else None

    def prefetch(self, devices: Iterable[str]) -> None:
        """Read (in parallel) the bins of ``devices``, only those."""
        if self.succinct is None:
            return
        names = sorted({self.bin_of(device_target(d)) for d in devices})
        with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
            list(pool.map(self._records, names))

    def every_record(self) -> dict[str, DeviceRecord]:
        """Every device's record (reads every key bin)."""
        if self.succinct is not None:
            names = self.existing_bins()
            with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
                list(pool.map(self._records, names))
        found: dict[str, DeviceRecord] = {}
        for name in self.existing_bins():
            for path in self._records(name):
                record = self._record(name, path)
                if isinstance(record, DeviceRecord):
                    found[record.device] = record
        legacy_devices = set(self.legacy_keys) | {r.device for r in self.legacy_revoked.values()}
        for device in sorted(legacy_devices - set(found)):
            legacy = self.record(device)
            if legacy is not None:
                found[device] = legacy
        return found

    @property
    def migrated(self) -> bool:
        """No key is left in the manifest."""
        return not self.legacy_keys and not self.legacy_revoked


class EnrolledKeys(Mapping[str, DeviceKey]):
    """Device id -> its key in force, read from the signed key bins as asked: what the
    rollout gate, the evidence index, the field view and runtime-watch look keys up in.
    Looking a device up reads only its bin; iterating reads every bin."""

    def __init__(self, book: KeyBook):
        self.book = book

    def __getitem__(self, device: str) -> DeviceKey:
        key = self.book.key(device)
        if key is None:
            raise KeyError(device)
        return key

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(d for d, r in self.book.every_record().items() if r.key is not None))

    def __len__(self) -> int:
        return sum(1 for r in self.book.every_record().values() if r.key is not None)

    def stamp(self, device: str) -> str | None:
        """The signed version of ``device``'s key bin, ``<bin>@<version>`` (from the keys
        index, no bin read): its key is the same while the stamp is. None when there is no
        such shortcut (an unsigned store, or keys not moved out of the manifest yet)."""
        book = self.book
        if book.succinct is None or book.state is None or book.state.snapshot is None:
            return None
        if not book.migrated:
            return None
        name = book.bin_of(device_target(device))
        meta = book.listing().get(f"{name}.json")
        return f"{name}@{meta.version if meta is not None else 0}"

    def __bool__(self) -> bool:
        """Whether the store has enrolled keys (a key bin, or keys in the manifest), read
        without reading a bin: a store whose every device was revoked still counts."""
        return bool(self.book.existing_bins() or self.book.legacy_keys)

    def prefetch(self, devices: Iterable[str]) -> EnrolledKeys:
        self.book.prefetch(devices)
        return self


def key_bins_changed(
    book: KeyBook, changed: Iterable[DeviceRecord | KeyClaim]
) -> dict[str, dict[str, Target]]:
    """The key bins to sign again for ``changed`` records: each bin's targets, whole (those
    signed now, carried as they are, with the changed ones in their place), and, while the
    manifest still carries keys, every legacy key moved into its bin."""
    moved: list[DeviceRecord | KeyClaim] = []
    if not book.migrated:
        devices = set(book.legacy_keys) | {r.device for r in book.legacy_revoked.values()}
        for device in sorted(devices):
            legacy = book.record(device)
            if legacy is not None:
                moved.append(legacy)
        for device, key in book.legacy_keys.items():
            moved.append(KeyClaim(keyid=key.keyid, device=device))
        for keyid, revoked in book.legacy_revoked.items():
            moved.append(KeyClaim(keyid=keyid, device=revoked.device))
    targets: dict[str, dict[str, Target]] = {}
    for record in [*moved, *changed]:
        target = record_target(record)
        name = book.bin_of(target.info.path)
        if name not in targets:
            signed = book.signed_bin(name)
            targets[name] = {
                p: Target(info, b"", carried=True)
                for p, info in (signed.targets.items() if signed is not None else ())
            }
        targets[name][target.info.path] = target
    return targets


def every_key_bin(book: KeyBook) -> dict[str, dict[str, Target]]:
    """Every key bin's targets as signed now, carried as they are (to be signed again by a
    new online key)."""
    found = {}
    for name in book.existing_bins():
        signed = book.signed_bin(name)
        assert signed is not None
        found[name] = {p: Target(info, b"", carried=True) for p, info in signed.targets.items()}
    return found


def without_legacy_keys(document: Manifest | None, now: datetime) -> Manifest | None:
    """The manifest's next generation without the keys it carried from before the key
    bins (None: it carries none)."""
    if document is None or (not document.device_keys and not document.revoked_device_keys):
        return None
    return document.succeeded_by(dict(document.models), now).model_copy(
        update={"device_keys": {}, "revoked_device_keys": {}}
    )


def keys_status(store: Store, state: RepositoryState) -> list[RoleStatus]:
    """The keys index's version and expiry, and the key bin that expires first (from the
    expiries the index lists), as ``epfleet trust status`` shows the roles: read as a
    publisher does, expired or not. None of them when the store has no keys index."""
    index = KeyBook(store, state, None, renewing=True).index.signed
    if index is None:
        return []
    rows = [RoleStatus("keys index", index.version, index.expires)]
    listed = [(e, n, m) for n, m in index.meta.items() if (e := listed_expiry(m)) is not None]
    if listed:
        expires, file, meta = min(listed)
        name = file.removesuffix(".json")
        rows.append(RoleStatus(f"key bins (first to expire: {name})", meta.version, expires))
    unlisted = len(index.meta) - len(listed)
    if unlisted:
        logger.warning(
            "%s: the keys index lists no expiry for %d key bins (signed before it listed "
            "them): the next %s --store %s signs them again and lists them",
            store.uri,
            unlisted,
            RENEW,
            store.uri,
        )
    return rows
