"""``epfleet watch`` and ``epfleet serve``: run the fleet's Prefect flows from the command line.

``watch`` runs the runtime-watch flow once; ``serve`` serves the deployments
(deployments/serve.py) from this process on their schedules.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from cyclopts import Parameter
from cyclopts.validators import Number

from epfleet.cli.exit_codes import EXIT_OK
from epfleet.cli.options import Json, Store, TrustRoot, command_help, pin_trust_root
from epfleet.errors import BadInputError
from epfleet.logs import say
from epfleet.stores import DEFAULT_STORE
from epfleet.text import output_width, printable, show, table

if TYPE_CHECKING:
    from epfleet.fleet.watch.rules import WatchPlan

REPORT_MAX_AGE_DAYS = 30
"""The runtime-watch flow's default for report_max_age_days (tests/fleet/test_watch.py keeps
them equal)."""


def watch(
    spec: str,
    /,
    *,
    store: Store = DEFAULT_STORE,
    dry_run: bool = False,
    compile_deployment: str | None = None,
    report_max_age_days: int | None = None,
    trust_root: TrustRoot = None,
    as_json: Json = False,
) -> int:
    """Run the runtime-watch flow once: compare the ORT and EP versions here with
    those each published variant was compiled with, read the device reports for
    unserved devices, and start fleet-compile for stale or missing pairs.

    --dry-run only reports, without a flow run (no Prefect API is started).

    For example:
      epfleet watch examples/fleet.yaml --store ./epfleet-store --dry-run
      epfleet watch fleet.yaml --store s3://bucket/fleet --report-max-age-days 7

    Exit codes: 0 watched; 2 bad input.

    Parameters
    ----------
    spec
        The fleet spec YAML (relative to the working directory).
    dry_run
        Report only: start nothing, emit no event, remove nothing (and no Prefect flow
        run: it needs no Prefect API).
    compile_deployment
        The deployment started for stale or missing pairs (default: the flow's,
        fleet-compile/on-demand).
    report_max_age_days
        Ignore device reports older than this (default: the flow's, 30).
    as_json
        Print the watch plan as JSON.
    """
    if report_max_age_days is not None and report_max_age_days < 1:
        raise BadInputError(f"--report-max-age-days must be 1 or more, got {report_max_age_days}")
    pin_trust_root(store, trust_root)
    if dry_run:
        plan = _dry_run(spec, store, report_max_age_days or REPORT_MAX_AGE_DAYS)
    else:
        from epfleet.cli.prefect_api import api_for_a_flow_run, prefect_defaults
        from flows.runtime_watch import runtime_watch

        given = {
            "compile_deployment": compile_deployment,
            "report_max_age_days": report_max_age_days,
        }
        parameters: dict[str, Any] = {"spec": spec, "store": store, "trigger": True}
        parameters |= {name: value for name, value in given.items() if value is not None}
        _check_flow_parameters(runtime_watch, parameters)
        with prefect_defaults():
            api_for_a_flow_run(without="use --dry-run (a report needs no Prefect)")
            plan = runtime_watch(**parameters)
    if as_json:
        print(plan.model_dump_json())
        return EXIT_OK
    rows = [[pair.model, pair.target, pair.status, pair.reason] for pair in plan.pairs]
    print(table(["model", "target", "status", "why"], rows, output_width(), wrapped=("why",)))
    for profile in plan.unserved:  # device ids, labels and model names from device reports
        show(
            printable(f"unserved: {', '.join(profile.devices)} ({profile.label}): {profile.models}")
        )
    return EXIT_OK


def _dry_run(spec: str, store: str, report_max_age_days: int) -> WatchPlan:
    """The watch's findings alone: a report starts nothing, so no flow run (and no
    Prefect API) is needed; what it leaves out goes to stderr."""
    from epfleet.fleet.watch.watching import watch_once

    found = watch_once(spec, store, report_max_age_days)
    for note in found.notes:
        say(f"epfleet: {note}")
    return found.plan


def _check_flow_parameters(flow: Any, parameters: dict[str, Any]) -> None:
    """Validate with the flow's own parameter model, before a run of it starts."""
    from prefect.exceptions import ParameterTypeError

    try:
        flow.validate_parameters(parameters)
    except ParameterTypeError as exc:
        raise BadInputError(str(exc)) from None


def serve(
    *,
    spec: Path = Path("examples/fleet.yaml"),
    store: Store = DEFAULT_STORE,
    cache: Path = Path("epfleet-device"),
    nightly: str = "0 2 * * *",
    sync_every: Annotated[float, Parameter(validator=Number(gt=0))] = 900,
    watch_every: Annotated[float, Parameter(validator=Number(gt=0))] = 3600,
) -> int:
    """Serve fleet-compile/nightly and /on-demand, runtime-watch/hourly,
    rollout-gate/gate and device-sync/periodic from this process, without a work pool.

    For one machine that compiles the fleet and keeps its own device cache
    (deployments/serve.py). Not served: compile-pairs (targets bound to a work
    pool need that pool's workers) and the automation. Schedules stay active
    when it stops, so a machine that restarts keeps them.

    For example:
      epfleet serve --spec examples/fleet.yaml --store ./epfleet-store
      epfleet serve --store s3://bucket/fleet --nightly "30 3 * * *"

    Exit codes: 0 stopped; 2 bad input.

    Parameters
    ----------
    spec
        The fleet spec YAML.
    cache
        This machine's device cache.
    nightly
        The cron of fleet-compile/nightly (UTC).
    sync_every
        Seconds between device syncs.
    watch_every
        Seconds between runtime watches, and between runs of the rollout gate.
    """
    from deployments.serve import serve_all
    from epfleet.cli.prefect_api import prefect_defaults

    with prefect_defaults():
        serve_all(spec, store, cache, nightly, sync_every, watch_every)
    return EXIT_OK


command_help(watch, serve)
