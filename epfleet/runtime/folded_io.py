"""Feeding a folded variant (pure numpy): quantise float inputs to the integers it takes and
dequantise the integers it gives, with the scales and zero points its manifest entry
records (``FoldedIo``), exactly as ONNX's QuantizeLinear and DequantizeLinear compute them;
and the check that such a record fits the model it describes.

Used by the compile host's verification (``epfleet.fleet.build.verify``) and the device's health
check (``epfleet.device.health``), and the arithmetic an app repeats to run the variant.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from epfleet.formats.variant_checks import INTEGER_RANGES, FoldedIo, FoldedTensor


def quantize(values: np.ndarray, tensor: FoldedTensor) -> np.ndarray:
    """``clip(round(values / scale) + zero_point)`` in ``tensor.dtype``, as QuantizeLinear:
    the division in float32, rounding half to even, saturating at the dtype's range."""
    low, high = INTEGER_RANGES[tensor.dtype]
    steps = np.asarray(values, dtype=np.float32) / np.float32(tensor.scale)
    rounded = np.rint(steps).astype(np.float64) + tensor.zero_point
    return np.clip(rounded, low, high).astype(tensor.dtype)


def dequantize(integers: np.ndarray, tensor: FoldedTensor) -> np.ndarray:
    """``(integers - zero_point) * scale`` in float32, as DequantizeLinear."""
    shifted = np.asarray(integers).astype(np.int32) - np.int32(tensor.zero_point)
    return shifted.astype(np.float32) * np.float32(tensor.scale)


def quantized_inputs(sample: Mapping[str, np.ndarray], folded: FoldedIo) -> dict[str, np.ndarray]:
    """``sample`` (float inputs by name) with each folded input quantised."""
    by_name = {t.name: t for t in folded.inputs}
    return {
        name: quantize(value, by_name[name]) if name in by_name else value
        for name, value in sample.items()
    }


def dequantized_outputs(
    outputs: Sequence[np.ndarray], names: Sequence[str], folded: FoldedIo
) -> list[np.ndarray]:
    """The variant's outputs (in ``names`` order) with each folded output dequantised."""
    by_name = {t.name: t for t in folded.outputs}
    return [
        dequantize(value, by_name[name]) if name in by_name else value
        for value, name in zip(outputs, names, strict=True)
    ]


def mismatch(folded: FoldedIo, inputs: Mapping[str, str], outputs: Mapping[str, str]) -> str | None:
    """Why ``folded`` does not describe a model with these ``inputs`` and ``outputs``
    (name to ORT type, e.g. ``tensor(uint8)``), or None: no more folded inputs (outputs)
    than the model has, every folded name one of the model's, of the recorded dtype. A
    record that fails this would have an app feed the variant wrongly."""
    for kind, tensors, have in (
        ("input", folded.inputs, inputs),
        ("output", folded.outputs, outputs),
    ):
        if len(tensors) > len(have):
            return f"folded_io lists {len(tensors)} {kind}s; the model has {len(have)}"
        for tensor in tensors:
            if tensor.name not in have:
                known = ", ".join(repr(n) for n in have) or "none"
                return (
                    f"folded_io names {kind} {tensor.name!r}, which the model does not have "
                    f"(its {kind}s: {known})"
                )
            wanted = f"tensor({tensor.dtype})"
            if have[tensor.name] != wanted:
                return (
                    f"folded_io says {kind} {tensor.name!r} is {tensor.dtype}; the model's is "
                    f"{have[tensor.name]}"
                )
    return None
