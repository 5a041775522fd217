"""What a model's users judge it by, as the spec names it (``MetricSpec``) and as the
manifest records what a variant scored (``TaskMetric``). Pure pydantic models; the
measures themselves are in ``epfleet.runtime.metrics``.

A numeric gate (the error relative to an output's range) cannot tell a variant that
flips a class or a character from one that does not: a model may name a task metric,
and a variant is published only when both gates pass.

- ``argmax_agreement``: the share of rows (along the last axis) whose argmax agrees;
  ``min`` 0..1.
- ``topk_agreement``: the share of rows whose source argmax is among the variant's top
  ``k``; ``min`` 0..1.
- ``cosine``: the lowest cosine similarity of one sample's output with the source's;
  ``min`` -1..1.
- ``snr_db``: the lowest signal-to-noise ratio of one sample's output, in dB.
- ``sequence_match``: the share of sequences (argmax over the last axis, or integer
  rows) equal to the source's; with ``blank``, CTC greedy decoded first; ``min`` 0..1.
  The steps lie along the last axis of the argmax (``[B, T, C]``: B sequences of T);
  ``time_axis`` names another (``[T, B, C]``, a time-major CTC head: ``time_axis: 0``).
- ``custom``: ``function(got, reference) -> float``, a ``module:function`` importable
  where verification runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MetricKind = Literal[
    "argmax_agreement", "topk_agreement", "cosine", "snr_db", "sequence_match", "custom"
]
SHARE_KINDS = ("argmax_agreement", "topk_agreement", "sequence_match")
InputSetName = Literal["samples", "calibration", "verification"]
ENTRY_POINT_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
MAX_TOP_K = 1000
MAX_TIME_AXIS = 31
"""A bound for the spec; an axis the output does not have is refused when measured."""


class MetricSpec(BaseModel):
    """A task metric a variant must reach on the golden samples to be published."""

    model_config = ConfigDict(extra="forbid")

    kind: MetricKind = Field(description="What is measured; see the verification concept page")
    output: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="The model output it is measured on, by name; the first output when omitted",
    )
    min: float = Field(
        allow_inf_nan=False,
        description="The lowest value published: a share for the agreement kinds (0.99), a "
        "similarity for cosine, decibels for snr_db",
    )
    k: int | None = Field(
        default=None, ge=2, le=MAX_TOP_K, description="topk_agreement: how many top classes"
    )
    blank: int | None = Field(
        default=None,
        ge=0,
        description="sequence_match: the CTC blank class; repeats collapse and blanks drop "
        "before sequences are compared",
    )
    time_axis: int | None = Field(
        default=None,
        ge=0,
        le=MAX_TIME_AXIS,
        description="sequence_match: the output's axis of time steps, counted from 0 (0 for "
        "a time-major [T, B, C] CTC head); omitted: the axis before the classes ([B, T, C])",
    )
    function: str | None = Field(
        default=None,
        pattern=ENTRY_POINT_PATTERN,
        max_length=300,
        description="custom: 'package.module:function', called with the variant's and the "
        "source's outputs (one array per sample) and returning a float",
    )

    @model_validator(mode="after")
    def _fits_its_kind(self) -> MetricSpec:
        if self.kind in SHARE_KINDS and not 0.0 <= self.min <= 1.0:
            raise ValueError(f"metric min: {self.kind} is a share; give 0..1, not {self.min}")
        if self.kind == "cosine" and not -1.0 <= self.min <= 1.0:
            raise ValueError(f"metric min: cosine lies in -1..1; {self.min} is outside")
        if self.kind == "topk_agreement" and self.k is None:
            raise ValueError("metric: topk_agreement needs k (how many top classes, e.g. 5)")
        if self.k is not None and self.kind != "topk_agreement":
            raise ValueError(f"metric k: only topk_agreement takes k, not {self.kind}")
        if self.blank is not None and self.kind != "sequence_match":
            raise ValueError(f"metric blank: only sequence_match takes blank, not {self.kind}")
        if self.time_axis is not None and self.kind != "sequence_match":
            raise ValueError(
                f"metric time_axis: only sequence_match takes time_axis, not {self.kind}"
            )
        if (self.kind == "custom") != (self.function is not None):
            raise ValueError(
                "metric: kind custom needs function: 'module:function'"
                if self.kind == "custom"
                else f"metric function: only kind custom takes a function, not {self.kind}"
            )
        return self

    def describe(self) -> str:
        """``argmax_agreement ≥ 0.99 on 'logits'``."""
        name = self.function or self.kind
        if self.k is not None:
            name += f"@{self.k}"
        on = f" on {self.output!r}" if self.output else ""
        return f"{name} ≥ {self.min:g}{on}"


class NoMetric(BaseModel):
    """``metric: {kind: none}``: the model names no task metric and turns the default for
    class scores off, so its variants are judged by the numeric gate alone."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["none"] = Field(
        description="none: no task metric, and no default judging of class scores"
    )


class TaskMetric(BaseModel):
    """The task metric a variant scored in its verification."""

    model_config = ConfigDict(extra="forbid")

    kind: MetricKind
    output: str = Field(max_length=200, description="The output it was measured on")
    value: float | None = Field(
        allow_inf_nan=False,
        description="What the variant scored (None: not measured, see the reason)",
    )
    min: float = Field(allow_inf_nan=False, description="The lowest value published")
    k: int | None = Field(default=None, exclude_if=lambda k: k is None)
    blank: int | None = Field(default=None, exclude_if=lambda blank: blank is None)
    time_axis: int | None = Field(
        default=None,
        exclude_if=lambda axis: axis is None,
        description="sequence_match: the output's axis of time steps (schema 1.5)",
    )
    function: str | None = Field(default=None, exclude_if=lambda f: f is None, max_length=300)
    default: bool = Field(
        default=False,
        exclude_if=lambda default: not default,
        description="The default metric of an integer variant's class scores, for a model "
        "that names none (schema 1.7)",
    )
    inputs: dict[InputSetName, int] | None = Field(
        default=None,
        exclude_if=lambda inputs: inputs is None,
        description="How many inputs of each set the value rests on: the golden samples, "
        "the calibration and the verification inputs (schema 1.7)",
    )
    hits: int | None = Field(
        default=None,
        ge=0,
        exclude_if=lambda hits: hits is None,
        description="A rate metric's agreeing rows or sequences (schema 1.7)",
    )
    trials: int | None = Field(
        default=None,
        ge=1,
        exclude_if=lambda trials: trials is None,
        description="A rate metric's rows or sequences counted (schema 1.7)",
    )
    low: float | None = Field(
        default=None,
        allow_inf_nan=False,
        exclude_if=lambda low: low is None,
        description="A rate metric's lower Clopper-Pearson bound, one-sided 95 % (schema 1.7)",
    )
    high: float | None = Field(
        default=None,
        allow_inf_nan=False,
        exclude_if=lambda high: high is None,
        description="A rate metric's upper Clopper-Pearson bound, one-sided 95 % (schema 1.7)",
    )
    evidence: Literal["reaches", "misses", "undecided"] | None = Field(
        default=None,
        exclude_if=lambda evidence: evidence is None,
        description="What the bounds show about min: reaches (the lower bound is at least "
        "min), misses (the upper bound is below it) or undecided, when the value decides "
        "(schema 1.7)",
    )

    @model_validator(mode="after")
    def _a_count(self) -> TaskMetric:
        if self.hits is not None and self.trials is not None and self.hits > self.trials:
            raise ValueError(f"metric: {self.hits} hits of {self.trials} trials is not a count")
        return self

    @property
    def input_count(self) -> int | None:
        return None if self.inputs is None else sum(self.inputs.values())

    @property
    def passed(self) -> bool:
        return self.value is not None and self.value >= self.min

    def spec(self) -> MetricSpec:
        """The metric as a spec names it: what a device's health check measures again."""
        return MetricSpec(
            kind=self.kind,
            output=self.output,
            min=self.min,
            k=self.k,
            blank=self.blank,
            time_axis=self.time_axis,
            function=self.function,
        )

    def describe(self) -> str:
        """``argmax_agreement 0.875 (min 0.99)``; a rate with its count and bounds:
        ``sequence_match 11/12 = 0.917 [0.661, 0.996] (min 0.99)``."""
        name = self.function or self.kind
        if self.k is not None:
            name += f"@{self.k}"
        value = "not measured" if self.value is None else f"{self.value:.4g}"
        if self.value is not None and self.hits is not None and self.trials is not None:
            value = f"{self.hits}/{self.trials} = {self.value:.3g}"
            if self.low is not None and self.high is not None:
                value += f" [{_outwards(self.low, math.floor)}, {_outwards(self.high, math.ceil)}]"
        return f"{name} {value} (min {self.min:g})"

    def shown(self) -> str:
        """``describe`` with what the value rests on, for tables and progress lines:
        ``sequence_match 107/108 = 0.991 [0.956, 1] (min 0.99) on 108 inputs, undecided``."""
        text = self.describe()
        count = self.input_count
        if count is not None:
            text += f" on {count} input{'' if count == 1 else 's'}"
        if self.evidence == "undecided":
            text += ", undecided"
        if self.default:
            text += " (default for class scores)"
        return text


def _outwards(bound: float, rounding: Callable[[float], int]) -> str:
    """A bound to 3 decimals, rounded away from the value: never claiming more."""
    return f"{rounding(round(bound * 1000, 6)) / 1000:g}"


def module_allowed(function: str, allowed: str) -> bool:
    """Whether ``function`` ('package.module:name') lies in one of the comma-separated
    ``allowed`` modules or their submodules (EPFLEET_METRIC_MODULES)."""
    module = function.partition(":")[0]
    names = [name.strip() for name in allowed.split(",") if name.strip()]
    return any(module == name or module.startswith(name + ".") for name in names)


def refusal(function: str) -> str:
    """Why a custom metric that is not allowed does not run, and how to allow it."""
    module = function.partition(":")[0]
    return (
        f"metric function {function}: module {module!r} is not among the modules this host "
        "lets specs call (EPFLEET_METRIC_MODULES, comma-separated; empty by default, as a "
        f"spec's metric runs code on the compile host): add {module} there to allow it"
    )
