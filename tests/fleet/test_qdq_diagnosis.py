"""The diagnosis a failed integer variant gets: how far its QDQ model itself is on the CPU
EP, measured on the quantised arithmetic as written, not on the integer kernels ORT's
optimiser fuses it into (which saturate on x86 without VNNI)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from epfleet.fleet.build.verify import VerifyJob, qdq_on_cpu
from epfleet.runtime.samples import compare

pytestmark = pytest.mark.fast

CHANNELS = 16


def saturating_qdq(tmp_path: Path) -> tuple[Path, list[dict[str, np.ndarray]], list[list]]:
    """A 1x1 Conv whose inputs quantise near 255 and weights near 127 (w8a8, per-channel):
    each pair of u8*s8 products sums past what VPMADDUBSW's int16 holds (2 x 255 x 127)."""
    rng = np.random.default_rng(0)
    weights = np.abs(rng.normal(1, 0.05, (8, CHANNELS, 1, 1))).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"])],
        "saturating",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 4, 4])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    source, qdq = tmp_path / "source.onnx", tmp_path / "qdq.onnx"
    onnx.save(model, str(source))
    samples = [
        {"x": rng.uniform(0.9, 1.0, (1, CHANNELS, 4, 4)).astype(np.float32)} for _ in range(4)
    ]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(samples)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.left, None)

    quantize_static(
        str(source),
        str(qdq),
        Reader(),
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        per_channel=True,
    )
    session = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"])
    return qdq, samples, [session.run(None, s) for s in samples]


def test_the_qdq_model_is_judged_on_its_arithmetic_not_on_fused_kernels(tmp_path: Path) -> None:
    qdq, samples, reference = saturating_qdq(tmp_path)
    job = VerifyJob(
        label="m x htp",
        artifact_path=str(qdq),
        golden_path="",
        ep="QNNExecutionProvider",
        device="npu",
        provider_options={},
        tolerance=0.10,
        abs_tolerance=0.004,
        qdq_path=str(qdq),
    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    as_written = ort.InferenceSession(str(qdq), options, providers=["CPUExecutionProvider"])
    simulated = compare([as_written.run(None, s) for s in samples], reference).max_rel_error
    assert simulated < 0.10  # 8-bit quantisation of this Conv costs a few % of its range

    said = qdq_on_cpu(job, samples, reference)

    assert f"the QDQ model itself is {simulated:.1%} off on the CPU EP, within tolerance" in said
    assert "the loss is in how QNNExecutionProvider executes it" in said
