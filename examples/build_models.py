"""Small float CNNs whose inputs have symbolic dims the way exported models do.

    python examples/build_models.py examples/models

``tiny-cls``: one input ``x`` [p2o.DynamicDimension.0, 3, ?, ?] (Paddle-style names).
``tiny-det``: inputs ``image`` [batch, 3, height, width] and ``gain`` [batch, 1, 1, 1],
which share the symbol ``batch``; fixing ``image`` fixes ``gain`` too.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _conv(name: str, inp: str, cin: int, cout: int, rng: np.random.Generator, stride: int = 1):
    weight = numpy_helper.from_array(
        (rng.standard_normal((cout, cin, 3, 3)) * 0.1).astype(np.float32), f"{name}.w"
    )
    bias = numpy_helper.from_array(np.zeros(cout, np.float32), f"{name}.b")
    node = helper.make_node(
        "Conv", [inp, weight.name, bias.name], [name], pads=[1, 1, 1, 1], strides=[stride, stride]
    )
    return node, [weight, bias]


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="epfleet-examples"
    )
    model.ir_version = 9
    onnx.checker.check_model(model)
    return model


def tiny_cls(width: int = 16, seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    x = helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, ["p2o.DynamicDimension.0", 3, "?", "?"]
    )
    y = helper.make_tensor_value_info("probs", TensorProto.FLOAT, ["p2o.DynamicDimension.1", 4])
    c1, i1 = _conv("c1", "x", 3, width, rng)
    r1 = helper.make_node("Relu", ["c1"], ["r1"])
    c2, i2 = _conv("c2", "r1", width, width * 2, rng, stride=2)
    r2 = helper.make_node("Relu", ["c2"], ["r2"])
    pool = helper.make_node("GlobalAveragePool", ["r2"], ["pool"])
    flat = helper.make_node("Flatten", ["pool"], ["flat"])
    fc_w = numpy_helper.from_array(
        (rng.standard_normal((width * 2, 4)) * 0.1).astype(np.float32), "fc.w"
    )
    fc = helper.make_node("MatMul", ["flat", "fc.w"], ["logits"])
    soft = helper.make_node("Softmax", ["logits"], ["probs"], axis=-1)
    graph = helper.make_graph(
        [c1, r1, c2, r2, pool, flat, fc, soft], "tiny_cls", [x], [y], [*i1, *i2, fc_w]
    )
    return _model(graph)


def tiny_det(width: int = 16, depth: int = 3, seed: int = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    image = helper.make_tensor_value_info(
        "image", TensorProto.FLOAT, ["batch", 3, "height", "width"]
    )
    gain = helper.make_tensor_value_info("gain", TensorProto.FLOAT, ["batch", 1, 1, 1])
    out = helper.make_tensor_value_info(
        "heatmap", TensorProto.FLOAT, ["batch", 1, "height", "width"]
    )
    nodes, inits, prev, cin = [], [], "image", 3
    for layer in range(depth):
        conv, params = _conv(f"c{layer}", prev, cin, width, rng)
        nodes += [conv, helper.make_node("Relu", [conv.output[0]], [f"r{layer}"])]
        inits += params
        prev, cin = f"r{layer}", width
    head, params = _conv("head", prev, cin, 1, rng)
    inits += params
    nodes += [
        head,
        helper.make_node("Mul", ["head", "gain"], ["scaled"]),
        helper.make_node("Sigmoid", ["scaled"], ["heatmap"]),
    ]
    graph = helper.make_graph(nodes, "tiny_det", [image, gain], [out], inits)
    return _model(graph)


def npu_unfriendly() -> onnx.ModelProto:
    """A model no NPU EP can take a node of (NonZero has a data-dependent output shape)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, [2, "k"])
    graph = helper.make_graph([helper.make_node("NonZero", ["x"], ["y"])], "nonzero", [x], [y])
    return _model(graph)


def npu_partial(seed: int = 2) -> onnx.ModelProto:
    """A model an NPU EP takes in part: a Conv, a Sigmoid and an Add it can run, and a
    NonZero (data-dependent output shape) left to the CPU EP."""
    rng = np.random.default_rng(seed)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4, 8, 8])
    where = helper.make_tensor_value_info("where", TensorProto.INT64, [4, "k"])
    weight = numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    one = numpy_helper.from_array(np.ones(1, np.float32), "one")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c"], ["y"]),
        # NonZero of sigmoid + 1 selects every element, whatever the precision: in fp16 a
        # sigmoid of a very negative value is 0, and the output's shape would follow it.
        helper.make_node("Add", ["y", "one"], ["shifted"]),
        helper.make_node("NonZero", ["shifted"], ["where"]),
    ]
    graph = helper.make_graph(nodes, "npu_partial", [x], [y, where], [weight, one])
    return _model(graph)


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(tiny_cls(), out / "tiny-cls.onnx")
    onnx.save(tiny_det(), out / "tiny-det.onnx")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "examples/models")
