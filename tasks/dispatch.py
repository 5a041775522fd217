"""Prefect glue for pairs whose target names a work pool: start a compile-pairs child run
per pool, wait for it, collect its outcomes, and sweep hand-over files dead runs left.

The fleet flow starts one run of deployment ``compile-pairs/<pool>`` per pool (a child
run, linked to it in the UI), compiles its own pairs meanwhile, then waits. The child
decides which pairs are up to date by its own ORT and EP packages, uploads its artifacts
to the store like any compile and leaves its outcomes at a store key the parent reads (and
deletes once published): every compile worker can already reach the store, so this needs
no shared Prefect result storage. The hand-over itself (what is sent, what comes back,
the keys) is ``epfleet.fleet.runs.handover``.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from uuid import UUID

import httpx
from prefect import get_client, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound, PrefectHTTPStatusError
from prefect.runtime import flow_run
from prefect.states import Cancelled, Cancelling

from epfleet.errors import StoreError, summarize
from epfleet.fleet.planning.rules import PlannedPair
from epfleet.fleet.runs.handover import (
    RUNS_PREFIX,
    Dispatched,
    PoolPair,
    Returned,
    abandoned,
    attempt_name,
    nothing_returned,
    parse_results_key,
    pool_outcomes,
    read_results,
    results_key,
)
from epfleet.fleet.runs.outcomes import PairOutcome
from epfleet.stores import Store, open_store

COMPILE_PAIRS_FLOW = "compile-pairs"
POLL_SECONDS = 2.0


def pool_deployment(pool: str) -> str:
    return f"{COMPILE_PAIRS_FLOW}/{pool}"


def dispatch(
    pool: str, pairs: list[PlannedPair], store: str, workers: int, timeout: float, force: bool
) -> Dispatched:
    """Start ``compile-pairs/<pool>`` for these pairs without waiting for it. A failure to
    start it fails that pool's pairs, never the fleet run."""
    # Each attempt of the fleet run (a retry included) starts its own child and hands over
    # through its own key, stamped with the time (runtime-watch sweeps old ones).
    attempt = attempt_name(flow_run.get_id() or "local", flow_run.get_run_count(), time.time())
    key = results_key(attempt, pool)
    sent = Dispatched(
        pool=pool,
        pairs=[PoolPair(request=p.request, previous=p.previous) for p in pairs],
        results_key=key,
        deadline=time.time() + timeout,
    )
    try:
        # The child may run on another machine: it gets the store's full URI, not a path
        # relative to this run's working directory.
        child: FlowRun = run_deployment(  # type: ignore[assignment]  # sync when called here
            pool_deployment(pool),
            parameters={
                "pairs": [p.model_dump(mode="json") for p in sent.pairs],
                "store": open_store(store).uri,
                "results_key": key,
                "workers": workers,
                "force": force,
            },
            timeout=0,
            idempotency_key=attempt + f":{pool}",
        )
    except ObjectNotFound:
        targets = sorted({p.request.target for p in sent.pairs})
        sent.error = (
            f"target {', '.join(targets)} names work pool {pool!r}, but there is no "
            f"deployment {pool_deployment(pool)}: deploy one on that pool (see "
            "deployments/prefect.yaml) or remove work_pool from the target"
        )
        return sent
    except Exception as exc:  # a stale deployment's schema, the API: this pool only
        sent.error = f"could not start {pool_deployment(pool)}: {summarize(exc, 500)}"
        return sent
    sent.flow_run_id = child.id
    get_run_logger().info(
        "%d pairs sent to work pool %s: flow run %s", len(sent.pairs), pool, child.name
    )
    return sent


def collect(dispatched: list[Dispatched], store: str) -> list[PairOutcome]:
    """Wait for the child runs, then read their outcomes. Pairs of a child that failed,
    timed out or left no outcome for them are failed outcomes naming the reason; those the
    pool never decided leave the manifest as it is."""
    logger = get_run_logger()
    target_store = open_store(store)
    outcomes: list[PairOutcome] = []
    for sent in dispatched:
        returned = nothing_returned(sent.error)
        try:
            if sent.error is None:
                returned = _outcome_of(sent, target_store)
        except Exception as exc:  # the child run gone, the API down: this pool only
            returned = nothing_returned(
                f"could not collect flow run {sent.flow_run_id}: {summarize(exc, 500)}"
            )
        got, problems = pool_outcomes(sent, returned)
        for problem in problems:
            logger.error("%s", problem)
        outcomes += got
    return outcomes


def _outcome_of(sent: Dispatched, target_store: Store) -> Returned:
    """The outcomes and skips of a child that completed; otherwise why it did not."""
    assert sent.flow_run_id is not None
    state, message = _wait(sent.flow_run_id, sent.deadline)
    run = f"flow run {sent.flow_run_id} on work pool {sent.pool!r}"
    if state == "COMPLETED":
        return read_results(target_store, sent)
    if state in ("SCHEDULED", "PENDING", "LATE", "PAUSED"):
        why = (
            f"no worker of work pool {sent.pool!r} started flow run {sent.flow_run_id} in "
            f"time (is one running? prefect worker start --pool {sent.pool}); it was cancelled"
        )
    elif state in ("RUNNING", "CANCELLING"):
        why = f"{run} was still running at work_pool_timeout; it was asked to cancel"
    else:
        why = f"{run} ended {state}" + (f": {message}" if message else "")
    return nothing_returned(why)


def discard_results(store: str, dispatched: list[Dispatched]) -> None:
    """Remove the hand-over files once their outcomes are published (best effort)."""
    target_store = open_store(store)
    for sent in dispatched:
        try:
            target_store.delete(sent.results_key)
        except StoreError as exc:
            get_run_logger().warning("could not remove %s: %s", sent.results_key, exc)


def _wait(run_id: UUID, deadline: float) -> tuple[str, str | None]:
    """The run's state type and message once final, or as it was at the deadline. A run no
    worker started by then is cancelled (so a worker that comes up later does not compile
    for nobody); a running one is asked to cancel, which its worker carries out. An API
    error while waiting does not end the wait (Prefect's client already retried the
    request): polling goes on until the deadline, since the pairs compiled here meanwhile
    must still be published."""
    with get_client(sync_client=True) as client:
        state_type, message = "UNKNOWN", None
        while True:
            try:
                state = client.read_flow_run(run_id).state
                if state is not None:
                    state_type, message = state.type.value, state.message
                    if state.is_final():
                        return state_type, message
            except (httpx.HTTPError, PrefectHTTPStatusError) as exc:
                get_run_logger().warning("reading flow run %s: %s; retrying", run_id, exc)
            if time.time() > deadline:
                break
            time.sleep(POLL_SECONDS)
        try:
            if state_type == "SCHEDULED":
                client.set_flow_run_state(
                    run_id, Cancelled(message="the fleet compile stopped waiting")
                )
            elif state_type in ("PENDING", "RUNNING"):  # a worker has it: let it stop it
                client.set_flow_run_state(
                    run_id, Cancelling(message="the fleet compile stopped waiting")
                )
            state = client.read_flow_run(run_id).state
        except (httpx.HTTPError, PrefectHTTPStatusError):
            return state_type, message
        if state is not None and state.type.value == "COMPLETED":
            return "COMPLETED", state.message  # it finished as the wait ended: collect it
        return state_type, message  # what kept it from finishing in time


def sweep_results(store: str, older_than: timedelta) -> list[str]:
    """Remove hand-over files whose fleet run ended more than ``older_than`` ago without
    collecting them (a fleet run that died between its child's hand-over and its publish
    leaves one); the keys removed. A file whose run this API does not know (another
    workspace may share the store) goes only once it is a day older than that."""
    target_store = open_store(store)
    now = datetime.now(timezone.utc)
    removed = []
    with get_client(sync_client=True) as client:
        for key in target_store.list_keys(RUNS_PREFIX):
            made = parse_results_key(key)
            if made is None:
                continue  # not a fleet run's hand-over
            parent, stamped = made
            try:
                run = client.read_flow_run(parent)
            except ObjectNotFound:
                run = None
            except Exception as exc:  # the API: try again at the next watch
                get_run_logger().warning("sweep: reading flow run %s: %s", parent, exc)
                continue
            final = run is not None and run.state is not None and run.state.is_final()
            ended = run.end_time if run is not None else None
            if abandoned(stamped, run is not None, final, ended, now, older_than):
                target_store.delete(key)
                removed.append(key)
    return removed
