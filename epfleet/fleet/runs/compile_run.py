"""One compile run's order of work, shared by the fleet-compile flow and the command line's
run without Prefect: the pairs of a work pool go to their pool, the others compile here,
every outcome is published in one compare-and-swap (a numerics twin whose representative
did not pass held back: ``epfleet.fleet.planning.twin_rules``), and the report settles what was
published (rules: ``epfleet.fleet.publishing.rules``).

Who compiles, publishes and logs is the caller's (``Runner``): the flow submits Prefect
tasks and starts child runs; the command line without Prefect compiles in threads and
fails a work pool's pairs, naming the pool. Nothing here imports Prefect.
"""

from __future__ import annotations

from typing import Protocol

from epfleet.fleet.planning.rules import PlannedPair
from epfleet.fleet.planning.twin_rules import hold_back
from epfleet.fleet.publishing.publish import Published
from epfleet.fleet.publishing.rules import settle, to_publish
from epfleet.fleet.runs.models import RunPlan, RunReport
from epfleet.fleet.runs.outcomes import PairOutcome
from epfleet.formats.manifest import VariantEntry


class Runner(Protocol):
    def compile_here(self, pairs: list[PlannedPair]) -> list[PairOutcome]:
        """Compile these pairs on this machine; a failed pair is a failed outcome."""

    def compile_in_pool(self, pool: str, pairs: list[PlannedPair]) -> None:
        """Start the pairs of ``pool`` there (their outcomes come from ``collect_pools``)."""

    def collect_pools(self) -> list[PairOutcome]:
        """Wait for the pools started and return their outcomes."""

    def publish(self, plan: RunPlan, variants: list[tuple[str, str, VariantEntry]]) -> Published:
        """Publish the variants (and the plan's sources and model facts) in one swap."""

    def warn(self, message: str) -> None:
        """Say something the run's report does not (a variant refused at publish, a rollout
        following a changed policy)."""


def by_pool(plan: RunPlan) -> tuple[list[PlannedPair], dict[str, list[PlannedPair]]]:
    """The plan's pairs to compile here, and those of each work pool."""
    here: list[PlannedPair] = []
    pools: dict[str, list[PlannedPair]] = {}
    for pair in plan.to_compile:
        if pair.work_pool:
            pools.setdefault(pair.work_pool, []).append(pair)
        else:
            here.append(pair)
    return here, pools


def run_compiles(plan: RunPlan, runner: Runner) -> RunReport:
    """Compile what ``plan`` says (the pools' pairs started first, so that they run while
    this machine compiles), publish every outcome at once, and report."""
    for model, note in (plan.policy_changes | plan.policy_kept).items():
        runner.warn(f"model {model}: {note}")
    here, pools = by_pool(plan)
    for pool, pairs in pools.items():
        runner.compile_in_pool(pool, pairs)
    outcomes = runner.compile_here(here)
    if pools:
        outcomes += runner.collect_pools()
    outcomes = hold_back(plan.pairs, outcomes)
    published = runner.publish(plan, to_publish(plan, outcomes))
    report, refused = settle(plan, outcomes, published)
    for result in refused:
        runner.warn(f"{result.model} × {result.target}: {result.error}")
    return report
