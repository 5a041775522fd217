"""With no metric named, an integer variant's class-score outputs are judged by what they
decide (the rule is pure; the verification runs for real on ORT's CPU EP, in this process):
a variant within the numeric tolerance that flips 2 of 16 decisions is refused, naming the
default and how to name a metric instead; fp16 variants and other outputs stay numeric."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from epfleet.fleet.build.decision_rules import (
    DEFAULT_DECISION_MIN,
    class_scores,
    decision_metric,
    judged_by_default,
)
from epfleet.fleet.build.verify import VerifyJob, class_score_outputs, run_verification
from epfleet.runtime.samples import write_golden

pytestmark = pytest.mark.fast

CLASSES = 4


def test_what_holds_class_scores() -> None:
    assert class_scores("logits", None, None, None)
    assert class_scores("char_Logits:0", "MatMul", None, 3)
    assert class_scores("probs", "Softmax", -1, 2)
    assert class_scores("probs", "LogSoftmax", 2, 3)
    assert not class_scores("probs", "Softmax", 1, 4)  # over channels: not the last axis
    assert not class_scores("probs", "Sigmoid", -1, 2)
    assert not class_scores("boxes", "Concat", None, 3)


def test_which_shapes_hold_decisions() -> None:
    rows = decision_metric("logits", (1, 4))
    assert rows is not None and rows.kind == "argmax_agreement"
    assert rows.min == DEFAULT_DECISION_MIN == 0.97
    time_major = decision_metric("logits", (20, 1, 37))  # a CTC head, [T, 1, C]
    assert time_major is not None and time_major.kind == "sequence_match"
    assert time_major.time_axis == 0 and time_major.blank is None
    batch_major = decision_metric("logits", (1, 20, 37))
    assert batch_major is not None and batch_major.time_axis is None
    assert decision_metric("logits", (1, 1)) is None  # one class decides nothing
    assert decision_metric("logits", (8,)) is None
    assert decision_metric("masks", (1, 3, 32, 32)) is None


def test_only_integer_rungs_of_models_without_a_metric() -> None:
    assert judged_by_default("w8a8", named_metric=False)
    assert judged_by_default("w8a16", named_metric=False)
    assert not judged_by_default("w8a8", named_metric=True)
    assert not judged_by_default("fp16", named_metric=False)
    assert not judged_by_default(None, named_metric=False)
    assert not judged_by_default("w8a8", named_metric=False, default_on=False)  # kind: none


def linear_heads(path: Path) -> Path:
    """Four outputs: a CTC head that leaves its Softmax to the caller (MatMul, bias Add,
    Reshape to a time-major [T, 1, C], named by a number as exporters do), a Gemm's
    [1, 8] that may be an embedding, a Sigmoid's, and a Gemm's [1, 8] named logits."""
    steps, features, classes = 20, 6, 37
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["mm"]),
            helper.make_node("Add", ["b", "mm"], ["biased"]),
            helper.make_node("Reshape", ["biased", "shape"], ["387"]),
            helper.make_node("Gemm", ["pooled", "w2"], ["embedding"]),
            helper.make_node("Sigmoid", ["embedding"], ["gate"]),
            helper.make_node("Gemm", ["pooled", "w2"], ["logits"]),
        ],
        "heads",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, features]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, features]),
        ],
        [
            helper.make_tensor_value_info("387", TensorProto.FLOAT, [1, "seqlen"]),  # as shipped
            helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, 8]),
            helper.make_tensor_value_info("gate", TensorProto.FLOAT, [1, 8]),
            helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 8]),
        ],
        [
            numpy_helper.from_array(np.ones((features, classes), np.float32), "w"),
            numpy_helper.from_array(np.zeros(classes, np.float32), "b"),
            numpy_helper.from_array(np.array([steps, 1, classes], np.int64), "shape"),
            numpy_helper.from_array(np.ones((features, 8), np.float32), "w2"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_linear_head_of_three_axes_is_judged_by_its_paths(tmp_path: Path) -> None:
    """ddddocr's reader ends in Gemm and Reshape to [T, 1, 8210], output '387', and its
    graph declares [1, seqlen]: the rule follows the graph, the shape is the one it gives."""
    found = class_score_outputs(str(linear_heads(tmp_path / "heads.onnx")))
    # a linear head named like logits holds class scores by its name, whatever its axes
    assert found == [("387", True), ("embedding", True), ("logits", False)]
    ctc = decision_metric("387", (20, 1, 37), linear_head=True)
    assert ctc is not None and ctc.kind == "sequence_match" and ctc.time_axis == 0
    assert decision_metric("embedding", (1, 8), linear_head=True) is None  # may embed
    assert decision_metric("logits", (1, 8)) is not None  # named so: class scores


def classifier(path: Path, shift: float, output: str = "logits", softmax: bool = False) -> Path:
    """x + [0, shift, 0, 0], then a Softmax when asked: a ``shift`` of 0.02 flips an input
    whose first two classes are 0.01 apart and no other."""
    bias = np.zeros((1, CLASSES), np.float32)
    bias[0, 1] = shift
    nodes = [helper.make_node("Add", ["x", "b"], ["scores" if softmax else output])]
    if softmax:
        nodes.append(helper.make_node("Softmax", ["scores"], [output], axis=-1))
    graph = helper.make_graph(
        nodes,
        "classifier",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CLASSES])],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, [1, CLASSES])],
        [numpy_helper.from_array(bias, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def verify(root: Path, close: int, **fields: object):
    output = str(fields.pop("output", "logits"))
    softmax = bool(fields.pop("softmax", False))
    source = classifier(root / "source.onnx", 0.0, output, softmax)
    rng = np.random.default_rng(0)
    samples = []
    for k in range(16):
        x = rng.uniform(-1, 0, (1, CLASSES)).astype(np.float32)
        x[0, 0], x[0, 1] = (0.5, 0.49) if k < close else (1.0, 0.0)
        samples.append({"x": x})
    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    write_golden(root / "golden.npz", samples, [session.run(None, s) for s in samples])
    job = VerifyJob.model_validate(
        {
            "label": "classifier × sd8g2",
            "artifact_path": str(classifier(root / "variant.onnx", 0.02, output, softmax)),
            "golden_path": str(root / "golden.npz"),
            "ep": "CPUExecutionProvider",
            "device": "cpu",
            "provider_options": {},
            "tolerance": 0.1,
            "abs_tolerance": 0.004,
            "source_path": str(source),
            "precision": "w8a8",
        }
        | fields
    )
    return run_verification(job)


def test_an_integer_rung_that_flips_decisions_is_refused_by_default(tmp_path: Path) -> None:
    check = verify(tmp_path, close=2)
    assert check.status == "failed" and check.metric is not None
    assert check.max_rel_error is not None and check.max_rel_error < 0.1  # numerically fine
    assert check.metric.default and check.metric.kind == "argmax_agreement"
    assert (check.metric.hits, check.metric.trials) == (14, 16)
    assert check.reason is not None and check.reason.startswith(
        "task metric argmax_agreement 14/16 = 0.875 ["
    )
    assert check.reason.endswith(
        "(the default for an integer variant's class scores, min 0.97: name the model's "
        "metric to judge it otherwise, or metric: {kind: none} to judge it by the numeric "
        "gate alone)"
    )
    assert check.metric.shown().endswith("on 16 inputs, undecided (default for class scores)")


def test_a_softmax_output_is_judged_and_a_clean_rung_passes(tmp_path: Path) -> None:
    assert class_score_outputs(str(classifier(tmp_path / "s.onnx", 0.0, "probs", True))) == [
        ("probs", False)
    ]
    flips = verify(tmp_path, close=1, output="probs", softmax=True)
    assert flips.status == "failed" and flips.metric is not None and flips.metric.hits == 15
    clean = verify(tmp_path, close=0, output="probs", softmax=True)
    assert clean.status == "passed" and clean.metric is not None and clean.metric.default
    assert clean.metric.value == 1.0


def test_fp16_and_outputs_without_class_scores_stay_numeric(tmp_path: Path) -> None:
    fp16 = verify(tmp_path, close=2, precision="fp16")
    assert fp16.status == "passed" and fp16.metric is None
    other = verify(tmp_path, close=2, output="y")
    assert other.status == "passed" and other.metric is None
    off = verify(tmp_path, close=2, decision_default=False)  # metric: {kind: none}
    assert off.status == "passed" and off.metric is None
    twin = verify(tmp_path, close=2, twin_of="sd8g3")
    assert twin.status == "passed" and twin.metric is None and twin.samples == 1
