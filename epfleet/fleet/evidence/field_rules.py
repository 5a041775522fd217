"""What the device reports say of each published variant in the field (pure): per model ×
target, the devices running it, the devices where it failed, how fast it runs across the
fleet, and where part of it fell back to another EP.

Rules:
- a device runs a variant when its model was kept, downloaded or recompiled and the
  report names that target;
- a device failed a variant when its model failed or fell back there and the best
  published variant it judged eligible (optimal or prefer_recompilation, in the order it
  considered them) is that target: the one it tried first;
- latency is each running device's own median run (its profile's p50, taken when the
  variant was activated): the fleet's p50 and p95 are over those devices;
- a device counts as falling back to other EPs when its profile has nodes left to them.
Targets the manifest no longer lists are shown too (devices still run them) and marked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel

from epfleet.fleet.evidence.sketch_rules import percentile as sketch_percentile
from epfleet.formats.device_report import DeviceReport, ModelReport
from epfleet.formats.manifest import Manifest
from eps.base import Verdict

ELIGIBLE = frozenset({Verdict.OPTIMAL, Verdict.PREFER_RECOMPILATION})


class FieldRow(BaseModel):
    model: str
    target: str
    published: bool
    running: int
    failed: int
    p50_ms: float | None
    p95_ms: float | None
    partly_on_other_eps: int


@dataclass
class FieldTally:
    """What the reports say of one model × target (``field_tally``)."""

    running: int = 0
    failed: int = 0
    latencies: list[float] = field(default_factory=list)
    partly_elsewhere: int = 0
    merged_latencies: list[tuple[float, int]] | None = None
    """The latencies as (value, count) pairs, increasing, when they come from merged
    aggregates (``sketch_rules``) rather than one by one."""

    def percentile(self, share: float) -> float | None:
        if self.merged_latencies is not None:
            return sketch_percentile(self.merged_latencies, share)
        return percentile(self.latencies, share)


def tried_first(report: ModelReport) -> str | None:
    """The target a device that failed a model tried first: its first eligible variant."""
    return next((v.target for v in report.considered if v.verdict in ELIGIBLE), None)


def percentile(values: list[float], share: float) -> float | None:
    """The nearest-rank percentile (``share`` in 0..1) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * share // 1))  # ceil, at least the first
    return ordered[int(rank) - 1]


def field_tally(reports: Iterable[DeviceReport]) -> dict[tuple[str, str], FieldTally]:
    """What ``reports`` say of each model × target they name (see the module's rules)."""
    tallies: dict[tuple[str, str], FieldTally] = {}
    for report in reports:
        for found in report.models:
            if found.served and found.target is not None:
                tally = tallies.setdefault((found.model, found.target), FieldTally())
                tally.running += 1
                if found.profile is not None:
                    tally.latencies.append(found.profile.p50_ms)
                    tally.partly_elsewhere += bool(found.profile.other_nodes)
            elif not found.served:
                target = tried_first(found)
                if target is not None:
                    tallies.setdefault((found.model, target), FieldTally()).failed += 1
    return tallies


def field_view(manifest: Manifest, reports: Iterable[DeviceReport]) -> list[FieldRow]:
    """Each model × target that is published or that a device reports, with its evidence."""
    return field_rows(manifest, field_tally(reports))


def field_rows(manifest: Manifest, found: dict[tuple[str, str], FieldTally]) -> list[FieldRow]:
    """The field view of the tallies ``found``: each model × target published or found."""
    tallies = {
        (model, target): FieldTally()
        for model, entry in manifest.models.items()
        for target in entry.variants
    } | found
    return [
        FieldRow(
            model=model,
            target=target,
            published=model in manifest.models and target in manifest.models[model].variants,
            running=tally.running,
            failed=tally.failed,
            p50_ms=tally.percentile(0.5),
            p95_ms=tally.percentile(0.95),
            partly_on_other_eps=tally.partly_elsewhere,
        )
        for (model, target), tally in sorted(tallies.items())
    ]
