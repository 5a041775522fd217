"""What the signed metadata says for a manifest (pure): its targets, bins and delegation.

One target per model (``models/<name>``), its ok variants in the signed custom field
``epfleet``, plus the ``manifest.json`` target, and the field rankings the rollout gate
signs beside them (``field/rankings/<model>/<n>``, ``ranking_targets``); ``plan_bins`` says
which hashed bins a manifest changes; ``delegating_targets`` is the targets role that
delegates them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from securesystemslib.signer import Key
from tuf.api.metadata import Delegations, SuccinctRoles, TargetFile, Targets

from epfleet.errors import BadInputError
from epfleet.formats.field_ranking import RANKED_MODELS, RANKING_TARGETS
from epfleet.stores import MANIFEST_KEY
from epfleet.trust.layout import BIN_PREFIX, CUSTOM_FIELD, FOLDED_FIELD, LIFETIME, SCHEMA_FIELD


def canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Target:
    info: TargetFile
    data: bytes
    carried: bool = False
    """Signed before and kept as it is (its file is in the store already; ``data`` empty)."""


def ranking_target(model: str, succinct: SuccinctRoles) -> str:
    """The TUF target path of a model's field ranking: ``field/rankings/<model>/<n>``, the
    smallest ``n`` whose hashed bin is that of ``models/<model>``, so that a device that
    loads a model's entry has its ranking's bin already, and a fleet without rankings
    costs it no bin more (about as many hashes as there are bins)."""
    home = succinct.get_role_for_target(f"models/{model}")
    n = 0
    while succinct.get_role_for_target(f"{RANKING_TARGETS}{model}/{n}") != home:
        n += 1
    return f"{RANKING_TARGETS}{model}/{n}"


def ranking_targets(rankings: dict[str, Any], succinct: SuccinctRoles) -> dict[str, Target]:
    """The targets of the field rankings (``epfleet.formats.field_ranking``): one per model,
    at ``ranking_target``, whose file and custom field ``epfleet`` are the ranking as
    canonical JSON text, and ``RANKED_MODELS``, the list of the models ranked."""
    targets = {}
    for model, ranking in sorted(rankings.items()):
        data = canonical(ranking)
        info = TargetFile.from_data(ranking_target(model, succinct), data, ["sha256"])
        info.unrecognized_fields["custom"] = {CUSTOM_FIELD: data.decode()}
        targets[info.path] = Target(info, data)
    listed = canonical(sorted(rankings))
    index = TargetFile.from_data(RANKED_MODELS, listed, ["sha256"])
    index.unrecognized_fields["custom"] = {CUSTOM_FIELD: listed.decode()}
    targets[index.path] = Target(index, listed)
    return targets


def carried_rankings(bins: dict[str, Targets]) -> dict[str, Target]:
    """The field rankings the verified bins sign now, to be signed again as they are by a
    publish that does not replace them."""
    return {
        path: Target(info, b"", carried=True)
        for signed in bins.values()
        for path, info in signed.targets.items()
        if path.startswith(RANKING_TARGETS) or path == RANKED_MODELS
    }


def model_targets(manifest_json: bytes) -> dict[str, Target]:
    """The targets ``manifest_json`` (the store's manifest.json, as stored) signs: one per
    model, ``models/<name>``, whose file and custom field ``epfleet`` are the model's entry
    with only its ok variants, as canonical JSON text (canonical JSON has no floats, so
    the custom field carries the text), beside the document's schema version unless it is
    "1.0" (``SCHEMA_FIELD``), and its folded variants apart (``FOLDED_FIELD``,
    ``split_folded``); and ``manifest.json`` itself."""
    document = json.loads(manifest_json)
    version = document.get("schema_version", "1.0")
    schema = {} if version == "1.0" else {SCHEMA_FIELD: version}
    targets = {}
    for name, entry in document.get("models", {}).items():
        variants = entry.get("variants", {})
        ok = {t: v for t, v in variants.items() if v.get("status") == "ok"}
        data = canonical({**entry, "variants": ok})
        info = TargetFile.from_data(f"models/{name}", data, ["sha256"])
        seen, folded = split_folded({**entry, "variants": ok})
        custom = {CUSTOM_FIELD: canonical(seen).decode(), **schema}
        if folded is not None:
            custom[FOLDED_FIELD] = canonical(folded).decode()
        info.unrecognized_fields["custom"] = custom
        targets[info.path] = Target(info, data)
    whole = TargetFile.from_data(MANIFEST_KEY, manifest_json, ["sha256"])
    targets[MANIFEST_KEY] = Target(whole, manifest_json)
    return targets


def split_folded(entry: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """A model entry (parsed JSON) as a device of schema 1.3 may see it, and its folded
    parts apart (None: it has none). A variant with ``folded_io`` takes and gives integers;
    1.3 drops that key as a newer minor's, so it must not see the variant at all: its
    ``variants`` go without them and a folded ``previous`` becomes None ("the target had
    none", which a device outside the rollout drops). ``joined_folded`` undoes it."""
    variants = entry.get("variants") or {}
    previous = entry.get("previous") or {}
    folded_variants = {t: v for t, v in variants.items() if v.get("folded_io")}
    folded_previous = {t: v for t, v in previous.items() if v and v.get("folded_io")}
    if not folded_variants and not folded_previous:
        return entry, None
    seen = {**entry, "variants": {t: v for t, v in variants.items() if t not in folded_variants}}
    if previous:
        seen["previous"] = {t: None if t in folded_previous else v for t, v in previous.items()}
    return seen, {"variants": folded_variants, "previous": folded_previous}


def joined_folded(seen: dict[str, Any], folded: Any) -> dict[str, Any]:
    """The entry ``split_folded`` split, whole again (variants in name order, as canonical
    JSON has them). ValueError when ``folded`` is not what it wrote."""
    if not isinstance(folded, dict) or set(folded) != {"variants", "previous"}:
        raise ValueError("not an object of variants and previous")
    variants, previous = folded["variants"], folded["previous"]
    if not isinstance(variants, dict) or not isinstance(previous, dict):
        raise ValueError("its variants and previous are not objects")
    joined = {**seen, "variants": dict(sorted({**seen.get("variants", {}), **variants}.items()))}
    if previous:
        joined["previous"] = dict(sorted({**seen.get("previous", {}), **previous}.items()))
    return joined


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
