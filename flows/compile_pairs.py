"""The ``compile-pairs`` flow: compile given pairs on this work pool's workers.

The fleet flow starts it, as deployment ``compile-pairs/<pool>``, for the pairs whose
target names that work pool (``work_pool: gpu-compilers``: an EP that compiles only on
its own hardware). It uploads the artifacts and leaves its outcomes at ``results_key``
in the store; the fleet flow merges them into its own publish.
"""

# No `from __future__ import annotations`: see flows/fleet_compile.py.
from typing import Annotated

from prefect import flow, get_run_logger
from pydantic import Field

from epfleet import MAX_WORKERS
from epfleet.fleet.planning.plan import plan_on_pool
from epfleet.fleet.runs.handover import PoolPair, write_results
from epfleet.fleet.runs.task_runners import from_environment
from tasks.compile import compile_all


@flow(
    name="compile-pairs",
    description="Compile pairs sent by fleet-compile to this work pool and hand back the "
    "outcomes through the store (started by fleet-compile, not by hand).",
    task_runner=from_environment(),
)
def compile_pairs(
    pairs: list[PoolPair],
    store: str,
    results_key: str,
    workers: Annotated[int, Field(ge=1, le=MAX_WORKERS)] = 2,
    force: bool = False,
) -> int:
    """Compile pairs sent by fleet-compile and leave their outcomes in the store.

    Args:
        pairs: The pairs, with their manifest entries when fleet-compile planned.
        store: Store URI of the fleet.
        results_key: Store key where the outcomes go.
        workers: Compiles run in parallel on this machine (1 to 64).
        force: Recompile pairs that are up to date.
    """
    todo, skipped = plan_on_pool(pairs, store, force)
    get_run_logger().info(
        "%d pairs: %d to compile, %d up to date on this pool", len(pairs), len(todo), len(skipped)
    )
    outcomes = compile_all(todo, store, workers)
    write_results(store, results_key, outcomes, skipped)
    return sum(o.result.status == "ok" for o in outcomes)
