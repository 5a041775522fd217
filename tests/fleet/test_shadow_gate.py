"""Shadow runs in the field evidence (pure): the gate halts a stage whose member devices
report their candidate outside the model's bounds, with the figures in its reason, under
the same attribution rules as failures (one vote per device key, membership from the
signed salt, finite numbers, signatures where the policy asks for them); the report and
policy formats stay readable as before; the evidence index keeps the shadow facts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from epfleet.fleet.evidence.index_rules import project, restore
from epfleet.fleet.evidence.rules import Unattributed, attribute
from epfleet.fleet.rollout.rules import gather, judge
from epfleet.fleet.views import rollout_row
from epfleet.formats.device_report import (
    DeviceReport,
    ShadowRun,
    content_digest,
    decode_report,
    encode_report,
    report_key,
)
from epfleet.formats.rollout import RolloutPolicy, ShadowPolicy
from epfleet.formats.spec import FleetSpec
from tests.support.staged_rollout import MEMBERS, MODEL, OUTSIDE, STARTED, report
from tests.support.staged_rollout import ROLLOUT as ACTIVE

pytestmark = pytest.mark.fast

NOW = STARTED
LATER = datetime.now(timezone.utc) + timedelta(minutes=1)


def heard(found: DeviceReport, key: str | None = None) -> DeviceReport | Unattributed:
    """The report as the gate hears it, read from ``key`` (its device's own by default)."""
    return attribute(key or report_key(found.device_id), encode_report(found), 1 << 20)


SHADOW = ACTIVE.model_copy(
    update={"policy": ACTIVE.policy.model_copy(update={"shadow": ShadowPolicy(samples=8)})}
)


def shadow(within: bool, error: float = 0.042, candidate_ms: float = 1.2) -> ShadowRun:
    return ShadowRun(
        candidate="cpu-new",
        active="cpu-old",
        samples=8,
        inputs="app",
        within=within,
        max_rel_error=0.0003 if within else error,
        tolerance=0.001,
        candidate_p50_ms=candidate_ms,
        active_p50_ms=1.0,
        seconds=0.4,
    )


def shadowed(device: str, member: bool, run: ShadowRun | None, **fields: object) -> DeviceReport:
    """A healthy report (kept, p50 10 ms) whose rollout part carries ``run``."""
    found = report(device, member, "kept", 10.0, **fields)  # type: ignore[arg-type]
    [model] = found.models
    assert model.rollout is not None
    seen = model.rollout.model_copy(update={"shadow": run})
    return found.model_copy(update={"models": [model.model_copy(update={"rollout": seen})]})


def test_the_gate_halts_a_stage_on_its_shadow_runs_with_the_figures() -> None:
    outside = heard(shadowed("dev-000", True, shadow(False)))
    agreed = heard(shadowed(MEMBERS[0], True, shadow(True)))
    before = heard(shadowed(OUTSIDE[0], False, None))
    evidence = gather(SHADOW, MODEL, [outside, agreed, before])
    new = evidence.new
    assert (new.devices, new.failed, new.shadow_runs, new.shadow_outside) == (2, 0, 2, 1)
    assert new.shadow_max_rel_error == 0.042 and new.shadow_outside_rate == 0.5
    verdict = judge(SHADOW, evidence, LATER)
    assert verdict.decision == "halt", verdict.reason
    assert "1 of 2 member devices' shadow runs found the candidate outside" in verdict.reason
    assert "largest error 4.20% of range (tolerance 0.10%)" in verdict.reason
    assert "median p50 candidate 1.2 ms, active 1 ms" in verdict.reason
    # failures and latency look healthy: without the shadow policy the stage advances
    assert judge(ACTIVE, evidence, LATER).decision == "advance"
    tolerant = SHADOW.policy.model_copy(
        update={"shadow": ShadowPolicy(samples=8, max_outside_rate=0.5)}
    )
    verdict = judge(SHADOW.model_copy(update={"policy": tolerant}), evidence, LATER)
    assert verdict.decision == "advance" and "1 of 2 shadow runs within" in verdict.reason
    assert evidence.runtimes["ORT 1.32.0"].new.shadow_outside == 1
    row = rollout_row_of(SHADOW, evidence, verdict)
    assert "shadow runs: 1 of 2 within the bounds (largest error 4.20%" in row["new"]


def rollout_row_of(rollout: object, evidence: object, verdict: object) -> dict[str, str]:
    from epfleet.fleet.rollout.rollouts import RolloutStatus

    status = RolloutStatus(model=MODEL, rollout=rollout, evidence=evidence, verdict=verdict)
    return rollout_row(status)


def test_forged_shadow_reports_halt_or_pass_nothing_a_forged_failure_could_not() -> None:
    """Outside-the-bounds reports under non-member ids, under another device's key, of an
    earlier stage or another rollout move nothing; an agreeing report under another key
    does not outvote a member's own; the real disagreement's halt stands."""
    canary = shadowed("dev-000", True, shadow(False))
    real = [heard(canary), heard(shadowed(MEMBERS[0], True, shadow(True)))]
    forged = [heard(shadowed(d, True, shadow(False))) for d in OUTSIDE[:30]]  # membership
    agreeing = shadowed(MEMBERS[1], True, shadow(True))
    forged += [heard(agreeing, report_key(d)) for d in OUTSIDE[30:50]]  # another key
    stale = NOW - timedelta(minutes=1)
    forged += [heard(shadowed(d, True, shadow(False), made=stale)) for d in MEMBERS[2:5]]
    forged += [heard(shadowed(d, True, shadow(False), rollout_id="f" * 16)) for d in MEMBERS[5:8]]
    evidence = gather(SHADOW, MODEL, [*real, *forged])
    assert (evidence.new.shadow_runs, evidence.new.shadow_outside) == (2, 1)
    assert evidence.not_attributed == {"membership": 30, "key": 20, "stale": 3}
    assert judge(SHADOW, evidence, LATER).decision == "halt"
    # only forged outside reports, all refused: the good stage advances
    good = [heard(shadowed("dev-000", True, shadow(True))), real[1]]
    verdict = judge(SHADOW, gather(SHADOW, MODEL, [*good, *forged]), LATER)
    assert verdict.decision == "advance", verdict.reason


def test_with_authenticated_reports_an_unsigned_shadow_report_holds_and_never_halts() -> None:
    signed_only = SHADOW.policy.model_copy(update={"authenticated_reports": True})
    rollout = SHADOW.model_copy(update={"policy": signed_only})
    unsigned = [heard(shadowed(d, True, shadow(False))) for d in ["dev-000", *MEMBERS[:3]]]
    evidence = gather(rollout, MODEL, unsigned, enrolled={})
    assert evidence.new.shadow_runs == 0 and evidence.not_attributed == {"unsigned": 4}
    assert judge(rollout, evidence, LATER).decision == "wait"


@pytest.mark.parametrize(
    ("field", "bad"),
    [
        ("max_rel_error", "NaN"),
        ("max_rel_error", "Infinity"),
        ("candidate_p50_ms", "-1"),
        ("metric_value", "1e300"),
        ("samples", "-3"),
    ],
)
def test_a_shadow_run_with_a_number_out_of_range_makes_the_report_unreadable(
    field: str, bad: str
) -> None:
    good = shadowed("dev-000", True, shadow(False)).model_dump_json()
    value = {"max_rel_error": "0.042", "candidate_p50_ms": "1.2", "samples": "8"}
    raw = good.replace(f'"{field}":{value.get(field, "null")}', f'"{field}":{bad}')
    assert raw != good
    found = attribute(report_key("dev-000"), raw.encode(), 1 << 20)
    assert isinstance(found, Unattributed) and found.reason == "unreadable"
    assert field in found.detail
    assert judge(SHADOW, gather(SHADOW, MODEL, [found]), LATER).decision == "wait"


def test_reports_and_policies_without_shadow_runs_keep_their_bytes_and_digests() -> None:
    plain = report("dev-000", True, "kept", 10.0, made=LATER)
    with_none = shadowed("dev-000", True, None, made=LATER)
    assert with_none.model_dump_json() == plain.model_dump_json()
    assert content_digest(with_none) == content_digest(plain)
    outside, agreed = (
        shadowed("dev-000", True, shadow(False)),
        shadowed("dev-000", True, shadow(True)),
    )
    assert len({content_digest(plain), content_digest(outside), content_digest(agreed)}) == 3
    # a reader of an older epfleet ignores keys it does not know: the rollout part parses
    assert decode_report(outside.model_dump_json().encode(), 1 << 20) == outside
    assert "shadow" not in RolloutPolicy().model_dump_json()
    assert RolloutPolicy(shadow={"samples": 4}).model_dump()["shadow"] == {  # type: ignore[arg-type]
        "samples": 4,
        "max_outside_rate": 0.0,
    }


@pytest.mark.parametrize(
    ("shadow_policy", "message"),
    [
        ({"samples": 0}, "greater than or equal to 1"),
        ({"samples": 1001}, "less than or equal to 1000"),
        ({"samples": 4, "max_outside_rate": 2}, "less than or equal to 1"),
        ({"samples": 4, "extra": 1}, "Extra inputs"),
        ({}, "samples"),
    ],
)
def test_a_spec_with_a_bad_shadow_policy_is_refused_naming_it(
    shadow_policy: dict[str, object], message: str
) -> None:
    spec = {
        "models": [{"name": "m", "source": "m.onnx"}],
        "targets": [{"name": "cpu", "ep": "CPUExecutionProvider"}],
        "rollout": {"shadow": shadow_policy},
    }
    with pytest.raises(ValidationError, match=message) as raised:
        FleetSpec.model_validate(spec)
    assert "shadow" in str(raised.value)


def test_the_index_keeps_the_shadow_facts_the_gate_reads() -> None:
    reports = [shadowed("dev-000", True, shadow(False)), shadowed(MEMBERS[0], True, shadow(True))]
    reports += [shadowed(d, False, None) for d in OUTSIDE[:2]]
    restored = [restore(project(r)) for r in reports]
    assert gather(SHADOW, MODEL, restored) == gather(SHADOW, MODEL, reports)
    assert [project(r) for r in restored] == [project(r) for r in reports]
    assert project(reports[0])["models"][0]["rollout"]["shadow"]["within"] is False
