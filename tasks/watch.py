"""Prefect tasks of runtime-watch: read what the watch compares, start the compile.

Thin glue over ``epfleet.fleet.watch.watching`` (one pass: what is read, what is decided); the
watch task is retried only for store faults (``epfleet.fleet.runs.retries``).
"""

from __future__ import annotations

import hashlib
import json

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound

from epfleet import ort_version
from epfleet.errors import BadInputError
from epfleet.fleet.runs.retries import TASK_RETRIES, TASK_RETRY_DELAY, retry_transient_only
from epfleet.fleet.watch.rules import WatchPlan
from epfleet.fleet.watch.watching import watch_once
from epfleet.stores import open_store


@task(
    name="watch",
    cache_policy=NO_CACHE,
    retries=TASK_RETRIES,
    retry_delay_seconds=TASK_RETRY_DELAY,
    retry_condition_fn=retry_transient_only,
)
def watch_task(spec: str, store: str, report_max_age_days: int) -> tuple[WatchPlan, int]:
    """The watch's findings and the manifest generation they were made on."""
    found = watch_once(spec, store, report_max_age_days)
    logger = get_run_logger()
    for note in found.notes:
        logger.warning("%s", note)
    return found.plan, found.generation


def trigger_key(
    plan: WatchPlan, generation: int, runtime_note: str, deployment: str, spec: str, store: str
) -> str:
    """The same findings on the same manifest of the same store start one compile, however
    often the watch runs while that compile is queued or running. (Prefect keeps keys per
    flow, not per deployment or store: two fleets' watches must not share one.)"""
    todo = [(p.model, p.target, p.reason) for p in plan.to_compile]
    what = [deployment, spec, open_store(store).uri, generation, runtime_note, todo]
    return f"runtime-watch:{hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]}"


def trigger_compile(
    deployment: str, spec: str, store: str, plan: WatchPlan, generation: int
) -> str:
    """Start ``deployment`` for the pairs to compile, unless a run for the same findings is
    queued, running or completed; the flow run's name. A run for them that failed, crashed
    or was cancelled (a worker or store outage: failed compiles still complete) is followed
    by a new one."""
    models, targets = plan.compile_subset()
    first = key = trigger_key(plan, generation, ort_version(), deployment, spec, store)
    while True:
        try:
            run: FlowRun = run_deployment(  # type: ignore[assignment]  # sync when called here
                deployment,
                parameters={"spec": spec, "store": store, "models": models, "targets": targets},
                timeout=0,
                idempotency_key=key,
                tags=["runtime-watch"],
            )
        except ObjectNotFound:
            raise BadInputError(
                f"no deployment {deployment!r} to trigger: deploy deployments/prefect.yaml or "
                "serve deployments/serve.py, or pass compile_deployment"
            ) from None
        ended = run.state.type.value if run.state and run.state.is_final() else None
        if ended not in ("FAILED", "CRASHED", "CANCELLED"):
            return run.name
        get_run_logger().warning(
            "%s run %s ended %s: starting another", deployment, run.name, ended
        )
        key = f"{first}:after:{run.id}"
