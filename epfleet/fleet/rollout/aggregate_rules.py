"""The rollout gate's pass as mergeable aggregates (pure): what one report, as the gate hears
it, adds to every rollout's evidence, the field view, the field rankings and the pass's
tally (``contribution``), and the gate's reading of the fleet's sum (``evidence_of``,
``field_of``, ``rankings_of``, ``tally_of``).

A contribution is made by the very rules a full pass applies to each report
(``rollout_rules.count``, ``field_rules.field_tally``, ``ranking_rules.LatencyTally.add``),
to that one report, and written as counts (``aggregate_rules``): so one vote per device,
membership from the signed salt, signatures, finite numbers and the stale and other-rollout
refusals hold as they do in a recount. Each is judged against a ``GateContext`` (the
rollouts under way, the manifest in force, the ranking window, whether device keys are
enrolled: ``context_digest``); the device's enrolled key is part of the record's identity
(``epfleet.fleet.evidence.aggregates``). The ranking's age window is the one part that
depends on the reader's clock: a ``Window`` from the report's time minus the allowed skew
through its time plus the maximum age, outside of which it counts as refused (``time``
before, ``old`` after), as ``ranking_rules`` refuses it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from epfleet.fleet.evidence.aggregate_rules import (
    Contribution,
    Counts,
    Merged,
    Window,
    add_count,
    add_sample,
    add_value,
    path,
)
from epfleet.fleet.evidence.field_rules import FieldTally, field_tally
from epfleet.fleet.evidence.ranking_rules import FUTURE_SKEW, LatencyTally, report_refused
from epfleet.fleet.evidence.rules import Unattributed
from epfleet.fleet.rollout.rules import Evidence, RuntimeEvidence, SideEvidence, count
from epfleet.formats.device_report import DeviceReport
from epfleet.formats.manifest import DeviceKey, Manifest
from epfleet.formats.rollout import Rollout

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_SIDE_COUNTS = ("devices", "failed", "partly_on_other_eps", "shadow_runs", "shadow_outside")
_SIDE_SAMPLES = ("p50_ms", "shadow_candidate_ms", "shadow_active_ms")
_SIDE_VALUES = ("shadow_errors", "shadow_tolerances", "shadow_metrics")
_EVIDENCE_COUNTS = ("other_rollouts", "unreadable", "unheard_members")
_SIDES = ("new", "previous")


def microseconds(when: datetime) -> int:
    """``when`` (with its UTC offset) as whole microseconds since the epoch: exact."""
    return (when - EPOCH) // timedelta(microseconds=1)


@dataclass(frozen=True)
class GateContext:
    """What the gate's pass judges a report against, but the clock."""

    staged: Mapping[str, Rollout]
    manifest: Manifest
    enrolled: Mapping[str, DeviceKey]
    max_age: timedelta

    @property
    def authenticated(self) -> bool:
        return bool(self.enrolled)


def context_digest(context: GateContext) -> str:
    """A digest of the context (the enrolled keys only as whether there are any: each
    device's own key is part of its record's identity)."""
    said = {
        "staged": {n: r.model_dump(mode="json") for n, r in sorted(context.staged.items())},
        "models": {
            n: e.model_dump(mode="json") for n, e in sorted(context.manifest.models.items())
        },
        "max_age": context.max_age.total_seconds(),
        "skew": FUTURE_SKEW.total_seconds(),
        "authenticated": context.authenticated,
    }
    return hashlib.sha256(json.dumps(said, sort_keys=True).encode()).hexdigest()


def contribution(heard: DeviceReport | Unattributed, context: GateContext) -> Contribution:
    """What one report object, as the gate hears it, adds to the pass (see the module)."""
    always: Counts = {}
    add_count(always, path("tally", heard.reason if isinstance(heard, Unattributed) else "read"))
    for name, rollout in context.staged.items():
        evidence = Evidence()
        count(evidence, rollout, name, heard, context.enrolled)
        _add_evidence(always, name, evidence)
    if isinstance(heard, Unattributed):
        _add_latencies(always, _latencies(heard, context, None))
        return Contribution(always)
    _add_field(always, field_tally([heard]))
    try:
        made = datetime.fromisoformat(heard.generated_at)
    except ValueError:
        made = None
    if made is None or made.tzinfo is None:
        _add_latencies(always, _latencies(heard, context, None))
        return Contribution(always)
    why = report_refused(heard, context.enrolled, made, context.max_age, context.authenticated)
    inside: Counts = {}
    _add_latencies(always if why is not None else inside, _latencies(heard, context, made))
    if why is not None:
        return Contribution(always)
    before: Counts = {}
    after: Counts = {}
    add_count(before, path("rank refused", "time"))
    add_count(after, path("rank refused", "old"))
    window = Window(
        start=microseconds(made - FUTURE_SKEW),
        end=microseconds(made + context.max_age),
        inside=inside,
        before=before,
        after=after,
    )
    return Contribution(always, window)


def _latencies(
    heard: DeviceReport | Unattributed, context: GateContext, now: datetime | None
) -> LatencyTally:
    """The ranking's tally of one report at ``now`` (its own time: within its window)."""
    tally = LatencyTally()
    tally.add(
        heard,
        context.manifest,
        context.enrolled,
        now or EPOCH,
        context.max_age,
        authenticated=context.authenticated,
    )
    return tally


def _add_latencies(counts: Counts, tally: LatencyTally) -> None:
    for key, devices in tally.latencies.items():
        for p50 in devices.values():
            add_sample(counts, path("rank", *key), p50)
    for profile, label in tally.hardware.items():
        add_count(counts, path("hardware", profile, label))
    for reason, n in tally.refused.items():
        add_count(counts, path("rank refused", reason), n)


def _add_field(counts: Counts, tallies: dict[tuple[str, str], FieldTally]) -> None:
    for (model, target), tally in tallies.items():
        add_count(counts, path("field", model, target, "running"), tally.running)
        add_count(counts, path("field", model, target, "failed"), tally.failed)
        add_count(counts, path("field", model, target, "partly"), tally.partly_elsewhere)
        add_count(counts, path("field", model, target, "seen"))
        for p50 in tally.latencies:
            add_sample(counts, path("field", model, target, "p50"), p50)


def _add_evidence(counts: Counts, name: str, evidence: Evidence) -> None:
    for reason, n in evidence.not_attributed.items():
        add_count(counts, path("rollout", name, "not attributed", reason), n)
    for what in _EVIDENCE_COUNTS:
        add_count(counts, path("rollout", name, what), getattr(evidence, what))
    for side in _SIDES:
        _add_side(counts, ("rollout", name, side), getattr(evidence, side))
    for runtime, sides in evidence.runtimes.items():
        add_count(counts, path("rollout", name, "runtime", runtime))
        for side in _SIDES:
            _add_side(counts, ("rollout", name, "runtime", runtime, side), getattr(sides, side))


def _add_side(counts: Counts, where: tuple[str, ...], side: SideEvidence) -> None:
    for what in _SIDE_COUNTS:
        add_count(counts, path(*where, what), getattr(side, what))
    for what in _SIDE_SAMPLES:
        for value in getattr(side, what):
            add_sample(counts, path(*where, what), value)
    for what in _SIDE_VALUES:
        for value in getattr(side, what):
            add_value(counts, path(*where, what), value)


def tally_of(merged: Merged) -> dict[str, int]:
    """The pass's reports: read, unreadable, and read under another device's key."""
    return {r: merged.count(path("tally", r)) for r in ("read", "unreadable", "key")}


def evidence_of(merged: Merged, name: str) -> Evidence:
    """The evidence of the rollout of model ``name`` in the merged aggregates."""
    evidence = Evidence()
    prefix = ["rollout", name, "not attributed"]
    for where, n in merged.counts.items():
        parts = json.loads(where)
        if parts[:3] == prefix:
            evidence.not_attributed[parts[3]] = n
        elif parts[:3] == ["rollout", name, "runtime"] and len(parts) == 4:
            evidence.runtimes[parts[3]] = RuntimeEvidence()
    evidence.not_attributed = dict(sorted(evidence.not_attributed.items()))
    for what in _EVIDENCE_COUNTS:
        setattr(evidence, what, merged.count(path("rollout", name, what)))
    for side in _SIDES:
        setattr(evidence, side, _side_of(merged, ("rollout", name, side)))
    for runtime in sorted(evidence.runtimes):
        evidence.runtimes[runtime] = RuntimeEvidence(
            new=_side_of(merged, ("rollout", name, "runtime", runtime, "new")),
            previous=_side_of(merged, ("rollout", name, "runtime", runtime, "previous")),
        )
    evidence.runtimes = dict(sorted(evidence.runtimes.items()))
    return evidence


def _side_of(merged: Merged, where: tuple[str, ...]) -> SideEvidence:
    side = SideEvidence()
    for what in _SIDE_COUNTS:
        setattr(side, what, merged.count(path(*where, what)))
    for what in _SIDE_SAMPLES:
        pairs = merged.samples.get(path(*where, what), [])
        if merged.exact.get(path(*where, what), True):
            setattr(side, what, [v for v, n in pairs for _ in range(n)])
        else:
            side.merged[what] = pairs
    for what in _SIDE_VALUES:
        setattr(side, what, sorted(merged.values.get(path(*where, what), [])))
    return side


def field_of(merged: Merged) -> dict[tuple[str, str], FieldTally]:
    """The field view's tallies (``field_rules.field_rows`` makes its rows)."""
    tallies: dict[tuple[str, str], FieldTally] = {}
    for where in merged.counts:
        parts = json.loads(where)
        if parts[0] == "field" and parts[3] == "seen":
            model, target = parts[1], parts[2]
            tallies[(model, target)] = FieldTally(
                running=merged.count(path("field", model, target, "running")),
                failed=merged.count(path("field", model, target, "failed")),
                partly_elsewhere=merged.count(path("field", model, target, "partly")),
                merged_latencies=merged.samples.get(path("field", model, target, "p50"), []),
            )
    return tallies


def rankings_of(merged: Merged) -> LatencyTally:
    """The ranking's tally (``ranking_rules.rank`` and ``explain`` read it)."""
    tally = LatencyTally()
    for where, n in merged.counts.items():
        parts = json.loads(where)
        if parts[0] == "hardware":
            tally.hardware[parts[1]] = parts[2]
        elif parts[0] == "rank refused":
            tally.refused[parts[1]] = n
    for where, pairs in merged.samples.items():
        parts = json.loads(where)
        if parts[0] == "rank":
            tally.merged[(parts[1], parts[2], parts[3], parts[4])] = pairs
    return tally
