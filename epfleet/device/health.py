"""The device's health check: run a variant before activating it, in a worker process.

On the model's golden samples when the manifest has them (compared with the source's
outputs within the variant's tolerance, never looser than ``eps.base.LOOSEST_TOLERANCE``),
on zero inputs otherwise. The session
helpers are shared with the compile host's verification (``epfleet.runtime.sessions``).
"""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from epfleet.errors import EpfleetError, HealthCheckError, summarize
from epfleet.runtime.samples import compare, read_golden
from epfleet.runtime.sessions import input_infos, open_session, run_samples
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


class Health(BaseModel):
    seconds: float
    providers: list[str]
    outputs: int
    samples: int = 0
    max_rel_error: float | None = None


def check_health(job: HealthJob) -> Health:
    import numpy as np

    started = time.perf_counter()
    name = job.label
    try:
        session = open_session(job.path, job.ep, job.provider_options, job.device, name)
    except EpfleetError:
        raise
    except Exception as exc:
        raise HealthCheckError(f"{job.ep} cannot load {name}: {summarize(exc, 400)}") from None
    if job.golden_path is None:
        infos = input_infos(session, job.input_shapes)
        zeros = [{i.name: np.zeros(i.shape, dtype=i.dtype) for i in infos}]
        outputs = run_samples(session, zeros, f"{job.ep} loaded {name} but on zero inputs")
        return Health(
            seconds=round(time.perf_counter() - started, 3),
            providers=list(session.get_providers()),
            outputs=len(outputs[0]),
        )
    try:
        samples, reference = read_golden(Path(job.golden_path))
    except ValueError as exc:
        raise HealthCheckError(f"{name}: {exc}") from None
    outputs = run_samples(session, samples, f"{job.ep} loaded {name} but on its golden samples")
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
    return Health(
        seconds=round(time.perf_counter() - started, 3),
        providers=list(session.get_providers()),
        outputs=len(outputs[0]),
        samples=len(samples),
        max_rel_error=comparison.max_rel_error,
    )
