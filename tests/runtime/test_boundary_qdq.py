"""QDQ variants for QNN HTP and the (de)quantisation at their edges, with real ORT quantisation
and QNN compiles: ``QuantizeLinear -> EPContext -> DequantizeLinear`` leaves the input's
Quantize and the output's Dequantize on ORT's CPU EP, so the variant does not load with CPU
fallback disabled, and its coverage says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from epfleet.runtime.compiler import measure_coverage, optimized_node_count
from epfleet.runtime.quantize import fold_boundary_qdq

pytestmark = pytest.mark.slow

V75 = {"backend_type": "htp", "htp_arch": "75", "soc_model": "57"}
SHAPE = [1, 3, 8, 8]

LOAD = """
import json, sys
import numpy as np, onnxruntime as ort, onnxruntime_qnn
path, options, feed, fallback = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
session_options = ort.SessionOptions()
session_options.add_provider_for_devices(devices, options)
session_options.add_session_config_entry("session.disable_cpu_ep_fallback", fallback)
try:
    session = ort.InferenceSession(path, session_options)
except Exception as exc:
    print(json.dumps({"loaded": False, "error": str(exc)}))
    sys.exit(0)
outputs = session.run(None, dict(np.load(feed))) if feed else []
print(json.dumps({"loaded": True, "outputs": [o.tolist() for o in outputs],
                  "inputs": [i.type for i in session.get_inputs()]}))
"""


def conv_model(path: Path) -> Path:
    rng = np.random.default_rng(0)
    weights = rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(weights, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def qdq_model(tmp_path: Path, activation: str) -> Path:
    """The conv model quantised by ORT's QNN recipe (w8a8: QUInt8, w8a16: QUInt16)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    source = conv_model(tmp_path / "conv.onnx")
    rng = np.random.default_rng(1)
    inputs = [{"x": rng.uniform(0, 1, SHAPE).astype(np.float32)} for _ in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter(inputs)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.left, None)

    kind = {"w8a8": QuantType.QUInt8, "w8a16": QuantType.QUInt16}[activation]
    config = get_qnn_qdq_config(str(source), Reader(), activation_type=kind)
    dst = tmp_path / f"conv.{activation}.qdq.onnx"
    quantize(str(source), str(dst), config)
    return dst


BUILD = """
import json, sys
from pathlib import Path
import eps
src, dst, options = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
eps.load("QNNExecutionProvider").build(src, dst, options, "npu", "basic")
"""


def compile_htp(src: Path, dst: Path) -> onnx.ModelProto:
    """The QNN compile in a process of its own, as epfleet's compile workers run it: in
    the test process it leaves the QNN plugin registered for compiling, and a later test
    there that asks ORT to judge a QNN string got EP_NOT_APPLICABLE or crashed."""
    done = subprocess.run(
        [sys.executable, "-c", BUILD, str(src), str(dst), json.dumps(V75)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return onnx.load(str(dst))


def load_without_cpu_fallback(path: Path, feed: Path | None = None, disable: str = "1") -> dict:
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(path), json.dumps(V75), str(feed or ""), disable],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("activation", ["w8a8", "w8a16"])
def test_boundary_qdq_is_left_to_the_cpu_and_coverage_says_so(
    tmp_path: Path, activation: str
) -> None:
    qdq = qdq_model(tmp_path, activation)
    variant = compile_htp(qdq, tmp_path / "variant.onnx")
    assert [n.op_type for n in variant.graph.node] == [
        "QuantizeLinear",
        "EPContext",
        "DequantizeLinear",
    ]

    coverage = measure_coverage(variant, True, lambda: optimized_node_count(qdq, "basic"))
    assert coverage.boundary_qdq == 2 and coverage.other_nodes == 2
    assert coverage.other_op_types == ["DequantizeLinear", "QuantizeLinear"]
    assert 0 < coverage.fraction < 1.0, coverage  # not a full compile

    # Measured: ORT refuses the session, the Q/DQ being assigned to the CPU EP.
    loaded = load_without_cpu_fallback(tmp_path / "variant.onnx")
    assert not loaded["loaded"]
    assert "fallback to CPU EP has been explicitly disabled" in loaded["error"]


@pytest.mark.parametrize("activation", ["w8a8", "w8a16"])
def test_folding_the_boundary_qdq_gives_a_full_variant_that_loads_without_cpu_fallback(
    tmp_path: Path, activation: str
) -> None:
    qdq = qdq_model(tmp_path, activation)
    model = onnx.load(str(qdq))
    io = fold_boundary_qdq(model)
    dtype = {"w8a8": "uint8", "w8a16": "uint16"}[activation]
    assert set(io) == {"x", "y"} and {q.dtype for q in io.values()} == {dtype}
    folded = tmp_path / "folded.qdq.onnx"
    onnx.save(model, str(folded))
    variant = compile_htp(folded, tmp_path / "folded.onnx")
    assert [n.op_type for n in variant.graph.node] == ["EPContext"]
    coverage = measure_coverage(variant, True, lambda: optimized_node_count(folded, "basic"))
    assert (coverage.fraction, coverage.boundary_qdq) == (1.0, 0)
    compile_htp(qdq, tmp_path / "unfolded.onnx")

    # The device's side: quantise the input with the recorded scale and zero point, run with
    # CPU fallback disabled, dequantise the output; the same as the unfolded variant.
    x = np.random.default_rng(5).uniform(0, 1, SHAPE).astype(np.float32)
    q = io["x"]
    limits = np.iinfo(np.dtype(q.dtype))
    xq = np.clip(np.round(x / q.scale) + q.zero_point, limits.min, limits.max)
    np.savez(tmp_path / "folded.npz", x=xq.astype(q.dtype))
    np.savez(tmp_path / "float.npz", x=x)
    ran = load_without_cpu_fallback(tmp_path / "folded.onnx", tmp_path / "folded.npz")
    assert ran["loaded"], ran
    assert ran["inputs"] == [f"tensor({dtype})"]
    out = io["y"]
    got = (np.array(ran["outputs"][0], np.float64) - out.zero_point) * out.scale
    unfolded = load_without_cpu_fallback(tmp_path / "unfolded.onnx", tmp_path / "float.npz", "0")
    assert unfolded["loaded"], unfolded
    np.testing.assert_array_equal(got.astype(np.float32), np.array(unfolded["outputs"][0]))


def test_min_coverage_judges_compute_not_the_io_conversions() -> None:
    """A target with min_coverage 1 keeps publishing integer variants whose compute is all
    on the NPU; compute left to the CPU is still refused, the conversions named apart."""
    from epfleet.errors import CompileError
    from epfleet.formats.variant_checks import Coverage
    from epfleet.runtime.compiler import check_coverage
    from epfleet.runtime.requests import CompileRequest

    request = CompileRequest.model_validate(
        {
            "model": "m",
            "target": "t",
            "ep": "QNNExecutionProvider",
            "device": "npu",
            "provider_options": {},
            "input_shapes": {},
            "source_key": "sources/a.onnx",
            "source_sha256": "a" * 64,
            "source_size": 1,
            "fingerprint": "",
            "min_coverage": 1.0,
        }
    )
    boundary_only = Coverage(
        ep_nodes=8,
        other_nodes=2,
        fraction=0.8,
        other_op_types=["DequantizeLinear", "QuantizeLinear"],
        boundary_qdq=2,
    )
    check_coverage(request, boundary_only)
    partial = boundary_only.model_copy(
        update={"other_nodes": 3, "fraction": 8 / 11, "other_op_types": ["NonZero"]}
    )
    with pytest.raises(CompileError) as refused:
        check_coverage(request, partial)
    assert "below the target's min_coverage 1; left out: NonZero (and 2 conversions" in str(
        refused.value
    )
