"""What a compile worker is asked to build (``CompileRequest``): names, store keys, digests and
recipe, never a loaded model; and the fingerprint that says a build is up to date."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field

from epfleet import RECIPE_VERSION
from epfleet.formats.manifest import (
    MODEL_FILE,
    ArtifactRef,
    PackageFile,
    SamplesRef,
    SourceEntry,
)
from epfleet.formats.spec import DEFAULT_VERIFY_TIMEOUT, CalibrateMethod
from epfleet.formats.task_metric import MetricSpec
from epfleet.hashing import sha256_bytes
from eps.base import (
    DEFAULT_TOLERANCE,
    INTEGER_PRECISIONS,
    DeviceType,
    GraphOptimization,
    Precision,
)


class Rung(BaseModel):
    """One precision of a target's ladder, with what a compile at it is built and verified
    with."""

    precision: Precision
    provider_options: dict[str, str]
    tolerance: float
    abs_tolerance: float


class QuantizeOptions(BaseModel):
    """How the quantise step makes the QDQ model of an integer precision (the spec's
    ``quantization``) and from which calibration inputs."""

    calibration: ArtifactRef | None = Field(
        description="The calibration inputs (.npz) in the store; None: the source is QDQ"
    )
    per_channel: bool = False
    calibrate_method: CalibrateMethod = "minmax"
    nodes_to_exclude: list[str] = Field(default_factory=list)


class RuntimeRef(BaseModel):
    """The spec's runtime a pair builds under: its name and pip requirements (each compile
    host builds or reuses the environment: ``epfleet.runtime.environments``)."""

    name: str
    requirements: list[str]


class CompileRequest(BaseModel):
    """What a compile task needs: names, store keys and digests, never a loaded model.
    It builds at ``precision`` (its ``provider_options`` and tolerances are that rung's);
    ``fallbacks`` are the ladder's later rungs, tried in order when it fails verification."""

    model: str
    target: str
    ep: str
    device: DeviceType
    provider_options: dict[str, str]
    input_shapes: dict[str, list[int]]
    source_key: str
    source_sha256: str = Field(description="The source's identity: its file set's digest")
    source_size: int
    source_model_file: str = Field(
        default=MODEL_FILE, description="The source's main file's path in its directory"
    )
    source_files: list[PackageFile] = Field(
        default_factory=list, description="The source's other files (external data, sidecars)"
    )
    source_file_sha256: str | None = Field(
        default=None, description="The main file's sha256 when source_sha256 is a set's digest"
    )
    embed_context: bool = Field(
        default=True, description="Embed EP contexts in the model (False: files beside it)"
    )
    external_initializers: bool = Field(
        default=False, description="Keep large initializers in a file beside the model"
    )
    graph_optimization: GraphOptimization = "basic"
    min_coverage: float | None = None
    verify: bool = True
    tolerance: float = DEFAULT_TOLERANCE.relative  # an older request's: eps.base's rule
    abs_tolerance: float = DEFAULT_TOLERANCE.absolute
    verify_timeout: float = DEFAULT_VERIFY_TIMEOUT
    samples: SamplesRef | None = Field(
        default=None, description="The model's golden samples, verification's reference"
    )
    samples_origin: Literal["spec", "generated"] = Field(
        default="generated", description="Whether the spec gave the samples' inputs"
    )
    decision_default: bool = Field(
        default=True,
        description="With no metric: whether integer rungs' class scores are judged by "
        "their decisions (False: the spec's metric {kind: none})",
    )
    metric: MetricSpec | None = Field(
        default=None, description="The model's task metric, judged beside the tolerance"
    )
    samples_problem: str | None = Field(
        default=None, description="Why the model has no golden samples"
    )
    precision: Precision | None = Field(
        default=None, description="What it builds at; None: the EP's default (older requests)"
    )
    fallbacks: list[Rung] = Field(
        default_factory=list, description="The ladder's later precisions, tried in order"
    )
    quantize: QuantizeOptions | None = Field(
        default=None, description="How to make the QDQ model of an integer precision"
    )
    fold_io: bool = Field(
        default=False,
        description="Fold the QDQ model's boundary Quantize/Dequantize into the variant's "
        "I/O at an integer precision (the target's fold_io)",
    )
    runtime: RuntimeRef | None = Field(
        default=None,
        description="The runtime environment it builds and verifies under; None: the "
        "compile host's own onnxruntime and EP package",
    )
    twin_of: str | None = Field(
        default=None,
        description="The target of this model whose variant computes the same outputs "
        "and is verified on every golden sample in this run (epfleet.fleet.planning.twin_rules): "
        "this one is checked on its first only. Not part of the fingerprint",
    )
    fingerprint: str

    @property
    def source_main_sha256(self) -> str:
        """The sha256 of the source's main file (its key's content)."""
        return self.source_file_sha256 or self.source_sha256

    @property
    def rungs(self) -> list[CompileRequest]:
        """The request at each precision of its ladder, in order (itself first)."""
        later = [
            self.model_copy(update={**rung.model_dump(), "fallbacks": []})
            for rung in self.fallbacks
        ]
        return [self.model_copy(update={"fallbacks": []}), *later]

    @property
    def integer(self) -> bool:
        """Whether it builds a QDQ model's variant."""
        return self.precision in INTEGER_PRECISIONS

    @property
    def folds_io(self) -> bool:
        """Whether its variant is compiled with the QDQ model's boundary Q/DQ folded."""
        return self.fold_io and self.integer


def source_fields(source: SourceEntry) -> dict[str, object]:
    """A CompileRequest's fields that say where its source is and what it is."""
    return {
        "source_key": source.uri,
        "source_sha256": source.digest,
        "source_size": source.size,
        "source_model_file": source.model_file,
        "source_files": source.files,
        "source_file_sha256": source.sha256 if source.files else None,
    }


def fingerprinted(
    request: CompileRequest, ort_version: str, build_identity: dict[str, str]
) -> CompileRequest:
    """The request with the fingerprint these ORT and EP package versions give it:
    everything that decides the pair's artifact and whether it is published (recipe,
    coverage floor, verification settings and samples). Same fingerprint, same build, or
    the same failure. (A pair bound to a work pool is fingerprinted there, with the pool's
    packages.)"""
    payload: dict[str, object] = {
        "recipe": RECIPE_VERSION,
        "source_sha256": request.source_sha256,
        "input_shapes": request.input_shapes,
        "ep": request.ep,
        "device": request.device,
        "provider_options": request.provider_options,
        "graph_optimization": request.graph_optimization,
        "min_coverage": request.min_coverage,
        "verify": request.verify,
        "tolerance": request.tolerance,
        "abs_tolerance": request.abs_tolerance,
        "samples": request.samples.basis if request.samples else None,
        "ort_version": ort_version,
        "build": build_identity,
    }
    if request.verify_timeout != DEFAULT_VERIFY_TIMEOUT:
        # Only when not the default: pairs with the default keep their fingerprints.
        payload["verify_timeout"] = request.verify_timeout
    # Each only where precisions matter: float pairs of one precision keep their fingerprints.
    if request.precision in INTEGER_PRECISIONS:
        payload["precision"] = request.precision
    if request.fallbacks:
        payload["fallbacks"] = [rung.model_dump() for rung in request.fallbacks]
    if request.metric is not None:
        # Only when named: pairs judged by the numeric gate alone keep their fingerprints.
        payload["metric"] = request.metric.model_dump(mode="json")
    if not request.decision_default and request.metric is None:
        # Only when turned off: pairs under the default keep their fingerprints.
        payload["decision_default"] = False
    if request.quantize is not None:
        payload["quantize"] = request.quantize.model_dump(mode="json")
    if request.fold_io:
        # Only when asked: pairs that do not fold keep their fingerprints.
        payload["fold_io"] = True
    if not request.embed_context or request.external_initializers:
        # Only when not the single-file layout: single-file pairs keep their fingerprints.
        payload["layout"] = {
            "embed_context": request.embed_context,
            "external_initializers": request.external_initializers,
        }
    digest = sha256_bytes(json.dumps(payload, sort_keys=True).encode())
    return request.model_copy(update={"fingerprint": digest})
