"""What device reports pin for ``epfleet gc``: the variants devices run, and their files.

A device that reported a variant active within the retention window keeps it in the
store after the manifest drops it (``pinned_prefixes``), with the ``files/`` objects its
``.files.json`` listing names (``pinned_files``). ``recent_reports`` streams the reports:
what is kept of them is the pins, one per variant in use, not one per device.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from datetime import datetime

from epfleet.errors import StoreError
from epfleet.fleet.evidence.reading import READ_THREADS, Problems, reports_from, stream_reports
from epfleet.fleet.evidence.rules import Unattributed
from epfleet.formats.device_report import REPORTS_PREFIX, DeviceReport
from epfleet.formats.keys import files_key, variant_key
from epfleet.lifecycle.gc_rules import pinning_device
from epfleet.stores import Store
from epfleet.stores.base import StoredObject

__all__ = ["READ_THREADS", "pinned_files", "pinned_prefixes", "recent_reports"]


def pinned_prefixes(reports: Iterable[DeviceReport]) -> dict[str, str]:
    """Key prefixes of the variants devices reported active, each with the device that
    pins it (the first report naming it).

    A report that gives the active variant's main file (``ModelReport.artifact_sha256``)
    pins exactly that file and its listing: ``variants/<model>/<target>/<sha256>.``. An
    older report gives only the variant's name, ``<target>-<first 12 hex digits>``
    (``epfleet.device.activation.variant_name``): of its main file's sha256 for a
    single-file variant, which the prefix ``variants/<model>/<target>/<12 digits>`` pins;
    a multi-file variant's name comes from its set's digest, which no key shows."""
    pinned: dict[str, str] = {}
    for report in reports:
        for model in report.models:
            if not (model.variant and model.target):
                continue
            if model.artifact_sha256 is not None:
                key = variant_key(model.model, model.target, model.artifact_sha256)
                pinned.setdefault(key.removesuffix("onnx"), report.device_id)
                continue
            prefix, _, digits = model.variant.rpartition("-")
            if prefix == model.target and re.fullmatch("[0-9a-f]{12}", digits):
                key = f"variants/{model.model}/{model.target}/{digits}"
                pinned.setdefault(key, report.device_id)
    return pinned


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
        device = pinning_device(obj.key, pinned)
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


def recent_reports(store: Store, since: datetime, problems: Problems) -> Iterator[DeviceReport]:
    """The device reports the store received since ``since`` (by the store's clock, not
    the devices'), streamed (``epfleet.fleet.evidence.reading``: a large fleet's reports are
    never all held); those that cannot be read go to ``problems``, with why. Where
    EPFLEET_REPORT_TO says the devices report elsewhere, from there."""
    reports = reports_from(store)
    listed = reports.iter_objects(f"{REPORTS_PREFIX}/")
    keys = (o.key for o in listed if o.modified >= since)
    for found in stream_reports(reports, keys, threads=READ_THREADS):
        if isinstance(found, Unattributed):
            problems.add(found)
        else:
            yield found
