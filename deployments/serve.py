"""Serve epfleet's deployments from one process, without a work pool: for a single machine
that compiles the fleet and keeps its own device cache.

    python deployments/serve.py [--spec examples/fleet.yaml] [--store ./epfleet-store]
                                [--cache ./epfleet-device] [--nightly "0 2 * * *"]
                                [--sync-every 900] [--watch-every 3600]

Four of the deployments of deployments/prefect.yaml (fleet-compile/nightly,
fleet-compile/on-demand, runtime-watch/hourly, device-sync/periodic), run in this
process's subprocesses while it lives. Not served: compile-pairs (targets bound to a
work pool need workers of that pool) and the automation. Schedules are not paused when
it stops, so a machine that restarts keeps them.
"""

import argparse
import os
from pathlib import Path
from typing import Any

from prefect import Flow, serve
from prefect.deployments.runner import RunnerDeployment

from epfleet.runs import DEFAULT_STORE
from flows.device_sync import device_sync
from flows.fleet_compile import fleet_compile
from flows.runtime_watch import runtime_watch


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python deployments/serve.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--spec", type=Path, default=Path("examples/fleet.yaml"), help="fleet spec YAML"
    )
    parser.add_argument(
        "--store", default=DEFAULT_STORE, help="directory, file:///abs/dir or s3://bucket/prefix"
    )
    parser.add_argument(
        "--cache", type=Path, default=Path("epfleet-device"), help="this machine's device cache"
    )
    parser.add_argument("--nightly", default="0 2 * * *", help="cron of fleet-compile/nightly")
    parser.add_argument("--sync-every", type=float, default=900, help="seconds between syncs")
    parser.add_argument("--watch-every", type=float, default=3600, help="seconds between watches")
    args = parser.parse_args(argv)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Flow runs start in subprocesses: local paths are made absolute here.
    store = args.store if "://" in args.store else str(Path(args.store).resolve())
    fleet = {"spec": str(args.spec.resolve()), "store": store}
    serve(
        _deployment(
            fleet_compile, "nightly", cron=args.nightly, parameters=fleet, concurrency_limit=1
        ),
        _deployment(fleet_compile, "on-demand", parameters=fleet),
        _deployment(runtime_watch, "hourly", interval=args.watch_every, parameters=fleet),
        _deployment(
            device_sync,
            "periodic",
            interval=args.sync_every,
            parameters={"cache": str(args.cache.resolve()), "store": store},
        ),
        pause_on_shutdown=False,
    )


def _deployment(flow: Flow[Any, Any], name: str, **options: Any) -> RunnerDeployment:
    made = flow.to_deployment(name, **options)
    assert isinstance(made, RunnerDeployment)  # called outside an event loop: never a coroutine
    return made


if __name__ == "__main__":
    main()
