"""Whether a model's inputs, at their fixed shapes, fit in the memory of the machine that plans.

The planning machine runs the source on one sample of inputs to make the golden samples,
and every verification runs the variant on them again: generated float inputs are drawn
in float64 and then cast (three times their size at the peak), the golden file is written
from in-memory copies, and the outputs (an LLM's present key/values mirror its past
inputs) come on top. So one sample's inputs may take at most ``MEMORY_SHARE`` of the
machine's memory; a shape past that is refused when the run plans, naming the input,
instead of failing every verification and every device's health check with a
MemoryError.
"""

from __future__ import annotations

import os
from pathlib import Path

import onnx

from epfleet.limits import format_size
from epfleet.runtime.shapes import graph_inputs

MEMORY_SHARE = 8
"""One sample's inputs may take at most 1/MEMORY_SHARE of the machine's memory."""

CGROUP_LIMITS = (
    Path("/sys/fs/cgroup/memory.max"),  # cgroup v2
    Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"),  # cgroup v1
)


def machine_memory() -> int:
    """This machine's physical memory in bytes, or its container's limit when lower."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for limit in CGROUP_LIMITS:
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            memory = min(memory, int(text))
    return memory


def input_sizes(model: onnx.ModelProto) -> dict[str, tuple[list[int], str, int]]:
    """Each input's (dims, dtype name, bytes) with its shapes fixed; a dim still symbolic
    counts as 1 (what a run gives it), an input of a non-numeric type is left out."""
    types = {value.name: value.type.tensor_type.elem_type for value in model.graph.input}
    sizes = {}
    for name, dims in graph_inputs(model).items():
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(types[name])
        except (KeyError, ValueError):
            continue
        if dtype.kind not in "biuf":
            continue
        fixed = [d if isinstance(d, int) and d > 0 else 1 for d in dims]
        count = 1
        for dim in fixed:
            count *= dim
        sizes[name] = (fixed, dtype.name, count * dtype.itemsize)
    return sizes


def check_input_memory(model: onnx.ModelProto, memory: int | None = None) -> None:
    """ValueError naming the largest input when one sample's inputs take more than
    1/MEMORY_SHARE of ``memory`` (default: this machine's)."""
    memory = machine_memory() if memory is None else memory
    sizes = input_sizes(model)
    total = sum(size for _, _, size in sizes.values())
    allowed = memory // MEMORY_SHARE
    if total <= allowed:
        return
    name, (dims, dtype, size) = max(sizes.items(), key=lambda item: item[1][2])
    others = f" ({format_size(total)} with the other inputs)" if size != total else ""
    raise ValueError(
        f"input {name!r} {dims} {dtype} takes {format_size(size)} a sample{others}; one "
        f"sample's inputs may take at most {format_size(allowed)} here (1/{MEMORY_SHARE} of "
        f"this machine's {format_size(memory)} of memory: making the golden samples and "
        "verifying hold them several times over). Give smaller input_shapes"
    )
