"""epfleet.runtime.op_types reads a model's main-graph op types as onnx does, without
importing onnx (the device's health-check worker counts EPContext nodes with it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from epfleet.runtime.op_types import graph_op_types
from examples.build_models import npu_partial, npu_unfriendly, tiny_cls, tiny_det

pytestmark = pytest.mark.fast


def as_onnx_reads_it(path: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node]


def context_variant() -> onnx.ModelProto:
    """A compiled variant's shape: EPContext nodes (attributes, a binary blob) beside a
    node left to the CPU."""
    blob = helper.make_attribute("ep_cache_context", b"\x00\xff" * 300)
    context = helper.make_node("EPContext", ["x"], ["y"], domain="com.microsoft")
    context.attribute.extend([blob, helper.make_attribute("embed_mode", 1)])
    graph = helper.make_graph(
        [context, helper.make_node("Relu", ["y"], ["z"])],
        "variant",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def with_loop() -> onnx.ModelProto:
    """A Loop whose body (a subgraph: not the main graph's nodes) has two nodes."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["acc_in", "acc_in"], ["acc_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [1]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Loop", ["trips", "cond", "x"], ["looped"], body=body),
            helper.make_node("Neg", ["looped"], ["y"]),
        ],
        "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [
            numpy_helper.from_array(np.array(3, np.int64), "trips"),
            numpy_helper.from_array(np.array(True), "cond"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    "build",
    [tiny_cls, tiny_det, npu_partial, npu_unfriendly, context_variant, with_loop],
    ids=lambda build: build.__name__,
)
def test_the_main_graphs_op_types_as_onnx_reads_them(tmp_path: Path, build: object) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(build(), str(path))  # type: ignore[operator]
    assert graph_op_types(path) == as_onnx_reads_it(path)
    assert graph_op_types(path)  # every one of these has nodes


def test_a_model_with_external_weights_and_a_graph_given_twice(tmp_path: Path) -> None:
    external = tmp_path / "external.onnx"
    onnx.save(tiny_cls(), str(external), save_as_external_data=True, size_threshold=0)
    assert graph_op_types(external) == as_onnx_reads_it(external)
    # Protobuf merges a message field given twice: the nodes of both, in order.
    twice = tmp_path / "twice.onnx"
    twice.write_bytes(context_variant().SerializeToString() + with_loop().SerializeToString())
    assert graph_op_types(twice) == ["EPContext", "Relu", "Loop", "Neg"] == as_onnx_reads_it(twice)


def test_bytes_that_are_no_model_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(context_variant().SerializeToString()[:-3])  # cut inside a field
    with pytest.raises(ValueError, match="truncated"):
        graph_op_types(path)
