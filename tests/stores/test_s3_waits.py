"""Every wait of an S3 request is bounded: an answer whose head (status line and headers,
or a ``100 Continue``) trickles in a byte at a time, each byte inside the socket's read
timeout, fails within the stall timeout per attempt; inside a device sync, the sync's
deadline stops any attempt in flight (a body botocore reads itself included) and starts
none after it (``epfleet.stores.s3.bounds``).

S3 is moto's server on loopback behind the fault proxy (tests/support/s3proxy.py), which sends
the heads one byte every half second: each would take minutes. The limits are small
(``EPFLEET_STALL_TIMEOUT=2``, two attempts), and the bounds asserted are generous beside
them: a loaded machine passes, a wait that the limits did not end fails.

These waits are sockets' and timers' (``epfleet.stores.watch``), so they run on the real
clock: a trickled head on ``read`` is in the fast tier, the same on the other operations
end to end in the slow tier (``END_TO_END``). The rules of the sync's deadline and of a
transfer's rate are tested without waiting on a fake clock (tests/device/test_download.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from epfleet.errors import DeadlineExceeded, StoreError, TransferTooSlow
from epfleet.fleet.publishing.publish import read_manifest, update_manifest
from epfleet.formats.manifest import Manifest
from epfleet.limits import Deadline, within
from epfleet.stores import MANIFEST_KEY, open_store
from epfleet.stores.s3 import S3Store
from tests.support.s3proxy import FaultProxy
from tests.support.tiers import END_TO_END

pytestmark = pytest.mark.fast

SLOW = 0.5  # seconds per byte of a trickled head: ~200 bytes and more, so minutes each
TRICKLED = "no complete answer within 2 s (EPFLEET_STALL_TIMEOUT; 2 attempts)"
BOUND = 30.0  # seconds: the limits' own total is ~5 s; the trickle's, minutes


@pytest.fixture
def store(s3_bucket: str, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "2")  # a busy moto may take a second
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    found = open_store(f"s3://{s3_bucket}/p")
    assert isinstance(found, S3Store)
    found.write("doc.json", b'{"a": 1}')
    return found


def timed(call: Callable[[], object]) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(StoreError) as error:
        call()
    return error.value, time.monotonic() - started


OPERATIONS: dict[str, tuple[str, str, Callable[[S3Store], object]]] = {
    # name: (method, proxy path under the bucket, the call)
    "read": ("GET", "/p/doc.json", lambda s: s.read("doc.json")),
    "read_range": ("GET", "/p/doc.json", lambda s: next(iter(s.read_range("doc.json", 0)))),
    "size": ("HEAD", "/p/doc.json", lambda s: s.size("doc.json")),
    "write": ("PUT", "/p/doc.json", lambda s: s.write("doc.json", b'{"a": 2}')),
    "list_keys": ("GET", "", lambda s: s.list_keys("")),
}


@pytest.mark.parametrize(
    "operation",
    [op if op == "read" else pytest.param(op, marks=END_TO_END) for op in sorted(OPERATIONS)],
)
def test_an_answer_whose_head_trickles_fails_within_the_stall_timeout_per_attempt(
    store: S3Store, s3_bucket: str, s3_proxy: FaultProxy, operation: str
) -> None:
    method, path, call = OPERATIONS[operation]
    s3_proxy.trickle_next_response_heads(f"/{s3_bucket}{path}", method=method, interval=SLOW, n=2)

    error, seconds = timed(lambda: call(store))

    assert isinstance(error, TransferTooSlow)
    assert TRICKLED in str(error)
    assert f"s3://{s3_bucket}/p/{'doc.json' if path else ''}" in str(error), error
    assert seconds < BOUND
    call(store)  # the trickles are spent: the next attempt is answered as usual


def test_a_100_continue_that_trickles_fails_within_the_stall_timeout_per_attempt(
    store: S3Store, s3_bucket: str, s3_proxy: FaultProxy
) -> None:
    puts = len(s3_proxy.seen("/p/doc.json", "PUT"))
    s3_proxy.trickle_next_continues(f"/{s3_bucket}/p/doc.json", interval=SLOW, n=2)

    error, seconds = timed(lambda: store.write("doc.json", b'{"a": 3}'))

    assert isinstance(error, TransferTooSlow) and "writing" in str(error), error
    assert seconds < BOUND
    found = store.read("doc.json")  # the store still answers; the body was never sent
    assert found is not None and found.data == b'{"a": 1}'
    assert len(s3_proxy.seen("/p/doc.json", "PUT")) == puts  # no trickled PUT went through


def test_a_body_slower_than_the_stall_timeout_as_a_whole_still_arrives(
    store: S3Store, s3_bucket: str, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head's bound ends with the head: a streamed body is timed per byte (and by its
    rate), as before."""
    monkeypatch.setenv("EPFLEET_MIN_RATE", "0")
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "2")  # each byte well within it, under load
    patient = open_store(f"s3://{s3_bucket}/p")
    s3_proxy.trickle_next_get_responses(f"/{s3_bucket}/p/doc.json", interval=0.4)
    started = time.monotonic()
    assert b"".join(patient.read_range("doc.json", 0)) == b'{"a": 1}'
    assert time.monotonic() - started > 2.5  # 8 bytes, one every 0.4 s: past a stall timeout


def test_the_sync_deadline_stops_an_attempt_in_flight_and_starts_none_after_it(
    store: S3Store, s3_bucket: str, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "60")  # only the deadline can end it
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "5")
    slow = open_store(f"s3://{s3_bucket}/p")
    s3_proxy.trickle_next_response_heads(f"/{s3_bucket}/p/doc.json", interval=SLOW, n=5)
    deadline = Deadline.after(2)

    with within(deadline):
        error, seconds = timed(lambda: slow.read("doc.json"))

        assert isinstance(error, DeadlineExceeded)
        assert str(error) == (
            "the sync ran past its deadline of 2 s (EPFLEET_SYNC_DEADLINE): reading "
            f"s3://{s3_bucket}/p/doc.json stopped"
        )
        assert seconds < BOUND  # the stall timeout (60 s) would have come 5 times
        asked = sum(s3_proxy.counts.values())
        for call in (lambda: slow.size("doc.json"), lambda: slow.list_keys("")):
            with pytest.raises(DeadlineExceeded, match=r"checking|listing"):
                call()
        assert sum(s3_proxy.counts.values()) == asked  # nothing was sent past the deadline


def test_the_sync_deadline_stops_a_body_botocore_reads_itself(
    store: S3Store, s3_bucket: str, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing's XML, an error's: read whole inside botocore, per socket read, so that
    only the deadline ends one that trickles (outside a sync, S3's own keep-alive spaces
    in a long copy's answer rule out a total)."""
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "60")
    slow = open_store(f"s3://{s3_bucket}/p")
    s3_proxy.trickle_next_get_responses(f"/{s3_bucket}", interval=SLOW, after=10)

    with within(Deadline.after(2)):
        error, seconds = timed(lambda: slow.list_keys(""))

    assert isinstance(error, DeadlineExceeded) and "listing" in str(error), error
    assert seconds < BOUND


def test_the_sync_deadline_stops_a_missing_objects_trickled_404(
    store: S3Store, s3_bucket: str, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next-root probe every signed sync makes is a GET answered 404: botocore read the
    error's body itself, after the attempt's timers had stopped (17 s past a 1 s
    deadline for these ~340 bytes at a byte every 50 ms; a byte a minute, hours)."""
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "60")
    slow = open_store(f"s3://{s3_bucket}/p")
    s3_proxy.trickle_next_get_responses(f"/{s3_bucket}/p/2.root.json", interval=0.05)

    with within(Deadline.after(1)):
        error, seconds = timed(lambda: slow.read("2.root.json"))

    assert isinstance(error, DeadlineExceeded), error
    assert str(error).endswith(f"reading s3://{s3_bucket}/p/2.root.json stopped")
    assert seconds < 5  # 1.0 s here
    assert slow.read("2.root.json") is None  # read whole when it comes at once


def test_publishing_the_manifest_to_a_store_whose_answers_trickle_ends_with_the_reason(
    store: S3Store, s3_bucket: str, s3_proxy: FaultProxy
) -> None:
    manifest = f"/{s3_bucket}/p/{MANIFEST_KEY}"
    s3_proxy.trickle_next_response_heads(manifest, method="GET", interval=SLOW, n=2)
    error, seconds = timed(lambda: read_manifest(store))
    assert isinstance(error, TransferTooSlow), error
    assert f"reading s3://{s3_bucket}/p/{MANIFEST_KEY}: {TRICKLED}" in str(error), error
    assert seconds < BOUND

    s3_proxy.trickle_next_response_heads(manifest, method="PUT", interval=SLOW, n=2)
    error, seconds = timed(lambda: update_manifest(store, lambda current: Manifest()))
    assert isinstance(error, TransferTooSlow), error
    assert f"writing s3://{s3_bucket}/p/{MANIFEST_KEY}: {TRICKLED}" in str(error), error
    assert seconds < BOUND


def test_the_timers_of_finished_requests_end(store: S3Store) -> None:
    before = threading.active_count()
    for _ in range(20):
        store.read("doc.json")
        store.size("doc.json")
    for _ in range(50):  # a cancelled timer's thread ends as soon as it is scheduled
        if threading.active_count() <= before:
            break
        time.sleep(0.1)
    assert threading.active_count() <= before
