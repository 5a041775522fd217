"""Run models of a fleet compile: its plan, each pair's result and outcome, the run's report.

Plain pydantic models shared by the flow, its tasks, the CLI and the renderings; how
they are made lives elsewhere (``epfleet.fleet.planning.plan``, ``epfleet.fleet.runs.outcomes``,
``epfleet.fleet.publishing.rules``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from epfleet.fleet.planning.rules import PlannedPair
from epfleet.fleet.publishing.merge_rules import ModelFacts
from epfleet.formats.manifest import (
    ArtifactRef,
    PrecisionTried,
    SamplesRef,
    SourceEntry,
    VariantEntry,
)
from epfleet.formats.rollout import RolloutPolicy
from epfleet.runtime.requests import CompileRequest
from eps.base import Precision


class RunPlan(BaseModel):
    store: str
    sources: dict[str, SourceEntry]
    pairs: list[PlannedPair]
    generation: int
    published_sources: dict[str, SourceEntry | None] = Field(
        description="Each model's source entry in the manifest when this run planned"
    )
    samples: dict[str, SamplesRef | None] = Field(
        default_factory=dict, description="Each model's golden samples (verification)"
    )
    published_samples: dict[str, SamplesRef | None] = Field(default_factory=dict)
    calibrations: dict[str, ArtifactRef | None] = Field(
        default_factory=dict, description="Each model's calibration inputs (integer variants)"
    )
    published_calibrations: dict[str, ArtifactRef | None] = Field(default_factory=dict)
    preferences: dict[str, list[str]] = Field(
        default_factory=dict, description="Each model's targets, in the spec's order"
    )
    published_preferences: dict[str, list[str]] = Field(default_factory=dict)
    rollouts: dict[str, RolloutPolicy] = Field(
        default_factory=dict, description="Each staged model's rollout policy"
    )
    policy_changes: dict[str, str] = Field(
        default_factory=dict,
        description="Models whose rollout under way follows a policy the spec changed: what "
        "changes",
    )
    policy_kept: dict[str, str] = Field(
        default_factory=dict,
        description="Models whose rollout under way keeps its policy, the spec giving none",
    )

    @property
    def to_compile(self) -> list[PlannedPair]:
        return [p for p in self.pairs if p.action == "compile"]

    def report(
        self, results: dict[tuple[str, str], PairResult], generation: int, published: bool
    ) -> RunReport:
        """The run's report in spec order; pairs without a result were up to date (and
        failed, when a failed compile of these very inputs is what they are up to)."""
        ordered = [
            results.get((p.request.model, p.request.target)) or _up_to_date(p) for p in self.pairs
        ]
        return RunReport(
            generation=generation,
            published=published,
            compiled=sum(r.status == "ok" for r in ordered),
            skipped=sum(r.status == "skipped" for r in ordered),
            failed=sum(r.status == "failed" for r in ordered),
            variants=ordered,
        )

    @property
    def is_noop(self) -> bool:
        """Nothing to compile and nothing new to publish: the fleet is up to date."""
        return (
            not self.to_compile
            and self.published_sources == self.sources
            and self.published_samples == self.samples
            and self.published_calibrations == self.calibrations
            and self.published_preferences == self.preferences
            and not self.policy_changes
        )

    @property
    def model_facts(self) -> ModelFacts:
        """What the run sets on each model's entry besides its variants."""
        return ModelFacts(
            samples=self.samples,
            calibration=self.calibrations,
            preference=self.preferences,
            rollout=self.rollouts,
        )


SETTLED = "up to date, not compiled again until its inputs change (--force compiles it)"


def _up_to_date(pair: PlannedPair) -> PairResult:
    previous = pair.previous
    failure = previous.failure_for(pair.request.fingerprint) if previous else None
    if failure is None and pair.work_pool and previous and previous.status == "failed":
        failure = previous  # its pool skipped it: a failure of the pool's fingerprint
    if failure is None:
        return PairResult.of(pair.request, previous, "skipped", None)
    result = PairResult.of(pair.request, failure, "failed", None)
    kept = "; an older build stays published" if failure is not previous else ""
    return result.model_copy(update={"error": f"{failure.error} [{SETTLED}{kept}]"})


class PairResult(BaseModel):
    model: str
    target: str
    ep: str
    status: Literal["ok", "skipped", "failed"]
    compatibility_string: str | None = None
    artifact_uri: str | None = None
    size: int | None = None  # every file of the variant
    seconds: float | None = None
    error: str | None = None
    coverage: float | None = None
    coverage_boundary_qdq: int = Field(
        default=0,
        description="Of what the EP left to ORT's CPU EP, the (de)quantisation of the graph's "
        "inputs and outputs",
    )
    verification: Literal["passed", "failed", "unverified"] | None = None
    max_rel_error: float | None = None
    verification_seconds: float | None = None
    metric: str | None = Field(
        default=None,
        description="The task metric the variant scored, e.g. 'cosine 0.998 (min 0.99)'",
    )
    samples_origin: Literal["spec", "generated"] | None = None
    verification_twin_of: str | None = Field(
        default=None,
        description="Checked on its first golden sample(s) only, as a numerics twin of this "
        "target (verified on every sample)",
    )
    device: Literal["cpu", "gpu", "npu"] | None = None
    precision: Precision | None = Field(
        default=None, description="What the variant computes in, as its entry records it"
    )
    precisions_lost: list[Precision] = Field(
        default_factory=list, description="The ladder's precisions tried before it, which failed"
    )
    precision_tried: list[PrecisionTried] = Field(
        default_factory=list,
        description="Each of those, as the entry records it: how it lost, why, its seconds",
    )
    folded: bool = Field(
        default=False,
        description="Compiled with its boundary Quantize/Dequantize folded: it takes and "
        "gives integers (the entry's folded_io)",
    )

    @classmethod
    def of(
        cls,
        pair: CompileRequest,
        entry: VariantEntry | None,
        status: Literal["ok", "skipped", "failed"],
        seconds: float | None,
    ) -> PairResult:
        artifact = entry.artifact if entry else None
        return cls(
            model=pair.model,
            target=pair.target,
            ep=pair.ep,
            status=status,
            compatibility_string=entry.compatibility_string if entry else None,
            artifact_uri=artifact.uri if artifact else None,
            size=entry.total_size if entry and artifact else None,
            seconds=seconds,
            error=entry.error if entry and status == "failed" else None,
            coverage=entry.coverage.fraction if entry and entry.coverage else None,
            coverage_boundary_qdq=entry.coverage.boundary_qdq if entry and entry.coverage else 0,
            verification=entry.verification.status if entry and entry.verification else None,
            max_rel_error=(
                entry.verification.max_rel_error if entry and entry.verification else None
            ),
            verification_seconds=(
                entry.verification.seconds if entry and entry.verification else None
            ),
            metric=(
                entry.verification.metric.shown()
                if entry and entry.verification and entry.verification.metric
                else None
            ),
            samples_origin=(
                entry.verification.samples_origin if entry and entry.verification else None
            ),
            verification_twin_of=(
                entry.verification.twin_of if entry and entry.verification else None
            ),
            device=pair.device,
            precision=entry.precision if entry else None,
            precisions_lost=[t.precision for t in entry.precision_tried] if entry else [],
            precision_tried=list(entry.precision_tried) if entry else [],
            folded=bool(entry and entry.folded_io),
        )


class RunReport(BaseModel):
    generation: int
    published: bool
    compiled: int
    skipped: int
    failed: int
    variants: list[PairResult]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


class PairOutcome(BaseModel):
    """One pair's compile, as it goes into the manifest (entry) and the report (result)."""

    entry: VariantEntry
    result: PairResult
    publish: bool = Field(
        default=True,
        description="False for a pair its work pool never decided (the pool did not run), "
        "or whose compile failed for a reason other than a verdict on the build: the run "
        "reports it failed, the manifest keeps the entry it has",
    )

    @property
    def key(self) -> tuple[str, str]:
        return (self.result.model, self.result.target)
