"""The device report's identity and delivery: the device's id, and the upload to the store."""

from __future__ import annotations

import re
import socket

from epfleet.errors import BadInputError, StoreError
from epfleet.formats.device_report import DeviceReport, report_key
from epfleet.formats.manifest import NAME_PATTERN
from epfleet.settings import settings
from epfleet.stores import Store


def device_id(given: str | None) -> str:
    """The device's id in reports: ``given``, else $EPFLEET_DEVICE_ID, else the host name."""
    chosen = given or settings().device_id  # EPFLEET_DEVICE_ID
    if chosen:
        if not re.fullmatch(NAME_PATTERN, chosen):
            raise BadInputError(
                f"device id {chosen!r} must match {NAME_PATTERN} (lowercase letters, digits, "
                "'.', '_' and '-')"
            )
        return chosen
    host = re.sub(r"[^a-z0-9._-]+", "-", socket.gethostname().lower()).strip("-._")
    return host or "device"


def upload_report(store: Store, report: DeviceReport) -> DeviceReport:
    """Put the report at reports/devices/<id>.json when the store accepts writes."""
    if report.manifest.offline:
        return report.model_copy(
            update={"report_uploaded": False, "report_error": "offline: not uploaded"}
        )
    data = report.model_dump_json(indent=2, exclude={"report_uploaded", "report_error"})
    try:
        store.write(report_key(report.device_id), data.encode())
    except StoreError as exc:
        return report.model_copy(update={"report_uploaded": False, "report_error": str(exc)})
    return report.model_copy(update={"report_uploaded": True})
