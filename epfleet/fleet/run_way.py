"""How ``epfleet compile`` runs a plan: the choice alone, pure (the command does the I/O).

Prefect's temporary API takes seconds to start (tens on a busy machine), while the
example fleet compiles, verifies and publishes in a few. So a run that needs nothing of
Prefect but a record compiles and publishes at once, without it, while the API starts
beside it, and records the finished run on it once it answers (``PLAIN_THEN_RECORD``).
A run that needs Prefect to do its work (a target's work pool, a Dask cluster) runs as
the fleet-compile flow; so does one with a Prefect server already up (PREFECT_API_URL:
nothing to wait for). An up-to-date plan is answered with no Prefect at all.
"""

from __future__ import annotations

from enum import Enum


class RunWay(Enum):
    ANSWER = "answer"
    """Nothing to compile: the plan is the report; no flow run, no Prefect API."""
    FLOW = "flow"
    """The fleet-compile flow run compiles and publishes (collecting the compiles the
    command started early)."""
    PLAIN_THEN_RECORD = "plain-then-record"
    """Compile and publish now without Prefect (``epfleet.fleet.plain_runner``), the
    temporary API starting meanwhile; then a fleet-compile flow run records the finished
    run (its artifacts and events) on it."""


def run_way(*, up_to_date: bool, task_runner: str, work_pools: bool, api_url: bool) -> RunWay:
    """The way a plan runs.

    ``up_to_date``: the plan has nothing to compile; ``task_runner``: ``threads`` (this
    machine) or ``dask``; ``work_pools``: a pair to compile is bound to a work pool;
    ``api_url``: PREFECT_API_URL names a Prefect server (no temporary API to wait for).
    """
    if up_to_date:
        return RunWay.ANSWER
    if api_url or work_pools or task_runner != "threads":
        return RunWay.FLOW
    return RunWay.PLAIN_THEN_RECORD
