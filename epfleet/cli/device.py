"""``epfleet device enroll|revoke|list|migrate-keys``: the devices whose signed reports the
rollout gate counts, where a rollout's policy asks for authenticated reports.

Enrolling and revoking are signed publishes (they need the store's signer, as a compile
does). Exit codes as every epfleet command: 0 done, 1 the store failed, 2 bad input (an
unsigned store, a device enrolled already or not enrolled, a key enrolled for another
device, a revoked key without --force, a key directory in a git work tree).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from cyclopts import App, Parameter

from epfleet.cli.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from epfleet.cli.options import Json, Store, TrustRoot, command_help, did_you_mean, pin_trust_root
from epfleet.errors import BadInputError
from epfleet.logs import say
from epfleet.stores import DEFAULT_STORE
from epfleet.text import show

device_app = App(
    name="device",
    help="Enrolled devices: the keys their signed reports are checked with.",
    help_epilogue="",
)

DeviceId = Annotated[str, Parameter(help="The device's id (its --device-id / EPFLEET_DEVICE_ID).")]


@device_app.default
def _no_device_command(*unknown: Annotated[str, Parameter(show=False)]) -> int:
    what = "device needs a command"
    if unknown:
        near = did_you_mean(unknown[0], ("enroll", "revoke", "list"))
        what = f"unknown command 'device {unknown[0]}'{near}"
    say(f"epfleet: error: {what} (one of: enroll, revoke, list)")
    return EXIT_BAD_INPUT


@device_app.command
def enroll(
    device: Annotated[
        str | None,
        Parameter(help="The device's id (its --device-id / EPFLEET_DEVICE_ID); or --from FILE."),
    ] = None,
    *,
    store: Store = DEFAULT_STORE,
    keys: Path | None = None,
    public_key: Path | None = None,
    from_file: Annotated[Path | None, Parameter(name="--from")] = None,
    trust_root: TrustRoot = None,
    force: bool = False,
) -> int:
    """Enrol a device: publish its public key in the signed key bins, so that a rollout
    with authenticated_reports counts its reports. Either make its key here (--keys: the
    private key goes to DIR/<device>.pem, 0600, to provision the device with as
    EPFLEET_DEVICE_KEY) or give the public key of one made on the device (--public-key).
    With --from FILE, every device the file names, in one signed publish.

    For example:
      epfleet device enroll dev-042 --store s3://bucket/fleet \\
        --keys /media/offline/device-keys
      epfleet device enroll dev-042 --store s3://bucket/fleet \\
        --public-key dev-042.pub.pem
      epfleet device enroll --from new-devices.txt --store s3://bucket/fleet \\
        --keys /media/offline/device-keys

    Parameters
    ----------
    keys
        Where the device's new private key is written (never inside a git work tree that
        does not ignore it, unless --force).
    public_key
        The device's public key (PEM), when its private key was made on the device.
    from_file
        Enrol many devices at once: one a line, "<device id>" (its key made here, in
        --keys) or "<device id> <public key PEM file>" (relative to FILE's folder); "#"
        starts a comment. One bad line refuses the whole file, naming the line, before
        anything is written.
    force
        Write the key into a git work tree that does not ignore --keys; or enrol again a
        key that was revoked from this device (the reports it signed before its revocation
        count again). A key enrolled for another device is refused even so.
    """
    from epfleet.fleet.evidence.enrolment import enroll as enroll_device
    from epfleet.stores import open_store

    if (device is None) == (from_file is None):
        raise BadInputError("give a DEVICE id, or --from FILE with one device a line")
    pin_trust_root(store, trust_root)
    if from_file is not None:
        return _enroll_batch(store, from_file, keys, public_key, force)
    assert device is not None
    enrolled = enroll_device(
        open_store(store), device, keys_dir=keys, public_key=public_key, force=force
    )
    entry = enrolled.entry
    show(f"enrolled {device} in {store}: key {entry.keyid[:12]} ({entry.scheme})")
    if enrolled.revoked_before is not None:
        when = enrolled.revoked_before.revoked_at.strftime("%Y-%m-%d %H:%M")
        say(
            f"epfleet: key {entry.keyid[:12]} was revoked on {when} and is enrolled again "
            "(--force): the reports it signed before its revocation count again"
        )
    if enrolled.written is not None:
        show(f"provision the device with: EPFLEET_DEVICE_KEY={enrolled.written}")
    return EXIT_OK


def _enroll_batch(
    store: str, from_file: Path, keys: Path | None, public_key: Path | None, force: bool
) -> int:
    from epfleet.fleet.evidence.enrolment import enroll_batch, read_batch
    from epfleet.stores import open_store

    if public_key is not None:
        raise BadInputError(
            "--public-key names one device's key: with --from, put each public key file on "
            "its device's line"
        )
    done = enroll_batch(open_store(store), read_batch(from_file), keys_dir=keys, force=force)
    for device, when in sorted(done.revoked_before.items()):
        say(
            f"epfleet: key {done.enrolled[device].keyid[:12]} of {device} was revoked on "
            f"{when.revoked_at:%Y-%m-%d %H:%M} and is enrolled again (--force): the reports "
            "it signed before its revocation count again"
        )
    show(
        f"enrolled {len(done.enrolled)} devices in {store} in one signed publish "
        f"({len(done.key_bins)} key bins and the keys index signed)"
    )
    if done.written:
        show(
            f"provision each device whose key was made here ({len(done.written)}) with: "
            f"EPFLEET_DEVICE_KEY={keys}/<device>.pem"
        )
    return EXIT_OK


@device_app.command
def revoke(device: DeviceId, *, store: Store = DEFAULT_STORE, trust_root: TrustRoot = None) -> int:
    """Remove a device's key: its reports no longer count where reports must be signed.

    For example:
      epfleet device revoke dev-042 --store s3://bucket/fleet
    """
    from epfleet.fleet.evidence.enrolment import revoke as revoke_device
    from epfleet.stores import open_store

    pin_trust_root(store, trust_root)
    removed = revoke_device(open_store(store), device)
    show(f"revoked {device} in {store}: key {removed.keyid[:12]}")
    return EXIT_OK


@device_app.command(name="list")
def list_(
    *, store: Store = DEFAULT_STORE, trust_root: TrustRoot = None, as_json: Json = False
) -> int:
    """The enrolled devices and their keys, from the store's signed key bins.

    For example:
      epfleet device list --store s3://bucket/fleet
    """
    from epfleet.fleet.evidence.enrolment import keys_in_force
    from epfleet.stores import open_store
    from epfleet.text import output_width, table

    pin_trust_root(store, trust_root)
    keys = dict(keys_in_force(open_store(store)))
    if as_json:
        print(json.dumps({d: k.model_dump(mode="json") for d, k in keys.items()}, indent=2))
        return EXIT_OK
    if not keys:
        show(f"no enrolled device in {store}")
        return EXIT_OK
    rows = [
        [d, k.keyid[:12], k.scheme, k.enrolled_at.strftime("%Y-%m-%d %H:%M")]
        for d, k in sorted(keys.items())
    ]
    print(table(["device", "key", "scheme", "enrolled"], rows, output_width(), wrapped=("device",)))
    return EXIT_OK


@device_app.command(name="migrate-keys")
def migrate_keys(*, store: Store = DEFAULT_STORE, trust_root: TrustRoot = None) -> int:
    """Move the device keys a store's signed manifest still carries into the signed key bins,
    and the key bins a store's snapshot still lists into the keys index.

    Stores enrolled before the key bins keep their keys in the manifest, and stores enrolled
    before the keys index list the key bins in the snapshot; they are read from there until
    moved, which the next enrol or revoke also does.

    For example:
      epfleet device migrate-keys --store s3://bucket/fleet
    """
    from epfleet.fleet.evidence.enrolment import migrate_keys as migrate
    from epfleet.stores import open_store

    pin_trust_root(store, trust_root)
    moved = migrate(open_store(store))
    if moved.devices:
        print(
            f"moved the keys of {moved.devices} devices from the manifest into the key bins "
            f"of {store}"
        )
    if moved.listed_bins:
        print(
            f"moved the listing of {moved.listed_bins} key bins from the snapshot into the "
            f"keys index of {store} (devices no longer download it)"
        )
    if not moved.devices and not moved.listed_bins:
        print(
            f"no device key left in the manifest of {store} and no key bin in its snapshot: "
            "nothing to move"
        )
    return EXIT_OK


command_help(enroll, revoke, list_, migrate_keys)
