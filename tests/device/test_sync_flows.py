"""The device sync as Prefect runs it: the device-sync flow run (its artifacts, one session
for all its model tasks) and the flow served as a deployment on a real Prefect API (a
subprocess). The same syncs without Prefect are in test_sync.py (fast tier)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from epfleet.device.policy import SyncPolicy
from epfleet.formats.device_report import decode_report
from tests.support.paths import REPO
from tests.support.synced_fleet import (
    assert_package_runs,
    copy_store,
)

pytestmark = pytest.mark.slow


@pytest.mark.usefixtures("prefect_api")
def test_device_sync_flow(htp_only_store: Path, tmp_path: Path) -> None:
    """The same sync as a Prefect flow run: typed parameters, one task per model, and the
    device's choices as table artifacts."""
    from prefect.artifacts import Artifact

    from flows.device_sync import device_sync

    cache = tmp_path / "device"
    report = device_sync(
        cache=str(cache),
        store=str(htp_only_store),
        policy=SyncPolicy(models=["tiny-cls"]),
        device="flow-device",
    )
    [result] = report.models
    assert (result.model, result.action, result.ep) == (
        "tiny-cls",
        "recompiled",
        "CPUExecutionProvider",
    )
    assert_package_runs(cache, {"tiny-cls": result.variant or ""})
    table = Artifact.get("device-sync-flow-device")
    assert table is not None and "recompiled" in str(table.data)
    verdicts = Artifact.get("device-sync-flow-device-verdicts")
    assert verdicts is not None and "unsupported" in str(verdicts.data)
    assert (htp_only_store / "reports" / "devices" / "flow-device.json").exists()


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.health_in_worker  # counts the worker processes the session starts
def test_device_sync_flow_does_the_per_sync_work_once(
    fleet_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One session serves the flow run's tasks: EP discovery, the manifest's parse and the
    worker process happen once for all the models, not once per model task."""
    import epfleet.device.session as session
    import epfleet.runtime.compile_pool as compile_pool
    from flows.device_sync import device_sync

    calls: dict[str, int] = {"discover": 0, "parse": 0, "worker": 0}

    def counted(name: str, call: Callable[..., object]) -> Callable[..., object]:
        def wrapper(*args: object, **kwargs: object) -> object:
            calls[name] += 1
            return call(*args, **kwargs)

        return wrapper

    monkeypatch.setattr(session, "discover", counted("discover", session.discover))
    monkeypatch.setattr(session, "manifest_in_force", counted("parse", session.manifest_in_force))
    # the steps import the pool when a step first needs a worker
    monkeypatch.setattr(compile_pool, "CompilePool", counted("worker", compile_pool.CompilePool))
    report = device_sync(cache=str(tmp_path / "device"), store=str(fleet_store), device="once")
    assert [(m.model, m.action) for m in report.models] == [
        ("tiny-cls", "downloaded"),
        ("tiny-det", "downloaded"),
    ]
    assert calls == {"discover": 1, "parse": 1, "worker": 1}


def test_device_sync_served_as_a_deployment(
    fleet_store: Path, prefect_api: str, tmp_path: Path
) -> None:
    """`python flows/device_sync.py --serve N` serves a `periodic` deployment on a real Prefect
    API; a run of it, started through the API, syncs the device."""
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    store = copy_store(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    report = store / "reports" / "devices" / "served-device.json"
    env = dict(os.environ, PREFECT_API_URL=prefect_api, PREFECT_LOGGING_LEVEL="WARNING")
    flow_file = REPO / "flows" / "device_sync.py"
    server = subprocess.Popen(
        [
            *(sys.executable, str(flow_file), "--store", str(store), "--cache", str(cache)),
            *("--device-id", "served-device", "--serve", "5"),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        run = None
        while run is None and time.monotonic() < deadline and server.poll() is None:
            try:  # the test API schedules nothing by itself: start a run as the UI would
                run = run_deployment("device-sync/periodic", timeout=0)
            except ObjectNotFound:
                time.sleep(0.5)  # not served yet
        while not report.exists() and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.5)
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    assert report.exists(), stderr[-2000:]
    served = decode_report(report.read_bytes(), 1 << 20)  # gzip-compressed JSON
    assert [m.action for m in served.models] == ["downloaded", "downloaded"]
    assert_package_runs(cache, {m.model: m.variant or "" for m in served.models})
