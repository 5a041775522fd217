"""Shared fixtures: generated models, spec files, a real S3 server (moto over HTTP), and
an isolated Prefect API (Prefect's SQLite-backed test harness)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import onnx
import pytest
from moto.server import ThreadedMotoServer

from tests.support.s3proxy import FaultProxy

if TYPE_CHECKING:
    from epfleet.device.health import Health, HealthJob
    from epfleet.runtime.compile_pool import CompilePool

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# Devices trust signed metadata only, as in production: a test that syncs an unsigned store
# says so (the ``unsigned_allowed`` fixture).
os.environ.pop("EPFLEET_ALLOW_UNSIGNED", None)
os.environ.pop("EPFLEET_TRUST_ROOT", None)
# Output is fitted to $COLUMNS when set: tests read whole lines unless they set it.
os.environ.pop("COLUMNS", None)

from examples.build_models import npu_partial, npu_unfriendly, tiny_cls, tiny_det
from tests.support.built_once import built_once, copy_with_keys
from tests.support.plain_fleet import compile_fleet
from tests.support.specs import CPU_TARGET, HTP_TARGETS, tiny_models, write_spec


@pytest.fixture(autouse=True)
def _isolated_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def unsigned_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Devices with no trusted root sync from the unsigned manifest.json
    (EPFLEET_ALLOW_UNSIGNED), as production refuses unless told: for the tests of that
    path itself, of manifests no publisher signs (hand-edited, invalid, of older schemas)
    and of the device's own checks of what such a manifest says. Every other test syncs
    signed stores; a test that uses this says why beside it."""
    monkeypatch.setenv("EPFLEET_ALLOW_UNSIGNED", "true")


@pytest.fixture(autouse=True)
def _health_in_thread(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Device syncs run their CPU EP health checks in this thread (no worker process to
    start for each sync), but in tests marked ``health_in_worker``: those about a check that
    crashes, runs past its time limit, or the worker itself. It stands for the production
    default, the worker process: tests/device/test_health_runners.py (slow tier) runs the
    same checks and syncs both ways and compares them.

    Another EP's check (QNN's HTP backend runs context binaries on this CPU) still runs in
    a worker process: once a QNN session has run in a process, QNN's compatibility
    validator there answers "not applicable" and then segfaults (eps/qnn.py), and the
    device tests judge QNN strings in this process."""
    if request.node.get_closest_marker("health_in_worker") is None:
        from epfleet.device.session import SyncSession

        monkeypatch.setattr(SyncSession, "default_health", staticmethod(_cpu_in_thread))


_health_worker: list[CompilePool] = []


def _cpu_in_thread(job: HealthJob, doing: str, timeout: float | None) -> Health:
    from epfleet.device.health import check_health, in_thread

    if job.ep == "CPUExecutionProvider":
        return in_thread(job, doing, timeout)
    if not _health_worker:
        from epfleet.runtime.compile_pool import CompilePool

        _health_worker.append(CompilePool(1))
    return _health_worker[0].call(check_health, job, doing, timeout=timeout)  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models")
    onnx.save(tiny_cls(), out / "tiny-cls.onnx")
    onnx.save(tiny_det(), out / "tiny-det.onnx")
    onnx.save(npu_unfriendly(), out / "nonzero.onnx")
    onnx.save(npu_partial(), out / "partial.onnx")
    return out


@pytest.fixture
def fleet_spec(tmp_path: Path, model_dir: Path) -> Path:
    """Two models with symbolic dims × two HTP targets and one CPU target."""
    return write_spec(tmp_path, tiny_models(model_dir), [*HTP_TARGETS, CPU_TARGET])


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    """A moto S3 server on loopback for the whole session; yields its endpoint URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(moto_server: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """Fake credentials and the moto endpoint, isolated from any real AWS config."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    return moto_server


@pytest.fixture
def s3_bucket(aws_env: str) -> str:
    """A fresh, empty bucket on the moto server."""
    name = f"epfleet-test-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=aws_env, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_proxy(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    """A fault-injecting proxy in front of moto; stores opened afterwards go through it."""
    proxy = FaultProxy(int(moto_server.rsplit(":", 1)[1]))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint_url)
    yield proxy
    proxy.close()


@pytest.fixture
def s3_store_uri(s3_bucket: str) -> str:
    return f"s3://{s3_bucket}/fleet"


@pytest.fixture
def cli_env(prefect_api: str, aws_env: str, tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PREFECT_API_URL"] = prefect_api
    env["EPFLEET_CACHE"] = str(tmp_path / "cli-cache")
    env.pop("PREFECT_LOGGING_LEVEL", None)  # the user's default: progress lines on stderr
    return env


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[str]:
    """An isolated SQLite-backed Prefect API for flow tests; yields its URL so that
    subprocesses (the CLI) can use it too."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        url = PREFECT_API_URL.value()
        assert url, "the Prefect test harness started no API"
        yield url


@pytest.fixture(scope="session")
def compiled_fleet(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> Path:
    """tiny-cls and tiny-det × two HTP targets and one CPU target compiled into a local
    store in this process, once per test run, through the compile's plain runner
    (``tests.support.plain_fleet``: no subprocess, no Prefect API). It stands for a real
    ``epfleet compile`` under a Prefect API; tests/cli/test_plain_fleet_fidelity.py (slow
    tier) checks that both make the same store. Never changed: tests get copies
    (``fleet_store``)."""
    return built_once(
        tmp_path_factory,
        "fleet",
        lambda directory: compile_fleet(directory, model_dir, [*HTP_TARGETS, CPU_TARGET]),
    )


@pytest.fixture(scope="module")
def fleet_store(compiled_fleet: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-cls and tiny-det × two HTP targets and one CPU target, in a local store: each
    test module's own copy of ``compiled_fleet`` (with the development keys beside it).

    One per test module, as when each module compiled its own: some tests sync from this
    store directly, and the device reports they leave in it would show up in another
    module's copy of it."""
    return copy_with_keys(compiled_fleet, tmp_path_factory.mktemp("fleet"))


@pytest.fixture(autouse=True)
def _evidence_listed_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """Most tests write device reports under reports/devices/ alone, as older devices do,
    and read the fleet again at once: there every pass of the evidence index lists every
    device's key and no reader answers from a pass made just before.
    tests/trust/test_evidence_inbox.py tests the passes in between (notices in the inbox,
    a full listing every few passes, readers sharing a recent pass)."""
    monkeypatch.setenv("EPFLEET_EVIDENCE_FULL_LISTING_EVERY", "1")
    monkeypatch.setenv("EPFLEET_EVIDENCE_FRESH_SECONDS", "0")
