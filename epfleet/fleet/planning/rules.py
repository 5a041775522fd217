"""Which pairs need compiling (pure: every fact it needs is passed in, the EP modules of
the targets too: ``EpModules``, loaded by the caller with ``eps.load``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Literal

from pydantic import BaseModel, Field

from epfleet.formats.manifest import (
    ArtifactRef,
    Manifest,
    SamplesRef,
    SourceEntry,
    VariantEntry,
)
from epfleet.formats.spec import ModelSpec, RuntimeSpec, TargetSpec, dask_resource
from epfleet.runtime.requests import (
    CompileRequest,
    QuantizeOptions,
    Rung,
    RuntimeRef,
    fingerprinted,
    source_fields,
)
from eps.base import ExecutionProvider, effective_tolerance

EpModules = Mapping[str, ExecutionProvider]
"""The EP module of each execution provider a plan names (``eps.load(name)``), by name."""


def embeds_context(choice: bool | None, source: SourceEntry, max_bytes: int) -> bool:
    """Whether a variant embeds its EP contexts: the target's choice, else whether the
    source totals less than ``max_bytes``."""
    if choice is not None:
        return choice
    return source.total_size < max_bytes


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
    dask_resource: str | None = Field(
        default=None,
        description="On the Dask task runner, the worker resource its compile needs (its "
        "runtime's), or None for any worker",
    )


def ladder_of(target: TargetSpec, module: ExecutionProvider) -> list[Rung]:
    """The target's precisions, each with the provider options that build it (``module``:
    the target's EP module) and the tolerances it is verified with (the spec's, else its
    precision's default)."""
    rungs = []
    for precision in target.ladder:
        tolerance = effective_tolerance(target.tolerance, target.abs_tolerance, precision=precision)
        rungs.append(
            Rung(
                precision=precision,
                provider_options=module.with_precision(precision, target.provider_options),
                tolerance=tolerance.relative,
                abs_tolerance=tolerance.absolute,
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
    built_with: dict[str, tuple[str, dict[str, str]]],
    force: bool,
    stored_size: Callable[[str], int | None],
    embed_max_bytes: int,
    ep_modules: EpModules,
    calibrations: dict[str, ArtifactRef | None] | None = None,
    runtimes: dict[str, RuntimeSpec] | None = None,
) -> list[PlannedPair]:
    """Decide compile or skip for each pair. A pair is skipped when the manifest holds an
    ok build with the same fingerprint whose artifact and files are still in the store
    at their sizes, or a failed compile with the same fingerprint (up to date, failed).
    ``built_with``: each target's onnxruntime version and EP build identity (its
    runtime's, or the host's); ``runtimes``: the spec's, by name.
    ``embed_max_bytes``: the caller's EPFLEET_EMBED_CONTEXT_MAX_BYTES (a rule reads no
    setting); ``ep_modules``: the targets' EP modules."""
    planned = []
    known = runtimes or {}
    for model, target in pairs:
        source = sources[model.name]
        module = ep_modules[target.ep]
        first, *fallbacks = ladder_of(target, module)
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
                if module.partitions_graph  # only EPContext models have contexts
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
            metric=model.named_metric,
            decision_default=model.decision_default,
            fold_io=target.fold_io,
            runtime=(
                RuntimeRef(name=target.runtime, requirements=known[target.runtime].requirements)
                if target.runtime
                else None
            ),
            fingerprint="",
        )
        request = fingerprinted(unfingerprinted, *built_with[target.name])
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
                dask_resource=(
                    dask_resource(target.runtime)
                    if target.runtime and known[target.runtime].dask_resource
                    else None
                ),
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
