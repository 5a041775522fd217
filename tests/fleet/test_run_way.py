"""How `epfleet compile` runs a plan (``epfleet.fleet.run_way``, pure)."""

from __future__ import annotations

import pytest

from epfleet.fleet.run_way import RunWay, run_way

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("up_to_date", "task_runner", "work_pools", "api_url", "way"),
    [
        (True, "threads", False, False, RunWay.ANSWER),  # no API started at all
        (True, "dask", True, True, RunWay.ANSWER),
        (False, "threads", False, False, RunWay.PLAIN_THEN_RECORD),  # the README's first run
        (False, "threads", False, True, RunWay.FLOW),  # a server is up: nothing to wait for
        (False, "threads", True, False, RunWay.FLOW),  # a work pool is reached via Prefect
        (False, "dask", False, False, RunWay.FLOW),
    ],
)
def test_run_way(
    up_to_date: bool, task_runner: str, work_pools: bool, api_url: bool, way: RunWay
) -> None:
    assert (
        run_way(
            up_to_date=up_to_date, task_runner=task_runner, work_pools=work_pools, api_url=api_url
        )
        is way
    )
