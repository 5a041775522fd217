"""What runtime-watch reads where it runs: the compile workers' runtime and the device reports.

The runtime is the ORT and EP packages installed here (deploy the watch on the compile
workers' pool); the reports are the evidence's (``epfleet.fleet.evidence.fleet_reports``,
through the evidence index, named here too); the decisions on what is read are
``epfleet.fleet.watch.rules``'s (pure).
"""

from __future__ import annotations

import eps
from epfleet import ort_version
from epfleet.fleet.evidence.fleet_reports import (
    READ_THREADS,
    full_attributed_device_reports,
    full_device_reports,
    index_pass,
    read_reports,
    report_keys,
    stream_attributed_device_reports,
    stream_device_reports,
)
from epfleet.fleet.watch.rules import Runtime
from epfleet.formats.spec import FleetSpec
from eps.base import MissingExtraError

__all__ = [
    "READ_THREADS",
    "compile_worker_runtime",
    "full_attributed_device_reports",
    "full_device_reports",
    "index_pass",
    "read_reports",
    "report_keys",
    "spec_releases",
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
