"""Where in each sync interval a device polls: a fixed offset derived from its id (pure).

Devices that all poll on the hour ask the store's ``trust/metadata/`` for their timestamp
in the same second: a million of them is ~50,000 GETs a second on one prefix, far past
the ~5,500 a second S3 serves per prefix before it answers 503 SlowDown. Spread over the
hour by their ids, they ask ~280 a second, every second.

``jitter_seconds`` is the first 32 bits of sha256(device id) modulo the interval in
whole seconds: stable (a device polls at the same offset every interval, across
restarts), uniform over the fleet, and what a shell computes with

    $(( 0x$(printf %s "$EPFLEET_DEVICE_ID" | sha256sum | cut -c1-8) % 3600 ))

for a cron line. ``sync_anchor`` is the anchor of an interval schedule that polls at
that offset (Prefect's ``Interval(..., anchor_date=...)``: runs at the anchor plus whole
intervals), ``next_sync`` the next such time after a moment.
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime, timedelta, timezone

EPOCH = datetime(2020, 1, 1, tzinfo=timezone.utc)
"""The anchor of every device's schedule before its offset: a midnight, so that an
hourly or daily interval's offset is a time of the hour or of the day."""


def jitter_seconds(device_id: str, interval: float) -> int:
    """The device's offset in each ``interval`` (seconds): 0 to the interval's whole
    seconds, exclusive; 0 for an interval under two seconds."""
    whole = max(1, math.floor(interval))
    digest = hashlib.sha256(device_id.encode()).digest()
    return int.from_bytes(digest[:4], "big") % whole


def sync_anchor(device_id: str, interval: float) -> datetime:
    """The anchor date of the device's interval schedule: ``EPOCH`` plus its offset."""
    return EPOCH + timedelta(seconds=jitter_seconds(device_id, interval))


def next_sync(device_id: str, interval: float, after: datetime) -> datetime:
    """The device's first poll time later than ``after`` (an aware datetime)."""
    anchor = sync_anchor(device_id, interval)
    periods = math.floor((after - anchor).total_seconds() / interval) + 1
    return anchor + timedelta(seconds=periods * interval)
