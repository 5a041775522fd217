"""The quantise step: an fp32 model to the QDQ model of an integer precision, with ONNX
Runtime's own QNN quantisation recipe; and, when such a variant fails verification, the
layers whose quantisation error explodes.

The recipe (``onnxruntime.quantization.execution_providers.qnn``): ``qnn_preprocess_model``
(fuses LayerNorm and other sequences the HTP runs whole), ``get_qnn_qdq_config`` (QNN's
overrides; opset 21 when 16-bit types are used) fed by the model's calibration inputs,
then ``quantize``. Two traps of onnxruntime 1.32, measured: ``qnn_preprocess_model``
fails on a model with any ``metadata_props`` (so they are dropped first), and given a
``ModelProto`` it changes it (so it is always given a path).

Everything here runs inside compile and verification workers (``epfleet.runtime.compiler``,
``epfleet.fleet.build.verify``): quantising a ViT-S takes 15-30 s and a few GB.
"""

from __future__ import annotations

import fcntl
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import onnx

from epfleet.errors import CompileError, summarize
from epfleet.formats.manifest import Quantization
from epfleet.formats.variant_checks import FoldedIo, FoldedTensor
from epfleet.fsutil import atomic_write_bytes
from epfleet.hashing import sha256_bytes, sha256_file
from epfleet.runtime.requests import CompileRequest, QuantizeOptions
from eps.base import INTEGER_PRECISIONS, WIDER_INTEGER, Precision

if TYPE_CHECKING:
    from epfleet.runtime.samples import Sample

QDQ_OPS = {"QuantizeLinear", "DequantizeLinear"}
BLAME_FLOOR_DB = 25.0
"""A layer is blamed when its output's SQNR against the float model falls below this..."""
BLAME_DROP_DB = 6.0
"""...and this far below the best SQNR upstream of it: where error is made, not carried."""
BLAMED_SHOWN = 5


def is_qdq(model: onnx.ModelProto) -> bool:
    """Whether the model is quantised already (QuantizeLinear / DequantizeLinear nodes)."""
    return any(node.op_type in QDQ_OPS for node in model.graph.node)


def calibration_samples(path: Path) -> Iterator[dict[str, np.ndarray]]:
    """The samples of a calibration file (the samples format, written by the planner with
    a leading sample axis on every array), one at a time."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    count = len(next(iter(arrays.values())))
    for k in range(count):
        yield {name: array[k] for name, array in arrays.items()}


def quantized_source(
    request: CompileRequest, prepared: Path, workdir: Path, calibration: Path | None
) -> tuple[Path, Path, Quantization]:
    """The QDQ model of ``prepared`` (the source, shapes fixed) at the request's precision,
    made once per (source, shapes, precision, calibration, options) on this machine and
    shared by every target that needs it (a lock beside it: two workers quantising the
    same model wait for each other). Returns the QDQ model, the float model its tensor
    names come from (for ``blame_layers``) and what the manifest records of it. A source
    that is QDQ already is compiled as it is."""
    options = request.quantize
    assert options is not None and request.precision is not None
    if is_qdq(onnx.load(str(prepared), load_external_data=False)):
        sha256, _ = sha256_file(prepared)
        return prepared, prepared, Quantization(qdq_sha256=sha256)
    if options.calibration is None or calibration is None:
        raise CompileError(f"model {request.model!r}: {request.precision} needs calibration inputs")
    if request.source_files:
        raise CompileError(
            f"model {request.model!r}: integer precisions are made here for single-file "
            "sources only (this one has external data or sidecars); quantise it yourself "
            "and give the QDQ model as its source"
        )
    recipe = {
        "prepared": str(prepared.relative_to(workdir)),
        "precision": request.precision,
        "options": options.model_dump(mode="json"),
        "ort": _ort_version(),
    }
    key = sha256_bytes(json.dumps(recipe, sort_keys=True).encode())[:24]
    folder = workdir / "quantized"
    folder.mkdir(parents=True, exist_ok=True)
    qdq, float_model, record = (
        folder / f"{key}.onnx",
        folder / f"{key}.float.onnx",
        folder / f"{key}.json",
    )
    with open(folder / f"{key}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (qdq.exists() and float_model.exists() and record.exists()):
            seconds = quantize(prepared, qdq, float_model, request.precision, options, calibration)
            sha256, _ = sha256_file(qdq)
            done = Quantization(
                qdq_sha256=sha256,
                calibration_sha256=options.calibration.sha256,
                calibration_samples=sum(1 for _ in calibration_samples(calibration)),
                method=options.calibrate_method,
                per_channel=options.per_channel,
                nodes_to_exclude=options.nodes_to_exclude,
                seconds=round(seconds, 2),
            )
            atomic_write_bytes(record, done.model_dump_json().encode())
    return qdq, float_model, Quantization.model_validate_json(record.read_bytes())


def _ort_version() -> str:
    import onnxruntime

    return str(onnxruntime.__version__)


def _at_opset(model: onnx.ModelProto, opset: int) -> onnx.ModelProto:
    """``model`` converted to ``opset`` of the default domain, when older; as it is when
    ONNX's converter cannot convert it (quantising still works, only the diagnosis not)."""
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), opset)
    if current >= opset:
        return model
    try:
        return onnx.version_converter.convert_version(model, opset)
    except Exception:
        return model


def _reader(samples: Callable[[], Iterator[dict[str, np.ndarray]]]) -> Any:
    """An ORT ``CalibrationDataReader`` over the samples ``samples()`` yields (again from
    the start after ``rewind``)."""
    from onnxruntime.quantization import CalibrationDataReader

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = samples()

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.left, None)

        def rewind(self) -> None:
            self.left = samples()

    return Reader()


def quantize(
    src: Path,
    dst: Path,
    float_dst: Path,
    precision: str,
    options: QuantizeOptions,
    calibration: Path,
) -> float:
    """Write the QDQ model of ``src`` at ``precision`` to ``dst``, and the float model it
    was quantised from (preprocessed) to ``float_dst``; the seconds it took. CompileError
    naming the step that failed."""
    from onnxruntime.quantization import CalibrationMethod, QuantType
    from onnxruntime.quantization import quantize as ort_quantize
    from onnxruntime.quantization.execution_providers.qnn import (
        get_qnn_qdq_config,
        qnn_preprocess_model,
    )

    started = time.perf_counter()
    activation = QuantType.QUInt8 if precision == "w8a8" else QuantType.QUInt16
    if precision == "w16a16":
        # Signed 16-bit weights, which ORT's QNN recipe makes symmetric (weight_symmetric
        # None); the EP module says which targets take them.
        weights = QuantType.QInt16
    else:
        # Per-channel weights are symmetric signed 8-bit, as the HTP takes them.
        weights = QuantType.QInt8 if options.per_channel else QuantType.QUInt8
    method = {
        "minmax": CalibrationMethod.MinMax,
        "entropy": CalibrationMethod.Entropy,
        "percentile": CalibrationMethod.Percentile,
    }[options.calibrate_method]

    model = onnx.load(str(src))
    del model.metadata_props[:]  # qnn_preprocess_model fails on any (onnxruntime 1.32)
    # Opset 21 first: 16-bit QDQ needs it (quantize() would upgrade to com.microsoft Q/DQ,
    # whose outputs qdq_loss_debug cannot match), and ORT fuses LayerNormalization and Gelu
    # from 17 on (a ViT-S at w8a8: 50 % off op by op, 26 % fused; measured).
    model = _at_opset(model, 21)
    plain = dst.with_name(dst.stem + ".plain.onnx")
    optimized = dst.with_name(dst.stem + ".basic.onnx")
    onnx.save(model, str(plain))
    step = "optimising it (ORT basic level)"
    # ORT's tools warn on the root logger about every unnamed node and advise steps this
    # recipe runs: noise on the compile's stderr. Their errors raise.
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        _basic(plain, optimized)
        step = "preprocessing it (qnn_preprocess_model)"
        # it writes nothing when it finds nothing more to fuse: the optimised model is it
        if not qnn_preprocess_model(str(optimized), str(float_dst), fuse_layernorm=True):
            optimized.replace(float_dst)
        step = "calibrating it (get_qnn_qdq_config)"
        config = get_qnn_qdq_config(
            str(float_dst),
            _reader(lambda: calibration_samples(calibration)),
            activation_type=activation,
            weight_type=weights,
            per_channel=options.per_channel,
            calibrate_method=method,
            nodes_to_exclude=options.nodes_to_exclude or None,
        )
        step = "quantising it (quantize)"
        ort_quantize(str(float_dst), str(dst), config)
    except Exception as exc:
        raise CompileError(
            f"quantising to {precision} failed while {step}: {summarize(exc, 500)}"
        ) from None
    finally:
        root.setLevel(level)
        plain.unlink(missing_ok=True)
        optimized.unlink(missing_ok=True)
    return time.perf_counter() - started


def _basic(src: Path, dst: Path) -> None:
    """``src`` optimised by ORT at its basic level (constants and shape sub-graphs folded,
    LayerNormalization and Gelu fused) into ``dst``; without its TransposeOptimizer, which
    moves a ViT's patch-embedding Transpose into its LayerNorm pattern (measured)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(dst)
    ort.InferenceSession(
        str(src),
        options,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=["TransposeOptimizer"],
    )


class IoQuantization(NamedTuple):
    """How a folded QDQ model's integer input or output maps to the float it stands for:
    ``real = (integer - zero_point) * scale``; ``dtype`` is ``uint8``, ``int8``,
    ``uint16`` or ``int16`` (the manifest records it as a ``FoldedTensor``)."""

    dtype: str
    scale: float
    zero_point: int


def fold_boundary_qdq(model: onnx.ModelProto) -> dict[str, IoQuantization]:
    """Fold, in place, the QuantizeLinear of each float graph input and the DequantizeLinear
    to each graph output into the graph's I/O: the input becomes the quantised tensor
    (uint8, int8, uint16 or int16) and the output the integer one, so that a QNN HTP
    compile takes the whole graph (one EPContext node, nothing on the CPU EP) and the
    variant loads with CPU fallback disabled. Returns each folded input's and output's
    scale and zero point: a device quantises its input with them (``round(x / scale) +
    zero_point``, clipped) and dequantises the output. Only per-tensor Q/DQ with
    initializer scale and zero point, and an input feeding nothing but its QuantizeLinear,
    are folded; others stay.

    Measured (onnxruntime 1.32, onnxruntime-qnn 2.7, HTP v75/57): tiny_cls at w8a8 and
    w8a16, folded and compiled, loads with ``session.disable_cpu_ep_fallback=1`` and its
    dequantised outputs equal the unfolded variant's exactly."""
    from onnx import numpy_helper

    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    inputs = {i.name: i for i in graph.input}
    outputs = {o.name: o for o in graph.output}
    folded: dict[str, IoQuantization] = {}

    def params(node: onnx.NodeProto) -> IoQuantization | None:
        if len(node.input) < 3 or not all(n in initializers for n in node.input[1:3]):
            return None
        scale = numpy_helper.to_array(initializers[node.input[1]])
        zero = initializers[node.input[2]]
        if scale.size != 1 or zero.data_type not in _INTEGER_IO:
            return None
        return IoQuantization(
            _INTEGER_IO[zero.data_type],
            float(scale.reshape(())),
            int(numpy_helper.to_array(zero).reshape(())),
        )

    for node in list(graph.node):
        if node.op_type == "QuantizeLinear" and node.input[0] in inputs:
            name = node.input[0]
            readers = [n for n in graph.node if name in n.input]
            found = params(node)
            if found is None or len(readers) != 1 or name in outputs:
                continue
            for reader in graph.node:
                for k, tensor in enumerate(reader.input):
                    if tensor == node.output[0]:
                        reader.input[k] = name
            inputs[name].type.tensor_type.elem_type = initializers[node.input[2]].data_type
            graph.node.remove(node)
            folded[name] = found
        elif node.op_type == "DequantizeLinear" and node.output[0] in outputs:
            name = node.output[0]
            found = params(node)
            integer = node.input[0]
            if found is None or integer in outputs or integer in inputs:
                continue
            for writer in graph.node:
                for k, tensor in enumerate(writer.output):
                    if tensor == integer:
                        writer.output[k] = name
            for reader in graph.node:
                for k, tensor in enumerate(reader.input):
                    if tensor == integer:
                        reader.input[k] = name
            outputs[name].type.tensor_type.elem_type = initializers[node.input[2]].data_type
            graph.node.remove(node)
            folded[name] = found
    return folded


_INTEGER_IO = {
    onnx.TensorProto.UINT8: "uint8",
    onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT16: "uint16",
    onnx.TensorProto.INT16: "int16",
}


def folded_source(qdq: Path, model: str, precision: str) -> tuple[Path, FoldedIo]:
    """The QDQ model at ``qdq`` with its boundary Q/DQ folded (``fold_boundary_qdq``),
    written beside it once (a lock beside it, as ``quantized_source``), and what was
    folded. CompileError when there is nothing to fold: a model whose inputs and outputs
    are not quantised per tensor cannot be fed integers."""
    folded_path = qdq.with_name(qdq.stem + ".folded.onnx")
    record = qdq.with_name(qdq.stem + ".folded.json")
    with open(qdq.with_name(qdq.stem + ".folded.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folded_path.exists() and record.exists()):
            graph = onnx.load(str(qdq))
            found = fold_boundary_qdq(graph)
            if not found:
                raise CompileError(
                    f"model {model!r} at {precision}: fold_io found no QuantizeLinear on a "
                    "graph input nor DequantizeLinear to a graph output with a per-tensor "
                    "scale and zero point to fold; remove fold_io from the target"
                )
            inputs = {i.name for i in graph.graph.input}
            tensors = [
                FoldedTensor.model_validate({"name": name, **q._asdict()})
                for name, q in found.items()
            ]
            folded = FoldedIo(
                inputs=[t for t in tensors if t.name in inputs],
                outputs=[t for t in tensors if t.name not in inputs],
            )
            onnx.save(graph, str(folded_path))
            atomic_write_bytes(record, folded.model_dump_json().encode())
    return folded_path, FoldedIo.model_validate_json(record.read_bytes())


def blame_layers(float_path: str, qdq_path: str, samples: list[Sample]) -> str:
    """Why a QDQ model is far off: the first layers (in graph order) whose output's SQNR
    against the float model drops below ``BLAME_FLOOR_DB`` and ``BLAME_DROP_DB`` under the
    best upstream (``onnxruntime.quantization.qdq_loss_debug``), run on the CPU EP on
    ``samples``. "" when nothing stands out, or the diagnosis itself fails."""
    import tempfile

    from onnxruntime.quantization.qdq_loss_debug import (
        collect_activations,
        compute_activation_error,
        create_activation_matching,
        modify_model_output_intermediate_tensors,
    )

    try:
        with tempfile.TemporaryDirectory() as scratch:
            aug_float, aug_qdq = Path(scratch) / "float.onnx", Path(scratch) / "qdq.onnx"
            modify_model_output_intermediate_tensors(float_path, str(aug_float))
            modify_model_output_intermediate_tensors(qdq_path, str(aug_qdq))
            matching = create_activation_matching(
                collect_activations(str(aug_qdq), _reader(lambda: iter(samples))),
                collect_activations(str(aug_float), _reader(lambda: iter(samples))),
            )
            # compute_activation_error expects every tensor in both models
            errors = compute_activation_error({k: v for k, v in matching.items() if "float" in v})
        graph = onnx.load(float_path, load_external_data=False).graph
    except Exception:  # a diagnosis only: the failure stands without it
        return ""
    blamed = _blamed(graph, errors)
    local = _worst_local(graph, errors)
    if not blamed and not local:
        lowest = min((float(e["xmodel_err"]) for e in errors.values()), default=None)
        if lowest is None:
            return ""
        return (
            f"; no single layer stands out (SQNR against the fp32 model falls gradually, to "
            f"{lowest:.1f} dB at worst): the error builds up across the graph"
        )
    named = ", ".join(f"{node!r} ({op}, {db:.1f} dB)" for node, op, db in blamed)
    first = f"; the quantisation error explodes first at {named}" if blamed else ""
    worst = f"; worst quantised ops: {local}" if local else ""
    return f"{first}{worst} (SQNR against the fp32 model on the samples)"


CALIBRATE_METHODS = ("minmax", "entropy", "percentile")


def ladder_advice(
    precision: Precision,
    makes: Sequence[Precision],
    ladder: Sequence[Precision],
    options: QuantizeOptions,
    limits: str,
) -> str:
    """What to change after an integer variant at ``precision`` failed verification, in
    the order it most often helps: the next wider precision the target ``makes`` that its
    ``ladder`` has not tried before (the ladder's own next rung when it has one), per-channel
    weights when off, another calibration method and inputs, and last the layers the
    failure names, left in float. ``limits`` says why the target makes no wider one."""
    done = list(ladder[: ladder.index(precision) + 1]) if precision in ladder else [precision]
    wider = [p for p in WIDER_INTEGER[WIDER_INTEGER.index(precision) + 1 :] if p in makes]
    wider += [p for p in makes if p not in INTEGER_PRECISIONS]
    untried = [p for p in wider if p not in done]
    levers = []
    if not untried:
        levers.append(f"no wider precision to try ({limits})")
    elif untried[0] in ladder:
        levers.append(f"the ladder's next rung, {untried[0]}")
    else:
        shown = ", ".join([*done, untried[0], *ladder[len(done) :]])
        levers.append(f"{untried[0]}, the next precision this target makes (precision: [{shown}])")
    if not options.per_channel:
        levers.append("per-channel weights (quantization.per_channel: true)")
    others = " or ".join(m for m in CALIBRATE_METHODS if m != options.calibrate_method)
    levers.append(
        f"another calibration method (quantization.calibrate_method: {others}; this one "
        f"{options.calibrate_method}) and calibration inputs like the real data"
    )
    levers.append("leaving the layers named above in float (quantization.nodes_to_exclude)")
    return ". Next, most often first: " + "; ".join(
        f"{k}) {lever}" for k, lever in enumerate(levers, 1)
    )


def _worst_local(graph: onnx.GraphProto, errors: dict[str, dict[str, Any]]) -> str:
    """The op types whose own quantisation (Q then DQ of their output) loses most, e.g.
    "Softmax x12 (10.2-23.1 dB)"; Relu and Clip are folded into their producer's
    quantisation, so their rows compare different tensors and are left out."""
    by_op: dict[str, list[float]] = {}
    for node in graph.node:
        if node.op_type in ("Relu", "Clip"):
            continue
        for output in node.output:
            if output in errors and float(errors[output]["qdq_err"]) < BLAME_FLOOR_DB:
                by_op.setdefault(node.op_type, []).append(float(errors[output]["qdq_err"]))
    worst = sorted(by_op.items(), key=lambda item: min(item[1]))[:3]
    return ", ".join(f"{op} x{len(dbs)} ({min(dbs):.1f}-{max(dbs):.1f} dB)" for op, dbs in worst)


def _blamed(
    graph: onnx.GraphProto, errors: dict[str, dict[str, Any]]
) -> list[tuple[str, str, float]]:
    """Nodes whose output is below the floor and well below the worst of their inputs (the
    graph's inputs and weights are exact): where the error is made, not carried along."""
    exact = float("inf")
    db_of: dict[str, float] = {}
    found = []
    for node in graph.node:
        upstream = min((db_of.get(name, exact) for name in node.input if name), default=exact)
        for output in node.output:
            if output not in errors:
                db_of[output] = upstream
                continue
            db = float(errors[output]["xmodel_err"])
            if db < BLAME_FLOOR_DB and db < upstream - BLAME_DROP_DB:
                found.append((node.name or output, f"{node.op_type} -> {output}", db))
            db_of[output] = db
    return found[:BLAMED_SHOWN]
