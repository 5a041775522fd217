"""What the signed metadata says for a manifest (pure): its targets, bins and delegation.

One target per model (``models/<name>``), its ok variants in the signed custom field
``epfleet``, plus the ``manifest.json`` target; ``plan_bins`` says which hashed bins a
manifest changes; ``delegating_targets`` is the targets role that delegates them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from securesystemslib.signer import Key
from tuf.api.metadata import Delegations, SuccinctRoles, TargetFile, Targets

from epfleet.errors import BadInputError
from epfleet.stores import MANIFEST_KEY
from epfleet.trust.layout import BIN_PREFIX, CUSTOM_FIELD, LIFETIME, SCHEMA_FIELD


def canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Target:
    info: TargetFile
    data: bytes


def model_targets(manifest_json: bytes) -> dict[str, Target]:
    """The targets ``manifest_json`` (the store's manifest.json, as stored) signs: one per
    model, ``models/<name>``, whose file and custom field ``epfleet`` are the model's entry
    with only its ok variants, as canonical JSON text (canonical JSON has no floats, so
    the custom field carries the text), beside the document's schema version unless it is
    "1.0" (``SCHEMA_FIELD``); and ``manifest.json`` itself."""
    document = json.loads(manifest_json)
    version = document.get("schema_version", "1.0")
    schema = {} if version == "1.0" else {SCHEMA_FIELD: version}
    targets = {}
    for name, entry in document.get("models", {}).items():
        variants = entry.get("variants", {})
        ok = {t: v for t, v in variants.items() if v.get("status") == "ok"}
        data = canonical({**entry, "variants": ok})
        info = TargetFile.from_data(f"models/{name}", data, ["sha256"])
        info.unrecognized_fields["custom"] = {CUSTOM_FIELD: data.decode(), **schema}
        targets[info.path] = Target(info, data)
    whole = TargetFile.from_data(MANIFEST_KEY, manifest_json, ["sha256"])
    targets[MANIFEST_KEY] = Target(whole, manifest_json)
    return targets


def stale(expires: datetime, lifetime: timedelta, now: datetime) -> bool:
    """Less than half of the signature's lifetime is left."""
    return expires - now < lifetime / 2


def plan_bins(
    succinct: SuccinctRoles,
    current: dict[str, Targets],
    targets: dict[str, Target],
    now: datetime,
    *,
    every_bin: bool = False,
) -> dict[str, dict[str, Target]]:
    """The bins to sign again and their targets: those whose targets differ from what is
    signed (or that are missing), that are stale, or all of them with ``every_bin``."""
    grouped: dict[str, dict[str, Target]] = {name: {} for name in succinct.get_roles()}
    for path, target in targets.items():
        grouped[succinct.get_role_for_target(path)][path] = target
    changed = {}
    for name, wanted in grouped.items():
        signed = current.get(name)
        if (
            every_bin
            or signed is None
            or signed.targets != {p: t.info for p, t in wanted.items()}
            or stale(signed.expires, LIFETIME["bin"], now)
        ):
            changed[name] = wanted
    return changed


def bin_bits(bins: int) -> int:
    if bins < 2 or bins > 2**16 or bins & (bins - 1):
        raise BadInputError(f"--bins {bins}: must be a power of two from 2 to 65536")
    return bins.bit_length() - 1


def delegating_targets(version: int, online: Key, bits: int, now: datetime) -> Targets:
    succinct = SuccinctRoles([online.keyid], 1, bits, BIN_PREFIX)
    return Targets(
        version=version,
        expires=now + LIFETIME["targets"],
        delegations=Delegations(keys={online.keyid: online}, succinct_roles=succinct),
    )
