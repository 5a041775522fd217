"""A compile run's work without Prefect (``epfleet compile`` when Prefect's temporary API
does not start): compiles in threads on this machine's compile pool, the publish a plain
call, warnings logged (the command line shows them on stderr). A work pool is reached
only through Prefect, so its pairs fail, naming the pool."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from epfleet.fleet.build.variant import build_variant
from epfleet.fleet.planning.rules import PlannedPair
from epfleet.fleet.publishing.publish import Published, publish
from epfleet.fleet.runs.models import RunPlan
from epfleet.fleet.runs.outcomes import PairOutcome, failed_outcome, ok_outcome, outcome_of_failure
from epfleet.formats.manifest import VariantEntry
from epfleet.stores import Store

logger = logging.getLogger(__name__)


@dataclass
class PlainRunner:
    store: Store
    workers: int
    pools: list[PlannedPair] = field(default_factory=list)

    def compile_here(self, pairs: list[PlannedPair]) -> list[PairOutcome]:
        with ThreadPoolExecutor(max(1, min(len(pairs), 4 * self.workers))) as threads:
            return list(threads.map(self._build, pairs))

    def _build(self, pair: PlannedPair) -> PairOutcome:
        try:
            return ok_outcome(pair.request, build_variant(pair.request, self.store, self.workers))
        except Exception as exc:  # one pair's failure never stops the others
            return outcome_of_failure(pair.request, exc)

    def compile_in_pool(self, pool: str, pairs: list[PlannedPair]) -> None:
        self.pools += pairs

    def collect_pools(self) -> list[PairOutcome]:
        return [
            failed_outcome(
                pair.request,
                f"not compiled: work pool {pair.work_pool} is reached through Prefect, "
                "whose API did not start",
            )
            for pair in self.pools
        ]

    def publish(self, plan: RunPlan, variants: list[tuple[str, str, VariantEntry]]) -> Published:
        chosen = {(model, target): entry for model, target, entry in variants}
        return publish(self.store, plan.sources, plan.published_sources, chosen, plan.model_facts)

    def warn(self, message: str) -> None:
        logger.warning(message)
