"""Enrolled device keys: the public half of each device's report-signing key, kept in the
signed manifest (``Manifest.device_keys``), so that only a holder of the store's online key
can enrol or revoke a device, and the rollout gate reads them from the same signed state
as the rollouts it judges.

``enroll`` adds a device's key in one signed publish (refused for a store without trust
metadata: an unsigned manifest would let anyone who can write the store enrol a key);
``revoke`` removes it and records it in ``Manifest.revoked_device_keys``. One key belongs
to one device: a key enrolled for another device is refused, and a revoked key stays
revoked unless ``force`` enrols it again, for the device it was revoked from (the reports
it signed before its revocation count again). The private key is made here and written
where the operator provisions devices from (``--keys``, never the store), or made on the
device and only its public key given. A device signs its reports with it (``EPFLEET_DEVICE_KEY``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)
from securesystemslib.signer import SSlibKey

from epfleet.errors import BadInputError
from epfleet.fleet.publishing.publish import update_manifest
from epfleet.formats.manifest import NAME_PATTERN, DeviceKey, Manifest, RevokedKey, utcnow
from epfleet.stores import Store
from epfleet.trust.key_location import check_keys_location
from epfleet.trust.keys import new_key, write_private_key
from epfleet.trust.pins import signed_store


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
    if not signed_store(store):
        raise BadInputError(
            f"{store.uri} has no trust metadata: authenticated reports need a signed store "
            "(epfleet trust init), or anyone who can write it could enrol a key"
        )
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

    def add(current: Manifest | None) -> Manifest | None:
        current = current or Manifest()
        revoked_before.clear()
        if device in current.device_keys:
            held = current.device_keys[device].keyid[:12]
            raise BadInputError(
                f"device {device!r} is enrolled already (key {held}); revoke it first to "
                "enrol another key"
            )
        holder = next((d for d, k in current.device_keys.items() if k.keyid == entry.keyid), None)
        if holder is not None:
            raise BadInputError(
                f"key {entry.keyid[:12]} is enrolled for device {holder!r}: one key belongs to "
                f"one device; give {device!r} a key of its own"
            )
        revoked = current.revoked_device_keys.get(entry.keyid)
        if revoked is not None:
            _check_enrol_again(revoked, entry, device, force)
            revoked_before.append(revoked)
        keys = current.device_keys | {device: entry}
        still_revoked = {k: r for k, r in current.revoked_device_keys.items() if k != entry.keyid}
        return current.succeeded_by(dict(current.models), utcnow()).model_copy(
            update={"device_keys": keys, "revoked_device_keys": still_revoked}
        )

    try:
        update_manifest(store, add)
    except BaseException:
        if written is not None:
            written.unlink(missing_ok=True)  # never enrolled: no key left behind
        raise
    return Enrolled(entry, written, revoked_before[0] if revoked_before else None)


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
    """Remove ``device``'s key from the signed manifest, recording it as revoked: its
    reports no longer count, and enrolling it again needs ``force``."""
    removed: list[DeviceKey] = []

    def drop(current: Manifest | None) -> Manifest | None:
        removed.clear()
        if current is None or device not in current.device_keys:
            raise BadInputError(f"device {device!r} is not enrolled in {store.uri}")
        removed.append(current.device_keys[device])
        keys = {d: k for d, k in current.device_keys.items() if d != device}
        gone = current.device_keys[device]
        revoked = current.revoked_device_keys | {
            gone.keyid: RevokedKey(device=device, revoked_at=utcnow())
        }
        return current.succeeded_by(dict(current.models), utcnow()).model_copy(
            update={"device_keys": keys, "revoked_device_keys": revoked}
        )

    update_manifest(store, drop)
    return removed[0]
