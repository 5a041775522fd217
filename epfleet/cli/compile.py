"""``epfleet compile``: parse the options, run the compile (``epfleet.fleet.runs.execute``
decides how: through Prefect, or without it), render the report.

The command gives the run its Prefect side (``_Prefect``: the temporary API of
``epfleet.cli.prefect_api`` and the fleet-compile flow), which the fleet package does
not import.
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from cyclopts import Parameter

from epfleet import MAX_WORKERS
from epfleet.cli.interrupts import interrupts
from epfleet.cli.options import (
    Json,
    Repeatable,
    RunnerName,
    Store,
    TrustRoot,
    command_help,
    pin_trust_root,
)
from epfleet.cli.prefect_api import (
    api_url_named,
    prefect_defaults,
    start_temporary_api,
    start_temporary_api_beside,
    temporary_api_dies_with_us,
)
from epfleet.errors import BadInputError, EpfleetError
from epfleet.fsutil import NO_SPACE, no_room
from epfleet.logs import say
from epfleet.stores import DEFAULT_STORE

_PROCESS_STARTED = time.time()  # (close enough: this module is imported at start-up)

if TYPE_CHECKING:
    from prefect.task_runners import TaskRunner

    from epfleet.fleet.runs.models import RunPlan, RunReport


def compile_(
    spec: Path,
    /,
    *,
    store: Store = DEFAULT_STORE,
    workers: Annotated[int, Parameter(show_default=False)] = os.cpu_count() or 1,
    force: bool = False,
    model: Repeatable = None,
    target: Repeatable = None,
    task_runner: RunnerName = "threads",
    dask_address: str | None = None,
    prune: bool = False,
    prefect: Literal["auto", "temporary"] = "auto",
    trust_root: TrustRoot = None,
    as_json: Json = False,
) -> int:
    """Compile every model of the fleet spec for every target, and publish.

    Each model is compiled once per target: a pair (model × target). Pairs up to date are
    skipped (with no Prefect run when all are); pairs of a target with a work_pool compile
    on that pool. With no Prefect API (PREFECT_API_URL)
    the run publishes without Prefect and is kept to be recorded by the next compile
    that has one. Progress goes to stderr.

    For example:
      epfleet compile examples/fleet.yaml --store ./epfleet-store
      epfleet compile fleet.yaml --store s3://bucket/fleet --model ocr-det --json
      epfleet compile fleet.yaml --task-runner dask --dask-address tcp://h:8786
      epfleet compile examples/fleet.yaml --prefect temporary  # recorded now

    Exit codes: 0 every pair ok or up to date; 1 a pair failed (the others are
    still published) or the store failed; 2 bad input (nothing compiled).

    Parameters
    ----------
    spec
        The fleet spec YAML.
    workers
        Compiles in parallel (default: the CPU count).
    force
        Recompile pairs that are up to date.
    model
        Only this model (repeatable).
    target
        Only this target (repeatable).
    task_runner
        Where compile tasks run: threads (this machine) or dask (a Dask cluster, the one
        at --dask-address or a local one of --workers processes).
    dask_address
        The Dask scheduler, e.g. tcp://10.0.0.5:8786.
    prune
        Deprecated: after the compile, run epfleet retire --spec SPEC --unlisted (the
        same retirement, with --dry-run to see it first). Then retire from the manifest
        what the spec no longer lists, judged on the whole spec.
    prefect
        The Prefect API that records the run. auto: the server PREFECT_API_URL names;
        without one, a run that needs nothing of Prefect (no work pool, threads) compiles
        and publishes without it, starts no API, and is kept in the worker cache to be
        recorded by the next compile that has one (a work pool's or Dask's run starts
        Prefect's temporary API). temporary: without PREFECT_API_URL, start Prefect's
        temporary API beside the compiles and record this run, and the runs kept before,
        once it answers (seconds of CPU, tens of seconds on a busy machine).
    as_json
        Print one JSON object on stdout.
    """
    from epfleet.fleet.runs.execute import execute_compile
    from epfleet.fleet.views import render_report
    from epfleet.logs import CompileProgress, log_to_stderr
    from epfleet.text import output_width

    log_to_stderr()  # epfleet's warnings as "epfleet: ..." lines, the report alone on stdout
    if not 1 <= workers <= MAX_WORKERS:
        raise BadInputError(f"--workers must be from 1 to {MAX_WORKERS}, got {workers}")
    if dask_address and task_runner != "dask":
        raise BadInputError("--dask-address needs --task-runner dask")
    pin_trust_root(store, trust_root)
    try:
        with interrupts("epfleet: interrupted; compiles stopped, nothing half-published"):
            report = execute_compile(
                spec,
                store=store,
                workers=workers,
                force=force,
                models=model,
                targets=target,
                task_runner=task_runner,
                dask_address=dask_address,
                temporary=prefect == "temporary",
                prefect=_Prefect(),
                started_at=_PROCESS_STARTED,
                show_progress=CompileProgress,
            )
            pruned = _prune(spec, store) if prune else None
    except OSError as exc:  # a full disk: the worker cache or a local store
        if exc.errno not in NO_SPACE:
            raise
        raise EpfleetError(no_room(exc, _disks(store))) from None
    if as_json:
        print(json.dumps(_json_report(report) | ({"pruned": pruned} if prune else {})))
    else:
        print(render_report(report, output_width()))
    return report.exit_code


def _disks(store: str) -> dict[str, Path]:
    """Where a compile writes: the worker cache, and a local store's directory."""
    from epfleet.settings import settings
    from epfleet.stores.local import local_path

    places = {"the worker cache (EPFLEET_CACHE)": settings().cache}
    if "://" not in store or store.startswith("file://"):
        places["the store"] = local_path(store)
    return places


PRUNE_DEPRECATED = (
    "epfleet: --prune is deprecated and will be removed: run epfleet retire --spec {spec} "
    "--unlisted --store {store} after the compile instead (the same retirement; add "
    "--dry-run to see it first)"
)


def _prune(spec: Path, store: str) -> dict[str, object]:
    """Retire what the spec no longer lists (``epfleet retire --spec --unlisted``, which
    replaces ``--prune``); say what went on stderr."""
    from epfleet.formats.spec_file import load_spec
    from epfleet.lifecycle.retire import Retirement, apply_retirement, releases_reported
    from epfleet.stores import MANIFEST_KEY, open_store
    from epfleet.text import format_bytes

    say(PRUNE_DEPRECATED.format(spec=spec, store=store))
    opened = open_store(store)
    if opened.size(MANIFEST_KEY) is None:  # nothing published yet, so nothing to retire
        return Retirement().model_dump(mode="json")
    done = apply_retirement(opened, spec=load_spec(spec), releases=releases_reported(opened))
    for name in done.models:
        say(f"epfleet: pruned model {name} (no longer in the spec)")
    for pair in done.variants:
        say(f"epfleet: pruned variant {pair} (no longer in the spec)")
    for target in done.kept:
        say(
            f"epfleet: kept target {target} (no longer in the spec): devices that reported "
            "within EPFLEET_GC_RETENTION_DAYS still run its runtime's EP release"
        )
    if not done.empty:
        say(
            f"epfleet: {format_bytes(done.bytes)} no longer referenced; epfleet gc collects "
            "it after its grace period"
        )
    return done.model_dump(mode="json")


class _Prefect:
    """The Prefect side of a compile run (``epfleet.fleet.runs.execute.PrefectSide``):
    its API (``epfleet.cli.prefect_api``) and the fleet-compile flow."""

    def api_url_named(self) -> bool:
        return api_url_named()

    def defaults(self) -> AbstractContextManager[None]:
        return prefect_defaults()

    def start_temporary_api(self) -> str | None:
        return start_temporary_api()

    def start_temporary_api_beside(self) -> Future[str | None]:
        return start_temporary_api_beside()

    def run_fleet_flow(
        self,
        plan: RunPlan,
        runner: TaskRunner[Any],
        *,
        spec: Path,
        store: str,
        workers: int,
        force: bool,
        models: list[str] | None,
        targets: list[str] | None,
        done: RunReport | None = None,
        origin: str | None = None,
    ) -> RunReport:
        """The fleet-compile flow run, on ``plan`` (and recording ``done``, a run compiled and
        published already, by this command or by an earlier one, ``origin``, instead of
        compiling)."""
        from epfleet.fleet.planning.plan import HANDED_BY_THIS_COMMAND, handing_over, plan_inputs
        from flows.fleet_compile import fleet_compile

        temporary_api_dies_with_us()
        for name in ("prefect.flow_runs", "prefect.task_runs"):
            logger = logging.getLogger(name)
            if not any(isinstance(f, _NoTracebackOfOurErrors) for f in logger.filters):
                logger.addFilter(_NoTracebackOfOurErrors())
        flow = fleet_compile.with_options(task_runner=runner)
        inputs = plan_inputs(
            spec_path=spec, store_uri=store, models=models, targets=targets, force=force
        )
        with handing_over(plan, inputs, done, origin or HANDED_BY_THIS_COMMAND):
            return flow(
                spec=str(spec.resolve()),
                store=store,
                workers=workers,
                force=force,
                models=models or [],
                targets=targets or [],
            )


class _NoTracebackOfOurErrors(logging.Filter):
    """Prefect logs a run that raised with its traceback; an ``EpfleetError`` (a full
    disk, a store that refuses) says all in its one line, which the run's log keeps."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], EpfleetError):
            record.exc_info, record.exc_text = None, None
        return True


REPORT_FIELDS = [
    *("model", "target", "ep", "status", "compatibility_string", "artifact_uri", "seconds"),
    *("error", "coverage", "verification", "max_rel_error", "verification_seconds"),
    *("samples_origin", "precision", "verification_twin_of", "metric", "folded"),
]
"""Each variant's keys in ``epfleet compile --json`` (a contract: tests/cli/test_cli.py)."""


def _json_report(report: RunReport) -> dict[str, object]:
    return {
        "generation": report.generation,
        "compiled": report.compiled,
        "skipped": report.skipped,
        "failed": report.failed,
        "variants": [{k: getattr(v, k) for k in REPORT_FIELDS} for v in report.variants],
    }


command_help(compile_)
