"""The ``fleet-compile`` flow: compile every model for every EP target and publish.

python flows/fleet_compile.py examples/fleet.yaml --store ./epfleet-store
"""

# No `from __future__ import annotations` here: Prefect builds each flow's parameter model
# from its annotations when it loads the flow from this file (deployments), and string
# annotations do not resolve there.
import sys
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field

from epfleet import MAX_WORKERS
from epfleet.fleet import DEFAULT_STORE, PairResult, RunPlan, RunReport
from epfleet.manifest import VariantEntry
from epfleet.report import matrix_rows
from tasks.compile import compile_task, failed_entry, plan_task, publish_task


@flow(
    name="fleet-compile",
    description="Compile every model for every EP target, stamp compatibility strings, "
    "upload the artifacts and publish the manifest with compare-and-swap.",
    # Task threads only wait on the compile worker processes, whose number `workers` sets.
    task_runner=ThreadPoolTaskRunner[Any](max_workers=MAX_WORKERS),  # type: ignore[arg-type]
)
def fleet_compile(
    spec: Annotated[str, Field(description="Path of the fleet spec YAML on the worker")],
    store: Annotated[
        str, Field(description="Store URI: a directory, file:///abs/dir or s3://bucket/prefix")
    ] = DEFAULT_STORE,
    workers: Annotated[
        int, Field(ge=1, le=MAX_WORKERS, description="Compiles run in parallel")
    ] = 2,
    force: Annotated[bool, Field(description="Recompile pairs that are up to date")] = False,
    models: Annotated[
        list[str] | None, Field(description="Only these models (default: all)")
    ] = None,
    targets: Annotated[
        list[str] | None, Field(description="Only these targets (default: all)")
    ] = None,
) -> RunReport:
    logger = get_run_logger()
    plan: RunPlan = plan_task(spec, store, models or None, targets or None, force)
    todo = plan.to_compile
    futures = {compile_task.submit(p.request, store, workers): p.request for p in todo}
    entries: dict[tuple[str, str], VariantEntry] = {}
    results: dict[tuple[str, str], PairResult] = {}
    for done, future in enumerate(as_completed(list(futures)), start=1):
        request = futures[future]
        key = (request.model, request.target)
        try:
            compiled = future.result()
            entries[key] = compiled.entry
            results[key] = PairResult.of(request, compiled.entry, "ok", compiled.seconds)
        except Exception as exc:
            entries[key] = failed_entry(request, str(exc))
            results[key] = PairResult.of(request, entries[key], "failed", None)
        logger.info(
            "[%d/%d] %s × %s: %s",
            done,
            len(todo),
            request.model,
            request.target,
            results[key].status if results[key].status == "ok" else f"FAILED: {entries[key].error}",
        )
    keys = [(p.request.model, p.request.target) for p in plan.pairs]
    in_spec_order = [(*key, entries[key]) for key in keys if key in entries]
    outcome = publish_task(store, plan.sources, plan.published_sources, in_spec_order)
    for key, result in results.items():
        if key[0] in outcome.conflicts and result.status == "ok":
            results[key] = result.model_copy(
                update={
                    "status": "failed",
                    "error": f"not published: the source of model {key[0]!r} changed in the store "
                    "while this run compiled (another publisher); run again to compile it",
                }
            )
    manifest = outcome.manifest
    report = plan.report(results, manifest.generation if manifest else 0, outcome.published)
    _publish_artifacts(report, store)
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


if __name__ == "__main__":
    from epfleet.cli import main

    sys.exit(main(["compile", *sys.argv[1:]]))
