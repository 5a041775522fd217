"""The ``rollout-gate`` flow: judge every staged rollout on the field evidence in the device
reports, advance the ones whose stage held and halt the ones that fail their gates
(``epfleet.fleet.rollout.rules``), without a person. Each move is a signed publish and an
event (``epfleet.rollout.advanced``, ``...halted``, ``...completed``); the run leaves a
table artifact of every rollout (stage, devices on the new and the previous variants,
failures, p50 new against previous, the gate's decision and why), and one of the fleet's
evidence per model × target (``fleet-field``: devices running it, failing it, latency),
one of each rollout's evidence by the runtime its devices run (``rollout-runtimes``), and
one of what each hardware profile takes (``field-rankings``): the same pass signs the field
rankings devices order their variants by (``epfleet.fleet.evidence.rankings``).

A rollout whose policy asks for approval (``approval: true``) waits, at each stage past
the first, for a person to approve it in the Prefect UI (the run pauses for input).

    python flows/rollout_gate.py --store s3://bucket/fleet   # is epfleet rollout status
"""

# No `from __future__ import annotations`: see flows/device_sync.py.
import runpy
import sys

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact
from prefect.events import emit_event
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput

from epfleet.fleet.rollout.rollouts import RolloutStatus, run_gate
from epfleet.fleet.views import FIELD_HEADERS, field_table_rows, rollout_row, short_side_text
from epfleet.stores import DEFAULT_STORE, open_store
from epfleet.text import markdown_cells


class Approval(RunInput):
    approve: bool = False
    reason: str = "approved in the Prefect UI"


@flow(
    name="rollout-gate",
    description="Advance staged rollouts whose stage held on the devices' evidence, halt "
    "those that fail their gates, and say why.",
)
def rollout_gate(store: str = DEFAULT_STORE) -> list[dict[str, object]]:
    """Judge and move every rollout in the store; returns what was moved.

    Args:
        store: Store URI: a directory, file:///abs/dir or s3://bucket/prefix.
    """
    logger = get_run_logger()
    reading, moved = run_gate(open_store(store), approve=_approval)
    for status in reading.statuses:
        if not any(m.rollout_id == status.rollout.id for m in moved):
            logger.info(
                "%s: rollout %s waits: %s", status.model, status.rollout.id, status.verdict.reason
            )
    for move in moved:
        logger.info("%s: rollout %s %s: %s", move.model, move.rollout_id, move.state, move.reason)
        event = {"advance": "advanced", "halt": "halted", "revert": "reverted"}[move.move]
        event = "completed" if move.state == "complete" else event
        emit_event(
            event=f"epfleet.rollout.{event}",
            resource={
                "prefect.resource.id": f"epfleet.rollout.{move.model}.{move.rollout_id}",
                "prefect.resource.name": f"{move.model} rollout {move.rollout_id}",
                "epfleet.model": move.model,
                "epfleet.store": store,
            },
            payload=move.model_dump(mode="json"),
        )
    create_table_artifact(
        key="rollout-gate",
        table=[markdown_cells(rollout_row(s)) for s in reading.statuses],
        description=f"Staged rollouts in {store}: the field evidence, side by side, and the "
        f"gate's decision ({reading.read} device reports read, {reading.unreadable} "
        f"unreadable, {reading.unattributed} under another device's key)",
    )
    create_table_artifact(
        key="fleet-field",
        table=[
            markdown_cells(dict(zip(FIELD_HEADERS, cells, strict=True)))
            for cells in field_table_rows(reading.field)
        ],
        description=f"What {reading.read} device reports say of each model and target in {store}",
    )
    create_table_artifact(
        key="rollout-runtimes",
        table=[
            markdown_cells(
                {
                    "model": status.model,
                    "rollout": status.rollout.id,
                    "runtime": runtime,
                    "new": short_side_text(sides.new),
                    "previous": short_side_text(sides.previous),
                }
            )
            for status in reading.statuses
            for runtime, sides in sorted(status.evidence.runtimes.items())
        ],
        description="Each rollout's counted device reports by the runtime their devices run "
        "(ORT and EP package versions), side by side",
    )
    published = reading.rankings_published
    if published is not None:
        signed = f"signed (bins {', '.join(published.bins)})" if published.signed else "unchanged"
        logger.info(
            "field rankings: %d models ranked, %s", published.models, published.skipped or signed
        )
    create_table_artifact(
        key="field-rankings",
        table=[
            markdown_cells(
                {
                    "model": c.model,
                    "profile": f"{c.profile}: {c.hardware}",
                    "runtime": c.runtime,
                    "takes": "; ".join(c.why),
                }
            )
            for c in reading.ranking_choices
        ],
        description="What devices of each hardware profile and runtime take, by the latency "
        "they reported (the field rankings signed beside the manifest), and why",
    )
    if reading.index is not None:
        for problem in reading.index.rebuilt:
            logger.warning("evidence index shard rebuilt from the reports: %s", problem)
        logger.info(
            "evidence index: %d reports listed, %d read (new or changed since the last pass)",
            reading.index.listed,
            reading.index.reports_read,
        )
    return [m.model_dump(mode="json") for m in moved]


def _approval(status: RolloutStatus) -> tuple[str, str]:
    """Pause for a person's approval of the next stage (the policy asks for it)."""
    answer = pause_flow_run(
        wait_for_input=Approval.with_initial_data(
            description=f"Advance {status.model}'s rollout {status.rollout.id} past stage "
            f"{status.rollout.stage + 1}? The gate says: {status.verdict.reason}"
        ),
        timeout=3600,
    )
    if answer.approve:
        return "advance", answer.reason
    return "wait", f"not approved: {answer.reason}"


if __name__ == "__main__":
    # The epfleet command's own entry point (``python -m epfleet``), not an import of it.
    sys.argv[1:1] = ["rollout", "status"]
    runpy.run_module("epfleet", run_name="__main__", alter_sys=True)
