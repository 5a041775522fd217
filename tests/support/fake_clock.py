"""A clock for tests of epfleet's time rules (``epfleet.clock.Clock``): it moves only when a
test (or a double standing in for a slow store) calls ``advance``, from any thread, so a
deadline, a stall, a rate window, a stage's ``min_hours`` or gc's recheck interval is
tested without waiting. Each mechanism keeps one end-to-end test on the real clock
(docs/development.md names them)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone

START = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc)


class FakeClock:
    def __init__(self, start: datetime = START) -> None:
        self._start = start
        self._elapsed = 0.0
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return 1000.0 + self._elapsed  # not 0: nothing may take 0 for "never"

    def now(self) -> datetime:
        with self._lock:
            return self._start + timedelta(seconds=self._elapsed)

    def advance(self, seconds: float) -> None:
        assert seconds >= 0, "a monotonic clock never goes back"
        with self._lock:
            self._elapsed += seconds

    @property
    def elapsed(self) -> float:
        """Seconds advanced since the clock was made."""
        with self._lock:
            return self._elapsed
