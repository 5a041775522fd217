"""The ``epfleet`` command line: one surface for everything an operator runs.

Commands ``compile``, ``manifest show|schema``, ``sync`` (``epfleet.cli_sync``),
``watch`` and ``serve``, and ``--version``; ``epfleet COMMAND --help`` shows each with
examples and exit codes (0 ok, 1 a pair or model failed or the store failed, 2 bad
input). Options come from type hints (cyclopts, ``epfleet.cli_options``). The flow
files run by path (``python flows/runtime_watch.py ...``) call ``main`` with their
command.

Engine code, Prefect and the flows are imported inside each command, never at module
level: ``--help`` starts no Prefect, and the module-level import graph has no cycle
through this module (``tests/test_imports.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from cyclopts import App, CycloptsError, Parameter

from epfleet import MAX_WORKERS, RECIPE_VERSION, __version__, ort_version
from epfleet.cli_options import Json, Repeatable, RunnerName, Store, cli_error, default_text
from epfleet.cli_store import gc, retire
from epfleet.cli_sync import sync
from epfleet.cli_trust import trust_app
from epfleet.errors import BadInputError, EpfleetError
from epfleet.runs import DEFAULT_STORE
from epfleet.settings import describe

if TYPE_CHECKING:
    from prefect.task_runners import TaskRunner

    from epfleet.logs import CompileProgress
    from epfleet.pool import CompilePool
    from epfleet.runs import RunPlan, RunReport

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a Ctrl-C

APP_HELP = """Keep a fleet of devices supplied with ONNX models compiled for the
execution provider each device really has.

For example:
  epfleet compile examples/fleet.yaml --store ./epfleet-store
  epfleet sync --store ./epfleet-store --cache ./epfleet-device
  epfleet COMMAND --help

Exit codes: 0 ok; 1 a pair or a model failed, or the store failed; 2 bad input;
130 interrupted (Ctrl-C).
"""


def _environment() -> str:
    lines = ["Environment (an empty variable counts as unset):"]
    for name, text in describe():
        lines += [
            f"  {name}",
            *textwrap.wrap(text, 76, initial_indent="    ", subsequent_indent="    "),
        ]
    return "\n".join(lines)


app = App(
    name="epfleet",
    help=APP_HELP + "\n" + _environment(),
    help_format="plaintext",
    version=lambda: f"epfleet {__version__} (onnxruntime {ort_version()}, recipe {RECIPE_VERSION})",
    default_parameter=Parameter(negative=(), show_default=default_text),
    suppress_keyboard_interrupt=False,  # main says "interrupted" (cyclopts exits silently)
)
manifest_app = App(name="manifest", help="Inspect the published manifest.")
app.command(manifest_app)
app.command(sync)
app.command(trust_app)
app.command(gc)
app.command(retire)


def main(argv: list[str] | None = None) -> int:
    """Run one command line; return its exit code."""
    try:
        result = app(
            sys.argv[1:] if argv is None else argv,
            exit_on_error=False,
            print_error=False,
            result_action="return_value",
        )
    except CycloptsError as exc:
        print(f"epfleet: error: {cli_error(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BadInputError as exc:
        print(f"epfleet: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except EpfleetError as exc:
        print(f"epfleet: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # our handler's, or a Ctrl-C before it was installed
        _announce(_stop_message)
        return EXIT_INTERRUPTED
    return result if isinstance(result, int) else EXIT_OK


# Ctrl-C (SIGINT) and what it does: kill every worker at once (a worker that dies then
# was killed, not crashed: epfleet.isolated.interrupted), print one line, exit 130. A
# command that runs Prefect exits at once (os._exit): its flow engine, task threads and
# temporary API would otherwise retry, rerun and print tracebacks for minutes. Nothing is
# half-published that way: the manifest is replaced in one compare-and-swap (a rename
# or a conditional PUT), so it is either the old one or the new one; temp files left
# behind are removed by a later run. A plain `epfleet sync` unwinds instead (locks and
# temp files released by their `finally`), with a deadline. A second Ctrl-C exits at once.
_stopping = threading.Event()
_announced = threading.Lock()
_stop_message = "epfleet: interrupted"
UNWIND_SECONDS = 5.0


def _announce(message: str) -> None:
    if _announced.acquire(blocking=False):
        os.write(2, f"{message}\n".encode())  # not print: the handler may interrupt a print


def _exit_interrupted(message: str) -> None:
    from epfleet.isolated import release_semaphores

    release_semaphores()
    _announce(message)
    os._exit(EXIT_INTERRUPTED)


def _kill_prefect_server() -> None:
    server = sys.modules.get("prefect.server.api.server")
    if server is None:
        return
    try:
        for instance in list(server.SubprocessASGIServer._instances.values()):
            process = instance.server_process
            if process is not None:
                process.kill()
    except Exception:  # best effort: it is Prefect's
        pass


@contextmanager
def _interrupts(message: str, *, unwind: bool = False) -> Iterator[None]:
    """Handle Ctrl-C as above while the block runs (in the main thread only)."""
    global _stop_message
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if _stopping.is_set():
            _exit_interrupted(message)
        _stopping.set()
        from epfleet.isolated import kill_workers

        kill_workers()
        _kill_prefect_server()
        if not unwind:
            _exit_interrupted(message)
        deadline = threading.Timer(UNWIND_SECONDS, _exit_interrupted, (message,))
        deadline.daemon = True
        deadline.start()
        raise KeyboardInterrupt

    _stop_message = message
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@app.default
def _no_command(*unknown: str) -> int:
    what = f"unknown command {unknown[0]!r}" if unknown else "a command is required"
    print(f"epfleet: error: {what} (epfleet --help)", file=sys.stderr)
    return EXIT_BAD_INPUT


@manifest_app.default
def _no_manifest_command(*unknown: str) -> int:
    what = f"unknown command 'manifest {unknown[0]}'" if unknown else "manifest needs a command"
    print(f"epfleet: error: {what}: show or schema", file=sys.stderr)
    return EXIT_BAD_INPUT


@app.command(name="compile")
def compile_(
    spec: Path,
    /,
    *,
    store: Store = DEFAULT_STORE,
    workers: int = os.cpu_count() or 1,
    force: bool = False,
    model: Repeatable = None,
    target: Repeatable = None,
    task_runner: RunnerName = "threads",
    dask_address: str | None = None,
    as_json: Json = False,
) -> int:
    """Compile every model of the fleet spec for every target, and publish.

    Pairs up to date are skipped (with no Prefect run when all are); pairs of a
    target with a work_pool compile on that pool. Progress goes to stderr.

    For example:
      epfleet compile examples/fleet.yaml --store ./epfleet-store
      epfleet compile fleet.yaml --store s3://bucket/fleet --model ocr-det --json
      epfleet compile fleet.yaml --task-runner dask --dask-address tcp://h:8786

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
        Where compile tasks run: threads (this machine) or dask (a Dask cluster:
        --dask-address, or a local one of --workers processes).
    dask_address
        The Dask scheduler, e.g. tcp://10.0.0.5:8786.
    as_json
        Print one JSON object on stdout.
    """
    from epfleet.report import render_report

    if not 1 <= workers <= MAX_WORKERS:
        raise BadInputError(f"--workers must be from 1 to {MAX_WORKERS}, got {workers}")
    if dask_address and task_runner != "dask":
        raise BadInputError("--dask-address needs --task-runner dask")
    with _interrupts("epfleet: interrupted; compiles stopped, nothing half-published"):
        report = _compile(spec, store, workers, force, model, target, task_runner, dask_address)
    print(json.dumps(_json_report(report)) if as_json else render_report(report))
    return report.exit_code


def _compile(
    spec: Path,
    store: str,
    workers: int,
    force: bool,
    model: list[str] | None,
    target: list[str] | None,
    task_runner: str,
    dask_address: str | None,
) -> RunReport:
    from epfleet.planning import plan_run
    from epfleet.runners import task_runner as make_runner
    from epfleet.staging import tidy_cache

    tidy_cache()  # temp files of killed runs, and the cache's size bound
    plan = plan_run(spec, store, model, target, force)
    if plan.is_noop:
        # Up to date: answer without starting a Prefect flow run (that costs seconds).
        report = plan.report({}, plan.generation, published=False)
    else:
        print(
            f"epfleet: {len(plan.to_compile)} of {len(plan.pairs)} pairs to compile "
            f"with {workers} workers",
            file=sys.stderr,
        )
        # Compiles start at once in this machine's workers, unless Dask runs them.
        pool, progress = None, None
        if task_runner == "threads":
            pool, progress = _prestart(plan, store, workers)
        try:
            problem = _start_temporary_api() if task_runner == "threads" else None
            if problem is None:
                runner = make_runner(task_runner, dask_address, workers)
                report = _run_fleet_flow(runner, spec, store, workers, force, model, target)
            else:
                print(
                    f"epfleet: Prefect's temporary API did not start ({problem}); "
                    "compiling and publishing without Prefect (no flow run, artifacts or "
                    "events recorded)",
                    file=sys.stderr,
                )
                report = _run_without_prefect(plan, store, workers)
        finally:
            if progress is not None:
                progress.close()
            if pool is not None:
                pool.drop_unclaimed()
    return report


def _prestart(plan: RunPlan, store_uri: str, workers: int) -> tuple[CompilePool, CompileProgress]:
    """Start the compiles before the flow run: importing Prefect and starting its API
    take seconds, and the flow's compile tasks collect these same jobs from the pool.
    Their progress goes to stderr as they run."""
    from epfleet.logs import CompileProgress
    from epfleet.pool import shared_pool
    from epfleet.staging import compile_job_for
    from epfleet.stores import open_store

    store = open_store(store_uri)
    pool = shared_pool(workers)
    compiles = []
    for pair in plan.to_compile:
        if pair.work_pool is None:  # the others compile on their work pool
            job = compile_job_for(pair.request, store)
            pool.prestart(job)
            label = f"{pair.request.model} × {pair.request.target}"
            compiles.append((label, pool._early[job.model_dump_json()]))
    return pool, CompileProgress(compiles)


def _start_temporary_api() -> str | None:
    """Start Prefect's temporary API now (none when PREFECT_API_URL names a server), while
    the compiles run: why it did not come up within its start-up time, or None. The flow
    run then uses this same server."""
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from prefect.settings import get_current_settings

    _quiet_prefect_console()
    if get_current_settings().api.url:
        return None
    _temporary_api_dies_with_us()
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    try:
        server.start()
    except Exception as exc:  # Prefect's: a RuntimeError after its start-up timeout
        if server.server_process is not None:
            server.server_process.kill()  # a slow one may still be starting
        first = str(exc).split(" stdout:")[0].strip().rstrip(".") or type(exc).__name__
        logged = _temporary_api_error()
        return f"{first}: {logged}" if logged else first
    return None


def _quiet_prefect_console() -> None:
    """Keep Prefect's INFO lines (each task run's, the temporary server's) off the
    terminal; they still reach the API's run logs."""
    import logging

    from prefect.logging.configuration import setup_logging
    from prefect.logging.handlers import PrefectConsoleHandler

    setup_logging()
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, PrefectConsoleHandler):
                handler.setLevel(logging.WARNING)


def _run_without_prefect(plan: RunPlan, store_uri: str, workers: int) -> RunReport:
    """The fleet-compile flow's work without Prefect: compile every pair (collecting the
    compiles started early), then publish as the flow does. Pairs of a work pool need
    Prefect to reach it: they fail, naming the pool."""
    from concurrent.futures import ThreadPoolExecutor

    from epfleet.build import build_variant
    from epfleet.outcomes import PairOutcome, failed_outcome, ok_outcome
    from epfleet.plan import PlannedPair
    from epfleet.publish_rules import settle, to_publish
    from epfleet.publishing import publish
    from epfleet.stores import open_store

    store = open_store(store_uri)

    def build(pair: PlannedPair) -> PairOutcome:
        if pair.work_pool is not None:
            return failed_outcome(
                pair.request,
                f"not compiled: work pool {pair.work_pool} is reached through "
                "Prefect, whose API did not start",
            )
        try:
            return ok_outcome(pair.request, build_variant(pair.request, store, workers))
        except Exception as exc:  # one pair's failure never stops the others
            return failed_outcome(pair.request, str(exc))

    with ThreadPoolExecutor(max(1, min(len(plan.to_compile), 4 * workers))) as threads:
        outcomes = list(threads.map(build, plan.to_compile))
    variants = {(m, t): entry for m, t, entry in to_publish(plan, outcomes)}
    published = publish(store, plan.sources, plan.published_sources, variants, plan.samples)
    report, refused = settle(plan, outcomes, published)
    for result in refused:
        print(f"epfleet: {result.model} × {result.target}: {result.error}", file=sys.stderr)
    return report


def _run_fleet_flow(
    runner: TaskRunner[Any],
    spec: Path,
    store: str,
    workers: int,
    force: bool,
    models: list[str] | None,
    targets: list[str] | None,
) -> RunReport:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.fleet_compile import fleet_compile

    _temporary_api_dies_with_us()
    flow = fleet_compile.with_options(task_runner=runner)
    return flow(
        spec=str(spec.resolve()),
        store=store,
        workers=workers,
        force=force,
        models=models,
        targets=targets,
    )


# Run by the temporary API's process before it becomes uvicorn: die with this process.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "try: ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"  # PR_SET_PDEATHSIG
    "except (OSError, AttributeError): pass\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # a Ctrl-C is ours; we kill it
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})\n"  # one pending: discarded
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class _PopenDyingWithUs:
    """Stands in for the ``subprocess`` module in Prefect's server module: its Popen
    starts the temporary API through ``_DIE_WITH_PARENT``, from epfleet's spawner thread
    (PR_SET_PDEATHSIG follows the thread that started a process)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        from epfleet.isolated import spawn

        wrapped = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *args]
        if kwargs.get("stdout") is None and kwargs.get("stderr") is None:
            # Its log lines (a start-up traceback) go to a file, not into our output.
            kwargs["stdout"] = kwargs["stderr"] = _temporary_api_log()

        def start() -> subprocess.Popen[Any]:
            # Started with SIGINT blocked: a terminal's Ctrl-C while the stub imports
            # stays pending until it ignores SIGINT (else a KeyboardInterrupt traceback).
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                return subprocess.Popen(wrapped, **kwargs)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

        return spawn(start)


_api_log: Any = None


def _temporary_api_log() -> Any:
    global _api_log
    if _api_log is None:
        import tempfile

        _api_log = tempfile.TemporaryFile()  # noqa: SIM115 (read back on failure)
    return _api_log


def _temporary_api_error() -> str | None:
    """The last error line the temporary API logged, if any."""
    if _api_log is None:
        return None
    _api_log.seek(0)
    lines = _api_log.read()[-65536:].decode(errors="replace").splitlines()
    errors = [line.strip() for line in lines if "Error" in line and not line.startswith(" ")]
    return errors[-1] if errors else None


def _temporary_api_dies_with_us() -> None:
    """On Linux, make Prefect's temporary API server (``SubprocessASGIServer`` runs
    ``python -m uvicorn`` with ``subprocess.Popen``) die when this process is killed.
    Best effort: skipped with a real API (PREFECT_API_URL) or where Prefect changed."""
    if not sys.platform.startswith("linux"):
        return
    from prefect.settings import get_current_settings

    if get_current_settings().api.url:
        return
    try:
        from prefect.server.api import server as prefect_server
    except ImportError:
        return
    if isinstance(getattr(prefect_server, "subprocess", None), type(subprocess)):
        prefect_server.subprocess = _PopenDyingWithUs()  # type: ignore[assignment]


REPORT_FIELDS = [
    *("model", "target", "ep", "status", "compatibility_string", "artifact_uri", "seconds"),
    *("error", "coverage", "verification", "max_rel_error", "verification_seconds"),
]
"""Each variant's keys in ``epfleet compile --json`` (a contract: tests/test_cli.py)."""


def _json_report(report: RunReport) -> dict[str, object]:
    return {
        "generation": report.generation,
        "compiled": report.compiled,
        "skipped": report.skipped,
        "failed": report.failed,
        "variants": [{k: getattr(v, k) for k in REPORT_FIELDS} for v in report.variants],
    }


@manifest_app.command
def show(*, store: Store = DEFAULT_STORE, as_json: Json = False, costs: bool = False) -> int:
    """Print the published manifest as a table, with what the store holds per model and
    target, or as JSON.

    For example:
      epfleet manifest show --store s3://bucket/fleet
      epfleet manifest show --store ./epfleet-store --json
      epfleet manifest show --store ./epfleet-store --json --costs

    Exit codes: 0 shown; 1 the store failed; 2 no manifest there.

    Parameters
    ----------
    as_json
        Print the manifest document itself.
    costs
        With --json: print the store's bytes per model and target, and its total
        (referenced, unreferenced, other), instead of the manifest.
    """
    from epfleet.costs import cost_table
    from epfleet.costs import costs as store_costs
    from epfleet.publishing import read_manifest
    from epfleet.report import render_manifest
    from epfleet.stores import open_store

    opened = open_store(store)
    manifest, _ = read_manifest(opened)
    if manifest is None:
        raise BadInputError(f"no manifest at {store}/manifest.json: run epfleet compile first")
    if as_json and costs:
        sys.stdout.write(store_costs(opened, manifest).model_dump_json(indent=2) + "\n")
    elif as_json:
        sys.stdout.write(manifest.to_json().decode())
    else:
        print(render_manifest(manifest, store))
        print()
        print(cost_table(opened, manifest))
    return EXIT_OK


@manifest_app.command
def schema() -> int:
    """Print the manifest's JSON Schema.

    For example:
      epfleet manifest schema > manifest.schema.json
    """
    from epfleet.manifest import json_schema

    sys.stdout.write(json_schema())
    return EXIT_OK


@app.command
def watch(
    spec: str,
    /,
    *,
    store: Store = DEFAULT_STORE,
    dry_run: bool = False,
    compile_deployment: str | None = None,
    report_max_age_days: int | None = None,
    as_json: Json = False,
) -> int:
    """Run the runtime-watch flow once: compare the ORT and EP versions here with
    those each published variant was compiled with, read the device reports for
    unserved devices, and start fleet-compile for stale or missing pairs.

    For example:
      epfleet watch examples/fleet.yaml --store ./epfleet-store --dry-run
      epfleet watch fleet.yaml --store s3://bucket/fleet --report-max-age-days 7

    Exit codes: 0 watched; 2 bad input.

    Parameters
    ----------
    spec
        The fleet spec YAML (relative to the working directory).
    dry_run
        Report only: start nothing, emit no event, remove nothing.
    compile_deployment
        The deployment started for stale or missing pairs (default: the flow's,
        fleet-compile/on-demand).
    report_max_age_days
        Ignore device reports older than this (default: the flow's, 30).
    as_json
        Print the watch plan as JSON.
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.runtime_watch import runtime_watch

    given = {"compile_deployment": compile_deployment, "report_max_age_days": report_max_age_days}
    parameters: dict[str, Any] = {"spec": spec, "store": store, "trigger": not dry_run}
    parameters |= {name: value for name, value in given.items() if value is not None}
    _check_flow_parameters(runtime_watch, parameters)
    plan = runtime_watch(**parameters)
    if as_json:
        print(plan.model_dump_json())
        return EXIT_OK
    print(f"{'model':24} {'target':20} {'status':8} why")
    for pair in plan.pairs:
        print(f"{pair.model:24} {pair.target:20} {pair.status:8} {pair.reason}")
    for profile in plan.unserved:
        print(f"unserved: {', '.join(profile.devices)} ({profile.label}): {profile.models}")
    return EXIT_OK


def _check_flow_parameters(flow: Any, parameters: dict[str, Any]) -> None:
    """Validate with the flow's own parameter model, before a run of it starts."""
    from prefect.exceptions import ParameterTypeError

    try:
        flow.validate_parameters(parameters)
    except ParameterTypeError as exc:
        raise BadInputError(str(exc)) from None


@app.command
def serve(
    *,
    spec: Path = Path("examples/fleet.yaml"),
    store: Store = DEFAULT_STORE,
    cache: Path = Path("epfleet-device"),
    nightly: str = "0 2 * * *",
    sync_every: float = 900,
    watch_every: float = 3600,
) -> int:
    """Serve fleet-compile/nightly and /on-demand, runtime-watch/hourly and
    device-sync/periodic from this process, without a work pool.

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
        Seconds between runtime watches.
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from deployments.serve import serve_all

    serve_all(spec, store, cache, nightly, sync_every, watch_every)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
