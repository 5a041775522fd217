"""Task metrics: how a variant's outputs score against its source's on the golden samples
(numpy only, no ORT). What each kind measures is drawn in
``epfleet.formats.task_metric``; ``measure`` computes it, ``load_function`` imports a
custom one the way ``eps.load`` imports an EP module: by name, when asked for, with an
error naming what is missing.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from epfleet.formats.task_metric import SHARE_KINDS, MetricSpec, module_allowed, refusal

CustomMetric = Callable[[list[np.ndarray], list[np.ndarray]], float]


class MetricError(ValueError):
    """The metric cannot be measured on these outputs (wrong output, shape or function)."""


def output_index(spec: MetricSpec, names: list[str]) -> int:
    """The index of the output ``spec`` is measured on (the first when it names none)."""
    if spec.output is None:
        return 0
    if spec.output not in names:
        raise MetricError(
            f"the metric names output {spec.output!r}; the model's outputs are "
            f"{', '.join(repr(n) for n in names)}"
        )
    return names.index(spec.output)


def measure(
    spec: MetricSpec,
    got: list[np.ndarray],
    reference: list[np.ndarray],
    allowed_modules: str = "",
) -> float:
    """``spec``'s value for one output: ``got[k]`` the variant's and ``reference[k]`` the
    source's array for sample ``k``. MetricError when the outputs do not suit the kind, or
    a custom function lies outside ``allowed_modules`` (EPFLEET_METRIC_MODULES)."""
    if len(got) != len(reference) or not got:
        raise MetricError(f"{len(got)} outputs to score against {len(reference)}")
    if spec.kind in SHARE_KINDS:
        agreeing, total = counted(spec, got, reference)
        return agreeing / total if total else 1.0
    pairs = [(np.asarray(g), np.asarray(r)) for g, r in zip(got, reference, strict=True)]
    if spec.kind == "custom":
        assert spec.function is not None
        function = load_function(spec.function, allowed_modules)
        value = function([g for g, _ in pairs], [r for _, r in pairs])
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise MetricError(f"{spec.function} returned {value!r}, not a number") from None
        if not math.isfinite(number):
            raise MetricError(f"{spec.function} returned {number}, not a finite number")
        return number
    pairs = _shaped(pairs)
    if spec.kind == "cosine":
        return min(_cosine(g, r) for g, r in pairs)
    return min(_snr_db(g, r) for g, r in pairs)


def counted(
    spec: MetricSpec, got: list[np.ndarray], reference: list[np.ndarray]
) -> tuple[int, int]:
    """A rate metric's count (``SHARE_KINDS``): the rows or sequences on which the variant
    agrees with the source, and how many there are, over every sample."""
    if len(got) != len(reference) or not got:
        raise MetricError(f"{len(got)} outputs to score against {len(reference)}")
    pairs = _shaped([(np.asarray(g), np.asarray(r)) for g, r in zip(got, reference, strict=True)])
    if spec.kind == "argmax_agreement":
        return _count(_rows(g, spec).argmax(-1) == _rows(r, spec).argmax(-1) for g, r in pairs)
    if spec.kind == "topk_agreement":
        assert spec.k is not None
        return _count(_top1_in_topk(g, r, spec.k, spec) for g, r in pairs)
    if spec.kind != "sequence_match":
        raise MetricError(f"{spec.kind} is not a rate: it has no count")
    return _count(
        np.array([_sequence(a, spec.blank) == _sequence(b, spec.blank)])
        for g, r in pairs
        for a, b in zip(_sequences(g, spec), _sequences(r, spec), strict=True)
    )


def _shaped(pairs: list[tuple[np.ndarray, np.ndarray]]) -> list[tuple[np.ndarray, np.ndarray]]:
    for g, r in pairs:
        if g.size != r.size:
            raise MetricError(f"the variant's output has {g.size} values, the source's {r.size}")
    return [(g.reshape(r.shape), r) for g, r in pairs]


def _count(hits: Any) -> tuple[int, int]:
    agreeing, total = 0, 0
    for hit in hits:
        agreeing += int(np.count_nonzero(hit))
        total += int(np.size(hit))
    return agreeing, total


def _rows(value: np.ndarray, spec: MetricSpec) -> np.ndarray:
    """Class scores along the last axis, as floats."""
    if value.ndim == 0 or value.shape[-1] < 2:
        raise MetricError(
            f"{spec.kind} needs class scores along the last axis; the output's shape is "
            f"{list(value.shape)}"
        )
    return value.astype(np.float64)


def _top1_in_topk(got: np.ndarray, ref: np.ndarray, k: int, spec: MetricSpec) -> np.ndarray:
    scores = _rows(got, spec)
    if k > scores.shape[-1]:
        raise MetricError(f"topk_agreement k={k}, but the output has {scores.shape[-1]} classes")
    top = np.argpartition(-scores, k - 1, axis=-1)[..., :k]
    return (top == _rows(ref, spec).argmax(-1)[..., None]).any(-1)


def _cosine(got: np.ndarray, ref: np.ndarray) -> float:
    a, b = got.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norms == 0.0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(a @ b) / norms


def _snr_db(got: np.ndarray, ref: np.ndarray) -> float:
    """10 log10(sum ref^2 / sum (got - ref)^2); capped at 200 dB for an exact match."""
    signal = float(np.sum(ref.astype(np.float64) ** 2))
    noise = float(np.sum((got.astype(np.float64) - ref.astype(np.float64)) ** 2))
    if noise == 0.0:
        return 200.0
    if signal == 0.0:
        return -200.0
    return max(-200.0, min(200.0, 10.0 * math.log10(signal / noise)))


def _sequences(value: np.ndarray, spec: MetricSpec) -> list[np.ndarray]:
    """One sequence per row: integer outputs as they are, float scores by argmax over
    the last axis (``[B, T, C]`` gives B sequences of T classes); with ``time_axis``, the
    steps are taken along that axis of the output (``[T, B, C]`` and ``time_axis: 0``
    give B sequences of T, not T*B one-step ones)."""
    steps = value.argmax(-1) if value.dtype.kind == "f" else value
    steps = np.atleast_1d(steps)
    if spec.time_axis is not None:
        if spec.time_axis >= steps.ndim:
            raise MetricError(
                f"sequence_match time_axis {spec.time_axis}: the output's shape is "
                f"{list(value.shape)}, whose steps (argmax over its last axis for scores) "
                f"have axes 0..{steps.ndim - 1}"
            )
        steps = np.moveaxis(steps, spec.time_axis, -1)
    return list(steps.reshape(-1, steps.shape[-1]))


def _sequence(steps: np.ndarray, blank: int | None) -> tuple[int, ...]:
    if blank is None:
        return tuple(int(s) for s in steps)
    decoded: list[int] = []
    previous = None
    for step in (int(s) for s in steps):
        if step != previous and step != blank:
            decoded.append(step)
        previous = step
    return tuple(decoded)


def load_function(entry: str, allowed_modules: str) -> CustomMetric:
    """The ``module:function`` named by ``entry``; MetricError naming what is missing, or
    that its module is not among ``allowed_modules``: nothing is imported then."""
    if not module_allowed(entry, allowed_modules):
        raise MetricError(refusal(entry))
    module_name, _, attribute = entry.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise MetricError(
            f"metric function {entry}: cannot import {module_name!r} on this host ({exc}); "
            "install the package that provides it where verification runs"
        ) from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise MetricError(f"metric function {entry}: {module_name} has no function {attribute!r}")
    return function
