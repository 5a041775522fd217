"""Rotating a store's keys: a new online key, or new root keys, in a new root version.

Devices follow a rotation by walking the root chain (each root signed by a threshold of
the previous root's keys); a rotation that stopped half-way is finished by running it
again.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from securesystemslib.signer import Signer
from tuf.api.metadata import Metadata, Root

from epfleet.errors import BadInputError, PreconditionFailed, StoreError
from epfleet.stores import Store
from epfleet.trust.keys import OfflineKeys
from epfleet.trust.layout import LIFETIME, metadata_key, utcnow
from epfleet.trust.signing import (
    SERIALIZER,
    Changes,
    TrustPublished,
    publish_signed,
    sign_metadata,
    write_versioned,
)
from epfleet.trust.state import latest_root, read_state
from epfleet.trust.targets import delegating_targets


def _new_root(store: Store) -> Metadata[Root]:
    current = latest_root(store)
    signed = Metadata.from_bytes(current.to_bytes(SERIALIZER)).signed
    signed.version += 1
    signed.expires = utcnow() + LIFETIME["root"]
    return Metadata(signed)


def check_offline_keys(store: Store, offline: OfflineKeys, *, targets: bool = False) -> None:
    """BadInputError unless ``offline`` holds a threshold of the store's current root keys
    (and, with ``targets``, its targets key): a rotation signed otherwise would be a root
    no device follows."""
    root = latest_root(store).signed
    role = root.roles["root"]
    held = {s.public_key.keyid for s in offline.root} & set(role.keyids)
    if len(held) < role.threshold:
        raise BadInputError(
            f"--keys {offline.directory} holds {len(held)} of the root keys of {store.uri} "
            f"(root version {root.version} needs {role.threshold}); is it this store's "
            "offline key directory?"
        )
    if targets and offline.targets.public_key.keyid not in root.roles["targets"].keyids:
        raise BadInputError(
            f"--keys {offline.directory}: its targets.pem is not the targets key of {store.uri}"
        )


def _write_root(store: Store, root: Root, signers: Sequence[Signer]) -> bytes:
    raw = sign_metadata(root, signers)
    try:
        store.write(metadata_key("root", root.version), raw, if_none_match=True)
    except PreconditionFailed:
        raise StoreError(
            f"{store.uri}/{metadata_key('root', root.version)} appeared meanwhile: another "
            "rotation ran; check epfleet trust status and rotate again"
        ) from None
    return raw


def rotate_online_key(
    store: Store, offline: OfflineKeys, new_online: Signer, *, now: datetime | None = None
) -> TrustPublished:
    """Replace the online key: a new root (signed by the root keys) names it for snapshot
    and timestamp, a new targets role delegates the bins to it, and every bin, the
    snapshot and the timestamp are signed again with it. Devices follow the new root."""
    check_offline_keys(store, offline, targets=True)
    root = _new_root(store)
    keyid = new_online.public_key.keyid
    # A root that names the key already: a rotation to it stopped after writing its root
    # (devices refuse the old key's timestamp from then on), or the key is the current one
    # and only targets is renewed. Either way no new root; targets and the rest follow.
    if any(root.signed.roles[role].keyids != [keyid] for role in ("snapshot", "timestamp")):
        for role in ("snapshot", "timestamp"):
            for old in list(root.signed.roles[role].keyids):
                root.signed.revoke_key(old, role)
            root.signed.add_key(new_online.public_key, role)
        _write_root(store, root.signed, offline.root)
    state = read_state(store, rotating=True)
    bits = state.succinct.bit_length
    targets = delegating_targets(
        state.targets.signed.version + 1, new_online.public_key, bits, now or utcnow()
    )
    raw_targets = write_versioned(store, "targets", targets, [offline.targets])
    return publish_signed(
        store,
        new_online,
        now,
        Changes(targets=raw_targets, every_bin=True, renew=True, rotating=True),
    )


def rotate_root_keys(
    store: Store, old: OfflineKeys, new_root: list[Signer], *, threshold: int | None = None
) -> bytes:
    """A new root version whose root keys are ``new_root`` (threshold unchanged unless
    given), signed by the old keys and the new ones: devices holding the old root verify
    it with the old threshold, and it verifies itself with the new one."""
    check_offline_keys(store, old)
    root = _new_root(store)
    threshold = threshold or root.signed.roles["root"].threshold
    if not 1 <= threshold <= len(new_root):
        raise BadInputError(
            f"root threshold {threshold}: must be from 1 to the number of new root keys "
            f"({len(new_root)})"
        )
    for keyid in list(root.signed.roles["root"].keyids):
        root.signed.revoke_key(keyid, "root")
    for signer in new_root:
        root.signed.add_key(signer.public_key, "root")
    root.signed.roles["root"].threshold = threshold
    return _write_root(store, root.signed, [*old.root, *new_root])
