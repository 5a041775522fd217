"""The device report's identity and delivery: the device's id, and the upload to the store.

A report goes up when it says something the store's copy does not (``content_digest``
differs from the last one uploaded) and otherwise once per heartbeat
(``EPFLEET_REPORT_HEARTBEAT``, a day by default), so that the fleet side still sees the
device alive: an unchanged poll writes nothing. The cache records what it last uploaded,
where and when (``.epfleet/report-sent.json``); an upload that failed records nothing, so
the next sync tries again. Each report uploaded carries the next number of a counter kept
in that record (``sequence``, signed with the report), never below the upload's time in
milliseconds: a cache that lost its record does not number again from 1, below reports
the fleet side has heard (``next_sequence``). Uploads are compact JSON, gzip-compressed
(``encode_report``), with ``Content-Encoding: gzip`` on S3.
"""

from __future__ import annotations

import re
import socket
from contextlib import suppress
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field, ValidationError

from epfleet.device.cache import DeviceCache
from epfleet.errors import BadInputError, EpfleetError, StoreError
from epfleet.formats.device_report import (
    DeviceReport,
    RolloutSeen,
    ShadowRun,
    content_digest,
    encode_report,
    inbox_key,
    report_key,
)
from epfleet.formats.manifest import NAME_PATTERN, ModelEntry, utcnow
from epfleet.settings import settings
from epfleet.stores import Store

if TYPE_CHECKING:
    from securesystemslib.signer import Signer


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


class SentReport(BaseModel):
    """The last report the store received from this cache: where, what it said, when."""

    store: str
    key: str
    digest: str
    at: datetime
    sequence: int = Field(default=0, ge=0, description="The number of the report uploaded")


def next_sequence(last: int, now: datetime) -> int:
    """The number of the next report after one numbered ``last``: one more, or the time
    ``now`` in milliseconds when that is higher."""
    return max(last + 1, int(now.timestamp() * 1000))


def unchanged_since(
    sent: SentReport | None,
    store: str,
    key: str,
    digest: str,
    now: datetime,
    heartbeat: timedelta,
) -> datetime | None:
    """When the store's copy of this report was uploaded, if it says what the report says
    and is younger than the heartbeat (then this one need not go up); else None. A record
    from the future (the clock was set back) counts as stale."""
    if sent is None or (sent.store, sent.key, sent.digest) != (store, key, digest):
        return None
    if not sent.at <= now < sent.at + heartbeat:
        return None
    return sent.at


def upload_report(
    store: Store, report: DeviceReport, cache: DeviceCache | None = None
) -> DeviceReport:
    """Put the report at reports/devices/<id>.json when the store accepts writes and the
    report says something new (or the heartbeat is due); with no ``cache`` to remember
    the last upload, always. Then leave a notice of it in the inbox (``inbox_key``: an
    empty object filed under this device's time), which tells the fleet side's evidence
    index to read it without listing every device's key."""
    if report.manifest.offline:
        return report.model_copy(
            update={"report_uploaded": False, "report_error": "offline: not uploaded"}
        )
    key, digest, now = report_key(report.device_id), content_digest(report), utcnow()
    heartbeat = timedelta(seconds=settings().report_heartbeat)
    sent = _last_sent(cache) if cache is not None else None
    since = unchanged_since(sent, store.uri, key, digest, now, heartbeat)
    if since is not None:
        due = (since + heartbeat).isoformat(timespec="seconds")
        skipped = (
            f"the store has the same report, uploaded {since.isoformat(timespec='seconds')}; "
            f"the next upload by {due} (EPFLEET_REPORT_HEARTBEAT)"
        )
        return report.model_copy(update={"report_uploaded": False, "report_skipped": skipped})
    sequence = next_sequence(sent.sequence if sent is not None else 0, now)
    report = report.model_copy(update={"sequence": sequence})
    try:
        store.write(key, encode_report(report, _signer()), content_encoding="gzip")
    except (StoreError, BadInputError) as exc:  # BadInputError: EPFLEET_DEVICE_KEY unusable
        return report.model_copy(update={"report_uploaded": False, "report_error": str(exc)})
    with suppress(StoreError):  # without it, the fleet side counts it at its next full listing
        store.write(inbox_key(report.device_id, now), b"")
    if cache is not None:
        record = SentReport(store=store.uri, key=key, digest=digest, at=now, sequence=sequence)
        with suppress(OSError, EpfleetError):  # not remembered: the next sync uploads again
            cache.save_report_sent(record.model_dump_json().encode())
    return report.model_copy(update={"report_uploaded": True})


def _last_sent(cache: DeviceCache) -> SentReport | None:
    try:
        data = cache.report_sent()
        return SentReport.model_validate_json(data) if data is not None else None
    except (OSError, EpfleetError, ValidationError):
        return None  # unreadable or damaged: upload, and record again


def rollout_seen(
    entry: ModelEntry, mine: ModelEntry, shadow: ShadowRun | None = None
) -> RolloutSeen:
    """What the report says of the model's rollout: whether this device is in it, and its
    shadow run of the rollout's candidate, if it ran one."""
    assert entry.rollout is not None
    return RolloutSeen(
        id=entry.rollout.id,
        member=mine is entry,
        stage=entry.rollout.stage,
        state=entry.rollout.state,
        shadow=shadow,
    )


def _signer() -> Signer | None:
    """The device's enrolled report-signing key (``EPFLEET_DEVICE_KEY``), if it has one."""
    path = settings().device_key
    if path is None:
        return None
    from epfleet.trust.keys import read_private_key

    try:
        return read_private_key(path)
    except BadInputError as exc:
        raise BadInputError(f"EPFLEET_DEVICE_KEY: {exc}; the report was not uploaded") from None
