"""``epfleet rollout status|advance|halt|resume|revert``: staged rollouts from the command
line.

Each move is a signed publish (it needs the store's signer, as a compile does); a move that
changes nothing (halting a halted rollout) publishes nothing and says so. Exit codes as
every epfleet command: 0 done (or nothing to change), 1 the store failed, 2 bad input (no
such model, no rollout under way, or an advance of a halted rollout: resume it first).
"""

from __future__ import annotations

import json
import sys
from typing import Annotated

from cyclopts import App, Parameter

from epfleet.cli.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from epfleet.cli.options import Json, Repeatable, Store, command_help
from epfleet.stores import DEFAULT_STORE

rollout_app = App(
    name="rollout",
    help="Staged rollouts of new variants: their stage and field evidence, and moving them.",
    help_epilogue="",
)

Model = Annotated[str, Parameter(help="The model whose rollout to move.")]
Reason = Annotated[str, Parameter(help="Why (recorded in the signed rollout state).")]


@rollout_app.default
def _no_rollout_command(*unknown: Annotated[str, Parameter(show=False)]) -> int:
    what = f"unknown command 'rollout {unknown[0]}'" if unknown else "rollout needs a command"
    print(f"epfleet: error: {what}: status, advance, halt, resume or revert", file=sys.stderr)
    return EXIT_BAD_INPUT


@rollout_app.command
def status(*, store: Store = DEFAULT_STORE, model: Repeatable = None, as_json: Json = False) -> int:
    """Show every rollout: its stage and state, the devices on the new and the previous
    variants side by side (failures, p50 latency, EP placement) from the device reports
    it can attribute, how many it could not, and what the gate would do.

    For example:
      epfleet rollout status --store s3://bucket/fleet
      epfleet rollout status --store ./epfleet-store --model ocr-det --json
    """
    from epfleet.fleet.rollouts import read_evidence
    from epfleet.fleet.views import ROLLOUT_HEADERS, rollout_row
    from epfleet.stores import open_store
    from epfleet.text import table

    reading = read_evidence(open_store(store), model)
    found = reading.statuses
    if as_json:
        print(json.dumps([s.model_dump(mode="json") for s in found], indent=2))
        return EXIT_OK
    if not found:
        print(f"no rollout in {store}")
        return EXIT_OK
    rows = [list(rollout_row(s).values()) for s in found]
    print(table(ROLLOUT_HEADERS, rows))
    print(
        f"\nfrom {reading.read} device reports ({reading.unreadable} unreadable, "
        f"{reading.unattributed} under another device's key); new and previous count only "
        "reports whose key names their device, made on the current stage since it started, "
        "on the side the signed salt gives that device"
    )
    return EXIT_OK


def _move(store: str, model: str, how: str, reason: str) -> int:
    from epfleet.fleet.rollouts import move
    from epfleet.stores import open_store

    moved = move(open_store(store), model, how, reason)  # type: ignore[arg-type]
    outcome = "published" if moved.published else "unchanged"
    if moved.unchanged is not None:
        outcome = f"unchanged: {moved.unchanged}, nothing published"
    print(
        f"{moved.model}: rollout {moved.rollout_id} {moved.state}, stage {moved.stage + 1} "
        f"({outcome})"
    )
    return EXIT_OK


@rollout_app.command
def advance(*, store: Store = DEFAULT_STORE, model: Model, reason: Reason = "by hand") -> int:
    """Move the model's rollout to its next stage (past the last: complete). A halted
    rollout is not advanced: resume it first.

    For example:
      epfleet rollout advance --store s3://bucket/fleet --model ocr-det
    """
    return _move(store, model, "advance", reason)


@rollout_app.command
def halt(*, store: Store = DEFAULT_STORE, model: Model, reason: Reason = "by hand") -> int:
    """Freeze the model's rollout at its stage: no more devices take the new variants.

    For example:
      epfleet rollout halt --store s3://bucket/fleet --model ocr-det --reason "crash reports"
    """
    return _move(store, model, "halt", reason)


@rollout_app.command
def resume(*, store: Store = DEFAULT_STORE, model: Model) -> int:
    """Make a halted rollout active again at its stage: the gate judges it again, and
    devices of the stage take the new variants.

    For example:
      epfleet rollout resume --store s3://bucket/fleet --model ocr-det
    """
    return _move(store, model, "resume", "by hand")


@rollout_app.command
def revert(*, store: Store = DEFAULT_STORE, model: Model, reason: Reason = "by hand") -> int:
    """Send every device back to the variants the rollout replaced, at its next sync.

    For example:
      epfleet rollout revert --store s3://bucket/fleet --model ocr-det --reason "accuracy"
    """
    return _move(store, model, "revert", reason)


command_help(status, advance, halt, resume, revert)
