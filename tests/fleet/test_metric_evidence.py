"""Every real input counts, weighed against the evidence, on the real verification path
(ORT's CPU EP, in this process): a model that names a metric has an input sets file beside
its golden samples, holding its calibration and verification inputs, and a rate metric is judged over
them in batches until its bounds settle the verdict, the record saying how many inputs of
each set it rests on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from epfleet.fleet.build.verify import GoldenJob, VerifyJob, make_golden, run_verification
from epfleet.formats.task_metric import MetricSpec
from epfleet.runtime.samples import (
    InputSet,
    read_golden,
    read_input_sets,
    write_golden,
    write_input_sets,
)

pytestmark = pytest.mark.fast

CLASSES = 4
ARGMAX = MetricSpec(kind="argmax_agreement", min=0.99)


def shifted_classifier(path: Path, shift: float) -> Path:
    """logits = x + [0, shift, 0, 0]: with ``shift`` 0.02 it flips an input whose two
    first classes are 0.01 apart (a 'close' input) and no other."""
    bias = np.zeros((1, CLASSES), np.float32)
    bias[0, 1] = shift
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["logits"])],
        "shifted",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CLASSES])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])],
        [numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def inputs(clear: int, close: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``close`` inputs the shifted variant misreads first, then ``clear`` ones it keeps."""
    rng = np.random.default_rng(seed)
    made = []
    for k in range(close + clear):
        x = rng.uniform(-1, 0, (1, CLASSES)).astype(np.float32)
        x[0, 0], x[0, 1] = (0.5, 0.49) if k < close else (1.0, 0.0)
        made.append({"x": x})
    return made


def golden(root: Path, samples: list, **sets: list) -> dict[str, str]:
    """The golden file and, given sets, the input sets file: a job's paths."""
    source = shifted_classifier(root / "source.onnx", 0.0)
    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    path = root / "golden.npz"
    write_golden(path, samples, [session.run(None, s) for s in samples])
    if not sets:
        return {"golden_path": str(path)}
    made = [
        InputSet(name, given, [session.run(None, s) for s in given]) for name, given in sets.items()
    ]
    write_input_sets(root / "sets.npz", made)
    return {"golden_path": str(path), "sets_path": str(root / "sets.npz")}


def job(root: Path, paths: dict[str, str], **fields: object) -> VerifyJob:
    return VerifyJob.model_validate(
        paths
        | {
            "label": "shifted × x86-cpu",
            "artifact_path": str(shifted_classifier(root / "variant.onnx", 0.02)),
            "ep": "CPUExecutionProvider",
            "device": "cpu",
            "provider_options": {},
            "tolerance": 0.05,
            "abs_tolerance": 0.001,
            "metric": ARGMAX,
        }
        | fields
    )


def test_twelve_clean_samples_cannot_show_the_minimum_and_say_so(tmp_path: Path) -> None:
    check = run_verification(job(tmp_path, golden(tmp_path, inputs(11, 1, 0))))
    assert check.status == "failed" and check.metric is not None
    assert (check.metric.hits, check.metric.trials, check.metric.evidence) == (11, 12, "undecided")
    assert check.metric.inputs == {"samples": 12}
    assert check.reason == (
        "task metric argmax_agreement 11/12 = 0.917 [0.661, 0.996] (min 0.99) on output "
        "'logits' over 12 sample(s); argmax_agreement 11/12 = 0.917; 12 inputs cannot show "
        ">= 0.99 either way: about 299 all agreeing would show it reached, about 18 at this "
        "rate would show it missed; below its minimum, so refused"
    )
    clean = run_verification(job(tmp_path, golden(tmp_path, inputs(12, 0, 0))))
    assert clean.status == "passed" and clean.metric is not None
    assert clean.metric.evidence == "undecided" and clean.metric.shown() == (
        "argmax_agreement 12/12 = 1 [0.779, 1] (min 0.99) on 12 inputs, undecided"
    )


def test_the_calibration_inputs_run_until_the_minimum_is_shown(tmp_path: Path) -> None:
    """12 samples and 400 calibration inputs, all kept: the lower bound reaches 0.99 at 299
    agreeing inputs, so verification stops at the first batch boundary past it (12 + 18 x
    16 = 300) and leaves the other 112 unrun."""
    path = golden(tmp_path, inputs(12, 0, 0), calibration=inputs(400, 0, 1))
    check = run_verification(job(tmp_path, path))
    assert check.status == "passed", check.reason
    assert check.metric is not None and check.metric.evidence == "reaches"
    assert check.metric.inputs == {"samples": 12, "calibration": 288}
    assert (check.metric.hits, check.metric.trials) == (300, 300)
    assert check.metric.low is not None and check.metric.low >= 0.99
    assert check.samples == 12  # the numeric gate is judged on the golden samples


def test_a_miss_among_the_calibration_inputs_refuses_the_rung(tmp_path: Path) -> None:
    """Clean on its 12 samples (undecided), the variant misreads 4 of the first 16
    calibration inputs: the bounds show it below 0.99 and the other sets are not run."""
    path = golden(
        tmp_path,
        inputs(12, 0, 0),
        calibration=inputs(60, 4, 1),
        verification=inputs(64, 0, 2),
    )
    check = run_verification(job(tmp_path, path))
    assert check.status == "failed" and check.metric is not None
    assert check.metric.evidence == "misses"
    assert check.metric.inputs == {"samples": 12, "calibration": 16}
    assert check.reason is not None and check.reason.startswith(
        "task metric argmax_agreement 24/28 = 0.857 ["
    )
    assert "over 28 input(s) (12 samples, 16 calibration)" in check.reason
    assert "cannot show" not in check.reason  # settled: no more inputs would change it


def test_the_verification_set_is_judged_after_the_calibration_set(tmp_path: Path) -> None:
    path = golden(
        tmp_path, inputs(12, 0, 0), calibration=inputs(20, 0, 1), verification=inputs(28, 4, 2)
    )
    check = run_verification(job(tmp_path, path))
    assert check.status == "failed" and check.metric is not None
    assert check.metric.inputs == {"samples": 12, "calibration": 20, "verification": 16}
    assert check.metric.evidence == "misses"


def test_a_variant_the_tolerance_refuses_runs_no_further_set(tmp_path: Path) -> None:
    path = golden(tmp_path, inputs(12, 0, 0), calibration=inputs(64, 0, 1))
    check = run_verification(job(tmp_path, path, tolerance=0.001, abs_tolerance=0.0))
    assert check.status == "failed" and check.metric is not None
    assert check.metric.inputs == {"samples": 12}
    assert check.reason is not None and check.reason.startswith("output 0 differs")


def test_without_a_metric_a_float_variant_runs_only_the_samples(tmp_path: Path) -> None:
    path = golden(tmp_path, inputs(11, 1, 0), calibration=inputs(64, 0, 1))
    check = run_verification(job(tmp_path, path, metric=None))
    assert check.status == "passed" and check.metric is None and check.samples == 12


def test_the_default_for_class_scores_is_judged_on_the_calibration_inputs(
    tmp_path: Path,
) -> None:
    """An integer rung of a model that names no metric: 16 clean samples cannot refuse it,
    the calibration inputs do (4 flips in the first batch show it below 0.97), and stop
    there; a clean one runs every input (80 clean cannot show 0.97: that takes 99) and
    passes on the point value; ``metric: {kind: none}`` judges it by the numeric gate."""
    default = {"metric": None, "precision": "w8a8", "source_path": str(tmp_path / "source.onnx")}
    path = golden(tmp_path, inputs(16, 0, 0), calibration=inputs(60, 4, 1))
    check = run_verification(job(tmp_path, path, **default))
    assert check.status == "failed" and check.metric is not None and check.metric.default
    assert check.metric.inputs == {"samples": 16, "calibration": 16}
    assert (check.metric.hits, check.metric.trials, check.metric.evidence) == (28, 32, "misses")
    assert check.reason is not None and "over 32 input(s) (16 samples, 16 calibration)" in (
        check.reason
    )
    off = run_verification(job(tmp_path, path, decision_default=False, **default))
    assert off.status == "passed" and off.metric is None
    path = golden(tmp_path, inputs(16, 0, 0), calibration=inputs(64, 0, 1))
    clean = run_verification(job(tmp_path, path, **default))
    assert clean.status == "passed" and clean.metric is not None
    assert clean.metric.inputs == {"samples": 16, "calibration": 64}
    assert clean.metric.evidence == "undecided"


def test_the_input_sets_file_holds_each_input_once(tmp_path: Path) -> None:
    """Calibration inputs already among the samples, or repeated, count once; the golden
    file holds the samples alone, as before (devices read it)."""
    source = shifted_classifier(tmp_path / "source.onnx", 0.0)
    samples = inputs(3, 0, 0)
    calibration = inputs(5, 0, 1)
    np.savez(tmp_path / "samples.npz", x=np.stack([s["x"] for s in samples]))
    given = [*calibration, samples[0], calibration[0]]
    np.savez(tmp_path / "calibration.npz", x=np.stack([s["x"] for s in given]))
    np.savez(tmp_path / "verification.npz", x=np.stack([s["x"] for s in inputs(2, 1, 2)]))
    job = GoldenJob(
        source_path=str(source),
        input_shapes={},
        samples_path=str(tmp_path / "samples.npz"),
        dest=str(tmp_path / "golden.npz"),
        sets_dest=str(tmp_path / "sets.npz"),
        sets={
            "verification": str(tmp_path / "verification.npz"),
            "calibration": str(tmp_path / "calibration.npz"),
        },
    )
    assert make_golden(job) == 3
    read_samples, read_outputs = read_golden(tmp_path / "golden.npz")
    assert len(read_samples) == len(read_outputs) == 3
    sets = read_input_sets(tmp_path / "sets.npz")
    assert [(s.name, len(s.inputs), len(s.outputs)) for s in sets] == [
        ("calibration", 5, 5),
        ("verification", 3, 3),
    ]
    np.testing.assert_array_equal(sets[0].outputs[4][0], calibration[4]["x"])
    with pytest.raises(ValueError, match="not a golden samples file"):
        read_golden(tmp_path / "sets.npz")


def test_planning_stores_the_calibration_and_verification_inputs_for_the_metric(
    tmp_path: Path,
) -> None:
    """Into the input sets file, for a model that names a metric or leaves the default for
    class scores on, not for one that turns judging off (``metric: {kind: none}``: they
    would cost runs and judge nothing); the golden file is the same either way."""
    from epfleet.fleet.planning.plan import plan_run
    from tests.support.specs import CPU_TARGET, write_spec

    shifted_classifier(tmp_path / "m.onnx", 0.0)
    for name, made in [
        ("samples", inputs(4, 0, 0)),
        ("calibration", inputs(10, 0, 1)),
        ("verification", inputs(6, 0, 2)),
    ]:
        np.savez(tmp_path / f"{name}.npz", x=np.stack([s["x"] for s in made]))
    model = {
        "name": "m",
        "source": "m.onnx",
        "samples": "samples.npz",
        "calibration": "calibration.npz",
        "verification": "verification.npz",
    }
    judged = {**model, "name": "judged", "metric": {"kind": "argmax_agreement", "min": 0.99}}
    default = {**model, "name": "default"}
    model["metric"] = {"kind": "none"}
    spec = write_spec(tmp_path, [model, judged, default], [CPU_TARGET])
    plan = plan_run(spec, str(tmp_path / "store"))
    plain, weighed = plan.samples["m"], plan.samples["judged"]
    assert plain is not None and weighed is not None
    assert plain.metric_inputs is None and weighed.metric_inputs is not None
    by_default = plan.samples["default"]
    assert by_default is not None and by_default.metric_inputs == weighed.metric_inputs
    assert weighed.sha256 == plain.sha256 and weighed.count == plain.count == 4
    assert weighed.basis != plain.basis  # the pairs' fingerprints change
    sets = read_input_sets(tmp_path / "store" / weighed.metric_inputs.uri)
    assert [(s.name, len(s.inputs)) for s in sets] == [("calibration", 10), ("verification", 6)]


def test_a_compile_records_and_shows_what_its_metric_rests_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Planned, compiled, verified and published in this process (the plain runner): the
    CPU variant agrees on all 4 samples and 20 calibration inputs; 24 cannot show 0.99, so
    the point value publishes it, and the record and ``manifest show`` say so."""
    from epfleet.cli.app import main
    from epfleet.formats.manifest import Manifest
    from tests.support.plain_fleet import compile_spec
    from tests.support.specs import CPU_TARGET, write_spec

    shifted_classifier(tmp_path / "m.onnx", 0.0)
    for name, made in [("samples", inputs(4, 0, 0)), ("calibration", inputs(20, 0, 1))]:
        np.savez(tmp_path / f"{name}.npz", x=np.stack([s["x"] for s in made]))
    model = {
        "name": "m",
        "source": "m.onnx",
        "samples": "samples.npz",
        "calibration": "calibration.npz",
        "metric": {"kind": "argmax_agreement", "min": 0.99},
    }
    store = tmp_path / "store"
    report = compile_spec(write_spec(tmp_path, [model], [CPU_TARGET]), store, tmp_path / "cache")
    assert report.exit_code == 0, [r.error for r in report.variants]
    shown = "argmax_agreement 24/24 = 1 [0.882, 1] (min 0.99) on 24 inputs, undecided"
    assert [r.metric for r in report.variants] == [shown]
    check = Manifest.from_json((store / "manifest.json").read_bytes()).models["m"]
    metric = check.variants["x86-cpu"].verification.metric  # type: ignore[union-attr]
    assert metric is not None and metric.inputs == {"samples": 4, "calibration": 20}
    capsys.readouterr()
    assert main(["manifest", "show", "--store", str(store)]) == 0
    assert shown in capsys.readouterr().out
