"""The evidence index between full listings: devices of this release leave a notice in the
inbox beside each report (``epfleet.device.reporting.upload_report``), and a pass lists only
the recent inbox partitions; older devices (reports/devices/ alone) are counted at the full
listing every EPFLEET_EVIDENCE_FULL_LISTING_EVERY passes; readers answer from a pass made
just before (EPFLEET_EVIDENCE_FRESH_SECONDS), but a gate about to advance does not. Each
checked against a full recount, under skewed device clocks, forged notices, an older shard
or a whole older index put back, two readers racing and a reader killed mid-pass; in
memory in the fast tier, on a local directory and on S3 (moto over HTTP) end to end."""

from __future__ import annotations

import gzip
from datetime import datetime, timedelta, timezone

import pytest

from epfleet.device.reporting import upload_report
from epfleet.fleet.evidence.index import head_key, index_key, update
from epfleet.fleet.rollout.rollouts import GateReading, read_evidence, run_gate
from epfleet.formats.device_report import DeviceReport, inbox_key, report_key
from epfleet.stores import Store
from tests.support.evidence_passes import (
    Interposed,
    pass_killed_at_write,
    same_as_recount,
    shard_objects,
)
from tests.support.staged_rollout import (
    MEMBERS,
    OUTSIDE,
    put,
    real_fleet,
    report,
    settled,
    settled_at_once,  # noqa: F401 (autouse)
    staged_store,  # noqa: F401 (the fixture store)
)

pytestmark = pytest.mark.fast

EVERY = 4


@pytest.fixture(autouse=True)
def _between_full_listings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPFLEET_EVIDENCE_FULL_LISTING_EVERY", str(EVERY))


def upload(store: Store, found: DeviceReport) -> None:
    """As a device of this release uploads: the report, then its notice."""
    done = upload_report(store, found)
    assert done.report_uploaded, done.report_error


def reading(store: Store) -> GateReading:
    settled(store)
    return read_evidence(store)


def failed_new(found: GateReading) -> int:
    return found.statuses[0].evidence.new.failed


def fleet(store: Store) -> GateReading:
    """The staged fleet, its first pass (a full listing: there is no index yet)."""
    real_fleet(store, "advance")
    for device in MEMBERS[1:6]:
        put(store, report(device, True, "kept", 10.0))
    for device in OUTSIDE[5:20]:
        put(store, report(device, False, "kept", 10.0))
    first = same_as_recount(store)
    assert first.index is not None and first.index.listing == "full"
    return first


def test_between_full_listings_a_pass_reads_the_noticed_reports_and_the_rest_later(
    store: Store,
) -> None:
    first = fleet(store)
    for device in MEMBERS[1:3]:  # this release: counted by the next pass
        upload(store, report(device, True, "failed"))
    put(store, report(MEMBERS[3], True, "failed"))  # an older device: no notice
    second = reading(store)
    assert second.index is not None and second.index.listing == "inbox"
    assert second.index.listed == 0 and second.index.reports_read == 2
    assert failed_new(second) == 2
    later = until_full(store)
    assert [p.index.listing for p in later if p.index] == ["inbox"] * (EVERY - 2) + ["full"]
    assert all(failed_new(p) == 2 for p in later[:-1])
    assert failed_new(later[-1]) == 3  # the older device's report, counted there
    assert later[-1].read == first.read
    same_as_recount(store)


def until_full(store: Store) -> list[GateReading]:
    """Passes up to the next full listing (every EVERY passes)."""
    passes = [reading(store)]
    while passes[-1].index is not None and passes[-1].index.listing != "full":
        assert len(passes) < EVERY
        passes.append(reading(store))
    return passes


def test_a_device_that_uploads_under_both_releases_counts_once_its_newest_report(
    store: Store,
) -> None:
    fleet(store)
    device = MEMBERS[1]
    upload(store, report(device, True, "kept", 12.0))
    assert failed_new(reading(store)) == 0
    put(store, report(device, True, "failed"))  # downgraded: the older release's upload
    full = until_full(store)[-1]
    assert failed_new(full) == 1
    upload(store, report(device, True, "kept", 13.0))  # upgraded again
    again = same_as_recount(store)
    assert again.index is not None and again.index.listing == "inbox"
    assert failed_new(again) == 0
    assert again.read == full.read  # one vote each time


def test_a_notice_under_a_skewed_clock_is_read_now_or_at_the_full_listing(store: Store) -> None:
    fleet(store)
    now = datetime.now(timezone.utc)
    near, far = MEMBERS[1], MEMBERS[2]
    for device, clock in ((near, now - timedelta(minutes=8)), (far, now - timedelta(hours=3))):
        put(store, report(device, True, "failed"))
        store.write(inbox_key(device, clock), b"")  # filed under the device's own time
    second = reading(store)
    assert second.index is not None and second.index.listing == "inbox"
    assert failed_new(second) == 1  # within the skew allowed (EPFLEET_EVIDENCE_SKEW_SECONDS)
    assert failed_new(until_full(store)[-1]) == 2


def test_forged_notices_move_nothing(store: Store) -> None:
    first = fleet(store)
    forged_report = gzip.compress(report(MEMBERS[1], True, "failed").model_dump_json().encode())
    now = datetime.now(timezone.utc)
    for device in [*MEMBERS[1:4], *OUTSIDE[:3], "dev-nobody", "Bad Name"]:
        store.write(inbox_key(device, now), forged_report)  # a report in a notice: not read
    store.write(f"reports/inbox/{now:%Y%m%dT%H}0/../../devices/x.json".replace("..", "x"), b"")
    store.write(inbox_key(MEMBERS[1], now + timedelta(days=400)), forged_report)
    second = same_as_recount(store)
    assert second.index is not None and second.index.listing == "inbox"
    assert second.statuses == first.statuses and second.field == first.field
    assert second.index.reports_read <= 7  # each noticed device's own report, read again


def test_readers_share_a_recent_pass_but_a_gate_about_to_advance_reads_now(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert fleet(store).statuses[0].verdict.decision == "advance"
    monkeypatch.setenv("EPFLEET_EVIDENCE_FRESH_SECONDS", "3600")
    upload(store, report(MEMBERS[1], True, "failed"))
    upload(store, report(MEMBERS[2], True, "failed"))
    settled(store)
    # the recent pass would advance: the gate reads what came since, and halts
    judged, moves = run_gate(store)
    assert judged.index is not None and judged.index.listing == "inbox"
    assert judged.statuses[0].verdict.decision == "halt" and len(moves) == 1
    upload(store, report(MEMBERS[3], True, "failed"))
    shared = read_evidence(store)  # the field view, runtime-watch: the recent pass serves
    assert shared.index is not None and shared.index.listing == "none"
    assert shared.index.reports_read == 0 and failed_new(shared) == 2
    monkeypatch.setenv("EPFLEET_EVIDENCE_FRESH_SECONDS", "0")
    assert failed_new(same_as_recount(store)) == 3


def test_an_older_shard_or_a_whole_older_index_put_back_brings_a_full_listing(
    store: Store,
) -> None:
    fleet(store)
    old = {where: store.read(where) for where in shard_objects(store)}
    old[head_key(index_key())] = store.read(head_key(index_key()))
    for device in MEMBERS[1:4]:
        upload(store, report(device, True, "failed"))
    halted = same_as_recount(store)
    assert halted.statuses[0].verdict.decision == "halt"
    for where, stored in old.items():
        if where.endswith(".json.gz"):
            assert stored is not None
            store.write(where, stored.data)  # sealed, from before the failures
    replayed = same_as_recount(store)
    assert replayed.index is not None and replayed.index.listing == "full"
    assert any("older than the head" in r for r in replayed.index.rebuilt)
    assert replayed.statuses == halted.statuses
    for where, stored in old.items():  # the head too: consistent, and older
        assert stored is not None
        store.write(where, stored.data)
    again = same_as_recount(store)
    assert again.index is not None and again.index.listing == "full"
    assert any("older than one this machine read" in r for r in again.index.rebuilt)
    assert again.statuses == halted.statuses


def test_two_readers_racing_between_full_listings_lose_nothing(store: Store) -> None:
    fleet(store)
    late = MEMBERS[1:4]

    def other_reader(writes: int) -> None:
        if writes == 1:
            for device in late:
                upload(store, report(device, True, "failed"))
            settled(store)
            assert update(store, {}).listing == "inbox"

    for device in OUTSIDE[10:20]:
        upload(store, report(device, False, "failed"))
    settled(store)
    assert update(Interposed(store, other_reader), {}).listing == "inbox"  # type: ignore[arg-type]
    after = same_as_recount(store)
    assert failed_new(after) == 3
    assert after.statuses[0].evidence.previous.failed == 10


def test_a_reader_killed_between_full_listings_leaves_what_the_next_completes(
    store: Store,
) -> None:
    fleet(store)
    for device in OUTSIDE[5:20]:
        upload(store, report(device, False, "failed"))

    pass_killed_at_write(store)
    after = same_as_recount(store)
    assert after.index is not None and after.index.listing == "inbox"
    assert 0 < after.index.reports_read < 15
    assert after.statuses[0].evidence.previous.failed == 15
    assert report_key(OUTSIDE[5]) in {k for k in update(store, {}).records}
