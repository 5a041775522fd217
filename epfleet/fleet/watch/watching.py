"""One runtime-watch pass, without Prefect: read the spec, the manifest in force, this
machine's runtime and the device reports, and decide (``epfleet.fleet.watch.rules``).
The runtime-watch flow's task runs it inside a flow run; ``epfleet watch --dry-run``
runs it alone (a report starts nothing, so it needs no Prefect API)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from epfleet.fleet.evidence.aggregate_rules import merged
from epfleet.fleet.evidence.enrolment import keys_in_force
from epfleet.fleet.evidence.index import index_key
from epfleet.fleet.evidence.reading import check_report_window, reports_from
from epfleet.fleet.publishing.publish import read_in_force
from epfleet.fleet.watch.aggregate_rules import EPOCH, WatchContext, unserved_of
from epfleet.fleet.watch.inputs import compile_worker_runtime, index_pass
from epfleet.fleet.watch.rules import WatchPlan, check_pairs
from epfleet.fleet.watch.shared_aggregates import keep_context, watch_aggregates
from epfleet.formats.manifest import utcnow
from epfleet.formats.spec import FleetSpec
from epfleet.formats.spec_file import load_spec
from epfleet.stores import Store, open_store


@dataclass
class WatchFindings:
    plan: WatchPlan
    generation: int
    """The manifest generation the findings were made on (0: nothing published)."""
    notes: list[str] = field(default_factory=list)
    """What was left out and why (reports unreadable or too old), for the log."""


def watch_once(spec: str, store: str, report_max_age_days: int) -> WatchFindings:
    """The watch's findings for ``spec`` against ``store``, from this machine's runtime.
    The device reports are read through the evidence index (only what changed), and the
    findings merged from its shards' aggregates (``epfleet.fleet.watch.aggregate_rules``),
    which the other readers' passes keep up to date too
    (``epfleet.fleet.watch.shared_aggregates``)."""
    return watch_store(load_spec(Path(spec)), open_store(store), report_max_age_days)


def watch_store(fleet: FleetSpec, target_store: Store, report_max_age_days: int) -> WatchFindings:
    """``watch_once`` of a spec and a store already opened."""
    in_force = read_in_force(target_store)
    manifest = in_force.manifest
    max_age = timedelta(days=report_max_age_days)
    check_report_window(max_age, "runtime-watch's report_max_age_days")
    runtime = compile_worker_runtime(fleet)
    checks = check_pairs(fleet, manifest, runtime)
    enrolled = keys_in_force(target_store, in_force)
    context = WatchContext(fleet, checks, runtime, max_age)
    now = utcnow()
    reports, key = reports_from(target_store), index_key()
    keep_context(reports, key, context)
    aggregates = watch_aggregates(reports, key, context, (now - EPOCH) // timedelta(microseconds=1))
    index_pass(target_store, enrolled, each_shard=aggregates)
    found = unserved_of(merged(aggregates.folded.values()))
    notes = [f"device report ignored: {problem}" for problem in found.problems]
    if found.quiet:
        notes.append(f"{found.quiet} device reports older than {report_max_age_days} days ignored")
    unserved, read, skipped = found.unserved, found.read, found.problems
    plan = WatchPlan(pairs=checks, unserved=unserved, reports_read=read, reports_skipped=skipped)
    return WatchFindings(plan, manifest.generation if manifest else 0, notes)
