"""The fleet side's pure rules: what a run publishes and reports, and how a work pool's
hand-over is matched to the pairs sent (no Prefect, no compile)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from uuid import uuid4

import pytest

from epfleet import ort_version
from epfleet.fleet.planning.rules import PlannedPair
from epfleet.fleet.publishing.publish import Published
from epfleet.fleet.publishing.rules import not_published_error, settle, to_publish
from epfleet.fleet.runs.handover import (
    Dispatched,
    PoolPair,
    Returned,
    abandoned,
    attempt_name,
    nothing_returned,
    parse_results_key,
    pool_outcomes,
    results_key,
)
from epfleet.fleet.runs.models import PairResult, RunPlan
from epfleet.fleet.runs.outcomes import PairOutcome, failed_outcome
from epfleet.formats.manifest import (
    ArtifactRef,
    Manifest,
    ModelEntry,
    SourceEntry,
    VariantEntry,
    utcnow,
)
from epfleet.runtime.requests import CompileRequest

pytestmark = pytest.mark.fast

SHA, OTHER = "a" * 64, "b" * 64
CPU = "CPUExecutionProvider"


def request(model: str, target: str, source: str = SHA) -> CompileRequest:
    return CompileRequest(
        model=model,
        target=target,
        ep=CPU,
        device="cpu",
        provider_options={},
        input_shapes={"x": [1, 3, 8, 8]},
        source_key=f"sources/{source}.onnx",
        source_sha256=source,
        source_size=10,
        fingerprint=f"{model}-{target}",
    )


def built(req: CompileRequest, artifact: str) -> VariantEntry:
    return VariantEntry(
        ep=CPU,
        device="cpu",
        compatibility_string="s",
        artifact=ArtifactRef(uri=artifact, sha256=req.source_sha256, size=3),
        ort_version=ort_version(),
        ep_version="x",
        compiled_at=utcnow(),
        status="ok",
        source_sha256=req.source_sha256,
        fingerprint=req.fingerprint,
    )


def ok(req: CompileRequest, artifact: str) -> PairOutcome:
    entry = built(req, artifact)
    return PairOutcome(entry=entry, result=PairResult.of(req, entry, "ok", 1.0))


def plan_of(*requests: CompileRequest) -> RunPlan:
    pairs = [PlannedPair(request=r, action="compile", reason="new pair") for r in requests]
    return RunPlan(store="s", sources={}, pairs=pairs, generation=0, published_sources={})


def test_a_run_publishes_in_spec_order_and_never_an_undecided_pool_pair() -> None:
    first, second, third = request("m", "a"), request("m", "b"), request("m", "c")
    undecided = failed_outcome(third, "the pool never ran")
    undecided.publish = False
    outcomes = [ok(second, "v/b.onnx"), undecided, ok(first, "v/a.onnx")]
    published = to_publish(plan_of(first, second, third), outcomes)
    assert [(m, t) for m, t, _ in published] == [("m", "a"), ("m", "b")]


def test_the_report_fails_overtaken_builds_and_names_the_artifact_devices_get() -> None:
    mine, theirs = request("mine", "cpu"), request("theirs", "cpu")
    plan = plan_of(mine, theirs)
    outcomes = [ok(mine, "v/mine/new.onnx"), ok(theirs, "v/theirs/new.onnx")]
    # the same build was published before with other bytes: devices keep that artifact
    kept = built(mine, "v/mine/old.onnx")
    manifest = Manifest(
        generation=4,
        models={
            "mine": ModelEntry(
                source=SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=10),
                variants={"cpu": kept},
            )
        },
    )
    report, refused = settle(
        plan, outcomes, Published(manifest=manifest, published=True, conflicts=["theirs"])
    )
    by_model = {r.model: r for r in report.variants}
    assert by_model["mine"].status == "ok"
    assert by_model["mine"].artifact_uri == "v/mine/old.onnx"
    assert by_model["theirs"].status == "failed"
    assert by_model["theirs"].error == not_published_error("theirs")
    assert [r.model for r in refused] == ["theirs"]
    assert (report.generation, report.published, report.compiled, report.failed) == (4, True, 1, 1)


def test_pool_outcomes_fail_what_did_not_come_back_and_publish_only_new_pairs_failures() -> None:
    up_to_date, rebuilt, other_source, lost, new = (
        request("m", t) for t in ("same", "rebuilt", "moved", "lost", "new")
    )
    previous = built(lost, "v/lost.onnx")
    sent = Dispatched(
        pool="gpu",
        pairs=[
            PoolPair(request=up_to_date, previous=built(up_to_date, "v/same.onnx")),
            PoolPair(request=rebuilt),
            PoolPair(request=other_source),
            PoolPair(request=lost, previous=previous),
            PoolPair(request=new),
        ],
        results_key="runs/x/gpu.json",
        deadline=0,
    )
    returned = Returned(
        {
            ("m", "rebuilt"): ok(rebuilt, "v/rebuilt.onnx"),
            ("m", "moved"): ok(request("m", "moved", source=OTHER), "v/moved.onnx"),
        },
        {("m", "same")},
        None,
    )
    outcomes, problems = pool_outcomes(sent, returned)
    assert [o.key[1] for o in outcomes] == ["rebuilt", "moved", "lost", "new"]
    status = {o.key[1]: (o.result.status, o.publish) for o in outcomes}
    assert status == {
        "rebuilt": ("ok", True),
        "moved": ("failed", True),  # not a build of the source this run planned
        "lost": ("failed", False),  # undecided: the manifest keeps its entry
        "new": ("failed", True),
    }
    assert len(problems) == 3 and all(p.startswith("m × ") for p in problems)
    assert "on work pool gpu: flow run None reported no outcome" in problems[0]

    down, why = pool_outcomes(sent, nothing_returned("the pool is down"))
    assert [o.result.error for o in down] == ["the pool is down"] * 5
    assert all(p.endswith(": the pool is down") for p in why)


def test_hand_over_keys_name_their_run_and_time_and_old_ones_are_abandoned() -> None:
    run = uuid4()
    made = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
    key = results_key(attempt_name(run, 2, made.timestamp()), "gpu")
    assert key == f"runs/{run}-2-{int(made.timestamp())}/gpu.json"
    assert parse_results_key(key) == (run, made)
    assert parse_results_key(results_key(attempt_name("local", 1, 0), "gpu")) is None

    hour = timedelta(hours=1)
    later = made + timedelta(hours=2)
    assert abandoned(made, True, True, made, later, hour)  # ended over an hour ago
    assert not abandoned(made, True, False, None, later, hour)  # still running
    assert not abandoned(made, False, False, None, later, hour)  # unknown: a day's grace
    assert abandoned(made, False, False, None, later + timedelta(days=1), hour)
