"""The tails: every input a verification runs (golden samples, calibration and verification
inputs) is checked for NaN or inf where the source gives a number and for a probability
leaving [0, 1], on every rung, whether or not a task metric judges it. Compiled for real:
QNN's HTP backend computes the fp16 variant on this host."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from epfleet.formats.manifest import Manifest
from tests.support.plain_fleet import compile_spec
from tests.support.specs import HTP_TARGETS, write_spec

pytestmark = pytest.mark.fast

LARGE = 3000.0
"""Where float16's spacing is 2: s + 0.5 rounds back to s."""


def cancelling_probability(path: Path) -> Path:
    """p = sigmoid(z) + 0.5 - ((s + 0.5) - s): sigmoid(z) in fp32 for any s up to 2^23,
    but in fp16 the bracket is 0 once s reaches ``LARGE``, so p = sigmoid(z) + 0.5, past 1
    where z > 0. Inputs with s = 0 show nothing."""
    half = numpy_helper.from_array(np.array(0.5, np.float32), "half")
    graph = helper.make_graph(
        [
            helper.make_node("Sigmoid", ["z"], ["c"]),
            helper.make_node("Add", ["s", "half"], ["shifted"]),
            helper.make_node("Sub", ["shifted", "s"], ["kept"]),
            helper.make_node("Add", ["c", "half"], ["raised"]),
            helper.make_node("Sub", ["raised", "kept"], ["p"]),
        ],
        "cancelling",
        [
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4]),
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [1, 1]),
        ],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, [1, 4])],
        [half],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def inputs(count: int, seed: int, large: int | None = None) -> dict[str, np.ndarray]:
    """``count`` inputs with s = 0, but for input ``large``: s = ``LARGE``, z = 3."""
    rng = np.random.default_rng(seed)
    z = rng.uniform(-3, 3, (count, 1, 4)).astype(np.float32)
    s = np.zeros((count, 1, 1), np.float32)
    if large is not None:
        z[large], s[large] = 3.0, LARGE
    return {"z": z, "s": s}


@pytest.mark.parametrize("where", ["calibration", "verification"])
def test_an_fp16_rung_leaving_0_1_on_a_further_input_only_is_refused(
    tmp_path: Path, where: str
) -> None:
    """No metric named, fp16 (the default judges only integer rungs by their decisions):
    clean on its 4 samples, the variant gives about 1.45 on input 13 of the set."""
    cancelling_probability(tmp_path / "m.onnx")
    np.savez(tmp_path / "samples.npz", **inputs(4, 0))
    large = 13 if where == "calibration" else None
    np.savez(tmp_path / "calibration.npz", **inputs(20, 1, large))
    model = {"name": "p", "source": "m.onnx", "samples": "samples.npz"}
    model["calibration"] = "calibration.npz"
    if where == "verification":
        np.savez(tmp_path / "verification.npz", **inputs(20, 2, 13))
        model["verification"] = "verification.npz"
    store = tmp_path / "store"
    spec = write_spec(tmp_path, [model], [HTP_TARGETS[0]])
    [variant] = compile_spec(spec, store, tmp_path / "cache").variants
    assert variant.status == "failed" and variant.error is not None
    assert variant.error == (
        f"verification failed: on {where} input 13: output 0 gives 1.45313, outside [0, 1] "
        "where every source value lies (allowance 0.001)"
    )
    entry = Manifest.from_json((store / "manifest.json").read_bytes()).models["p"]
    refused = entry.variants["sd8g3-htp"]
    assert refused.status == "failed" and refused.artifact is None  # nothing published

    # the same model without the large input is published: the samples show nothing
    np.savez(tmp_path / "calibration.npz", **inputs(20, 1))
    if where == "verification":
        np.savez(tmp_path / "verification.npz", **inputs(20, 2))
    [variant] = compile_spec(spec, store, tmp_path / "cache").variants
    assert variant.status == "ok", variant.error
