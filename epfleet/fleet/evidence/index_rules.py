"""The evidence index's rules (pure): which shard holds a report key, when a report must be
read again, what of a report the index keeps, and how a shard is sealed so that a writer of
reports cannot forge one.

- A report key's shard: the first two bytes of sha256(key), modulo ``SHARDS``. A key names
  one device (``reports/devices/<id>.json``), so a device's facts live in one shard.
- A report is read again when the listing shows it changed: its size differs from the
  record's or its modification time (the store's clock: S3's LastModified, a local file's
  mtime), or that of a notice of it, is later than the record's, or the record is
  *unsettled*: the report was modified less than
  ``SETTLE_SECONDS`` before the pass that read it started, by the store's clock (a pass
  writes a small object first and takes its modification time; S3 gives whole seconds, so
  a rewrite of the same size in the same second as the read looks unchanged: such a record
  is read once more). A reader that cannot write takes the newest report it listed as the
  start, which is earlier. Only the store's clock is compared with itself: a device's or a
  reader's clock never decides what is read. A record whose report was signed and checked
  against another key than the one its device is enrolled with now (or none) is read again
  too: its signature is checked against the key in force.
- What a record keeps of a report (``project``): what the gate, the field view and
  runtime-watch read of it (device, time, number, EPs and runtime, each model's action,
  target, variant, the artifact's sha256 (a ranking refuses a vote for another build than
  the one published), verdicts, profile and rollout, with its shadow run's figures), not
  the words (reasons, paths, warnings). ``INDEX_FORMAT`` changes when what it keeps does: a
  shard of another format is rebuilt from the reports (an older reader's records lack
  what this one keeps).
  ``restore`` gives back a report those readers read as they read the report itself.
- A signed report's signature is checked when it is folded, against its device's enrolled
  key, and the record keeps which key it was checked against and the result
  (``CheckedSignature``): ``signed_by`` asks it as it asks an envelope, and it answers yes
  only for that very key.
- A shard is sealed with HMAC-SHA256 under the index key (held where the fleet-side readers
  run, never by a device): a shard whose seal does not verify (forged, or written under
  another key, or damaged) is not used: its reports are read again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Any, TypeVar

from pydantic import BaseModel
from securesystemslib.exceptions import VerificationError

from epfleet.formats.device_report import (
    DeviceInfo,
    DeviceReport,
    ManifestStatus,
    ModelReport,
    Profile,
    RolloutSeen,
    ShadowRun,
    VariantVerdict,
)
from epfleet.formats.manifest import DeviceKey
from eps.base import Verdict

SHARDS = 256
SETTLE_SECONDS = 5.0
INDEX_FORMAT = 3
_SEAL_CONTEXT = b"epfleet evidence index shard v1\n"

Stamp = tuple[int, float]
"""A listed report's size and modification time (POSIX seconds, the store's clock)."""


def shard_of(key: str) -> int:
    """The shard holding ``key``'s record."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:2], "big") % SHARDS


def stamp_of(size: int, modified: datetime) -> Stamp:
    return size, round(modified.timestamp(), 6)


def must_read(
    record: dict[str, Any] | None,
    listed: tuple[int | None, float],
    enrolled_key: str | None,
    settle: float = SETTLE_SECONDS,
) -> bool:
    """Whether the report listed with ``listed`` is read again, its ``record`` as folded
    (None: never folded), ``enrolled_key`` the fingerprint of its device's key in force.
    ``listed``'s size is None when the report was not listed itself but a notice of it
    was (``epfleet.formats.device_report.INBOX_PREFIX``), at the notice's time: the store
    writes a report before its notice, so a report listed no later than its record's time,
    at the same size, is the one folded."""
    if record is None:
        return True
    size, modified = listed
    kept_size, kept_modified = record["stamp"]
    if modified > kept_modified or (size is not None and size != kept_size):
        return True
    if kept_modified >= record["read_after"] - settle:
        return True
    signature = record.get("signature")
    return signature is not None and signature["key"] != enrolled_key


def key_fingerprint(keyid: str, keytype: str, scheme: str, public: str) -> str:
    text = "\0".join((keyid, keytype, scheme, public))
    return hashlib.sha256(text.encode()).hexdigest()


def device_key_fingerprint(key: DeviceKey | None) -> str | None:
    if key is None:
        return None
    return key_fingerprint(key.keyid, key.keytype, key.scheme, key.public)


class CheckedSignature:
    """A report's signature as it was checked when folded: ``verify`` (what ``signed_by``
    calls on an envelope) passes only for the key it was checked against, and only when it
    verified then."""

    def __init__(self, key: str | None, verified: bool) -> None:
        self.key = key
        self.verified = verified

    def verify(self, keys: list[Any], threshold: int) -> None:
        fingerprints = {
            key_fingerprint(k.keyid, k.keytype, k.scheme, k.keyval.get("public", "")) for k in keys
        }
        if not (self.verified and self.key in fingerprints and threshold <= 1):
            raise VerificationError("the report's signature was not checked with this key")


_MODEL_FIELDS = {
    "model": True,
    "action": True,
    "variant": True,
    "target": True,
    "ep": True,
    "verdict": True,
    "artifact_sha256": True,
    "considered": {"__all__": {"target", "ep", "device", "verdict"}},
    "profile": True,
    "rollout": True,
}
_REPORT_FIELDS: dict[str, Any] = {
    "device_id": True,
    "generated_at": True,
    "sequence": True,
    "ort_version": True,
    "ep_packages": True,
    "devices": True,
    "models": {"__all__": _MODEL_FIELDS},
}


def project(report: DeviceReport) -> dict[str, Any]:
    """What the index keeps of ``report`` (see the module)."""
    return report.model_dump(mode="json", include=_REPORT_FIELDS, exclude_none=True)


_MANIFEST = ManifestStatus(status="unchanged", generation=None, body_bytes=0)
_PROFILE_NONE = {"ep_nodes": None, "other_nodes": None}
# every field given: model_construct fills a missing one from its default, slowly (it
# inspects a default factory's signature on every call)

Built = TypeVar("Built", bound=BaseModel)


def _built(built: type[Built], /, **fields: Any) -> Built:
    """``built.model_construct(**fields)``, in half its time when ``fields`` names every
    field of ``built`` (no alias or default looked up per field): a pass restores every
    report of the fleet, a dozen models each."""
    if fields.keys() != built.model_fields.keys():
        return built.model_construct(**fields)  # a field left to its default
    made = built.__new__(built)
    object.__setattr__(made, "__dict__", fields)
    object.__setattr__(made, "__pydantic_fields_set__", set(fields))
    object.__setattr__(made, "__pydantic_extra__", None)
    object.__setattr__(made, "__pydantic_private__", None)
    if built.__pydantic_post_init__:
        made.model_post_init(None)  # private attributes: their defaults
    return made


def restore(kept: dict[str, Any], signature: CheckedSignature | None = None) -> DeviceReport:
    """The report ``project`` kept, the words it left out empty. Built without validating
    again (``model_construct``): what a sealed shard holds was validated when it was
    folded, and a pass restores every report of the fleet."""
    models = [
        _built(
            ModelReport,
            model=m["model"],
            action=m["action"],
            variant=m.get("variant"),
            target=m.get("target"),
            ep=m.get("ep"),
            verdict=Verdict(m["verdict"]) if m.get("verdict") is not None else None,
            artifact_sha256=m.get("artifact_sha256"),
            source_sha256=None,
            precision=None,
            bytes_downloaded=0,
            delta_from=None,
            reason="",
            seconds=0.0,
            considered=[
                _built(
                    VariantVerdict,
                    target=v["target"],
                    ep=v["ep"],
                    device=v["device"],
                    verdict=Verdict(v["verdict"]),
                    reason="",
                )
                for v in m.get("considered", ())
            ],
            profile=Profile.model_construct(**(_PROFILE_NONE | m["profile"]))
            if "profile" in m
            else None,
            rollout=_rollout(m["rollout"]) if "rollout" in m else None,
        )
        for m in kept.get("models", ())
    ]
    report = _built(
        DeviceReport,
        device_id=kept["device_id"],
        generated_at=kept["generated_at"],
        sequence=kept.get("sequence"),
        ort_version=kept["ort_version"],
        ep_packages=kept["ep_packages"],
        devices=[DeviceInfo.model_construct(**d) for d in kept["devices"]],
        store="",
        cache="",
        manifest=_MANIFEST,
        models=models,
        seconds=0.0,
        report_uploaded=None,
        report_error=None,
        report_skipped=None,
        warnings=[],
    )
    report._envelope = signature
    return report


_SHADOW_NONE = {
    "max_rel_error": None,
    "tolerance": None,
    "metric": None,
    "metric_value": None,
    "metric_min": None,
}


def _rollout(kept: dict[str, Any]) -> RolloutSeen:
    shadow = kept.get("shadow")
    return RolloutSeen.model_construct(
        **(kept | {"shadow": ShadowRun.model_construct(**(_SHADOW_NONE | shadow))})
        if shadow is not None
        else kept | {"shadow": None}
    )


def seal(shard: int, body: dict[str, Any], key: bytes) -> bytes:
    """The shard as stored: its seal (HMAC-SHA256 under ``key``), a line break, its JSON."""
    data = json.dumps({**body, "format": INDEX_FORMAT, "shard": shard}, separators=(",", ":"))
    raw = data.encode()
    return _mac(key, raw).encode() + b"\n" + raw


def seal_of(stored: bytes) -> str:
    """The seal of a stored shard (verified or made by this reader): a digest of exactly
    its records, version and shard number under the index key."""
    return stored.partition(b"\n")[0].decode()


def unseal(shard: int, stored: bytes, key: bytes) -> dict[str, Any]:
    """The body of a stored shard; ValueError saying why when its seal does not verify
    under ``key``, or it is not shard ``shard`` of this index's format."""
    mac, newline, raw = stored.partition(b"\n")
    if not newline or not hmac.compare_digest(mac, _mac(key, raw).encode()):
        raise ValueError("its seal does not verify under this index key (forged or damaged)")
    body: dict[str, Any] = json.loads(raw)
    if body.get("format") != INDEX_FORMAT or body.get("shard") != shard:
        raise ValueError(f"sealed as shard {body.get('shard')!r}, format {body.get('format')!r}")
    return body


def _mac(key: bytes, raw: bytes) -> str:
    return hmac.new(key, _SEAL_CONTEXT + raw, hashlib.sha256).hexdigest()


def merge(
    theirs: dict[str, Any], ours: dict[str, Any], base: dict[str, Any], read: set[str]
) -> dict[str, Any]:
    """Records of a shard another reader wrote (``theirs``) meanwhile, with this reader's
    changes to ``base`` (what it started from) applied: the records it read (``read``),
    each unless theirs is of a newer listing of the report, and the records it dropped
    (reports no longer listed), unless they changed theirs."""
    merged = dict(theirs)
    for key in read:
        mine, other = ours.get(key), theirs.get(key)
        if mine is not None and (other is None or other["stamp"][1] <= mine["stamp"][1]):
            merged[key] = mine
    for key in set(base) - set(ours):
        if merged.get(key) == base[key]:
            del merged[key]
    return merged
