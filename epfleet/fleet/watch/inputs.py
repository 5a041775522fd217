"""What runtime-watch reads where it runs: the compile workers' runtime and the device reports.

The runtime is the ORT and EP packages installed here (deploy the watch on the compile
workers' pool); the reports are read through the evidence index
(``epfleet.fleet.evidence.index``: a pass reads only the reports that changed since the
last); the decisions on what is read are ``epfleet.fleet.watch.rules``'s (pure).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

import eps
from epfleet import ort_version
from epfleet.fleet.evidence.heard_reports import HeardReports
from epfleet.fleet.evidence.index import IndexPass, update
from epfleet.fleet.evidence.reading import (
    READ_THREADS,
    ReportOrder,
    reports_from,
    stream_attributed_reports,
    stream_reports,
)
from epfleet.fleet.evidence.rules import Unattributed
from epfleet.fleet.watch.rules import Runtime, report_time
from epfleet.formats.device_report import REPORTS_PREFIX, DeviceReport
from epfleet.formats.manifest import DeviceKey
from epfleet.formats.spec import FleetSpec
from epfleet.stores import Store
from eps.base import MissingExtraError

logger = logging.getLogger(__name__)

__all__ = [
    "READ_THREADS",
    "compile_worker_runtime",
    "full_attributed_device_reports",
    "full_device_reports",
    "index_pass",
    "read_reports",
    "report_keys",
    "stream_attributed_device_reports",
    "stream_device_reports",
]


def compile_worker_runtime(spec: FleetSpec) -> Runtime:
    """The versions installed where this runs: the compile workers' when the watch runs on
    their work pool, as its deployment does."""
    versions: dict[str, str | None] = {}
    packages: dict[str, str | None] = {}
    for ep in {t.ep for t in spec.targets}:
        try:
            identity = eps.load(ep).build_identity()
        except MissingExtraError:
            versions[ep] = packages[ep] = None
            continue
        versions[ep], packages[ep] = identity["version"], identity["package"]
    return Runtime(
        ort_version=ort_version(),
        ep_versions=versions,
        ep_packages=packages,
        spec_releases=spec_releases(spec, packages),
    )


def spec_releases(spec: FleetSpec, packages: dict[str, str | None]) -> dict[str, dict[str, str]]:
    """EP name -> the spec's runtimes that build its targets -> the release of the EP's
    package each pins (``==``); a runtime that does not pin it exactly is left out."""
    from packaging.utils import canonicalize_name

    releases: dict[str, dict[str, str]] = {}
    for target in spec.targets:
        package = packages.get(target.ep)
        if target.runtime is None or package is None:
            continue
        pinned = spec.runtimes[target.runtime].pins.get(canonicalize_name(package))
        if pinned is not None:
            releases.setdefault(target.ep, {})[target.runtime] = pinned
    return releases


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
) -> IndexPass:
    """The evidence index of the fleet's reports brought up to date (``evidence_index``;
    with ``rebuild``, every report read again), a warning logged for each shard that did
    not verify and was rebuilt from the reports."""
    found = update(reports_from(store), enrolled, threads=threads, rebuild=rebuild)
    for problem in found.rebuilt:
        logger.warning("evidence index shard rebuilt from the reports: %s", problem)
    return found


def full_device_reports(
    store: Store, threads: int = READ_THREADS
) -> Iterator[DeviceReport | Unattributed]:
    """``stream_device_reports`` without the index: every report read (a full recount)."""
    reports = reports_from(store)
    return stream_reports(reports, report_keys(reports), threads=threads, check=report_time)


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
