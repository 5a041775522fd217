"""The clock epfleet's time rules read, passed to them as a parameter.

``Deadline``, ``TransferGuard`` and a download (``epfleet.limits``,
``epfleet.device.download``), the sync session, the rollout gate's ``min_hours``
(``epfleet.fleet.rollout.rollouts``) and gc's recheck interval (``epfleet.lifecycle.gc``) take a
``clock`` that defaults to ``SYSTEM_CLOCK``; tests pass a fake one to test a rule without
waiting (``tests/support/fake_clock.py``), and keep one end-to-end test per mechanism on
this real one.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for intervals and deadlines)."""
        ...

    def now(self) -> datetime:
        """The current time, timezone-aware in UTC (for times stored or compared with
        stored ones)."""
        ...


class SystemClock:
    """The process's clocks: ``time.monotonic`` and the wall clock in UTC."""

    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(timezone.utc)


SYSTEM_CLOCK: Clock = SystemClock()
