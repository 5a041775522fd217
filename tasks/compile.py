"""Prefect tasks of the fleet compile: plan, compile one pair, publish."""

from __future__ import annotations

from pathlib import Path

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.futures import as_completed
from prefect.states import State
from pydantic import BaseModel, Field

import eps
from epfleet import ort_version
from epfleet.compiler import CompileOutput, check_coverage, discard
from epfleet.errors import CompileError, IntegrityError, TransientStoreError
from epfleet.fleet import (
    PairResult,
    Published,
    RunPlan,
    compile_job_for,
    fetch_verified,
    plan_run,
    publish,
)
from epfleet.manifest import (
    ArtifactRef,
    SamplesRef,
    SourceEntry,
    VariantEntry,
    Verification,
    utcnow,
)
from epfleet.plan import CompileRequest, variant_key
from epfleet.pool import shared_pool
from epfleet.stores import Store, open_store
from epfleet.verify import VerifyJob, skipped, verify_artifact


class CompiledVariant(BaseModel):
    entry: VariantEntry
    seconds: float


class PairOutcome(BaseModel):
    """One pair's compile, as it goes into the manifest (entry) and the report (result)."""

    entry: VariantEntry
    result: PairResult
    publish: bool = Field(
        default=True,
        description="False for a pair its work pool never decided (the pool did not run): "
        "the run reports it failed, the manifest keeps the entry it has",
    )

    @property
    def key(self) -> tuple[str, str]:
        return (self.result.model, self.result.target)


def retry_transient_only(task: Task, task_run: TaskRun, state: State) -> bool:
    """Retry store hiccups; a compile error or bad input fails the same way every time."""
    try:
        state.result()
    except (TransientStoreError, IntegrityError):
        return True
    except Exception:
        return False
    return False


# Incremental builds are decided by epfleet's own fingerprints against the manifest
# (the cache keys we control), so Prefect's result cache stays off for these tasks.


@task(
    name="plan",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_transient_only,
)
def plan_task(
    spec: str, store: str, models: list[str] | None, targets: list[str] | None, force: bool
) -> RunPlan:
    plan = plan_run(Path(spec), store, models, targets, force)
    logger = get_run_logger()
    logger.info(
        "%d pairs: %d to compile, %d up to date",
        len(plan.pairs),
        len(plan.to_compile),
        len(plan.pairs) - len(plan.to_compile),
    )
    return plan


@task(
    name="compile",
    cache_policy=NO_CACHE,
    task_run_name="{request.model} × {request.target}",
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_transient_only,
)
def compile_task(request: CompileRequest, store: str, workers: int) -> CompiledVariant:
    """Compile one pair in a worker process and upload its artifact content-addressed."""
    target_store = open_store(store)
    output = shared_pool(workers).run(compile_job_for(request, target_store))
    key = variant_key(request.model, request.target, output.sha256)
    logger = get_run_logger()
    try:
        check_coverage(request, output.coverage)
        verification = verify_output(request, output, target_store)
        if verification.status == "failed":
            raise CompileError(f"verification failed: {verification.reason}")
        if target_store.size(key) != output.size:
            target_store.upload(key, Path(output.artifact_path), output.sha256)
    finally:
        discard(output)
    logger.info(
        "%s × %s: compiled in %.2f s, %d bytes, %s; coverage %s; verification %s",
        request.model,
        request.target,
        output.seconds,
        output.size,
        output.compatibility_string,
        f"{output.coverage.fraction:.0%}" if output.coverage else "-",
        describe_verification(verification),
    )
    entry = VariantEntry(
        ep=request.ep,
        device=request.device,
        compatibility_string=output.compatibility_string,
        provider_options=request.provider_options,
        artifact=ArtifactRef(uri=key, sha256=output.sha256, size=output.size),
        ort_version=ort_version(),
        ep_version=eps.load(request.ep).build_identity()["version"],
        compiled_at=utcnow(),
        status="ok",
        source_sha256=request.source_sha256,
        fingerprint=request.fingerprint,
        coverage=output.coverage,
        verification=verification,
    )
    return CompiledVariant(entry=entry, seconds=output.seconds)


def verify_output(request: CompileRequest, output: CompileOutput, store: Store) -> Verification:
    """Run the fresh variant with its own EP on the model's golden samples, in a killable
    worker, and compare with the source's outputs."""
    if not request.verify:
        return skipped("not run: verify is false for this target")
    if request.samples is None:
        return skipped(request.samples_problem or "not run: the model has no golden samples")
    samples = request.samples
    golden = fetch_verified(store, samples.uri, samples.sha256, samples.size)
    job = VerifyJob(
        label=f"{request.model} × {request.target}",
        artifact_path=output.artifact_path,
        golden_path=str(golden),
        ep=request.ep,
        device=request.device,
        provider_options=request.provider_options,
        tolerance=request.tolerance,
    )
    return verify_artifact(job, request.verify_timeout)


def describe_verification(verification: Verification) -> str:
    if verification.status == "passed":
        return (
            f"passed ({verification.max_rel_error:.2%} of range, tolerance "
            f"{verification.tolerance:.2%}, {verification.seconds:.2f} s)"
        )
    return f"{verification.status}: {verification.reason}"


def failed_entry(request: CompileRequest, error: str) -> VariantEntry:
    try:
        ep_version: str | None = eps.load(request.ep).build_identity()["version"]
    except Exception:
        ep_version = None
    return VariantEntry(
        ep=request.ep,
        device=request.device,
        provider_options=request.provider_options,
        ort_version=ort_version(),
        ep_version=ep_version,
        compiled_at=utcnow(),
        status="failed",
        error=error,
        source_sha256=request.source_sha256,
        fingerprint=request.fingerprint,
    )


@task(
    name="publish",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=retry_transient_only,
)
def publish_task(
    store: str,
    sources: dict[str, SourceEntry],
    planned_on: dict[str, SourceEntry | None],
    variants: list[tuple[str, str, VariantEntry]],
    samples: dict[str, SamplesRef | None] | None = None,
) -> Published:
    outcome = publish(
        open_store(store), sources, planned_on, {(m, t): v for m, t, v in variants}, samples
    )
    logger = get_run_logger()
    if outcome.published and outcome.manifest is not None:
        logger.info("published %s/manifest.json generation %d", store, outcome.manifest.generation)
    else:
        logger.info("manifest unchanged; nothing published")
    for model in outcome.conflicts:
        logger.warning("model %s: its source changed in the store meanwhile; left as is", model)
    return outcome


def failed_outcome(request: CompileRequest, error: str) -> PairOutcome:
    entry = failed_entry(request, error)
    return PairOutcome(entry=entry, result=PairResult.of(request, entry, "failed", None))


def compile_all(requests: list[CompileRequest], store: str, workers: int) -> list[PairOutcome]:
    """Run ``compile_task`` for every request on the flow's task runner, logging progress
    as each finishes. A failed pair becomes a failed outcome; it never stops the others.
    Call from inside a flow."""
    logger = get_run_logger()
    futures = {compile_task.submit(request, store, workers): request for request in requests}
    outcomes = []
    for done, future in enumerate(as_completed(list(futures)), start=1):
        request = futures[future]
        try:
            compiled = future.result()
            outcome = PairOutcome(
                entry=compiled.entry,
                result=PairResult.of(request, compiled.entry, "ok", compiled.seconds),
            )
        except Exception as exc:
            outcome = failed_outcome(request, str(exc))
        outcomes.append(outcome)
        logger.info(
            "[%d/%d] %s × %s: %s",
            done,
            len(futures),
            request.model,
            request.target,
            "ok" if outcome.result.status == "ok" else f"FAILED: {outcome.entry.error}",
        )
    return outcomes
