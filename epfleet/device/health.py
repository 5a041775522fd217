"""The device's health check: run a variant before activating it.

On the model's golden samples when the manifest has them (compared with the source's
outputs within the variant's tolerance, never looser than ``eps.base.LOOSEST_TOLERANCE``),
on zero inputs otherwise. A folded variant (``folded_io``) is loaded with CPU fallback
disabled and fed its golden inputs quantised, its outputs dequantised. The session
helpers are shared with the compile host's verification (``epfleet.runtime.sessions``).

Where it runs is the sync's ``HealthRunner``: by default a worker process
(``epfleet.device.steps``), killed past its time limit, so that a variant whose native
code crashes or never returns takes down the worker and not the sync; ``in_thread`` runs
it in the calling thread instead, with neither protection (what the tests use, but for
those about crashes and time limits).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel

from epfleet.errors import EpfleetError, HealthCheckError, summarize
from epfleet.formats.device_report import MAX_ERROR, Profile, ShadowRun
from epfleet.formats.manifest import FoldedIo
from epfleet.formats.task_metric import TaskMetric
from epfleet.runtime.folded_io import dequantized_outputs, mismatch, quantized_inputs
from epfleet.runtime.op_types import graph_op_types
from epfleet.runtime.samples import Comparison, compare, load_samples, read_golden
from epfleet.runtime.sessions import input_infos, io_types, open_session, run_samples
from eps.base import DeviceType, Tolerance, bounded


class HealthJob(BaseModel):
    label: str
    """The variant's name, for messages."""
    path: str
    ep: str
    device: DeviceType
    provider_options: dict[str, str]
    input_shapes: dict[str, list[int]]
    """Shapes for inputs with symbolic dims (the manifest's source shapes); other
    symbolic dims run at 1."""
    golden_path: str | None = None
    """The model's golden samples: run on those and compare, instead of zero inputs."""
    tolerance: Tolerance | None = None
    """How far from the golden outputs the variant may be."""
    metric: TaskMetric | None = None
    """The model's task metric as the compile host measured it: measured again here, on
    this device's EP (a custom one, whose package a device need not have, is not)."""
    folded_io: FoldedIo | None = None
    """A folded variant's integer inputs and outputs (its entry's): it must load with CPU
    fallback disabled, and runs on its golden inputs quantised, outputs dequantised."""


class HealthRunner(Protocol):
    def __call__(self, job: HealthJob, doing: str, timeout: float | None) -> Health:
        """``check_health(job)``, run somewhere; ``doing`` names it in a crash's message and
        ``timeout`` (seconds, None: none) is its time limit."""
        ...


def in_thread(job: HealthJob, doing: str, timeout: float | None) -> Health:
    """Run the check in the calling thread: no worker process to start, and no time limit
    (``timeout`` is not enforced) nor isolation from a crash of the EP's native code."""
    return check_health(job)


class Health(BaseModel):
    seconds: float
    providers: list[str]
    outputs: int
    samples: int = 0
    max_rel_error: float | None = None
    profile: Profile | None = None


REPEATS = 4
"""Runs of the first sample after the check's own, for the profile's percentiles."""


def profiled(
    session: Any, samples: list[Any], session_ms: float, first_ms: list[float], path: str
) -> Profile:
    """Time ``REPEATS`` more runs of the first sample and say how the variant ran: its
    session, first run, median and 95th percentile, and which nodes its EP took (the
    EPContext nodes of a compiled variant; every node of one its EP runs whole)."""
    import numpy as np

    times = list(first_ms)
    for _ in range(REPEATS):
        started = time.perf_counter()
        session.run(None, samples[0])
        times.append((time.perf_counter() - started) * 1000)
    nodes = graph_op_types(path)  # not onnx.load: importing onnx costs a second per worker
    contexts = nodes.count("EPContext")
    ep_nodes, other = (contexts, len(nodes) - contexts) if contexts else (len(nodes), 0)
    return Profile(
        session_ms=round(session_ms, 2),
        first_run_ms=round(first_ms[0], 2),
        p50_ms=round(float(np.percentile(times, 50)), 3),
        p95_ms=round(float(np.percentile(times, 95)), 3),
        runs=len(times),
        ep_nodes=ep_nodes,
        other_nodes=other,
    )


def timed_runs(session: Any, samples: list[Any], what: str) -> tuple[list[Any], list[float]]:
    """``run_samples``, each run timed (milliseconds)."""
    outputs, times = [], []
    for sample in samples:
        started = time.perf_counter()
        outputs.extend(run_samples(session, [sample], what))
        times.append((time.perf_counter() - started) * 1000)
    return outputs, times


def opened(job: HealthJob) -> tuple[Any, float]:
    """The variant's session (a folded one with CPU fallback disabled) and the milliseconds
    it took to create; HealthCheckError when its EP cannot load it."""
    started = time.perf_counter()
    try:
        session = open_session(
            job.path,
            job.ep,
            job.provider_options,
            job.device,
            job.label,
            cpu_fallback=job.folded_io is None,
        )
    except EpfleetError:
        raise
    except Exception as exc:
        raise HealthCheckError(f"{job.ep} cannot load {job.label}: {summarize(exc, 400)}") from None
    return session, (time.perf_counter() - started) * 1000


def float_runs(
    session: Any, job: HealthJob, samples: list[Any], what: str
) -> tuple[list[Any], list[Any], list[float]]:
    """The variant's outputs on float ``samples``, each run timed: what it was fed (a
    folded variant its inputs quantised), its outputs (a folded one's dequantised) and the
    milliseconds of each run."""
    folded = job.folded_io
    if folded is None:
        outputs, times = timed_runs(session, samples, what)
        return samples, outputs, times
    problem = mismatch(folded, *io_types(session))
    if problem is not None:
        raise HealthCheckError(f"{job.label}: {problem}; not activated")
    fed = [quantized_inputs(sample, folded) for sample in samples]
    integers, times = timed_runs(session, fed, what)
    names = [output.name for output in session.get_outputs()]
    return fed, [dequantized_outputs(o, names, folded) for o in integers], times


def check_health(job: HealthJob) -> Health:
    import numpy as np

    started = time.perf_counter()
    name = job.label
    session, session_ms = opened(job)
    if job.folded_io is not None and job.golden_path is None:
        raise HealthCheckError(
            f"{name} is a folded variant and the manifest has no golden samples to check "
            "its integer inputs and outputs against; not activated"
        )
    if job.golden_path is None:
        infos = input_infos(session, job.input_shapes)
        zeros = [{i.name: np.zeros(i.shape, dtype=i.dtype) for i in infos}]
        outputs, times = timed_runs(session, zeros, f"{job.ep} loaded {name} but on zero inputs")
        return Health(
            seconds=round(time.perf_counter() - started, 3),
            providers=list(session.get_providers()),
            outputs=len(outputs[0]),
            profile=profiled(session, zeros, session_ms, times, job.path),
        )
    try:
        samples, reference = read_golden(Path(job.golden_path))
    except ValueError as exc:
        raise HealthCheckError(f"{name}: {exc}") from None
    what = f"{job.ep} loaded {name} but on its golden samples"
    fed, outputs, times = float_runs(session, job, samples, what)
    failure = out_of_bounds(job, session, outputs, reference)
    if failure:
        raise HealthCheckError(f"{name} on its golden samples: {failure[0]}; not activated")
    return Health(
        seconds=round(time.perf_counter() - started, 3),
        providers=list(session.get_providers()),
        outputs=len(outputs[0]),
        samples=len(samples),
        max_rel_error=compare(outputs, reference).max_rel_error,
        profile=profiled(session, fed, session_ms, times, job.path),
    )


def out_of_bounds(
    job: HealthJob, session: Any, outputs: list[Any], reference: list[Any]
) -> tuple[str, Comparison | None, float | None] | None:
    """Why ``outputs`` fall outside ``job``'s bounds of ``reference`` (its tolerance, and its
    task metric where it has one), with the comparison and the metric's value where they
    were measured; None when they are within."""
    try:
        comparison = compare(outputs, reference)
    except ValueError as exc:
        return f"its outputs do not line up with the reference: {exc}", None, None
    # Never looser than LOOSEST_TOLERANCE, whatever the entry says (an entry validated
    # under older rules, or signed with a stolen online key).
    allowed = bounded(job.tolerance or Tolerance(relative=0.0, absolute=0.0))
    failure = comparison.failure(allowed.relative, allowed.absolute)
    if failure:
        return failure, comparison, None
    if job.metric is not None and job.metric.kind != "custom":
        missed, value = missed_metric(job.metric, session, outputs, reference)
        if missed:
            return missed, comparison, value
    return None


def missed_metric(
    metric: TaskMetric, session: Any, outputs: list[Any], reference: list[Any]
) -> tuple[str | None, float | None]:
    """Why the variant misses the task metric on this device (None: it does not), and the
    metric's value (None: not measured)."""
    from epfleet.runtime.metrics import MetricError, measure, output_index

    names = [output.name for output in session.get_outputs()]
    spec = metric.spec()
    try:
        index = output_index(spec, names)
        value = measure(spec, [o[index] for o in outputs], [r[index] for r in reference])
    except MetricError as exc:
        return f"task metric {spec.describe()} not measured: {exc}", None
    if value >= metric.min:
        return None, value
    measured_here = {"value": value, "hits": None, "trials": None, "low": None, "high": None}
    scored = metric.model_copy(update=measured_here).describe()
    host = "nothing" if metric.value is None else f"{metric.value:.4g}"
    return (
        f"task metric {scored} on output {metric.output!r} (the compile host measured {host})",
        value,
    )


class ShadowJob(BaseModel):
    """A shadow run: the candidate beside the active variant on the same inputs."""

    candidate: HealthJob
    """The candidate, with the model's bounds to judge it by (its tolerance, task metric)."""
    active: HealthJob
    inputs_path: str
    """The app's inputs (arrays by input name, a leading axis of samples), or the golden
    samples file whose inputs are used."""
    inputs: Literal["app", "golden"]
    samples: int
    """Run at most this many of them."""


class ShadowOutcome(BaseModel):
    run: ShadowRun
    outside: str | None = None
    """Why the candidate is outside the bounds (None: within)."""


def run_shadow(job: ShadowJob) -> ShadowOutcome:
    """Run the active variant and then the candidate on the inputs (each once more on
    the first, before, untimed: their p50s are of warm sessions) and judge the
    candidate's outputs against the active one's by the candidate's bounds
    (``out_of_bounds``: the health check's rules, the active variant's outputs in place of
    the source's). HealthCheckError when either cannot load or run, or the inputs do not
    fit the model."""
    import numpy as np

    started = time.perf_counter()
    active, _ = opened(job.active)
    inputs = shadow_inputs(job, active)
    runs = "the shadow run of {} on the {} inputs".format
    doing = runs(job.active.label, job.inputs)
    float_runs(active, job.active, inputs[:1], doing)  # warm-up: not timed
    _, reference, active_ms = float_runs(active, job.active, inputs, doing)
    del active
    candidate, _ = opened(job.candidate)
    doing = runs(job.candidate.label, job.inputs)
    float_runs(candidate, job.candidate, inputs[:1], doing)
    _, outputs, candidate_ms = float_runs(candidate, job.candidate, inputs, doing)
    outside = out_of_bounds(job.candidate, candidate, outputs, reference)
    metric = job.candidate.metric
    if metric is not None and metric.kind == "custom":
        metric = None  # as the health check: a custom metric's package need not be here
    if outside is None:
        comparison: Comparison | None = compare(outputs, reference)
        value = missed_metric(metric, candidate, outputs, reference)[1] if metric else None
    else:
        _, comparison, value = outside
    error = comparison.max_rel_error if comparison is not None else None
    allowed = bounded(job.candidate.tolerance or Tolerance(relative=0.0, absolute=0.0))
    run = ShadowRun(
        candidate=job.candidate.label,
        active=job.active.label,
        samples=len(inputs),
        inputs=job.inputs,
        within=outside is None,
        max_rel_error=_figure(error),
        tolerance=allowed.relative,
        metric=metric.kind if metric else None,
        metric_value=_figure(value),
        metric_min=metric.min if metric else None,
        candidate_p50_ms=round(float(np.percentile(candidate_ms, 50)), 3),
        active_p50_ms=round(float(np.percentile(active_ms, 50)), 3),
        seconds=round(time.perf_counter() - started, 3),
    )
    # the health check's words name the source: here the reference is the active variant
    why = None if outside is None else outside[0].replace("the source", "the active variant")
    return ShadowOutcome(run=run, outside=why)


def shadow_inputs(job: ShadowJob, active: Any) -> list[Any]:
    """The first ``job.samples`` of the shadow run's inputs."""
    if job.inputs == "golden":
        try:
            inputs = read_golden(Path(job.inputs_path))[0]
        except ValueError as exc:
            raise HealthCheckError(f"the shadow run's golden samples: {exc}") from None
    else:
        infos = input_infos(active, job.active.input_shapes)
        try:
            inputs = load_samples(Path(job.inputs_path), infos)
        except ValueError as exc:
            raise HealthCheckError(f"the app's shadow inputs do not fit the model: {exc}") from None
    return inputs[: job.samples]


def _figure(value: float | None) -> float | None:
    """A figure for the report: finite, within its bounds (an error of inf: the largest)."""
    if value is None or value != value:
        return None
    return round(max(-MAX_ERROR, min(float(value), MAX_ERROR)), 6)
