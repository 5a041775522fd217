"""Prefect tasks of the device sync, over one ``SyncSession`` per flow run.

The tasks fetch the manifest, drop the models it no longer lists (when the policy says
so), list the wanted models, sync one model, and report.

The flow opens the session with ``open_sync`` (the cache's lock, its state, the
manifest in force, EP discovery and the worker are per sync, not per task) and the
tasks find it by the cache directory they are given, so that their parameters stay
plain paths and names. They must therefore run in the flow's process, as the default
task runner runs them (in the flow's thread when called directly).

Every task here reads or changes the device cache, so Prefect's result cache stays
off: what is active is decided by the cache's own state, not by task inputs. No task
retries either: boto3 retries transient requests and the download resumes dropped
segments (see ``epfleet.device.download``); the next scheduled sync is the retry.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from epfleet.device.policy import SyncPolicy
from epfleet.device.session import SyncSession
from epfleet.device.shadow import inputs_directory
from epfleet.errors import EpfleetError
from epfleet.formats.device_report import DeviceReport, ManifestStatus, ModelReport
from epfleet.logs import PACKAGE_LOGGER
from epfleet.stores.probe import store_named_first

_open: dict[Path, SyncSession] = {}
_open_lock = threading.Lock()


@contextmanager
def open_sync(
    store: str,
    cache: str,
    policy: SyncPolicy,
    device: str | None,
    trust_root: str | None = None,
    allow_unsigned: bool | None = None,
    report_to: str | None = None,
    shadow_inputs: str | None = None,
) -> Iterator[None]:
    """Open the flow run's sync session, for the tasks below to find by ``cache``; and
    send epfleet's log records to the run's logs meanwhile. ``shadow_inputs``: a directory
    of the app's inputs for shadow runs (``epfleet.device.shadow.inputs_directory``)."""
    root = Path(trust_root) if trust_root else None
    hook = inputs_directory(Path(shadow_inputs)) if shadow_inputs else None
    with (
        logs_to_run(),
        store_named_first(store),  # a missing store, before anything about trust
        SyncSession(
            store,
            Path(cache),
            policy,
            device,
            trust_root=root,
            allow_unsigned=allow_unsigned,
            report_to=report_to,
            shadow_inputs=hook,
        ) as session,
    ):
        key = session.cache.root
        with _open_lock:
            if key in _open:  # the cache lock already refuses this; a clear message anyway
                raise EpfleetError(f"a device sync of {key} is already open in this process")
            _open[key] = session
        try:
            yield
        finally:
            with _open_lock:
                del _open[key]


def session_for(cache: str) -> SyncSession:
    with _open_lock:
        session = _open.get(Path(cache).resolve())
    if session is None:
        raise EpfleetError(
            f"no device sync of {cache} is open in this process: the device-sync tasks run "
            "inside the flow's open_sync block, in the flow's process"
        )
    return session


@contextmanager
def logs_to_run() -> Iterator[None]:
    """Give the ``epfleet`` logger the handlers Prefect gives the loggers named in
    PREFECT_LOGGING_EXTRA_LOGGERS (the run's API log handler), at Prefect's log level,
    for the duration of the block: the device engine logs with stdlib logging."""
    target = logging.getLogger(PACKAGE_LOGGER)
    extra = logging.getLogger("prefect.extra")
    added = [h for h in extra.handlers if h not in target.handlers]
    level = target.level
    for handler in added:
        target.addHandler(handler)
    if level == logging.NOTSET:
        target.setLevel(extra.getEffectiveLevel())
    try:
        yield
    finally:
        for handler in added:
            target.removeHandler(handler)
        target.setLevel(level)


@task(name="fetch-manifest", cache_policy=NO_CACHE)
def fetch_manifest_task(cache: str) -> ManifestStatus:
    """Conditional GET; an unreachable store is reported as offline, not raised, so the
    device carries on with what it has (boto3 has already retried transient errors)."""
    return session_for(cache).fetch_manifest()


@task(name="drop-unlisted", cache_policy=NO_CACHE)
def drop_unlisted_task(cache: str) -> list[str]:
    """Remove the models the manifest no longer lists, if the policy's drop_unlisted (or
    EPFLEET_DROP_UNLISTED) says so; the models dropped."""
    return session_for(cache).drop_unlisted()


@task(name="wanted-models", cache_policy=NO_CACHE)
def wanted_models_task(cache: str) -> list[str]:
    return session_for(cache).wanted()


@task(name="sync-model", cache_policy=NO_CACHE, task_run_name="sync {model}")
def sync_model_task(cache: str, model: str) -> ModelReport:
    return session_for(cache).sync_model(model)


@task(name="device-report", cache_policy=NO_CACHE)
def report_task(cache: str) -> DeviceReport:
    report = session_for(cache).finish()
    if report.report_skipped:
        get_run_logger().info("device report not uploaded: it %s", report.report_skipped)
    elif report.report_uploaded is False:
        get_run_logger().warning("device report not uploaded: %s", report.report_error)
    return report
