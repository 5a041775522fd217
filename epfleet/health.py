"""Running a variant: open an ORT session for its EP and feed it inputs.

Two callers: the device's health check before it activates a variant (golden samples
when the manifest has them, zero inputs otherwise), and the compile host's
verification before it publishes one (``epfleet.verify``). Both run in worker
processes: an EP whose native code crashes on a bad artifact takes down the worker,
not the caller.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

import eps
from epfleet.errors import EpfleetError, HealthCheckError, summarize
from epfleet.samples import NUMPY_TYPES, InputInfo, Sample, compare, read_golden
from eps.base import DeviceType

if TYPE_CHECKING:
    import numpy as np
    import onnxruntime


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
    tolerance: float | None = None
    """Largest error relative to an output's range accepted against the golden outputs."""


class Health(BaseModel):
    seconds: float
    providers: list[str]
    outputs: int
    samples: int = 0
    max_rel_error: float | None = None


def open_session(
    path: str, ep: str, provider_options: dict[str, str], device: DeviceType, label: str
) -> onnxruntime.InferenceSession:
    """An ORT session for the variant at ``path`` on ``ep``. Raises NoDeviceError or
    MissingExtraError (from the EP module) when this machine cannot run it, and
    HealthCheckError when ORT refuses the model."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    eps.load(ep).configure_session(options, provider_options, device)
    try:
        return ort.InferenceSession(path, options)
    except Exception as exc:
        raise HealthCheckError(f"{ep} cannot load {label}: {summarize(exc, 400)}") from None


def input_infos(
    session: onnxruntime.InferenceSession, input_shapes: dict[str, list[int]]
) -> list[InputInfo]:
    infos = []
    for arg in session.get_inputs():
        dtype = NUMPY_TYPES.get(arg.type)
        if dtype is None:
            raise HealthCheckError(f"input {arg.name!r} has type {arg.type}, not a tensor")
        given = input_shapes.get(arg.name)
        shape = given or [d if isinstance(d, int) and d > 0 else 1 for d in arg.shape]
        infos.append(InputInfo(arg.name, dtype, shape))
    return infos


def run_samples(
    session: onnxruntime.InferenceSession, samples: list[Sample], what: str
) -> list[list[np.ndarray]]:
    """The session's outputs for each sample; HealthCheckError when a run fails."""
    names = {arg.name for arg in session.get_inputs()}
    outputs = []
    for k, sample in enumerate(samples):
        missing = sorted(names - set(sample))
        if missing:
            raise HealthCheckError(f"{what}: sample {k} has no array for inputs {missing}")
        try:
            outputs.append(session.run(None, {name: sample[name] for name in names}))
        except Exception as exc:
            raise HealthCheckError(
                f"{what}: running sample {k} failed: {summarize(exc, 400)}"
            ) from None
    return outputs


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
    failure = comparison.failure(job.tolerance if job.tolerance is not None else 0.0)
    if failure:
        raise HealthCheckError(f"{name} on its golden samples: {failure}; not activated")
    return Health(
        seconds=round(time.perf_counter() - started, 3),
        providers=list(session.get_providers()),
        outputs=len(outputs[0]),
        samples=len(samples),
        max_rel_error=comparison.max_rel_error,
    )
