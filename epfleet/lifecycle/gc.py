"""``epfleet gc``: find, and with ``delete`` remove, the store objects nothing needs.

What it collects (each a *kind*):

- ``variant``: ``variants/<model>/<target>/<sha256>.onnx`` no manifest entry references
  (superseded builds, retired models and targets) and no device reported active within
  the retention window (``EPFLEET_GC_RETENTION_DAYS``, at least the devices' report
  heartbeat ``EPFLEET_REPORT_HEARTBEAT``: an unchanged device reports once per heartbeat);
- ``source`` / ``samples``: ``sources/<sha256>.onnx`` and ``samples/<sha256>.npz`` no
  model uses;
- ``file``: ``files/<sha256>`` (external data, EP contexts, sidecars of multi-file sources
  and variants) no source or variant lists, and no variant a device reported active
  lists (``variants/.../<sha256>.files.json``, beside its main file, says which);
- ``delta``: ``deltas/<model>/<target>/<sha256>.from-<base sha256>.zst``, a binary delta
  to a variant's file from a file devices may hold
  (``epfleet.fleet.publishing.delta_rules``), unless both that variant file and its base
  are kept;
- ``temp``: temporary files interrupted local writes left (``.<name>.<8 chars>.tmp``);
- ``multipart``: incomplete S3 multipart uploads.

Only objects older than the grace period, and unreferenced objects (the first three
kinds) only once the manifest in force has been in force for the grace period: a device
that read the previous manifest may still be downloading what it referenced. It never
touches ``manifest.json``, ``reports/``, ``trust/``, ``runs/`` or any key it does not
recognise. Right before each removal it asks whether the manifest changed (a
conditional GET), and if it did, plans again from the new one: an object a racing
publish references again is kept.

``epfleet.lifecycle.gc_rules.plan_collection`` is the pure decision,
``epfleet.lifecycle.gc_pins`` what device
reports pin; ``collect`` here reads the store and removes.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from epfleet.clock import SYSTEM_CLOCK, Clock
from epfleet.errors import StoreError
from epfleet.fleet.evidence.reading import Problems, check_report_window
from epfleet.fleet.publishing.publish import InForce, read_in_force
from epfleet.formats.device_report import REPORTS_PREFIX
from epfleet.formats.manifest import Manifest
from epfleet.formats.schema_version import check_writable
from epfleet.lifecycle.gc_pins import READ_THREADS, pinned_files, pinned_prefixes, recent_reports
from epfleet.lifecycle.gc_rules import (
    KINDS,
    PROTECTED,
    Candidate,
    GcPlan,
    Kept,
    Kind,
    KindTotal,
    kind_of,
    needed_keys,
    plan_collection,
)
from epfleet.stores import UNCHANGED, Store
from epfleet.stores.base import StoredObject
from epfleet.text import format_bytes, printable_lines, wrap

__all__ = [
    "DEFAULT_GRACE_HOURS",
    "DEFAULT_RETENTION_DAYS",
    "KINDS",
    "PROTECTED",
    "READ_THREADS",
    "RECHECK_SECONDS",
    "Candidate",
    "Collection",
    "GcPlan",
    "Kept",
    "Kind",
    "KindTotal",
    "collect",
    "kind_of",
    "needed_keys",
    "pinned_files",
    "pinned_prefixes",
    "plan_collection",
    "recent_reports",
    "render",
]

DEFAULT_GRACE_HOURS = 24.0
"""Objects younger than this, and unreferenced objects while the manifest in force is
younger than this, are kept: longer than any sync or compile run takes."""
DEFAULT_RETENTION_DAYS = 30.0
"""A variant a device reported active within this many days is kept."""
RECHECK_SECONDS = 1.0
"""How old the last look at the manifest may be when gc removes an object: checking before
every removal would read a large local manifest whole each time."""


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
        removed = set(self.removed)
        return sum(c.size for c in self.plan.candidates if c.key in removed)


def collect(
    store: Store,
    *,
    delete: bool = False,
    grace_hours: float = DEFAULT_GRACE_HOURS,
    retention_days: float = DEFAULT_RETENTION_DAYS,
    now: datetime | None = None,
    recheck_seconds: float = RECHECK_SECONDS,
    clock: Clock = SYSTEM_CLOCK,
) -> Collection:
    """List (and with ``delete`` remove) what nothing needs in ``store``: see the module
    docstring. Before a removal, the manifest is checked for a change when the last
    check is ``recheck_seconds`` old on ``clock`` (``now`` defaults to its time).
    StoreError when the manifest cannot be read."""
    now = now or clock.now()
    grace = timedelta(hours=grace_hours)
    retention = timedelta(days=retention_days)
    check_report_window(retention, "the retention window (--retention-days)")
    objects, reports_listed = _objects_but_reports(store)
    uploads = store.incomplete_uploads()
    unreadable = Problems()
    pinned = pinned_prefixes(recent_reports(store, now - retention, unreadable))
    file_keys, bad_listings = pinned_files(store, objects, pinned)
    warnings = [f"unreadable device report {u}" for u in unreadable.summary()]
    warnings += [f"unreadable file listing {b}" for b in bad_listings]
    keep_variants = (
        f"{unreadable.count} device report(s) could not be read: any variant may be active"
        if unreadable.count
        else f"{len(bad_listings)} file listing(s) of active variants could not be read"
        if bad_listings
        else None
    )

    def planned() -> tuple[GcPlan, Manifest | None, InForce]:
        in_force = read_in_force(store)
        manifest = in_force.manifest
        check_writable(manifest.schema_version if manifest else None, store.uri)
        plan = plan_collection(
            objects, uploads, manifest, pinned, now, grace, keep_variants, file_keys
        )
        plan.protected += reports_listed
        return plan, manifest, in_force

    plan, manifest, in_force = planned()
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
    planned_by_key = {c.key: c for c in pending}
    touched: list[Kept] = []
    cutoff = now - grace
    checked = clock.monotonic()
    while pending:
        candidate = pending.pop(0)
        if candidate.kind != "temp" and clock.monotonic() - checked >= recheck_seconds:
            changed = _manifest_changed(store, in_force)
            checked = clock.monotonic()
        else:
            changed = False
        if changed:
            plan, manifest, in_force = planned()
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
            # Only if still older than the cutoff: a publish that reuses an object touches
            # it (publishing.check_present), and the local store checks under its lock.
            if candidate.kind == "temp" or store.delete_if_older(candidate.key, cutoff):
                if candidate.kind == "temp":
                    store.delete(candidate.key)
                result.removed.append(candidate.key)
            else:
                touched.append(
                    Kept(
                        key=candidate.key,
                        kind=candidate.kind,
                        size=candidate.size,
                        reason="touched since planned: a publish reuses it",
                    )
                )
        except StoreError as exc:
            result.errors.append(str(exc))
    if any(c.kind == "multipart" for c in plan.candidates):
        result.removed += store.clean_up_incomplete(older_than=grace.total_seconds())
    result.plan.kept += touched  # (kept across re-plans)
    result.plan.candidates = [c for c in result.plan.candidates if c.kind == "multipart"] + [
        planned_by_key[key] for key in result.removed if key in planned_by_key
    ]
    return result


def _objects_but_reports(store: Store) -> tuple[list[StoredObject], int]:
    """Every object in the store (hidden ones too) but the device reports, which gc never
    collects and a large fleet has a million of: those are only counted."""
    objects, reports = [], 0
    for obj in store.iter_objects("", hidden=True):
        if obj.key.startswith(f"{REPORTS_PREFIX}/"):
            reports += 1
        else:
            objects.append(obj)
    return sorted(objects, key=lambda o: o.key), reports


def _manifest_changed(store: Store, in_force: InForce) -> bool:
    if in_force.etag is None:
        return store.size(in_force.key) is not None
    return store.read_if_changed(in_force.key, in_force.etag) != UNCHANGED


def render(collection: Collection, width: int | None = None) -> str:
    """A readable summary: per kind what it would free (or freed), then what it kept,
    each line wrapped to ``width`` columns."""
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
    return "\n".join(wrap(printable_lines(line), width) for line in lines)
