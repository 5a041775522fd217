"""How one ``epfleet compile`` run executes: plan, then run the plan the way ``run_way``
chooses, starting the compiles in this machine's workers before any flow run (importing
Prefect and starting its temporary API take seconds; the fleet-compile flow then
collects them).

With no Prefect API and nothing that needs one, the pairs compile and publish without
Prefect and the run is kept to be recorded later (``kept_runs``); when the temporary API
does not start, they compile and publish without Prefect too. Progress is logged
(``logger``), and the command line shows it.

The Prefect side (its API, its settings, the fleet-compile flow) is the caller's
(``PrefectSide``): the fleet package does not import the flows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

Compiles = list[tuple[str, Future[Any]]]
"""The compiles started early, each with its label (``model × target``)."""

if TYPE_CHECKING:
    from prefect.task_runners import TaskRunner

    from epfleet.fleet.planning.plan import PlanInputs
    from epfleet.fleet.runs.models import RunPlan, RunReport
    from epfleet.runtime.compile_pool import CompilePool


logger = logging.getLogger(__name__)
"""A run's progress: ``epfleet compile`` shows it on stderr (``epfleet.logs.log_to_stderr``)."""


class ProgressView(Protocol):
    """What shows the compiles' progress as they run (the command line's
    ``epfleet.logs.CompileProgress``); closed when the run ends."""

    def close(self) -> None: ...


class PrefectSide(Protocol):
    """What a run needs of Prefect: its API, its settings, and the fleet-compile flow."""

    def api_url_named(self) -> bool:
        """PREFECT_API_URL names a Prefect server."""
        ...

    def defaults(self) -> AbstractContextManager[None]:
        """epfleet's defaults for Prefect's settings, in force within."""
        ...

    def start_temporary_api(self) -> str | None:
        """Start Prefect's temporary API and wait for it: why it did not come up, or None."""
        ...

    def start_temporary_api_beside(self) -> Future[str | None]:
        """Start Prefect's temporary API without waiting: why it did not come up, or None."""
        ...

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
        """The fleet-compile flow run on ``plan`` (recording ``done``, a run published
        already, ``origin`` saying by whom, instead of compiling)."""
        ...


def execute_compile(
    spec: Path,
    *,
    store: str,
    workers: int,
    force: bool,
    models: list[str] | None,
    targets: list[str] | None,
    task_runner: str,
    dask_address: str | None,
    temporary: bool,
    prefect: PrefectSide,
    started_at: float,
    show_progress: Callable[[Compiles], ProgressView] | None = None,
) -> RunReport:
    """Plan, then run the plan the way ``epfleet.fleet.runs.run_way`` chooses: answered from
    the plan, as the fleet-compile flow run, or compiled and published at once without
    Prefect and either kept to be recorded later (no Prefect API) or recorded on the
    temporary API once it answers (``temporary``). ``started_at``: when the command
    started (``time.time()``), to say how long the temporary API took; ``show_progress``:
    what shows the compiles started early as they run (the caller's rendering)."""
    from epfleet.fleet.build.staging import tidy_cache
    from epfleet.fleet.planning.plan import plan_inputs, plan_run
    from epfleet.fleet.runs.run_way import RunWay, run_way

    logger.info(f"planning {spec} against {store}")
    tidy_cache()  # temp files of killed runs, and the cache's size bound
    plan = plan_run(spec, store, models=models, targets=targets, force=force)
    store_uri = canonical(store)  # what the runs kept for this store are kept under
    _note_runs_kept_before_stores()
    if plan.is_noop:
        for name, note in plan.policy_kept.items():
            logger.info(f"model {name}: {note}")
        # Up to date: answer without starting a Prefect flow run (that costs seconds).
        _record_kept_if_an_api(prefect, temporary=temporary, store_uri=store_uri)
        return plan.report({}, plan.generation, published=False)
    logger.info(
        f"{len(plan.to_compile)} of {len(plan.pairs)} pairs (model × target) to "
        f"compile, {workers} at a time"
    )
    api_named = prefect.api_url_named()
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
            logger.info(
                "starting Prefect's temporary API to record this run (PREFECT_API_URL "
                "names a server instead); the compiles run meanwhile"
            )
            api = prefect.start_temporary_api_beside()
        pool, compiles = _prestart(plan, store, workers)
        progress = show_progress(compiles) if show_progress is not None else None
    try:
        if way is RunWay.PLAIN_THEN_KEEP:
            report = run_without_prefect(plan, store, workers)
            inputs = plan_inputs(
                spec_path=spec, store_uri=store_uri, models=models, targets=targets, force=force
            )
            _keep(plan, report, inputs=inputs, workers=workers)
            return report
        with prefect.defaults():  # the run's Prefect settings (its flow run's, its API's)
            if way is RunWay.PLAIN_THEN_RECORD:
                assert api is not None
                return _compile_then_record(
                    plan,
                    api,
                    prefect=prefect,
                    started_at=started_at,
                    spec=spec,
                    store=store,
                    workers=workers,
                    force=force,
                    models=models,
                    targets=targets,
                )
            problem = _wait_saying_so(api, prefect, started_at) if api is not None else None
            if problem is not None:
                logger.warning(
                    f"Prefect's temporary API did not start ({problem}); "
                    "compiling and publishing without Prefect (no flow run, artifacts or "
                    "events recorded)"
                )
                return run_without_prefect(plan, store, workers)
            if api_named or api is not None:  # (the compiles started run meanwhile)
                _record_kept_runs(prefect, store_uri)
            from epfleet.fleet.runs.task_runners import task_runner as make_runner

            runner = make_runner(task_runner, dask_address, workers)
            return prefect.run_fleet_flow(
                plan,
                runner,
                spec=spec,
                store=store,
                workers=workers,
                force=force,
                models=models,
                targets=targets,
            )
    finally:
        if progress is not None:
            progress.close()
        if pool is not None:
            pool.drop_unclaimed()


def _keep(plan: RunPlan, report: RunReport, *, inputs: PlanInputs, workers: int) -> None:
    """Keep a run published without Prefect to be recorded by a later compile with a
    Prefect API, saying so in one line; a record that cannot be kept costs the run nothing
    but its record."""
    from epfleet.fleet.runs import kept_runs

    try:
        path, dropped = kept_runs.keep(inputs=inputs, workers=workers, plan=plan, report=report)
    except (OSError, ValueError) as exc:
        logger.warning(
            f"published without Prefect; this run's record was not kept ({exc}), "
            "so no flow run will show it"
        )
        return
    for old in dropped:
        logger.info(
            f"dropped the oldest kept run {old.name}, never recorded (at most "
            f"{kept_runs.MAX_KEPT} are kept)"
        )
    logger.info(
        f"published without Prefect (no PREFECT_API_URL); this run is kept in "
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
        logger.info(
            f"{len(old)} run(s) kept by an earlier epfleet in {old[0].parent} will not "
            "be recorded (their records do not say for sure which store they were compiled "
            f"into); remove them: rm {old[0].parent}/*.json*"
        )


def _record_kept_if_an_api(prefect: PrefectSide, *, temporary: bool, store_uri: str) -> None:
    """An up-to-date run: record the kept runs if a Prefect API is at hand (named by
    PREFECT_API_URL, or the temporary one asked for); else say they wait. Nothing at all
    (no Prefect import) when none is kept."""
    from epfleet.fleet.runs import kept_runs

    count = len(kept_runs.pending(store_uri))
    if not count:
        return
    if prefect.api_url_named():
        with prefect.defaults():
            _record_kept_runs(prefect, store_uri)
        return
    if not temporary:
        logger.info(
            f"{count} run(s) kept to be recorded on Prefect (set PREFECT_API_URL, "
            "or add --prefect temporary)"
        )
        return
    logger.info(f"starting Prefect's temporary API to record {count} kept run(s)")
    with prefect.defaults():
        problem = prefect.start_temporary_api()
        if problem is not None:
            logger.warning(
                f"Prefect's temporary API did not start ({problem}); {count} run(s) "
                "still kept to be recorded"
            )
            return
        _record_kept_runs(prefect, store_uri)


def _record_kept_runs(prefect: PrefectSide, store_uri: str) -> None:
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
            logger.warning(f"kept run {path} cannot be read ({exc}); left there")
            continue
        spec, store, models, targets, force = run.inputs
        try:
            prefect.run_fleet_flow(
                run.plan,
                task_runner("threads", None, run.workers),
                spec=Path(spec),
                store=store,
                workers=run.workers,
                force=force,
                models=list(models),
                targets=list(targets),
                done=run.report,
                origin=(
                    f"compiled and published by epfleet compile at {run.kept_at} without "
                    "Prefect, kept until a Prefect API was available"
                ),
            )
        except Exception as exc:  # it stays kept: the API may answer next time
            kept_runs.release(claimed)
            left = len(kept_runs.pending(store_uri))
            logger.warning(
                f"Prefect's API did not record a kept run "
                f"({' '.join(str(exc).split())[:300]}); {left} run(s) still kept"
            )
            break
        claimed.unlink(missing_ok=True)
        recorded += 1
    if recorded:
        logger.info(f"recorded {recorded} kept run(s) as fleet-compile flow runs")


def _compile_then_record(
    plan: RunPlan,
    api: Future[str | None],
    *,
    prefect: PrefectSide,
    started_at: float,
    spec: Path,
    store: str,
    workers: int,
    force: bool,
    models: list[str] | None,
    targets: list[str] | None,
) -> RunReport:
    """Compile and publish now without Prefect while its temporary API (``api``) starts;
    once the run is published and the API answers, a fleet-compile flow run records it
    (its artifacts and events), as if it had compiled it, after the runs kept before."""
    report = run_without_prefect(plan, store, workers)
    if not api.done():
        logger.info(
            f"published (manifest generation {report.generation}); waiting for "
            "Prefect's temporary API to record this run"
        )
    problem = _wait_saying_so(api, prefect, started_at)
    if problem is not None:
        logger.warning(
            f"Prefect's temporary API did not start ({problem}); compiled and "
            "published without Prefect (no flow run, artifacts or events recorded)"
        )
        return report
    from epfleet.fleet.runs.task_runners import task_runner

    _record_kept_runs(prefect, canonical(store))
    runner = task_runner("threads", None, workers)
    try:
        prefect.run_fleet_flow(
            plan,
            runner,
            spec=spec,
            store=store,
            workers=workers,
            force=force,
            models=models,
            targets=targets,
            done=report,
        )
    except Exception as exc:  # the run is published: its record alone is lost
        logger.warning(
            f"Prefect's temporary API did not record this run "
            f"({' '.join(str(exc).split())[:300]}); it is published all the same"
        )
    return report


def _wait_saying_so(api: Future[str | None], prefect: PrefectSide, started_at: float) -> str | None:
    """Wait for the temporary API started beside the compiles (on a busy machine it takes
    tens of seconds): why it did not come up, or None, saying when it answered."""
    started = time.monotonic()
    problem = api.result()
    if problem is None and not prefect.api_url_named():
        logger.info(
            f"Prefect's temporary API answered ({time.time() - started_at:.0f} s "
            f"after the command started, {time.monotonic() - started:.0f} s waited for)"
        )
    return problem


def _prestart(plan: RunPlan, store_uri: str, workers: int) -> tuple[CompilePool, Compiles]:
    """Start the compiles before the flow run: importing Prefect and starting its API
    take seconds, and the flow's compile tasks collect these same jobs from the pool.
    Returns them labelled, for the caller to show their progress."""
    from epfleet.fleet.build.staging import compile_job_for
    from epfleet.runtime.compile_pool import shared_pool
    from epfleet.stores import open_store

    store = open_store(store_uri)
    pool = shared_pool(workers)
    compiles: Compiles = []
    for pair in plan.to_compile:
        # Pairs of a work pool compile there; those of a runtime, in its environment's pool.
        if pair.work_pool is None and pair.request.runtime is None:
            job = compile_job_for(pair.request, store)
            label = f"{pair.request.model} × {pair.request.target}"
            compiles.append((label, pool.prestart(job)))
    return pool, compiles


def run_without_prefect(plan: RunPlan, store_uri: str, workers: int) -> RunReport:
    """The fleet-compile flow's run (``epfleet.fleet.runs.compile_run``) without Prefect: the
    pairs compile in threads (collecting the compiles started early), then publish as the
    flow does. Pairs of a work pool need Prefect to reach it: they fail, naming the pool."""
    from epfleet.fleet.runs.compile_run import run_compiles
    from epfleet.fleet.runs.plain_runner import PlainRunner
    from epfleet.stores import open_store

    return run_compiles(plan, PlainRunner(open_store(store_uri), workers))
