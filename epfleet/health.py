"""Health check of a variant before a device activates it: open an ORT session for its EP
and run it once on zero inputs of its declared shapes.

It runs in a worker process (``epfleet.pool``): an EP whose native code crashes on a
bad artifact takes down the worker, not the device's sync.
"""

from __future__ import annotations

import time

from pydantic import BaseModel

import eps
from epfleet.errors import EpfleetError, HealthCheckError, summarize
from eps.base import DeviceType

# ORT's element type names -> numpy dtype names, for the zero inputs.
NUMPY_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(uint8)": "uint8",
    "tensor(uint16)": "uint16",
    "tensor(uint32)": "uint32",
    "tensor(uint64)": "uint64",
    "tensor(bool)": "bool",
}


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


class Health(BaseModel):
    seconds: float
    providers: list[str]
    outputs: int


def check_health(job: HealthJob) -> Health:
    import numpy as np
    import onnxruntime as ort

    started = time.perf_counter()
    name = job.label
    options = ort.SessionOptions()
    try:
        eps.load(job.ep).configure_session(options, job.provider_options, job.device)
        session = ort.InferenceSession(job.path, options)
    except EpfleetError:
        raise
    except Exception as exc:
        raise HealthCheckError(f"{job.ep} cannot load {name}: {summarize(exc, 400)}") from None
    feeds = {}
    for arg in session.get_inputs():
        dtype = NUMPY_TYPES.get(arg.type)
        if dtype is None:
            raise HealthCheckError(f"{name}: input {arg.name!r} has type {arg.type}, not a tensor")
        given = job.input_shapes.get(arg.name)
        shape = given or [d if isinstance(d, int) and d > 0 else 1 for d in arg.shape]
        feeds[arg.name] = np.zeros(shape, dtype=dtype)
    try:
        outputs = session.run(None, feeds)
    except Exception as exc:
        raise HealthCheckError(
            f"{job.ep} loaded {name} but running it on zero inputs failed: {summarize(exc, 400)}"
        ) from None
    return Health(
        seconds=round(time.perf_counter() - started, 3),
        providers=list(session.get_providers()),
        outputs=len(outputs),
    )
