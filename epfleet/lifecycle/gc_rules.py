"""What ``epfleet gc`` removes and what it keeps, with why: the pure decision over a listing.

``kind_of`` says which keys it may ever collect; ``plan_collection`` decides, from the
store's listing, the manifest in force and the pins of device reports
(``epfleet.lifecycle.gc_pins``), which of them go. No I/O here: ``epfleet.lifecycle.gc``
reads and removes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field

from epfleet.formats.keys import is_temp_name, listing_key, signature_key
from epfleet.formats.manifest import Manifest, referenced_keys
from epfleet.stores.base import MANIFEST_KEY, StoredObject

Kind = Literal["variant", "source", "samples", "file", "delta", "temp", "multipart", "notice"]
KINDS: tuple[Kind, ...] = (
    "variant",
    "source",
    "samples",
    "file",
    "delta",
    "temp",
    "multipart",
    "notice",
)
PROTECTED = ("reports/", "trust/", "runs/")
"""Never collected: device reports, signed metadata, hand-over files (their own sweeps);
but the notices devices leave beside their reports (``notice``, below)."""

_HEX = "[0-9a-f]{64}"
_NAME = "[a-z0-9][a-z0-9._-]*"
_PATTERNS: tuple[tuple[Kind, re.Pattern[str]], ...] = (
    ("variant", re.compile(rf"variants/{_NAME}/{_NAME}/{_HEX}\.(onnx|files\.json|onnx\.sig)")),
    ("source", re.compile(rf"sources/{_HEX}\.onnx")),
    ("samples", re.compile(rf"samples/{_HEX}\.npz")),
    ("file", re.compile(rf"files/{_HEX}")),
    ("delta", re.compile(rf"deltas/{_NAME}/{_NAME}/{_HEX}\.from-{_HEX}\.zst")),
)
_NOTICE = re.compile(rf"reports/inbox/[0-9]{{8}}T[0-9]{{4}}/{_NAME}\.json")
"""A notice of a report (``epfleet.formats.device_report.inbox_key``): the evidence index
lists its partition for an hour or so; the report itself stays at reports/devices/."""
_TEMP_FOLDERS = ("sources/", "samples/", "variants/", "files/", "deltas/")
_DELTA = re.compile(rf"deltas/({_NAME})/({_NAME})/({_HEX})\.from-({_HEX})\.zst")
_VARIANT_FILE = re.compile(rf"variants/({_NAME})/{_NAME}/({_HEX})\.onnx")
"""Where a temp file is collected: these folders and the store's root."""


def kind_of(key: str) -> Kind | None:
    """The kind of a store key the collector may remove; None for anything else."""
    if _NOTICE.fullmatch(key):
        return "notice"
    if key == MANIFEST_KEY or key.startswith(PROTECTED):
        return None
    for kind, pattern in _PATTERNS:
        if pattern.fullmatch(key):
            return kind
    folder, _, name = key.rpartition("/")
    if is_temp_name(name) and (not folder or key.startswith(_TEMP_FOLDERS)):
        return "temp"
    return None


def needed_keys(manifest: Manifest | None) -> set[str]:
    """What the manifest references, the file listings of its multi-file variants and the
    model signatures of its variants."""
    keys = referenced_keys(manifest)
    for entry in (manifest.models if manifest else {}).values():
        kept = [v for v in entry.previous.values() if v is not None]  # a rollout's way back
        for variant in [*entry.variants.values(), *kept]:
            if variant.artifact is not None:
                keys.add(signature_key(variant.artifact.uri))
            if variant.artifact is not None and variant.files:
                keys.add(listing_key(variant.artifact.uri))
    return keys


def pinning_device(key: str, pinned: dict[str, str]) -> str | None:
    """The device that pins ``key``: the one of the first prefix in ``pinned`` (key
    prefix of a variant a device runs -> device id) that ``key`` starts with."""
    return next((device for prefix, device in pinned.items() if key.startswith(prefix)), None)


class Candidate(BaseModel):
    key: str
    kind: Kind
    size: int
    modified: datetime


class KindTotal(BaseModel):
    count: int = 0
    bytes: int = 0


class Kept(BaseModel):
    key: str
    kind: Kind
    size: int
    reason: str


class GcPlan(BaseModel):
    """What a collection removes (``candidates``) and what it keeps that it could
    otherwise have removed, with why."""

    candidates: list[Candidate] = Field(default_factory=list)
    kept: list[Kept] = Field(default_factory=list)
    protected: int = Field(
        default=0, description="Objects it never collects: manifest, reports, trust, runs"
    )
    unrecognised: int = Field(default=0, description="Objects of no known kind, left alone")
    deferred: str | None = Field(
        default=None, description="Why unreferenced objects are all kept this time"
    )

    def totals(self) -> dict[str, KindTotal]:
        totals: dict[str, KindTotal] = {kind: KindTotal() for kind in KINDS}
        for c in self.candidates:
            totals[c.kind].count += 1
            totals[c.kind].bytes += c.size
        return totals


def plan_collection(
    objects: Iterable[StoredObject],
    uploads: Iterable[StoredObject],
    manifest: Manifest | None,
    pinned: dict[str, str],
    now: datetime,
    grace: timedelta,
    keep_variants: str | None = None,
    pinned_file_keys: dict[str, str] | None = None,
) -> GcPlan:
    """Decide what to remove (pure). ``pinned`` maps key prefixes of variants devices run
    to a device (``epfleet.lifecycle.gc_pins.pinned_prefixes``), ``pinned_file_keys`` the files/
    keys those variants list; ``keep_variants``, when set, is why every variant and file
    is kept (an unreadable device report or file listing may pin any of them)."""
    plan = GcPlan()
    referenced = needed_keys(manifest)
    pinned_file_keys = pinned_file_keys or {}
    cutoff = now - grace
    if manifest is None:
        plan.deferred = f"no {MANIFEST_KEY}: nothing is known to be unreferenced"
    elif manifest.published_at is not None and manifest.published_at > cutoff:
        plan.deferred = (
            f"the manifest in force (generation {manifest.generation}) was published at "
            f"{manifest.published_at.isoformat()}, within the grace period: a device may "
            "still be downloading what the one before it referenced"
        )
    deltas: list[StoredObject] = []
    variant_files: set[str] = set()
    for obj in objects:
        kind = kind_of(obj.key)
        if kind == "delta":
            deltas.append(obj)  # decided once every variant file is
            continue
        if kind == "variant" and obj.key.endswith(".onnx"):
            variant_files.add(obj.key)
        if kind is None and (obj.key == MANIFEST_KEY or obj.key.startswith(PROTECTED)):
            plan.protected += 1
            continue
        if kind is None:
            plan.unrecognised += 1
            continue
        if obj.key in referenced:
            continue
        reason = None
        if obj.modified > cutoff:
            reason = "younger than the grace period"
        elif kind not in ("temp", "notice") and plan.deferred:
            reason = "the manifest in force is younger than the grace period"
        elif kind in ("variant", "file") and keep_variants:
            reason = keep_variants
        elif kind == "variant":
            device = pinning_device(obj.key, pinned)
            if device is not None:
                reason = f"device {device} reported it active within the retention window"
        elif kind == "file" and obj.key in pinned_file_keys:
            device = pinned_file_keys[obj.key]
            reason = f"a variant device {device} reported active within the retention window"
        if reason:
            plan.kept.append(Kept(key=obj.key, kind=kind, size=obj.size, reason=reason))
        else:
            plan.candidates.append(
                Candidate(key=obj.key, kind=kind, size=obj.size, modified=obj.modified)
            )
    collected = {c.key for c in plan.candidates}
    _plan_deltas(plan, deltas, variant_files - collected, cutoff)
    for upload in uploads:
        if upload.modified > cutoff:
            reason = "an upload started within the grace period (maybe still running)"
            plan.kept.append(
                Kept(key=upload.key, kind="multipart", size=upload.size, reason=reason)
            )
        else:
            plan.candidates.append(
                Candidate(
                    key=upload.key, kind="multipart", size=upload.size, modified=upload.modified
                )
            )
    return plan


def _plan_deltas(
    plan: GcPlan, deltas: list[StoredObject], kept_variants: set[str], cutoff: datetime
) -> None:
    """A delta is kept while both the variant file it makes and the file it applies to (its
    base, of any target of the model) are kept, and while it is younger than the grace
    period (a publish uploads its deltas before the manifest lists them); else it goes."""
    kept_files = set()
    for key in kept_variants:
        if found := _VARIANT_FILE.fullmatch(key):
            kept_files.add(found.groups())
    for obj in deltas:
        found = _DELTA.fullmatch(obj.key)
        assert found is not None  # kind_of matched the same pattern
        model, target, sha256, base = found.groups()
        made_kept = f"variants/{model}/{target}/{sha256}.onnx" in kept_variants
        if made_kept and (model, base) in kept_files:
            continue
        if obj.modified > cutoff:
            reason = "younger than the grace period"
            plan.kept.append(Kept(key=obj.key, kind="delta", size=obj.size, reason=reason))
            continue
        plan.candidates.append(
            Candidate(key=obj.key, kind="delta", size=obj.size, modified=obj.modified)
        )
