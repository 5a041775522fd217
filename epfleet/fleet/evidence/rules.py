"""Whose report a stored report object is (pure): the one door through which the rollout
gate reads a device report, from the object's key and raw bytes.

The rules:

- A report object decodes (``epfleet.formats.device_report.decode_report``: gzip or plain
  JSON, within the size limit, every number finite and in range) and its ``generated_at``
  is an ISO time with its UTC offset; otherwise it is *unreadable*.
- Its key is a device report's key (``reports/devices/<id>.json``) naming the device id
  inside it; otherwise it is *not attributed* (reason ``key``). A device has one key, so
  one vote: the newest report it wrote, the one its key holds. Forty objects saying one
  id are one attributed report at most.
- A device's reports in order (``newest``): an enrolled device numbers and signs its
  reports, and the fleet side remembers the highest-numbered one it heard from each
  (``epfleet.fleet.evidence.heard_reports``). What its key holds counts when it is signed with the
  device's enrolled key and numbered at least as high; otherwise (an older report put
  back, an unnumbered, unsigned or unreadable one in its place) the remembered one counts.
  A report without a number (an older device) or not signed with an enrolled key ranks
  below every numbered signed one, and is counted as before where nothing is remembered:
  anyone who can write the store can write any number into an unsigned report, so only a
  signed number orders reports.
- What a report then counts for in a rollout (its side, its stage, its age) is
  ``epfleet.fleet.rollout.rules``'.

Authenticated reports (a device signs its report with a key the operator enrolled) are
checked here, first, when they are turned on: ``attribute`` is the only place a report
object becomes a report the gate hears.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import ValidationError

from epfleet.formats.device_report import DeviceReport, decode_report, key_device, signed_by
from epfleet.formats.manifest import DeviceKey
from epfleet.text import printable

UnattributedReason = Literal["unreadable", "key"]

READING_REASONS: dict[str, str] = {
    "unreadable": "could not be read",
    "key": "its object key names another device",
}


@dataclass(frozen=True)
class Unattributed:
    """A report object that cannot be used as its key's device's report, and why: the one
    kind of unusable report, for the gate, runtime-watch and gc alike. As text,
    ``key: why``, made printable (whoever wrote the report chose both)."""

    key: str
    reason: UnattributedReason
    detail: str
    report: DeviceReport | None = None
    """The report it holds, when it decoded (its key names another device)."""

    def __str__(self) -> str:
        return printable(f"{self.key}: {self.detail}")


def decoded(key: str, data: bytes, limit: int) -> DeviceReport | Unattributed:
    """The report the object ``key`` holds in ``data`` (at most ``limit`` bytes once
    inflated), or why it is unreadable; whose report it is is not checked."""
    try:
        return decode_report(data, limit)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(map(str, error["loc"]))
        return Unattributed(key, "unreadable", f"{where}: {error['msg']}")
    except ValueError as exc:
        return Unattributed(key, "unreadable", str(exc))


def attribute(key: str, data: bytes, limit: int) -> DeviceReport | Unattributed:
    """The report of the device ``key`` names, read from ``data`` (at most ``limit`` bytes
    once inflated), or why it is not (see the module's rules)."""
    report = decoded(key, data, limit)
    if isinstance(report, Unattributed):
        return report
    try:
        made_at(report.generated_at)
    except ValueError as exc:
        return Unattributed(key, "unreadable", str(exc))
    named = key_device(key)
    if named != report.device_id:
        return Unattributed(
            key,
            "key",
            f"the key names {named!r}, the report device {report.device_id!r}",
            report,
        )
    return report


Heard = DeviceReport | Unattributed


def newest(heard: Heard, remembered: Heard | None, key: DeviceKey) -> tuple[Heard, bool]:
    """Which report of a device enrolled with ``key`` counts: ``heard``, what its report
    key holds now, or ``remembered``, the highest-numbered signed report heard from it
    before (both as ``attribute`` read them); and whether ``heard`` is to be remembered
    in its place (it is signed and numbered higher). The rules are the module's."""
    now, before = _rank(heard, key), _rank(remembered, key)
    if remembered is not None and before is not None and (now is None or now < before):
        return remembered, False
    return heard, now is not None and (before is None or now > before)


def _rank(report: Heard | None, key: DeviceKey) -> int | None:
    """The report's number when it is signed with ``key``; None otherwise."""
    if not isinstance(report, DeviceReport) or report.sequence is None:
        return None
    return report.sequence if signed_by(report, key) else None


def made_at(generated_at: str) -> datetime:
    """When a report says it was made (its ``generated_at``); ValueError, saying why,
    unless an ISO time with its UTC offset."""
    try:
        made = datetime.fromisoformat(generated_at)
    except ValueError:
        raise ValueError(f"generated_at {generated_at!r} is not an ISO time") from None
    if made.tzinfo is None:
        raise ValueError(f"generated_at {generated_at!r} has no UTC offset")
    return made
