"""Fixing symbolic and unknown input dims so NPU EPs get static shapes.

Real models name their dynamic dims in many ways (``"?"``, ``-1``, ``0``,
``"p2o.DynamicDimension.0"``), and one symbolic name may be shared by several
inputs (a batch dim, say). A named symbol is fixed everywhere it appears
(other inputs, outputs), ``"?"``, ``-1`` and empty dims only where they stand.
"""

from __future__ import annotations

import onnx
from onnx import ModelProto, TensorShapeProto, external_data_helper

ANONYMOUS_SYMBOLS = {"", "?"}

Dim = int | str


def describe_dim(dim: TensorShapeProto.Dimension) -> Dim:
    if dim.HasField("dim_value") and dim.dim_value > 0:
        return dim.dim_value
    if dim.HasField("dim_param") and dim.dim_param:
        return dim.dim_param
    return "?" if not dim.HasField("dim_value") else dim.dim_value


def uses_external_data(model: ModelProto) -> bool:
    """Whether any initializer lives in a file beside the model (not loaded here)."""
    tensors = list(model.graph.initializer) + [
        attribute.t
        for node in model.graph.node
        for attribute in node.attribute
        if attribute.HasField("t")
    ]
    return any(external_data_helper.uses_external_data(tensor) for tensor in tensors)


def graph_inputs(model: ModelProto) -> dict[str, list[Dim]]:
    """The model's real inputs (not initializers) and their dims as ints or symbol names."""
    initializers = {init.name for init in model.graph.initializer}
    return {
        value.name: [describe_dim(d) for d in value.type.tensor_type.shape.dim]
        for value in model.graph.input
        if value.name not in initializers
    }


def dynamic_inputs(model: ModelProto) -> dict[str, list[Dim]]:
    """Inputs that still have a dim that is not a positive integer."""
    return {
        name: dims
        for name, dims in graph_inputs(model).items()
        if any(not isinstance(d, int) or d <= 0 for d in dims)
    }


def fix_input_shapes(model: ModelProto, input_shapes: dict[str, list[int]]) -> None:
    """Fix the named inputs' dims in place and re-run shape inference.

    Raises ValueError naming the input and dim when a shape cannot apply: an
    unknown input, a rank mismatch, a fixed dim given another value, or one
    symbol given two values.
    """
    if not input_shapes:
        return
    inputs = {v.name: v for v in model.graph.input}
    known = graph_inputs(model)
    symbols: dict[str, tuple[int, str]] = {}
    for input_name, wanted in input_shapes.items():
        if input_name not in known:
            raise ValueError(
                f"input_shapes names {input_name!r}, but the model's inputs are "
                f"{', '.join(known) or '(none)'}"
            )
        dims = inputs[input_name].type.tensor_type.shape.dim
        if len(dims) != len(wanted):
            raise ValueError(
                f"input {input_name!r} has rank {len(dims)} {known[input_name]}, "
                f"input_shapes gives {len(wanted)} dims {wanted}"
            )
        for index, (dim, value) in enumerate(zip(dims, wanted, strict=True)):
            where = f"{input_name}[{index}]"
            if dim.HasField("dim_value") and dim.dim_value > 0:
                if dim.dim_value != value:
                    raise ValueError(
                        f"input dim {where} is fixed at {dim.dim_value} in the model, "
                        f"input_shapes gives {value}"
                    )
                continue
            symbol = dim.dim_param if dim.HasField("dim_param") else ""
            if symbol not in ANONYMOUS_SYMBOLS:
                previous = symbols.get(symbol)
                if previous and previous[0] != value:
                    raise ValueError(
                        f"symbolic dim {symbol!r} is shared by {previous[1]} and {where}, "
                        f"but input_shapes gives {previous[0]} and {value}"
                    )
                symbols[symbol] = (value, where)
            dim.dim_value = value
    _fix_symbols(model, {symbol: value for symbol, (value, _) in symbols.items()})
    del model.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    model.CopyFrom(inferred)


def _fix_symbols(model: ModelProto, values: dict[str, int]) -> None:
    """Give every other use of a fixed symbol (other inputs, outputs) its value; clear the
    outputs' remaining symbols so shape inference recomputes them."""
    for value in list(model.graph.input) + list(model.graph.output):
        is_output = value in model.graph.output
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in values:
                dim.dim_value = values[dim.dim_param]
            elif is_output and not (dim.HasField("dim_value") and dim.dim_value > 0):
                dim.Clear()


def prepare_model(
    model: ModelProto, input_shapes: dict[str, list[int]], require_static: bool, ep_name: str
) -> None:
    """Apply ``input_shapes``, then check the model; ValueError naming what is wrong."""
    fix_input_shapes(model, input_shapes)
    if require_static:
        still_dynamic = dynamic_inputs(model)
        if still_dynamic:
            described = "; ".join(f"{name} {dims}" for name, dims in still_dynamic.items())
            raise ValueError(
                f"{ep_name} needs static input shapes, but {described} still has "
                "symbolic or unknown dims: give them in the model's input_shapes"
            )
    try:
        onnx.checker.check_model(_without_external_data(model))
    except onnx.checker.ValidationError as exc:
        raise ValueError(f"onnx.checker rejects the model: {str(exc).splitlines()[0]}") from None


def _without_external_data(model: ModelProto) -> ModelProto:
    """What the checker checks of a model whose weights stay in their files (the checker
    would look for them beside the working directory): a copy in which each external
    initializer is a graph input of the same type and shape. Cheap: the copy holds no
    weights either."""
    if not uses_external_data(model):
        return model
    checked = ModelProto()
    checked.CopyFrom(model)
    graph = checked.graph
    kept = [t for t in graph.initializer if not external_data_helper.uses_external_data(t)]
    moved = [t for t in graph.initializer if external_data_helper.uses_external_data(t)]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    declared = {value.name for value in graph.input}
    for tensor in moved:
        if tensor.name not in declared:
            graph.input.append(
                onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, tensor.dims)
            )
    return checked
