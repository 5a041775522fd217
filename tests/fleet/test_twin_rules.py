"""Verification by distinct numerics (pure rules, no compile): which provider options an EP
module says change a variant's outputs, how a run's pairs fall into numerics groups (one
representative verified on every golden sample, twins on the first), the publish rule
that holds back a twin whose representative did not pass, and the compile host's cache
of full verifications by numerics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import eps
from epfleet import ort_version
from epfleet.fleet.build.verify_cache import (
    Backing,
    numerics_key_for,
    recalled,
    recalled_backing,
    remember,
    remember_backing,
)
from epfleet.fleet.planning.rules import PlannedPair
from epfleet.fleet.planning.twin_rules import HELD_BACK, assign_twins, group_key, hold_back
from epfleet.fleet.runs.models import PairResult
from epfleet.fleet.runs.outcomes import PairOutcome, failed_outcome
from epfleet.formats.manifest import ArtifactRef, SamplesRef, VariantEntry, Verification, utcnow
from epfleet.runtime.requests import CompileRequest, Rung

EP_MODULES = {name: eps.load(name) for name in eps.known()}

pytestmark = pytest.mark.fast

QNN = "QNNExecutionProvider"
SHA = "a" * 64
SAMPLES = SamplesRef(uri=f"samples/{SHA}.npz", sha256=SHA, size=10, count=3, basis="b")


def htp(arch: str, soc: str) -> dict[str, str]:
    return eps.load(QNN).with_precision(
        "fp16", {"backend_type": "htp", "htp_arch": arch, "soc_model": soc}
    )


def request(
    target: str, options: dict[str, str], model: str = "m", **fields: Any
) -> CompileRequest:
    values: dict[str, Any] = {
        "model": model,
        "target": target,
        "ep": QNN,
        "device": "npu",
        "provider_options": options,
        "input_shapes": {"x": [1, 3, 8, 8]},
        "source_key": f"sources/{SHA}.onnx",
        "source_sha256": SHA,
        "source_size": 10,
        "samples": SAMPLES,
        "precision": "fp16",
        "fingerprint": f"{model}-{target}",
    }
    return CompileRequest(**(values | fields))


def planned(req: CompileRequest, action: str = "compile", **fields: Any) -> PlannedPair:
    return PlannedPair(request=req, action=action, reason="test", **fields)  # type: ignore[arg-type]


def entry(
    req: CompileRequest,
    status: str = "ok",
    twin_of: str | None = None,
    error: str | None = None,
    verified: str = "passed",
    precision: str = "fp16",
) -> VariantEntry:
    ok = status == "ok"
    return VariantEntry(
        ep=req.ep,
        device=req.device,
        compatibility_string="s" if ok else None,
        artifact=ArtifactRef(uri=f"variants/{req.target}.onnx", sha256=SHA, size=3) if ok else None,
        ort_version=ort_version(),
        compiled_at=utcnow(),
        status=status,  # type: ignore[arg-type]
        error=error,
        source_sha256=SHA,
        fingerprint=req.fingerprint,
        precision=precision,  # type: ignore[arg-type]
        verification=Verification(
            status=verified,  # type: ignore[arg-type]
            samples=1 if twin_of else 3,
            max_rel_error=0.01,
            tolerance=0.05,
            twin_of=twin_of,
        ),
    )


def outcome(req: CompileRequest, built: VariantEntry, publish: bool = True) -> PairOutcome:
    status = "ok" if built.status == "ok" else "failed"
    result = PairResult.of(req, built, status, 1.0)  # type: ignore[arg-type]
    return PairOutcome(entry=built, result=result, publish=publish)


def test_qnn_counts_the_arch_family_with_its_reference_socs_as_one() -> None:
    qnn = eps.load(QNN)
    family = {
        str(qnn.numerics_options(htp(arch, soc)))
        for arch, soc in [("73", "43"), ("75", "57"), ("79", "69"), ("81", "87")]
    }
    assert len(family) == 1
    # A target naming the arch alone builds with its reference SoC (with_precision).
    assert str(qnn.numerics_options(htp("75", "57"))) in family
    assert htp("75", "57") == eps.load(QNN).with_precision("fp16", {"htp_arch": "75"}) | {
        "backend_type": "htp"
    }
    # v69 differs (measured), and so does another SoC of a family arch (v73 with SoC 53
    # computed v69's outputs); every other option still counts.
    for outside in [htp("69", "36"), htp("73", "53"), htp("73", "43") | {"vtcm_mb": "4"}]:
        assert str(qnn.numerics_options(outside)) not in family
    assert qnn.numerics_options(htp("73", "53")) == htp("73", "53")
    # Without a SoC (this host's backend then computes float graphs in fp32), and other
    # backends, every option counts.
    assert qnn.numerics_options({"htp_arch": "73"}) == {"htp_arch": "73"}
    gpu = {"backend_type": "gpu", "htp_arch": "73", "soc_model": "43"}
    assert qnn.numerics_options(gpu) == gpu


def test_other_eps_count_every_option() -> None:
    for name in ("CPUExecutionProvider", "OpenVINOExecutionProvider"):
        options = {"isa": "avx2"} if name.startswith("CPU") else {"device_type": "NPU"}
        assert eps.load(name).numerics_options(options) == options


def test_a_models_pairs_of_one_numerics_have_one_representative_first_in_spec_order() -> None:
    pairs = [
        planned(request("v75", htp("75", "57"))),
        planned(request("v73", htp("73", "43"))),
        planned(request("v69", htp("69", "36"))),
        planned(request("v81", htp("81", "87"))),
        planned(request("v73", htp("73", "43"), model="other")),
    ]
    twins = {
        (p.request.model, p.request.target): p.request.twin_of
        for p in assign_twins(pairs, EP_MODULES)
    }
    assert twins == {
        ("m", "v75"): None,
        ("m", "v73"): "v75",
        ("m", "v69"): None,
        ("m", "v81"): "v75",
        ("other", "v73"): None,
    }


@pytest.mark.parametrize(
    "change",
    [
        {"tolerance": 0.02},
        {"abs_tolerance": 0.01},
        {"precision": "w8a16"},
        {"graph_optimization": "all"},
        {"min_coverage": 1.0},
        {"input_shapes": {"x": [1, 3, 16, 16]}},
        {"source_sha256": "c" * 64},
        {"samples": SAMPLES.model_copy(update={"sha256": "d" * 64})},
        {
            "fallbacks": [
                Rung(precision="w8a8", provider_options={}, tolerance=0.1, abs_tolerance=0)
            ]
        },
    ],
)
def test_what_changes_outputs_or_their_check_keeps_targets_apart(change: dict[str, Any]) -> None:
    first = planned(request("v75", htp("75", "57")))
    second = planned(request("v73", htp("73", "43"), **change))
    assert group_key(first, EP_MODULES) is not None and group_key(first, EP_MODULES) != group_key(
        second, EP_MODULES
    )


def test_pairs_not_verified_without_samples_or_on_a_work_pool_are_verified_alone() -> None:
    alone = [
        planned(request("v73", htp("73", "43"), verify=False)),
        planned(request("v73", htp("73", "43"), samples=None)),
        planned(request("v73", htp("73", "43")), work_pool="gpu-pool"),
    ]
    assert [group_key(p, EP_MODULES) for p in alone] == [None, None, None]
    representative = planned(request("v75", htp("75", "57")))
    assert [p.request.twin_of for p in assign_twins([representative, *alone], EP_MODULES)] == [
        None
    ] * 4


def test_a_twin_held_back_is_planned_again_unless_its_representative_is_up_to_date_and_failed() -> (
    None
):
    rep, twin = request("v75", htp("75", "57")), request("v73", htp("73", "43"))
    held = entry(twin, "failed", twin_of="v75", error=f"{HELD_BACK}v75 failed: ...")
    skipped_twin = planned(twin, "skip", previous=held)

    compiling = assign_twins([planned(rep), skipped_twin], EP_MODULES)[1]
    assert compiling.action == "compile" and "held back for v75" in compiling.reason

    up_to_date_ok = planned(rep, "skip", previous=entry(rep))
    assert assign_twins([up_to_date_ok, skipped_twin], EP_MODULES)[1].action == "compile"

    failed = entry(rep, "failed", error="verification failed: output 0 ...", verified="failed")
    up_to_date_failed = planned(rep, "skip", previous=failed)
    assert assign_twins([up_to_date_failed, skipped_twin], EP_MODULES)[1].action == "skip"

    # No longer a twin (its representative left the spec): verified on its own.
    alone = assign_twins([skipped_twin], EP_MODULES)[0]
    assert alone.action == "compile" and "now verified on its own" in alone.reason

    # A twin that failed on its own (not held back) stays up to date, failed.
    own = entry(twin, "failed", error="verification failed: output 0 ...", verified="failed")
    assert (
        assign_twins([planned(rep), planned(twin, "skip", previous=own)], EP_MODULES)[1].action
        == "skip"
    )


def grouped(*pairs: PlannedPair) -> list[PlannedPair]:
    return assign_twins(list(pairs), EP_MODULES)


def test_a_twin_whose_representative_failed_is_held_back_naming_it() -> None:
    plan = grouped(
        planned(request("v75", htp("75", "57"))), planned(request("v73", htp("73", "43")))
    )
    rep, twin = plan[0].request, plan[1].request
    error = "verification failed: output 0 differs from the source by 37.2% of its range"
    failed = outcome(rep, entry(rep, "failed", error=error, verified="failed"))
    checked = outcome(twin, entry(twin, twin_of="v75"))

    settled = hold_back(plan, [failed, checked])
    assert settled[0] == failed
    held = settled[1]
    assert held.publish and held.result.status == "failed" and held.entry.status == "failed"
    assert held.entry.artifact is None and held.result.artifact_uri is None
    assert held.entry.error is not None and held.entry.error.startswith(HELD_BACK)
    assert "numerics twin of v75" in held.entry.error and error in held.entry.error
    # What its own check measured stays on record.
    assert held.entry.verification == checked.entry.verification

    # The same twin beside a representative that passed is published as it was.
    passed = outcome(rep, entry(rep))
    assert hold_back(plan, [passed, checked]) == [passed, checked]
    # A twin verified on every sample (a model with one golden sample) needs no one.
    full = outcome(twin, entry(twin))
    assert hold_back(plan, [failed, full]) == [failed, full]


def test_a_representative_up_to_date_counts_with_its_recorded_verification() -> None:
    rep_request, twin_request = request("v75", htp("75", "57")), request("v73", htp("73", "43"))
    checked = outcome(twin_request, entry(twin_request, twin_of="v75"))
    up_to_date = grouped(
        planned(rep_request, "skip", previous=entry(rep_request)), planned(twin_request)
    )
    assert hold_back(up_to_date, [checked]) == [checked]

    failed_before = entry(
        rep_request, "failed", error="verification failed: ...", verified="failed"
    )
    plan = grouped(planned(rep_request, "skip", previous=failed_before), planned(twin_request))
    [held] = hold_back(plan, [checked])
    assert held.result.status == "failed" and "v75 failed: verification failed" in (
        held.entry.error or ""
    )


def test_a_representative_at_another_precision_or_undecided_holds_its_twin_back() -> None:
    plan = grouped(
        planned(request("v75", htp("75", "57"))), planned(request("v73", htp("73", "43")))
    )
    rep, twin = plan[0].request, plan[1].request
    checked = outcome(twin, entry(twin, twin_of="v75"))

    # Its ladder's fp16 failed on the representative, which passed at w8a16: the twin's
    # one-sample check at fp16 does not make its fp16 variant verified.
    lower = outcome(rep, entry(rep, precision="w8a16"))
    [_, held] = hold_back(plan, [lower, checked])
    assert held.result.status == "failed" and "passed at w8a16, not at fp16" in (
        held.entry.error or ""
    )
    assert held.publish

    # A representative whose compile ended without a verdict (a store error): the twin is
    # reported failed but not recorded, so the next run tries both again.
    undecided = failed_outcome(rep, "the store refused the upload")
    undecided.publish = False
    [_, held] = hold_back(plan, [undecided, checked])
    assert held.result.status == "failed" and not held.publish
    assert "was not decided in this run: the store refused the upload" in (held.entry.error or "")


def test_only_a_pass_on_every_sample_vouches_for_later_builds_of_its_numerics(
    tmp_path: Path,
) -> None:
    full = Verification(status="passed", samples=3, max_rel_error=0.01, seconds=2.0)
    remember_backing(tmp_path, "k-full", "v75", full)
    assert recalled_backing(tmp_path, "k-full") == Backing(target="v75", verification=full)
    # A twin's check (its representative may still fail), a failure, a reused record: kept
    # under neither key.
    twin = full.model_copy(update={"samples": 1, "twin_of": "v75"})
    failed = full.model_copy(update={"status": "failed"})
    for key, verification in [("k-twin", twin), ("k-failed", failed)]:
        remember_backing(tmp_path, key, "v73", verification)
        remember(tmp_path, key, verification)
        assert recalled_backing(tmp_path, key) is None and recalled(tmp_path, key) is None
    (tmp_path / "numerics-k-full.json").write_text("{")
    assert recalled_backing(tmp_path, "k-full") is None


def test_the_numerics_key_follows_the_numerics_not_the_target() -> None:
    v75, v73 = request("v75", htp("75", "57")), request("v73", htp("73", "43"))
    assert numerics_key_for(v75) == numerics_key_for(v73)
    assert numerics_key_for(v75) != numerics_key_for(request("v69", htp("69", "36")))
    assert numerics_key_for(v75) != numerics_key_for(
        request("v75", htp("75", "57"), tolerance=0.01)
    )
