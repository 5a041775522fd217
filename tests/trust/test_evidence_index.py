"""The evidence index against a full recount of the reports, under races and faults: a pass
reads only what changed and answers as a recount does, after forged, damaged and older
shards put back, two readers folding at once, a reader killed mid-pass and a report
rewritten while it is read. The staged store and its reports are the forged-report
tests' (test_report_attacks.py): in memory in the fast tier, a local
directory and S3 over HTTP (moto) end to end."""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path
from typing import Any

import pytest

from epfleet.errors import StoreError
from epfleet.fleet.evidence.index import index_key, shard_key, update
from epfleet.fleet.evidence.index_rules import (
    SHARDS,
    CheckedSignature,
    must_read,
    project,
    restore,
    seal,
    shard_of,
    unseal,
)
from epfleet.fleet.evidence.rules import Unattributed
from epfleet.fleet.rollout.rollouts import read_evidence
from epfleet.fleet.watch.inputs import full_device_reports, index_pass
from epfleet.formats.device_report import DeviceReport, report_key
from epfleet.stores import Store, open_store
from tests.support.evidence_passes import (
    Interposed,
    pass_killed_at_write,
    put_back_after_failures,
    same_as_recount,
    shard_objects,
)
from tests.support.staged_rollout import (
    MEMBERS,
    OUTSIDE,
    ROLLOUT,
    ROLLOUT_ID,
    put,
    real_fleet,
    report,
    settled,
    settled_at_once,  # noqa: F401 (autouse)
    staged_store,  # noqa: F401 (the fixture store)
)

pytestmark = pytest.mark.fast


def fleet(store: Store) -> None:
    real_fleet(store, "advance")
    for device in MEMBERS[1:6]:
        put(store, report(device, True, "kept", 12.0))
    for device in OUTSIDE[5:40]:
        put(store, report(device, False, "kept", 9.0))


def test_a_second_pass_reads_only_what_changed_and_answers_as_a_recount(store: Store) -> None:
    fleet(store)
    first = same_as_recount(store)
    assert first.index is not None and first.index.reports_read == first.index.listed == 47
    for device in MEMBERS[1:3]:  # two members fail now: the gate halts
        put(store, report(device, True, "failed"))
    store.write(report_key(OUTSIDE[6]), b"not a report")
    store.delete(report_key(OUTSIDE[7]))
    second = same_as_recount(store)
    assert second.index is not None and second.index.listed == 46
    assert second.index.reports_read == 3  # the three changed; the removed one dropped
    [status] = second.statuses
    assert status.verdict.decision == "halt" and status.evidence.new.failed == 2
    assert second.unreadable == 1
    third = read_evidence(store)
    assert third.index is not None and third.index.reports_read == 0
    assert third.index.shards_written == 0


def test_runtime_watch_reads_the_reports_as_a_full_read_does(store: Store) -> None:
    fleet(store)
    store.write(report_key(OUTSIDE[8]), b"{}")
    for _ in range(2):
        indexed = list(index_pass(store, {}).readings())
        full = list(full_device_reports(store))
        assert sorted(map(_watch_view, indexed)) == sorted(map(_watch_view, full))
        put(store, report(OUTSIDE[9], False, "failed"))


def _watch_view(found: DeviceReport | Unattributed) -> str:
    if isinstance(found, Unattributed):
        return str(found)
    return repr(sorted(project(found).items()))


def forged_shard(body: dict[str, Any], shard: int) -> bytes:
    """The shard with every device's model failed, sealed under a key the forger made."""
    for record in body["records"].values():
        for model in record.get("report", {}).get("models", []):
            model["action"] = "failed"
    return gzip.compress(seal(shard, {"records": body["records"]}, b"f" * 64))


@pytest.mark.parametrize("forgery", ["resealed", "garbage", "unsealed", "swapped"])
def test_a_forged_or_damaged_shard_is_rebuilt_from_the_reports(store: Store, forgery: str) -> None:
    fleet(store)
    before = same_as_recount(store)
    key = index_key()
    shards = shard_objects(store)
    assert shards
    for where in shards:
        stored = store.read(where)
        assert stored is not None
        shard = int(where.rsplit("/", 1)[1].split(".")[0])
        body = unseal(shard, gzip.decompress(stored.data), key)
        if forgery == "resealed":
            forged = forged_shard(body, shard)
        elif forgery == "garbage":
            forged = b"\x1f\x8bnot gzip"
        elif forgery == "unsealed":
            forged = gzip.compress(b"0" * 64 + b"\n" + gzip.decompress(stored.data)[65:])
        else:  # a genuine shard sealed for another place: its seal names its own shard
            forged = gzip.compress(seal((shard + 1) % SHARDS, body, key))
        store.write(where, forged)
    after = same_as_recount(store)
    assert after.index is not None and len(after.index.rebuilt) == len(shards)
    assert after.statuses == before.statuses
    assert after.index.reports_read == after.index.listed
    healed = read_evidence(store)
    assert healed.index is not None and healed.index.rebuilt == []
    assert healed.index.reports_read == 0


def test_an_older_shard_put_back_costs_reads_not_votes(store: Store) -> None:
    fleet(store)
    same_as_recount(store)
    halted, replayed = put_back_after_failures(store, shard_objects(store))
    assert replayed.statuses == halted.statuses
    assert replayed.index is not None and replayed.index.reports_read >= 3


def test_two_readers_folding_at_once_lose_nothing(store: Store) -> None:
    fleet(store)
    same_as_recount(store)
    late = MEMBERS[1:4]
    other_read: list[int] = []

    def other_reader(writes: int) -> None:
        if writes == 1:  # between this reader's listing and its first write
            for device in late:
                put(store, report(device, True, "failed"))
            settled(store)
            other_read.append(update(store, {}).reports_read)

    for device in OUTSIDE[10:20]:
        put(store, report(device, False, "failed"))
    settled(store)
    racing = Interposed(store, other_reader)
    found = update(racing, {})  # type: ignore[arg-type]
    assert racing.writes >= 1 and len(other_read) == 1
    # The other reader reads the late ones, and those of the ten in shards this reader had
    # not read yet (how many depends on how far its shard tasks got: threads); this reader
    # reads the rest of the ten, and each new report is read by one of them at least. The
    # late reports rewrite reports this reader listed: in a shard it reads after the other
    # reader wrote it, their stamps differ from its listing, so it reads them again and
    # records them under the stamps it listed (it read 11 once under load).
    assert len(late) <= other_read[0] <= len(late) + 10
    assert found.reports_read <= 10 + len(late)
    assert found.reports_read + other_read[0] >= 10 + len(late)
    after = same_as_recount(store)  # both readers' reports are in the index
    # ... so the next pass reads those again, at most the late ones, and then none
    assert after.index is not None and after.index.reports_read <= len(late)
    again = same_as_recount(store)
    assert again.index is not None and again.index.reports_read == 0
    assert after.statuses[0].evidence.new.failed == 3
    assert after.statuses[0].evidence.previous.failed == 10


def test_a_reader_killed_mid_pass_leaves_an_index_the_next_pass_completes(store: Store) -> None:
    fleet(store)
    same_as_recount(store)
    for device in OUTSIDE[5:40]:
        put(store, report(device, False, "failed"))

    pass_killed_at_write(store)
    after = same_as_recount(store)
    assert after.index is not None and 0 < after.index.reports_read < 35
    assert after.statuses[0].evidence.previous.failed == 35


class RewrittenWhileRead:
    """A store on which a report is rewritten just after a reader read it."""

    def __init__(self, inner: Store, key: str, later: bytes) -> None:
        self.inner, self.key, self.later = inner, key, later

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self, key: str) -> Any:
        found = self.inner.read(key)
        if key == self.key and self.later:
            self.inner.write(key, self.later)
            self.later = b""
        return found


def test_a_report_rewritten_during_a_pass_is_read_again_by_the_next(store: Store) -> None:
    fleet(store)
    same_as_recount(store)
    key = report_key(MEMBERS[1])
    put(store, report(MEMBERS[1], True, "kept", 13.0))
    failed = gzip.compress(report(MEMBERS[1], True, "failed").model_dump_json().encode())
    update(RewrittenWhileRead(store, key, failed), {})  # type: ignore[arg-type]
    after = same_as_recount(store)
    assert after.statuses[0].evidence.new.failed == 1


def test_a_reader_that_cannot_write_answers_and_leaves_the_index(store: Store) -> None:
    fleet(store)
    same_as_recount(store)
    put(store, report(MEMBERS[1], True, "failed"))

    class ReadOnly(Interposed):
        def write(self, key: str, data: bytes, **options: Any) -> str:
            raise StoreError(f"{key}: access denied")

    found = update(ReadOnly(store, None), {})  # type: ignore[arg-type]
    assert found.not_written and found.shards_written == 0
    heard = [h for h in found.heard() if isinstance(h, DeviceReport)]
    assert any(h.device_id == MEMBERS[1] and h.models[0].action == "failed" for h in heard)
    assert same_as_recount(store).index is not None


class ClockRacer(Interposed):
    """A local store on which, as soon as a pass writes its clock object, another writer
    writes clock objects of its own, dated a day ahead, where the pass's could be."""

    def __init__(self, inner: Store, root: Path) -> None:
        super().__init__(inner, lambda writes: None)
        self.root = root

    def write(self, key: str, data: bytes, **options: Any) -> str:
        written = self.inner.write(key, data, **options)
        index = shard_key(index_key(), 0).rsplit("/", 1)[0]
        if key.startswith(f"{index}/clock") and not self.writes:
            self.writes += 1
            ahead = time.time() + 86400
            for where in (f"{index}/clock", f"{index}/clocks/late"):
                self.inner.write(where, b"a day late\n")
                os.utime(self.root / where, (ahead, ahead))
        return written


def test_a_writer_racing_the_pass_clock_does_not_move_its_start(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    fleet(store)
    folder = f"{shard_key(index_key(), 0).rsplit('/', 1)[0]}/clocks"
    store.write(f"{folder}/left-by-a-killed-pass", b"")
    two_hours_ago = time.time() - 7200
    os.utime(tmp_path / "store" / folder / "left-by-a-killed-pass", (two_hours_ago,) * 2)
    before = time.time()
    found = update(ClockRacer(store, tmp_path / "store"), {})  # type: ignore[arg-type]
    starts = {r["read_after"] for r in found.records.values()}
    assert len(starts) == 1 and before - 5 <= starts.pop() <= time.time()
    # the pass removed its own clock and the one left two hours ago, not the racer's
    assert store.list_keys(f"{folder}/") == [f"{folder}/late"]


# --- the rules (pure) --------------------------------------------------------------------------


def test_a_record_is_read_again_unless_listed_as_folded_and_settled() -> None:
    record = {"stamp": [100, 50.0], "read_after": 60.0}
    assert not must_read(record, (100, 50.0), None, settle=5.0)
    assert must_read(None, (100, 50.0), None)
    assert must_read(record, (101, 50.0), None)  # rewritten: another size
    assert must_read(record, (100, 51.0), None)  # rewritten: another time
    # modified within the settle time of the read: a same-second rewrite may hide
    assert must_read(record, (100, 50.0), None, settle=10.0)
    signed = record | {"signature": {"key": "k1", "verified": True}}
    assert not must_read(signed, (100, 50.0), "k1", settle=5.0)
    assert must_read(signed, (100, 50.0), "k2", settle=5.0)  # enrolled with another key now
    assert must_read(signed, (100, 50.0), None, settle=5.0)  # revoked


def test_a_checked_signature_answers_only_for_the_key_it_was_checked_with() -> None:
    from securesystemslib.signer import SSlibKey

    from epfleet.fleet.evidence.index_rules import key_fingerprint

    key = SSlibKey("a" * 64, "ecdsa", "ecdsa-sha2-nistp256", {"public": "PEM"})
    fingerprint = key_fingerprint(key.keyid, key.keytype, key.scheme, "PEM")
    CheckedSignature(fingerprint, True).verify([key], 1)
    with pytest.raises(Exception, match="not checked with this key"):
        CheckedSignature(fingerprint, False).verify([key], 1)
    other = SSlibKey("b" * 64, "ecdsa", "ecdsa-sha2-nistp256", {"public": "PEM"})
    with pytest.raises(Exception, match="not checked with this key"):
        CheckedSignature(fingerprint, True).verify([other], 1)


def test_what_the_index_keeps_reads_as_the_report_for_the_gate() -> None:
    from epfleet.fleet.rollout.rules import gather

    reports = [report(d, True, "kept", 11.0) for d in MEMBERS[:3]]
    reports += [report(d, False, "failed") for d in OUTSIDE[:3]]
    restored = [restore(project(r)) for r in reports]
    assert gather(ROLLOUT, "model-0", restored) == gather(ROLLOUT, "model-0", reports)
    assert [project(r) for r in restored] == [project(r) for r in reports]
    for made in restored:  # every field given, as validation gives them (and fast)
        parts = [made, *made.models, *(v for m in made.models for v in m.considered)]
        assert all(set(vars(p)) == set(type(p).model_fields) for p in parts)
        assert made.model_dump().keys() == reports[0].model_dump().keys()


def test_shards_spread_device_keys_and_seals_verify_only_under_their_key() -> None:
    used = {shard_of(report_key(f"dev-{i:06d}")) for i in range(20_000)}
    assert len(used) == SHARDS
    sealed = seal(7, {"records": {}}, b"k" * 64)
    assert unseal(7, sealed, b"k" * 64)["records"] == {}
    with pytest.raises(ValueError, match="does not verify"):
        unseal(7, sealed, b"j" * 64)
    with pytest.raises(ValueError, match="sealed as shard 7"):
        unseal(8, sealed, b"k" * 64)


def test_reindex_checks_and_rebuilds_the_index_from_the_command_line(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    from epfleet.cli.app import main

    fleet(store)
    put(
        store,
        report(MEMBERS[1], True, "kept", 12.0).model_copy(
            update={"ep_packages": {"onnxruntime-qnn": "2.7.0"}}
        ),
    )
    capsys.readouterr()
    assert main(["rollout", "reindex", "--store", store.uri, "--check"]) == 0
    out = capsys.readouterr().out
    assert "the evidence index answers as a full recount does: 47 reports, 1 rollout" in out
    for where in shard_objects(store)[:2]:
        store.write(where, b"forged")
    assert main(["rollout", "reindex", "--store", store.uri, "--check"]) == 0
    out = capsys.readouterr().out
    assert out.count("shard rebuilt from the reports (it did not verify)") == 2
    assert main(["rollout", "reindex", "--store", store.uri]) == 0
    assert "evidence index rebuilt: 47 of 47 reports read" in capsys.readouterr().out
    assert main(["rollout", "status", "--store", store.uri]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index(f"model-0 {ROLLOUT_ID} by runtime:")
    by_runtime = lines[start : lines.index("", start)]
    assert by_runtime[1:3] == ["  ORT 1.32.0", "    new      6 devices, 0 failed (0%), p50 12.0 ms"]
    assert "  ORT 1.32.0, onnxruntime-qnn 2.7.0" in by_runtime
    assert all(len(line) <= 80 for line in by_runtime)
