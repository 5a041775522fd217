"""The evidence index's per-shard aggregates against a full recount of the reports: the gate,
the field view and the rankings merge the shards' aggregates instead of restoring every
record, and answer as a recount does (latencies read from the sketch within its stated
error); a pass computes contributions only for records that changed, or for all when what
they are judged against changed; forged, damaged and older aggregates put back cost
computing, never a vote; the ranking's age window is applied on the reader's clock. The
staged store and its reports are the forged-report tests'."""

from __future__ import annotations

import gzip
import json
import random
import statistics
from datetime import datetime, timedelta, timezone

import pytest

from epfleet.fleet.evidence.aggregate_rules import (
    Contribution,
    Window,
    add_count,
    add_sample,
    fold,
    merged,
    path,
    seal,
    unseal,
)
from epfleet.fleet.evidence.field_rules import percentile
from epfleet.fleet.evidence.index import INDEX_PREFIX, index_key
from epfleet.fleet.evidence.sketch_rules import (
    RELATIVE_ERROR,
    median,
    within_error,
)
from epfleet.fleet.evidence.sketch_rules import percentile as sketch_percentile
from epfleet.fleet.rollout.rollouts import check_index, move, read_evidence
from epfleet.formats.device_report import report_key
from epfleet.stores import Store
from tests.support.evidence_passes import (
    put_back_after_failures,
    same_as_recount,
)
from tests.support.fake_clock import FakeClock
from tests.support.staged_rollout import (
    MEMBERS,
    MODEL,
    OUTSIDE,
    put,
    real_fleet,
    report,
    settled,
    settled_at_once,  # noqa: F401 (autouse)
    staged_store,  # noqa: F401 (the fixture store)
)

pytestmark = pytest.mark.fast


def aggregate_objects(store: Store) -> list[str]:
    return [k for k in store.list_keys(f"{INDEX_PREFIX}/") if "/aggregates/" in k]


def fleet(store: Store) -> None:
    real_fleet(store, "advance")
    for i, device in enumerate(MEMBERS[1:6]):
        put(store, report(device, True, "kept", 12.0 + i * 0.37))
    for i, device in enumerate(OUTSIDE[5:40]):
        put(store, report(device, False, "kept", 9.0 + i * 0.113))


def test_a_sketch_reads_quantiles_within_its_stated_error_and_merges_by_adding() -> None:
    values = [10 ** random.Random(7).uniform(-3, 5) for _ in range(5000)]
    values += [0.0, 0.0, 1e-12]
    shards = [values[i::7] for i in range(7)]
    parts = []
    for part in shards:
        counts: dict = {}
        for value in part:
            add_sample(counts, "p", value)
        parts.append(fold([Contribution(counts)], 0).counts)
    fleet = merged(parts)
    pairs = fleet.samples["p"]
    assert not fleet.exact["p"] and sum(n for _, n in pairs) == len(values)
    middle = median(pairs)
    assert middle is not None and within_error(middle, statistics.median(values))
    for share in (0.01, 0.25, 0.5, 0.95, 0.99):
        found = sketch_percentile(pairs, share)
        exact = percentile(values, share)
        assert found is not None and exact is not None
        assert abs(found - exact) <= RELATIVE_ERROR * exact + 1e-9, share
    # few samples a shard: kept exactly, and read as a recount reads them, to the bit
    few = [3.3, 1.1, 2.2, 7.7]
    exact_parts = []
    for value in few:
        counts = {}
        add_sample(counts, "p", value)
        exact_parts.append(fold([Contribution(counts)], 0).counts)
    small = merged(exact_parts)
    assert small.exact["p"] and median(small.samples["p"]) == statistics.median(few)
    assert sketch_percentile(small.samples["p"], 0.95) == percentile(few, 0.95)


def test_a_fold_holds_until_a_window_opens_or_closes() -> None:
    inside, before, after = {}, {}, {}
    add_count(inside, path("in"))
    add_count(before, path("before"))
    add_count(after, path("after"))
    one = Contribution({}, Window(100, 200, inside, before, after))
    early = fold([one], 50)
    assert merged([early.counts]).counts == {path("before"): 1} and early.until == 100
    during = fold([one], 100)
    assert merged([during.counts]).counts == {path("in"): 1} and during.until == 201
    assert during.holds(200) and not during.holds(201) and not during.holds(99)
    late = fold([one], 201)
    assert merged([late.counts]).counts == {path("after"): 1}


def test_an_aggregate_seal_verifies_only_for_its_key_kind_and_shard() -> None:
    sealed = seal("gate", 3, {"parts": {}}, b"k" * 64)
    assert unseal("gate", 3, sealed, b"k" * 64)["parts"] == {}
    for kind, shard, key in (("gate", 4, b"k" * 64), ("watch", 3, b"k" * 64), ("gate", 3, b"x")):
        with pytest.raises(ValueError):
            unseal(kind, shard, sealed, key)


def test_a_pass_computes_only_what_changed_and_answers_as_a_recount(store: Store) -> None:
    fleet(store)
    first = same_as_recount(store)
    assert first.index is not None and first.index.contributions_computed == 47
    assert aggregate_objects(store)
    for device in MEMBERS[1:3]:
        put(store, report(device, True, "failed"))
    store.delete(report_key(OUTSIDE[7]))
    second = same_as_recount(store)
    assert second.index is not None and second.index.contributions_computed == 2
    assert second.statuses[0].verdict.decision == "halt"
    third = read_evidence(store)
    assert third.index is not None and third.index.contributions_computed == 0


def test_a_changed_rollout_is_judged_again_from_the_records_without_reading_reports(
    store: Store,
) -> None:
    fleet(store)
    same_as_recount(store)
    move(store, MODEL, "advance", "by hand")  # stage 2: every report now stale
    moved = same_as_recount(store)
    assert moved.index is not None
    assert moved.index.reports_read == 0 and moved.index.contributions_computed == 47
    assert moved.statuses[0].evidence.new.devices == 0
    assert moved.statuses[0].evidence.not_attributed["stale"] == 47


@pytest.mark.parametrize("forgery", ["resealed", "garbage", "swapped"])
def test_a_forged_or_damaged_aggregate_is_computed_again_from_the_records(
    store: Store, forgery: str
) -> None:
    fleet(store)
    before = same_as_recount(store)
    key = index_key()
    objects = aggregate_objects(store)
    failed = [[["n", path("rollout", MODEL, "new", "failed")], 100]]
    for where in objects:
        stored = store.read(where)
        assert stored is not None
        name = where.rsplit("/", 1)[1]
        shard, what = int(name.split(".")[0]), name.split(".")[1]
        kind = f"gate {what}"
        body = unseal(kind, shard, gzip.decompress(stored.data), key)
        if what == "sum":  # every shard: a hundred failures on the new side
            body["folded"] = failed
        else:
            body["parts"] = {
                k: json.dumps([json.loads(p)[0], {"a": failed}]) for k, p in body["parts"].items()
            }
        if forgery == "resealed":
            forged = gzip.compress(seal(kind, shard, body, b"f" * 64))
        elif forgery == "garbage":
            forged = b"\x1f\x8bnot gzip"
        else:  # a genuine aggregate sealed for another shard
            forged = gzip.compress(seal(kind, (shard + 1) % 256, body, key))
        store.write(where, forged)
    after = same_as_recount(store)
    assert after.statuses == before.statuses
    assert after.index is not None and len(after.index.rebuilt) == len(objects)
    assert after.index.reports_read == 0 and after.index.contributions_computed == 47
    healed = read_evidence(store)
    assert healed.index is not None and healed.index.rebuilt == []
    assert healed.index.contributions_computed == 0


def test_an_older_aggregate_put_back_costs_computing_not_votes(store: Store) -> None:
    fleet(store)
    same_as_recount(store)
    halted, replayed = put_back_after_failures(store, aggregate_objects(store))
    assert replayed.statuses == halted.statuses
    assert replayed.index is not None and replayed.index.contributions_computed == 3


def test_the_ranking_window_is_applied_on_the_readers_clock(store: Store) -> None:
    now = datetime.now(timezone.utc)
    fleet(store)
    aging = OUTSIDE[50:55]
    for device in aging:  # a week old, less an hour
        put(store, report(device, False, "kept", 9.5, made=now - timedelta(days=7, hours=-1)))
    clock = FakeClock(now)
    fresh = same_as_recount(store, clock)
    assert "old" not in fresh.ranking_refused
    clock.advance(2 * 3600)  # now they are older than the ranking's seven days
    aged = same_as_recount(store, clock)
    assert aged.ranking_refused.get("old") == len(aging)
    assert aged.index is not None and aged.index.contributions_computed == 0


def test_a_vote_for_another_build_is_refused_by_the_index_as_by_a_recount(store: Store) -> None:
    fleet(store)
    for device in OUTSIDE[50:53]:  # the variant's target, but not the build published
        found = report(device, False, "kept", 9.5)
        found.models[0].artifact_sha256 = "f" * 64
        put(store, found)
    reading = same_as_recount(store)
    assert reading.ranking_refused.get("another build") == 3


def test_past_a_few_samples_a_shard_latencies_come_from_the_sketch_within_its_error(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("epfleet.fleet.evidence.aggregate_rules.EXACT_PER_SHARD", 0)
    fleet(store)
    settled(store)
    reading, differences = check_index(store)
    assert differences == []
    recount = read_evidence(store, full=True)
    [mine], [theirs] = reading.statuses, recount.statuses
    assert mine.evidence.new.devices == theirs.evidence.new.devices
    for side in ("new", "previous"):
        estimate = getattr(mine.evidence, side).median_p50_ms
        exact = getattr(theirs.evidence, side).median_p50_ms
        assert estimate is not None and exact is not None and within_error(estimate, exact)
    assert mine.verdict.decision == theirs.verdict.decision
    assert [(r.model, r.target, r.running) for r in reading.field] == [
        (r.model, r.target, r.running) for r in recount.field
    ]
