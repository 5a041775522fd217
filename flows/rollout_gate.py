"""The ``rollout-gate`` flow: judge every staged rollout on the field evidence in the device
reports, advance the ones whose stage held and halt the ones that fail their gates
(``epfleet.fleet.rollout_rules``), without a person. Each move is a signed publish and an
event (``epfleet.rollout.advanced``, ``...halted``, ``...completed``); the run leaves a
table artifact of every rollout (stage, devices on the new and the previous variants,
failures, p50 new against previous, the gate's decision and why), and one of the fleet's
evidence per model × target (``fleet-field``: devices running it, failing it, latency).

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

from epfleet.fleet.publishing import read_in_force
from epfleet.fleet.rollouts import Move, RolloutStatus, move, statuses
from epfleet.fleet.views import FIELD_HEADERS, field_table_rows
from epfleet.fleet.watch_inputs import field_evidence
from epfleet.stores import DEFAULT_STORE, Store, open_store


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
    opened = open_store(store)
    judged = statuses(opened)
    moves = []
    for status in judged:
        decision: str = status.verdict.decision
        reason = status.verdict.reason
        if decision == "advance" and status.rollout.policy.approval and status.rollout.stage:
            decision, reason = _approval(status)
        if decision not in ("advance", "halt"):
            logger.info("%s: rollout %s waits: %s", status.model, status.rollout.id, reason)
            continue
        how: Move = "advance" if decision == "advance" else "halt"
        moved = move(opened, status.model, how, reason, status.rollout.id)
        logger.info("%s: rollout %s %s: %s", status.model, moved.rollout_id, moved.state, reason)
        event = {"advance": "advanced", "halt": "halted"}[decision]
        event = "completed" if moved.state == "complete" else event
        emit_event(
            event=f"epfleet.rollout.{event}",
            resource={
                "prefect.resource.id": f"epfleet.rollout.{status.model}.{moved.rollout_id}",
                "prefect.resource.name": f"{status.model} rollout {moved.rollout_id}",
                "epfleet.model": status.model,
                "epfleet.store": store,
            },
            payload=moved.model_dump(mode="json"),
        )
        moves.append(moved.model_dump(mode="json"))
    create_table_artifact(
        key="rollout-gate",
        table=[_row(s) for s in judged],
        description=f"Staged rollouts in {store}: the field evidence and the gate's decision",
    )
    _field_artifact(opened, store)
    return moves


def _field_artifact(opened: Store, store: str) -> None:
    """The fleet's evidence per model × target (``epfleet manifest show --field``)."""
    manifest = read_in_force(opened).manifest
    if manifest is None:
        return
    rows, read, _ = field_evidence(opened, manifest)
    create_table_artifact(
        key="fleet-field",
        table=[dict(zip(FIELD_HEADERS, cells, strict=True)) for cells in field_table_rows(rows)],
        description=f"What {read} device reports say of each model and target in {store}",
    )


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


def _row(status: RolloutStatus) -> dict[str, str]:
    ev, ro = status.evidence, status.rollout
    regression = ev.latency_regression
    return {
        "model": status.model,
        "rollout": ro.id,
        "stage": f"{ro.stage + 1}/{len(ro.policy.stages)} ({ro.percent:g} %)",
        "state": ro.state,
        "devices on new": str(ev.on_new),
        "devices on previous": str(ev.on_previous),
        "failed": f"{ev.failed_on_new} ({ev.failure_rate:.0%})",
        "p50 new vs previous": "-" if regression is None else f"{regression:+.0%}",
        "gate": f"{status.verdict.decision}: {status.verdict.reason}",
    }


if __name__ == "__main__":
    # The epfleet command's own entry point (``python -m epfleet``), not an import of it.
    sys.argv[1:1] = ["rollout", "status"]
    runpy.run_module("epfleet", run_name="__main__", alter_sys=True)
