"""Deadlines and size limits for everything that waits on a store or a worker.

Three kinds of limit, all set through ``epfleet.settings`` (``EPFLEET_*``):

- **Transfers** (downloads, uploads, document reads): a stall timeout (no byte for
  ``EPFLEET_STALL_TIMEOUT`` seconds) and a minimum rate (``EPFLEET_MIN_RATE`` bytes per
  second averaged over ``EPFLEET_RATE_WINDOW`` seconds). A ``TransferGuard`` counts one
  transfer's bytes and raises ``TransferTooSlow`` when the rate is too low; a stall
  shows as a socket timeout (the S3 client's read timeout is the stall timeout), which
  the store turns into the same error with ``stalled``. Before a body, the head of an
  answer must arrive whole within the stall timeout (``epfleet.stores.s3.bounds``).
- **Documents** read whole from a store (``manifest.json``, device reports, hand-over
  files): ``EPFLEET_MAX_MANIFEST_BYTES`` for the manifest, ``EPFLEET_MAX_DOCUMENT_BYTES``
  for the rest, enforced while streaming (``epfleet.errors.DocumentTooLarge``).
- **A device sync** as a whole: ``EPFLEET_SYNC_DEADLINE``. The sync session runs each
  of its steps ``within`` it (downloads check it with every chunk, each S3 request is
  stopped when it passes and none starts after it: ``epfleet.stores.s3.bounds``, worker
  calls get at most what is left: ``time_limit``), and reports the models it did not
  reach as failed.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from epfleet.clock import SYSTEM_CLOCK, Clock
from epfleet.errors import DeadlineExceeded, TransferTooSlow, TransientStoreError


def format_size(size: float) -> str:
    """1024 -> '1 KiB', 12 -> '12 B', 268435456 -> '256 MiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return (
                f"{size:.0f} {unit}" if unit == "B" or size == int(size) else f"{size:.1f} {unit}"
            )
        size /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class TransferLimits:
    stall_timeout: float
    """Seconds without a byte before a transfer is aborted."""
    min_rate: int
    """Bytes per second a transfer must average over ``rate_window``; 0: no check."""
    rate_window: float

    @classmethod
    def from_settings(cls) -> TransferLimits:
        from epfleet.settings import settings  # not at import: settings imports the stores

        s = settings()
        return cls(s.stall_timeout, int(s.min_rate), s.rate_window)


# --- the sync's deadline ------------------------------------------------------------------


@dataclass(frozen=True)
class Deadline:
    at: float
    """``clock.monotonic()`` by which the sync ends."""
    seconds: float
    """The deadline as configured, for messages."""
    clock: Clock = field(default=SYSTEM_CLOCK, compare=False, repr=False)

    @classmethod
    def after(cls, seconds: float, clock: Clock = SYSTEM_CLOCK) -> Deadline:
        return cls(clock.monotonic() + seconds, seconds, clock)

    def remaining(self) -> float:
        return self.at - self.clock.monotonic()

    def passed(self) -> bool:
        return self.remaining() <= 0

    def describe(self) -> str:
        return f"the sync ran past its deadline of {self.seconds:g} s (EPFLEET_SYNC_DEADLINE)"

    def exceeded(self, what: str) -> DeadlineExceeded:
        return DeadlineExceeded(f"{self.describe()}: {what}")


_deadline: ContextVar[Deadline | None] = ContextVar("epfleet_sync_deadline", default=None)


def current_deadline() -> Deadline | None:
    """The deadline of the sync this code runs in (its context), if any."""
    return _deadline.get()


@contextmanager
def within(deadline: Deadline) -> Iterator[Deadline]:
    """Run the block under ``deadline``: downloads and worker calls in it (and in threads
    started with a copy of its context) end by then. The sync session enters it around
    each of its steps, in whichever thread runs the step."""
    token = _deadline.set(deadline)
    try:
        yield deadline
    finally:
        _deadline.reset(token)


def time_limit(limit: float, what: str) -> tuple[float, Deadline | None]:
    """How long ``what`` (a call into a worker) may take: ``limit`` seconds, or less when
    the sync's deadline comes first, and then with that deadline. DeadlineExceeded when
    it has already passed: nothing is started."""
    deadline = current_deadline()
    if deadline is None or deadline.remaining() >= limit:
        return limit, None
    if deadline.passed():
        raise deadline.exceeded(f"{what} not started")
    return deadline.remaining(), deadline


# --- one transfer's progress ---------------------------------------------------------------


class TransferGuard:
    """Times one transfer (from any number of threads: a download's segments). ``add``
    counts bytes as they move; it, and ``check`` (a watchdog's poll), abort the transfer
    with ``TransferTooSlow`` when nothing moved for ``stall_timeout`` seconds (``check``
    only: ``add`` is progress), or when, after its first ``rate_window`` seconds, the
    bytes of the last ``rate_window`` seconds average less than ``min_rate`` per second;
    and with ``DeadlineExceeded`` once the sync's deadline passes. Once tripped, every
    later call raises the same error, so that retries of the transfer (botocore
    re-reading an upload's body) stop at once. ``clock`` times the stall and the rate
    (the deadline has its own)."""

    def __init__(
        self,
        what: str,
        where: str,
        limits: TransferLimits | None = None,
        deadline: Deadline | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.what, self.where, self.clock = what, where, clock
        self.limits = limits or TransferLimits.from_settings()
        self.deadline = deadline if deadline is not None else current_deadline()
        self.moved = 0
        self.failure: TransientStoreError | None = None
        self._lock = threading.Lock()
        self._started = self._last = clock.monotonic()
        self._samples: deque[tuple[float, int]] = deque([(self._started, 0)])

    def add(self, n: int) -> None:
        """Count ``n`` bytes moved (a negative ``n``, an upload's retry rewinding, is not
        progress) and check the limits."""
        now = self.clock.monotonic()
        with self._lock:
            if self.failure is not None:
                raise self.failure
            if n > 0:
                self.moved += n
                self._last = now
                self._samples.append((now, self.moved))
            self._check(now)

    def check(self) -> None:
        """Check the limits without progress: for a watchdog while the transfer blocks."""
        now = self.clock.monotonic()
        with self._lock:
            if self.failure is not None:
                raise self.failure
            if now - self._last >= self.limits.stall_timeout:
                self.failure = stalled(self.where, self.what, self.limits.stall_timeout)
                raise self.failure
            self._check(now)

    def cancel(self, error: TransientStoreError) -> None:
        """Trip the guard from outside (the caller gave up): the transfer stops at its
        next ``add``."""
        with self._lock:
            if self.failure is None:
                self.failure = error

    def stalled(self) -> TransientStoreError:
        """The error for a transfer whose socket went ``stall_timeout`` without a byte."""
        self.cancel(stalled(self.where, self.what, self.limits.stall_timeout))
        assert self.failure is not None
        return self.failure

    def _check(self, now: float) -> None:
        if self.deadline is not None and self.deadline.passed():
            self.failure = self.deadline.exceeded(f"{self.what} ({self.where}) stopped")
            raise self.failure
        limits = self.limits
        if not limits.min_rate or now - self._started < limits.rate_window:
            return
        start = now - limits.rate_window
        while len(self._samples) > 1 and self._samples[1][0] <= start:
            self._samples.popleft()
        moved = self.moved - self._samples[0][1]
        if moved < limits.min_rate * limits.rate_window:
            self.failure = TransferTooSlow(
                f"{self.where} moved {format_size(moved)} in {limits.rate_window:g} s, below "
                f"the minimum rate of {format_size(limits.min_rate)}/s (EPFLEET_MIN_RATE over "
                f"EPFLEET_RATE_WINDOW): {self.what} aborted"
            )
            raise self.failure


def stalled(where: str, what: str, seconds: float) -> TransferTooSlow:
    return TransferTooSlow(
        f"{where} moved nothing for {seconds:g} s (EPFLEET_STALL_TIMEOUT): {what} aborted"
    )
