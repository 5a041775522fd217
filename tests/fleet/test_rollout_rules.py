"""Staged rollouts, the pure rules: which devices a stage reaches, what a device outside it
runs, how a publish starts a rollout and how it moves, and the gate's judgement of the
field evidence."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from epfleet.fleet.merge_rules import ModelFacts, merge
from epfleet.fleet.rollout_rules import (
    Evidence,
    NoRollout,
    advance,
    gather,
    halt,
    judge,
    revert,
    start,
)
from epfleet.formats.device_report import (
    DeviceReport,
    ManifestStatus,
    ModelReport,
    Profile,
    RolloutSeen,
)
from epfleet.formats.manifest import ArtifactRef, ModelEntry, SourceEntry, VariantEntry
from epfleet.formats.rollout import Rollout, RolloutPolicy, bucket, is_member

pytestmark = pytest.mark.fast

SHA = "ab" * 32
NOW = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)


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
    start(entry, {"cpu": variant("a" * 64), "npu-new": None}, RolloutPolicy(stages=[10, 100]), NOW)
    assert entry.rollout is not None
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
    start(first, {"cpu": None}, RolloutPolicy(), NOW)
    assert first.rollout is None and first.previous == {}
    entry = entry_with_rollout()
    older = entry.previous["cpu"]
    start(entry, {"cpu": variant("b" * 64)}, RolloutPolicy(), NOW)  # a newer publish meanwhile
    assert entry.previous["cpu"] == older  # the way back stays what the fleet ran before


def test_merge_stages_a_replaced_variant_of_a_model_with_a_policy() -> None:
    source = SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=9)
    facts = ModelFacts(rollout={"m": RolloutPolicy(stages=[10, 100])})
    first = merge(None, {"m": source}, {"m": None}, {("m", "cpu"): variant("a" * 64)}, facts)
    assert first.manifest is not None and first.manifest.models["m"].rollout is None
    second = merge(
        first.manifest, {"m": source}, {"m": source}, {("m", "cpu"): variant("b" * 64)}, facts
    )
    assert second.manifest is not None
    staged = second.manifest.models["m"]
    assert staged.rollout is not None and staged.rollout.state == "active"
    assert staged.previous["cpu"] is not None and staged.previous["cpu"].digest == "a" * 64
    no_policy = merge(
        first.manifest, {"m": source}, {"m": source}, {("m", "cpu"): variant("b" * 64)}
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


def test_the_gate_waits_halts_and_advances_on_the_evidence() -> None:
    policy = RolloutPolicy(stages=[10, 100], min_reports=4, max_failure_rate=0.2, min_hours=1)
    active = rollout([10, 100]).model_copy(update={"policy": policy})
    soon, later = NOW + timedelta(minutes=10), NOW + timedelta(hours=2)
    few = Evidence(on_new=2, failed_on_new=0, on_previous=10)
    assert judge(active, few, later).decision == "wait"
    failing = Evidence(on_new=3, failed_on_new=2, on_previous=10)
    verdict = judge(active, failing, soon)
    assert verdict.decision == "halt" and "2 of 5 devices failed" in verdict.reason
    slow = Evidence(
        on_new=5, failed_on_new=0, on_previous=5, new_p50_ms=[20] * 5, previous_p50_ms=[10] * 5
    )
    assert judge(active, slow, later).decision == "halt"
    good = Evidence(on_new=5, failed_on_new=0, on_previous=10)
    assert judge(active, good, soon).decision == "wait"  # min_hours not yet
    assert judge(active, good, later).decision == "advance"


def report(device: str, member: bool, action: str, p50: float | None = None) -> DeviceReport:
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
        rollout=RolloutSeen(id="0" * 16, member=member, stage=0, state="active"),
    )
    return DeviceReport(
        device_id=device,
        generated_at=NOW.isoformat(),
        ort_version="1.32.0",
        ep_packages={},
        devices=[],
        store="s",
        cache="c",
        manifest=ManifestStatus(status="unchanged", generation=2, body_bytes=0),
        models=[model],
        seconds=1.0,
    )


def test_the_evidence_counts_each_device_once_by_the_rollout_it_acted_on() -> None:
    reports = [
        report("a", True, "downloaded", 12.0),
        report("b", True, "failed"),
        report("c", False, "kept", 10.0),
        report("d", False, "kept", 11.0),
    ]
    other = report("e", True, "failed")
    other.models[0].rollout = RolloutSeen(id="1" * 16, member=True, stage=0, state="active")
    evidence = gather(rollout([10, 100]), "m", [*reports, other])
    assert (evidence.on_new, evidence.failed_on_new, evidence.on_previous) == (1, 1, 2)
    assert evidence.new_p50_ms == [12.0] and sorted(evidence.previous_p50_ms) == [10.0, 11.0]
    assert evidence.latency_regression == pytest.approx(12 / 10.5 - 1)
