"""The ``fleet-compile`` flow: compile every model for every EP target and publish.

python flows/fleet_compile.py examples/fleet.yaml --store ./epfleet-store
"""

# No `from __future__ import annotations` here: Prefect builds each flow's parameter model
# from its annotations when it loads the flow from this file (deployments), and string
# annotations do not resolve there.
import runpy
import sys
from dataclasses import dataclass, field
from typing import Annotated

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field

from epfleet import MAX_WORKERS
from epfleet.errors import StoreError
from epfleet.fleet.planning.plan import handed_origin, handed_report, plan_inputs
from epfleet.fleet.planning.rules import PlannedPair
from epfleet.fleet.publishing.publish import Published, read_in_force
from epfleet.fleet.publishing.rules import news
from epfleet.fleet.runs.compile_run import run_compiles
from epfleet.fleet.runs.models import RunPlan, RunReport
from epfleet.fleet.runs.outcomes import PairOutcome
from epfleet.fleet.runs.task_runners import from_environment
from epfleet.fleet.views import detail_rows, matrix_rows, runtime_lines
from epfleet.formats.manifest import VariantEntry
from epfleet.lifecycle.costs import cost_markdown, costs
from epfleet.stores import DEFAULT_STORE, open_store
from tasks.compile import compile_all, plan_task, publish_task
from tasks.dispatch import Dispatched, collect, discard_results, dispatch
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
    inputs = plan_inputs(spec, store, models or None, targets or None, force)
    done = handed_report(inputs)
    if done is not None:
        # ``epfleet compile`` compiled and published this plan without Prefect: while the
        # temporary API started, or earlier, with no API to record it on (a kept run).
        get_run_logger().info(
            "%s: %d compiled, %d failed, manifest generation %d",
            handed_origin(inputs),
            done.compiled,
            done.failed,
            done.generation,
        )
        report = done
    else:
        runner = _FlowRunner(store, workers, work_pool_timeout, force)
        report = run_compiles(plan, runner)
        discard_results(store, runner.sent)
    _publish_artifacts(report, store)
    _store_artifacts(store)
    emit_variant_events(news(plan, report), store, report.generation)
    return report


@dataclass
class _FlowRunner:
    """The run's work as Prefect tasks: compiles on the flow's task runner, a work pool's
    pairs in a ``compile-pairs`` child run, the publish a retried task."""

    store: str
    workers: int
    work_pool_timeout: int
    force: bool
    sent: list[Dispatched] = field(default_factory=list)

    def compile_here(self, pairs: list[PlannedPair]) -> list[PairOutcome]:
        resources = {
            (pair.request.model, pair.request.target): pair.dask_resource
            for pair in pairs
            if pair.dask_resource
        }
        return compile_all([pair.request for pair in pairs], self.store, self.workers, resources)

    def compile_in_pool(self, pool: str, pairs: list[PlannedPair]) -> None:
        sent = dispatch(pool, pairs, self.store, self.workers, self.work_pool_timeout, self.force)
        self.sent.append(sent)

    def collect_pools(self) -> list[PairOutcome]:
        return collect(self.sent, self.store)

    def publish(self, plan: RunPlan, variants: list[tuple[str, str, VariantEntry]]) -> Published:
        return publish_task(
            self.store, plan.sources, plan.published_sources, variants, plan.model_facts
        )

    def warn(self, message: str) -> None:
        get_run_logger().warning("%s", message)


def _publish_artifacts(report: RunReport, store: str) -> None:
    create_table_artifact(
        key="fleet-compile-matrix",
        table=matrix_rows(report),
        description=f"Compile matrix for {store}: model × target → status, precision, verified "
        "error (EP n%: the EP took part of the graph); every measurement in the "
        f"fleet-compile-details artifact (generation {report.generation})",
    )
    create_table_artifact(
        key="fleet-compile-details",
        table=detail_rows(report),
        description=f"Each pair of the compile matrix for {store}: precision (and the "
        "ladder's losers), compile seconds, size, coverage (and the I/O Q/DQ left on the "
        f"CPU EP), verification (generation {report.generation})",
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


def _store_artifacts(store: str) -> None:
    """From the manifest in force: bytes per model and target and the store's total, and,
    when variants are built under the spec's runtimes, the variants serving each runtime.
    A store that fails here costs the run only these artifacts: the manifest is already
    published."""
    try:
        opened = open_store(store)
        manifest = read_in_force(opened).manifest
        data = costs(opened, manifest)
    except StoreError as exc:
        get_run_logger().warning("no cost artifact: %s", exc)
        return
    create_markdown_artifact(
        key="fleet-compile-costs",
        markdown=cost_markdown(data),
        description=f"Store costs for {store} (generation {data.generation}): bytes per model "
        "and target, the store's total referenced and unreferenced",
    )
    served = runtime_lines(manifest) if manifest else []
    if served:
        create_markdown_artifact(
            key="fleet-compile-runtimes",
            markdown="```\n" + "\n".join(served) + "\n```",
            description=f"Runtimes of {store} (generation {data.generation}): each one's "
            "onnxruntime, EP package and SDK releases, and the variants that serve it",
        )


if __name__ == "__main__":
    # The epfleet command's own entry point (``python -m epfleet``), not an import of it:
    # the CLI imports the flows, so a flow importing the CLI would close a circle.
    sys.argv[1:1] = ["compile"]
    runpy.run_module("epfleet", run_name="__main__", alter_sys=True)
