"""The fidelity test of the in-thread health check: the test suite runs the device's health
checks in the test's thread (``epfleet.device.health.in_thread``, set in tests/conftest.py)
where production runs them in a worker process (the sync's default). Here the same checks
run both ways, on the compiled fleet's CPU variant, and must agree: the same health (runs,
outputs, samples, error against the golden outputs, nodes per EP) for a variant that
runs, the same refusal for one that does not, and the same device report for a whole sync.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from epfleet.device.health import Health, HealthJob, check_health, in_thread
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import SyncSession, sync
from epfleet.errors import HealthCheckError
from epfleet.formats.device_report import DeviceReport
from epfleet.runtime.compile_pool import CompilePool
from eps.base import Tolerance
from tests.support.synced_fleet import DEVICE, copy_store, read_manifest, scale_largest_weight

pytestmark = [pytest.mark.slow, pytest.mark.health_in_worker]

MODEL = "tiny-cls"
TIMES = {"seconds", "session_ms", "first_run_ms", "p50_ms", "p95_ms"}


def cpu_variant_job(store: Path, tmp_path: Path, edit: bool = False) -> HealthJob:
    """The health job a device makes for tiny-cls's CPU variant (``edit``: a build with one
    weight tripled, which runs but misses its golden outputs)."""
    entry = read_manifest(store).models[MODEL]
    variant = entry.variants["x86-cpu"]
    assert variant.artifact is not None and entry.samples is not None
    path = store / variant.artifact.uri
    if edit:
        model = onnx.load(str(path))
        scale_largest_weight(model)
        path = tmp_path / "tripled.onnx"
        onnx.save(model, str(path))
    return HealthJob(
        label="x86-cpu",
        path=str(path),
        ep=variant.ep,
        device=variant.device,
        provider_options=variant.provider_options,
        input_shapes=entry.source.input_shapes,
        golden_path=str(store / entry.samples.uri),
        tolerance=Tolerance(relative=0.01, absolute=0.0),
    )


def in_a_worker(job: HealthJob) -> Health:
    """The check as a sync runs it by default: in a killable worker process."""
    pool = CompilePool(1)
    try:
        return pool.call(check_health, job, "health-checking x86-cpu", timeout=120)
    finally:
        pool.shutdown()


def untimed(health: Health) -> dict[str, object]:
    dumped = health.model_dump()
    dumped["profile"] = {k: v for k, v in dumped["profile"].items() if k not in TIMES}
    return {k: v for k, v in dumped.items() if k not in TIMES}


def test_a_check_that_passes_gives_the_same_health_in_a_thread_and_in_a_worker(
    fleet_store: Path, tmp_path: Path
) -> None:
    job = cpu_variant_job(fleet_store, tmp_path)
    here, there = in_thread(job, "health-checking x86-cpu", 120), in_a_worker(job)
    assert here.samples > 0 and here.max_rel_error is not None and here.profile is not None
    assert untimed(here) == untimed(there)


def test_a_check_that_fails_is_refused_alike_in_a_thread_and_in_a_worker(
    fleet_store: Path, tmp_path: Path
) -> None:
    job = cpu_variant_job(fleet_store, tmp_path, edit=True)
    with pytest.raises(HealthCheckError, match="on its golden samples") as here:
        in_thread(job, "health-checking x86-cpu", 120)
    with pytest.raises(HealthCheckError) as there:
        in_a_worker(job)
    assert str(here.value) == str(there.value)


def untimed_report(report: DeviceReport) -> list[dict[str, object]]:
    models = [m.model_dump(mode="json") for m in report.models]
    for model in models:
        model.pop("seconds", None)
        if model.get("profile"):
            model["profile"] = {k: v for k, v in model["profile"].items() if k not in TIMES}
    return models


def test_a_sync_reports_the_same_whichever_way_its_checks_run(
    fleet_store: Path, tmp_path: Path
) -> None:
    """One sync with the production default (no runner given: the worker process, as this
    module's marker keeps it), one with ``in_thread``, each from its own copy of the store:
    the same actions, variants, reasons and health."""
    assert SyncSession.default_health is None
    reports = []
    for way, health in (("worker", None), ("thread", in_thread)):
        store = copy_store(fleet_store, tmp_path / way / "store")
        reports.append(
            sync(str(store), tmp_path / way / "device", SyncPolicy(), DEVICE, health=health)
        )
    in_worker, here = reports
    assert [m.action for m in in_worker.models] == ["downloaded", "downloaded"]
    assert untimed_report(here) == untimed_report(in_worker)
