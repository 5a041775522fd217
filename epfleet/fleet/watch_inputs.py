"""What runtime-watch reads where it runs: the compile workers' runtime and the device reports.

The runtime is the ORT and EP packages installed here (deploy the watch on the compile
workers' pool); the decisions on what is read are ``epfleet.fleet.watch_rules``'s (pure).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from pydantic import ValidationError

import eps
from epfleet import ort_version
from epfleet.fleet.watch_rules import Runtime, report_time
from epfleet.formats.device_report import REPORTS_PREFIX, DeviceReport
from epfleet.formats.spec import FleetSpec
from epfleet.stores import DocumentTooLarge, Store
from eps.base import MissingExtraError

READ_THREADS = 16


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
    return Runtime(ort_version=ort_version(), ep_versions=versions, ep_packages=packages)


def read_reports(store: Store, threads: int = READ_THREADS) -> tuple[list[DeviceReport], list[str]]:
    """Every device report in the store, and the keys of those that do not parse. Reports
    are small and many (one per device), so they are read ``threads`` at a time."""

    def read_one(key: str) -> DeviceReport | str | None:
        try:
            found = store.read(key)
        except DocumentTooLarge as exc:  # over EPFLEET_MAX_DOCUMENT_BYTES: one bad report
            return f"{key}: {exc}"
        if found is None:
            return None  # removed since listed
        try:
            report = DeviceReport.model_validate_json(found.data)
            report_time(report)
        except ValidationError as exc:
            error = exc.errors()[0]
            return f"{key}: {'.'.join(map(str, error['loc']))}: {error['msg']}"
        except ValueError as exc:
            return f"{key}: {exc}"
        return report

    keys = store.list_keys(f"{REPORTS_PREFIX}/")
    with ThreadPoolExecutor(max_workers=threads) as pool:
        results = list(pool.map(read_one, keys))
    reports = [r for r in results if isinstance(r, DeviceReport)]
    return reports, [r for r in results if isinstance(r, str)]
