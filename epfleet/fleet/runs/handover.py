"""The store hand-over between a fleet run and the compile-pairs runs of its work pools.

What is sent, what comes back, and the keys under ``runs/`` where it lies.

The fleet run sends each pool its ``PoolPair``s (as the child run's parameters) and a
results key; the pool decides, compiles, and writes ``PoolResults`` at that key; the
fleet run reads them back, matches them to the pairs it sent (``pool_outcomes``) and
deletes the file once published. Keys name the fleet run attempt that owns them, so a
sweep can remove the files a dead run left behind.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import NamedTuple
from uuid import UUID

from pydantic import BaseModel, Field, ValidationError

from epfleet.errors import StoreError
from epfleet.fleet.runs.outcomes import PairOutcome, failed_outcome
from epfleet.formats.manifest import VariantEntry
from epfleet.runtime.requests import CompileRequest
from epfleet.stores import Store, open_store

RUNS_PREFIX = "runs/"


def attempt_name(run_id: object, run_count: int, now: float) -> str:
    """The name of one attempt of a fleet run (a retry included), stamped with the time:
    ``<flow run id>-<run count>-<unix seconds>``."""
    return f"{run_id}-{run_count}-{int(now)}"


def results_key(attempt: str, pool: str) -> str:
    return f"{RUNS_PREFIX}{attempt}/{pool}.json"


def parse_results_key(key: str) -> tuple[UUID, datetime] | None:
    """The fleet run and time a hand-over key was made by; None for another key."""
    attempt = key.removeprefix(RUNS_PREFIX).split("/", 1)[0]
    try:
        return UUID(attempt[:36]), datetime.fromtimestamp(
            int(attempt.rsplit("-", 1)[1]), timezone.utc
        )
    except (ValueError, IndexError):
        return None


def abandoned(
    stamped: datetime,
    run_known: bool,
    run_final: bool,
    run_ended: datetime | None,
    now: datetime,
    older_than: timedelta,
) -> bool:
    """Whether a hand-over file is left over: its fleet run ended more than ``older_than``
    ago without collecting it, or (a run this API does not know: another workspace may
    share the store) the file is a day older than that."""
    if not run_known:
        return stamped < now - older_than - timedelta(days=1)
    return run_final and (run_ended or stamped) < now - older_than


class PoolPair(BaseModel):
    """A pair sent to a work pool, with its manifest entry when the fleet run planned: the
    pool decides whether it is up to date, by its own ORT and EP package versions."""

    request: CompileRequest
    previous: VariantEntry | None = None


class PoolResults(BaseModel):
    outcomes: list[PairOutcome]
    skipped: list[tuple[str, str]] = Field(
        default_factory=list, description="(model, target) pairs the pool found up to date"
    )


class Dispatched(BaseModel):
    """A hand-over in flight: the pairs sent to a pool, and where its outcomes will lie."""

    pool: str
    pairs: list[PoolPair]
    results_key: str
    deadline: float = Field(description="time.time() after which the fleet run stops waiting")
    flow_run_id: UUID | None = None
    error: str | None = None


class Returned(NamedTuple):
    """What came back from a pool: outcomes by pair, pairs found up to date, and why
    nothing (or not everything) came back."""

    outcomes: dict[tuple[str, str], PairOutcome]
    skipped: set[tuple[str, str]]
    reason: str | None


def nothing_returned(reason: str | None) -> Returned:
    return Returned({}, set(), reason)


def write_results(
    store: str, key: str, outcomes: list[PairOutcome], skipped: list[tuple[str, str]]
) -> None:
    """On the pool: leave the outcomes and skips at ``key`` for the fleet run."""
    results = PoolResults(outcomes=outcomes, skipped=skipped)
    open_store(store).write(key, results.model_dump_json().encode())


def read_results(target_store: Store, sent: Dispatched) -> Returned:
    """On the fleet run: what a pool whose run completed left at its results key."""
    where = f"{target_store.uri}/{sent.results_key}"
    try:
        found = target_store.read(sent.results_key)
        if found is None:
            return nothing_returned(f"the run left no outcomes at {where}")
        results = PoolResults.model_validate_json(found.data)
    except (StoreError, ValidationError) as exc:
        return nothing_returned(f"cannot read its outcomes at {where}: {exc}")
    return Returned({o.key: o for o in results.outcomes}, set(results.skipped), None)


def pool_outcomes(sent: Dispatched, returned: Returned) -> tuple[list[PairOutcome], list[str]]:
    """The outcome of each pair sent, in the order sent (pairs the pool found up to date
    have none: they are reported as skipped), and a message for each pair that came back
    without one. Such a pair is a failed outcome naming why; one the pool never decided
    leaves the manifest as it is, while a new pair gets its failure recorded."""
    outcomes, problems = [], []
    for pair in sent.pairs:
        request = pair.request
        if (request.model, request.target) in returned.skipped:
            continue
        outcome = returned.outcomes.get((request.model, request.target))
        if outcome is not None and outcome.entry.source_sha256 != request.source_sha256:
            outcome = None  # not a build of the source this run planned
        if outcome is None:
            why = (
                returned.reason or f"flow run {sent.flow_run_id} reported no outcome for this pair"
            )
            outcome = failed_outcome(request, why)
            # Undecided: publishing it would rewrite the pair's entry on every run
            # while the pool is down.
            outcome.publish = pair.previous is None
            problems.append(f"{request.model} × {request.target} on work pool {sent.pool}: {why}")
        outcomes.append(outcome)
    return outcomes, problems
