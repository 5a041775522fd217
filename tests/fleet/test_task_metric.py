"""Task metrics in verification, on the real verification path (ORT's CPU EP, in this
process): a variant within the numeric tolerance that changes what users see is refused
when its model names a metric; the record keeps what it scored and what its relative
error divided by; a custom metric runs where verification runs; a metric joins the
fingerprint and the verification cache's key only when named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from epfleet.fleet.build.verify import VerifyJob, run_verification
from epfleet.fleet.build.verify_cache import CACHE_VERSION, VerifyKey, verification_key
from epfleet.formats.task_metric import MetricSpec
from epfleet.hashing import sha256_bytes
from epfleet.runtime.requests import CompileRequest, fingerprinted
from epfleet.runtime.samples import write_golden
from tests.support.fragile import features, fragile_classifier

pytestmark = pytest.mark.fast

ARGMAX = MetricSpec(kind="argmax_agreement", min=0.99)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A source, its golden samples, and a 'variant' that moves one logit by 0.04: 0.25 %
    of the logits' range, but the top class of many rows changes."""
    root = tmp_path_factory.mktemp("fragile")
    source = fragile_classifier(root / "source.onnx")
    variant = fragile_classifier(root / "variant.onnx", margin=-0.02)
    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    samples = [{"x": x} for x in features(1, 16)]
    write_golden(root / "golden.npz", samples, [session.run(None, s) for s in samples])
    return variant, root / "golden.npz"


def job(fleet: tuple[Path, Path], **fields: object) -> VerifyJob:
    variant, golden = fleet
    return VerifyJob.model_validate(
        {
            "label": "fragile × x86-cpu",
            "artifact_path": str(variant),
            "golden_path": str(golden),
            "ep": "CPUExecutionProvider",
            "device": "cpu",
            "provider_options": {},
            "tolerance": 0.05,
            "abs_tolerance": 0.001,
        }
        | fields
    )


def test_the_numeric_gate_alone_passes_a_variant_that_flips_classes(fleet) -> None:
    check = run_verification(job(fleet))
    assert check.status == "passed", check.reason
    assert check.max_rel_error is not None and check.max_rel_error < 0.01
    assert check.top1_agreement is not None and check.top1_agreement < 0.9
    assert check.metric is None
    # What the relative error divided by, and the tail beside the maximum.
    assert check.worst_output == "logits"
    assert check.error_range is not None and 10 < check.error_range < 30
    assert check.error_floor is not None and check.error_floor < 1e-5
    assert check.tail_abs_error is not None and 0 < check.tail_abs_error <= check.max_abs_error


def test_a_named_metric_refuses_it_and_records_the_score(fleet) -> None:
    check = run_verification(job(fleet, metric=ARGMAX))
    assert check.status == "failed"
    assert check.metric is not None and check.metric.value is not None
    assert check.metric.value < 0.9 and not check.metric.passed
    assert check.metric.output == "logits"
    assert check.reason is not None
    assert check.reason.startswith(f"task metric argmax_agreement {check.metric.value:.4g}")
    assert "(min 0.99) on output 'logits' over 16 sample(s)" in check.reason
    lenient = run_verification(job(fleet, metric=ARGMAX.model_copy(update={"min": 0.0})))
    assert lenient.status == "passed" and lenient.metric is not None and lenient.metric.passed


def test_a_metric_that_cannot_be_measured_fails_the_variant(fleet) -> None:
    wrong = run_verification(job(fleet, metric=ARGMAX.model_copy(update={"output": "probs"})))
    assert wrong.status == "failed"
    assert wrong.reason == (
        "task metric argmax_agreement ≥ 0.99 on 'probs' not measured: the metric names output "
        "'probs'; the model's outputs are 'logits'"
    )
    custom = MetricSpec(kind="custom", min=1, function="tests.support.task_metrics:raises")
    broken = run_verification(job(fleet, metric=custom, metric_modules="tests.support"))
    assert broken.status == "failed" and broken.reason is not None
    assert "not measured: the reader's vocabulary file is missing" in broken.reason


def test_a_custom_metric_runs_in_the_verification(fleet) -> None:
    custom = MetricSpec(kind="custom", min=1, function="tests.support.task_metrics:rounded_match")
    refused = run_verification(job(fleet, metric=custom))
    assert refused.status == "failed" and refused.reason is not None
    assert "is not among the modules this host lets specs call" in refused.reason
    check = run_verification(job(fleet, metric=custom, metric_modules="tests.support"))
    assert check.metric is not None and check.metric.function == custom.function
    assert check.status == ("passed" if check.metric.value == 1 else "failed")


def test_a_twin_is_judged_by_its_representative(fleet) -> None:
    """A twin runs one golden sample: a share over one sample is no measure, so its metric
    is its representative's (verified on every sample with the same metric)."""
    check = run_verification(job(fleet, metric=ARGMAX, twin_of="sd8g3"))
    assert check.samples == 1 and check.twin_of == "sd8g3"
    assert check.metric is None and check.status == "passed"


def request(**fields: object) -> CompileRequest:
    return CompileRequest.model_validate(
        {
            "model": "m",
            "target": "t",
            "ep": "CPUExecutionProvider",
            "device": "cpu",
            "provider_options": {},
            "input_shapes": {},
            "source_key": "sources/a.onnx",
            "source_sha256": "a" * 64,
            "source_size": 1,
            "fingerprint": "",
        }
        | fields
    )


def test_a_metric_joins_the_fingerprint_and_the_cache_key_only_when_named() -> None:
    plain = fingerprinted(request(), "1.32.0", {"package": "onnxruntime"}).fingerprint
    again = fingerprinted(request(metric=None), "1.32.0", {"package": "onnxruntime"}).fingerprint
    judged = fingerprinted(request(metric=ARGMAX), "1.32.0", {"package": "onnxruntime"})
    stricter = fingerprinted(
        request(metric=ARGMAX.model_copy(update={"min": 0.999})), "1.32.0", {}
    ).fingerprint
    assert plain == again != judged.fingerprint != stricter
    key = {
        "artifact": [("model.onnx", "b" * 64, 2)],
        "samples_sha256": "c" * 64,
        "ep": "CPUExecutionProvider",
        "ep_build": {},
        "ort_version": "1.32.0",
        "device": "cpu",
        "provider_options": {},
        "tolerance": 0.05,
        "abs_tolerance": 0.001,
        "verify_timeout": 600.0,
    }
    unnamed = verification_key(VerifyKey.model_validate(key))
    named = verification_key(VerifyKey.model_validate(key | {"metric": ARGMAX}))
    assert unnamed != named
    # the key of a variant verified by the numeric gate alone is the one written before metrics
    before = {"version": CACHE_VERSION, **key, "artifact": [["model.onnx", "b" * 64, 2]]}
    assert unnamed == sha256_bytes(
        json.dumps(before, sort_keys=True, separators=(",", ":")).encode()
    )


def test_a_device_measures_the_metric_again_on_its_own_ep(fleet) -> None:
    """The compile host measured the metric on its backend; the device's health check
    measures it again on the device's EP before activating (a custom one, whose package
    a device need not have, is left to the compile host)."""
    from epfleet.device.health import HealthJob, check_health
    from epfleet.errors import HealthCheckError
    from epfleet.formats.task_metric import TaskMetric
    from eps.base import Tolerance

    variant, golden = fleet
    recorded = TaskMetric(kind="argmax_agreement", output="logits", value=1.0, min=0.99)
    health = HealthJob(
        label="fragile/x86-cpu",
        path=str(variant),
        ep="CPUExecutionProvider",
        device="cpu",
        provider_options={},
        input_shapes={},
        golden_path=str(golden),
        tolerance=Tolerance(relative=0.05, absolute=0.001),
    )
    assert check_health(health).samples == 16
    with pytest.raises(HealthCheckError) as refused:
        check_health(health.model_copy(update={"metric": recorded}))
    assert str(refused.value).startswith("fragile/x86-cpu on its golden samples: task metric ")
    assert "(min 0.99) on output 'logits' (the compile host measured 1); not activated" in str(
        refused.value
    )
    custom = recorded.model_copy(update={"kind": "custom", "function": "absent.pkg:score"})
    assert check_health(health.model_copy(update={"metric": custom})).samples == 16


def test_a_spec_naming_a_function_the_host_does_not_allow_is_refused_before_compiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from epfleet.errors import BadInputError
    from epfleet.fleet.planning.plan import plan_run
    from tests.support.specs import CPU_TARGET, write_spec

    fragile_classifier(tmp_path / "fragile.onnx")
    metric = {"kind": "custom", "min": 1, "function": "os:system"}
    model = {"name": "fragile", "source": "fragile.onnx", "metric": metric}
    spec = write_spec(tmp_path, [model], [CPU_TARGET])
    monkeypatch.delenv("EPFLEET_METRIC_MODULES", raising=False)
    with pytest.raises(BadInputError) as refused:
        plan_run(spec, str(tmp_path / "store"))
    assert str(refused.value).startswith(
        "models[fragile]: metric function os:system: module 'os' is not among the modules"
    )
    assert not (tmp_path / "store").exists()


def test_the_record_keeps_a_time_axis_and_scores_whole_strings() -> None:
    """A time-major CTC head ([T, 1, C], as ddddocr's): the record carries ``time_axis`` (a
    device measures the same again), and a misread character fails its whole string."""
    from epfleet.fleet.build.verify import Evidence, scored

    source = np.zeros((3, 1, 4), np.float32)
    source[np.arange(3), 0, [1, 2, 3]] = 1
    misread = source.copy()
    misread[2, 0] = [0, 0, 1, 0]
    spec = MetricSpec(kind="sequence_match", blank=0, time_axis=0, min=0.99)
    record, why = scored(spec, ["387"], Evidence([[misread], [source]], [[source], [source]]))
    assert record.time_axis == 0 and record.spec() == spec.model_copy(update={"output": "387"})
    assert record.value == 0.5 and why is not None and "1/2 = 0.5 [" in why
    assert (record.hits, record.trials, record.inputs) == (1, 2, {"samples": 2})
