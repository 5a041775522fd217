"""The ``epfleet`` command line.

    epfleet compile SPEC --store URI [--workers N] [--force] [--model M ...]
                    [--target T ...] [--task-runner threads|dask [--dask-address A]]
                    [--json]
    epfleet manifest show --store URI [--json]
    epfleet manifest schema
    epfleet sync --store URI --cache DIR [--model NAME ...] [--no-recompile]
                 [--prefer npu,gpu,cpu] [--device-id ID] [--verify] [--json]

Exit codes: compile: 0 every pair ok or up to date; 1 a pair failed (the rest
still published) or the store failed. sync: 0 every wanted model kept,
downloaded or recompiled; 1 one fell back or failed. 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from epfleet import MAX_WORKERS
from epfleet.errors import BadInputError, EpfleetError

if TYPE_CHECKING:
    from prefect.task_runners import TaskRunner

    from epfleet.pool import CompilePool
    from epfleet.runs import RunPlan, RunReport

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    from epfleet.runners import TASK_RUNNERS
    from epfleet.runs import DEFAULT_STORE

    parser = argparse.ArgumentParser(prog="epfleet", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    compile_ = commands.add_parser("compile", help="compile every model for every target, publish")
    compile_.add_argument("spec", type=Path, help="fleet spec YAML")
    compile_.add_argument(
        "--store",
        default=DEFAULT_STORE,
        help=f"directory, file:///abs/dir or s3://bucket/prefix (default {DEFAULT_STORE})",
    )
    compile_.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="compiles in parallel (default: the CPU count)",
    )
    compile_.add_argument("--force", action="store_true", help="recompile up-to-date pairs")
    compile_.add_argument(
        "--model",
        action="append",
        dest="models",
        metavar="NAME",
        help="only this model (repeatable)",
    )
    compile_.add_argument(
        "--target",
        action="append",
        dest="targets",
        metavar="NAME",
        help="only this target (repeatable)",
    )
    compile_.add_argument(
        "--task-runner",
        default="threads",
        choices=sorted(TASK_RUNNERS),
        help="where compile tasks run: threads (this machine, default) or dask "
        "(a Dask cluster: --dask-address, or a local one of --workers processes)",
    )
    compile_.add_argument(
        "--dask-address", metavar="ADDR", help="Dask scheduler, e.g. tcp://10.0.0.5:8786"
    )
    compile_.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    manifest = commands.add_parser("manifest", help="inspect the published manifest")
    manifest_commands = manifest.add_subparsers(dest="manifest_command", required=True)
    show = manifest_commands.add_parser("show", help="print the manifest as a table or JSON")
    show.add_argument("--store", default=DEFAULT_STORE)
    show.add_argument("--json", action="store_true")
    manifest_commands.add_parser("schema", help="print the manifest's JSON Schema")

    sync = commands.add_parser(
        "sync",
        help="on a device: judge the published variants here, then keep, download, "
        "recompile or fall back",
    )
    sync.add_argument("--store", default=DEFAULT_STORE, help="the fleet's store URI")
    sync.add_argument(
        "--cache", type=Path, required=True, help="device cache directory (an ORT model package)"
    )
    sync.add_argument(
        "--model", action="append", dest="models", metavar="NAME", help="only this model"
    )
    sync.add_argument(
        "--no-recompile",
        action="store_false",
        dest="recompile",
        help="never compile on this device",
    )
    sync.add_argument(
        "--prefer",
        default="npu,gpu,cpu",
        help="device types in order of preference (default npu,gpu,cpu)",
    )
    sync.add_argument(
        "--device-id", help="this device's id in reports (default $EPFLEET_DEVICE_ID or hostname)"
    )
    sync.add_argument(
        "--verify",
        action="store_true",
        help="re-hash the active files (default: trust size and mtime as activated)",
    )
    sync.add_argument("--json", action="store_true", help="print the device report as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "compile":
            return _compile(args)
        if args.command == "sync":
            return _sync(args)
        if args.manifest_command == "schema":
            from epfleet.manifest import json_schema

            sys.stdout.write(json_schema())
            return EXIT_OK
        return _show(args)
    except BadInputError as exc:
        print(f"epfleet: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except EpfleetError as exc:
        print(f"epfleet: {exc}", file=sys.stderr)
        return EXIT_FAILED


def _compile(args: argparse.Namespace) -> int:
    from epfleet.planning import plan_run
    from epfleet.report import render_report
    from epfleet.runners import task_runner

    if not 1 <= args.workers <= MAX_WORKERS:
        raise BadInputError(f"--workers must be from 1 to {MAX_WORKERS}, got {args.workers}")
    if args.dask_address and args.task_runner != "dask":
        raise BadInputError("--dask-address needs --task-runner dask")
    plan = plan_run(args.spec, args.store, args.models, args.targets, args.force)
    if plan.is_noop:
        # Up to date: answer without starting a Prefect flow run (that costs seconds).
        report = plan.report({}, plan.generation, published=False)
    else:
        print(
            f"epfleet: {len(plan.to_compile)} of {len(plan.pairs)} pairs to compile "
            f"with {args.workers} workers",
            file=sys.stderr,
        )
        # Compiles start at once in this machine's workers, unless Dask runs them.
        pool = _prestart(plan, args.store, args.workers) if args.task_runner == "threads" else None
        try:
            report = _run_flow(args, task_runner(args.task_runner, args.dask_address, args.workers))
        finally:
            if pool is not None:
                pool.drop_unclaimed()
    if args.json:
        print(json.dumps(_json_report(report)))
    else:
        print(render_report(report))
    return report.exit_code


def _prestart(plan: RunPlan, store_uri: str, workers: int) -> CompilePool:
    """Start the compiles before the flow run: importing Prefect and starting its API take
    seconds, and the flow's compile tasks collect these same jobs from the shared pool."""
    from epfleet.pool import shared_pool
    from epfleet.staging import compile_job_for
    from epfleet.stores import open_store

    store = open_store(store_uri)
    pool = shared_pool(workers)
    for pair in plan.to_compile:
        if pair.work_pool is None:  # the others compile on their work pool
            pool.prestart(compile_job_for(pair.request, store))
    return pool


def _run_flow(args: argparse.Namespace, runner: TaskRunner[Any]) -> RunReport:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from flows.fleet_compile import fleet_compile

    flow = fleet_compile.with_options(task_runner=runner)
    return flow(
        spec=str(args.spec.resolve()),
        store=args.store,
        workers=args.workers,
        force=args.force,
        models=args.models,
        targets=args.targets,
    )


def _json_report(report: RunReport) -> dict[str, object]:
    return {
        "generation": report.generation,
        "compiled": report.compiled,
        "skipped": report.skipped,
        "failed": report.failed,
        "variants": [
            {
                "model": v.model,
                "target": v.target,
                "ep": v.ep,
                "status": v.status,
                "compatibility_string": v.compatibility_string,
                "artifact_uri": v.artifact_uri,
                "seconds": v.seconds,
                "error": v.error,
                "coverage": v.coverage,
                "verification": v.verification,
                "max_rel_error": v.max_rel_error,
                "verification_seconds": v.verification_seconds,
            }
            for v in report.variants
        ],
    }


def _sync(args: argparse.Namespace) -> int:
    from epfleet.device.policy import SyncPolicy
    from epfleet.device.session import sync
    from epfleet.logs import log_to_stderr
    from epfleet.report import render_device_report

    prefer = [p.strip() for p in args.prefer.split(",") if p.strip()]
    bad = [p for p in prefer if p not in ("npu", "gpu", "cpu")]
    if bad or not prefer:
        raise BadInputError(f"--prefer takes device types npu, gpu, cpu; got {args.prefer!r}")
    policy = SyncPolicy(
        models=args.models, recompile=args.recompile, prefer=prefer, verify=args.verify
    )

    log_to_stderr()  # progress lines on stderr, the report alone on stdout
    report = sync(args.store, args.cache, policy, args.device_id)
    if args.json:
        print(report.model_dump_json())
    else:
        print(render_device_report(report))
    return report.exit_code


def _show(args: argparse.Namespace) -> int:
    from epfleet.publishing import read_manifest
    from epfleet.report import render_manifest
    from epfleet.stores import open_store

    manifest, _ = read_manifest(open_store(args.store))
    if manifest is None:
        raise BadInputError(f"no manifest at {args.store}/manifest.json: run epfleet compile first")
    if args.json:
        sys.stdout.write(manifest.to_json().decode())
    else:
        print(render_manifest(manifest, args.store))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
