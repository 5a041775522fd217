"""``epfleet compile``: plan, compile every pair (through Prefect, or without it), publish.

The compiles start in this machine's workers before the flow run (importing Prefect and
starting its temporary API take seconds); the fleet-compile flow then collects them.
With no Prefect API and nothing that needs one, the pairs compile and publish without
Prefect and the run is kept to be recorded later (``epfleet.fleet.runs.kept_runs``); when the
temporary API does not start, they compile and publish without Prefect too.
"""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import Future
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

    from epfleet.fleet.planning.plan import PlanInputs
    from epfleet.fleet.runs.models import RunPlan, RunReport
    from epfleet.logs import CompileProgress
    from epfleet.runtime.compile_pool import CompilePool


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
      epfleet compile fleet.yaml --store s3://bucket/fleet --prune
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
        Then retire from the manifest the models and targets the spec no longer
        lists (as epfleet retire --spec SPEC --unlisted): judged on the whole spec,
        never on a --model/--target subset.
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
    from epfleet.fleet.views import render_report
    from epfleet.logs import log_to_stderr
    from epfleet.text import output_width

    log_to_stderr()  # epfleet's warnings as "epfleet: ..." lines, the report alone on stdout
    if not 1 <= workers <= MAX_WORKERS:
        raise BadInputError(f"--workers must be from 1 to {MAX_WORKERS}, got {workers}")
    if dask_address and task_runner != "dask":
        raise BadInputError("--dask-address needs --task-runner dask")
    pin_trust_root(store, trust_root)
    try:
        with interrupts("epfleet: interrupted; compiles stopped, nothing half-published"):
            report = _compile(
                *(spec, store, workers, force, model, target, task_runner, dask_address),
                temporary=prefect == "temporary",
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


def _prune(spec: Path, store: str) -> dict[str, object]:
    """Retire what the spec no longer lists; say what went on stderr."""
    from datetime import timedelta

    from epfleet.formats.manifest import utcnow
    from epfleet.formats.spec_file import load_spec
    from epfleet.lifecycle.retire import Retirement, apply_retirement, releases_in_use
    from epfleet.settings import settings
    from epfleet.stores import MANIFEST_KEY, open_store
    from epfleet.text import format_bytes

    opened = open_store(store)
    if opened.size(MANIFEST_KEY) is None:  # nothing published yet, so nothing to retire
        return Retirement().model_dump(mode="json")
    since = utcnow() - timedelta(days=settings().gc_retention_days)
    done = apply_retirement(opened, spec=load_spec(spec), releases=releases_in_use(opened, since))
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


def _compile(
    spec: Path,
    store: str,
    workers: int,
    force: bool,
    model: list[str] | None,
    target: list[str] | None,
    task_runner: str,
    dask_address: str | None,
    temporary: bool,
) -> RunReport:
    """Plan, then run the plan the way ``epfleet.fleet.runs.run_way`` chooses: answered from the
    plan, as the fleet-compile flow run, or compiled and published at once without Prefect
    and either kept to be recorded later (no Prefect API) or recorded on the temporary API
    once it answers (``--prefect temporary``)."""
    from epfleet.fleet.build.staging import tidy_cache
    from epfleet.fleet.planning.plan import plan_inputs, plan_run
    from epfleet.fleet.runs.run_way import RunWay, run_way

    say(f"epfleet: planning {spec} against {store}")
    tidy_cache()  # temp files of killed runs, and the cache's size bound
    plan = plan_run(spec, store, model, target, force)
    store_uri = canonical(store)  # what the runs kept for this store are kept under
    _note_runs_kept_before_stores()
    if plan.is_noop:
        for name, note in plan.policy_kept.items():
            say(f"epfleet: model {name}: {note}")
        # Up to date: answer without starting a Prefect flow run (that costs seconds).
        _record_kept_if_an_api(temporary, store_uri)
        return plan.report({}, plan.generation, published=False)
    say(
        f"epfleet: {len(plan.to_compile)} of {len(plan.pairs)} pairs (model × target) to "
        f"compile, {workers} at a time"
    )
    api_named = api_url_named()
    way = run_way(
        up_to_date=False,
        task_runner=task_runner,
        work_pools=any(pair.work_pool for pair in plan.to_compile),
        api_url=api_named,
        temporary=temporary,
    )
    # Prefect's temporary API when this run needs one (unless Dask's run starts it) and
    # the compiles start at once, the API first: it is the slower to come up.
    pool, progress, api = None, None, None
    if task_runner == "threads":
        if way is not RunWay.PLAIN_THEN_KEEP and not api_named:
            say(
                "epfleet: starting Prefect's temporary API to record this run (PREFECT_API_URL "
                "names a server instead); the compiles run meanwhile"
            )
            api = start_temporary_api_beside()
        pool, progress = _prestart(plan, store, workers)
    try:
        args = (spec, store, workers, force, model, target)
        if way is RunWay.PLAIN_THEN_KEEP:
            report = _run_without_prefect(plan, store, workers)
            _keep(plan, report, plan_inputs(spec, store_uri, model, target, force), workers)
            return report
        with prefect_defaults():  # the run's Prefect settings (its flow run's, its API's)
            if way is RunWay.PLAIN_THEN_RECORD:
                assert api is not None
                return _compile_then_record(plan, api, *args)
            problem = _wait_saying_so(api) if api is not None else None
            if problem is not None:
                say(
                    f"epfleet: Prefect's temporary API did not start ({problem}); "
                    "compiling and publishing without Prefect (no flow run, artifacts or "
                    "events recorded)"
                )
                return _run_without_prefect(plan, store, workers)
            if api_named or api is not None:  # (the compiles started run meanwhile)
                _record_kept_runs(store_uri)
            from epfleet.fleet.runs.task_runners import task_runner as make_runner

            return _run_fleet_flow(plan, make_runner(task_runner, dask_address, workers), *args)
    finally:
        if progress is not None:
            progress.close()
        if pool is not None:
            pool.drop_unclaimed()


def _keep(plan: RunPlan, report: RunReport, inputs: PlanInputs, workers: int) -> None:
    """Keep a run published without Prefect to be recorded by a later compile with a
    Prefect API, saying so in one line; a record that cannot be kept costs the run nothing
    but its record."""
    from epfleet.fleet.runs import kept_runs

    try:
        path, dropped = kept_runs.keep(inputs, workers, plan, report)
    except (OSError, ValueError) as exc:
        say(
            f"epfleet: published without Prefect; this run's record was not kept ({exc}), "
            "so no flow run will show it"
        )
        return
    for old in dropped:
        say(
            f"epfleet: dropped the oldest kept run {old.name}, never recorded (at most "
            f"{kept_runs.MAX_KEPT} are kept)"
        )
    say(
        f"epfleet: published without Prefect (no PREFECT_API_URL); this run is kept in "
        f"{path.parent} to be recorded as a fleet-compile flow run by the next compile with "
        "a Prefect API (PREFECT_API_URL set, or --prefect temporary)"
    )


def canonical(store: str) -> str:
    """The store's canonical URI (``file:///abs/dir``, ``s3://bucket/prefix``): the same
    store from any working directory."""
    from epfleet.stores import open_store

    return open_store(store).uri


def _note_runs_kept_before_stores() -> None:
    from epfleet.fleet.runs import kept_runs

    old = kept_runs.from_before_stores()
    if old:
        say(
            f"epfleet: {len(old)} run(s) kept by an earlier epfleet in {old[0].parent} will not "
            "be recorded (their records do not say for sure which store they were compiled "
            f"into); remove them: rm {old[0].parent}/*.json*"
        )


def _record_kept_if_an_api(temporary: bool, store_uri: str) -> None:
    """An up-to-date run: record the kept runs if a Prefect API is at hand (named by
    PREFECT_API_URL, or the temporary one asked for); else say they wait. Nothing at all
    (no Prefect import) when none is kept."""
    from epfleet.fleet.runs import kept_runs

    count = len(kept_runs.pending(store_uri))
    if not count:
        return
    if api_url_named():
        with prefect_defaults():
            _record_kept_runs(store_uri)
        return
    if not temporary:
        say(
            f"epfleet: {count} run(s) kept to be recorded on Prefect (set PREFECT_API_URL, "
            "or add --prefect temporary)"
        )
        return
    say(f"epfleet: starting Prefect's temporary API to record {count} kept run(s)")
    with prefect_defaults():
        problem = start_temporary_api()
        if problem is not None:
            say(
                f"epfleet: Prefect's temporary API did not start ({problem}); {count} run(s) "
                "still kept to be recorded"
            )
            return
        _record_kept_runs(store_uri)


def _record_kept_runs(store_uri: str) -> None:
    """Record each kept run (oldest first) as a fleet-compile flow run on the Prefect API
    at hand, with the artifacts and events of a run that compiled, then remove its file.
    The first that fails to record ends this, in one line: it and the rest stay kept."""
    from epfleet.fleet.runs import kept_runs
    from epfleet.fleet.runs.task_runners import task_runner

    recorded = 0
    for path in kept_runs.pending(store_uri):
        claimed = kept_runs.claim(path)
        if claimed is None:  # another command records it
            continue
        try:
            run = kept_runs.load(claimed)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            kept_runs.release(claimed)
            say(f"epfleet: kept run {path} cannot be read ({exc}); left there")
            continue
        spec, store, models, targets, force = run.inputs
        try:
            _run_fleet_flow(
                *(run.plan, task_runner("threads", None, run.workers), Path(spec), store),
                *(run.workers, force, list(models), list(targets)),
                done=run.report,
                origin=(
                    f"compiled and published by epfleet compile at {run.kept_at} without "
                    "Prefect, kept until a Prefect API was available"
                ),
            )
        except Exception as exc:  # it stays kept: the API may answer next time
            kept_runs.release(claimed)
            left = len(kept_runs.pending(store_uri))
            say(
                f"epfleet: Prefect's API did not record a kept run "
                f"({' '.join(str(exc).split())[:300]}); {left} run(s) still kept"
            )
            break
        claimed.unlink(missing_ok=True)
        recorded += 1
    if recorded:
        say(f"epfleet: recorded {recorded} kept run(s) as fleet-compile flow runs")


def _compile_then_record(
    plan: RunPlan,
    api: Future[str | None],
    spec: Path,
    store: str,
    workers: int,
    force: bool,
    model: list[str] | None,
    target: list[str] | None,
) -> RunReport:
    """Compile and publish now without Prefect while its temporary API (``api``) starts;
    once the run is published and the API answers, a fleet-compile flow run records it
    (its artifacts and events), as if it had compiled it, after the runs kept before."""
    report = _run_without_prefect(plan, store, workers)
    if not api.done():
        say(
            f"epfleet: published (manifest generation {report.generation}); waiting for "
            "Prefect's temporary API to record this run"
        )
    problem = _wait_saying_so(api)
    if problem is not None:
        say(
            f"epfleet: Prefect's temporary API did not start ({problem}); compiled and "
            "published without Prefect (no flow run, artifacts or events recorded)"
        )
        return report
    from epfleet.fleet.runs.task_runners import task_runner

    _record_kept_runs(canonical(store))
    runner = task_runner("threads", None, workers)
    try:
        _run_fleet_flow(plan, runner, spec, store, workers, force, model, target, done=report)
    except Exception as exc:  # the run is published: its record alone is lost
        say(
            f"epfleet: Prefect's temporary API did not record this run "
            f"({' '.join(str(exc).split())[:300]}); it is published all the same"
        )
    return report


def _wait_saying_so(api: Future[str | None]) -> str | None:
    """Wait for the temporary API started beside the compiles (on a busy machine it takes
    tens of seconds): why it did not come up, or None, saying when it answered."""
    started = time.monotonic()
    problem = api.result()
    if problem is None and not api_url_named():
        say(
            f"epfleet: Prefect's temporary API answered ({_started_ago()} s after the "
            f"command started, {time.monotonic() - started:.0f} s waited for)"
        )
    return problem


def _started_ago() -> str:
    """Seconds since this process started."""
    return f"{time.time() - _PROCESS_STARTED:.0f}"


def _prestart(plan: RunPlan, store_uri: str, workers: int) -> tuple[CompilePool, CompileProgress]:
    """Start the compiles before the flow run: importing Prefect and starting its API
    take seconds, and the flow's compile tasks collect these same jobs from the pool.
    Their progress goes to stderr as they run."""
    from epfleet.fleet.build.staging import compile_job_for
    from epfleet.logs import CompileProgress
    from epfleet.runtime.compile_pool import shared_pool
    from epfleet.stores import open_store

    store = open_store(store_uri)
    pool = shared_pool(workers)
    compiles = []
    for pair in plan.to_compile:
        # Pairs of a work pool compile there; those of a runtime, in its environment's pool.
        if pair.work_pool is None and pair.request.runtime is None:
            job = compile_job_for(pair.request, store)
            label = f"{pair.request.model} × {pair.request.target}"
            compiles.append((label, pool.prestart(job)))
    return pool, CompileProgress(compiles)


def _run_without_prefect(plan: RunPlan, store_uri: str, workers: int) -> RunReport:
    """The fleet-compile flow's run (``epfleet.fleet.runs.compile_run``) without Prefect: the
    pairs compile in threads (collecting the compiles started early), then publish as the
    flow does. Pairs of a work pool need Prefect to reach it: they fail, naming the pool."""
    from epfleet.fleet.runs.compile_run import run_compiles
    from epfleet.fleet.runs.plain_runner import PlainRunner
    from epfleet.stores import open_store

    return run_compiles(plan, PlainRunner(open_store(store_uri), workers))


def _run_fleet_flow(
    plan: RunPlan,
    runner: TaskRunner[Any],
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
    inputs = plan_inputs(spec, store, models, targets, force)
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
