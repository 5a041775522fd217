"""Field rankings (pure): which published variant devices of one kind measured fastest.

The latency evidence is kept per (model, variant, hardware profile, runtime): each
device's own median run of the variant it activated (its report's profile ``p50_ms``),
one vote per device. ``LatencyTally.add`` takes the reports as the rollout gate hears
them (``epfleet.fleet.evidence.rules.attribute`` and the evidence index), and counts a
model's vote only when the gate could count it too:

- the report is attributed to the device its key names (an ``Unattributed`` one counts
  for nothing), and, when ``authenticated`` (the fleet enrols device keys), it is signed
  with its device's enrolled key: an unsigned report, an unenrolled device or a bad
  signature moves nothing;
- it was made with a UTC offset, no earlier than ``max_age`` before ``now`` and no later
  than ``now`` plus the clock skew a gate allows;
- the model runs a variant the manifest publishes (its target, and the very artifact
  when the report names its sha256), activated with a health check's timings;
- during the model's rollout, the device's claim to be in it or not is its bucket's
  (``membership``), as the gate requires;
- a device's first mention of a model is its vote (a report listing a model twice does
  not vote twice); the report format already refuses numbers that are not finite, and a
  hardware list or runtime longer than a ranking carries (``MAX_LABEL``) votes for nothing.

``rank`` turns the tally into a ranking per (hardware profile, runtime): a variant is
ranked once at least ``min_devices`` distinct devices of that kind reported it, a
profile is ranked once two of the model's variants are, fastest median first (ties by
target name). An accelerator variant measured slower than the profile's fastest CPU
variant falls behind it by that order, and is named (``slower_than_cpu``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pydantic import BaseModel

from epfleet.fleet.evidence.rules import Unattributed
from epfleet.fleet.evidence.sketch_rules import median as sketch_median
from epfleet.fleet.evidence.sketch_rules import total as sketch_total
from epfleet.formats.device_report import DeviceReport, ModelReport, signed_by, signed_envelope
from epfleet.formats.field_ranking import (
    MAX_LABEL,
    Measured,
    ModelRanking,
    ProfileRanking,
    hardware_profile,
    runtime_label,
)
from epfleet.formats.manifest import DeviceKey, Manifest
from epfleet.formats.rollout import is_member

MIN_DEVICES = 5
"""The default of ``EPFLEET_RANKING_MIN_DEVICES``."""
FUTURE_SKEW = timedelta(minutes=10)
"""How far past the gate's clock a report's time may be (device clocks drift)."""

LatencyKey = tuple[str, str, str, str]
"""(model, target, hardware profile id, runtime)."""


@dataclass
class LatencyTally:
    """The latency evidence of one pass: per key, each device's median run, and why the
    votes that did not count did not."""

    latencies: dict[LatencyKey, dict[str, float]] = field(default_factory=dict)
    hardware: dict[str, str] = field(default_factory=dict)
    """Profile id -> its label (the EP devices)."""
    refused: dict[str, int] = field(default_factory=dict)
    merged: dict[LatencyKey, list[tuple[float, int]]] = field(default_factory=dict)
    """Per key, the devices' medians as (value, count) pairs, increasing, when they come
    from merged aggregates (``sketch_rules``) rather than device by device."""

    def measured(self) -> dict[LatencyKey, tuple[int, float]]:
        """Per key, how many devices voted and the median of their medians."""
        found = {
            key: (len(devices), statistics.median(devices.values()))
            for key, devices in self.latencies.items()
        }
        for key, pairs in self.merged.items():
            middle = sketch_median(pairs)
            if middle is not None:
                found[key] = (sketch_total(pairs), middle)
        return found

    def add(
        self,
        heard: DeviceReport | Unattributed,
        manifest: Manifest,
        enrolled: Mapping[str, DeviceKey],
        now: datetime,
        max_age: timedelta,
        *,
        authenticated: bool,
    ) -> None:
        """Count what one report object says of its device's latencies (see the module)."""
        if isinstance(heard, Unattributed):
            self._refuse(heard.reason)
            return
        why = report_refused(heard, enrolled, now, max_age, authenticated)
        if why is not None:
            self._refuse(why)
            return
        profile, label = hardware_profile(heard.devices)
        runtime = runtime_label(heard.ort_version, heard.ep_packages)
        if len(label) > MAX_LABEL or len(runtime) > MAX_LABEL:
            self._refuse("too long")
            return
        voted: set[str] = set()
        for found in heard.models:
            if found.model in voted:
                self._refuse("repeated")
                continue
            voted.add(found.model)
            refused = _model_refused(found, heard.device_id, manifest)
            if refused is not None:
                self._refuse(refused)
                continue
            assert found.target is not None and found.profile is not None
            key = (found.model, found.target, profile, runtime)
            self.latencies.setdefault(key, {})[heard.device_id] = found.profile.p50_ms
            self.hardware[profile] = label

    def _refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1


def report_refused(
    report: DeviceReport,
    enrolled: Mapping[str, DeviceKey],
    now: datetime,
    max_age: timedelta,
    authenticated: bool,
) -> str | None:
    if authenticated:
        key = enrolled.get(report.device_id)
        if signed_envelope(report) is None:
            return "unsigned"
        if key is None:
            return "not enrolled"
        if not signed_by(report, key):
            return "bad signature"
    try:
        made = datetime.fromisoformat(report.generated_at)
    except ValueError:
        return "time"
    if made.tzinfo is None:
        return "time"
    if made < now - max_age:
        return "old"
    if made > now + FUTURE_SKEW:
        return "time"
    return None


def _model_refused(found: ModelReport, device: str, manifest: Manifest) -> str | None:
    entry = manifest.models.get(found.model)
    if entry is None or not found.served or found.target is None or found.profile is None:
        return "nothing measured"
    variant = entry.variants.get(found.target)
    if variant is None or variant.status != "ok":
        return "not published"
    artifact = variant.artifact
    if found.artifact_sha256 is not None and (
        artifact is None or artifact.sha256 != found.artifact_sha256
    ):
        return "another build"
    rollout, seen = entry.rollout, found.rollout
    if rollout is None or seen is None or seen.id != rollout.id:
        return None
    return "membership" if seen.member != is_member(rollout, device) else None


def rank(tally: LatencyTally, manifest: Manifest, min_devices: int) -> dict[str, ModelRanking]:
    """Each model's ranking per (profile, runtime) with enough evidence (see the module);
    models with no ranked profile are left out."""
    grouped: dict[tuple[str, str, str], list[Measured]] = {}
    for (model, target, profile, runtime), (devices, p50) in sorted(tally.measured().items()):
        if devices >= min_devices:
            one = Measured(target=target, devices=devices, p50_ms=round(p50, 3))
            grouped.setdefault((model, profile, runtime), []).append(one)
    found: dict[str, list[ProfileRanking]] = {}
    for (model, profile, runtime), measured in grouped.items():
        if len(measured) < 2:
            continue
        order = sorted(measured, key=lambda m: (m.p50_ms, m.target))
        variants = manifest.models[model].variants
        cpu = [m.p50_ms for m in order if variants[m.target].device == "cpu"]
        slower = [
            m.target
            for m in order
            if cpu and variants[m.target].device != "cpu" and m.p50_ms > min(cpu)
        ]
        found.setdefault(model, []).append(
            ProfileRanking(
                profile=profile,
                hardware=tally.hardware[profile],
                runtime=runtime,
                order=order,
                slower_than_cpu=slower,
            )
        )
    return {
        model: ModelRanking(model=model, min_devices=min_devices, profiles=profiles)
        for model, profiles in sorted(found.items())
    }


class ProfileChoice(BaseModel):
    """What devices of one hardware profile and runtime take for a model, and why."""

    model: str
    profile: str
    hardware: str
    runtime: str
    ranked: bool
    why: list[str]


def explain(
    tally: LatencyTally, rankings: dict[str, ModelRanking], min_devices: int
) -> list[ProfileChoice]:
    """Every (model, profile, runtime) the reports measured: its ranking's reasons, or why
    it has none (its devices then order their variants as with no evidence)."""
    measured: dict[tuple[str, str, str], dict[str, int]] = {}
    for (model, target, profile, runtime), (devices, _) in tally.measured().items():
        measured.setdefault((model, profile, runtime), {})[target] = devices
    choices = []
    for (model, profile, runtime), counts in sorted(measured.items()):
        ranking = rankings.get(model)
        mine = ranking.for_device(profile, runtime) if ranking is not None else None
        if mine is not None:
            why = why_lines(mine)
        else:
            said = ", ".join(f"{t} {n}" for t, n in sorted(counts.items()))
            why = [
                f"no ranking: the order without evidence (devices a variant: {said}; a "
                f"ranking needs two variants of {min_devices} devices each)"
            ]
        choices.append(
            ProfileChoice(
                model=model,
                profile=profile,
                hardware=tally.hardware[profile],
                runtime=runtime,
                ranked=mine is not None,
                why=why,
            )
        )
    return choices


def why_lines(ranking: ProfileRanking) -> list[str]:
    """Why devices of this profile take what they take, a phrase a variant."""
    lines = []
    for place, m in enumerate(ranking.order):
        said = f"{m.target}: p50 {m.p50_ms:.1f} ms over {m.devices} devices"
        if place == 0:
            said += ", fastest: taken first where usable"
        elif m.target in ranking.slower_than_cpu:
            said += ", slower than the CPU variant: not preferred"
        lines.append(said)
    return lines
