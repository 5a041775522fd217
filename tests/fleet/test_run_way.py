"""How `epfleet compile` runs a plan (``epfleet.fleet.runs.run_way``, pure)."""

from __future__ import annotations

import pytest

from epfleet.fleet.runs.run_way import RunWay, run_way

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("up_to_date", "task_runner", "work_pools", "api_url", "temporary", "way"),
    [
        (True, "threads", False, False, False, RunWay.ANSWER),  # no flow run at all
        (True, "dask", True, True, True, RunWay.ANSWER),
        # The README's first run: no API started, the run kept to be recorded later.
        (False, "threads", False, False, False, RunWay.PLAIN_THEN_KEEP),
        (False, "threads", False, False, True, RunWay.PLAIN_THEN_RECORD),  # --prefect temporary
        (False, "threads", False, True, False, RunWay.FLOW),  # a server is up: nothing to wait for
        (False, "threads", False, True, True, RunWay.FLOW),
        (False, "threads", True, False, False, RunWay.FLOW),  # a work pool is reached via Prefect
        (False, "dask", False, False, False, RunWay.FLOW),
    ],
)
def test_run_way(
    up_to_date: bool, task_runner: str, work_pools: bool, api_url: bool, temporary: bool,
    way: RunWay,
) -> None:  # fmt: skip
    assert (
        run_way(
            up_to_date=up_to_date,
            task_runner=task_runner,
            work_pools=work_pools,
            api_url=api_url,
            temporary=temporary,
        )
        is way
    )
