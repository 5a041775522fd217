"""A model's calibration inputs, for its integer (QDQ) variants: kept apart from the inputs
it is verified on, and staged content-addressed when a fleet run plans.

The rules (``split``): no input may be both a calibration input and a verification
sample (a variant checked on the inputs it was calibrated on proves little), so an
overlap is refused, naming how many; when the spec gives calibration inputs and no
samples, a fifth of them (at least one, and at least one left to calibrate on) is held
out for verification, and the run says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx

from epfleet.errors import BadInputError
from epfleet.fleet.build.staging import HeldUploads, held_sample_file
from epfleet.formats.manifest import ArtifactRef
from epfleet.formats.spec import ModelSpec
from epfleet.runtime.samples import InputInfo, Sample, load_samples, sample_digest, write_samples

HOLD_OUT_SHARE = 5
"""Without samples, one calibration input in this many is held out for verification."""


@dataclass(frozen=True)
class StagedCalibration:
    ref: ArtifactRef
    """The inputs calibrated on, in the store (``samples/<sha256>.npz``)."""
    count: int
    held_out: Path | None
    """The inputs held out for verification (a samples file), when the spec gave none."""
    held_out_count: int = 0


def split(
    calibration: list[Sample], samples: list[Sample] | None, where: str
) -> tuple[list[Sample], list[Sample] | None]:
    """The inputs to calibrate on, and those held out for verification (None when the spec
    gave samples). BadInputError when the two share an input, or there are too few."""
    if samples is not None:
        verified = {sample_digest(s) for s in samples}
        shared = sum(sample_digest(s) in verified for s in calibration)
        if shared:
            raise BadInputError(
                f"{where}: {shared} of its {len(calibration)} inputs are also among the "
                "model's samples; a variant must be verified on inputs it was not "
                "calibrated on: give samples and calibration inputs that differ"
            )
        return calibration, None
    if len(calibration) < 2:
        raise BadInputError(
            f"{where} holds {len(calibration)} input(s): with no samples for verification "
            "it needs at least 2 (a fifth are held out to verify on); give more, or samples"
        )
    held = max(1, len(calibration) // HOLD_OUT_SHARE)
    return calibration[:-held], calibration[-held:]


def graph_inputs(model: onnx.ModelProto) -> list[InputInfo]:
    """The model's inputs (not its initializers), shapes as fixed for compiling."""
    initializers = {init.name for init in model.graph.initializer}
    infos = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        shape = [d.dim_value if d.dim_value > 0 else 1 for d in tensor.shape.dim]
        infos.append(InputInfo(value.name, dtype.name, shape))
    return infos


def stage_calibration(
    model: ModelSpec,
    calibration_path: Path,
    samples_path: Path | None,
    prepared: onnx.ModelProto,
    uploads: HeldUploads,
) -> StagedCalibration:
    """Check the calibration inputs against the model and its samples (``split``), and
    hold those to calibrate on to upload, content-addressed (``uploads``). A held-out part
    is written beside them for the golden samples."""
    where = f"models[{model.name}].calibration {model.calibration}"
    infos = graph_inputs(prepared)
    try:
        calibration = load_samples(calibration_path, infos)
        samples = load_samples(samples_path, infos) if samples_path else None
    except ValueError as exc:
        raise BadInputError(f"{where}: {exc}") from None
    kept, held = split(calibration, samples, where)
    folder = uploads.scratch()
    staged = folder / "calibration.npz"
    write_samples(staged, kept)
    ref = held_sample_file(staged, uploads)
    held_out = None
    if held is not None:
        held_out = folder / "held-out.npz"
        write_samples(held_out, held)
    return StagedCalibration(
        ref=ref,
        count=len(kept),
        held_out=held_out,
        held_out_count=len(held or []),
    )
