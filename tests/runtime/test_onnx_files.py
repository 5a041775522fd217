"""Telling an ONNX file from anything else by the framing of its top-level fields, without
reading it whole (``epfleet.runtime.onnx_files``)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from epfleet.runtime.onnx_files import MAX_ONNX_BYTES, onnx_problem

pytestmark = pytest.mark.fast


def model_bytes() -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    helper.set_model_props(model, {"ep_compatibility_info.X": "v1"})
    return model.SerializeToString()


def problem(path: Path, data: bytes) -> str | None:
    path.write_bytes(data)
    with open(path, "rb") as file:
        return onnx_problem(file)


def test_an_onnx_model_passes(tmp_path: Path) -> None:
    assert problem(tmp_path / "m.onnx", model_bytes()) is None
    assert onnx.load_model_from_string(model_bytes()).graph.name == "g"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"", "the file is empty"),
        (b"\0" * 4096, "no protobuf field at byte 0"),
        (b"root:x:0:0:root:/root:/bin/bash\n", "is cut short or of an unknown kind"),
        (b"PK\x03\x04" + b"\0" * 100, "no protobuf field at byte 2"),
        (model_bytes()[:-3], "is cut short"),
        (onnx.ModelProto(ir_version=8).SerializeToString(), "it has no graph"),
    ],
    ids=["empty", "zeros", "text", "zip", "cut short", "no graph"],
)
def test_what_is_not_onnx_is_named(tmp_path: Path, data: bytes, expected: str) -> None:
    found = problem(tmp_path / "x.onnx", data)
    assert found is not None and expected in found, found


def test_a_file_larger_than_protobuf_allows_is_refused_by_its_size(tmp_path: Path) -> None:
    path = tmp_path / "huge.onnx"
    with open(path, "wb") as sparse:
        sparse.write(model_bytes())
        sparse.truncate(MAX_ONNX_BYTES + 1)
    with open(path, "rb") as file:
        found = onnx_problem(file)
    assert found is not None and "2,147,483,648 bytes, more than an ONNX file" in found
