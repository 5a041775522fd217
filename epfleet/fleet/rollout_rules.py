"""What a staged rollout does (pure: every fact is passed in): how a publish starts one, how it
moves (advance, halt, revert), and the gate's judgement of a stage from field evidence.

The rules (the state itself is ``epfleet.formats.rollout``'s):

- ``start``: a publish that replaces (or adds) published variants of a model whose spec
  gives a rollout policy starts a rollout at its first stage, keeping what each variant
  replaced in ``previous``. A model with no published variant before is not staged.
  When a rollout is under way (or was reverted), ``previous`` keeps what the fleet ran
  before it: a newer publish never makes an unproven build the way back.
- ``advance`` moves to the next stage; past the last, the rollout is ``complete`` and
  ``previous`` is dropped (``epfleet gc`` may then collect it). ``halt`` freezes the
  stage; ``revert`` sends every device back to ``previous``; both say why.
- ``judge`` (the gate): a stage is judged once at least ``min_reports`` devices report
  running the new variants. It halts when the share of them whose sync of the model
  failed passes ``max_failure_rate``, or when their median inference time is more than
  ``max_latency_regression`` above the median of devices still on the previous
  variants; it advances when the stage has lasted ``min_hours`` and nothing failed it;
  otherwise it waits.
"""

from __future__ import annotations

import secrets
import statistics
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field

from epfleet.formats.device_report import DeviceReport
from epfleet.formats.manifest import ModelEntry, VariantEntry
from epfleet.formats.rollout import Rollout, RolloutPolicy


def start(
    entry: ModelEntry,
    replaced: dict[str, VariantEntry | None],
    policy: RolloutPolicy,
    now: datetime,
) -> None:
    """Stage ``entry``'s new variants (``replaced``: target -> what its new variant
    replaced), in place; nothing when the model had nothing published before."""
    old = entry.rollout
    carried = old is not None and old.state != "complete"
    if not carried and all(before is None for before in replaced.values()):
        return  # a first publish: nothing to go back to
    previous = dict(entry.previous) if carried else {}
    for target, before in replaced.items():
        previous.setdefault(target, before)
    entry.previous = previous
    entry.rollout = Rollout(
        id=secrets.token_hex(8),
        salt=secrets.token_hex(16),
        stage=0,
        policy=policy,
        started_at=now,
        stage_started_at=now,
    )


def advance(entry: ModelEntry, now: datetime) -> ModelEntry:
    rollout = _under_way(entry)
    if rollout.last_stage:
        done = rollout.model_copy(update={"state": "complete", "stage_started_at": now})
        return entry.model_copy(update={"rollout": done, "previous": {}})
    moved = rollout.model_copy(
        update={"stage": rollout.stage + 1, "state": "active", "stage_started_at": now}
    )
    return entry.model_copy(update={"rollout": moved})


def halt(entry: ModelEntry, reason: str) -> ModelEntry:
    rollout = _under_way(entry)
    return entry.model_copy(
        update={"rollout": rollout.model_copy(update={"state": "halted", "reason": reason})}
    )


def revert(entry: ModelEntry, reason: str) -> ModelEntry:
    rollout = _under_way(entry)
    return entry.model_copy(
        update={"rollout": rollout.model_copy(update={"state": "reverted", "reason": reason})}
    )


class NoRollout(ValueError):
    """The model has no rollout under way (none, or it is complete or reverted)."""


def _under_way(entry: ModelEntry) -> Rollout:
    rollout = entry.rollout
    if rollout is None or rollout.state in ("complete", "reverted"):
        state = "no rollout" if rollout is None else f"its rollout is {rollout.state}"
        raise NoRollout(state)
    return rollout


# --- the gate ----------------------------------------------------------------------------------


class Evidence(BaseModel):
    """What the device reports say about one rollout of one model."""

    on_new: int = Field(description="Devices whose report says they run the new variants")
    failed_on_new: int = Field(
        description="Of the devices the rollout reached, those whose sync of the model failed"
    )
    on_previous: int
    new_p50_ms: list[float] = Field(default_factory=list, description="Each device's p50")
    previous_p50_ms: list[float] = Field(default_factory=list)

    @property
    def failure_rate(self) -> float:
        reached = self.on_new + self.failed_on_new
        return self.failed_on_new / reached if reached else 0.0

    @property
    def latency_regression(self) -> float | None:
        if not self.new_p50_ms or not self.previous_p50_ms:
            return None
        before = statistics.median(self.previous_p50_ms)
        return statistics.median(self.new_p50_ms) / before - 1 if before > 0 else None


Decision = Literal["advance", "halt", "wait"]


class Verdict(BaseModel):
    decision: Decision
    reason: str


def judge(rollout: Rollout, evidence: Evidence, now: datetime) -> Verdict:
    """The gate's decision on the rollout's current stage (see the module's rules)."""
    policy = rollout.policy
    if rollout.state != "active":
        return Verdict(decision="wait", reason=f"the rollout is {rollout.state}")
    reached = evidence.on_new + evidence.failed_on_new
    if reached < policy.min_reports:
        return Verdict(
            decision="wait",
            reason=f"{reached} of the {policy.min_reports} device reports needed",
        )
    if evidence.failure_rate > policy.max_failure_rate:
        return Verdict(
            decision="halt",
            reason=f"{evidence.failed_on_new} of {reached} devices failed the new variants "
            f"({evidence.failure_rate:.0%}, more than max_failure_rate "
            f"{policy.max_failure_rate:.0%})",
        )
    regression = evidence.latency_regression
    if regression is not None and regression > policy.max_latency_regression:
        return Verdict(
            decision="halt",
            reason=f"the new variants' median inference time is {regression:.0%} above the "
            f"previous ones' (max_latency_regression {policy.max_latency_regression:.0%})",
        )
    lasted = now - rollout.stage_started_at
    if lasted < timedelta(hours=policy.min_hours):
        return Verdict(
            decision="wait",
            reason=f"stage {rollout.stage + 1} has lasted {lasted.total_seconds() / 3600:.1f} "
            f"of its {policy.min_hours:g} hours",
        )
    return Verdict(
        decision="advance",
        reason=f"{reached} devices on the new variants, {evidence.failure_rate:.0%} failed"
        + (f", latency {regression:+.0%}" if regression is not None else ""),
    )


def gather(rollout: Rollout, model: str, reports: Iterable[DeviceReport]) -> Evidence:
    """What the device reports say of ``rollout`` of ``model``: reports of other rollouts
    (or of none) do not count."""
    evidence = Evidence(on_new=0, failed_on_new=0, on_previous=0)
    for report in reports:
        count(evidence, rollout, model, report)
    return evidence


def count(evidence: Evidence, rollout: Rollout, model: str, report: DeviceReport) -> None:
    """Add what one device report says of ``rollout`` of ``model`` to ``evidence`` (so a
    stream of reports is read once for every rollout under way)."""
    found = next((m for m in report.models if m.model == model), None)
    if found is None or found.rollout is None or found.rollout.id != rollout.id:
        return
    p50 = found.profile.p50_ms if found.profile is not None else None
    if found.rollout.member and found.served:
        evidence.on_new += 1
        if p50 is not None:
            evidence.new_p50_ms.append(p50)
    elif found.rollout.member:
        evidence.failed_on_new += 1
    elif found.served:
        evidence.on_previous += 1
        if p50 is not None:
            evidence.previous_p50_ms.append(p50)
