"""The ``fleet-compile`` flow: compile every model for every EP target and publish.

python flows/fleet_compile.py examples/fleet.yaml --store ./epfleet-store
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.futures import as_completed
from prefect.task_runners import ThreadPoolTaskRunner
from pydantic import Field

from epfleet.fleet import DEFAULT_STORE, PairResult, RunPlan, RunReport
from epfleet.manifest import VariantEntry
from epfleet.report import matrix_rows
from tasks.compile import compile_task, failed_entry, plan_task, publish_task


@flow(
    name="fleet-compile",
    description="Compile every model for every EP target, stamp compatibility strings, "
    "upload the artifacts and publish the manifest with compare-and-swap.",
    task_runner=ThreadPoolTaskRunner[Any](max_workers=8),  # type: ignore[arg-type]
)
def fleet_compile(
    spec: Annotated[str, Field(description="Path of the fleet spec YAML on the worker")],
    store: Annotated[
        str, Field(description="Store URI: a directory, file:///abs/dir or s3://bucket/prefix")
    ] = DEFAULT_STORE,
    workers: Annotated[int, Field(ge=1, le=64, description="Compiles run in parallel")] = 2,
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
    entries: list[tuple[str, str, VariantEntry]] = []
    results: dict[tuple[str, str], PairResult] = {}
    for done, future in enumerate(as_completed(list(futures)), start=1):
        request = futures[future]
        seconds: float | None = None
        try:
            compiled = future.result()
            entry, seconds = compiled.entry, compiled.seconds
        except Exception as exc:
            entry = failed_entry(request, str(exc))
        entries.append((request.model, request.target, entry))
        results[(request.model, request.target)] = _pair_result(
            request.model, request.target, entry, seconds=seconds
        )
        logger.info(
            "[%d/%d] %s × %s: %s",
            done,
            len(todo),
            request.model,
            request.target,
            "ok" if entry.status == "ok" else f"FAILED: {entry.error}",
        )
    order = {(p.request.model, p.request.target): i for i, p in enumerate(plan.pairs)}
    entries.sort(key=lambda e: order[(e[0], e[1])])  # manifest order follows the spec
    manifest, published = publish_task(store, plan.sources, entries)
    for pair in plan.pairs:
        key = (pair.request.model, pair.request.target)
        if key not in results:
            variant = manifest.models[key[0]].variants[key[1]] if manifest else None
            results[key] = _pair_result(key[0], key[1], variant, skipped=True, ep=pair.request.ep)
    ordered = [results[(p.request.model, p.request.target)] for p in plan.pairs]
    report = RunReport(
        generation=manifest.generation if manifest else 0,
        published=published,
        compiled=sum(r.status == "ok" for r in ordered),
        skipped=sum(r.status == "skipped" for r in ordered),
        failed=sum(r.status == "failed" for r in ordered),
        variants=ordered,
    )
    _publish_artifacts(report, store)
    return report


def _pair_result(
    model: str,
    target: str,
    entry: VariantEntry | None,
    skipped: bool = False,
    ep: str = "",
    seconds: float | None = None,
) -> PairResult:
    if entry is None:
        return PairResult(model=model, target=target, ep=ep, status="skipped")
    failed = entry.status == "failed"
    return PairResult(
        model=model,
        target=target,
        ep=entry.ep,
        status="failed" if failed else "skipped" if skipped else "ok",
        compatibility_string=entry.compatibility_string,
        artifact_uri=entry.artifact.uri if entry.artifact else None,
        size=entry.artifact.size if entry.artifact else None,
        seconds=seconds,
        error=entry.error if failed else None,
    )


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
