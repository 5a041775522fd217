"""Enrolled device keys: the public half of each device's report-signing key, kept in the
signed manifest (``Manifest.device_keys``), so that only a holder of the store's online key
can enrol or revoke a device, and the rollout gate reads them from the same signed state
as the rollouts it judges.

``enroll`` adds a device's key in one signed publish (refused for a store without trust
metadata: an unsigned manifest would let anyone who can write the store enrol a key);
``revoke`` removes it. The private key is made here and written where the operator
provisions devices from (``--keys``, never the store), or made on the device and only its
public key given. A device signs its reports with it (``EPFLEET_DEVICE_KEY``).
"""

from __future__ import annotations

import re
from pathlib import Path

from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_public_key,
)
from securesystemslib.signer import SSlibKey

from epfleet.errors import BadInputError
from epfleet.fleet.publishing import update_manifest
from epfleet.formats.manifest import NAME_PATTERN, DeviceKey, Manifest, utcnow
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


def enroll(
    store: Store,
    device: str,
    *,
    keys_dir: Path | None = None,
    public_key: Path | None = None,
    force: bool = False,
) -> tuple[DeviceKey, Path | None]:
    """Enrol ``device``: its key (made here, its private half written to
    ``keys_dir/<device>.pem``; or the public key in ``public_key``) published in the signed
    manifest. Returns the entry and the private key file written, if any."""
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

    def add(current: Manifest | None) -> Manifest | None:
        current = current or Manifest()
        if device in current.device_keys:
            held = current.device_keys[device].keyid[:12]
            raise BadInputError(
                f"device {device!r} is enrolled already (key {held}); revoke it first to "
                "enrol another key"
            )
        keys = current.device_keys | {device: entry}
        return current.succeeded_by(dict(current.models)).model_copy(update={"device_keys": keys})

    try:
        update_manifest(store, add)
    except BaseException:
        if written is not None:
            written.unlink(missing_ok=True)  # never enrolled: no key left behind
        raise
    return entry, written


def revoke(store: Store, device: str) -> DeviceKey:
    """Remove ``device``'s key from the signed manifest: its reports no longer count."""
    removed: list[DeviceKey] = []

    def drop(current: Manifest | None) -> Manifest | None:
        removed.clear()
        if current is None or device not in current.device_keys:
            raise BadInputError(f"device {device!r} is not enrolled in {store.uri}")
        removed.append(current.device_keys[device])
        keys = {d: k for d, k in current.device_keys.items() if d != device}
        return current.succeeded_by(dict(current.models)).model_copy(update={"device_keys": keys})

    update_manifest(store, drop)
    return removed[0]
