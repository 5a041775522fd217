"""``epfleet gc``: find, and with ``delete`` remove, the store objects nothing needs.

What it collects (each a *kind*):

- ``variant``: ``variants/<model>/<target>/<sha256>.onnx`` no manifest entry references
  (superseded builds, retired models and targets) and no device reported active within
  the retention window;
- ``source`` / ``samples``: ``sources/<sha256>.onnx`` and ``samples/<sha256>.npz`` no
  model uses;
- ``file``: ``files/<sha256>`` (external data, EP contexts, sidecars of multi-file sources
  and variants) no source or variant lists, and no variant a device reported active
  lists (``variants/.../<sha256>.files.json``, beside its main file, says which);
- ``temp``: temporary files interrupted local writes left (``.<name>.<8 chars>.tmp``);
- ``multipart``: incomplete S3 multipart uploads.

Only objects older than the grace period, and unreferenced objects (the first three
kinds) only once the manifest in force has been in force for the grace period: a device
that read the previous manifest may still be downloading what it referenced. It never
touches ``manifest.json``, ``reports/``, ``trust/``, ``runs/`` or any key it does not
recognise. Right before each removal it asks whether the manifest changed (a
conditional GET), and if it did, plans again from the new one: an object a racing
publish references again is kept.

``plan_collection`` is the pure decision; ``collect`` reads the store and removes.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from epfleet.device_report import REPORTS_PREFIX, DeviceReport
from epfleet.errors import StoreError
from epfleet.fsutil import is_temp_name
from epfleet.manifest import Manifest, files_key, referenced_keys
from epfleet.plan import listing_key
from epfleet.publishing import read_manifest
from epfleet.report import format_bytes
from epfleet.stores import MANIFEST_KEY, UNCHANGED, DocumentTooLarge, Store
from epfleet.stores.base import StoredObject

DEFAULT_GRACE_HOURS = 24.0
"""Objects younger than this, and unreferenced objects while the manifest in force is
younger than this, are kept: longer than any sync or compile run takes."""
DEFAULT_RETENTION_DAYS = 30.0
"""A variant a device reported active within this many days is kept."""
READ_THREADS = 16
RECHECK_SECONDS = 1.0
"""How old the last look at the manifest may be when gc removes an object: checking before
every removal would read a large local manifest whole each time."""

Kind = Literal["variant", "source", "samples", "file", "temp", "multipart"]
KINDS: tuple[Kind, ...] = ("variant", "source", "samples", "file", "temp", "multipart")
PROTECTED = ("reports/", "trust/", "runs/")
"""Never collected: device reports, signed metadata, hand-over files (their own sweeps)."""

_HEX = "[0-9a-f]{64}"
_NAME = "[a-z0-9][a-z0-9._-]*"
_PATTERNS: tuple[tuple[Kind, re.Pattern[str]], ...] = (
    ("variant", re.compile(rf"variants/{_NAME}/{_NAME}/{_HEX}\.(onnx|files\.json)")),
    ("source", re.compile(rf"sources/{_HEX}\.onnx")),
    ("samples", re.compile(rf"samples/{_HEX}\.npz")),
    ("file", re.compile(rf"files/{_HEX}")),
)
_TEMP_FOLDERS = ("sources/", "samples/", "variants/", "files/")
"""Where a temp file is collected: these folders and the store's root."""


def kind_of(key: str) -> Kind | None:
    """The kind of a store key the collector may remove; None for anything else."""
    if key == MANIFEST_KEY or key.startswith(PROTECTED):
        return None
    for kind, pattern in _PATTERNS:
        if pattern.fullmatch(key):
            return kind
    folder, _, name = key.rpartition("/")
    if is_temp_name(name) and (not folder or key.startswith(_TEMP_FOLDERS)):
        return "temp"
    return None


def pinned_prefixes(reports: Iterable[DeviceReport]) -> dict[str, str]:
    """Key prefixes of the variants devices reported active, each with the device that
    pins it: a device's variant name is ``<target>-<first 12 hex digits of its sha256>``
    (``epfleet.device.activation.variant_name``)."""
    pinned: dict[str, str] = {}
    for report in reports:
        for model in report.models:
            if not (model.variant and model.target):
                continue
            prefix, _, digits = model.variant.rpartition("-")
            if prefix == model.target and re.fullmatch("[0-9a-f]{12}", digits):
                key = f"variants/{model.model}/{model.target}/{digits}"
                pinned.setdefault(key, report.device_id)
    return pinned


def needed_keys(manifest: Manifest | None) -> set[str]:
    """What the manifest references, and the file listings of its multi-file variants."""
    keys = referenced_keys(manifest)
    for entry in (manifest.models if manifest else {}).values():
        for variant in entry.variants.values():
            if variant.artifact is not None and variant.files:
                keys.add(listing_key(variant.artifact.uri))
    return keys


def pinned_files(
    store: Store, objects: Iterable[StoredObject], pinned: dict[str, str]
) -> tuple[dict[str, str], list[str]]:
    """The files/ keys that the variants devices run list (their ``.files.json``), each
    with the device pinning it; and the listings that cannot be read, with why."""
    files: dict[str, str] = {}
    problems = []
    for obj in objects:
        if not obj.key.endswith(".files.json"):
            continue
        device = next((d for p, d in pinned.items() if obj.key.startswith(p)), None)
        if device is None:
            continue
        try:
            found = store.read(obj.key)
            listing = json.loads(found.data) if found is not None else []
            for item in listing:
                files.setdefault(files_key(item["sha256"]), device)
        except (StoreError, ValueError, TypeError, KeyError) as exc:
            problems.append(f"{obj.key}: {exc}")
    return files, problems


def recent_reports(store: Store, since: datetime) -> tuple[list[DeviceReport], list[str]]:
    """The device reports the store received since ``since`` (by the store's clock, not
    the devices'), and the keys of those that cannot be read, with why. Reports are small
    and many (one per device): read ``READ_THREADS`` at a time."""
    keys = [o.key for o in store.list_objects(f"{REPORTS_PREFIX}/") if o.modified >= since]

    def read_one(key: str) -> DeviceReport | str | None:
        try:
            found = store.read(key)
            if found is None:
                return None  # removed since listed
            return DeviceReport.model_validate_json(found.data)
        except DocumentTooLarge as exc:
            return f"{key}: {exc}"
        except ValidationError as exc:
            error = exc.errors()[0]
            return f"{key}: {'.'.join(map(str, error['loc']))}: {error['msg']}"

    with ThreadPoolExecutor(max_workers=READ_THREADS) as pool:
        results = list(pool.map(read_one, keys))
    return (
        [r for r in results if isinstance(r, DeviceReport)],
        [r for r in results if isinstance(r, str)],
    )


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
    to a device, ``pinned_file_keys`` the files/ keys those variants list; ``keep_variants``,
    when set, is why every variant and file is kept (an unreadable device report or file
    listing may pin any of them)."""
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
    for obj in objects:
        kind = kind_of(obj.key)
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
        elif kind != "temp" and plan.deferred:
            reason = "the manifest in force is younger than the grace period"
        elif kind in ("variant", "file") and keep_variants:
            reason = keep_variants
        elif kind == "variant":
            device = next((d for p, d in pinned.items() if obj.key.startswith(p)), None)
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


class Collection(BaseModel):
    """What ``epfleet gc`` found and did."""

    store: str
    generation: int | None = Field(description="Generation of the manifest it planned from")
    grace_hours: float
    retention_days: float
    deleted: bool = Field(description="Whether it removed the candidates (else a dry run)")
    plan: GcPlan
    removed: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list, description="Removals that failed")

    @property
    def freed(self) -> int:
        return sum(c.size for c in self.plan.candidates if c.key in set(self.removed))


def collect(
    store: Store,
    *,
    delete: bool = False,
    grace_hours: float = DEFAULT_GRACE_HOURS,
    retention_days: float = DEFAULT_RETENTION_DAYS,
    now: datetime | None = None,
    recheck_seconds: float = RECHECK_SECONDS,
) -> Collection:
    """List (and with ``delete`` remove) what nothing needs in ``store``: see the module
    docstring. Before a removal, the manifest is checked for a change when the last
    check is ``recheck_seconds`` old. StoreError when the manifest cannot be read."""
    now = now or datetime.now(timezone.utc)
    grace = timedelta(hours=grace_hours)
    objects = store.list_objects("", hidden=True)
    uploads = store.incomplete_uploads()
    reports, unreadable = recent_reports(store, now - timedelta(days=retention_days))
    pinned = pinned_prefixes(reports)
    file_keys, bad_listings = pinned_files(store, objects, pinned)
    warnings = [f"unreadable device report {u}" for u in unreadable]
    warnings += [f"unreadable file listing {b}" for b in bad_listings]
    keep_variants = (
        f"{len(unreadable)} device report(s) could not be read: any variant may be active"
        if unreadable
        else f"{len(bad_listings)} file listing(s) of active variants could not be read"
        if bad_listings
        else None
    )

    def planned() -> tuple[GcPlan, Manifest | None, str | None]:
        manifest, etag = read_manifest(store)
        plan = plan_collection(
            objects, uploads, manifest, pinned, now, grace, keep_variants, file_keys
        )
        return plan, manifest, etag

    plan, manifest, etag = planned()
    result = Collection(
        store=store.uri,
        generation=manifest.generation if manifest else None,
        grace_hours=grace_hours,
        retention_days=retention_days,
        deleted=delete,
        plan=plan,
        warnings=warnings,
    )
    if not delete:
        return result
    pending = [c for c in plan.candidates if c.kind != "multipart"]
    checked = time.monotonic()
    while pending:
        candidate = pending.pop(0)
        if candidate.kind != "temp" and time.monotonic() - checked >= recheck_seconds:
            changed = _manifest_changed(store, etag)
            checked = time.monotonic()
        else:
            changed = False
        if changed:
            plan, manifest, etag = planned()
            result.plan, result.generation = plan, manifest.generation if manifest else None
            result.warnings.append(
                f"the manifest changed during the collection (now generation "
                f"{result.generation}); planned again from it"
            )
            still = {c.key for c in plan.candidates}
            pending = [c for c in pending if c.key in still]
            if candidate.key not in still:
                continue
        try:
            store.delete(candidate.key)
            result.removed.append(candidate.key)
        except StoreError as exc:
            result.errors.append(str(exc))
    if any(c.kind == "multipart" for c in plan.candidates):
        result.removed += store.clean_up_incomplete(older_than=grace.total_seconds())
    result.plan.candidates = [
        c for c in result.plan.candidates if c.kind == "multipart" or c.key in set(result.removed)
    ]
    return result


def _manifest_changed(store: Store, etag: str | None) -> bool:
    if etag is None:
        return store.size(MANIFEST_KEY) is not None
    return store.read_if_changed(MANIFEST_KEY, etag) != UNCHANGED


def render(collection: Collection) -> str:
    """A readable summary: per kind what it would free (or freed), then what it kept."""
    plan = collection.plan
    verb = "removed" if collection.deleted else "would remove"
    lines = [
        f"store {collection.store} · manifest generation {collection.generation} · grace "
        f"{collection.grace_hours:g} h · retention {collection.retention_days:g} days",
        f"{'kind':<10} {'objects':>8} {'bytes':>12}",
    ]
    totals = plan.totals()
    for kind, total in totals.items():
        lines.append(f"{kind:<10} {total.count:>8} {format_bytes(total.bytes):>12}")
    count = sum(t.count for t in totals.values())
    size = sum(t.bytes for t in totals.values())
    lines.append(f"{'total':<10} {count:>8} {format_bytes(size):>12}")
    lines.append(
        f"{verb} {count} object(s), {format_bytes(size)}"
        + ("" if collection.deleted else "; run with --delete to remove them")
    )
    if plan.deferred:
        lines.append(f"kept every unreferenced object: {plan.deferred}")
    reasons: dict[str, int] = {}
    for kept in plan.kept:
        reasons[kept.reason] = reasons.get(kept.reason, 0) + 1
    lines += [f"kept {n}: {reason}" for reason, n in sorted(reasons.items())]
    if plan.protected:
        lines.append(
            f"left alone {plan.protected} object(s) of manifest.json, reports/, trust/, runs/"
        )
    if plan.unrecognised:
        lines.append(f"left alone {plan.unrecognised} object(s) it does not recognise")
    lines += [f"warning: {w}" for w in collection.warnings]
    lines += [f"error: {e}" for e in collection.errors]
    return "\n".join(lines)
