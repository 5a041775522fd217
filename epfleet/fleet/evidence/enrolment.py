"""Enrolled device keys: the public half of each device's report-signing key, kept in the
store's signed metadata as hashed-bin targets of their own (``epfleet.trust.device_keys``),
so that only a holder of the store's online key can enrol or revoke a device, the rollout
gate reads them from the same signed state as the rollouts it judges, and a device's sync
downloads none of them.

``enroll`` adds a device's key in one signed publish, ``enroll_batch`` the devices of a
batch file (``read_batch``) in one, or none of them (both refused for a store without trust
metadata: unsigned keys would let anyone who can write the store enrol a key); ``revoke``
removes it and records it as revoked in the device's record. ``keys_in_force`` and
``enrolled_keys`` are how readers look keys up, a device's bin at a time. One key belongs
to one device: a key enrolled for another device is refused, and a revoked key stays
revoked unless ``force`` enrols it again, for the device it was revoked from (the reports
it signed before its revocation count again). The private key is made here and written
where the operator provisions devices from (``--keys``, never the store), or made on the
device and only its public key given. A device signs its reports with it (``EPFLEET_DEVICE_KEY``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)
from securesystemslib.signer import SSlibKey

from epfleet.errors import BadInputError
from epfleet.fleet.publishing.publish import InForce, read_in_force, write_copy
from epfleet.formats.manifest import NAME_PATTERN, DeviceKey, RevokedKey, utcnow
from epfleet.settings import settings
from epfleet.stores import Store
from epfleet.trust.device_keys import (
    DeviceRecord,
    EnrolledKeys,
    KeyBook,
    KeyClaim,
    key_bins_changed,
    without_legacy_keys,
)
from epfleet.trust.key_location import check_keys_location
from epfleet.trust.keys import new_key, write_private_key
from epfleet.trust.pins import signed_store
from epfleet.trust.signers import signer_for
from epfleet.trust.signing import Changes, TrustPublished, publish_signed


def key_entry(public: SSlibKey) -> DeviceKey:
    pem = public.keyval["public"]
    return DeviceKey(
        keyid=public.keyid,
        keytype=public.keytype,
        scheme=public.scheme,
        public=pem,
        enrolled_at=utcnow(),
    )


def public_key_file(path: Path) -> SSlibKey:
    """The public key in a PEM file (a key made on the device); BadInputError otherwise."""
    try:
        loaded = load_pem_public_key(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise BadInputError(f"--public-key {path}: not a readable PEM public key ({exc})") from None
    key = SSlibKey.from_crypto(loaded)
    pem = loaded.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo).decode()
    return SSlibKey(key.keyid, key.keytype, key.scheme, {"public": pem})


@dataclass(frozen=True)
class Enrolled:
    entry: DeviceKey
    written: Path | None
    """The private key file written, if the key was made here."""
    revoked_before: RevokedKey | None
    """The revocation ``force`` overrode, when the key had been revoked."""


def enroll(
    store: Store,
    device: str,
    *,
    keys_dir: Path | None = None,
    public_key: Path | None = None,
    force: bool = False,
) -> Enrolled:
    """Enrol ``device``: its key (made here, its private half written to
    ``keys_dir/<device>.pem``; or the public key in ``public_key``) published in the signed
    manifest. ``force`` also writes ``keys_dir`` in a git work tree, and enrols a revoked
    key again. BadInputError for a key enrolled for another device, or revoked."""
    _check_signed(store)
    if not re.fullmatch(NAME_PATTERN, device):
        raise BadInputError(
            f"device id {device!r}: lower-case letters, digits, '.', '_' and '-', starting "
            "with a letter or digit (as EPFLEET_DEVICE_ID)"
        )
    if (keys_dir is None) == (public_key is None):
        raise BadInputError("give --keys DIR (a key is made here) or --public-key FILE")
    written: Path | None = None
    if public_key is not None:
        public = public_key_file(public_key)
    else:
        assert keys_dir is not None
        check_keys_location(keys_dir, force=force)
        signer = new_key()
        written = keys_dir / f"{device}.pem"
        write_private_key(written, signer)
        assert isinstance(signer.public_key, SSlibKey)
        public = signer.public_key
    entry = key_entry(public)
    revoked_before: list[RevokedKey] = []

    def add(book: KeyBook) -> list[DeviceRecord | KeyClaim]:
        revoked_before.clear()
        changed, again = enrolment_records(book, device, entry, force)
        if again is not None:
            revoked_before.append(again)
        return changed

    try:
        publish_keys(store, add)
    except BaseException:
        if written is not None:
            written.unlink(missing_ok=True)  # never enrolled: no key left behind
        raise
    return Enrolled(entry, written, revoked_before[0] if revoked_before else None)


def enrolment_records(
    book: KeyBook, device: str, entry: DeviceKey, force: bool
) -> tuple[list[DeviceRecord | KeyClaim], RevokedKey | None]:
    """The records that enrol ``entry`` for ``device`` over the signed key bins ``book``
    reads, and the revocation ``force`` overrides (if any); BadInputError for a device
    enrolled already, a key enrolled for another device, or a revoked key (without
    ``force``, or revoked from another device)."""
    record = book.record(device)
    if record is not None and record.key is not None:
        raise BadInputError(
            f"device {device!r} is enrolled already (key {record.key.keyid[:12]}); revoke "
            "it first to enrol another key"
        )
    holder = book.claim(entry.keyid)
    if holder is not None and holder != device:
        held = book.record(holder)
        when = held.revoked.get(entry.keyid) if held is not None else None
        if when is None:
            raise BadInputError(
                f"key {entry.keyid[:12]} is enrolled for device {holder!r}: one key "
                f"belongs to one device; give {device!r} a key of its own"
            )
        _check_enrol_again(RevokedKey(device=holder, revoked_at=when), entry, device, force)
    revoked = record.revoked if record is not None else {}
    again = None
    if entry.keyid in revoked:
        again = RevokedKey(device=device, revoked_at=revoked[entry.keyid])
        _check_enrol_again(again, entry, device, force)
    still_revoked = {k: when for k, when in revoked.items() if k != entry.keyid}
    changed: list[DeviceRecord | KeyClaim] = [
        DeviceRecord(device=device, key=entry, revoked=still_revoked)
    ]
    if holder is None:
        changed.append(KeyClaim(keyid=entry.keyid, device=device))
    return changed, again


@dataclass(frozen=True)
class BatchLine:
    """One device of a batch file: where it is (``FILE:LINE``), its id, and the public key
    file given for it (None: a key is made here)."""

    where: str
    device: str
    public_key: Path | None


def read_batch(path: Path) -> list[BatchLine]:
    """The devices of a batch file: one a line, ``<device id>`` (a key made here) or
    ``<device id> <public key PEM file>`` (relative to the file's folder); blank lines and
    ``#`` comments skipped. BadInputError naming the first bad line (a bad device id, too
    many fields, a device given twice)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"--from {path}: cannot read it ({exc})") from None
    lines: list[BatchLine] = []
    seen: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        where = f"{path}:{number}"
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) > 2:
            raise BadInputError(
                f"{where}: {line.strip()!r} has {len(fields)} fields; a line is a device id, "
                "optionally followed by its public key file"
            )
        device = fields[0]
        _check_device_id(device, where)
        if device in seen:
            raise BadInputError(f"{where}: device {device!r} is given already on {seen[device]}")
        seen[device] = where
        public = (path.parent / fields[1]) if len(fields) == 2 else None
        lines.append(BatchLine(where, device, public))
    if not lines:
        raise BadInputError(f"--from {path} names no device")
    return lines


@dataclass(frozen=True)
class BatchEnrolled:
    enrolled: dict[str, DeviceKey]
    """Device -> its key, as enrolled."""
    written: dict[str, Path]
    """The private key files written, for the keys made here."""
    revoked_before: dict[str, RevokedKey]
    """The revocations ``force`` overrode."""
    key_bins: list[str]
    """The key bins signed (each once)."""


def enroll_batch(
    store: Store,
    lines: list[BatchLine],
    *,
    keys_dir: Path | None = None,
    force: bool = False,
) -> BatchEnrolled:
    """Enrol every device of ``lines`` (``read_batch``) in one signed publish: each key bin
    the batch touches signed once, and the keys index once. The whole batch is refused,
    naming the line, when one device cannot be enrolled (its public key unreadable, a
    key given twice, the device enrolled already, a key enrolled for another device or
    revoked), before anything is written, in the store or in ``keys_dir``."""
    _check_signed(store)
    made_here = [line for line in lines if line.public_key is None]
    if made_here and keys_dir is None:
        raise BadInputError(
            f"{made_here[0].where}: device {made_here[0].device!r} has no public key file: "
            "give --keys DIR for the keys made here, or a public key file on the line"
        )
    if keys_dir is not None and made_here:
        check_keys_location(keys_dir, force=force)
    signers = {}
    entries: dict[str, DeviceKey] = {}
    by_key: dict[str, BatchLine] = {}
    for line in lines:
        if line.public_key is not None:
            try:
                public = public_key_file(line.public_key)
            except BadInputError as exc:
                raise BadInputError(f"{line.where}: {exc}") from None
        else:
            assert keys_dir is not None
            if (keys_dir / f"{line.device}.pem").exists():
                raise BadInputError(
                    f"{line.where}: {keys_dir / f'{line.device}.pem'} already exists; not "
                    "overwriting a private key"
                )
            signers[line.device] = signer = new_key()
            assert isinstance(signer.public_key, SSlibKey)
            public = signer.public_key
        entry = key_entry(public)
        if entry.keyid in by_key:
            raise BadInputError(
                f"{line.where}: the key of {line.device!r} is the key of "
                f"{by_key[entry.keyid].device!r} on {by_key[entry.keyid].where}: one key "
                "belongs to one device"
            )
        by_key[entry.keyid] = line
        entries[line.device] = entry
    revoked_before: dict[str, RevokedKey] = {}

    def add(book: KeyBook) -> list[DeviceRecord | KeyClaim]:
        revoked_before.clear()
        book.prefetch(entries)
        changed: list[DeviceRecord | KeyClaim] = []
        for line in lines:
            try:
                records, again = enrolment_records(book, line.device, entries[line.device], force)
            except BadInputError as exc:
                raise BadInputError(f"{line.where}: {exc}; nothing enrolled") from None
            changed += records
            if again is not None:
                revoked_before[line.device] = again
        return changed

    in_force = read_in_force(store)  # read as the publish reads it: expired or not
    add(
        KeyBook(store, in_force.state, in_force.manifest, renewing=True)
    )  # before any key is written
    written: dict[str, Path] = {}
    try:
        for device, signer in signers.items():
            assert keys_dir is not None
            written[device] = keys_dir / f"{device}.pem"
            write_private_key(written[device], signer)
        done = publish_keys(store, add)
    except BaseException:
        for path in written.values():
            path.unlink(missing_ok=True)  # never enrolled: no key left behind
        raise
    key_bins = [name for name in done.bins if name.startswith("keys-")]
    return BatchEnrolled(entries, written, dict(revoked_before), key_bins)


def _check_device_id(device: str, where: str = "device id") -> None:
    if not re.fullmatch(NAME_PATTERN, device):
        raise BadInputError(
            f"{where}: device id {device!r}: lower-case letters, digits, '.', '_' and '-', "
            "starting with a letter or digit (as EPFLEET_DEVICE_ID)"
        )


def _check_signed(store: Store) -> None:
    if not signed_store(store):
        raise BadInputError(
            f"{store.uri} has no trust metadata: authenticated reports need a signed store "
            "(epfleet trust init), or anyone who can write it could enrol a key"
        )


def _check_enrol_again(revoked: RevokedKey, entry: DeviceKey, device: str, force: bool) -> None:
    """BadInputError unless ``force`` enrols the revoked key again for its own device."""
    when = revoked.revoked_at.strftime("%Y-%m-%d %H:%M")
    if revoked.device != device:
        raise BadInputError(
            f"key {entry.keyid[:12]} was revoked from device {revoked.device!r} on {when}: "
            f"one key belongs to one device; give {device!r} a key of its own"
        )
    if not force:
        raise BadInputError(
            f"key {entry.keyid[:12]} of device {device!r} was revoked on {when}: a revoked "
            "key stays revoked; give the device a new key, or --force to enrol this one "
            "again (the reports it signed before its revocation would count again)"
        )


def revoke(store: Store, device: str) -> DeviceKey:
    """Remove ``device``'s key from the signed key bins, recording it as revoked: its
    reports no longer count, and enrolling it again needs ``force``."""
    removed: list[DeviceKey] = []

    def drop(book: KeyBook) -> list[DeviceRecord | KeyClaim]:
        removed.clear()
        record = book.record(device)
        if record is None or record.key is None:
            raise BadInputError(f"device {device!r} is not enrolled in {store.uri}")
        removed.append(record.key)
        revoked = {**record.revoked, record.key.keyid: utcnow()}
        return [DeviceRecord(device=device, key=None, revoked=revoked)]

    publish_keys(store, drop)
    return removed[0]


@dataclass(frozen=True)
class Migrated:
    """What ``migrate_keys`` moved."""

    devices: int
    """Devices whose keys moved from the signed manifest into the key bins."""
    listed_bins: int
    """Key bins whose listing moved from the snapshot into the keys index."""


def migrate_keys(store: Store) -> Migrated:
    """Move the keys a store's signed manifest still carries (``device_keys``,
    ``revoked_device_keys``, written before the keys had bins of their own) into the key
    bins, and the listing of the key bins a store's snapshot still carries (written before
    the keys index) into the keys index, in one signed publish that drops them from the
    manifest and the snapshot (nothing to move: nothing signed)."""
    moved: list[Migrated] = []

    def nothing_else(book: KeyBook) -> list[DeviceRecord | KeyClaim]:
        devices = set(book.legacy_keys) | {r.device for r in book.legacy_revoked.values()}
        listed = len(book.listing()) if book.index.signed is None else 0
        moved[:] = [Migrated(len(devices), listed)]
        return []

    publish_keys(store, nothing_else)
    return moved[0] if moved else Migrated(0, 0)


def publish_keys(
    store: Store, edit: Callable[[KeyBook], list[DeviceRecord | KeyClaim]]
) -> TrustPublished:
    """Sign the records ``edit`` derives from the signed key bins (the bins they live in,
    then snapshot and timestamp, by compare-and-swap: ``edit`` runs again on the newer
    state after a lost race), moving any keys the manifest still carries into the bins in
    the same publish."""
    _check_signed(store)
    signer = signer_for(store)
    assert signer is not None  # a signed store has a signer, or signer_for raised
    done = publish_signed(
        store,
        signer,
        None,
        Changes(
            change=lambda document: without_legacy_keys(document, utcnow()),
            keys=lambda book: key_bins_changed(book, edit(book)),
        ),
    )
    if done.changed:
        write_copy(store)  # the manifest lost its keys: its copy follows
    return done


def keys_in_force(store: Store, in_force: InForce | None = None) -> EnrolledKeys:
    """The enrolled device keys in force (``in_force``: the manifest in force, read
    already), looked up device by device in the signed key bins, and in the manifest of a
    store whose keys have not moved yet."""
    in_force = in_force if in_force is not None else read_in_force(store)
    return EnrolledKeys(KeyBook(store, in_force.state, in_force.manifest, local_key_bins()))


def local_key_bins() -> Path:
    """Where this machine keeps the key bins its readers verified (the worker cache)."""
    return settings().cache / "work" / "key-bins"


def enrolled_keys(store: Store, devices: Iterable[str]) -> dict[str, DeviceKey]:
    """The keys in force of ``devices`` (those enrolled), reading only their bins."""
    wanted = list(devices)
    keys = keys_in_force(store).prefetch(wanted)
    return {device: keys[device] for device in wanted if device in keys}
