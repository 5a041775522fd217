"""Shared fixtures: generated models, spec files, a real S3 server (moto over HTTP), and
an isolated Prefect API (Prefect's SQLite-backed test harness)."""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import onnx
import pytest
import yaml
from moto.server import ThreadedMotoServer
from onnxruntime.capi._pybind_state import get_compatibility_info_from_model_bytes
from s3proxy import FaultProxy

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
# Most tests sync from stores they compiled without trust metadata; the signed path and
# the refusal without a root are tested in test_trust_*.py, which unset this.
os.environ.setdefault("EPFLEET_ALLOW_UNSIGNED", "true")

from epfleet.formats.manifest import Manifest
from epfleet.hashing import sha256_bytes
from examples.build_models import npu_partial, npu_unfriendly, tiny_cls, tiny_det

HTP_TARGETS = [
    {
        "name": "sd8g3-htp",
        "ep": "QNNExecutionProvider",
        "provider_options": {
            "backend_type": "htp",
            "htp_arch": 75,
            "soc_model": 57,
            "enable_htp_fp16_precision": 1,
        },
    },
    {
        "name": "sd8g2-htp",
        "ep": "QNNExecutionProvider",
        "provider_options": {
            "backend_type": "htp",
            "htp_arch": 73,
            "soc_model": 43,
            "enable_htp_fp16_precision": 1,
        },
    },
]
CPU_TARGET = {"name": "x86-cpu", "ep": "CPUExecutionProvider"}


@pytest.fixture(autouse=True)
def _isolated_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models")
    onnx.save(tiny_cls(), out / "tiny-cls.onnx")
    onnx.save(tiny_det(), out / "tiny-det.onnx")
    onnx.save(npu_unfriendly(), out / "nonzero.onnx")
    onnx.save(npu_partial(), out / "partial.onnx")
    return out


def write_spec(
    directory: Path, models: list[dict], targets: list[dict], name: str = "fleet.yaml"
) -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump({"models": models, "targets": targets}, sort_keys=False))
    return path


def tiny_models(model_dir: Path) -> list[dict]:
    """The spec entries of the two small models, with symbolic dims fixed."""
    return [
        {
            "name": "tiny-cls",
            "source": str(model_dir / "tiny-cls.onnx"),
            "input_shapes": {"x": [1, 3, 48, 192]},
        },
        {
            "name": "tiny-det",
            "source": str(model_dir / "tiny-det.onnx"),
            "input_shapes": {"image": [1, 3, 64, 64]},
        },
    ]


@pytest.fixture
def fleet_spec(tmp_path: Path, model_dir: Path) -> Path:
    """Two models with symbolic dims × two HTP targets and one CPU target."""
    return write_spec(tmp_path, tiny_models(model_dir), [*HTP_TARGETS, CPU_TARGET])


def with_npu_unfriendly_model(directory: Path, model_dir: Path, targets: list[dict]) -> Path:
    """A spec whose `nonzero` model no NPU EP can compile, beside `tiny-cls`, which any can."""
    return write_spec(
        directory,
        [
            {
                "name": "tiny-cls",
                "source": str(model_dir / "tiny-cls.onnx"),
                "input_shapes": {"x": [1, 3, 32, 32]},
            },
            {
                "name": "nonzero",
                "source": str(model_dir / "nonzero.onnx"),
                "input_shapes": {"x": [1, 8]},
            },
        ],
        targets,
    )


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


def built_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], Path]
) -> Path:
    """``build(directory)``'s result, built once per test run: under pytest-xdist, the first
    worker to ask builds it in a directory all workers share, and the others wait for it
    and reuse it (read-only; tests copy what they change). Returns what ``build`` did."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent / f"built-{name}"
    shared.mkdir(exist_ok=True)
    with (shared / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the build holds it; the waiters block here
        done = shared / ".result"
        if not done.exists():
            done.write_text(str(build(shared)))
        return Path(done.read_text())


def assert_variants_match_store(manifest: Manifest, read: Callable[[str], bytes]) -> int:
    """Every ok variant's stored bytes match its sha256 and size, and its manifest string is
    what ORT reads from those bytes for its EP. Returns how many variants were checked."""
    checked = 0
    for model in manifest.models.values():
        for variant in model.variants.values():
            assert variant.status == "ok" and variant.artifact is not None
            data = read(variant.artifact.uri)
            assert (sha256_bytes(data), len(data)) == (
                variant.artifact.sha256,
                variant.artifact.size,
            )
            assert (
                get_compatibility_info_from_model_bytes(data, variant.ep)
                == variant.compatibility_string
            )
            assert variant.source_sha256 == model.source.sha256
            checked += 1
    return checked
