"""The test fleet compiled in this process, as ``epfleet compile`` compiles it when no
Prefect API is named: planned by ``epfleet.fleet.planning.plan.plan_run``, then compiled,
verified and published by ``epfleet.fleet.runs.compile_run.run_compiles`` through
``epfleet.fleet.runs.plain_runner.PlainRunner``. No subprocess, no Prefect API: the session's
``compiled_fleet`` (tests/conftest.py) is made this way.

It stands for a real ``epfleet compile`` under a Prefect API: the fidelity test
tests/cli/test_plain_fleet_fidelity.py (slow tier) compiles the same spec both ways and
checks that the two stores agree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from epfleet.fleet.planning.plan import plan_run
from epfleet.fleet.runs.compile_run import run_compiles
from epfleet.fleet.runs.models import RunReport
from epfleet.fleet.runs.plain_runner import PlainRunner
from epfleet.stores import open_store
from tests.support.specs import tiny_models, write_spec


def compile_spec(spec: Path, store: Path, cache: Path) -> RunReport:
    """Plan and compile ``spec`` into the local ``store`` as ``epfleet compile`` does with
    no Prefect API (its default of one worker per CPU), with ``cache`` as the worker cache
    (EPFLEET_CACHE, set for the compile alone)."""
    with pytest.MonkeyPatch.context() as scoped:
        scoped.setenv("EPFLEET_CACHE", str(cache))
        plan = plan_run(spec, str(store))
        return run_compiles(plan, PlainRunner(open_store(str(store)), os.cpu_count() or 1))


def compile_fleet(directory: Path, model_dir: Path, targets: list[dict]) -> Path:
    """tiny-cls and tiny-det × ``targets`` compiled into ``directory``/store (pairs it holds
    up to date already skipped, as ``epfleet compile`` skips them); no pair may fail."""
    spec = write_spec(directory, tiny_models(model_dir), targets)
    store = directory / "store"
    report = compile_spec(spec, store, directory / "cache")
    failed = [(r.model, r.target, r.error) for r in report.variants if r.status == "failed"]
    assert report.exit_code == 0 and not failed, failed
    return store
