"""Feeding a folded variant: quantise and dequantise as ONNX's QuantizeLinear and
DequantizeLinear do (checked against ORT's own kernels on the CPU EP), saturating at the
integer type's range; and the check that a folded_io record fits the model it describes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from pydantic import ValidationError

from epfleet.formats.variant_checks import FoldedIo, FoldedTensor
from epfleet.runtime.folded_io import (
    dequantize,
    dequantized_outputs,
    mismatch,
    quantize,
    quantized_inputs,
)

pytestmark = pytest.mark.fast

ONNX_TYPES = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8}
ONNX_TYPES |= {"uint16": TensorProto.UINT16, "int16": TensorProto.INT16}


def ort_roundtrip(values: np.ndarray, tensor: FoldedTensor) -> tuple[np.ndarray, np.ndarray]:
    """ORT's QuantizeLinear of ``values`` and DequantizeLinear of that, on the CPU EP."""
    zero = np.array(tensor.zero_point, dtype=tensor.dtype)
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"]),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(values.shape))],
        [
            helper.make_tensor_value_info("q", ONNX_TYPES[tensor.dtype], list(values.shape)),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, list(values.shape)),
        ],
        [
            numpy_helper.from_array(np.array(tensor.scale, dtype=np.float32), "s"),
            numpy_helper.from_array(zero, "z"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    q, y = session.run(None, {"x": values})
    return q, y


TENSORS = [
    FoldedTensor(name="x", dtype="uint8", scale=0.0039215689, zero_point=0),
    FoldedTensor(name="x", dtype="uint8", scale=0.0123, zero_point=131),
    FoldedTensor(name="x", dtype="int8", scale=0.02, zero_point=-3),
    FoldedTensor(name="x", dtype="uint16", scale=1.5259e-05, zero_point=32768),
    FoldedTensor(name="x", dtype="int16", scale=0.001, zero_point=0),
]


@pytest.mark.parametrize("tensor", TENSORS, ids=lambda t: f"{t.dtype}-{t.zero_point}")
def test_quantize_and_dequantize_match_onnx_runtime_bit_for_bit(tensor: FoldedTensor) -> None:
    rng = np.random.default_rng(3)
    span = tensor.scale * 70_000  # past every type's range: saturation on both sides
    values = rng.uniform(-span, span, (4, 257)).astype(np.float32)
    # exact halves between integer steps: round half to even, as QuantizeLinear does
    halves = (np.arange(-6, 6, dtype=np.float32) + np.float32(0.5)) * np.float32(tensor.scale)
    values = np.concatenate([values.ravel(), halves, [0.0, np.float32(tensor.scale)]])
    values = values.astype(np.float32)
    want_q, want_y = ort_roundtrip(values, tensor)
    got_q = quantize(values, tensor)
    assert got_q.dtype == np.dtype(tensor.dtype)
    np.testing.assert_array_equal(got_q, want_q)
    got_y = dequantize(got_q, tensor)
    assert got_y.dtype == np.float32
    np.testing.assert_array_equal(got_y, want_y)


def test_rounding_is_half_to_even_and_saturates_at_the_range() -> None:
    tensor = FoldedTensor(name="x", dtype="uint8", scale=1.0, zero_point=10)
    values = np.array([0.5, 1.5, 2.5, -0.5, -10.5, -11.0, -1000.0, 245.0, 245.5, 1e9])
    assert quantize(values, tensor).tolist() == [10, 12, 12, 10, 0, 0, 0, 255, 255, 255]
    wide = FoldedTensor(name="x", dtype="uint16", scale=0.5, zero_point=0)
    assert quantize(np.array([-1.0, 0.25, 0.75, 32767.5, 40000.0]), wide).tolist() == [
        0,
        0,
        2,
        65535,
        65535,
    ]
    assert dequantize(np.array([0, 65535], dtype=np.uint16), wide).tolist() == [0.0, 32767.5]
    signed = FoldedTensor(name="x", dtype="int16", scale=1.0, zero_point=-5)
    assert quantize(np.array([-40000.0, 40000.0]), signed).tolist() == [-32768, 32767]
    assert dequantize(np.array([-32768], dtype=np.int16), signed).tolist() == [-32763.0]


FOLDED = FoldedIo(
    inputs=[FoldedTensor(name="x", dtype="uint8", scale=0.5, zero_point=2)],
    outputs=[FoldedTensor(name="y", dtype="uint16", scale=0.25, zero_point=100)],
)


def test_a_sample_is_quantised_and_outputs_dequantised_by_name() -> None:
    sample = {"x": np.array([1.0, -1.0], np.float32), "mask": np.array([1, 0], np.int64)}
    fed = quantized_inputs(sample, FOLDED)
    assert fed["x"].tolist() == [4, 0] and fed["x"].dtype == np.uint8
    assert fed["mask"] is sample["mask"]  # not folded: as it was
    outputs = [np.array([104], np.uint16), np.array([7.0], np.float32)]
    back = dequantized_outputs(outputs, ["y", "z"], FOLDED)
    assert back[0].tolist() == [1.0] and back[1] is outputs[1]


@pytest.mark.parametrize(
    ("inputs", "outputs", "expected"),
    [
        ({"x": "tensor(uint8)"}, {"y": "tensor(uint16)"}, None),
        (
            {"x": "tensor(float)"},
            {"y": "tensor(uint16)"},
            "folded_io says input 'x' is uint8; the model's is tensor(float)",
        ),
        (
            {"image": "tensor(uint8)"},
            {"y": "tensor(uint16)"},
            "folded_io names input 'x', which the model does not have (its inputs: 'image')",
        ),
        (
            {"x": "tensor(uint8)"},
            {"y": "tensor(uint8)"},
            "folded_io says output 'y' is uint16; the model's is tensor(uint8)",
        ),
    ],
)
def test_a_record_that_does_not_fit_the_model_is_named(
    inputs: dict[str, str], outputs: dict[str, str], expected: str | None
) -> None:
    assert mismatch(FOLDED, inputs, outputs) == expected


def test_a_record_listing_more_inputs_than_the_model_has_is_named_by_its_count() -> None:
    tensors = [FoldedTensor(name=f"x{i}", dtype="uint8", scale=0.5, zero_point=0) for i in range(3)]
    folded = FoldedIo(inputs=tensors)
    problem = mismatch(folded, {"x0": "tensor(uint8)", "x1": "tensor(uint8)"}, {})
    assert problem == "folded_io lists 3 inputs; the model has 2"


@pytest.mark.parametrize(
    ("tensor", "expected"),
    [
        ({"scale": 0.0}, "Input should be greater than 0"),
        ({"scale": -0.5}, "Input should be greater than 0"),
        ({"scale": float("nan")}, "Input should be a finite number"),
        ({"scale": float("inf")}, "Input should be a finite number"),
        ({"dtype": "float32"}, "Input should be 'uint8', 'int8', 'uint16' or 'int16'"),
        ({"zero_point": 256}, "zero_point 256 is outside uint8's range [0, 255]"),
        ({"name": ""}, "String should have at least 1 character"),
    ],
)
def test_a_record_no_model_could_have_is_refused_by_validation(
    tensor: dict[str, object], expected: str
) -> None:
    good = {"name": "x", "dtype": "uint8", "scale": 0.5, "zero_point": 0}
    with pytest.raises(ValidationError, match=expected.replace("[", r"\[").replace("(", r"\(")):
        FoldedTensor.model_validate(good | tensor)


def test_a_record_naming_a_tensor_twice_or_nothing_is_refused() -> None:
    x = {"name": "x", "dtype": "uint8", "scale": 0.5, "zero_point": 0}
    with pytest.raises(ValidationError, match="inputs name 'x' twice"):
        FoldedIo.model_validate({"inputs": [x, x]})
    with pytest.raises(ValidationError, match="folds nothing"):
        FoldedIo.model_validate({})


def test_a_model_with_nothing_to_fold_fails_its_compile_saying_so(tmp_path: Path) -> None:
    from epfleet.errors import CompileError
    from epfleet.runtime.quantize import folded_source

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "float",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
    )
    path = tmp_path / "plain.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(CompileError) as refused:
        folded_source(path, "m", "w8a8")
    assert str(refused.value) == (
        "model 'm' at w8a8: fold_io found no QuantizeLinear on a graph input nor "
        "DequantizeLinear to a graph output with a per-tensor scale and zero point to fold; "
        "remove fold_io from the target"
    )
