"""Which pairs need compiling (pure: every fact it needs is passed in)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

import eps
from epfleet import RECIPE_VERSION
from epfleet.hashing import sha256_bytes
from epfleet.manifest import (
    MODEL_FILE,
    ArtifactRef,
    Manifest,
    PackageFile,
    SamplesRef,
    SourceEntry,
    VariantEntry,
)
from epfleet.spec import DEFAULT_VERIFY_TIMEOUT, CalibrateMethod, ModelSpec, TargetSpec
from eps.base import (
    FP16_TOLERANCE,
    INTEGER_PRECISIONS,
    TOLERANCE_OF,
    DeviceType,
    GraphOptimization,
    Precision,
)


def source_key(sha256: str) -> str:
    return f"sources/{sha256}.onnx"


def samples_key(sha256: str) -> str:
    return f"samples/{sha256}.npz"


def variant_key(model: str, target: str, sha256: str) -> str:
    return f"variants/{model}/{target}/{sha256}.onnx"


def listing_key(artifact_key: str) -> str:
    """Beside a multi-file variant's main file, the list of its other files (JSON): what
    ``epfleet gc`` keeps of a variant a device runs after the manifest dropped it."""
    return artifact_key.removesuffix(".onnx") + ".files.json"


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
    tolerance: float = FP16_TOLERANCE.relative
    abs_tolerance: float = FP16_TOLERANCE.absolute
    verify_timeout: float = DEFAULT_VERIFY_TIMEOUT
    samples: SamplesRef | None = Field(
        default=None, description="The model's golden samples, verification's reference"
    )
    samples_origin: Literal["spec", "generated"] = Field(
        default="generated", description="Whether the spec gave the samples' inputs"
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


def embeds_context(choice: bool | None, source: SourceEntry, max_bytes: int) -> bool:
    """Whether a variant embeds its EP contexts: the target's choice, else whether the
    source totals less than ``max_bytes``."""
    if choice is not None:
        return choice
    return source.total_size < max_bytes


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
    if request.quantize is not None:
        payload["quantize"] = request.quantize.model_dump(mode="json")
    if not request.embed_context or request.external_initializers:
        # Only when not the single-file layout: single-file pairs keep their fingerprints.
        payload["layout"] = {
            "embed_context": request.embed_context,
            "external_initializers": request.external_initializers,
        }
    digest = sha256_bytes(json.dumps(payload, sort_keys=True).encode())
    return request.model_copy(update={"fingerprint": digest})


class PlannedPair(BaseModel):
    request: CompileRequest
    action: Literal["compile", "skip"]
    reason: str
    previous: VariantEntry | None = Field(
        default=None, description="The pair's manifest entry when the run planned"
    )
    work_pool: str | None = Field(
        default=None, description="Where it compiles: a work pool, or None for the flow's own"
    )


def ladder_of(target: TargetSpec) -> list[Rung]:
    """The target's precisions, each with the provider options that build it and the
    tolerances it is verified with (the spec's, else its precision's default)."""
    module = eps.load(target.ep)
    rungs = []
    for precision in target.ladder:
        default = TOLERANCE_OF[precision]
        rungs.append(
            Rung(
                precision=precision,
                provider_options=module.with_precision(precision, target.provider_options),
                tolerance=default.relative if target.tolerance is None else target.tolerance,
                abs_tolerance=default.absolute
                if target.abs_tolerance is None
                else target.abs_tolerance,
            )
        )
    return rungs


def quantize_options(model: ModelSpec, calibration: ArtifactRef | None) -> QuantizeOptions:
    options = model.quantization
    return QuantizeOptions(
        calibration=calibration,
        per_channel=options.per_channel,
        calibrate_method=options.calibrate_method,
        nodes_to_exclude=options.nodes_to_exclude,
    )


def plan_pairs(
    pairs: list[tuple[ModelSpec, TargetSpec]],
    sources: dict[str, SourceEntry],
    samples: dict[str, SamplesRef | None],
    samples_problems: dict[str, str],
    manifest: Manifest | None,
    ort_version: str,
    build_identities: dict[str, dict[str, str]],
    force: bool,
    stored_size: Callable[[str], int | None],
    embed_max_bytes: int | None = None,
    calibrations: dict[str, ArtifactRef | None] | None = None,
) -> list[PlannedPair]:
    """Decide compile or skip for each pair. A pair is skipped when the manifest holds an
    ok build with the same fingerprint whose artifact and files are still in the store
    at their sizes, or a failed compile with the same fingerprint (up to date, failed).
    ``embed_max_bytes``: EPFLEET_EMBED_CONTEXT_MAX_BYTES when None."""
    if embed_max_bytes is None:
        from epfleet.settings import settings

        embed_max_bytes = int(settings().embed_context_max_bytes)
    planned = []
    for model, target in pairs:
        source = sources[model.name]
        first, *fallbacks = ladder_of(target)
        calibration = (calibrations or {}).get(model.name)
        unfingerprinted = CompileRequest(
            model=model.name,
            target=target.name,
            ep=target.ep,
            device=target.device_type,
            provider_options=first.provider_options,
            precision=first.precision,
            fallbacks=fallbacks,
            quantize=quantize_options(model, calibration) if target.quantizes else None,
            input_shapes=model.input_shapes,
            **source_fields(source),  # type: ignore[arg-type]
            embed_context=(
                embeds_context(target.embed_context, source, embed_max_bytes)
                if eps.load(target.ep).partitions_graph  # only EPContext models have contexts
                else True
            ),
            external_initializers=bool(source.files),
            graph_optimization=target.graph_optimization or "basic",  # set by validation
            min_coverage=target.min_coverage,
            verify=target.verify,
            tolerance=first.tolerance,
            abs_tolerance=first.abs_tolerance,
            verify_timeout=target.verify_timeout,
            samples=samples.get(model.name),
            # a model with calibration inputs and no samples is verified on held-out ones
            samples_origin="spec" if model.samples or calibration else "generated",
            samples_problem=samples_problems.get(model.name),
            fingerprint="",
        )
        request = fingerprinted(unfingerprinted, ort_version, build_identities[target.ep])
        entry = manifest.models.get(model.name) if manifest else None
        previous = entry.variants.get(target.name) if entry else None
        action: Literal["compile", "skip"]
        if target.work_pool:
            action, reason = "compile", f"planned on work pool {target.work_pool}"
        else:
            action, reason = decide_pair(request, previous, force, stored_size)
        planned.append(
            PlannedPair(
                request=request,
                action=action,
                reason=reason,
                previous=previous,
                work_pool=target.work_pool,
            )
        )
    return planned


def decide_pair(
    request: CompileRequest,
    previous: VariantEntry | None,
    force: bool,
    stored_size: Callable[[str], int | None],
) -> tuple[Literal["compile", "skip"], str]:
    if force:
        return "compile", "forced"
    if previous is None:
        return "compile", "new pair"
    if previous.failure_for(request.fingerprint) is not None:
        return "skip", "up to date, failed: these inputs failed before (--force compiles again)"
    if previous.fingerprint != request.fingerprint:
        return "compile", "inputs changed (source, target, shapes, ORT/EP version or recipe)"
    if previous.status != "ok" or previous.artifact is None:
        return "compile", "previous compile failed"
    for stored in [previous.artifact, *previous.files]:
        if stored_size(stored.uri) != stored.size:
            return "compile", f"artifact {stored.uri} is missing from the store"
    return "skip", "up to date"
