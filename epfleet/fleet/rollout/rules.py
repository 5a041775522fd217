"""What a staged rollout does (pure: every fact is passed in): how a publish starts one, how it
moves (advance, halt, resume, revert), and the gate's judgement of a stage from field evidence.

The rules (the state itself is ``epfleet.formats.rollout``'s):

- ``start``: a publish that replaces (or adds) published variants of a model whose spec
  gives a rollout policy starts a rollout at its first stage, keeping what each variant
  replaced in ``previous``. A model with no published variant before is not staged.
- ``start_version``: a publish of a new source (a new model version) of such a model
  stages the new version as a whole: ``previous_version`` keeps the version it replaces
  (source, golden samples, calibration, target order) and ``previous`` that version's ok
  variants, so that a device outside the rollout runs and health-checks the previous
  version, and ``revert`` brings every device back to it.
  When a rollout is under way (or was reverted), ``previous`` keeps what the fleet ran
  before it: a newer publish never makes an unproven build (or version) the way back.
- ``advance`` moves to the next stage; past the last, the rollout is ``complete`` and
  ``previous`` is dropped (``epfleet gc`` may then collect it). ``halt`` freezes the
  stage; ``revert`` sends every device back to ``previous``; both say why. ``resume``
  makes a halted rollout active again at its stage. A halted rollout is not advanced:
  it is resumed first (a halt is a decision an advance must not undo on the way). A move
  that changes nothing (``halt`` of a halted rollout, ``resume`` of an active one) gives
  back the entry it was given: nothing to publish.
- ``follow_policy``: a rollout under way (active or halted) follows its model's rollout
  policy as the spec gives it now: a compile applies a changed policy (thresholds,
  canaries, stages) to it at its current stage, and says so; a policy with fewer stages
  than the rollout has reached is refused (advance or revert the rollout first). A spec
  that no longer gives the model a policy leaves the rollout on its own, and the compile
  says so (``policy_dropped``).
- What the gate hears (``epfleet.fleet.evidence.rules.attribute``): a report object is
  the report of the device its key names, or it is unreadable (it does not decode, or a
  number in it is not finite or out of range) or not attributed (its key names another
  device). A device has one key, so one vote: the newest report it wrote.
- ``counts_for`` (what a heard report may count for): it counts for a rollout only when
  it names this rollout's id (else it is of another rollout: counted apart), it acted on
  the current stage and was made after that stage started (else *stale*: a device that
  has not reported on this stage yet), and the side it says it is on (the new variants
  or the previous ones) is the one the signed salt, stage and canary list give its
  device id (``epfleet.formats.rollout.is_member``, recomputed here, never taken from the
  report; else *membership*). Reports not counted are counted by reason.
- ``judge`` (the gate) reads only counted reports. It waits until ``min_reports``
  distinct member devices have reported on the stage. It halts when the share of them
  whose sync or health check of the model failed passes ``max_failure_rate``, or when
  their median p50 is more than ``max_latency_regression`` above that of the devices on
  the previous variants. It advances when the stage has lasted ``min_hours`` and nothing
  failed it; otherwise it waits, and every verdict says how many reports it could not
  read or attribute, by reason.
- The bound on what reports that cannot be attributed do: they never advance or halt a
  stage, and only those under the key of a device the salt puts *in* the stage
  (unreadable, naming another device, or claiming the wrong side: a member whose report
  the gate cannot use, "unheard") can hold one: the gate does not advance while unheard
  members are as many as the member devices it heard. Reports under keys of devices
  outside the stage, of other rollouts or older stages change no decision, however many.
  What is left to a writer of reports (reports in member devices' names, which the salt
  lets anyone compute) is docs/concepts/trust.md's, closed by authenticated reports.
- Authenticated reports: a rollout whose policy asks for ``authenticated_reports``
  counts a report only when it is signed (a DSSE envelope) with the key its device id is
  enrolled with in the signed manifest (``epfleet device enroll``); unsigned, unenrolled
  and badly signed reports are refused by reason and, in a member's name, leave it
  unheard.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from epfleet.fleet.evidence.rules import READING_REASONS, Unattributed, made_at
from epfleet.fleet.evidence.sketch_rules import median as sketch_median
from epfleet.formats.device_report import (
    DeviceReport,
    ModelReport,
    ShadowRun,
    key_device,
    signed_by,
    signed_envelope,
)
from epfleet.formats.field_ranking import runtime_label
from epfleet.formats.manifest import DeviceKey, ModelEntry, PreviousVersion, VariantEntry
from epfleet.formats.rollout import Rollout, RolloutPolicy, is_member


@dataclass(frozen=True)
class Begin:
    """What a new rollout takes from its caller: when it starts, and its random id and
    salt (the rules read no clock and draw no randomness)."""

    now: datetime
    id: str
    salt: str

    @classmethod
    def derived(cls, now: datetime, seed: str, model: str) -> Begin:
        """The rollout of ``model`` a publish starts, from the publish's random ``seed``:
        one seed gives each model its own id and salt."""
        digest = hashlib.sha256(f"{seed}\0{model}".encode()).hexdigest()
        return cls(now=now, id=digest[:16], salt=digest[16:48])


def start(
    entry: ModelEntry,
    replaced: dict[str, VariantEntry | None],
    policy: RolloutPolicy,
    begin: Begin,
) -> ModelEntry:
    """``entry`` with its new variants staged (``replaced``: target -> what its new variant
    replaced); ``entry`` itself when the model had nothing published before."""
    old = entry.rollout
    carried = old is not None and old.state != "complete"
    if not carried and all(before is None for before in replaced.values()):
        return entry  # a first publish: nothing to go back to
    previous = dict(entry.previous) if carried else {}
    if not (carried and entry.previous_version is not None):  # a version's way back is whole
        for target, before in replaced.items():
            previous.setdefault(target, before)
    return entry.model_copy(update={"previous": previous, "rollout": _new_rollout(policy, begin)})


def start_version(
    entry: ModelEntry, old: ModelEntry, policy: RolloutPolicy, begin: Begin
) -> ModelEntry:
    """``entry``, a new source of the model, staged over ``old``, the model's entry before
    it: ``previous_version`` and ``previous`` are the last proven version (``old``'s own
    previous version while its rollout is unfinished, else ``old`` as devices outside that
    rollout ran it); ``entry`` itself when that version has no ok variant."""
    unfinished = old.rollout is not None and old.rollout.state != "complete"
    variants: dict[str, VariantEntry | None]
    if unfinished and old.previous_version is not None:
        proven, variants = old.previous_version, dict(old.previous)
    else:
        # a rebuild's rollout unfinished: the builds it replaced are the proven ones
        ran = old.variants_before() if unfinished else old.variants
        variants = {t: v for t, v in ran.items() if v.status == "ok"}
        proven = PreviousVersion(
            source=old.source,
            samples=old.samples,
            calibration=old.calibration,
            preference=old.preference,
        )
    if not any(v is not None for v in variants.values()):
        return entry  # nothing proven to go back to
    return entry.model_copy(
        update={
            "previous": variants,
            "previous_version": proven,
            "rollout": _new_rollout(policy, begin),
        }
    )


def _new_rollout(policy: RolloutPolicy, begin: Begin) -> Rollout:
    return Rollout(
        id=begin.id,
        salt=begin.salt,
        stage=0,
        policy=policy,
        started_at=begin.now,
        stage_started_at=begin.now,
    )


def advance(entry: ModelEntry, now: datetime) -> ModelEntry:
    rollout = _under_way(entry)
    if rollout.state == "halted":
        raise CannotMove(
            f"its rollout is halted ({rollout.reason or 'no reason given'}) at stage "
            f"{rollout.stage + 1}: resume it first (epfleet rollout resume), then advance"
        )
    if rollout.last_stage:
        done = rollout.model_copy(update={"state": "complete", "stage_started_at": now})
        return entry.model_copy(update={"rollout": done, "previous": {}, "previous_version": None})
    moved = rollout.model_copy(
        update={"stage": rollout.stage + 1, "state": "active", "stage_started_at": now}
    )
    return entry.model_copy(update={"rollout": moved})


def halt(entry: ModelEntry, reason: str) -> ModelEntry:
    rollout = _under_way(entry)
    if rollout.state == "halted":
        return entry  # halted already: its first reason stays
    return entry.model_copy(
        update={"rollout": rollout.model_copy(update={"state": "halted", "reason": reason})}
    )


def policy_change(entry: ModelEntry, policy: RolloutPolicy) -> str | None:
    """What following ``policy`` would change in ``entry``'s rollout under way, as a
    sentence; None when it has none or already follows it. CannotMove when the rollout's
    stage is past ``policy``'s stages."""
    rollout = entry.rollout
    if rollout is None or rollout.state not in ("active", "halted"):
        return None
    before, after = rollout.policy.model_dump(), RolloutPolicy(**policy.model_dump()).model_dump()
    if before == after:
        return None
    if rollout.stage >= len(policy.stages):
        raise CannotMove(
            f"the spec's rollout policy has {_stages(policy)}, and "
            f"its rollout {rollout.id} under way is at stage {rollout.stage + 1} "
            f"{rollout.policy.stages}: advance or revert that rollout first, or keep its stages"
        )
    changed = ", ".join(f"{f} {before[f]} -> {after[f]}" for f in after if before[f] != after[f])
    return (
        f"its rollout {rollout.id} ({rollout.state}, stage {rollout.stage + 1}) follows the "
        f"spec's changed rollout policy: {changed}"
    )


def policy_dropped(entry: ModelEntry) -> str | None:
    """What happens to ``entry``'s rollout under way when the spec gives the model no
    rollout policy, as a sentence; None when it has none under way."""
    rollout = entry.rollout
    if rollout is None or rollout.state not in ("active", "halted"):
        return None
    return (
        f"its rollout {rollout.id} ({rollout.state}, stage {rollout.stage + 1}) keeps the "
        "policy it started with: the spec gives the model no rollout policy now (move it "
        "by hand: epfleet rollout advance, halt or revert)"
    )


def _stages(policy: RolloutPolicy) -> str:
    count = len(policy.stages)
    return f"{count} stage{'s' if count != 1 else ''} {policy.stages}"


def follow_policy(entry: ModelEntry, policy: RolloutPolicy) -> ModelEntry:
    """``entry`` with its rollout under way following ``policy`` (``policy_change``); the
    entry itself when there is nothing to change."""
    if policy_change(entry, policy) is None:
        return entry
    assert entry.rollout is not None
    followed = entry.rollout.model_copy(update={"policy": RolloutPolicy(**policy.model_dump())})
    return entry.model_copy(update={"rollout": followed})


def resume(entry: ModelEntry) -> ModelEntry:
    rollout = _under_way(entry)
    if rollout.state == "active":
        return entry
    return entry.model_copy(
        update={"rollout": rollout.model_copy(update={"state": "active", "reason": None})}
    )


def revert(entry: ModelEntry, reason: str) -> ModelEntry:
    rollout = _under_way(entry)
    return entry.model_copy(
        update={"rollout": rollout.model_copy(update={"state": "reverted", "reason": reason})}
    )


class CannotMove(ValueError):
    """The move asked for does not apply to the model's rollout as it is."""


class NoRollout(CannotMove):
    """The model has no rollout under way (none, or it is complete or reverted)."""


def _under_way(entry: ModelEntry) -> Rollout:
    rollout = entry.rollout
    if rollout is None or rollout.state in ("complete", "reverted"):
        state = "no rollout" if rollout is None else f"its rollout is {rollout.state}"
        raise NoRollout(state)
    return rollout


# --- the gate ----------------------------------------------------------------------------------

Side = Literal["new", "previous"]

NOT_ATTRIBUTED = {
    **READING_REASONS,
    "stale": "made before the stage started or on an earlier stage",
    "membership": "claims a side of the rollout the signed salt does not give its device",
    "time": "has no readable time with its UTC offset",
    "unsigned": "not signed (the rollout counts only signed reports)",
    "not enrolled": "signed, by a device that is not enrolled",
    "bad signature": "signed, but not with its device's enrolled key",
}
"""Why a report that names a rollout is not counted for it (``counts_for``; ``key`` and
``unreadable``: ``evidence_rules.attribute``)."""
UNHEARD = frozenset({"membership", "unsigned", "not enrolled", "bad signature"})
"""Refusals that leave a member device unheard when its key names a member: they hold a
stage, as a member's unreadable report does (see the bound)."""


class SideEvidence(BaseModel):
    """What the attributed reports of one side of a rollout say (the devices on the new
    variants, or on the previous ones): devices, failure rate, latency, EP placement."""

    devices: int = Field(default=0, description="Devices whose report counts on this side")
    failed: int = Field(default=0, description="Of them, those whose sync of the model failed")
    p50_ms: list[float] = Field(
        default_factory=list,
        exclude=True,
        description="Each serving device's p50 (finite: a report with another never parses)",
    )
    partly_on_other_eps: int = Field(
        default=0, description="Serving devices where part of the model ran on another EP"
    )
    shadow_runs: int = Field(
        default=0, description="Devices whose report gives a shadow run of the rollout's candidate"
    )
    shadow_outside: int = Field(
        default=0,
        description="Of them, those whose shadow run found the candidate outside the model's "
        "bounds (they kept their active variant)",
    )
    shadow_errors: list[float] = Field(
        default_factory=list,
        exclude=True,
        description="Each shadow run's max relative error, candidate against active",
    )
    shadow_tolerances: list[float] = Field(default_factory=list, exclude=True)
    shadow_metrics: list[str] = Field(
        default_factory=list,
        exclude=True,
        description="Each outside run's task metric: 'kind value (min min)'",
    )
    shadow_candidate_ms: list[float] = Field(default_factory=list, exclude=True)
    shadow_active_ms: list[float] = Field(default_factory=list, exclude=True)
    merged: dict[str, list[tuple[float, int]]] = Field(
        default_factory=dict,
        exclude=True,
        description="A latency list field's values as (value, count) pairs, increasing, "
        "when the evidence comes from merged aggregates (``sketch_rules``): its medians are "
        "read from them",
    )

    def _median(self, name: str, values: list[float]) -> float | None:
        if values:
            return statistics.median(values)
        pairs = self.merged.get(name)
        return sketch_median(pairs) if pairs else None

    @property
    def serving(self) -> int:
        return self.devices - self.failed

    @computed_field  # type: ignore[prop-decorator]
    @property
    def failure_rate(self) -> float:
        return self.failed / self.devices if self.devices else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def median_p50_ms(self) -> float | None:
        """The median of the serving devices' p50s."""
        return self._median("p50_ms", self.p50_ms)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def shadow_outside_rate(self) -> float:
        """The share of the devices with a shadow run whose candidate fell outside."""
        return self.shadow_outside / self.shadow_runs if self.shadow_runs else 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def shadow_max_rel_error(self) -> float | None:
        """The largest error a shadow run gave, candidate against active."""
        return max(self.shadow_errors) if self.shadow_errors else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def shadow_p50_ms(self) -> dict[str, float] | None:
        """The median of the shadow runs' p50s: the candidate's and the active variant's."""
        candidate = self._median("shadow_candidate_ms", self.shadow_candidate_ms)
        active = self._median("shadow_active_ms", self.shadow_active_ms)
        if candidate is None or active is None:
            return None
        return {"candidate": candidate, "active": active}

    @computed_field  # type: ignore[prop-decorator]
    @property
    def other_eps_share(self) -> float:
        """The share of serving devices where part of the model fell back to other EPs."""
        return self.partly_on_other_eps / self.serving if self.serving > 0 else 0.0


class RuntimeEvidence(BaseModel):
    """The counted reports of devices on one runtime, side by side."""

    new: SideEvidence = Field(default_factory=SideEvidence)
    previous: SideEvidence = Field(default_factory=SideEvidence)


class Evidence(BaseModel):
    """What the device reports say about one rollout of one model, side by side."""

    new: SideEvidence = Field(default_factory=SideEvidence)
    previous: SideEvidence = Field(default_factory=SideEvidence)
    runtimes: dict[str, RuntimeEvidence] = Field(
        default_factory=dict,
        description="The same counted reports by the runtime their device runs "
        "(``runtime_of``: ORT and EP package versions)",
    )
    not_attributed: dict[str, int] = Field(
        default_factory=dict, description="Reports naming the rollout not counted, by reason"
    )
    other_rollouts: int = Field(
        default=0, description="Reports of the model acting on another (older) rollout"
    )
    unreadable: int = Field(
        default=0, description="Reports of the fleet that could not be read at all"
    )
    unheard_members: int = Field(
        default=0,
        description="Keys of member devices whose report could not be used (unreadable, "
        "naming another device, or claiming the wrong side)",
    )

    @property
    def unattributed(self) -> int:
        return sum(self.not_attributed.values())

    @property
    def latency_regression(self) -> float | None:
        new, before = self.new.median_p50_ms, self.previous.median_p50_ms
        if new is None or before is None or before <= 0:
            return None
        return new / before - 1


Decision = Literal["advance", "halt", "wait"]


class Verdict(BaseModel):
    decision: Decision
    reason: str


def counts_for(
    rollout: Rollout,
    model: str,
    report: DeviceReport,
    enrolled: Mapping[str, DeviceKey] | None = None,
) -> tuple[Side, ModelReport] | str | None:
    """The side of ``rollout`` (of ``model``) the report (read from its device's own key)
    counts for, with its model's part; the reason (a ``NOT_ATTRIBUTED`` key, or
    ``"other"`` for another rollout of the model) it does not; None when it says nothing
    of a rollout of the model. ``enrolled``: the devices' enrolled keys (the signed
    manifest's), which a rollout with ``authenticated_reports`` requires a report to be
    signed with. The rules are the module's."""
    found = next((m for m in report.models if m.model == model), None)
    if found is None or found.rollout is None:
        return None
    if found.rollout.id != rollout.id:
        return "other"
    if rollout.policy.authenticated_reports:
        enrolled_key = (enrolled or {}).get(report.device_id)
        if signed_envelope(report) is None:
            return "unsigned"
        if enrolled_key is None:
            return "not enrolled"
        if not signed_by(report, enrolled_key):
            return "bad signature"
    try:
        made = made_at(report.generated_at)
    except ValueError:
        return "time"
    if made < rollout.stage_started_at or found.rollout.stage != rollout.stage:
        return "stale"
    member = is_member(rollout, report.device_id)
    if found.rollout.member != member:
        return "membership"
    return ("new" if member else "previous"), found


def count(
    evidence: Evidence,
    rollout: Rollout,
    model: str,
    heard: DeviceReport | Unattributed,
    enrolled: Mapping[str, DeviceKey] | None = None,
) -> None:
    """Add what one report object (as ``evidence_rules.attribute`` heard it) says of
    ``rollout`` of ``model`` to ``evidence`` (a stream of reports is read once for every
    rollout under way)."""
    if isinstance(heard, Unattributed):
        if heard.reason == "unreadable":
            evidence.unreadable += 1
        elif _names(heard.report, model, rollout):
            _refused(evidence, heard.reason)
        device = key_device(heard.key)
        evidence.unheard_members += device is not None and is_member(rollout, device)
        return
    attributed = counts_for(rollout, model, heard, enrolled)
    if attributed is None:
        return
    if attributed == "other":
        evidence.other_rollouts += 1
        return
    if isinstance(attributed, str):
        _refused(evidence, attributed)
        if attributed in UNHEARD:
            evidence.unheard_members += is_member(rollout, heard.device_id)
        return
    side_name, found = attributed
    runtime = evidence.runtimes.setdefault(runtime_of(heard), RuntimeEvidence())
    for sides in (evidence, runtime):
        side = sides.new if side_name == "new" else sides.previous
        side.devices += 1
        if not found.served:
            side.failed += 1
        elif found.profile is not None:
            side.p50_ms.append(found.profile.p50_ms)
            side.partly_on_other_eps += bool(found.profile.other_nodes)
        shadow = found.rollout.shadow if found.rollout is not None else None
        if shadow is not None:
            add_shadow(side, shadow)


def add_shadow(side: SideEvidence, shadow: ShadowRun) -> None:
    """Count one device's shadow run (its figures finite: a report with others never
    parses) on ``side``."""
    side.shadow_runs += 1
    side.shadow_outside += not shadow.within
    if shadow.max_rel_error is not None:
        side.shadow_errors.append(shadow.max_rel_error)
    if shadow.tolerance is not None:
        side.shadow_tolerances.append(shadow.tolerance)
    if not shadow.within and shadow.metric is not None and shadow.metric_value is not None:
        side.shadow_metrics.append(
            f"{shadow.metric} {shadow.metric_value:.4g} (min {shadow.metric_min:.4g})"
            if shadow.metric_min is not None
            else f"{shadow.metric} {shadow.metric_value:.4g}"
        )
    side.shadow_candidate_ms.append(shadow.candidate_p50_ms)
    side.shadow_active_ms.append(shadow.active_p50_ms)


def runtime_of(report: DeviceReport) -> str:
    """The runtime a device reports: its ORT version and its EP packages' versions."""
    return runtime_label(report.ort_version, report.ep_packages)


def _refused(evidence: Evidence, reason: str) -> None:
    evidence.not_attributed[reason] = evidence.not_attributed.get(reason, 0) + 1


def _names(report: DeviceReport | None, model: str, rollout: Rollout) -> bool:
    if report is None:
        return False
    found = next((m for m in report.models if m.model == model), None)
    return found is not None and found.rollout is not None and found.rollout.id == rollout.id


def gather(
    rollout: Rollout,
    model: str,
    reports: Iterable[DeviceReport | Unattributed],
    enrolled: Mapping[str, DeviceKey] | None = None,
) -> Evidence:
    """``count`` over report objects as ``evidence_rules.attribute`` heard them."""
    evidence = Evidence()
    for heard in reports:
        count(evidence, rollout, model, heard, enrolled)
    return evidence


def judge(rollout: Rollout, evidence: Evidence, now: datetime) -> Verdict:
    """The gate's decision on the rollout's current stage (see the module's rules)."""
    policy = rollout.policy
    if rollout.state != "active":
        return Verdict(decision="wait", reason=f"the rollout is {rollout.state}")
    new = evidence.new
    unattributed = _unattributed_text(evidence)
    if new.devices < policy.min_reports:
        return Verdict(
            decision="wait",
            reason=f"{new.devices} of the {policy.min_reports} member device reports needed "
            f"on stage {rollout.stage + 1}{unattributed}",
        )
    if new.failure_rate > policy.max_failure_rate:
        return Verdict(
            decision="halt",
            reason=f"{new.failed} of {new.devices} member devices failed the new variants "
            f"({new.failure_rate:.0%}, more than max_failure_rate "
            f"{policy.max_failure_rate:.0%}; {evidence.previous.failed} of "
            f"{evidence.previous.devices} on the previous ones){unattributed}",
        )
    shadow = policy.shadow
    if shadow is not None and new.shadow_outside_rate > shadow.max_outside_rate:
        return Verdict(
            decision="halt",
            reason=f"{new.shadow_outside} of {new.shadow_runs} member devices' shadow runs "
            f"found the candidate outside the model's bounds ({shadow_figures(new)}; "
            f"{new.shadow_outside_rate:.0%}, more than max_outside_rate "
            f"{shadow.max_outside_rate:.0%}); they kept their active variant{unattributed}",
        )
    regression = evidence.latency_regression
    if regression is not None and regression > policy.max_latency_regression:
        return Verdict(
            decision="halt",
            reason=f"the new variants' median inference time is {regression:.0%} above the "
            f"previous ones' (max_latency_regression {policy.max_latency_regression:.0%})"
            f"{unattributed}",
        )
    if evidence.unheard_members >= new.devices:
        return Verdict(
            decision="wait",
            reason=f"{evidence.unheard_members} member devices' reports could not be used, "
            f"as many as the {new.devices} heard{unattributed}: not advancing on evidence "
            "that may be forged or broken; see docs/concepts/trust.md, or advance by hand",
        )
    hours = max(0.0, (now - rollout.stage_started_at).total_seconds() / 3600)
    if hours < policy.min_hours:
        return Verdict(
            decision="wait",
            reason=f"stage {rollout.stage + 1} has lasted {hours:.1f} of its "
            f"{policy.min_hours:g} hours",
        )
    return Verdict(
        decision="advance",
        reason=f"{new.devices} member devices on the new variants, {new.failure_rate:.0%} "
        "failed"
        + (f", latency {regression:+.0%}" if regression is not None else "")
        + (
            f", {new.shadow_runs - new.shadow_outside} of {new.shadow_runs} shadow runs within "
            f"the bounds ({shadow_figures(new)})"
            if new.shadow_runs
            else ""
        )
        + unattributed,
    )


def shadow_figures(side: SideEvidence) -> str:
    """``largest error 35.20% of range (tolerance 1.00%), p50 candidate 1.2 ms, active
    1.1 ms``: what a side's shadow runs measured."""
    parts = []
    error = side.shadow_max_rel_error
    if error is not None:
        tolerance = min(side.shadow_tolerances) if side.shadow_tolerances else None
        parts.append(
            f"largest error {error:.2%} of range"
            + (f" (tolerance {tolerance:.2%})" if tolerance is not None else "")
        )
    if side.shadow_metrics:
        parts.append(f"task metric {min(side.shadow_metrics)}")  # min: in any report order
    p50 = side.shadow_p50_ms
    if p50 is not None:
        candidate, active = p50["candidate"], p50["active"]
        parts.append(f"median p50 candidate {candidate:.3g} ms, active {active:.3g} ms")
    return ", ".join(parts)


def _unattributed_text(evidence: Evidence) -> str:
    parts = [
        f"{n} {NOT_ATTRIBUTED.get(why, why)}" for why, n in sorted(evidence.not_attributed.items())
    ]
    if evidence.unreadable:
        parts.append(f"{evidence.unreadable} of the fleet's reports unreadable")
    if not parts:
        return ""
    return f"; not counted: {', '.join(parts)}"
