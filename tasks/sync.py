"""Prefect tasks of the device sync: fetch the manifest, sync one model, report."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from epfleet.devicecache import DeviceCache
from epfleet.local_eps import discover
from epfleet.sync import (
    DeviceReport,
    ManifestStatus,
    ModelReport,
    SyncPolicy,
    build_report,
    fetch_manifest,
    manifest_in_force,
    sync_models,
    upload_report,
)

# Every task here reads or changes the device cache, so Prefect's result cache stays off:
# what is active is decided by the cache's own state, not by task inputs.


@task(name="fetch-manifest", cache_policy=NO_CACHE)
def fetch_manifest_task(store: str, cache: str) -> ManifestStatus:
    """Conditional GET; an unreachable store is reported as offline, not raised, so the
    device carries on with what it has (boto3 has already retried transient errors)."""
    status = fetch_manifest(store, Path(cache))
    logger = get_run_logger()
    logger.info(
        "manifest %s: generation %s, %d body bytes",
        status.status,
        status.generation,
        status.body_bytes,
    )
    if status.reason:
        logger.warning("manifest %s: %s", status.status, status.reason)
    return status


@task(name="wanted-models", cache_policy=NO_CACHE)
def wanted_models_task(store: str, cache: str, models: list[str] | None) -> list[str]:
    return list(manifest_in_force(store, Path(cache), models).models)


@task(name="sync-model", cache_policy=NO_CACHE, task_run_name="sync {model}")
def sync_model_task(
    store: str, cache: str, model: str, policy: SyncPolicy, offline: bool
) -> ModelReport:
    logger = get_run_logger()
    one = policy.model_copy(update={"models": [model]})
    [report] = sync_models(store, Path(cache), one, offline, log=logger.info)
    return report


@task(name="device-report", cache_policy=NO_CACHE)
def report_task(
    device: str,
    store: str,
    cache: str,
    manifest: ManifestStatus,
    models: list[ModelReport],
    seconds: float,
) -> DeviceReport:
    report = build_report(device, store, Path(cache), discover(), manifest, models, seconds)
    report = upload_report(store, report)
    DeviceCache(Path(cache)).save_last_report(report.model_dump_json(indent=2).encode())
    if report.report_uploaded is False:
        get_run_logger().warning("device report not uploaded: %s", report.report_error)
    return report
