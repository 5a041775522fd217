"""The ``fleet-compile`` flow: compile every model for every EP target and publish.

python flows/fleet_compile.py examples/fleet.yaml --store ./epfleet-store
"""

# No `from __future__ import annotations` here: Prefect builds each flow's parameter model
# from its annotations when it loads the flow from this file (deployments), and string
# annotations do not resolve there.
import runpy
import sys
from typing import Annotated

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field

from epfleet import MAX_WORKERS
from epfleet.errors import StoreError
from epfleet.fleet.outcomes import PairOutcome
from epfleet.fleet.plan_rules import PlannedPair
from epfleet.fleet.publish_rules import news, settle, to_publish
from epfleet.fleet.publishing import read_in_force
from epfleet.fleet.runs import RunPlan, RunReport
from epfleet.fleet.task_runners import from_environment
from epfleet.fleet.views import matrix_rows
from epfleet.lifecycle.costs import cost_markdown, costs
from epfleet.stores import DEFAULT_STORE, open_store
from tasks.compile import compile_all, plan_task, publish_task
from tasks.dispatch import collect, discard_results, dispatch
from tasks.events import emit_variant_events


@flow(
    name="fleet-compile",
    description="Compile every model for every EP target, stamp compatibility strings, "
    "upload the artifacts and publish the manifest with compare-and-swap.",
    task_runner=from_environment(),
)
def fleet_compile(
    spec: str,
    store: str = DEFAULT_STORE,
    workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)] = 2,
    force: bool = False,
    models: list[str] = [],  # noqa: B006 (never changed; Prefect's form needs a list default)
    targets: list[str] = [],  # noqa: B006
    work_pool_timeout: Annotated[int, Field(ge=1)] = 3600,
) -> RunReport:
    """Compile every model for every EP target and publish the manifest.

    Args:
        spec: Path of the fleet spec YAML on the worker (relative to its working directory).
        store: Store URI: a directory, file:///abs/dir or s3://bucket/prefix.
        workers: Compiles run in parallel on this machine (1 to 64).
        force: Recompile pairs that are up to date.
        models: Only these models (empty: every model of the spec).
        targets: Only these targets (empty: every target of the spec).
        work_pool_timeout: Seconds from dispatch to wait for pairs sent to a target's work
            pool (1 or more; default an hour).
    """
    plan: RunPlan = plan_task(spec, store, models or None, targets or None, force)
    by_pool: dict[str, list[PlannedPair]] = {}
    here = []
    for pair in plan.to_compile:
        if pair.work_pool:
            by_pool.setdefault(pair.work_pool, []).append(pair)
        else:
            here.append(pair.request)
    sent = [
        dispatch(pool, pairs, store, workers, work_pool_timeout, force)
        for pool, pairs in by_pool.items()
    ]
    outcomes = compile_all(here, store, workers)
    if sent:
        outcomes += collect(sent, store)
    report = _publish(plan, outcomes, store)
    discard_results(store, sent)
    _publish_artifacts(report, store)
    _cost_artifact(store)
    emit_variant_events(news(plan, report), store, report.generation)
    return report


def _publish(plan: RunPlan, outcomes: list[PairOutcome], store: str) -> RunReport:
    """Publish the run's outcomes (rules: ``epfleet.fleet.publish_rules``) and report."""
    variants = to_publish(plan, outcomes)
    outcome = publish_task(store, plan.sources, plan.published_sources, variants, plan.model_facts)
    report, refused = settle(plan, outcomes, outcome)
    for result in refused:
        get_run_logger().warning("%s × %s: %s", result.model, result.target, result.error)
    return report


def _publish_artifacts(report: RunReport, store: str) -> None:
    create_table_artifact(
        key="fleet-compile-matrix",
        table=matrix_rows(report),
        description=f"Compile matrix for {store}: model × target → status · seconds · size "
        f"(generation {report.generation})",
    )
    create_markdown_artifact(
        key="fleet-compile-summary",
        markdown=(
            f"**{report.compiled} compiled, {report.skipped} up to date, {report.failed} failed**"
            f" · manifest generation {report.generation}"
            f"{' (published)' if report.published else ' (unchanged)'} · store `{store}`\n\n"
            + "\n".join(
                f"- `{r.model} × {r.target}` failed: {r.error}"
                for r in report.variants
                if r.status == "failed"
            )
        ),
    )


def _cost_artifact(store: str) -> None:
    """Bytes per model and target and the store's total, as a markdown artifact. A store
    that fails here costs the run only this artifact: the manifest is already published."""
    try:
        opened = open_store(store)
        data = costs(opened, read_in_force(opened).manifest)
    except StoreError as exc:
        get_run_logger().warning("no cost artifact: %s", exc)
        return
    create_markdown_artifact(
        key="fleet-compile-costs",
        markdown=cost_markdown(data),
        description=f"Store costs for {store} (generation {data.generation}): bytes per model "
        "and target, the store's total referenced and unreferenced",
    )


if __name__ == "__main__":
    # The epfleet command's own entry point (``python -m epfleet``), not an import of it:
    # the CLI imports the flows, so a flow importing the CLI would close a circle.
    sys.argv[1:1] = ["compile"]
    runpy.run_module("epfleet", run_name="__main__", alter_sys=True)
