"""``epfleet rollout status|advance|halt|resume|revert|reindex``: staged rollouts from the
command line, and the evidence index their gate reads.

Each move is a signed publish (it needs the store's signer, as a compile does); a move that
changes nothing (halting a halted rollout) publishes nothing and says so. Exit codes as
every epfleet command: 0 done (or nothing to change), 1 the store failed, 2 bad input (no
such model, no rollout under way, or an advance of a halted rollout: resume it first).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from cyclopts import App, Parameter

from epfleet.cli.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from epfleet.cli.options import (
    Json,
    Repeatable,
    Store,
    TrustRoot,
    command_help,
    did_you_mean,
    pin_trust_root,
)
from epfleet.logs import say
from epfleet.stores import DEFAULT_STORE
from epfleet.text import output_width, show, table

rollout_app = App(
    name="rollout",
    help="Staged rollouts of new variants: their stage and field evidence, and moving them.",
    help_epilogue="",
)

Model = Annotated[str, Parameter(help="The model whose rollout to move.")]
Reason = Annotated[str, Parameter(help="Why (recorded in the signed rollout state).")]


@rollout_app.default
def _no_rollout_command(*unknown: Annotated[str, Parameter(show=False)]) -> int:
    what = "rollout needs a command"
    commands = ("status", "advance", "halt", "resume", "revert", "reindex")
    if unknown:
        what = f"unknown command 'rollout {unknown[0]}'{did_you_mean(unknown[0], commands)}"
    say(f"epfleet: error: {what} (one of: {', '.join(commands)})")
    return EXIT_BAD_INPUT


@rollout_app.command
def status(
    *,
    store: Store = DEFAULT_STORE,
    model: Repeatable = None,
    trust_root: TrustRoot = None,
    as_json: Json = False,
) -> int:
    """Show every rollout: its stage and state, the devices on the new and the previous
    variants side by side (failures, p50 latency, EP placement) from the device reports
    it can attribute, how many it could not, and what the gate would do.

    For example:
      epfleet rollout status --store s3://bucket/fleet
      epfleet rollout status --store ./epfleet-store --model ocr-det --json
    """
    from epfleet.fleet.rollout.rollouts import read_evidence
    from epfleet.fleet.views import ROLLOUT_HEADERS, rollout_row, rollout_runtime_lines
    from epfleet.stores import open_store
    from epfleet.text import plural, wrap

    pin_trust_root(store, trust_root)
    reading = read_evidence(open_store(store), model)
    found = reading.statuses
    if as_json:
        print(json.dumps([s.model_dump(mode="json") for s in found], indent=2))
        return EXIT_OK
    if not found:
        print(wrap(f"no rollout in {store}", width=output_width()))
        return EXIT_OK
    rows = [list(rollout_row(s).values()) for s in found]
    width = output_width()
    print(table(ROLLOUT_HEADERS, rows, width, wrapped=("new", "previous", "gate")))
    for shown in found:
        if shown.evidence.runtimes:
            print()
            print(wrap("\n".join(rollout_runtime_lines(shown)), width, indent="      "))
    counted = (
        f"from {plural(reading.read, 'device report')} ({reading.unreadable} unreadable, "
        f"{reading.unattributed} under another device's key); new and previous count only "
        "reports whose key names their device, made on the current stage since it started, "
        "on the side the signed salt gives that device"
    )
    print("\n" + wrap(counted, width))
    return EXIT_OK


def _move(store: str, model: str, how: str, reason: str, trust_root: Path | None) -> int:
    from epfleet.fleet.rollout.rollouts import move
    from epfleet.stores import open_store

    pin_trust_root(store, trust_root)
    moved = move(open_store(store), model, how, reason)  # type: ignore[arg-type]
    outcome = "published" if moved.published else "unchanged"
    if moved.unchanged is not None:
        outcome = f"unchanged: {moved.unchanged}, nothing published"
    show(
        f"{moved.model}: rollout {moved.rollout_id} {moved.state}, stage {moved.stage + 1} "
        f"({outcome})"
    )
    return EXIT_OK


@rollout_app.command
def advance(
    *,
    store: Store = DEFAULT_STORE,
    model: Model,
    reason: Reason = "by hand",
    trust_root: TrustRoot = None,
) -> int:
    """Move the model's rollout to its next stage (past the last: complete). A halted
    rollout is not advanced: resume it first.

    For example:
      epfleet rollout advance --store s3://bucket/fleet --model ocr-det
    """
    return _move(store, model, "advance", reason, trust_root)


@rollout_app.command
def halt(
    *,
    store: Store = DEFAULT_STORE,
    model: Model,
    reason: Reason = "by hand",
    trust_root: TrustRoot = None,
) -> int:
    """Freeze the model's rollout at its stage: no more devices take the new variants.

    For example:
      epfleet rollout halt --store s3://bucket/fleet --model ocr-det \\
        --reason "crash reports"
    """
    return _move(store, model, "halt", reason, trust_root)


@rollout_app.command
def resume(*, store: Store = DEFAULT_STORE, model: Model, trust_root: TrustRoot = None) -> int:
    """Make a halted rollout active again at its stage: the gate judges it again, and
    devices of the stage take the new variants.

    For example:
      epfleet rollout resume --store s3://bucket/fleet --model ocr-det
    """
    return _move(store, model, "resume", "by hand", trust_root)


@rollout_app.command
def revert(
    *,
    store: Store = DEFAULT_STORE,
    model: Model,
    reason: Reason = "by hand",
    trust_root: TrustRoot = None,
) -> int:
    """Send every device back to the variants the rollout replaced, at its next sync.

    For example:
      epfleet rollout revert --store s3://bucket/fleet --model ocr-det \\
        --reason "accuracy"
    """
    return _move(store, model, "revert", reason, trust_root)


@rollout_app.command
def reindex(
    *,
    store: Store = DEFAULT_STORE,
    check: Annotated[
        bool,
        Parameter(
            help="Bring the index up to date as a gate run does and compare what it "
            "answers (from its per-shard aggregates) with a full recount of every report: "
            "counts equal, latencies within the sketch's 1 %; rebuilding nothing; exit 1 "
            "when they differ."
        ),
    ] = False,
    trust_root: TrustRoot = None,
) -> int:
    """Rebuild the evidence index that the gate, the field view and runtime-watch keep of
    the device reports (reports/evidence-index/) from every report; or, with --check, say
    whether it answers as a full recount does. A pass rebuilds a shard that does not
    verify by itself (and warns): rebuild by hand after changing EPFLEET_EVIDENCE_KEY, or
    when a check finds a difference.

    For example:
      epfleet rollout reindex --store s3://bucket/fleet --check
      epfleet rollout reindex --store ./epfleet-store
    """
    from epfleet.fleet.rollout.rollouts import check_index, rebuild_index
    from epfleet.stores import open_store
    from epfleet.text import plural

    pin_trust_root(store, trust_root)
    opened = open_store(store)
    if not check:
        counts = rebuild_index(opened)
        show(
            f"evidence index rebuilt: {counts.reports_read} of {counts.listed} reports read, "
            f"{counts.shards_written} shards written"
        )
        for problem in counts.not_written:
            show(f"not written: {problem}")
        return EXIT_FAILED if counts.not_written else EXIT_OK
    reading, differences = check_index(opened)
    assert reading.index is not None
    for problem in reading.index.rebuilt:
        show(f"shard rebuilt from the reports (it did not verify): {problem}")
    if differences:
        show("the evidence index and a full recount of the reports differ:")
        show("\n".join(f"  {d}" for d in differences))
        show(f"rebuild it: epfleet rollout reindex --store {store}")
        return EXIT_FAILED
    show(
        "the evidence index answers as a full recount does: "
        f"{plural(reading.index.listed, 'report')}, {plural(len(reading.statuses), 'rollout')}, "
        f"{plural(len(reading.field), 'field row')} "
        f"({reading.index.reports_read} reports read to bring it up to date, "
        f"{reading.index.contributions_computed} records' aggregate parts computed)"
    )
    return EXIT_OK


command_help(status, advance, halt, resume, revert, reindex)
