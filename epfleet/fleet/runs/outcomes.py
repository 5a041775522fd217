"""How a compile outcome becomes a manifest entry and a report row.

A pair's compile ends as a ``PairOutcome``: the ``VariantEntry`` it publishes (an ok
build, or a failure with its error) and the ``PairResult`` the run reports. The fleet
flow, its work pools' compile-pairs runs and the store hand-over between them all build
outcomes here, so an entry reads the same wherever it was compiled.
"""

from __future__ import annotations

from pydantic import BaseModel

import eps
from epfleet import ort_version
from epfleet.errors import CompileError, RejectedBuild
from epfleet.fleet.build.staging import built_with
from epfleet.fleet.runs.models import PairOutcome, PairResult
from epfleet.formats.keys import files_key
from epfleet.formats.manifest import (
    ArtifactRef,
    Coverage,
    PackageFile,
    VariantEntry,
    VariantRuntime,
    Verification,
    utcnow,
)
from epfleet.runtime.compiler import CompileOutput
from epfleet.runtime.requests import CompileRequest, RuntimeRef


class CompiledVariant(BaseModel):
    """A pair built, checked and uploaded: its manifest entry and the compile's seconds."""

    entry: VariantEntry
    seconds: float


def ok_entry(
    request: CompileRequest, output: CompileOutput, artifact_key: str, verification: Verification
) -> VariantEntry:
    """The entry of a build that passed its checks and was uploaded at ``artifact_key``
    (its other files under files/<sha256>)."""
    ort, build = built_with(request.ep, request.runtime)
    return VariantEntry(
        ep=request.ep,
        device=request.device,
        compatibility_string=output.compatibility_string,
        provider_options=request.provider_options,
        artifact=ArtifactRef(uri=artifact_key, sha256=output.sha256, size=output.size),
        model_file=output.model_file,
        files=[
            PackageFile(path=path, uri=files_key(sha256), sha256=sha256, size=size)
            for path, sha256, size in output.files
        ],
        ort_version=ort,
        ep_version=build["version"],
        compiled_at=utcnow(),
        status="ok",
        source_sha256=request.source_sha256,
        fingerprint=request.fingerprint,
        coverage=output.coverage,
        verification=verification,
        precision=request.precision,
        quantization=output.quantization,
        folded_io=output.folded_io,
        runtime=variant_runtime(
            request.runtime, ort, build, request.ep, output.compatibility_string
        ),
    )


def variant_runtime(
    runtime: RuntimeRef | None,
    ort: str,
    build: dict[str, str],
    ep: str,
    compatibility_string: str | None,
) -> VariantRuntime | None:
    """What a variant's entry says of the runtime it was built under (the SDK release
    where the EP's string names one)."""
    if runtime is None:
        return None
    return VariantRuntime(
        name=runtime.name,
        onnxruntime=ort,
        ep_package=build["package"],
        ep_version=build["version"],
        sdk_version=(
            eps.load(ep).sdk_version(compatibility_string) if compatibility_string else None
        ),
    )


def failed_entry(
    request: CompileRequest,
    error: str,
    coverage: Coverage | None = None,
    verification: Verification | None = None,
    output: CompileOutput | None = None,
) -> VariantEntry:
    """The entry of a pair that failed with ``error``, with what was measured of its build
    (merge keeps a working build over it)."""
    try:
        ort, build = built_with(request.ep, request.runtime)
    except Exception:
        ort, build = ort_version(), {}
    return VariantEntry(
        ep=request.ep,
        device=request.device,
        provider_options=request.provider_options,
        ort_version=ort,
        ep_version=build.get("version"),
        runtime=(
            variant_runtime(
                request.runtime,
                ort,
                build,
                request.ep,
                output.compatibility_string if output else None,
            )
            if build
            else None
        ),
        compiled_at=utcnow(),
        status="failed",
        error=error,
        source_sha256=request.source_sha256,
        fingerprint=request.fingerprint,
        coverage=coverage,
        verification=verification,
        precision=request.precision,
        quantization=output.quantization if output is not None else None,
    )


def ok_outcome(request: CompileRequest, compiled: CompiledVariant) -> PairOutcome:
    return PairOutcome(
        entry=compiled.entry,
        result=PairResult.of(request, compiled.entry, "ok", compiled.seconds),
    )


def failed_outcome(request: CompileRequest, error: str) -> PairOutcome:
    entry = failed_entry(request, error)
    return PairOutcome(entry=entry, result=PairResult.of(request, entry, "failed", None))


def outcome_of_failure(request: CompileRequest, exc: Exception) -> PairOutcome:
    """The outcome of a compile task that raised ``exc``. A verdict on the build (the EP
    refused or crashed on it, its checks rejected it: a CompileError) is recorded, and the
    pair stays failed until its inputs change. Anything else (a store still failing after
    its retries, an EP package missing on this worker) is reported but not recorded, so
    the next run tries again."""
    if isinstance(exc, RejectedBuild):
        result = PairResult.of(request, exc.entry, "failed", exc.seconds)
        return PairOutcome(entry=exc.entry, result=result)
    outcome = failed_outcome(request, str(exc))
    outcome.publish = isinstance(exc, CompileError)
    return outcome
