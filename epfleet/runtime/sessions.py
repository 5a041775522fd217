"""Running a model with ONNX Runtime: open a session for an EP and feed it inputs.

Shared by the compile host's verification before it publishes a variant
(``epfleet.fleet.build.verify``) and the device's health check before it activates one
(``epfleet.device.health``). Both call these in worker processes: an EP whose native
code crashes on a bad artifact takes down the worker, not the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import eps
from epfleet.errors import HealthCheckError, ep_errors, summarize
from epfleet.formats.variant_checks import FoldedIo
from epfleet.runtime.folded_io import dequantized_outputs, mismatch, quantized_inputs
from epfleet.runtime.samples import NUMPY_TYPES, InputInfo, Sample
from eps.base import DeviceType

if TYPE_CHECKING:
    import numpy as np
    import onnxruntime


def open_session(
    path: str,
    ep: str,
    provider_options: dict[str, str],
    device: DeviceType,
    label: str,
    cpu_fallback: bool = True,
) -> onnxruntime.InferenceSession:
    """An ORT session for the variant at ``path`` on ``ep``; without ``cpu_fallback``, ORT
    refuses it unless an EP that partitions graphs takes every node
    (``session.disable_cpu_ep_fallback``).
    Raises epfleet's NoDeviceError or MissingExtraError when this machine cannot run it,
    and HealthCheckError when ORT refuses the model."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    # A check runs a few samples, so packing weights buys nothing, and ORT's CPU EP packs
    # by copying every MatMul weight to the heap: a 2.2 GB model then peaks at 2.8 GB
    # of RSS instead of running from its memory-mapped data file (bench/large_model.py).
    options.add_session_config_entry("session.disable_prepacking", "1")
    with ep_errors():
        module = eps.load(ep)
        module.configure_session(options, provider_options, device)
    # An EP that runs whole graphs (the CPU EP) has no fallback to disable: ORT refuses the
    # setting beside the CPU EP itself.
    whole = not cpu_fallback and module.partitions_graph
    if whole:
        options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    try:
        return ort.InferenceSession(path, options)
    except Exception as exc:
        without = " with CPU fallback disabled" if whole else ""
        raise HealthCheckError(
            f"{ep} cannot load {label}{without}: {summarize(exc, 400)}"
        ) from None


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


def io_types(session: onnxruntime.InferenceSession) -> tuple[dict[str, str], dict[str, str]]:
    """The session's inputs and outputs, name to ORT type (``tensor(uint8)``)."""
    return (
        {arg.name: arg.type for arg in session.get_inputs()},
        {arg.name: arg.type for arg in session.get_outputs()},
    )


def folded_runner(
    session: Any, folded: FoldedIo, label: str
) -> Callable[[list[Sample]], list[list[Any]]]:
    """How to run float samples through a folded variant's ``session``: each input of
    ``folded`` quantised, each output dequantised (``epfleet.runtime.folded_io``).
    HealthCheckError when ``folded`` does not describe the session's model."""
    problem = mismatch(folded, *io_types(session))
    if problem is not None:
        raise HealthCheckError(f"{label}: {problem}")
    names = [output.name for output in session.get_outputs()]

    def run(samples: list[Sample]) -> list[list[Any]]:
        quantized = [quantized_inputs(sample, folded) for sample in samples]
        outputs = run_samples(session, quantized, f"loaded {label}, quantised inputs")
        return [dequantized_outputs(o, names, folded) for o in outputs]

    return run
