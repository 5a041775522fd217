"""Pairs whose target names a work pool compile on that pool's workers.

The fleet flow starts one run of deployment ``compile-pairs/<pool>`` per pool (a child
run, linked to it in the UI), compiles its own pairs meanwhile, then waits. The child
uploads its artifacts to the store like any compile and leaves its outcomes at a store
key the parent reads and deletes: every compile worker can already reach the store, so
this needs no shared Prefect result storage.
"""

from __future__ import annotations

import time
from uuid import UUID

from prefect import get_client, get_run_logger
from prefect.client.schemas.objects import FlowRun
from prefect.deployments import run_deployment
from prefect.exceptions import ObjectNotFound
from prefect.runtime import flow_run
from prefect.states import Cancelled
from pydantic import BaseModel, ValidationError

from epfleet.errors import StoreError
from epfleet.plan import CompileRequest
from epfleet.stores import Store, open_store
from tasks.compile import PairOutcome, failed_outcome

COMPILE_PAIRS_FLOW = "compile-pairs"
POLL_SECONDS = 2.0


def pool_deployment(pool: str) -> str:
    return f"{COMPILE_PAIRS_FLOW}/{pool}"


def results_key(parent_run_id: str, pool: str) -> str:
    return f"runs/{parent_run_id}/{pool}.json"


class PoolResults(BaseModel):
    outcomes: list[PairOutcome]


class Dispatched(BaseModel):
    pool: str
    requests: list[CompileRequest]
    results_key: str
    flow_run_id: UUID | None = None
    error: str | None = None


def dispatch(pool: str, requests: list[CompileRequest], store: str, workers: int) -> Dispatched:
    """Start ``compile-pairs/<pool>`` for these pairs without waiting for it."""
    parent = str(flow_run.get_id() or "local")
    key = results_key(parent, pool)
    sent = Dispatched(pool=pool, requests=requests, results_key=key)
    try:
        child: FlowRun = run_deployment(  # type: ignore[assignment]  # sync when called here
            pool_deployment(pool),
            parameters={
                "requests": [r.model_dump(mode="json") for r in requests],
                "store": store,
                "results_key": key,
                "workers": workers,
            },
            timeout=0,
            idempotency_key=f"{parent}:{pool}",
        )
    except ObjectNotFound:
        targets = sorted({r.target for r in requests})
        sent.error = (
            f"target {', '.join(targets)} names work pool {pool!r}, but there is no "
            f"deployment {pool_deployment(pool)}: deploy one on that pool (see "
            "deployments/prefect.yaml) or remove work_pool from the target"
        )
        return sent
    sent.flow_run_id = child.id
    get_run_logger().info(
        "%d pairs sent to work pool %s: flow run %s", len(requests), pool, child.name
    )
    return sent


def collect(dispatched: list[Dispatched], store: str, timeout: float) -> list[PairOutcome]:
    """Wait for the child runs, then read (and delete) their outcomes. Pairs of a child that
    failed, timed out or left no outcome are failed outcomes naming the reason."""
    logger = get_run_logger()
    finals = _wait([d.flow_run_id for d in dispatched if d.flow_run_id], timeout)
    target_store = open_store(store)
    outcomes: list[PairOutcome] = []
    for sent in dispatched:
        reason = sent.error
        got: dict[tuple[str, str], PairOutcome] = {}
        if reason is None:
            assert sent.flow_run_id is not None
            state = finals.get(sent.flow_run_id)
            if state is None:
                reason = (
                    f"no worker of work pool {sent.pool!r} finished flow run {sent.flow_run_id} "
                    f"within {timeout:.0f} s (is one running? prefect worker start --pool "
                    f"{sent.pool}); the run was cancelled"
                )
            elif state != "COMPLETED":
                reason = f"flow run {sent.flow_run_id} on work pool {sent.pool!r} ended {state}"
            else:
                got, reason = _read_results(target_store, sent)
        for request in sent.requests:
            key = (request.model, request.target)
            if key in got:
                outcomes.append(got[key])
            else:
                outcomes.append(failed_outcome(request, reason or "no outcome reported"))
        if reason:
            logger.error("work pool %s: %s", sent.pool, reason)
    return outcomes


def _read_results(
    target_store: Store, sent: Dispatched
) -> tuple[dict[tuple[str, str], PairOutcome], str | None]:
    try:
        found = target_store.read(sent.results_key)
        if found is None:
            return {}, f"the run left no outcomes at {target_store.uri}/{sent.results_key}"
        results = PoolResults.model_validate_json(found.data)
        target_store.delete(sent.results_key)
    except (StoreError, ValidationError) as exc:
        return {}, f"cannot read its outcomes at {sent.results_key}: {exc}"
    return {o.key: o for o in results.outcomes}, None


def write_results(store: str, key: str, outcomes: list[PairOutcome]) -> None:
    open_store(store).write(key, PoolResults(outcomes=outcomes).model_dump_json().encode())


def _wait(run_ids: list[UUID], timeout: float) -> dict[UUID, str]:
    """Each run's final state type, for the runs that ended within ``timeout``; the others
    are cancelled so that a worker that comes up later does not compile for nobody."""
    finals: dict[UUID, str] = {}
    deadline = time.monotonic() + timeout
    with get_client(sync_client=True) as client:
        pending = set(run_ids)
        while pending:
            for run_id in list(pending):
                state = client.read_flow_run(run_id).state
                if state is not None and state.is_final():
                    finals[run_id] = state.type.value
                    pending.discard(run_id)
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(POLL_SECONDS)
        for run_id in pending:
            client.set_flow_run_state(
                run_id, Cancelled(message="the fleet compile stopped waiting"), force=True
            )
    return finals
