"""Staged rollouts, the pure rules: which devices a stage reaches, what a device outside it
runs, how a publish starts a rollout and how it moves, and the gate's judgement of the
field evidence."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from epfleet.fleet.evidence.rules import Unattributed, attribute
from epfleet.fleet.publishing.merge_rules import ModelFacts, merge
from epfleet.fleet.rollout.rules import (
    Begin,
    CannotMove,
    Evidence,
    NoRollout,
    SideEvidence,
    advance,
    gather,
    halt,
    judge,
    policy_change,
    resume,
    revert,
    start,
)
from epfleet.formats.device_report import (
    DeviceReport,
    ManifestStatus,
    ModelReport,
    Profile,
    RolloutSeen,
    encode_report,
    key_device,
    report_key,
)
from epfleet.formats.manifest import (
    ArtifactRef,
    Manifest,
    ModelEntry,
    SamplesRef,
    SourceEntry,
    VariantEntry,
    referenced_keys,
)
from epfleet.formats.rollout import Rollout, RolloutPolicy, bucket, is_member
from epfleet.text import markdown_text, printable, printable_lines

pytestmark = pytest.mark.fast

SHA = "ab" * 32
NOW = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
SEED = "5eed" * 8
BEGIN = Begin(now=NOW, id="1" * 16, salt="2" * 32)


def variant(digest: str) -> VariantEntry:
    return VariantEntry(
        ep="CPUExecutionProvider",
        device="cpu",
        compatibility_string="epfleet-cpu/1",
        artifact=ArtifactRef(uri=f"variants/m/cpu/{digest}.onnx", sha256=digest, size=5),
        ort_version="1.32.0",
        compiled_at=NOW,
        status="ok",
        source_sha256=SHA,
        fingerprint=digest[:8],
    )


def rollout(stages: list[float], stage: int = 0, **fields: object) -> Rollout:
    policy = RolloutPolicy(stages=stages, canary=["dev-000"])
    return Rollout(
        id="0" * 16,
        salt="5a17" * 8,
        policy=policy,
        stage=stage,
        started_at=NOW,
        stage_started_at=NOW,
        **fields,
    )


def test_a_stage_reaches_about_its_share_of_devices_and_the_canaries() -> None:
    ten = rollout([10, 100])
    devices = [f"dev-{i:03d}" for i in range(1000)]
    reached = [d for d in devices if is_member(ten, d)]
    assert 70 <= len(reached) <= 130  # 10 % of 1,000, give or take
    assert "dev-000" in reached  # the canary, wherever its bucket falls
    assert all(is_member(ten.model_copy(update={"stage": 1}), d) for d in devices)
    assert not any(is_member(ten.model_copy(update={"state": "reverted"}), d) for d in devices)
    widened = rollout([10, 50, 100], stage=1)
    assert set(reached) <= {d for d in devices if is_member(widened, d)}  # stages only add
    other_salt = ten.model_copy(update={"salt": "6b28" * 8})
    assert {d for d in devices if is_member(other_salt, d)} != set(reached)  # a new draw
    assert 0 <= bucket(ten.salt, "dev-1") < 10_000


@pytest.mark.parametrize("stages", [[], [5, 25], [50, 10, 100], [0, 100], [10, 10, 100]])
def test_a_policy_whose_stages_do_not_end_at_every_device_is_refused(stages: list[float]) -> None:
    with pytest.raises(ValidationError, match="stages"):
        RolloutPolicy(stages=stages)


def entry_with_rollout(stage: int = 0) -> ModelEntry:
    entry = ModelEntry(
        source=SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=9),
        variants={"cpu": variant("b" * 64), "npu-new": variant("d" * 64)},
    )
    entry = start(
        entry, {"cpu": variant("a" * 64), "npu-new": None}, RolloutPolicy(stages=[10, 100]), BEGIN
    )
    assert entry.rollout is not None and entry.rollout.id == "1" * 16
    entry.rollout = entry.rollout.model_copy(update={"stage": stage})
    return entry


def test_a_device_outside_the_rollout_runs_what_the_new_variants_replaced() -> None:
    entry = entry_with_rollout()
    assert entry.rollout is not None
    outside = next(f"d{i}" for i in range(1000) if not is_member(entry.rollout, f"d{i}"))
    inside = next(f"d{i}" for i in range(1000) if is_member(entry.rollout, f"d{i}"))
    assert entry.for_device(inside) is entry
    mine = entry.for_device(outside)
    assert mine.variants["cpu"].digest == "a" * 64
    assert "npu-new" not in mine.variants  # a target the rollout added: not yet theirs


def test_a_publish_starts_a_rollout_only_with_something_to_go_back_to() -> None:
    first = ModelEntry(source=SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=9))
    assert start(first, {"cpu": None}, RolloutPolicy(), BEGIN) is first
    entry = entry_with_rollout()
    older = entry.previous["cpu"]
    newer = Begin(now=NOW, id="3" * 16, salt="4" * 32)
    restaged = start(entry, {"cpu": variant("b" * 64)}, RolloutPolicy(), newer)  # a newer publish
    assert restaged.previous["cpu"] == older  # the way back stays what the fleet ran before
    assert restaged.rollout is not None and restaged.rollout.id == "3" * 16
    assert entry.rollout is not None and entry.rollout.id == "1" * 16  # a copy: entry unchanged


def test_merge_stages_a_replaced_variant_of_a_model_with_a_policy() -> None:
    source = SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=9)
    facts = ModelFacts(rollout={"m": RolloutPolicy(stages=[10, 100])})
    first = merge(
        None,
        {"m": source},
        {"m": None},
        {("m", "cpu"): variant("a" * 64)},
        facts,
        now=NOW,
        seed=SEED,
    )
    assert first.manifest is not None and first.manifest.models["m"].rollout is None
    second = merge(
        first.manifest,
        {"m": source},
        {"m": source},
        {("m", "cpu"): variant("b" * 64)},
        facts,
        now=NOW,
        seed=SEED,
    )
    assert second.manifest is not None
    staged = second.manifest.models["m"]
    assert staged.rollout is not None and staged.rollout.state == "active"
    assert staged.previous["cpu"] is not None and staged.previous["cpu"].digest == "a" * 64
    no_policy = merge(
        first.manifest,
        {"m": source},
        {"m": source},
        {("m", "cpu"): variant("b" * 64)},
        now=NOW,
        seed=SEED,
    )
    assert no_policy.manifest is not None and no_policy.manifest.models["m"].rollout is None


def test_a_rollout_advances_to_completion_halts_and_reverts() -> None:
    entry = entry_with_rollout()
    later = NOW + timedelta(hours=2)
    moved = advance(entry, later)
    assert moved.rollout is not None and moved.rollout.stage == 1
    done = advance(moved, later)
    assert done.rollout is not None and done.rollout.state == "complete" and done.previous == {}
    with pytest.raises(NoRollout):
        advance(done, later)
    halted = halt(entry, "crashes")
    assert halted.rollout is not None and halted.rollout.state == "halted"
    back = revert(halted, "accuracy")
    assert back.rollout is not None and back.rollout.state == "reverted"
    assert back.rollout.reason == "accuracy"
    assert back.for_device("dev-000").variants["cpu"].digest == "a" * 64  # even the canary


def test_a_halted_rollout_is_resumed_before_it_advances_and_no_op_moves_change_nothing() -> None:
    entry = entry_with_rollout()
    later = NOW + timedelta(hours=2)
    halted = halt(entry, "crashes")
    assert halt(halted, "again") is halted  # nothing to publish: the first reason stays
    with pytest.raises(CannotMove, match=r"halted \(crashes\) at stage 1: resume it first"):
        advance(halted, later)
    assert resume(entry) is entry
    resumed = resume(halted)
    assert resumed.rollout is not None and resumed.rollout.state == "active"
    assert resumed.rollout.reason is None and resumed.rollout.stage == 0
    moved = advance(resumed, later)
    assert moved.rollout is not None and moved.rollout.stage == 1
    with pytest.raises(NoRollout):
        resume(revert(entry, "accuracy"))


def test_merge_makes_a_rollout_under_way_follow_its_changed_policy() -> None:
    entry = entry_with_rollout()
    current = Manifest(models={"m": entry})
    source = entry.source
    looser = RolloutPolicy(stages=[10, 100], max_failure_rate=0.5)
    assert policy_change(entry, looser) == (
        f"its rollout {entry.rollout.id if entry.rollout else ''} (active, stage 1) follows "
        "the spec's changed rollout policy: max_failure_rate 0.05 -> 0.5"
    )
    merged = merge(
        current,
        {"m": source},
        {"m": source},
        {},
        ModelFacts(rollout={"m": looser}),
        now=NOW,
        seed=SEED,
    )
    assert merged.manifest is not None
    followed = merged.manifest.models["m"].rollout
    assert followed is not None and followed.policy == looser
    assert entry.rollout is not None and followed.id == entry.rollout.id
    assert entry.rollout.policy.max_failure_rate == 0.05  # the manifest given is not changed
    same = ModelFacts(rollout={"m": entry.rollout.policy})
    assert (
        merge(current, {"m": source}, {"m": source}, {}, same, now=NOW, seed=SEED).manifest is None
    )
    ended = advance(entry_with_rollout(stage=1), NOW)
    assert ended.rollout is not None and ended.rollout.state == "complete"
    assert policy_change(ended, looser) is None  # a finished rollout keeps what it ran
    with pytest.raises(CannotMove, match=r"has 1 stage \[100.0\], and its rollout"):
        policy_change(entry_with_rollout(stage=1), RolloutPolicy(stages=[100]))


def side(devices: int, failed: int = 0, p50: float | None = None) -> SideEvidence:
    served = devices - failed
    return SideEvidence(devices=devices, failed=failed, p50_ms=[p50] * served if p50 else [])


def test_the_gate_waits_halts_and_advances_on_the_evidence() -> None:
    policy = RolloutPolicy(stages=[10, 100], min_reports=4, max_failure_rate=0.2, min_hours=1)
    active = rollout([10, 100]).model_copy(update={"policy": policy})
    soon, later = NOW + timedelta(minutes=10), NOW + timedelta(hours=2)
    few = Evidence(new=side(2), previous=side(10))
    assert judge(active, few, later).decision == "wait"
    failing = Evidence(new=side(5, failed=2), previous=side(10))
    verdict = judge(active, failing, soon)
    assert verdict.decision == "halt" and "2 of 5 member devices failed" in verdict.reason
    slow = Evidence(new=side(5, p50=20), previous=side(5, p50=10))
    assert judge(active, slow, later).decision == "halt"
    good = Evidence(new=side(5), previous=side(10))
    assert judge(active, good, soon).decision == "wait"  # min_hours not yet
    assert judge(active, good, later).decision == "advance"
    refused = {"key": 30, "membership": 20}
    doubtful = good.model_copy(update={"not_attributed": refused, "unreadable": 7})
    verdict = judge(active, doubtful, later)  # reports outside the stage move nothing
    assert verdict.decision == "advance"
    assert "30 its object key names another device" in verdict.reason
    assert "20 claims a side" in verdict.reason and "7 of the fleet's reports" in verdict.reason
    unheard = good.model_copy(update={"unheard_members": 5, "not_attributed": refused})
    verdict = judge(active, unheard, later)
    assert verdict.decision == "wait" and "5 member devices' reports could not be used" in (
        verdict.reason
    )
    assert judge(active, failing.model_copy(update={"unheard_members": 50}), soon).decision == (
        "halt"
    )


def test_a_side_gives_its_failure_rate_median_latency_and_ep_placement() -> None:
    found = SideEvidence(devices=4, failed=1, p50_ms=[9.0, 30.0, 10.0], partly_on_other_eps=1)
    assert (found.failure_rate, found.median_p50_ms) == (0.25, 10.0)
    assert found.other_eps_share == pytest.approx(1 / 3)
    assert "p50_ms" not in found.model_dump() and found.model_dump()["failure_rate"] == 0.25
    assert SideEvidence().median_p50_ms is None and SideEvidence().other_eps_share == 0.0


def report(
    device: str,
    member: bool,
    action: str,
    p50: float | None = None,
    made: datetime = NOW,
    rollout_id: str = "0" * 16,
    stage: int = 0,
) -> DeviceReport:
    profile = (
        Profile(session_ms=1, first_run_ms=2, p50_ms=p50, p95_ms=p50, runs=5)
        if p50 is not None
        else None
    )
    model = ModelReport(
        model="m",
        action=action,  # type: ignore[arg-type]
        variant="cpu-x",
        target="cpu",
        ep="CPUExecutionProvider",
        verdict=None,
        bytes_downloaded=0,
        reason="",
        considered=[],
        seconds=0.1,
        profile=profile,
        rollout=RolloutSeen(id=rollout_id, member=member, stage=stage, state="active"),
    )
    return DeviceReport(
        device_id=device,
        generated_at=made.isoformat(),
        ort_version="1.32.0",
        ep_packages={},
        devices=[],
        store="s",
        cache="c",
        manifest=ManifestStatus(status="unchanged", generation=2, body_bytes=0),
        models=[model],
        seconds=1.0,
    )


LIMIT = 1 << 20


def heard(report: DeviceReport, key: str | None = None) -> DeviceReport | Unattributed:
    """The report as the gate hears it, read from ``key`` (its device's own by default)."""
    return attribute(key or report_key(report.device_id), encode_report(report), LIMIT)


def keyed(*reports: DeviceReport) -> list[DeviceReport | Unattributed]:
    return [heard(r) for r in reports]


STAGED = rollout([10, 100])
MEMBERS = [d for d in (f"dev-{i:03d}" for i in range(1, 200)) if is_member(STAGED, d)]
OUTSIDE = [d for d in (f"dev-{i:03d}" for i in range(1, 200)) if not is_member(STAGED, d)]
GOOD_POLICY = RolloutPolicy(stages=[10, 100], canary=["dev-000"], min_reports=2, min_hours=0)
ACTIVE = STAGED.model_copy(update={"policy": GOOD_POLICY, "stage_started_at": NOW})
LATER = NOW + timedelta(hours=1)


def test_a_report_is_heard_only_under_its_own_device_key_and_when_it_reads() -> None:
    good = report(MEMBERS[0], True, "kept", 10.0)
    assert heard(good) == good
    other = heard(good, report_key(OUTSIDE[0]))
    assert isinstance(other, Unattributed) and other.reason == "key" and other.report == good
    assert f"the key names {OUTSIDE[0]!r}" in str(other)
    nested = heard(good, f"reports/devices/x/{MEMBERS[0]}.json")
    assert isinstance(nested, Unattributed) and nested.reason == "key"
    damaged = attribute(report_key("d"), b"\x1f\x8b not gzip", LIMIT)
    assert isinstance(damaged, Unattributed) and damaged.reason == "unreadable"
    naive = good.model_copy(update={"generated_at": "2026-12-01T12:00:00"})
    found = heard(naive)
    assert isinstance(found, Unattributed) and "no UTC offset" in found.detail
    raw = good.model_dump_json().replace('"p50_ms":10.0', '"p50_ms":NaN').encode()
    nan = attribute(report_key(good.device_id), raw, LIMIT)
    assert isinstance(nan, Unattributed) and nan.reason == "unreadable", nan
    assert "p50_ms" in nan.detail


def test_the_evidence_counts_each_device_once_by_the_side_the_salt_gives_it() -> None:
    a, b = MEMBERS[:2]
    c, d = OUTSIDE[:2]
    reports = keyed(
        report(a, True, "downloaded", 12.0),
        report(b, True, "failed"),
        report(c, False, "kept", 10.0),
        report(d, False, "kept", 11.0),
        report(OUTSIDE[2], True, "failed", rollout_id="1" * 16),  # an older rollout's
    )
    unreadable = Unattributed("reports/devices/x.json", "unreadable", "damaged")
    evidence = gather(STAGED, "m", [*reports, unreadable])
    assert (evidence.new.devices, evidence.new.failed, evidence.previous.devices) == (2, 1, 2)
    assert evidence.new.p50_ms == [12.0] and sorted(evidence.previous.p50_ms) == [10.0, 11.0]
    assert evidence.latency_regression == pytest.approx(12 / 10.5 - 1)
    assert (evidence.other_rollouts, evidence.unreadable, evidence.unattributed) == (1, 1, 0)
    assert evidence.unheard_members == is_member(STAGED, "x")


def test_a_report_of_an_earlier_stage_or_made_before_it_is_stale() -> None:
    second = ACTIVE.model_copy(update={"stage": 1})
    earlier_stage = report(MEMBERS[0], True, "failed", stage=0)
    before_start = report(MEMBERS[1], True, "failed", made=NOW - timedelta(seconds=1), stage=1)
    evidence = gather(second, "m", keyed(earlier_stage, before_start))
    assert evidence.new.devices == 0 and evidence.not_attributed == {"stale": 2}
    assert evidence.unheard_members == 0  # not yet reported is not unheard


def test_forged_reports_move_no_decision() -> None:
    """The issue's forgeries: 40 reports under other keys all saying one canary id, ids
    outside the stage claiming to be in it, reports of another rollout, reports made
    before the stage started; the gate's halt on a real failure stands."""
    real = keyed(report("dev-000", True, "downloaded", 10.0), report(MEMBERS[0], True, "failed"))
    before = judge(ACTIVE, gather(ACTIVE, "m", real), LATER)
    assert before.decision == "halt"
    canary = report("dev-000", True, "downloaded", 10.0)
    forged = [heard(canary, report_key(device)) for device in OUTSIDE[:40]]
    forged += keyed(*(report(d, True, "downloaded", 10.0) for d in OUTSIDE[40:100]))
    forged += keyed(*(report(d, True, "downloaded", rollout_id="f" * 16) for d in MEMBERS[1:4]))
    stale = NOW - timedelta(minutes=5)
    forged += keyed(*(report(d, True, "downloaded", 10.0, made=stale) for d in MEMBERS[4:8]))
    evidence = gather(ACTIVE, "m", [*real, *forged])
    assert (evidence.new.devices, evidence.new.failed) == (2, 1)
    assert evidence.not_attributed == {"key": 40, "membership": 60, "stale": 4}
    assert (evidence.other_rollouts, evidence.unheard_members) == (3, 0)
    after = judge(ACTIVE, evidence, LATER)
    assert after.decision == "halt" and "1 of 2 member devices failed" in after.reason
    assert "40 its object key names another device" in after.reason


def test_forged_failures_in_non_member_names_move_nothing() -> None:
    """A halt needs failures of member devices: failures in names the salt puts outside
    the stage are not counted, however many; the good rollout still advances."""
    good = keyed(report("dev-000", True, "downloaded", 10.0), report(MEMBERS[0], True, "kept", 9.0))
    forged = keyed(*(report(d, True, "failed") for d in OUTSIDE[:60]))
    evidence = gather(ACTIVE, "m", [*good, *forged])
    assert evidence.new.failed == 0 and evidence.not_attributed == {"membership": 60}
    verdict = judge(ACTIVE, evidence, LATER)
    assert verdict.decision == "advance" and "60 claims a side" in verdict.reason


def test_unusable_reports_in_member_names_hold_a_stage_and_never_halt_or_advance_it() -> None:
    good = keyed(report("dev-000", True, "downloaded", 10.0), report(MEMBERS[0], True, "kept", 9.0))
    broken = [Unattributed(report_key(d), "unreadable", "damaged") for d in MEMBERS[1:3]]
    held = judge(ACTIVE, gather(ACTIVE, "m", [*good, *broken]), LATER)
    assert held.decision == "wait" and "2 member devices' reports could not be used" in held.reason
    one = judge(ACTIVE, gather(ACTIVE, "m", [*good, *broken[:1]]), LATER)
    assert one.decision == "advance"
    failing = keyed(report("dev-000", True, "failed"), report(MEMBERS[0], True, "failed"))
    assert judge(ACTIVE, gather(ACTIVE, "m", [*failing, *broken]), LATER).decision == "halt"


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-1", "1e300"])
def test_a_report_with_a_number_out_of_range_does_not_parse(bad: str) -> None:
    good = report(MEMBERS[0], True, "downloaded", 10.0).model_dump_json()
    assert DeviceReport.model_validate_json(good).models[0].profile is not None
    forged = good.replace('"p50_ms":10.0', f'"p50_ms":{bad}')
    assert forged != good
    with pytest.raises(ValidationError):
        DeviceReport.model_validate_json(forged)


def test_a_report_key_names_its_device_only_as_reports_devices_id_json() -> None:
    assert key_device("reports/devices/dev-1.json") == "dev-1"
    assert key_device("reports/devices/a/b.json") is None
    assert key_device("reports/devices/.json") is None
    assert key_device("reports/other/dev-1.json") is None


def test_text_from_reports_is_escaped_for_terminals_and_markdown() -> None:
    hostile = "a\x1b[2Jb\nc\u202ed|e *f* [g](h) <i>"
    shown = printable(hostile)
    assert shown == "a\\x1b[2Jb\\x0ac\\u202ed|e *f* [g](h) <i>"
    assert shown.isprintable()
    marked = markdown_text(hostile)
    assert "\\|" in marked and "\\*f\\*" in marked and "\\[g\\]" in marked and "&lt;i\\>" in marked
    assert printable("tiny-cls × x86-cpu, 12.5 ms") == "tiny-cls × x86-cpu, 12.5 ms"


def test_a_message_of_several_lines_keeps_its_line_breaks_and_escapes_the_rest() -> None:
    shown = printable_lines("spec is invalid:\n  models[a\x1b[2Jb].name: bad\r")
    assert shown == "spec is invalid:\n  models[a\\x1b[2Jb].name: bad\\x0d"


# --- new model versions under rollout --------------------------------------------------------

SHA2 = "cd" * 32


def samples(digest: str) -> SamplesRef:
    return SamplesRef(uri=f"samples/{digest}.npz", sha256=digest, size=3, count=2, basis=digest)


def versions() -> tuple[Manifest, Manifest]:
    """A model published at version 1 (source SHA, samples, a cpu variant), then version 2
    (source SHA2, its own samples, cpu and a new npu target) under a rollout policy."""
    old_source = SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=9)
    new_source = SourceEntry(uri=f"sources/{SHA2}.onnx", sha256=SHA2, size=9)
    policy = RolloutPolicy(stages=[10, 100], canary=["dev-000"])
    v1 = ModelFacts(samples={"m": samples("1" * 64)}, rollout={"m": policy})
    first = merge(
        None,
        {"m": old_source},
        {"m": None},
        {("m", "cpu"): variant("a" * 64)},
        v1,
        now=NOW,
        seed=SEED,
    )
    assert first.manifest is not None
    v2 = ModelFacts(samples={"m": samples("2" * 64)}, rollout={"m": policy})
    new_variants = {("m", "cpu"): variant("b" * 64), ("m", "npu"): variant("c" * 64)}
    second = merge(
        first.manifest, {"m": new_source}, {"m": old_source}, new_variants, v2, now=NOW, seed=SEED
    )
    assert second.manifest is not None
    return first.manifest, second.manifest


def test_a_new_source_is_staged_and_outside_devices_keep_the_whole_previous_version() -> None:
    first, second = versions()
    staged = second.models["m"]
    assert staged.rollout is not None and staged.rollout.state == "active"
    assert staged.previous_version is not None
    assert staged.previous_version.source.sha256 == SHA
    rollout = staged.rollout
    inside = next(f"d{i}" for i in range(1000) if is_member(rollout, f"d{i}"))
    outside = next(f"d{i}" for i in range(1000) if not is_member(rollout, f"d{i}"))
    assert staged.for_device(inside) is staged
    assert staged.for_device("dev-000") is staged  # the canary
    mine = staged.for_device(outside)
    assert mine.source.sha256 == SHA and mine.samples == first.models["m"].samples
    assert set(mine.variants) == {"cpu"} and mine.variants["cpu"].digest == "a" * 64
    # the signed entry round-trips, the previous version with it
    again = Manifest.from_json(second.to_json()).models["m"]
    assert again.for_device(outside).source.sha256 == SHA


def test_a_reverted_version_rollout_sends_every_device_back_and_advance_drops_it() -> None:
    _, second = versions()
    staged = second.models["m"]
    back = revert(staged, "accuracy")
    for device in ("dev-000", "d1", "d2"):
        mine = back.for_device(device)
        assert mine.source.sha256 == SHA and set(mine.variants) == {"cpu"}
    done = advance(advance(staged, NOW), NOW)
    assert done.rollout is not None and done.rollout.state == "complete"
    assert done.previous == {} and done.previous_version is None
    assert done.for_device("d1").source.sha256 == SHA2


def test_a_newer_version_during_a_rollout_never_makes_an_unproven_one_the_way_back() -> None:
    _, second = versions()
    sha3 = "ef" * 32
    third_source = SourceEntry(uri=f"sources/{sha3}.onnx", sha256=sha3, size=9)
    policy = RolloutPolicy(stages=[10, 100])
    facts = ModelFacts(rollout={"m": policy})
    v2_source = second.models["m"].source
    third = merge(
        second,
        {"m": third_source},
        {"m": v2_source},
        {("m", "cpu"): variant("d" * 64)},
        facts,
        now=NOW,
        seed=SEED,
    )
    assert third.manifest is not None
    entry = third.manifest.models["m"]
    assert entry.previous_version is not None and entry.previous_version.source.sha256 == SHA
    assert entry.previous["cpu"] is not None and entry.previous["cpu"].digest == "a" * 64
    # a rebuild of the new version meanwhile keeps the same way back, and adds no target to it
    rebuilt = merge(
        third.manifest,
        {"m": third_source},
        {"m": third_source},
        {("m", "gpu"): variant("e" * 64), ("m", "cpu"): variant("f" * 64)},
        facts,
        now=NOW,
        seed=SEED,
    )
    assert rebuilt.manifest is not None
    kept = rebuilt.manifest.models["m"]
    assert kept.previous_version == entry.previous_version and set(kept.previous) == {"cpu"}


def test_a_first_version_and_a_new_source_without_policy_are_not_staged() -> None:
    first, _ = versions()
    assert first.models["m"].rollout is None
    new_source = SourceEntry(uri=f"sources/{SHA2}.onnx", sha256=SHA2, size=9)
    old_source = first.models["m"].source
    plain = merge(
        first,
        {"m": new_source},
        {"m": old_source},
        {("m", "cpu"): variant("b" * 64)},
        now=NOW,
        seed=SEED,
    )
    assert plain.manifest is not None
    assert plain.manifest.models["m"].rollout is None
    assert plain.manifest.models["m"].previous_version is None


def test_gc_keeps_what_a_version_rollout_may_return_to() -> None:
    first, second = versions()
    needed = referenced_keys(second)
    old = first.models["m"]
    assert old.source.uri in needed and old.samples is not None and old.samples.uri in needed
    assert old.variants["cpu"].artifact is not None
    assert old.variants["cpu"].artifact.uri in needed
    done = second.model_copy(
        update={"models": {"m": advance(advance(second.models["m"], NOW), NOW)}}
    )
    assert old.source.uri not in referenced_keys(done)  # collectable once complete
