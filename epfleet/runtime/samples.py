"""Sample inputs, golden files and output comparison (pure: numpy and files, no ORT).

A golden file is an ``.npz`` holding each sample's inputs and the source model's
outputs on the CPU EP for them:

    input/<k>/<input name>     the k-th sample's input arrays
    output/<k>/<index>         the source's outputs for it, in output order

A model that names a task metric also has an input sets file: the further inputs the
metric is judged on (``INPUT_SETS``: its calibration and verification inputs) and the
source's outputs for them, kept apart so that readers of the golden file (devices of
every version) see the same file:

    set/<set>/<k>/<input name> the k-th input of a set
    setout/<set>/<k>/<index>   the source's outputs for it

It is written byte for byte the same for the same arrays (fixed zip timestamps),
so it can be stored content-addressed.
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Bumped when generated inputs or the golden layout change: part of every golden's basis.
GOLDEN_VERSION = "1"
GENERATED_SEED = 20261130
_ZIP_DATE = (2020, 1, 1, 0, 0, 0)

# ORT's element type names -> numpy dtypes.
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

Sample = dict[str, np.ndarray]
INPUT_SETS = ("calibration", "verification")
"""The input sets a golden file may hold beside its samples, in the order they are run."""


@dataclass(frozen=True)
class InputInfo:
    name: str
    dtype: str  # numpy dtype name
    shape: list[int]


def generated_samples(inputs: list[InputInfo], count: int = 1) -> list[Sample]:
    """Seeded inputs by dtype: floats uniform in [-1, 1), integers in {0, 1}, random bools.
    Small integers keep index-like inputs (token ids, Gather indices) in range."""
    rng = np.random.default_rng(GENERATED_SEED)
    samples = []
    for _ in range(count):
        sample: Sample = {}
        for info in inputs:
            dtype = np.dtype(info.dtype)
            if dtype.kind == "f":
                sample[info.name] = rng.uniform(-1, 1, info.shape).astype(dtype)
            elif dtype.kind == "b":
                sample[info.name] = rng.integers(0, 2, info.shape).astype(bool)
            else:
                sample[info.name] = rng.integers(0, 2, info.shape).astype(dtype)
        samples.append(sample)
    return samples


def load_samples(path: Path, inputs: list[InputInfo]) -> list[Sample]:
    """Samples from a user's ``.npz`` of arrays by input name. An array shaped like its
    input is one sample; one with an extra leading axis holds that many samples.
    ValueError naming the array when it does not fit."""
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path} is not a readable .npz file: {exc}") from None
    with archive:
        arrays = {name: archive[name] for name in archive.files}
    expected = {info.name: info for info in inputs}
    unknown = sorted(set(arrays) - set(expected))
    if unknown:
        raise ValueError(
            f"{path} has arrays {unknown} that are not model inputs; the inputs are "
            f"{sorted(expected)}"
        )
    missing = sorted(set(expected) - set(arrays))
    if missing:
        raise ValueError(f"{path} lacks arrays for inputs {missing}")
    counts = {}
    for name, array in arrays.items():
        info = expected[name]
        if list(array.shape) == info.shape:
            counts[name] = 0
        elif list(array.shape[1:]) == info.shape and array.shape[0] > 0:
            counts[name] = array.shape[0]
        else:
            raise ValueError(
                f"{path}: array {name!r} has shape {list(array.shape)}; input {name!r} takes "
                f"{info.shape} (one sample) or [N, {', '.join(map(str, info.shape))}] (N samples)"
            )
        if array.dtype != np.dtype(info.dtype):
            raise ValueError(
                f"{path}: array {name!r} is {array.dtype}; input {name!r} takes {info.dtype}"
            )
    sizes = set(counts.values())
    if len(sizes) > 1:
        raise ValueError(f"{path}: arrays hold different numbers of samples: {counts}")
    count = sizes.pop()
    if count == 0:
        return [arrays]
    return [{name: array[k] for name, array in arrays.items()} for k in range(count)]


@dataclass(frozen=True)
class InputSet:
    """Inputs beside the golden samples, and the source's outputs for them."""

    name: str
    inputs: list[Sample]
    outputs: list[list[np.ndarray]]


def write_golden(path: Path, samples: list[Sample], outputs: list[list[np.ndarray]]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for k, sample in enumerate(samples):
            for name in sorted(sample):
                _add(archive, f"input/{k}/{name}", sample[name])
            for index, array in enumerate(outputs[k]):
                _add(archive, f"output/{k}/{index}", array)


def write_input_sets(path: Path, sets: list[InputSet]) -> None:
    """The input sets file, byte for byte the same for the same arrays."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for extra in sets:
            for k, sample in enumerate(extra.inputs):
                for name in sorted(sample):
                    _add(archive, f"set/{extra.name}/{k}/{name}", sample[name])
                for index, array in enumerate(extra.outputs[k]):
                    _add(archive, f"setout/{extra.name}/{k}/{index}", array)


def distinct_inputs(candidates: list[Sample], seen: list[Sample]) -> list[Sample]:
    """``candidates`` without any input among ``seen`` or repeated: an input counts once."""
    known = {sample_digest(s) for s in seen}
    kept = []
    for sample in candidates:
        digest = sample_digest(sample)
        if digest not in known:
            known.add(digest)
            kept.append(sample)
    return kept


def write_samples(path: Path, samples: list[Sample]) -> None:
    """``samples`` in the samples format (arrays by input name, a leading axis of samples),
    byte for byte the same for the same arrays."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in sorted(samples[0]):
            _add(archive, name, np.stack([sample[name] for sample in samples]))


def sample_digest(sample: Sample) -> str:
    """One sample's identity: its arrays' names, dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for name in sorted(sample):
        array = np.ascontiguousarray(sample[name])
        digest.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _add(archive: zipfile.ZipFile, name: str, array: np.ndarray) -> None:
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.ascontiguousarray(array), allow_pickle=False)
    info = zipfile.ZipInfo(name + ".npy", date_time=_ZIP_DATE)
    info.compress_type = zipfile.ZIP_DEFLATED
    archive.writestr(info, buffer.getvalue())


def read_golden(path: Path) -> tuple[list[Sample], list[list[np.ndarray]]]:
    """Each sample's inputs and reference outputs; ValueError when the file is malformed."""
    paired = _read_pairs(path, ("input", "output"), "golden samples")
    if list(paired) != [""]:
        raise ValueError(f"{path} is not a golden samples file: samples and outputs do not pair")
    return paired[""]


def read_input_sets(path: Path) -> list[InputSet]:
    """The input sets a file holds, in ``INPUT_SETS`` order; ValueError when malformed."""
    paired = _read_pairs(path, ("set", "setout"), "input sets")
    unknown = sorted(set(paired) - set(INPUT_SETS))
    if unknown:
        raise ValueError(f"{path} is not an input sets file: unknown sets {unknown}")
    return [InputSet(name, *paired[name]) for name in INPUT_SETS if name in paired]


def _read_pairs(
    path: Path, kinds: tuple[str, str], what: str
) -> dict[str, tuple[list[Sample], list[list[np.ndarray]]]]:
    """Inputs and outputs by set ("" for a golden file's samples), paired by index."""
    given_kind = kinds[0]
    inputs: dict[str, dict[int, Sample]] = {}
    outputs: dict[str, dict[int, dict[int, np.ndarray]]] = {}
    try:
        with np.load(path, allow_pickle=False) as archive:
            for key in archive.files:
                kind, rest = key.split("/", 1)
                if kind not in kinds:
                    raise ValueError(f"unexpected array {key!r}")
                where = ""
                if kind in ("set", "setout"):
                    where, rest = rest.split("/", 1)
                k, name = rest.split("/", 1)
                if kind == given_kind:
                    inputs.setdefault(where, {}).setdefault(int(k), {})[name] = archive[key]
                else:
                    outputs.setdefault(where, {}).setdefault(int(k), {})[int(name)] = archive[key]
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path} is not a {what} file: {exc}") from None
    paired = {}
    for where in sorted(set(inputs) | set(outputs)):
        given, made = inputs.get(where, {}), outputs.get(where, {})
        if sorted(given) != sorted(made) or sorted(given) != list(range(len(given))):
            raise ValueError(f"{path} is not a {what} file: inputs and outputs do not pair")
        paired[where] = (
            [given[k] for k in range(len(given))],
            [[made[k][i] for i in sorted(made[k])] for k in range(len(given))],
        )
    if not paired:
        raise ValueError(f"{path} is not a {what} file: it holds nothing")
    return paired


TAIL_PERCENTILE = 99.9


@dataclass(frozen=True)
class OutputError:
    """One output's error over every element of every sample (finite source values)."""

    index: int
    max_abs_error: float
    span: float
    """max(ref) - min(ref) over all samples' finite values, not within one sample."""
    floor: float = 0.0
    """The smallest range the error is divided by: the dtype's resolution at the output's
    scale (eps * max(1, max |ref|)), so a constant output (a scalar probability that never
    moves on the samples) gets a finite relative error."""
    tail_abs_error: float = 0.0
    """The TAIL_PERCENTILE-th percentile of |got - ref| over every element."""
    ref_min: float = 0.0
    ref_max: float = 0.0
    got_min: float = 0.0
    got_max: float = 0.0

    @property
    def rel_error(self) -> float:
        divisor = max(self.span, self.floor)
        if divisor > 0:
            return self.max_abs_error / divisor
        return 0.0 if self.max_abs_error == 0 else float("inf")


@dataclass(frozen=True)
class Comparison:
    outputs: list[OutputError]
    top1_agreement: float | None
    """Share of rows whose argmax agrees, over class-score outputs ([N, C] floats)."""

    @property
    def max_abs_error(self) -> float:
        return max((o.max_abs_error for o in self.outputs), default=0.0)

    @property
    def max_rel_error(self) -> float:
        """max |got - ref| / max(range over all samples, floor), the worst output."""
        return max((o.rel_error for o in self.outputs), default=0.0)

    def failure(self, tolerance: float, abs_tolerance: float = 0.0) -> str | None:
        """Why the variant is out of tolerance, or None. An output fails when its largest
        error exceeds both ``tolerance`` times its range and ``abs_tolerance``: an output
        that is nearly constant on the samples (a detector's heat map on noise spans
        2e-4) is judged by the absolute floor, the precision's own resolution. An output
        whose source values all lie in [0, 1] (a probability) fails when the variant leaves
        [0, 1] by more than ``abs_tolerance``, whatever its relative error."""
        for output in self.outputs:
            wrong = self._out_of_domain(output, abs_tolerance)
            if wrong:
                return wrong
            if output.max_abs_error > max(tolerance * output.span, abs_tolerance):
                return (
                    f"output {output.index} differs from the source by "
                    f"{output.rel_error:.1%} of its range (tolerance {tolerance:.1%}; "
                    f"{output.max_abs_error:.3g} against an absolute floor of {abs_tolerance:g})"
                )
        return None

    def domain_failure(self, abs_tolerance: float = 0.0) -> str | None:
        """Why the variant leaves the source's domain (a probability outside [0, 1]), or
        None: the check of ``failure`` that needs no range, for inputs the tolerance does
        not judge."""
        for output in self.outputs:
            wrong = self._out_of_domain(output, abs_tolerance)
            if wrong:
                return wrong
        return None

    @staticmethod
    def _out_of_domain(output: OutputError, abs_tolerance: float) -> str | None:
        if output.ref_min >= 0.0 and output.ref_max <= 1.0:
            for value in (output.got_min, output.got_max):
                if value < -abs_tolerance or value > 1.0 + abs_tolerance:
                    return (
                        f"output {output.index} gives {value:.6g}, outside [0, 1] where "
                        f"every source value lies (allowance {abs_tolerance:g})"
                    )
        return None


def resolution_floor(dtype: np.dtype, scale: float) -> float:
    """The dtype's resolution at ``scale``: eps * max(1, scale) for floats, 1 for integers."""
    if dtype.kind == "f":
        return float(np.finfo(dtype).eps) * max(1.0, scale)
    return 1.0


def compare(
    got: list[list[np.ndarray]],
    reference: list[list[np.ndarray]],
    labels: list[str] | None = None,
) -> Comparison:
    """Compare a variant's outputs with the source's over every element of every sample.
    ValueError naming the sample (``labels``, else ``sample <k>``) when they do not even
    line up (count, shape), or when the variant gives NaN/inf where the source gives a
    number."""
    diffs: dict[int, list[np.ndarray]] = {}
    bounds: dict[int, list[float]] = {}  # ref min, ref max, got min, got max, max |ref|
    dtypes: dict[int, np.dtype] = {}
    agree, rows = 0, 0
    for k, (outs, refs) in enumerate(zip(got, reference, strict=True)):
        sample = labels[k] if labels else f"sample {k}"
        if len(outs) != len(refs):
            raise ValueError(f"{sample}: {len(outs)} outputs, the source gives {len(refs)}")
        for index, (out, ref) in enumerate(zip(outs, refs, strict=True)):
            out, ref = np.asarray(out), np.asarray(ref)
            if out.size != ref.size:
                raise ValueError(
                    f"output {index} has shape {list(out.shape)} on {sample}, the source's "
                    f"{list(ref.shape)}"
                )
            out = out.reshape(ref.shape)
            if ref.dtype.kind not in "fiub":
                continue
            out64, ref64 = out.astype(np.float64), ref.astype(np.float64)
            finite = np.isfinite(ref64)
            bad = ~np.isfinite(out64) & finite
            if bad.any():
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                raise ValueError(
                    f"output {index} has NaN or inf ({out64[where]}) at {sample}, element "
                    f"{list(where)}, "
                    f"where the source gives {ref64[where]:.6g}"
                )
            if not finite.any():
                continue
            got_f, ref_f = out64[finite], ref64[finite]
            diffs.setdefault(index, []).append(np.abs(got_f - ref_f).ravel())
            dtypes[index] = out.dtype if out.dtype.kind == "f" else ref.dtype
            now = [ref_f.min(), ref_f.max(), got_f.min(), got_f.max(), np.abs(ref_f).max()]
            before = bounds.get(index)
            if before is not None:
                now = [
                    min(now[0], before[0]),
                    max(now[1], before[1]),
                    min(now[2], before[2]),
                    max(now[3], before[3]),
                    max(now[4], before[4]),
                ]
            bounds[index] = [float(v) for v in now]
            if ref.dtype.kind == "f" and ref.ndim == 2 and ref.shape[1] > 1:
                agree += int((out64.argmax(axis=1) == ref64.argmax(axis=1)).sum())
                rows += ref.shape[0]
    outputs = []
    for index in sorted(diffs):
        every = np.concatenate(diffs[index])
        ref_min, ref_max, got_min, got_max, scale = bounds[index]
        outputs.append(
            OutputError(
                index=index,
                max_abs_error=float(every.max()),
                span=ref_max - ref_min,
                floor=resolution_floor(dtypes[index], scale),
                tail_abs_error=float(np.percentile(every, TAIL_PERCENTILE)),
                ref_min=ref_min,
                ref_max=ref_max,
                got_min=got_min,
                got_max=got_max,
            )
        )
    return Comparison(outputs=outputs, top1_agreement=agree / rows if rows else None)
