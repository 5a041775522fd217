"""Enrolled device keys as signed hashed-bin targets of their own, apart from the manifest.

Each enrolled device has a target ``device-keys/<device id>`` whose signed custom field
``epfleet`` is its record (``DeviceRecord``: the key in force, if any, and the keys revoked
from it), and each key ever enrolled a target ``device-key-ids/<key id>`` naming the
device it was enrolled for (``KeyClaim``: one key belongs to one device, for good). They
live in succinct hashed bins ``keys-000`` .. ``keys-1ff`` (``KEY_BIN_BITS``) signed by the
online key, the key the ``targets`` role delegates the model bins to (re-read from the
signed ``targets`` every time, so an online-key rotation carries them over), and listed in
the snapshot like every bin: a reader verifies a key bin through root, timestamp, snapshot
(its version and length) and ``targets`` (its key), and an older bin put back is refused
as a rollback. Devices never load them: nothing ``targets`` delegates leads to them, and a
device asks only for the targets of models, field rankings and ``manifest.json``, so it
downloads no key; each key bin costs its snapshot one entry. A standard TUF client cannot
resolve ``device-keys/...`` paths: the fleet side's reader (``KeyBook``) verifies them.

Enrolling or revoking a device signs again its one bin (and, for a key new to the store,
the bin of its claim), then snapshot and timestamp, by the same compare-and-swap as every
publish (``epfleet.trust.signing``, ``Changes.keys``). A store whose signed manifest
still carries ``device_keys`` / ``revoked_device_keys`` (written before the keys moved)
is read through both (``KeyBook``); the next enrol or revoke, or
``epfleet device migrate-keys``, moves them into the bins in the same signed publish that
drops them from the manifest.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tuf.api.metadata import Delegations, Metadata, MetaFile, SuccinctRoles, TargetFile, Targets

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
    metadata_key,
)
from epfleet.trust.state import RepositoryState, _signed_by, load_versioned
from epfleet.trust.targets import Target, canonical

READ_THREADS = 8

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
    ):
        self.store = store
        self.state = state
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
        self._lock = threading.Lock()
        self.bins_read = 0

    def bin_of(self, path: str) -> str:
        assert self.succinct is not None
        return self.succinct.get_role_for_target(path)

    def existing_bins(self) -> list[str]:
        """The key bins the snapshot names (a bin no key was ever put in does not exist)."""
        if self.state is None or self.state.snapshot is None:
            return []
        meta = self.state.snapshot.signed.meta
        assert self.succinct is not None
        return [n for n in self.succinct.get_roles() if f"{n}.json" in meta]

    def signed_bin(self, name: str) -> Targets | None:
        """Key bin ``name`` verified through the TUF chain (None: the snapshot names no such
        bin). Unverified, naming it, when it does not verify."""
        with self._lock:
            if name in self._signed:
                return self._signed[name]
        state = self.state
        signed: Targets | None = None
        meta = self._meta(name)
        if state is not None and meta is not None:
            key = metadata_key(name, meta.version)
            check = _signed_by(_delegator(state), name, meta.version)
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
            self.bins_read += signed is not None
        return signed

    def _meta(self, name: str) -> MetaFile | None:
        if self.state is None or self.state.snapshot is None:
            return None
        return self.state.snapshot.signed.meta.get(f"{name}.json")

    def _local_file(self, name: str) -> Path | None:
        """Where this machine keeps the records of key bin ``name`` at the version the
        snapshot signs, once verified (None: no local copy for this book)."""
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
            try:
                texts = json.loads(local.read_bytes())
            except (OSError, ValueError):
                texts = None
            if isinstance(texts, dict):
                with self._lock:
                    self._texts[name] = texts
                return texts
        self.signed_bin(name)
        texts = self._texts[name]
        if local is not None:
            try:
                local.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(local, json.dumps(texts).encode())
            except OSError as exc:  # only a cost: the next run verifies this bin again
                logger.info("key bin %s not kept in %s: %s", name, local.parent, exc)
        return texts

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
        """The signed version of ``device``'s key bin, ``<bin>@<version>`` (no bin read):
        its key is the same while the stamp is. None when there is no such shortcut (an
        unsigned store, or keys not moved out of the manifest yet)."""
        book = self.book
        if book.succinct is None or book.state is None or book.state.snapshot is None:
            return None
        if not book.migrated:
            return None
        name = book.bin_of(device_target(device))
        meta = book.state.snapshot.signed.meta.get(f"{name}.json")
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
