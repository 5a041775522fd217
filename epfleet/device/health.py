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
from typing import Any, Protocol

from pydantic import BaseModel

from epfleet.errors import EpfleetError, HealthCheckError, summarize
from epfleet.formats.device_report import Profile
from epfleet.formats.manifest import FoldedIo
from epfleet.formats.task_metric import TaskMetric
from epfleet.runtime.folded_io import dequantized_outputs, mismatch, quantized_inputs
from epfleet.runtime.op_types import graph_op_types
from epfleet.runtime.samples import compare, read_golden
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


def check_health(job: HealthJob) -> Health:
    import numpy as np

    started = time.perf_counter()
    name = job.label
    folded = job.folded_io
    try:
        session = open_session(
            job.path, job.ep, job.provider_options, job.device, name, cpu_fallback=folded is None
        )
    except EpfleetError:
        raise
    except Exception as exc:
        raise HealthCheckError(f"{job.ep} cannot load {name}: {summarize(exc, 400)}") from None
    session_ms = (time.perf_counter() - started) * 1000
    if folded is not None and job.golden_path is None:
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
    if folded is None:
        fed = samples
        outputs, times = timed_runs(session, fed, what)
    else:  # fed its golden inputs quantised, its outputs dequantised
        problem = mismatch(folded, *io_types(session))
        if problem is not None:
            raise HealthCheckError(f"{name}: {problem}; not activated")
        fed = [quantized_inputs(sample, folded) for sample in samples]
        integers, times = timed_runs(session, fed, what)
        names = [output.name for output in session.get_outputs()]
        outputs = [dequantized_outputs(o, names, folded) for o in integers]
    try:
        comparison = compare(outputs, reference)
    except ValueError as exc:
        raise HealthCheckError(f"{name} disagrees with its golden samples: {exc}") from None
    # Never looser than LOOSEST_TOLERANCE, whatever the entry says (an entry validated
    # under older rules, or signed with a stolen online key).
    allowed = bounded(job.tolerance or Tolerance(relative=0.0, absolute=0.0))
    failure = comparison.failure(allowed.relative, allowed.absolute)
    if failure:
        raise HealthCheckError(f"{name} on its golden samples: {failure}; not activated")
    if job.metric is not None and job.metric.kind != "custom":
        missed = missed_metric(job.metric, session, outputs, reference)
        if missed:
            raise HealthCheckError(f"{name} on its golden samples: {missed}; not activated")
    return Health(
        seconds=round(time.perf_counter() - started, 3),
        providers=list(session.get_providers()),
        outputs=len(outputs[0]),
        samples=len(samples),
        max_rel_error=comparison.max_rel_error,
        profile=profiled(session, fed, session_ms, times, job.path),
    )


def missed_metric(
    metric: TaskMetric, session: Any, outputs: list[Any], reference: list[Any]
) -> str | None:
    """Why the variant misses the task metric on this device, or None."""
    from epfleet.runtime.metrics import MetricError, measure, output_index

    names = [output.name for output in session.get_outputs()]
    spec = metric.spec()
    try:
        index = output_index(spec, names)
        value = measure(spec, [o[index] for o in outputs], [r[index] for r in reference])
    except MetricError as exc:
        return f"task metric {spec.describe()} not measured: {exc}"
    if value >= metric.min:
        return None
    measured_here = {"value": value, "hits": None, "trials": None, "low": None, "high": None}
    scored = metric.model_copy(update=measured_here).describe()
    host = "nothing" if metric.value is None else f"{metric.value:.4g}"
    return f"task metric {scored} on output {metric.output!r} (the compile host measured {host})"
