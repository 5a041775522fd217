"""Prefect tasks of the fleet compile: plan, compile one pair, publish.

Thin glue: each task calls a plain function (``epfleet.fleet.planning.plan``,
``epfleet.fleet.build.variant``, ``epfleet.fleet.publishing.publish``) and logs what it
did. Retries (see ``epfleet.fleet.runs.retries``): each task is retried only for
``TransientStoreError`` and ``IntegrityError``; lost publish races are retried inside
``publish``, transient HTTP faults inside the store's client. Incremental builds are
decided by epfleet's own fingerprints against the manifest (the cache keys we control),
so Prefect's result cache stays off for these tasks.
"""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.futures import PrefectFuture, as_completed

from epfleet.errors import EpfleetError
from epfleet.fleet.build.variant import build_variant, describe_verification
from epfleet.fleet.planning.plan import handed_plan, plan_inputs, plan_run
from epfleet.fleet.publishing.merge_rules import ModelFacts
from epfleet.fleet.publishing.publish import Published, publish
from epfleet.fleet.runs.models import RunPlan
from epfleet.fleet.runs.outcomes import CompiledVariant, PairOutcome, ok_outcome, outcome_of_failure
from epfleet.fleet.runs.retries import TASK_RETRIES, TASK_RETRY_DELAY, retry_transient_only
from epfleet.fleet.runs.task_runners import DaskWorkers, dask_resources, unserved_resource
from epfleet.fleet.views import coverage_text
from epfleet.formats.manifest import SourceEntry, VariantEntry
from epfleet.runtime.requests import CompileRequest
from epfleet.stores import open_store
from tasks.events import emit_tampered_event


@task(
    name="plan",
    cache_policy=NO_CACHE,
    retries=TASK_RETRIES,
    retry_delay_seconds=TASK_RETRY_DELAY,
    retry_condition_fn=retry_transient_only,
)
def plan_task(
    spec: str, store: str, models: list[str] | None, targets: list[str] | None, force: bool
) -> RunPlan:
    logger = get_run_logger()
    plan = handed_plan(plan_inputs(spec, store, models, targets, force))
    if plan is not None:
        logger.info("planned by the command that started this run")
    else:
        plan = plan_run(Path(spec), store, models, targets, force)
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
    retries=TASK_RETRIES,
    retry_delay_seconds=TASK_RETRY_DELAY,
    retry_condition_fn=retry_transient_only,
)
def compile_task(request: CompileRequest, store: str, workers: int) -> CompiledVariant:
    """Compile one pair in a worker process and upload its files content-addressed."""
    compiled = build_variant(request, open_store(store), workers)
    entry = compiled.entry
    get_run_logger().info(
        "%s × %s: compiled in %.2f s, %d bytes in %d files, %s; coverage %s; verification %s",
        request.model,
        request.target,
        compiled.seconds,
        entry.total_size,
        1 + len(entry.files),
        entry.compatibility_string,
        coverage_text(entry.coverage.fraction, entry.coverage.boundary_qdq)
        + (" (boundary Q/DQ folded: integer I/O)" if entry.folded_io else "")
        if entry.coverage
        else "-",
        describe_verification(entry.verification) if entry.verification else "-",
    )
    return compiled


@task(
    name="publish",
    cache_policy=NO_CACHE,
    retries=TASK_RETRIES,
    retry_delay_seconds=TASK_RETRY_DELAY,
    retry_condition_fn=retry_transient_only,
)
def publish_task(
    store: str,
    sources: dict[str, SourceEntry],
    planned_on: dict[str, SourceEntry | None],
    variants: list[tuple[str, str, VariantEntry]],
    facts: ModelFacts | None = None,
) -> Published:
    outcome = publish(
        open_store(store), sources, planned_on, {(m, t): v for m, t, v in variants}, facts
    )
    logger = get_run_logger()
    if outcome.published and outcome.manifest is not None:
        logger.info("published %s/manifest.json generation %d", store, outcome.manifest.generation)
    else:
        logger.info("manifest unchanged; nothing published")
    for model in outcome.conflicts:
        logger.warning("model %s: its source changed in the store meanwhile; left as is", model)
    emit_tampered_event(outcome.tampered, store)  # publishing logged it
    return outcome


def compile_all(
    requests: list[CompileRequest],
    store: str,
    workers: int,
    resources: dict[tuple[str, str], str] | None = None,
) -> list[PairOutcome]:
    """Run ``compile_task`` for every request on the flow's task runner, logging progress
    as each finishes. A failed pair becomes a failed outcome (``outcome_of_failure``); it
    never stops the others. ``resources``: (model, target) -> the Dask worker resource its
    compile needs (its runtime's; see ``submit_pinned``).
    Call from inside a flow."""
    logger = get_run_logger()
    resources = resources or {}
    advertised = dask_resources() if resources else None
    futures = {}
    outcomes = []
    for request in requests:
        resource = resources.get((request.model, request.target))
        refused = unserved_resource(resource, advertised)
        if refused is not None:
            logger.error("%s × %s: %s", request.model, request.target, refused)
            outcomes.append(outcome_of_failure(request, EpfleetError(refused)))
            continue
        futures[submit_pinned(request, store, workers, resource, advertised)] = request
    for done, future in enumerate(as_completed(list(futures)), start=1):
        request = futures[future]
        try:
            outcome = ok_outcome(request, future.result())
        except Exception as exc:
            outcome = outcome_of_failure(request, exc)
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


def submit_pinned(
    request: CompileRequest,
    store: str,
    workers: int,
    resource: str | None,
    dask: DaskWorkers | None,
) -> PrefectFuture[CompiledVariant]:
    """Submit one compile, on Dask to the workers advertising ``resource`` (the task
    runner's own local cluster: to any of its workers, unless some advertise it)."""
    if resource is None or dask is None or resource not in dask.resources:
        return compile_task.submit(request, store, workers)
    import dask as dask_config

    with dask_config.annotate(resources={resource: 1}):
        return compile_task.submit(request, store, workers)
