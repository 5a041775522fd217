"""Fixing symbolic dims the way exported models spell them."""

from __future__ import annotations

import onnx
import pytest

from epfleet.runtime.shapes import dynamic_inputs, fix_input_shapes, graph_inputs, prepare_model
from examples.build_models import tiny_cls, tiny_det

pytestmark = pytest.mark.fast


def test_paddle_style_and_anonymous_dims_are_fixed() -> None:
    model = tiny_cls()
    assert graph_inputs(model) == {"x": ["p2o.DynamicDimension.0", 3, "?", "?"]}
    prepare_model(model, {"x": [1, 3, 48, 192]}, require_static=True, ep_name="QNN")
    assert graph_inputs(model) == {"x": [1, 3, 48, 192]}
    assert dynamic_inputs(model) == {}
    output_dims = [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim]
    assert output_dims == [1, 4]  # recomputed by shape inference


def test_shared_symbol_fixes_every_input_that_uses_it() -> None:
    model = tiny_det()
    fix_input_shapes(model, {"image": [2, 3, 32, 40]})
    assert graph_inputs(model) == {"image": [2, 3, 32, 40], "gain": [2, 1, 1, 1]}
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [2, 1, 32, 40]


def test_minus_one_dims_are_fixed() -> None:
    model = tiny_cls()
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    fix_input_shapes(model, {"x": [1, 3, 8, 8]})
    assert graph_inputs(model)["x"] == [1, 3, 8, 8]


def test_one_symbol_given_two_values_is_refused() -> None:
    model = tiny_det()
    with pytest.raises(ValueError, match="'batch' is shared by image\\[0\\] and gain\\[0\\]"):
        fix_input_shapes(model, {"image": [1, 3, 8, 8], "gain": [2, 1, 1, 1]})


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ({"y": [1]}, "input_shapes names 'y', but the model's inputs are x"),
        ({"x": [1, 3, 8]}, "has rank 4"),
        ({"x": [1, 4, 8, 8]}, "x[1] is fixed at 3"),
    ],
)
def test_shapes_that_do_not_fit(shapes: dict, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        fix_input_shapes(tiny_cls(), shapes)
    assert message in str(raised.value)


def test_static_requirement_names_the_dynamic_input() -> None:
    model = tiny_det()
    with pytest.raises(ValueError, match="gain \\['batch', 1, 1, 1\\]"):
        prepare_model(model, {}, require_static=True, ep_name="QNNExecutionProvider")
    # Without the requirement, the model passes untouched.
    other = tiny_det()
    prepare_model(other, {}, require_static=False, ep_name="CPUExecutionProvider")
    assert graph_inputs(other)["image"] == ["batch", 3, "height", "width"]


def test_checker_failure_is_reported() -> None:
    model = tiny_cls()
    model.graph.node[0].input[1] = "missing-weight"
    with pytest.raises(ValueError, match=r"onnx\.checker rejects the model"):
        prepare_model(model, {}, require_static=False, ep_name="CPUExecutionProvider")
    assert isinstance(model, onnx.ModelProto)
