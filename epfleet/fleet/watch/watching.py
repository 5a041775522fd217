"""One runtime-watch pass, without Prefect: read the spec, the manifest in force, this
machine's runtime and the device reports, and decide (``epfleet.fleet.watch.rules``).
The runtime-watch flow's task runs it inside a flow run; ``epfleet watch --dry-run``
runs it alone (a report starts nothing, so it needs no Prefect API)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from epfleet.fleet.evidence.enrolment import keys_in_force
from epfleet.fleet.evidence.reading import Problems, check_report_window
from epfleet.fleet.evidence.rules import Unattributed
from epfleet.fleet.publishing.publish import read_in_force
from epfleet.fleet.watch.inputs import compile_worker_runtime, stream_device_reports
from epfleet.fleet.watch.rules import WatchPlan, check_pairs, find_unserved
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.manifest import utcnow
from epfleet.formats.spec_file import load_spec
from epfleet.stores import open_store


@dataclass
class WatchFindings:
    plan: WatchPlan
    generation: int
    """The manifest generation the findings were made on (0: nothing published)."""
    notes: list[str] = field(default_factory=list)
    """What was left out and why (reports unreadable or too old), for the log."""


def watch_once(spec: str, store: str, report_max_age_days: int) -> WatchFindings:
    """The watch's findings for ``spec`` against ``store``, from this machine's runtime.
    The device reports are streamed (never all held)."""
    fleet = load_spec(Path(spec))
    target_store = open_store(store)
    in_force = read_in_force(target_store)
    manifest = in_force.manifest
    max_age = timedelta(days=report_max_age_days)
    check_report_window(max_age, "runtime-watch's report_max_age_days")
    runtime = compile_worker_runtime(fleet)
    checks = check_pairs(fleet, manifest, runtime)
    problems, read = Problems(), [0]

    def reports() -> Iterator[DeviceReport]:
        enrolled = keys_in_force(target_store, in_force)
        for found in stream_device_reports(target_store, enrolled=enrolled):
            if isinstance(found, Unattributed):
                problems.add(found)
            else:
                read[0] += 1
                yield found

    unserved, quiet = find_unserved(reports(), fleet, checks, runtime, utcnow(), max_age)
    skipped = problems.summary()
    notes = [f"device report ignored: {problem}" for problem in skipped]
    if quiet:
        notes.append(f"{quiet} device reports older than {report_max_age_days} days ignored")
    plan = WatchPlan(pairs=checks, unserved=unserved, reports_read=read[0], reports_skipped=skipped)
    return WatchFindings(plan, manifest.generation if manifest else 0, notes)
