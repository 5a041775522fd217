"""Resumable segmented downloads (epfleet.device.download) against a real local store, with a
wrapper that cuts the byte streams: the only double here stands in for a network that
drops connections, which nothing on loopback does on demand.

The limits (a minimum rate, the sync's deadline) are tested on a fake clock
(tests/support/fake_clock.py) that the slow store advances with each chunk, so no test
here waits for one; tests/device/test_deadlines.py checks the same limits on the real
clock, end to end (a store that trickles, one that stalls, a sync past its deadline)."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from epfleet.device.download import Transfer
from epfleet.errors import (
    DeadlineExceeded,
    IntegrityError,
    StoreError,
    TransferTooSlow,
    TransientStoreError,
)
from epfleet.hashing import sha256_bytes
from epfleet.limits import Deadline, within
from epfleet.stores.local import LocalStore
from tests.support.fake_clock import FakeClock

pytestmark = pytest.mark.fast

SIZE = 10_000  # with SEGMENT at 1,000: four segments of 2,500 bytes


class Cutting:
    """A store whose ranged reads stop with a transient error after ``budget`` bytes, and
    take ``slow`` seconds for each 100 bytes: on ``clock`` when given (it advances), else
    really."""

    def __init__(
        self, store: LocalStore, budget: int, slow: float = 0.0, clock: FakeClock | None = None
    ) -> None:
        self.store, self.budget, self.slow, self.clock = store, budget, slow, clock
        self.uri = store.uri

    def read_range(self, key: str, start: int, end: int | None = None) -> Iterator[bytes]:
        sent = 0
        for chunk in self.store.read_range(key, start, end):
            for i in range(0, len(chunk), 100):
                if sent >= self.budget:
                    raise TransientStoreError("connection dropped")
                if self.clock is not None:
                    self.clock.advance(self.slow)
                else:
                    time.sleep(self.slow)
                sent += len(chunk[i : i + 100])
                yield chunk[i : i + 100]


@pytest.fixture
def blob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[LocalStore, bytes]:
    monkeypatch.setattr("epfleet.device.download.SEGMENT", 1000)
    store = LocalStore(tmp_path / "store")
    data = os.urandom(SIZE)
    store.write("blob", data)
    return store, data


def transfer(store: object, data: bytes, part: Path, clock: FakeClock | None = None) -> Transfer:
    digest = sha256_bytes(data)
    if clock is None:
        return Transfer(store, "blob", digest, len(data), part)  # type: ignore[arg-type]
    return Transfer(store, "blob", digest, len(data), part, clock)  # type: ignore[arg-type]


def test_segments_resume_where_each_stopped(blob: tuple[LocalStore, bytes], tmp_path: Path) -> None:
    store, data = blob
    part = tmp_path / "blob.part"
    first = transfer(Cutting(store, budget=600), data, part)
    assert len(first.segments) == 4
    with pytest.raises(TransientStoreError):
        first.run()  # three attempts, 600 bytes per segment each
    assert first.moved == 4 * 1800
    record = json.loads(part.with_name("blob.part.progress").read_text())
    assert record["done"] == [1800] * 4

    second = transfer(store, data, part)
    assert second.run() == SIZE - 4 * 1800  # only the missing bytes move
    assert part.read_bytes() == data
    assert not part.with_name("blob.part.progress").exists()


def test_a_record_that_does_not_fit_discards_the_partial_file(
    blob: tuple[LocalStore, bytes], tmp_path: Path
) -> None:
    store, data = blob
    part = tmp_path / "blob.part"
    part.write_bytes(b"\0" * 5000)
    part.with_name("blob.part.progress").write_text(
        json.dumps({"size": SIZE, "segment": 999, "done": [999] * 5})
    )
    assert transfer(store, data, part).run() == SIZE
    assert part.read_bytes() == data


def test_resumed_bytes_that_do_not_verify_are_fetched_again(
    blob: tuple[LocalStore, bytes], tmp_path: Path
) -> None:
    store, data = blob
    part = tmp_path / "blob.part"
    part.write_bytes(b"\0" * 5000)
    part.with_name("blob.part.progress").write_text(
        json.dumps({"size": SIZE, "segment": 2500, "done": [2500, 2500, 0, 0]})
    )
    moved = transfer(store, data, part).run()
    assert moved == 5000 + SIZE  # the rest, then everything once more
    assert part.read_bytes() == data


def test_wrong_bytes_are_never_kept(blob: tuple[LocalStore, bytes], tmp_path: Path) -> None:
    store, _ = blob
    part = tmp_path / "blob.part"
    wrong = Transfer(store, "blob", sha256_bytes(b"other"), SIZE, part)
    with pytest.raises(IntegrityError, match="not activated"):
        wrong.run()
    assert not part.exists()


def test_an_empty_object(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.write("empty", b"")
    part = tmp_path / "empty.part"
    got = Transfer(store, "empty", sha256_bytes(b""), 0, part)
    assert got.run() == 0 and part.read_bytes() == b""


class Failing(Cutting):
    """One segment fails for good at once; the others are slow."""

    def read_range(self, key: str, start: int, end: int | None = None) -> Iterator[bytes]:
        if start == 0:
            raise StoreError("access denied")
        yield from super().read_range(key, start, end)


def test_a_hard_error_stops_the_other_segments(
    blob: tuple[LocalStore, bytes], tmp_path: Path
) -> None:
    store, data = blob
    part = tmp_path / "blob.part"
    slow = Failing(store, budget=SIZE, slow=0.05)  # 25 chunks a segment: 1.25 s if unstopped
    started = time.monotonic()
    with pytest.raises(StoreError, match="access denied"):
        transfer(slow, data, part).run()
    assert time.monotonic() - started < 0.8
    record = json.loads(part.with_name("blob.part.progress").read_text())
    assert record["done"][0] == 0 and sum(record["done"]) < 3 * 2500


def test_long_downloads_report_progress(
    blob: tuple[LocalStore, bytes],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("epfleet.device.download.PROGRESS_EVERY", 500)
    monkeypatch.setattr("epfleet.device.download.REPORT_EVERY", 0.0)
    store, data = blob
    digest = sha256_bytes(data)
    with caplog.at_level(logging.INFO, logger="epfleet.device.download"):
        Transfer(store, "blob", digest, SIZE, tmp_path / "blob.part").run()
    lines = [r.getMessage() for r in caplog.records if r.name == "epfleet.device.download"]
    assert lines and all(line.startswith("blob: ") and "% (" in line for line in lines)


# --- deadlines ----------------------------------------------------------------------------


def test_a_store_that_trickles_is_aborted_and_not_resumed_in_the_same_sync(
    blob: tuple[LocalStore, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPFLEET_MIN_RATE", "10KiB")  # 100 bytes per 0.1 s: 1 KB/s in all
    monkeypatch.setenv("EPFLEET_RATE_WINDOW", "0.5")
    store, data = blob
    part = tmp_path / "blob.part"
    clock = FakeClock()
    slow = transfer(Cutting(store, budget=SIZE, slow=0.1, clock=clock), data, part, clock)
    with pytest.raises(TransferTooSlow, match=r"below the minimum rate of 10 KiB/s") as info:
        slow.run()  # 10 s on its clock if let be
    assert 0.5 <= clock.elapsed < 1.0  # one window, no second round
    assert str(info.value).endswith("download of blob aborted")
    assert 0 < slow.moved < SIZE
    record = json.loads(part.with_name("blob.part.progress").read_text())
    assert sum(record["done"]) == slow.moved  # kept for the next sync, which resumes
    assert transfer(store, data, part).run() == SIZE - slow.moved
    assert part.read_bytes() == data


def test_a_steady_store_is_not_aborted_by_the_rate_check(
    blob: tuple[LocalStore, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPFLEET_MIN_RATE", "900")  # bytes a second, under its 1 KB/s
    monkeypatch.setenv("EPFLEET_RATE_WINDOW", "0.5")
    store, data = blob
    clock = FakeClock()
    steady = transfer(
        Cutting(store, budget=SIZE, slow=0.1, clock=clock), data, tmp_path / "p", clock
    )
    assert steady.run() == SIZE
    assert clock.elapsed == pytest.approx(10.0)  # 20 windows, each checked


def test_the_sync_deadline_stops_a_download_in_flight(
    blob: tuple[LocalStore, bytes], tmp_path: Path
) -> None:
    store, data = blob
    part = tmp_path / "blob.part"
    clock = FakeClock()
    slow = transfer(Cutting(store, budget=SIZE, slow=0.1, clock=clock), data, part, clock)
    with within(Deadline.after(0.4, clock)), pytest.raises(DeadlineExceeded) as info:
        slow.run()  # 10 s on its clock if let be
    assert 0.4 <= clock.elapsed < 1.0
    assert str(info.value) == (
        "the sync ran past its deadline of 0.4 s (EPFLEET_SYNC_DEADLINE): "
        f"download of blob ({store.uri}) stopped"
    )
    with within(Deadline.after(0, clock)), pytest.raises(DeadlineExceeded, match="not started"):
        transfer(store, data, part, clock).run()
    assert transfer(store, data, part).run() == SIZE - slow.moved
