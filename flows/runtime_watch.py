"""The ``runtime-watch`` flow: recompile when the compile workers' runtime moves on.

It compares the ORT and EP package versions installed where it runs (deploy it on the
compile workers' pool) with those each published variant was compiled with, reads the
device reports for device profiles the fleet does not serve, and starts fleet-compile
for the stale and missing pairs.

python flows/runtime_watch.py examples/fleet.yaml --store ./epfleet-store [--dry-run]
"""

# No `from __future__ import annotations`: see flows/fleet_compile.py.
import runpy
import sys
from datetime import timedelta
from typing import Annotated

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field

from epfleet.fleet.watch.rules import WatchPlan
from epfleet.stores import DEFAULT_STORE
from epfleet.text import markdown_cells, markdown_text, printable
from tasks.dispatch import sweep_results
from tasks.events import MAX_UNSERVED_EVENTS, emit_unserved_events
from tasks.watch import trigger_compile, watch_task


@flow(
    name="runtime-watch",
    description="Compare the compile workers' ORT and EP versions with the manifest's, "
    "read device reports for unserved device profiles, and start fleet-compile for stale "
    "or missing pairs.",
)
def runtime_watch(
    spec: str,
    store: str = DEFAULT_STORE,
    compile_deployment: str = "fleet-compile/on-demand",
    trigger: bool = True,
    report_max_age_days: Annotated[int, Field(ge=1)] = 30,
) -> WatchPlan:
    """Start fleet-compile for pairs compiled with an older runtime, or missing.

    Args:
        spec: Path of the fleet spec YAML on the worker (relative to its working directory).
        store: Store URI: a directory, file:///abs/dir or s3://bucket/prefix.
        compile_deployment: The deployment started for stale or missing pairs.
        trigger: Start the compile and emit events (off: only report).
        report_max_age_days: Ignore device reports older than this many days (1 or more).
    """
    logger = get_run_logger()
    plan, generation = watch_task(spec, store, report_max_age_days)
    todo = plan.to_compile
    for pair in todo:
        logger.info("%s × %s: %s (%s)", pair.model, pair.target, pair.status, pair.reason)
    for profile in plan.unserved:
        logger.warning(  # labels, model names and reasons come from device reports: escaped
            "unserved: %d devices (%s) for %s",
            profile.device_count,
            printable(profile.label),
            printable(", ".join(f"{m}: {why}" for m, why in profile.models.items())),
        )
    if trigger:  # a dry run starts nothing, automations included, and removes nothing
        left_out = emit_unserved_events(plan.unserved, store)
        if left_out:
            logger.warning(
                "%d more unserved profiles emitted no event (at most %d a pass, the most "
                "devices first)",
                left_out,
                MAX_UNSERVED_EVENTS,
            )
        try:
            for key in sweep_results(store, timedelta(hours=1)):
                logger.info("removed %s: its fleet run ended without collecting it", key)
        except Exception as exc:  # housekeeping (store or API trouble) never fails the watch
            logger.warning("could not sweep hand-over files: %s", exc)
    started = None
    if todo and trigger:
        started = trigger_compile(compile_deployment, spec, store, plan, generation)
        logger.info(
            "%d pairs to compile: started %s run %s", len(todo), compile_deployment, started
        )
    elif not todo:
        logger.info("every published pair matches the compile workers' runtime")
    _artifacts(plan, store, compile_deployment, started)
    return plan


def _artifacts(plan: WatchPlan, store: str, deployment: str, started: str | None) -> None:
    create_table_artifact(
        key="runtime-watch-pairs",
        table=[
            markdown_cells(
                {
                    "model": p.model,
                    "target": p.target,
                    "ep": p.ep,
                    "status": p.status,
                    "why": p.reason,
                }
            )
            for p in plan.pairs
        ],
        description=f"Published pairs vs the compile workers' runtime, {store}",
    )
    lines = [
        f"**{len(plan.to_compile)} pairs to compile**"
        + (f" · started `{deployment}` run `{started}`" if started else "")
        + f" · {plan.reports_read} device reports read"
    ]
    lines += [  # labels, model names and reasons come from device reports: escaped
        f"- unserved: {u.device_count} devices ({markdown_text(u.label)}): "
        + "; ".join(f"{markdown_text(m)} {markdown_text(why)}" for m, why in u.models.items())
        for u in plan.unserved
    ]
    create_markdown_artifact(key="runtime-watch-summary", markdown="\n".join(lines))


if __name__ == "__main__":
    # The epfleet command's own entry point (``python -m epfleet``), not an import of it:
    # the CLI imports the flows, so a flow importing the CLI would close a circle.
    sys.argv[1:1] = ["watch"]
    runpy.run_module("epfleet", run_name="__main__", alter_sys=True)
