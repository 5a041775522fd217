"""A transfer's limits (``epfleet.limits.TransferGuard``) on a fake clock
(tests/support/fake_clock.py): a stall, a rate below the minimum over its window, the
sync's deadline, each at the second it comes and not before. The same limits on the real
clock, end to end: tests/device/test_deadlines.py (a store that stalls, one that
trickles, a sync past its deadline) and tests/stores/test_s3_waits.py (S3's sockets)."""

from __future__ import annotations

import pytest

from epfleet.errors import DeadlineExceeded, TransferTooSlow
from epfleet.limits import Deadline, TransferGuard, TransferLimits
from tests.support.fake_clock import FakeClock

pytestmark = pytest.mark.fast


def guard(clock: FakeClock, stall: float = 30, rate: int = 0, window: float = 10) -> TransferGuard:
    limits = TransferLimits(stall_timeout=stall, min_rate=rate, rate_window=window)
    return TransferGuard("download of m", "s3://b/p", limits, clock=clock)


def test_a_transfer_stalls_once_nothing_moved_for_the_stall_timeout() -> None:
    clock = FakeClock()
    watched = guard(clock)
    clock.advance(29.9)
    watched.check()
    watched.add(1)  # progress: the stall counts again from here
    clock.advance(29.9)
    watched.check()
    clock.advance(0.1)
    with pytest.raises(TransferTooSlow) as stalled:
        watched.check()
    assert str(stalled.value) == (
        "s3://b/p moved nothing for 30 s (EPFLEET_STALL_TIMEOUT): download of m aborted"
    )
    with pytest.raises(TransferTooSlow) as again:
        watched.add(100)  # tripped: a retry of the transfer stops at once
    assert again.value is stalled.value


def test_a_transfer_below_the_minimum_rate_over_its_window_is_aborted() -> None:
    clock = FakeClock()
    watched = guard(clock, rate=1000, window=10)
    watched.add(500)  # the first window is not judged before it has passed
    for _ in range(10):
        clock.advance(1)
        watched.add(1000)  # 10,000 bytes in the last 10 s: exactly the minimum
    clock.advance(1)
    with pytest.raises(TransferTooSlow) as slow:
        watched.add(500)  # the last 10 s: 9,500 bytes
    assert str(slow.value) == (
        "s3://b/p moved 9.3 KiB in 10 s, below the minimum rate of 1000 B/s "
        "(EPFLEET_MIN_RATE over EPFLEET_RATE_WINDOW): download of m aborted"
    )


def test_the_syncs_deadline_stops_a_transfer_when_it_passes() -> None:
    clock = FakeClock()
    deadline = Deadline.after(5, clock)
    watched = TransferGuard("download of m", "s3://b/p", TransferLimits(30, 0, 10), deadline, clock)
    clock.advance(4.9)
    watched.add(1)
    assert deadline.remaining() == pytest.approx(0.1)
    clock.advance(0.1)
    with pytest.raises(DeadlineExceeded, match=r"deadline of 5 s .*: download of m \(s3://b/p\)"):
        watched.add(1)
