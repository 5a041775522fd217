"""Staged rollouts in a store: each one's status with its field evidence (from the device
reports), the gate that advances or halts them, and an operator's advance, halt and revert.

Every move is a publish (``epfleet.fleet.publishing.update_manifest``): the rollout state
is in the model's signed entry, so only a holder of the online key moves a rollout, and
a move is compare-and-swap against the rollout it judged (a rollout replaced meanwhile by a
newer publish is left alone). The rules are ``epfleet.fleet.rollout_rules``'.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from epfleet.errors import BadInputError
from epfleet.fleet.publishing import read_in_force, update_manifest
from epfleet.fleet.rollout_rules import (
    Evidence,
    NoRollout,
    Verdict,
    advance,
    count,
    halt,
    judge,
    revert,
)
from epfleet.fleet.watch_inputs import stream_device_reports
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.manifest import Manifest, ModelEntry, utcnow
from epfleet.formats.rollout import Rollout
from epfleet.stores import Store

Move = Literal["advance", "halt", "revert"]


class RolloutStatus(BaseModel):
    model: str
    rollout: Rollout
    evidence: Evidence
    verdict: Verdict
    """What the gate would do now."""


class Moved(BaseModel):
    model: str
    rollout_id: str
    move: Move
    reason: str
    stage: int
    state: str
    published: bool
    """False when the rollout had changed meanwhile (nothing was moved)."""


def statuses(store: Store, models: list[str] | None = None) -> list[RolloutStatus]:
    """Every rollout in the manifest in force (or of ``models``), with its evidence and
    the gate's verdict now. Reports that cannot be read are left out."""
    manifest = read_in_force(store).manifest
    entries = manifest.models if manifest is not None else {}
    unknown = sorted(set(models or ()) - set(entries))
    if unknown:
        raise BadInputError(f"no model {', '.join(unknown)} in {store.uri}")
    staged = {n: e for n, e in entries.items() if e.rollout and (not models or n in models)}
    if not staged:
        return []
    evidence = {name: Evidence(on_new=0, failed_on_new=0, on_previous=0) for name in staged}
    for report in stream_device_reports(store):  # streamed: a large fleet's are never all held
        if isinstance(report, DeviceReport):
            for name, entry in staged.items():
                assert entry.rollout is not None
                count(evidence[name], entry.rollout, name, report)
    now = utcnow()
    found = []
    for name, entry in sorted(staged.items()):
        assert entry.rollout is not None
        found.append(
            RolloutStatus(
                model=name,
                rollout=entry.rollout,
                evidence=evidence[name],
                verdict=judge(entry.rollout, evidence[name], now),
            )
        )
    return found


def move(store: Store, model: str, how: Move, reason: str, rollout_id: str | None = None) -> Moved:
    """Advance, halt or revert the model's rollout (the one ``rollout_id`` names, when
    given) in one publish. BadInputError when the model has no rollout under way."""
    steps: dict[Move, Callable[[ModelEntry, datetime, str], ModelEntry]] = {
        "advance": lambda entry, now, _: advance(entry, now),
        "halt": lambda entry, _, why: halt(entry, why),
        "revert": lambda entry, _, why: revert(entry, why),
    }
    done: list[ModelEntry] = []

    def change(current: Manifest | None) -> Manifest | None:
        done.clear()
        entry = current.models.get(model) if current is not None else None
        if current is None or entry is None:
            raise BadInputError(f"no model {model!r} in {store.uri}")
        if rollout_id is not None and (entry.rollout is None or entry.rollout.id != rollout_id):
            return None  # a newer publish replaced the rollout judged: leave it
        try:
            moved = steps[how](entry, utcnow(), reason)
        except NoRollout as exc:
            raise BadInputError(
                f"model {model!r} in {store.uri}: {exc}; nothing to {how}"
            ) from None
        done.append(moved)
        models = current.models | {model: moved}
        return Manifest(generation=current.generation + 1, published_at=utcnow(), models=models)

    published = update_manifest(store, change)
    after = done[-1].rollout if done else None
    return Moved(
        model=model,
        rollout_id=rollout_id or (after.id if after else ""),
        move=how,
        reason=reason,
        stage=after.stage if after else -1,
        state=after.state if after else "unchanged",
        published=published.published,
    )


def run_gate(store: Store) -> tuple[list[RolloutStatus], list[Moved]]:
    """Judge every active rollout on its evidence and advance or halt those the gate
    decides (``rollout_rules.judge``); the statuses judged and the moves made."""
    judged = statuses(store)
    moves = [
        move(store, s.model, s.verdict.decision, s.verdict.reason, s.rollout.id)
        for s in judged
        if s.verdict.decision in ("advance", "halt")
    ]
    return judged, moves
