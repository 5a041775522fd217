"""What a fleet run publishes, reports and announces (pure: every fact is passed in).

- ``to_publish``: the outcomes that go into the manifest, in spec order (not a pool
  pair that was never decided).
- ``settle``: the run's report once published: an ok build of a model whose source
  another publisher changed meanwhile is failed (not published), and an ok rebuild that
  is the same build keeps the published artifact (``VariantEntry.rebuilt_alike``).
- ``news``: the results worth an event: failures, and builds that changed what is
  published.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from epfleet.fleet.runs.models import PairOutcome, PairResult, RunPlan, RunReport
from epfleet.formats.manifest import Manifest, VariantEntry


class Published(BaseModel):
    """What a publish did to the store's manifest."""

    manifest: Manifest | None = Field(description="The manifest now in the store")
    published: bool = Field(description="Whether this call changed it")
    conflicts: list[str] = Field(
        default_factory=list, description="Models left alone: their source changed meanwhile"
    )
    signed_version: int | None = Field(
        default=None,
        description="The version of the store's signed timestamp now; None for a store "
        "published unsigned (no trust metadata)",
    )
    tampered: list[str] = Field(
        default_factory=list,
        description="Models whose entries in manifest.json differed from the signed ones "
        "(changed by someone without the keys); manifest.json was put right",
    )


def to_publish(plan: RunPlan, outcomes: list[PairOutcome]) -> list[tuple[str, str, VariantEntry]]:
    """(model, target, entry) of each outcome to publish, in the plan's (spec) order."""
    by_key = {o.key: o for o in outcomes}
    keys = [(p.request.model, p.request.target) for p in plan.pairs]
    return [(*key, by_key[key].entry) for key in keys if key in by_key and by_key[key].publish]


def not_published_error(model: str) -> str:
    return (
        f"not published: the source of model {model!r} changed in the store "
        "while this run compiled (another publisher); run again to compile it"
    )


def settle(
    plan: RunPlan, outcomes: list[PairOutcome], outcome: Published
) -> tuple[RunReport, list[PairResult]]:
    """The run's report after ``outcome``, and the ok results it refused (their model's
    source changed meanwhile), now failed."""
    results = {o.key: o.result for o in outcomes}
    refused = []
    for key, result in results.items():
        if key[0] in outcome.conflicts and result.status == "ok":
            results[key] = result.model_copy(
                update={"status": "failed", "error": not_published_error(key[0])}
            )
            refused.append(results[key])
    manifest = outcome.manifest
    if manifest is not None:
        results = {key: as_published(result, manifest) for key, result in results.items()}
    report = plan.report(results, manifest.generation if manifest else 0, outcome.published)
    return report, refused


def as_published(result: PairResult, manifest: Manifest) -> PairResult:
    """A rebuild that is the same build keeps the published artifact (see
    ``VariantEntry.rebuilt_alike``): report the artifact devices get."""
    model = manifest.models.get(result.model)
    entry = model.variants.get(result.target) if model else None
    if result.status != "ok" or entry is None or entry.artifact is None:
        return result
    return result.model_copy(
        update={"artifact_uri": entry.artifact.uri, "size": entry.artifact.size}
    )


def news(plan: RunPlan, report: RunReport) -> list[PairResult]:
    """The results worth an event: failures, and builds that changed what is published (a
    forced rebuild that produced the same bytes publishes nothing new)."""
    before = {
        (p.request.model, p.request.target): p.previous.artifact.uri
        for p in plan.pairs
        if p.previous is not None and p.previous.artifact is not None
    }
    return [
        r
        for r in report.variants
        if r.status == "failed"
        or (
            r.status == "ok"
            and report.published
            and r.artifact_uri != before.get((r.model, r.target))
        )
    ]
