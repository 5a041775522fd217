"""runtime-watch's trigger on the Prefect test API: one fleet-compile run per findings,
and a new one after that run failed (the pure watch rules: tests/fleet/test_watch.py)."""

from __future__ import annotations

import pytest

from epfleet.fleet.watch.rules import WatchPlan, check_pairs
from tests.support.watch_fleet import QNN, RUNTIME, SPEC, current_fleet, variant

pytestmark = pytest.mark.slow


def test_trigger_starts_one_run_per_findings_and_another_after_a_failed_one(
    prefect_api: str,
) -> None:
    """Against the Prefect test API: the same findings return the queued run; once that run
    has failed (an outage, not a compile error), the next watch starts a new one."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Failed

    from flows.fleet_compile import fleet_compile
    from tasks.watch import trigger_compile

    deployment_id = fleet_compile.to_deployment("watch-trigger-test").apply()
    fleet = current_fleet()
    fleet.models["det"].variants["sd8g3-htp"] = variant(QNN, ep_version="2.6.0")
    plan = WatchPlan(pairs=check_pairs(SPEC, fleet, RUNTIME), unserved=[], reports_read=0)

    @flow
    def watch_once() -> str:
        return trigger_compile("fleet-compile/watch-trigger-test", "s.yaml", "st", plan, 3)

    try:
        first, again = watch_once(), watch_once()
        assert first == again
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs()
            run = next(r for r in runs if r.name == first)
            assert run.parameters["models"] == ["det"] and run.parameters["targets"] == [
                "sd8g3-htp"
            ]
            client.set_flow_run_state(run.id, Failed(message="worker lost"), force=True)
        third = watch_once()
        assert third != first
        assert watch_once() == third
    finally:
        with get_client(sync_client=True) as client:
            client.delete_deployment(deployment_id)
