"""What the compile host measured of a variant, as the manifest records it: how much of
the graph the EP took (``Coverage``), how the variant compared with its source
(``Verification``), a failed compile kept beside a working build (``FailedBuild``), and
how it reached its precision (``PrecisionTried``: the ladder's precisions that lost;
``Quantization``: how its QDQ model was made), and how a variant whose boundary
Quantize/Dequantize were folded is fed (``FoldedIo``).

Pure pydantic models; ``epfleet.formats.manifest`` holds them in its entries. A device checks a
new variant with the tolerances recorded here, so they are bounded: no entry, signed or
not, loosens a device's health check past ``eps.base.LOOSEST_TOLERANCE``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from epfleet.formats.task_metric import TaskMetric
from eps.base import LOOSEST_TOLERANCE, Precision


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Coverage(_Strict):
    """How much of the source graph the EP took."""

    ep_nodes: int = Field(ge=0, description="Source nodes inside the EP's partitions")
    other_nodes: int = Field(ge=0, description="Nodes left to other EPs (ORT's CPU EP)")
    fraction: float = Field(ge=0, le=1, description="ep_nodes / all nodes; 1.0 is a full compile")
    other_op_types: list[str] = Field(default_factory=list)
    boundary_qdq: int = Field(
        default=0,
        ge=0,
        description="Of other_nodes, the QuantizeLinear of a graph input and DequantizeLinear "
        "to a graph output a QDQ variant leaves to ORT's CPU EP: the variant does not load "
        "with CPU fallback disabled (session.disable_cpu_ep_fallback)",
        exclude_if=lambda count: not count,
    )


class Verification(_Strict):
    """Whether the variant was run on the compile host and matched its source."""

    status: Literal["passed", "failed", "unverified"]
    runner: str | None = Field(default=None, description="The EPs that ran it, and where")
    samples: int = Field(default=0, ge=0)
    max_abs_error: float | None = None
    max_rel_error: float | None = Field(
        default=None, description="max |variant - source| / range of the source's output"
    )
    top1_agreement: float | None = Field(
        default=None, description="Share of class-score rows whose argmax agrees"
    )
    worst_output: str | None = Field(
        default=None,
        max_length=200,
        exclude_if=lambda name: name is None,
        description="The output max_rel_error was measured on (the worst one)",
    )
    error_range: float | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="What max_rel_error divides by: that output's max - min over every "
        "golden sample, at least error_floor",
    )
    error_floor: float | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="That output's smallest range: its dtype's resolution at its scale "
        "(eps x max(1, max |source|); 1 for integers)",
    )
    tail_abs_error: float | None = Field(
        default=None,
        exclude_if=lambda value: value is None,
        description="The largest 99.9th percentile of |variant - source| over the outputs, "
        "every element of every sample: what most values see, beside max_abs_error",
    )
    metric: TaskMetric | None = Field(
        default=None,
        exclude_if=lambda metric: metric is None,
        description="The model's task metric and what the variant scored (None: the model "
        "names none and no default applied: the numeric gate alone decided)",
    )
    tolerance: float | None = Field(
        default=None,
        ge=0,
        le=LOOSEST_TOLERANCE.relative,
        allow_inf_nan=False,
        description="Largest max_rel_error accepted (a device checks the variant with it)",
    )
    abs_tolerance: float | None = Field(
        default=None,
        ge=0,
        le=LOOSEST_TOLERANCE.absolute,
        allow_inf_nan=False,
        description="Absolute errors up to this pass whatever the output's range",
    )
    seconds: float | None = None
    reason: str | None = Field(default=None, description="Why it failed or was not run")
    samples_origin: Literal["spec", "generated"] | None = Field(
        default=None,
        exclude_if=lambda origin: origin is None,
        description="Where the inputs it ran came from: the spec's samples file, or seeded "
        "generated inputs (which can miss what real inputs reach)",
    )
    reused: bool = Field(
        default=False,
        exclude_if=lambda reused: not reused,
        description="Not run again: the result of an earlier verification on the compile "
        "host of the same artifact bytes, golden samples, EP and ORT versions and tolerances",
    )
    twin_of: str | None = Field(
        default=None,
        max_length=100,
        exclude_if=lambda target: target is None,
        description="Checked on its first golden sample(s) only (samples): it computes the "
        "same outputs as this target's variant of the model (same source, precision, "
        "tolerances and numerics-relevant EP options), which was verified on every sample, "
        "in the same run or earlier on the same compile host. None: verified on every sample",
    )


class FailedBuild(_Strict):
    """A compile of a pair for other inputs than its working build's, which failed: the
    entry keeps its working build, and these inputs are not compiled again."""

    fingerprint: str
    error: str
    compiled_at: datetime
    ort_version: str
    ep_version: str | None = None
    coverage: Coverage | None = None
    verification: Verification | None = None


SHA256_PATTERN = r"^[0-9a-f]{64}$"


class PrecisionTried(_Strict):
    """A precision of the target's ladder tried before the one published, and why it lost."""

    precision: Precision
    reason: str = Field(max_length=2000)
    max_rel_error: float | None = Field(default=None, description="Its verification's error")
    outcome: Literal["compile failed", "below min_coverage", "verification failed"] | None = Field(
        default=None,
        exclude_if=lambda outcome: outcome is None,
        description="How it lost (schema 1.3; None: recorded before)",
    )
    seconds: float | None = Field(
        default=None,
        ge=0,
        exclude_if=lambda seconds: seconds is None,
        description="Seconds it took on the compile host: quantising and compiling, then "
        "verifying (a compile that failed: the attempt's wall time; schema 1.3; None: "
        "recorded before)",
    )


class Quantization(_Strict):
    """How an integer variant's QDQ model was made from the fp32 source (ORT's QNN
    quantisation tools), or that the source was QDQ already."""

    qdq_sha256: str = Field(pattern=SHA256_PATTERN, description="The QDQ model compiled")
    qdq_uri: str | None = Field(
        default=None,
        description="Where the store keeps that QDQ model (sources/<sha256>.onnx), once for "
        "every target compiled from it; None: the source itself",
    )
    calibration_sha256: str | None = Field(
        default=None, pattern=SHA256_PATTERN, description="None: the source was QDQ already"
    )
    calibration_samples: int = Field(default=0, ge=0)
    method: str | None = Field(default=None, description="Calibration method, e.g. minmax")
    per_channel: bool = False
    nodes_to_exclude: list[str] = Field(default_factory=list)
    seconds: float | None = Field(default=None, description="Time the quantise step took")


IntegerDtype = Literal["uint8", "int8", "uint16", "int16"]
INTEGER_RANGES: dict[str, tuple[int, int]] = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "uint16": (0, 65_535),
    "int16": (-32_768, 32_767),
}


class FoldedTensor(_Strict):
    """One integer input or output of a folded variant: ``real = (integer - zero_point) *
    scale``, and an app quantises its floats with ``clip(round(real / scale) + zero_point)``
    to the dtype's range (``epfleet.runtime.folded_io``)."""

    name: str = Field(min_length=1, max_length=1000, description="The model's input or output")
    dtype: IntegerDtype = Field(description="The integer type the variant takes or gives")
    scale: float = Field(gt=0, allow_inf_nan=False, description="Float per integer step")
    zero_point: int = Field(description="The integer that stands for 0.0")

    @model_validator(mode="after")
    def _zero_point_in_range(self) -> FoldedTensor:
        low, high = INTEGER_RANGES[self.dtype]
        if not low <= self.zero_point <= high:
            raise ValueError(
                f"{self.name!r}: zero_point {self.zero_point} is outside {self.dtype}'s "
                f"range [{low}, {high}]"
            )
        return self


MAX_FOLDED_TENSORS = 10_000
"""The most inputs (or outputs) a ``folded_io`` may list: far more than any model has (a
large language model with its caches has a few hundred), so that an entry written by
someone without the keys cannot make every reader of the manifest work for minutes. Where
the model is at hand, a list longer than its inputs (or outputs) is refused
(``epfleet.runtime.folded_io.mismatch``)."""


class FoldedIo(_Strict):
    """A quantised variant compiled with its boundary QuantizeLinear and DequantizeLinear
    removed (the target's ``fold_io``): the inputs it takes and the outputs it gives as
    integers, and how each maps to the floats of the source. Inputs and outputs not listed
    stay as the source has them. Schema 1.4."""

    inputs: list[FoldedTensor] = Field(default_factory=list, max_length=MAX_FOLDED_TENSORS)
    outputs: list[FoldedTensor] = Field(default_factory=list, max_length=MAX_FOLDED_TENSORS)

    @model_validator(mode="after")
    def _distinct(self) -> FoldedIo:
        if not self.inputs and not self.outputs:
            raise ValueError("folds nothing: name at least one input or output")
        for kind, tensors in (("inputs", self.inputs), ("outputs", self.outputs)):
            seen: set[str] = set()
            for tensor in tensors:
                if tensor.name in seen:
                    raise ValueError(f"{kind} name {tensor.name!r} twice")
                seen.add(tensor.name)
        return self

    def tensor(self, name: str) -> FoldedTensor | None:
        return next((t for t in [*self.inputs, *self.outputs] if t.name == name), None)
