"""Verification on the compile host: run each new variant with its own EP on the model's
golden samples and compare with the source's outputs on the CPU EP, before it is
published.

``make_golden`` and ``run_verification`` run inside killable worker processes
(``epfleet.runtime.workers``); ``golden_for`` and ``verify_artifact`` are what callers use.
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from epfleet.errors import (
    BadInputError,
    EpfleetError,
    HealthCheckError,
    MissingExtraError,
    summarize,
)
from epfleet.fleet.build.decision_rules import (
    DEFAULT_DECISION_MIN,
    LAYOUT_OPS,
    LINEAR_OPS,
    SCORE_OPS,
    class_scores,
    decision_metric,
    judged_by_default,
)
from epfleet.formats.manifest import FoldedIo, Verification
from epfleet.formats.task_metric import SHARE_KINDS, MetricSpec, TaskMetric
from epfleet.runtime.samples import (
    INPUT_SETS,
    Comparison,
    InputSet,
    compare,
    distinct_inputs,
    generated_samples,
    load_samples,
    read_golden,
    read_input_sets,
    write_golden,
    write_input_sets,
)
from epfleet.runtime.sessions import folded_runner, input_infos, open_session, run_samples
from epfleet.runtime.shapes import uses_external_data
from epfleet.runtime.workers import WorkerDied, WorkerTimeout, shared_workers
from eps.base import DeviceType, Precision

GOLDEN_TIMEOUT = 900.0
GENERATED_COUNT = 1


class GoldenJob(BaseModel):
    source_path: str
    """The source with its input shapes fixed (beside its external data files)."""
    input_shapes: dict[str, list[int]]
    samples_path: str | None
    """The spec's ``samples`` file; None: seeded generated inputs."""
    dest: str
    sets: dict[str, str] = {}
    """Further inputs the task metric is judged on, by set (``INPUT_SETS``): files in the
    samples format. An input already among the samples or an earlier set counts once."""
    sets_dest: str | None = None
    """Where the input sets file goes (written only when a set holds an input)."""


def make_golden(job: GoldenJob) -> int:
    """Run the source on the CPU EP for each sample and write the golden file, and for each
    input of ``job.sets`` into the input sets file; the count of samples."""
    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    if uses_external_data(onnx.load(job.source_path, load_external_data=False)):
        # Weights stay in their memory-mapped files instead of a packed copy in the heap.
        options.add_session_config_entry("session.disable_prepacking", "1")
    session = ort.InferenceSession(job.source_path, options, providers=["CPUExecutionProvider"])
    infos = input_infos(session, job.input_shapes)
    if job.samples_path is not None:
        samples = load_samples(Path(job.samples_path), infos)
    else:
        samples = generated_samples(infos, GENERATED_COUNT)
    outputs = run_samples(session, samples, "the source on the CPU EP")
    sets, seen = [], list(samples)
    for name in INPUT_SETS:
        if name not in job.sets:
            continue
        inputs = distinct_inputs(load_samples(Path(job.sets[name]), infos), seen)
        if inputs:
            seen += inputs
            made = run_samples(session, inputs, "the source on the CPU EP")
            sets.append(InputSet(name, inputs, made))
    write_golden(Path(job.dest), samples, outputs)
    if sets and job.sets_dest is not None:
        write_input_sets(Path(job.sets_dest), sets)
    return len(samples)


def golden_for(job: GoldenJob) -> int:
    """``make_golden`` in a worker. Raises EpfleetError naming why no golden was made
    (bad samples file, source that does not run on the CPU EP, time limit)."""
    try:
        return shared_workers().call(make_golden, job, GOLDEN_TIMEOUT)
    except WorkerTimeout:
        raise EpfleetError(
            f"the source did not finish on the CPU EP within {GOLDEN_TIMEOUT:g} s"
        ) from None
    except WorkerDied as exc:
        raise EpfleetError(f"the source crashed the CPU EP ({exc})") from None
    except MemoryError as exc:
        raise EpfleetError(
            f"running the source on the CPU EP ran out of memory: {summarize(exc, 300)}"
        ) from None
    except ValueError as exc:  # the samples file does not fit the model
        raise BadInputError(str(exc)) from None
    except EpfleetError:
        raise
    except Exception as exc:
        raise EpfleetError(
            f"the source does not run on the CPU EP: {summarize(exc, 400)}"
        ) from None


class VerifyJob(BaseModel):
    label: str
    artifact_path: str
    golden_path: str
    ep: str
    device: DeviceType
    provider_options: dict[str, str]
    tolerance: float
    abs_tolerance: float = 0.0
    source_path: str | None = None
    """The source (a failure in fp16 is then checked for intermediates past its range)."""
    samples_origin: Literal["spec", "generated"] | None = None
    """Where the golden inputs came from, recorded with the result."""
    precision: Precision | None = None
    """What the variant computes in (None: its EP's default for its options)."""
    qdq_path: str | None = None
    """The QDQ model an integer variant was compiled from (a failure is then traced to the
    layers whose quantisation error explodes)."""
    twin_of: str | None = None
    """The target whose variant of the model computes the same outputs and is (or was)
    verified on every golden sample: this one runs the first ``TWIN_SAMPLES`` only."""
    metric: MetricSpec | None = None
    """The model's task metric: the variant must reach it as well as the tolerance."""
    metric_modules: str = ""
    """The modules a custom metric may come from (EPFLEET_METRIC_MODULES where it runs)."""
    folded_io: FoldedIo | None = None
    """A folded variant's integer inputs and outputs: it is loaded with CPU fallback
    disabled, fed the golden inputs quantised and its outputs dequantised."""
    sets_path: str | None = None
    """The model's input sets file: more inputs the named metric, or the default for class
    scores, is judged on."""
    decision_default: bool = True
    """With no metric: whether an integer variant's class scores are judged by their
    decisions (False: the spec's ``metric: {kind: none}``)."""


TWIN_SAMPLES = 1
"""How many golden samples a numerics twin runs: enough to prove it loads and runs."""


def run_verification(job: VerifyJob) -> Verification:
    """Run the variant on the golden inputs (a twin on its first ``TWIN_SAMPLES``) and
    compare with the source's outputs, each error relative to the output's range over
    every golden sample."""
    started = time.perf_counter()
    every, reference = read_golden(Path(job.golden_path))
    by_default = judged_by_default(job.precision, job.metric is not None, job.decision_default)
    judged_on_sets = job.sets_path is not None and (job.metric is not None or by_default)
    sets = read_input_sets(Path(job.sets_path)) if judged_on_sets and job.sets_path else []
    samples, twin_of = every, None
    if job.twin_of is not None and len(every) > TWIN_SAMPLES:
        samples, twin_of = every[:TWIN_SAMPLES], job.twin_of
    folded = job.folded_io
    try:
        session = open_session(
            job.artifact_path,
            job.ep,
            job.provider_options,
            job.device,
            job.label,
            cpu_fallback=folded is None,
        )
        if folded is not None:
            fed = folded_runner(session, folded, job.label)
    except HealthCheckError as exc:
        return _checked(
            job, "failed", str(exc), started, samples=len(samples), ran=True, twin_of=twin_of
        )
    except (MissingExtraError, EpfleetError) as exc:  # NoDeviceError is a CompileError
        reason = f"this host cannot run {job.ep} on a {job.device} device: {exc}"
        return _checked(job, "unverified", reason)
    runner = f"{'+'.join(session.get_providers())} on {platform.machine()}"
    if folded is not None and partitions_graph(job.ep):
        runner += " (CPU fallback disabled)"

    def run(inputs: list[Any]) -> list[list[Any]]:
        if folded is None:
            return run_samples(session, inputs, f"{job.ep} loaded {job.label}")
        return fed(inputs)

    try:
        outputs = run(samples)
        comparison = over_range_of(compare(outputs, reference[: len(samples)]), reference)
    except (HealthCheckError, ValueError) as exc:
        return _checked(
            job,
            "failed",
            str(exc),
            started,
            samples=len(samples),
            runner=runner,
            ran=True,
            twin_of=twin_of,
        )
    failure = comparison.failure(job.tolerance, job.abs_tolerance)
    names = [output.name for output in session.get_outputs()]
    metric, missed = None, None
    if job.metric is not None and twin_of is None:
        # A twin's metric is its representative's: a share over one sample is no measure.
        judged = judge_metric(
            job.metric,
            names,
            Evidence(outputs, reference[: len(samples)]),
            sets if failure is None else [],
            run,
            job,
        )
        metric, missed = judged.record, judged.missed
        if judged.failure:
            failure = judged.failure
    elif twin_of is None and by_default:
        decided = judge_decisions(
            job,
            names,
            Evidence(outputs, reference[: len(samples)]),
            sets if failure is None else [],
            run,
        )
        if decided is not None:
            metric, missed = decided.record, decided.missed
            failure = decided.failure or failure
    if failure and job.source_path and computes_in_fp16(job):
        failure += fp16_overflow(job.source_path, samples)
    elif failure and job.source_path and job.qdq_path:
        from epfleet.runtime.quantize import blame_layers

        failure += qdq_on_cpu(job, samples, reference) + blame_layers(
            job.source_path, job.qdq_path, samples
        )
    if missed:
        failure = f"{failure}; {missed}" if failure else missed
    worst = max(comparison.outputs, key=lambda o: o.rel_error, default=None)
    return _checked(
        job,
        "failed" if failure else "passed",
        failure,
        started,
        samples=len(samples),
        runner=runner,
        ran=True,
        max_abs_error=_rounded(comparison.max_abs_error),
        max_rel_error=_rounded(comparison.max_rel_error),
        top1_agreement=comparison.top1_agreement,
        twin_of=twin_of,
        metric=metric,
        worst_output=None if worst is None else _name_of(worst.index, names),
        error_range=None if worst is None else _rounded(max(worst.span, worst.floor)),
        error_floor=None if worst is None else _rounded(worst.floor),
        tail_abs_error=_rounded(max((o.tail_abs_error for o in comparison.outputs), default=0)),
    )


def judge_decisions(
    job: VerifyJob,
    names: list[str],
    evidence: Evidence,
    sets: list[InputSet],
    run: Callable[[list[Any]], list[list[Any]]],
) -> Judged | None:
    """The default metric of an integer variant of a model that names none: each output
    holding class scores judged by its decisions (``epfleet.fleet.build.decision_rules``) on the
    samples and the further sets, as a named metric is (``judge``). The record is the first
    output that misses, else the lowest scoring; None when no output holds class scores."""
    if job.source_path is None or not evidence.reference:
        return None
    specs = []
    for name, linear in class_score_outputs(job.source_path):
        if name in names:
            shape = tuple(evidence.reference[0][names.index(name)].shape)
            spec = decision_metric(name, shape, linear)
            if spec is not None:
                specs.append(spec)
    if not specs:
        return None
    judged = judge(specs, names, evidence, sets, run, job)
    records = [(r.model_copy(update={"default": True}), m) for r, m in judged.records]
    record, missed = next(
        ((r, m) for r, m in records if m), min(records, key=lambda rm: rm[0].value or 0.0)
    )
    if missed:
        missed += (
            f" (the default for an integer variant's class scores, min "
            f"{DEFAULT_DECISION_MIN:g}: name the model's metric to judge it otherwise, or "
            "metric: {kind: none} to judge it by the numeric gate alone)"
        )
    return Judged(record, missed, judged.failure)


def class_score_outputs(source_path: str) -> list[tuple[str, bool]]:
    """The source's graph outputs that hold class scores (``decision_rules.class_scores``),
    each with whether it is a linear head's (``linear_head``)."""
    import onnx

    try:
        model = onnx.load(source_path, load_external_data=False)
    except Exception:  # judged by the numeric gate alone, as before this default
        return []
    producers = {output: node for node in model.graph.node for output in node.output}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    found = []
    constants = {i.name for i in model.graph.initializer}
    constants |= {o for node in model.graph.node if node.op_type == "Constant" for o in node.output}
    for output in model.graph.output:
        node = producers.get(output.name)
        axis, rank = None, None
        if output.type.tensor_type.HasField("shape"):
            rank = len(output.type.tensor_type.shape.dim)
        if node is not None and node.op_type in SCORE_OPS:
            axis = -1 if opset >= 13 else 1  # the op's default axis
            for attribute in node.attribute:
                if attribute.name == "axis":
                    axis = attribute.i
        if class_scores(output.name, node.op_type if node else None, axis, rank):
            found.append((output.name, False))
        elif linear_head(output.name, producers, constants):  # scores by what makes them
            found.append((output.name, True))
    return found


def linear_head(name: str, producers: dict[str, Any], constants: set[str]) -> bool:
    """Whether graph output ``name`` is made by a MatMul or Gemm through ``LAYOUT_OPS``
    only (``decision_rules``)."""
    node = producers.get(name)
    for _ in range(16):
        if node is None:
            return False
        if node.op_type in LINEAR_OPS:
            return True
        if node.op_type not in LAYOUT_OPS or not node.input:
            return False
        data = [i for i in node.input if i not in constants] if node.op_type == "Add" else []
        if node.op_type == "Add" and len(data) != 1:
            return False
        node = producers.get(data[0] if data else node.input[0])
    return False


def _name_of(index: int, names: list[str]) -> str:
    return names[index] if index < len(names) else str(index)


SET_BATCH = 16
"""Inputs of a further set run between two looks at whether the metric is settled."""


@dataclass
class Evidence:
    """The variant's and the source's outputs the metric is judged on, and how many
    inputs of each set they hold."""

    outputs: list[list[Any]]
    reference: list[list[Any]]
    inputs: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.inputs = self.inputs or {"samples": len(self.outputs)}

    def add(self, name: str, outputs: list[list[Any]], reference: list[list[Any]]) -> None:
        self.outputs += outputs
        self.reference += reference
        self.inputs[name] = self.inputs.get(name, 0) + len(outputs)


@dataclass(frozen=True)
class Judged:
    record: TaskMetric
    missed: str | None
    """Why the variant misses the metric (None: it reaches it)."""
    failure: str | None = None
    """Why the variant failed on a further set's input (NaN, out of [0, 1], a crash)."""


def judge_metric(
    spec: MetricSpec,
    names: list[str],
    evidence: Evidence,
    sets: list[InputSet],
    run: Callable[[list[Any]], list[list[Any]]],
    job: VerifyJob,
) -> Judged:
    """The named metric over the golden samples and the further sets (``judge``)."""
    judged = judge([spec], names, evidence, sets, run, job)
    record, missed = judged.records[0]
    return Judged(record, missed, judged.failure)


@dataclass(frozen=True)
class JudgedAll:
    records: list[tuple[TaskMetric, str | None]]
    """Each metric's record, and why the variant misses it (None: it reaches it)."""
    failure: str | None = None


def judge(
    specs: list[MetricSpec],
    names: list[str],
    evidence: Evidence,
    sets: list[InputSet],
    run: Callable[[list[Any]], list[list[Any]]],
    job: VerifyJob,
) -> JudgedAll:
    """Each metric over the golden samples, then over each further set ``run`` in batches
    of ``SET_BATCH`` until the verdict is settled (one metric shown missed, or every one
    ``settled``) or every input has run. Each batch is also checked for NaN or inf where
    the source gives a number and for a probability leaving [0, 1]: such a failure ends
    the verdict."""

    def scores() -> list[tuple[TaskMetric, str | None]]:
        return [scored(spec, names, evidence, job.metric_modules) for spec in specs]

    records = scores()
    for extra in sets:
        for start in range(0, len(extra.inputs), SET_BATCH):
            if all(settled(r) for r, _ in records) or any(
                m and r.evidence == "misses" for r, m in records
            ):
                return JudgedAll(records)
            inputs = extra.inputs[start : start + SET_BATCH]
            want = extra.outputs[start : start + SET_BATCH]
            where = f"{extra.name} input(s) {start}-{start + len(inputs) - 1}"
            try:
                got = run(inputs)
                wrong = compare(got, want).domain_failure(job.abs_tolerance)
            except (HealthCheckError, ValueError) as exc:
                return JudgedAll(records, f"on {where}: {exc}")
            if wrong:
                return JudgedAll(records, f"on {where}: {wrong}")
            evidence.add(extra.name, got, want)
            records = scores()
    return JudgedAll(records)


def settled(record: TaskMetric) -> bool:
    """Whether more inputs cannot change the verdict the metric gives: a rate's bounds
    show it either way, a lowest-value metric (cosine, snr_db) is already below its
    minimum, or it could not be measured. A custom metric is never settled early."""
    if record.value is None:
        return True
    if record.evidence is not None:
        return record.evidence != "undecided"
    return record.kind in ("cosine", "snr_db") and record.value < record.min


def scored(
    spec: MetricSpec,
    names: list[str],
    evidence: Evidence,
    allowed_modules: str = "",
) -> tuple[TaskMetric, str | None]:
    """The variant's task metric, and why it misses it (None: it reaches ``spec.min``).
    A metric that cannot be measured (no such output, unsuitable shape, a custom function
    that fails or returns no number) is missed: nothing unjudged is published. A rate
    metric's count is weighed against ``spec.min`` (``epfleet.fleet.build.share_rules``)."""
    from epfleet.fleet.build.share_rules import weigh
    from epfleet.runtime.metrics import MetricError, counted, measure, output_index

    outputs, reference = evidence.outputs, evidence.reference

    output = spec.output or (names[0] if names else "0")
    record = TaskMetric(
        kind=spec.kind,
        output=output,
        value=None,
        min=spec.min,
        k=spec.k,
        blank=spec.blank,
        time_axis=spec.time_axis,
        function=spec.function,
    )
    inputs = dict(evidence.inputs)
    record = record.model_copy(update={"inputs": inputs})
    try:
        index = output_index(spec, names)
        got, want = [o[index] for o in outputs], [r[index] for r in reference]
        if spec.kind in SHARE_KINDS:
            hits, trials = counted(spec, got, want)
            value = hits / trials if trials else 1.0
        else:
            value, hits, trials = measure(spec, got, want, allowed_modules), 0, 0
    except MetricError as exc:
        return record, f"task metric {spec.describe()} not measured: {exc}"
    except Exception as exc:  # the custom function's own failure
        return record, f"task metric {spec.describe()} not measured: {summarize(exc, 300)}"
    record = record.model_copy(update={"value": value})
    doubt = None
    if trials:
        verdict = weigh(hits, trials, spec.min)
        record = record.model_copy(
            update={
                "hits": hits,
                "trials": trials,
                # Rounded outwards: a stored bound never claims more than was shown.
                "low": math.floor(verdict.low * 1e4) / 1e4,
                "high": math.ceil(verdict.high * 1e4) / 1e4,
                "evidence": verdict.evidence,
            }
        )
        unit = "inputs" if trials == len(outputs) else _unit(spec)
        doubt = verdict.doubt(spec.function or spec.kind, unit)
    if record.passed:
        return record, None
    why = f"task metric {record.describe()} on output {output!r} over {_inputs_said(inputs)}"
    if doubt:
        return record, f"{why}; {doubt}; below its minimum, so refused"
    return record, f"{why}: the variant changes what its users see, whatever its numeric error"


def _inputs_said(inputs: dict[str, int]) -> str:
    """``16 sample(s)``, or ``108 input(s) (12 samples, 96 calibration)``."""
    if list(inputs) == ["samples"]:
        return f"{inputs['samples']} sample(s)"
    parts = ", ".join(f"{count} {name}" for name, count in inputs.items())
    return f"{sum(inputs.values())} input(s) ({parts})"


def _unit(spec: MetricSpec) -> str:
    return "sequences" if spec.kind == "sequence_match" else "rows"


def over_range_of(comparison: Comparison, reference: list[list[Any]]) -> Comparison:
    """``comparison`` with each output's error relative to its range over every sample of
    ``reference``: a twin checked on one sample meets the tolerance its representative
    meets on all, not a stricter one of one sample's narrower range."""
    spans = {o.index: o.span for o in compare(reference, reference).outputs}
    outputs = [replace(o, span=max(o.span, spans.get(o.index, o.span))) for o in comparison.outputs]
    return replace(comparison, outputs=outputs)


FP16_MAX = 65504.0
SENTINEL_FLOOR = 3.4028235e38 / 1024
"""Magnitudes from here to float32's largest (3.4e38) are mask sentinels (finfo.min,
finfo.max and values computed from them), not results of computation."""


def qdq_on_cpu(job: VerifyJob, samples: list[Any], reference: list[Any]) -> str:
    """How far the QDQ model itself is, run on the CPU EP: within tolerance there, the loss
    is in how the EP executes it (measured: a 16-bit Softmax at a graph's output 297 % off
    on this host's HTP backend, its QDQ model 0.6 % on the CPU EP), not in quantising.

    It runs the QDQ model as written, each op between its DequantizeLinear and
    QuantizeLinear (graph optimisation off): the quantised arithmetic, simulated. Optimised,
    ORT fuses w8a8 into u8s8 integer kernels, which saturate on x86 without VNNI
    (VPMADDUBSW): ddddocr's w8a8 captcha reader read 50 % off that way against 11.7 % on
    the HTP backend, and the QDQ model blamed for a loss it does not have."""
    import onnxruntime as ort

    assert job.qdq_path is not None
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(job.qdq_path, options, providers=["CPUExecutionProvider"])
        comparison = compare(run_samples(session, samples, "the QDQ model"), reference)
    except Exception:  # a diagnosis only: the failure stands without it
        return ""
    off = f"; the QDQ model itself is {comparison.max_rel_error:.1%} off on the CPU EP"
    if comparison.failure(job.tolerance, job.abs_tolerance):
        return off
    return (
        f"{off}, within tolerance: the loss is in how {job.ep} executes it, not in "
        "quantising; leaving its last layers in float (quantization.nodes_to_exclude, e.g. "
        "a Softmax at the output) or another precision of the ladder may pass"
    )


def computes_in_fp16(job: VerifyJob) -> bool:
    """Whether the variant computes in fp16 (its precision, else its EP's default)."""
    import eps

    precision = job.precision or eps.load(job.ep).precisions(job.provider_options)[0]
    return precision == "fp16"


def fp16_overflow(source_path: str, samples: list[Any]) -> str:
    """Why a variant computing in fp16 may be far off: the largest value the source's
    intermediates reach on the samples past what float16 holds ("" when none, or when
    the source's weights are in external data: this check loads the whole graph into one
    session). Values already infinite or NaN in fp32 (a Log of 0) and mask sentinels
    are not overflows of fp16: they are left out (``computed_peak``)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(source_path, load_external_data=False)
    if uses_external_data(model):
        return ""
    names = [name for node in model.graph.node for name in node.output if name]
    known = {output.name for output in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names if n not in known)
    try:
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        wanted = [o.name for o in session.get_outputs()]
        largest: dict[str, float] = {}
        for sample in samples:
            for name, value in zip(wanted, session.run(wanted, sample), strict=True):
                peak = computed_peak(value)
                if peak is not None:
                    largest[name] = max(largest.get(name, 0.0), peak)
    except Exception:  # a diagnosis only: the failure stands without it
        return ""
    over = sorted(((peak, name) for name, peak in largest.items() if peak > FP16_MAX), reverse=True)
    if not over:
        return ""
    peak, name = over[0]
    return (
        f"; the source's intermediate {name!r} reaches {peak:,.0f} on the samples, past "
        f"float16's largest value ({FP16_MAX:,.0f}; {len(over)} intermediate(s) in all, "
        "not counting values already infinite in fp32 or mask sentinels): computed in fp16 "
        "it overflows. Quantise the model, or compile for a backend that computes in fp32"
    )


def computed_peak(value: Any) -> float | None:
    """The largest magnitude among a float array's values that computation reached: NaN
    and infinities (already past fp32) and mask sentinels (``SENTINEL_FLOOR`` and up)
    left out. None for anything else, or when nothing is left."""
    import numpy as np

    if not isinstance(value, np.ndarray) or value.dtype.kind != "f" or not value.size:
        return None
    magnitudes = np.abs(value[np.isfinite(value)].astype(np.float64))
    computed = magnitudes[magnitudes < SENTINEL_FLOOR]
    return float(computed.max()) if computed.size else None


def _rounded(value: float) -> float:
    return float(f"{value:.4g}")


def _checked(
    job: VerifyJob,
    status: Literal["passed", "failed", "unverified"],
    reason: str | None,
    started: float | None = None,
    ran: bool = False,
    **measured: Any,
) -> Verification:
    """The job's verification record: its tolerances, the seconds since ``started`` and,
    when the variant ``ran`` on the golden inputs, where those came from."""
    seconds = None if started is None else round(time.perf_counter() - started, 3)
    return Verification(
        status=status,
        reason=reason,
        tolerance=job.tolerance,
        abs_tolerance=job.abs_tolerance,
        seconds=seconds,
        samples_origin=job.samples_origin if ran else None,
        **measured,
    )


def verify_artifact(job: VerifyJob, timeout: float, site: str | None = None) -> Verification:
    """``run_verification`` in a killable worker, of the runtime environment at ``site``
    when the variant was built under one (None: the host's onnxruntime). A variant that
    could not be checked because it ran past ``timeout``, crashed its process or ran out
    of memory is ``failed``: nothing unchecked is published."""
    started = time.perf_counter()
    try:
        return shared_workers(site).call(run_verification, job, timeout)
    except WorkerTimeout:
        reason = (
            f"verification ran past its time limit of {timeout:g} s (verify_timeout); its "
            "process was killed. Raise the target's verify_timeout, or set verify: false "
            "to publish it unverified"
        )
    except WorkerDied as exc:
        reason = f"{job.ep} crashed the process running {job.label} ({exc})"
    except MemoryError as exc:
        reason = f"verifying {job.label} ran out of memory: {summarize(exc, 300)}"
    except ValueError as exc:  # the golden file is malformed
        return _checked(job, "failed", str(exc))
    except Exception as exc:
        reason = f"verifying {job.label} failed unexpectedly: {summarize(exc, 400)}"
    return _checked(job, "failed", reason, started)


def skipped(reason: str) -> Verification:
    return Verification(status="unverified", reason=reason)


def partitions_graph(ep: str) -> bool:
    import eps

    return eps.load(ep).partitions_graph
