"""Which pairs need compiling (pure: every fact it needs is passed in)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

from epfleet import RECIPE_VERSION
from epfleet.hashing import sha256_bytes
from epfleet.manifest import Manifest, SamplesRef, SourceEntry, VariantEntry
from epfleet.spec import ModelSpec, TargetSpec
from eps.base import FP16_TOLERANCE, DeviceType, GraphOptimization


def source_key(sha256: str) -> str:
    return f"sources/{sha256}.onnx"


def samples_key(sha256: str) -> str:
    return f"samples/{sha256}.npz"


def variant_key(model: str, target: str, sha256: str) -> str:
    return f"variants/{model}/{target}/{sha256}.onnx"


class CompileRequest(BaseModel):
    """What a compile task needs: names, store keys and digests, never a loaded model."""

    model: str
    target: str
    ep: str
    device: DeviceType
    provider_options: dict[str, str]
    input_shapes: dict[str, list[int]]
    source_key: str
    source_sha256: str
    source_size: int
    graph_optimization: GraphOptimization = "basic"
    min_coverage: float | None = None
    verify: bool = True
    tolerance: float = FP16_TOLERANCE.relative
    abs_tolerance: float = FP16_TOLERANCE.absolute
    verify_timeout: float = 600
    samples: SamplesRef | None = Field(
        default=None, description="The model's golden samples, verification's reference"
    )
    samples_problem: str | None = Field(
        default=None, description="Why the model has no golden samples"
    )
    fingerprint: str


def fingerprinted(
    request: CompileRequest, ort_version: str, build_identity: dict[str, str]
) -> CompileRequest:
    """The request with the fingerprint these ORT and EP package versions give it:
    everything that decides the pair's artifact and whether it is published (recipe,
    coverage floor, verification settings and samples). Same fingerprint, same build. (A
    pair bound to a work pool is fingerprinted there, with the pool's packages.)"""
    payload = {
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
) -> list[PlannedPair]:
    """Decide compile or skip for each pair. A pair is skipped when the manifest holds an
    ok build with the same fingerprint whose artifact is still in the store at its size."""
    planned = []
    for model, target in pairs:
        source = sources[model.name]
        unfingerprinted = CompileRequest(
            model=model.name,
            target=target.name,
            ep=target.ep,
            device=target.device_type,
            provider_options=target.provider_options,
            input_shapes=model.input_shapes,
            source_key=source.uri,
            source_sha256=source.sha256,
            source_size=source.size,
            graph_optimization=target.graph_optimization or "basic",  # set by validation
            min_coverage=target.min_coverage,
            verify=target.verify,
            tolerance=target.tolerance or FP16_TOLERANCE.relative,  # set by validation
            abs_tolerance=FP16_TOLERANCE.absolute
            if target.abs_tolerance is None
            else target.abs_tolerance,
            verify_timeout=target.verify_timeout,
            samples=samples.get(model.name),
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
    if previous.fingerprint != request.fingerprint:
        return "compile", "inputs changed (source, target, shapes, ORT/EP version or recipe)"
    if previous.status != "ok" or previous.artifact is None:
        return "compile", "previous compile failed"
    if stored_size(previous.artifact.uri) != previous.artifact.size:
        return "compile", f"artifact {previous.artifact.uri} is missing from the store"
    return "skip", "up to date"
