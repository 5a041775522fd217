"""How ``epfleet compile`` runs a plan: the choice alone, pure (the command does the I/O).

Prefect's temporary API takes seconds to start (tens on a busy machine, ~10 s of CPU),
while the example fleet compiles, verifies and publishes in a few. So a run that needs
nothing of Prefect but a record, with no Prefect API to record it on (no PREFECT_API_URL),
compiles and publishes without Prefect and starts no API: its record is kept on disk
(``epfleet.fleet.runs.kept_runs``) for the next compile that has an API (``PLAIN_THEN_KEEP``).
Asked to (``--prefect temporary``), the command starts the temporary API beside the
compiles instead, and records the finished run on it once it answers
(``PLAIN_THEN_RECORD``). A run that needs Prefect to do its work (a target's work pool, a
Dask cluster) runs as the fleet-compile flow; so does one with a Prefect server already up
(PREFECT_API_URL: nothing to wait for). An up-to-date plan is answered with no flow run.
"""

from __future__ import annotations

from enum import Enum


class RunWay(Enum):
    ANSWER = "answer"
    """Nothing to compile: the plan is the report; no flow run (kept runs are recorded if
    a Prefect API is at hand)."""
    FLOW = "flow"
    """The fleet-compile flow run compiles and publishes (collecting the compiles the
    command started early)."""
    PLAIN_THEN_KEEP = "plain-then-keep"
    """Compile and publish now without Prefect (``epfleet.fleet.runs.plain_runner``), start no
    Prefect API, and keep the run's record for the next compile that has one."""
    PLAIN_THEN_RECORD = "plain-then-record"
    """Compile and publish now without Prefect, the temporary API starting meanwhile; then
    a fleet-compile flow run records the finished run (its artifacts and events) on it."""


def run_way(
    *, up_to_date: bool, task_runner: str, work_pools: bool, api_url: bool, temporary: bool
) -> RunWay:
    """The way a plan runs.

    ``up_to_date``: the plan has nothing to compile; ``task_runner``: ``threads`` (this
    machine) or ``dask``; ``work_pools``: a pair to compile is bound to a work pool;
    ``api_url``: PREFECT_API_URL names a Prefect server (no temporary API to wait for);
    ``temporary``: the user asked for Prefect's temporary API (``--prefect temporary``).
    """
    if up_to_date:
        return RunWay.ANSWER
    if api_url or work_pools or task_runner != "threads":
        return RunWay.FLOW
    return RunWay.PLAIN_THEN_RECORD if temporary else RunWay.PLAIN_THEN_KEEP
