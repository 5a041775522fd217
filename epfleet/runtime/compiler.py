"""Compile one model for one target: prepare the source, let the EP module build the
variant, then stamp the compatibility string and provenance into its metadata.

This runs in a compile worker process (see ``epfleet.runtime.compile_pool``); it never branches
on the EP's name: every EP fact comes from the EP's module.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import onnx
from pydantic import BaseModel, Field, ValidationError

import eps
from epfleet import RECIPE_VERSION, ort_version
from epfleet.errors import CompileError, ep_errors, summarize
from epfleet.formats.keys import files_key
from epfleet.formats.manifest import Coverage, FileSet, FoldedIo, PackageFile, Quantization
from epfleet.fsutil import atomic_write_bytes
from epfleet.hashing import sha256_bytes, sha256_file
from epfleet.runtime.filesets import external_locations, link_or_copy, listed_files
from epfleet.runtime.quantize import folded_source, quantized_source
from epfleet.runtime.requests import CompileRequest
from epfleet.runtime.shapes import prepare_model, uses_external_data
from epfleet.text import share
from eps.base import GraphOptimization, Layout, ort_level

COMPATIBILITY_KEY_PREFIX = "ep_compatibility_info."
EP_CONTEXT_OP = "EPContext"


class CompileJob(BaseModel):
    """One planned pair plus where this worker finds its source and keeps its scratch.
    ``source_path`` is the main ONNX file, in a directory holding the source's other
    files at their paths (so its external data resolves)."""

    request: CompileRequest
    source_path: str
    workdir: str
    calibration_path: str | None = None
    """The model's calibration inputs, for a request at an integer precision."""


class CompileOutput(BaseModel):
    """A compiled variant: the directory of ``artifact_path`` holds exactly its files, the
    main one (``artifact_path``, named ``model_file``) and ``files``."""

    artifact_path: str
    sha256: str
    size: int
    model_file: str = "model.onnx"
    files: list[tuple[str, str, int]] = Field(
        default_factory=list, description="(path, sha256, size) of each other file"
    )
    compatibility_string: str
    compatibility_written_by: str  # "ep" or "epfleet"
    seconds: float
    coverage: Coverage | None = None
    quantization: Quantization | None = None
    """How the QDQ model of an integer variant was made."""
    qdq_path: str | None = None
    """That QDQ model, and the float model it was quantised from (for ``blame_layers``)."""
    qdq_float_path: str | None = None
    folded_io: FoldedIo | None = None
    """The integer inputs and outputs of a variant compiled with its boundary Q/DQ folded."""


def compatibility_key(ep_name: str) -> str:
    return COMPATIBILITY_KEY_PREFIX + ep_name


def prepared_source(job: CompileJob, require_static: bool) -> Path:
    """The source with input shapes fixed and checked, cached per source, shapes and recipe
    so that several targets of one model prepare it once per worker."""
    request = job.request
    key = sha256_bytes(
        f"{RECIPE_VERSION}|{onnx.__version__}|{request.source_sha256}|"
        f"{sorted(request.input_shapes.items())}|{require_static}".encode()
    )[:24]
    prepared = Path(job.workdir) / "prepared"
    path = prepared / f"{key}.onnx"
    folder = prepared / key
    main = folder / request.source_model_file
    if path.exists():
        return path
    if main.exists():
        return main
    model = onnx.load(job.source_path, load_external_data=False)
    try:
        prepare_model(model, request.input_shapes, require_static, request.ep)
    except ValueError as exc:
        raise CompileError(f"model {request.model!r}: {exc}") from None
    if not uses_external_data(model):
        atomic_write_bytes(path, model.SerializeToString())
        return path
    # Beside hard links to the source's data files, so that its locations resolve.
    prepared.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=prepared, prefix=f".{key}."))
    try:
        source_dir = Path(job.source_path).parent
        for location in external_locations(model):
            link_or_copy(source_dir / location, scratch / location)
        onnx.save(model, str(scratch / request.source_model_file))
        try:
            os.rename(scratch, folder)
        except OSError:  # another worker prepared it first
            if not main.exists():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return main


def compile_job(job: CompileJob) -> CompileOutput:
    """Compile one pair into its own scratch directory; ``discard`` removes it once the
    artifact is stored."""
    started = time.perf_counter()
    request = job.request
    module = eps.load(request.ep)
    src = prepared_source(job, module.requires_static_shapes)
    quantized: tuple[Path, Path, Quantization] | None = None
    if request.integer:
        calibration = Path(job.calibration_path) if job.calibration_path else None
        quantized = quantized_source(request, src, Path(job.workdir), calibration)
        src = quantized[0]
    folded: FoldedIo | None = None
    if request.folds_io:
        src, folded = folded_source(src, request.model, request.precision or "")
    variants = Path(job.workdir) / "variants"
    variants.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=variants, prefix=f"{request.model}.{request.target}."))
    model_file = request.source_model_file
    try:
        artifact = scratch / model_file
        try:
            with ep_errors():
                module.build(
                    src,
                    artifact,
                    request.provider_options,
                    request.device,
                    request.graph_optimization,
                    layout_of(request),
                )
        except CompileError:
            raise
        except Exception as exc:  # ORT raises RuntimeError/Fail/InvalidArgument subclasses
            advice = module.compile_error_advice(str(exc))
            said = f"{advice}. {request.ep}'s error: " if advice else ""
            raise CompileError(
                f"{request.ep} failed to compile {request.model!r}"
                f"{f' at {request.precision}' if request.precision else ''}: "
                f"{said}{summarize(exc, 600)}"
            ) from None
        if not artifact.exists():
            raise CompileError(f"{request.ep} wrote no model for {request.model!r}")
        stamped, string, written_by = _stamp(request, module, artifact)
        data = stamped.SerializeToString()
        atomic_write_bytes(artifact, data)  # only the main file: external references kept
        coverage = measure_coverage(
            stamped,
            module.partitions_graph,
            lambda: optimized_node_count(src, request.graph_optimization),
        )
        files = _variant_files(job, scratch, model_file)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return CompileOutput(
        artifact_path=str(artifact),
        sha256=sha256_bytes(data),
        size=len(data),
        model_file=model_file,
        files=files,
        compatibility_string=string,
        compatibility_written_by=written_by,
        seconds=round(time.perf_counter() - started, 3),
        coverage=coverage,
        quantization=quantized[2] if quantized else None,
        qdq_path=str(quantized[0]) if quantized else None,
        qdq_float_path=str(quantized[1]) if quantized else None,
        folded_io=folded,
    )


def layout_of(request: CompileRequest) -> Layout:
    """How the pair's variant lays out its files (decided when the run planned)."""
    external = f"{request.source_model_file}.data" if request.external_initializers else None
    return Layout(embed_context=request.embed_context, external_initializers=external)


def _variant_files(job: CompileJob, scratch: Path, model_file: str) -> list[tuple[str, str, int]]:
    """The files beside the compiled main file: what the EP wrote there (contexts,
    external initializers), the source's data files it still refers to, and the source's
    sidecars (its files that are not the main model's external data), carried over
    unchanged. CompileError naming a clash."""
    request = job.request
    external = (scratch / f"{model_file}.data") if request.external_initializers else None
    if external is not None and external.exists() and external.stat().st_size == 0:
        external.unlink()  # no initializer was large enough
    written = listed_files(scratch, model_file)
    if request.source_files:
        source_dir = Path(job.source_path).parent
        source = onnx.load(job.source_path, load_external_data=False)
        data_files = set(external_locations(source))
        variant = onnx.load(str(scratch / model_file), load_external_data=False)
        kept = [loc for loc in external_locations(variant) if loc not in written]
        unknown = sorted(set(kept) - data_files)
        if unknown:
            raise CompileError(
                f"{request.ep}'s variant of {request.model!r} refers to external data files "
                f"it did not write: {', '.join(unknown)}"
            )
        sidecars = [f.path for f in request.source_files if f.path not in data_files]
        taken = {path.lower() for path in [model_file, *written]}
        for carried in [*kept, *sidecars]:
            if carried.lower() in taken:
                raise CompileError(
                    f"{request.ep} wrote {carried!r} for {request.model!r}, which is also a "
                    "file of its source; rename the source's file"
                )
            taken.add(carried.lower())
            link_or_copy(source_dir / carried, scratch / carried)
    files = [(path, *sha256_file(scratch / path)) for path in listed_files(scratch, model_file)]
    try:
        FileSet(
            model_file=model_file,
            files=[PackageFile(path=p, uri=files_key(h), sha256=h, size=n) for p, h, n in files],
        )
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise CompileError(
            f"the variant of {request.model!r} has bad file names: {problem}"
        ) from None
    return files


def measure_coverage(
    variant: onnx.ModelProto, partitions_graph: bool, source_nodes: Callable[[], int]
) -> Coverage:
    """How much of the source the EP took. In an EPContext model each of the EP's
    partitions is one EPContext node and every other node is left to ORT's CPU EP, so
    the EP's share is the optimised source's node count less those left over
    (``source_nodes`` counts it, only when needed).

    A QDQ model's variant (``QuantizeLinear -> EPContext -> DequantizeLinear``) keeps the
    quantisation of its inputs and the dequantisation of its outputs on the CPU EP: they
    count as left over (``boundary_qdq`` says how many of them), so such a variant is never
    reported as a full compile: with CPU fallback disabled it does not load (measured,
    onnxruntime 1.32 and onnxruntime-qnn 2.7). Folding them into the variant's I/O (the
    target's ``fold_io``: ``epfleet.runtime.quantize.folded_source``) makes it full."""
    if not partitions_graph:
        count = len(variant.graph.node)
        return Coverage(ep_nodes=count, other_nodes=0, fraction=1.0)
    contexts = [node for node in variant.graph.node if node.op_type == EP_CONTEXT_OP]
    others = [node for node in variant.graph.node if node.op_type != EP_CONTEXT_OP]
    if not others:
        return Coverage(ep_nodes=max(len(contexts), source_nodes()), other_nodes=0, fraction=1.0)
    boundary = sum(1 for node in others if _edge_conversion(node, variant.graph))
    ep_nodes = max(len(contexts), source_nodes() - len(others))
    # Never rounded up to 1.0: a variant with any node on the CPU EP is not a full compile.
    fraction = min(round(ep_nodes / (ep_nodes + len(others)), 4), 0.9999)
    return Coverage(
        ep_nodes=ep_nodes,
        other_nodes=len(others),
        fraction=fraction,
        other_op_types=sorted({node.op_type for node in others}),
        boundary_qdq=boundary,
    )


def _edge_conversion(node: onnx.NodeProto, graph: onnx.GraphProto) -> bool:
    """A QuantizeLinear of a graph input, or a DequantizeLinear to a graph output."""
    if node.op_type == "QuantizeLinear":
        return node.input[0] in {i.name for i in graph.input}
    if node.op_type == "DequantizeLinear":
        return node.output[0] in {o.name for o in graph.output}
    return False


@functools.cache
def optimized_node_count(src: Path, optimization: GraphOptimization) -> int:
    """Nodes of ``src`` after ORT's optimisation at ``optimization`` on the CPU EP: the
    graph an EP is offered at that level (basic rewrites do not depend on the EP)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as scratch:
        optimized = Path(scratch) / "optimized.onnx"
        for external in (False, True):  # first referring to the source's data files
            options = ort.SessionOptions()
            options.graph_optimization_level = ort_level(optimization)
            options.optimized_model_filepath = str(optimized)
            options.add_session_config_entry("session.disable_prepacking", "1")
            if external:  # initializers the optimiser made, past protobuf's 2 GB
                options.add_session_config_entry(
                    "session.optimized_model_external_initializers_file_name",
                    "optimized.onnx.data",
                )
            try:
                ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
                break
            except Exception:
                if external:
                    raise
        graph = onnx.load(str(optimized), load_external_data=False)
    return len(graph.graph.node)


def check_coverage(request: CompileRequest, coverage: Coverage | None) -> None:
    """CompileError naming what the EP left out when it took less of the model's compute
    than the target needs. The (de)quantisation of a QDQ model's inputs and outputs is
    not compute left out: a target asking for the whole graph still gets its integer
    variants (``coverage.boundary_qdq`` says they need the CPU EP to load)."""
    if request.min_coverage is None or coverage is None:
        return
    nodes = coverage.ep_nodes + coverage.other_nodes
    compute = (coverage.ep_nodes + coverage.boundary_qdq) / nodes if nodes else 1.0
    if coverage.fraction >= request.min_coverage or compute >= request.min_coverage:
        return
    boundary = (
        f" (and {coverage.boundary_qdq} conversions of the graph's inputs and outputs, "
        "which do not count against min_coverage)"
        if coverage.boundary_qdq
        else ""
    )
    raise CompileError(
        f"{request.ep} took {share(coverage.fraction)} of {request.model!r} "
        f"({coverage.ep_nodes} of {coverage.ep_nodes + coverage.other_nodes} nodes), below the "
        f"target's min_coverage {request.min_coverage:g}; left out: "
        f"{', '.join(coverage.other_op_types)}{boundary}"
    )


def discard(output: CompileOutput) -> None:
    """Remove a compile's scratch directory and the variant's files in it."""
    shutil.rmtree(Path(output.artifact_path).parent, ignore_errors=True)


def _stamp(
    request: CompileRequest, module: eps.ExecutionProvider, raw: Path
) -> tuple[onnx.ModelProto, str, str]:
    """The main file's graph (its external data left in its files) with the compatibility
    string and provenance in its metadata."""
    # Read from the metadata ORT wrote it to (the key its own reader reads), as every
    # runtime's ORT allows: onnxruntime 1.24 has no get_compatibility_info_from_model_bytes.
    model = onnx.load_from_string(raw.read_bytes())
    props = {p.key: p.value for p in model.metadata_props}
    string = props.get(compatibility_key(request.ep))
    written_by = "ep"
    if not string:
        string = module.generate_compatibility_string(raw)
        written_by = "epfleet"
    if not string:
        raise CompileError(
            f"{request.ep} wrote no compatibility string and its epfleet module generates none"
        )
    props.update(
        {
            compatibility_key(request.ep): string,
            "epfleet.model": request.model,
            "epfleet.target": request.target,
            "epfleet.source_sha256": request.source_sha256,
            "epfleet.fingerprint": request.fingerprint,
            "epfleet.recipe": RECIPE_VERSION,
            "epfleet.ort_version": ort_version(),
            "epfleet.ep_version": module.build_identity()["version"],
            "epfleet.compatibility_written_by": written_by,
        }
    )
    del model.metadata_props[:]
    for key in sorted(props):
        model.metadata_props.add(key=key, value=props[key])
    return model, string, written_by
