"""The fleet's device reports as the rollout gate, the field view and runtime-watch read
them: through the evidence index (``epfleet.fleet.evidence.index``: a pass reads only the
reports that changed since the last), or every one read again (a recount); in the store,
or where EPFLEET_REPORT_TO says the devices send them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from epfleet.fleet.evidence.heard_reports import HeardReports
from epfleet.fleet.evidence.index import EachShard, IndexPass, update
from epfleet.fleet.evidence.reading import (
    READ_THREADS,
    ReportOrder,
    reports_from,
    stream_attributed_reports,
    stream_reports,
)
from epfleet.fleet.evidence.rules import Unattributed, made_at
from epfleet.formats.device_report import REPORTS_PREFIX, DeviceReport
from epfleet.formats.manifest import DeviceKey
from epfleet.settings import settings
from epfleet.stores import Store

logger = logging.getLogger(__name__)


def _time_checked(report: DeviceReport) -> None:
    """ValueError unless the report's time is readable (``made_at``), as the index checks."""
    made_at(report.generated_at)


def report_keys(store: Store) -> Iterator[str]:
    """The keys of the device reports, as the store lists them (not held)."""
    return (o.key for o in store.iter_objects(f"{REPORTS_PREFIX}/"))


def stream_device_reports(
    store: Store, threads: int = READ_THREADS, enrolled: Mapping[str, DeviceKey] | None = None
) -> Iterator[DeviceReport | Unattributed]:
    """Every device report of the fleet (in the store, or where EPFLEET_REPORT_TO says), or
    why one cannot be used (a ``generated_at`` without its UTC offset included), as the
    evidence index holds them after a pass that read only what changed
    (``epfleet.fleet.evidence.index``). ``enrolled``: the devices' keys (the signed
    manifest's), that the index checks signed reports against."""
    return index_pass(store, enrolled or {}, threads).readings()


def stream_attributed_device_reports(
    store: Store, enrolled: Mapping[str, DeviceKey], threads: int = READ_THREADS
) -> Iterator[DeviceReport | Unattributed]:
    """Every device report of the fleet as the rollout gate hears it: the report of the
    device its key names, or why not (``epfleet.fleet.evidence.rules.attribute``); for a
    device ``enrolled`` (the signed manifest's keys), its newest signed report, this
    machine's memory of them kept (``epfleet.fleet.evidence.heard_reports``); as the evidence index
    holds them after a pass that read only what changed."""
    return index_pass(store, enrolled, threads).heard()


def index_pass(
    store: Store,
    enrolled: Mapping[str, DeviceKey],
    threads: int = READ_THREADS,
    *,
    rebuild: bool = False,
    fresh: float | None = None,
    each_shard: EachShard | None = None,
) -> IndexPass:
    """The evidence index of the fleet's reports brought up to date (``evidence_index``;
    with ``rebuild``, every report read again, every key listed), or as a pass that
    started less than ``fresh`` seconds ago left it (default EPFLEET_EVIDENCE_FRESH_SECONDS;
    0: brought up to date now), a warning logged for each shard that did not verify and
    was rebuilt from the reports; ``each_shard`` called with each shard's records once up
    to date (``index.update``)."""
    fresh = settings().evidence_fresh_seconds if fresh is None else fresh
    found = update(
        reports_from(store),
        enrolled,
        threads=threads,
        rebuild=rebuild,
        fresh=fresh,
        each_shard=each_shard,
    )
    for problem in found.rebuilt:
        logger.warning("evidence index shard rebuilt from the reports: %s", problem)
    return found


def full_device_reports(
    store: Store, threads: int = READ_THREADS
) -> Iterator[DeviceReport | Unattributed]:
    """``stream_device_reports`` without the index: every report read (a full recount)."""
    reports = reports_from(store)
    return stream_reports(reports, report_keys(reports), threads=threads, check=_time_checked)


def full_attributed_device_reports(
    store: Store, enrolled: Mapping[str, DeviceKey], threads: int = READ_THREADS
) -> Iterator[DeviceReport | Unattributed]:
    """``stream_attributed_device_reports`` without the index: every report read."""
    reports = reports_from(store)
    order = ReportOrder(enrolled, HeardReports.of(reports.uri))
    return stream_attributed_reports(reports, report_keys(reports), threads=threads, order=order)


def read_reports(store: Store, threads: int = READ_THREADS) -> tuple[list[DeviceReport], list[str]]:
    """Every device report in the store, and the keys of those that do not parse, held in
    lists: for tests and benchmarks; runtime-watch streams them (``stream_device_reports``)."""
    results = list(stream_device_reports(store, threads))
    reports = [r for r in results if isinstance(r, DeviceReport)]
    return reports, [str(r) for r in results if isinstance(r, Unattributed)]
