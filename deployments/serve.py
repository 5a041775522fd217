"""Serve epfleet's deployments from one process, without a work pool: for a single machine
that compiles the fleet and keeps its own device cache.

    epfleet serve [--spec examples/fleet.yaml] [--store ./epfleet-store]
                  [--cache ./epfleet-device] [--nightly "0 2 * * *"]
                  [--sync-every 900] [--watch-every 3600]

(``python deployments/serve.py`` takes the same options.) Five of the deployments of
deployments/prefect.yaml (fleet-compile/nightly, fleet-compile/on-demand,
runtime-watch/hourly, rollout-gate/gate on the watch's interval, device-sync/periodic),
run in this process's subprocesses while it lives. Not served: compile-pairs (targets
bound to a work pool need workers of that pool), the automation, and the gate's trigger
on device reports (it runs on its interval only). Schedules are not paused when it
stops, so a machine that restarts keeps them. device-sync/periodic polls at an offset in
its interval derived from the device id (``device_sync_schedule``,
``epfleet.device.jitter``), so that a fleet of machines serving it does not poll the
store in the same second.
"""

import runpy
import sys
from pathlib import Path
from typing import Any

from prefect import Flow, serve
from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy
from prefect.deployments.runner import RunnerDeployment
from prefect.schedules import Interval, Schedule

from epfleet.device.jitter import sync_anchor
from epfleet.device.reporting import device_id
from flows.device_sync import device_sync
from flows.fleet_compile import fleet_compile
from flows.rollout_gate import rollout_gate
from flows.runtime_watch import runtime_watch


def serve_all(
    spec: Path, store: str, cache: Path, nightly: str, sync_every: float, watch_every: float
) -> None:
    """Serve the five deployments until this process is stopped."""
    # Flow runs start in subprocesses: local paths are made absolute here.
    store = store if "://" in store else str(Path(store).resolve())
    fleet = {"spec": str(spec.resolve()), "store": store}
    deployments = [
        _deployment(fleet_compile, "nightly", cron=nightly, parameters=fleet, concurrency_limit=1),
        _deployment(fleet_compile, "on-demand", parameters=fleet),
        _deployment(runtime_watch, "hourly", interval=watch_every, parameters=fleet),
        _deployment(
            rollout_gate,
            "gate",
            interval=watch_every,
            parameters={"store": store},
            concurrency_limit=ConcurrencyLimitConfig(
                limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW
            ),
        ),
        _deployment(
            device_sync,
            "periodic",
            schedule=device_sync_schedule(sync_every, None),
            parameters={"cache": str(cache.resolve()), "store": store},
        ),
    ]
    _take_over(deployments)
    serve(*deployments, pause_on_shutdown=False)


def device_sync_schedule(interval: float, device: str | None) -> Schedule:
    """A device sync every ``interval`` seconds at the device's own offset in it (its id:
    ``device``, else $EPFLEET_DEVICE_ID or the host name, as its reports name it)."""
    return Interval(interval, anchor_date=sync_anchor(device_id(device), interval))


def _take_over(deployments: list[RunnerDeployment]) -> None:
    """Delete the deployments of these names that `prefect deploy` made (bound to a work
    pool, code placed by pull steps): serving updates a deployment without its ``path``,
    so its runs would look for the code in a directory named None."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        for deployment in deployments:
            name = f"{deployment.flow_name}/{deployment.name}"
            try:
                existing = client.read_deployment_by_name(name)
            except ObjectNotFound:
                continue
            if existing.work_pool_name or existing.pull_steps or existing.path != deployment._path:
                pool = f" (work pool {existing.work_pool_name})" if existing.work_pool_name else ""
                print(
                    f"epfleet: serving {name} here instead of its deployment{pool}", file=sys.stderr
                )
                client.delete_deployment(existing.id)


def _deployment(flow: Flow[Any, Any], name: str, **options: Any) -> RunnerDeployment:
    made = flow.to_deployment(name, **options)
    assert isinstance(made, RunnerDeployment)  # called outside an event loop: never a coroutine
    return made


if __name__ == "__main__":
    # The epfleet command's own entry point (``python -m epfleet``), not an import of it:
    # the CLI imports the flows, so a flow importing the CLI would close a circle.
    sys.argv[1:1] = ["serve"]
    runpy.run_module("epfleet", run_name="__main__", alter_sys=True)
