"""A model "retrained" in one layer: one Conv weight moved by noise of 1 % of its range
(what a fine-tune of one layer changes), for the binary-delta tests and bench/deltas.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper


def retrained(source: Path, dest: Path, seed: int = 0) -> str:
    """``source`` with one Conv weight (the middle one), an initializer or a Constant
    node's value, moved by 1 % of its range, saved as ``dest``; the weight's name and
    shape."""
    model = onnx.load(str(source))
    tensors = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            tensors[node.output[0]] = node.attribute[0].t
    convs = [n.input[1] for n in model.graph.node if n.op_type == "Conv" and n.input[1] in tensors]
    name = convs[len(convs) // 2]
    tensor = tensors[name]
    w = numpy_helper.to_array(tensor)
    noise = np.random.default_rng(seed).normal(0, 0.01 * float(np.ptp(w)), w.shape)
    tensor.CopyFrom(numpy_helper.from_array((w + noise).astype(w.dtype), tensor.name))
    onnx.save(model, str(dest))
    return f"{name} {list(w.shape)}"
