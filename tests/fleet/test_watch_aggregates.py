"""Runtime-watch's findings merged from the evidence index's shard aggregates against
``find_unserved`` over every report read: the same profiles, counts and reasons, devices
named in id order (the first ``MAX_LISTED_DEVICES``), quiet reports counted on the
reader's clock, and a pass computing only the reports that changed."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from epfleet.fleet.evidence.aggregate_rules import merged, seal, unseal
from epfleet.fleet.evidence.aggregates import ShardAggregates
from epfleet.fleet.evidence.fleet_reports import full_device_reports, index_pass
from epfleet.fleet.evidence.index import index_key, reading_from
from epfleet.fleet.evidence.index_rules import shard_of
from epfleet.fleet.rollout.rollouts import read_evidence
from epfleet.fleet.watch.aggregate_rules import (
    EPOCH,
    WatchContext,
    WatchReading,
    context_digest,
    contribution,
    unserved_of,
)
from epfleet.fleet.watch.rules import MAX_LISTED_DEVICES, check_pairs, find_unserved
from epfleet.fleet.watch.shared_aggregates import context_key, keep_context, stored_context
from epfleet.formats.device_report import DeviceReport, encode_report, report_key
from epfleet.stores import Store, open_store
from epfleet.stores.memory import forget
from tests.support.fake_clock import FakeClock
from tests.support.staged_rollout import settled_at_once  # noqa: F401 (autouse)
from tests.support.watch_fleet import CPU, NOW, QNN, RUNTIME, SPEC, current_fleet, watch_report

pytestmark = pytest.mark.fast
MAX_AGE = timedelta(days=30)
CHECKS = check_pairs(SPEC, current_fleet(), RUNTIME)
OPENVINO = [("OpenVINOExecutionProvider", "npu", 0x8086), (CPU, "cpu", 0x8086)]
SNAPDRAGON = [(QNN, "npu", 0x5143), (CPU, "cpu", 0x51)]
UNSERVED_DEVICES = {f"ov-{i:03d}" for i in range(130)} | {f"old-{i}" for i in range(4)} | {"sd-0"}


@pytest.fixture(name="store")
def memory_store(tmp_path: Path) -> Iterator[Store]:
    yield open_store(f"memory://{tmp_path.name}")
    forget(tmp_path.name)


def report(device: str, hardware: list, action: str, age: timedelta) -> DeviceReport:
    return watch_report(device, hardware, {"det": action, "cls": action}, age)


def fleet(store: Store) -> None:
    for i in range(130):  # more than an unserved profile names
        found = report(f"ov-{i:03d}", OPENVINO, "fallback", timedelta(hours=1 + i % 5))
        store.write(report_key(found.device_id), encode_report(found))
    for i in range(6):
        found = report(f"sd-{i}", SNAPDRAGON, "kept", timedelta(hours=2))
        store.write(report_key(found.device_id), encode_report(found))
    for i in range(4):  # near the end of the window
        found = report(f"old-{i}", OPENVINO, "fallback", MAX_AGE - timedelta(minutes=30))
        store.write(report_key(found.device_id), encode_report(found))
    store.write(report_key("junk"), b"{not json")


def aggregated(store: Store, now_hours: float = 0.0) -> tuple[WatchReading, ShardAggregates]:
    context = WatchContext(SPEC, CHECKS, RUNTIME, MAX_AGE)
    now = NOW + timedelta(hours=now_hours)
    aggregates = ShardAggregates(
        store,
        index_key(),
        "watch",
        context_digest(context),
        lambda key, record: contribution(reading_from(key, record), context),
        (now - EPOCH) // timedelta(microseconds=1),
    )
    index_pass(store, {}, each_shard=aggregates)
    return unserved_of(merged(aggregates.folded.values())), aggregates


def recount(store: Store, now_hours: float = 0.0) -> tuple[list, int, int]:
    reports = [r for r in full_device_reports(store) if isinstance(r, DeviceReport)]
    now = NOW + timedelta(hours=now_hours)
    unserved, quiet = find_unserved(reports, SPEC, CHECKS, RUNTIME, now, MAX_AGE)
    return unserved, quiet, len(reports)


def same(found: WatchReading, full: tuple[list, int, int]) -> None:
    unserved, quiet, read = full
    assert (found.quiet, found.read) == (quiet, read)
    assert sorted(p.profile_id for p in found.unserved) == sorted(p.profile_id for p in unserved)
    theirs = {p.profile_id: p for p in unserved}
    for mine in found.unserved:
        other = theirs[mine.profile_id]
        assert mine.device_count == other.device_count
        assert (mine.label, mine.eps, mine.models, mine.targets) == (
            other.label,
            other.eps,
            other.models,
            sorted(other.targets),
        )
        assert len(mine.devices) == min(mine.device_count, MAX_LISTED_DEVICES)
        assert mine.devices == sorted(mine.devices)[:MAX_LISTED_DEVICES]
        assert set(mine.devices) <= UNSERVED_DEVICES


def test_the_watch_merged_from_aggregates_finds_what_a_full_read_finds(store: Store) -> None:
    fleet(store)
    found, aggregates = aggregated(store)
    same(found, recount(store))
    assert aggregates.computed == 141
    [profile] = found.unserved
    assert profile.device_count == 134 and profile.devices[0] == "old-0"
    assert len(found.problems) == 1 and "junk" in found.problems[0]
    again, second = aggregated(store)
    assert again == found and second.computed == 0
    changed = report("sd-0", SNAPDRAGON, "recompiled", timedelta(hours=1))
    store.write(report_key("sd-0"), encode_report(changed))
    after, third = aggregated(store)
    same(after, recount(store))
    assert third.computed == 1


def test_reports_leave_the_window_on_the_readers_clock(store: Store) -> None:
    fleet(store)
    aggregated(store)
    later, aggregates = aggregated(store, now_hours=1)
    assert later.quiet == 4 and aggregates.computed == 0
    same(later, recount(store, now_hours=1))


def test_a_sum_holds_for_a_reader_whose_clock_is_behind_the_folders(store: Store) -> None:
    fleet(store)
    aggregated(store)
    behind, aggregates = aggregated(store, now_hours=-0.5)  # no window opens or closes between
    assert aggregates.computed == 0 and aggregates.written == 0
    same(behind, recount(store, now_hours=-0.5))


def watch_context() -> WatchContext:
    return WatchContext(SPEC, CHECKS, RUNTIME, MAX_AGE)


def test_the_pass_that_folds_new_reports_keeps_the_watchs_aggregates(store: Store) -> None:
    fleet(store)
    aggregated(store)
    keep_context(store, index_key(), watch_context())
    assert stored_context(store, index_key()) == watch_context()
    changed = report("sd-0", SNAPDRAGON, "recompiled", timedelta(hours=1))
    store.write(report_key("sd-0"), encode_report(changed))
    gate = read_evidence(store, clock=FakeClock(NOW), fresh=0.0)
    assert gate.index is not None and gate.index.reports_read == 1
    found, aggregates = aggregated(store)  # runtime-watch's pass, sharing the gate's
    assert aggregates.computed == 0 and aggregates.written == 0
    same(found, recount(store))


@pytest.mark.parametrize("forgery", ["resealed", "garbage", "another spec"])
def test_a_forged_watch_context_moves_no_finding(store: Store, forgery: str) -> None:
    fleet(store)
    aggregated(store)
    key = index_key()
    keep_context(store, key, watch_context())
    if forgery == "another spec":  # sealed under the key: read, but judged under its digest
        keep_context(store, key, WatchContext(SPEC, [], RUNTIME, timedelta(days=1)))
    else:
        stored = store.read(context_key(key))
        assert stored is not None
        body = unseal("watch context", -1, gzip.decompress(stored.data), key)
        body["max_age"] = 1.0
        forged = seal("watch context", -1, body, b"f" * 64)
        store.write(context_key(key), gzip.compress(forged) if forgery == "resealed" else b"x")
        assert stored_context(store, key) is None
    changed = report("sd-0", SNAPDRAGON, "recompiled", timedelta(hours=1))
    store.write(report_key("sd-0"), encode_report(changed))
    read_evidence(store, clock=FakeClock(NOW), fresh=0.0)
    found, aggregates = aggregated(store)
    # runtime-watch folds the new report itself; under another context, the gate's pass
    # folded the new report's shard under that one: runtime-watch folds that shard again
    keys = {report_key(d) for d in [*UNSERVED_DEVICES, *(f"sd-{i}" for i in range(6)), "junk"]}
    beside = sum(1 for k in keys if shard_of(k) == shard_of(report_key("sd-0")))
    assert aggregates.computed == (beside if forgery == "another spec" else 1)
    same(found, recount(store))


class CountedReads:
    """A store that counts the objects a reader reads (each one GET on S3)."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.gets = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self, key: str) -> Any:
        self.gets += 1
        return self.inner.read(key)

    def read_if_changed(self, key: str, etag: str) -> Any:
        self.gets += 1
        return self.inner.read_if_changed(key, etag)


def test_the_pass_that_folds_both_kinds_reads_one_aggregate_a_kind_per_shard_it_changes(
    store: Store,
) -> None:
    devices, new = 600, 30
    for i in range(devices):
        found = report(f"dev-{i:04d}", OPENVINO, "fallback", timedelta(hours=1 + i % 5))
        store.write(report_key(found.device_id), encode_report(found))
    aggregated(store)
    keep_context(store, index_key(), watch_context())
    read_evidence(store, clock=FakeClock(NOW), fresh=0.0)
    quiet = CountedReads(store)
    read_evidence(quiet, clock=FakeClock(NOW), fresh=0.0)  # type: ignore[arg-type]
    for i in range(new):
        found = report(f"dev-{i:04d}", OPENVINO, "kept", timedelta(minutes=30))
        store.write(report_key(found.device_id), encode_report(found))
    changed = len({shard_of(report_key(f"dev-{i:04d}")) for i in range(new)})
    folding = CountedReads(store)
    gate = read_evidence(folding, clock=FakeClock(NOW), fresh=0.0)  # type: ignore[arg-type]
    assert gate.index is not None and gate.index.reports_read == new
    assert folding.gets <= 0.05 * devices + 1000
    # beyond a pass with nothing new: each new report, and for each shard the pass changed
    # the parts of both kinds, and no sum (none was folded of the shard it just wrote)
    assert folding.gets - quiet.gets <= new + changed
    _, aggregates = aggregated(store)  # runtime-watch's pass, sharing the gate's
    assert aggregates.computed == 0 and aggregates.written == 0
