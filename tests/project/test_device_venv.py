"""The device install for real: a fresh venv with ``pip install epfleet`` (this checkout's
wheel, no extra) syncs a device with its ``epfleet`` command from a local store and
through an HTTP mirror, and has neither Prefect, boto3 nor PyYAML; what needs an extra
says which one to install.

The wheel is built without its dependencies, then installed with them by the pip that
runs the tests (``pip --python``; the venv needs no pip of its own), with the
onnxruntime of this environment, the one the store's CPU variant is stamped for. Its
dependencies come from the configured package indexes, as any install's do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

from epfleet.formats.device_report import decode_report, report_key
from tests.support.hand_made_fleet import DEVICE, Fleet, make_fleet
from tests.support.http_mirror import Mirror
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

EXTRAS_MODULES = ("prefect", "boto3", "botocore", "yaml", "prefect_dask")


@pytest.fixture(scope="module")
def device_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the device install and nothing else; its bin directory."""
    work = tmp_path_factory.mktemp("device-install")
    venv, wheels = work / "venv", work / "wheels"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(REPO)],
        check=True, capture_output=True, timeout=900,
    )  # fmt: skip
    (wheel,) = wheels.glob("epfleet-*.whl")
    installed = subprocess.run(
        [*pip, "--python", str(venv / "bin" / "python"), "install", "--no-compile",
         str(wheel), f"onnxruntime=={version('onnxruntime')}"],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    return venv / "bin"


def device_env() -> dict[str, str]:
    """This environment less what would reach past the venv (PYTHONPATH) or set a sync's
    options (EPFLEET_*)."""
    dropped = ("PYTHONPATH", "VIRTUAL_ENV")
    return {
        k: v for k, v in os.environ.items() if k not in dropped and not k.startswith("EPFLEET_")
    }


def epfleet(bin_dir: Path, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / "epfleet"), *argv],
        cwd=cwd, env=device_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip


@pytest.fixture
def fleet(tmp_path: Path) -> Fleet:
    return make_fleet(str(tmp_path / "store"), tmp_path)  # model m, a CPU variant, signed


@pytest.fixture
def mirror(fleet: Fleet, tmp_path: Path) -> Iterator[Mirror]:
    served = Mirror(tmp_path / "store")
    yield served
    served.close()


def test_the_device_install_has_no_extra(device_venv: Path, tmp_path: Path) -> None:
    found = subprocess.run(
        [str(device_venv / "python"), "-c",
         "import importlib.util as u, json, sys; "
         "print(json.dumps([m for m in sys.argv[1:] if u.find_spec(m)]))",
         *EXTRAS_MODULES, "epfleet", "onnxruntime", "tuf"],
        cwd=tmp_path, env=device_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == ["epfleet", "onnxruntime", "tuf"]


def test_it_syncs_a_device_from_a_local_store_and_again_keeps_the_model(
    device_venv: Path, fleet: Fleet, tmp_path: Path
) -> None:
    cache = tmp_path / "device"
    common = ("--store", fleet.uri, "--cache", str(cache), "--device-id", DEVICE, "--json")
    first = epfleet(device_venv, tmp_path, "sync", *common, "--trust-root", str(fleet.root))
    assert first.returncode == 0, first.stderr[-3000:]
    report = json.loads(first.stdout)
    assert report["manifest"]["signed"] is True
    assert [(m["model"], m["action"]) for m in report["models"]] == [("m", "downloaded")]
    again = epfleet(device_venv, tmp_path, "sync", *common)  # the root kept in the cache
    assert again.returncode == 0, again.stderr[-3000:]
    assert [m["action"] for m in json.loads(again.stdout)["models"]] == ["kept"]


def test_it_syncs_a_device_through_a_mirror(
    device_venv: Path, fleet: Fleet, mirror: Mirror, tmp_path: Path
) -> None:
    cache, reports = tmp_path / "device", tmp_path / "reports"
    done = epfleet(
        device_venv, tmp_path, "sync", "--store", mirror.url, "--cache", str(cache),
        "--device-id", DEVICE, "--trust-root", str(fleet.root), "--report-to", str(reports),
        "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert [m["action"] for m in report["models"]] == ["downloaded"], report["models"]
    assert report["manifest"]["signed"] is True and report["report_uploaded"] is True
    assert mirror.count("GET", ".onnx") >= 1  # the variant came through the mirror
    assert decode_report((reports / report_key(DEVICE)).read_bytes(), 1 << 20).device_id == DEVICE


def test_what_needs_an_extra_names_it_and_leaves_nothing(device_venv: Path, tmp_path: Path) -> None:
    s3 = epfleet(device_venv, tmp_path, "sync", "--store", "s3://bucket/fleet", "--cache", "dev")
    assert s3.returncode == 2 and 'pip install "epfleet[s3]"' in s3.stderr, s3.stderr
    compile_ = epfleet(
        device_venv, tmp_path, "compile", str(REPO / "examples" / "fleet.yaml"), "--store", "st"
    )
    assert compile_.returncode == 2, compile_.stderr
    assert compile_.stderr.startswith("epfleet: error: epfleet compile needs epfleet's 'host'")
    assert 'pip install "epfleet[host]"' in compile_.stderr
    flow = epfleet(device_venv, tmp_path, "sync", "--flow", "--store", "st", "--cache", "dev")
    assert flow.returncode == 2 and 'pip install "epfleet[host]"' in flow.stderr, flow.stderr
    spec = str(REPO / "examples" / "fleet.yaml")
    for command in (["watch", spec], ["serve"], ["retire", "--spec", spec, "--unlisted"]):
        refused = epfleet(device_venv, tmp_path, *command, "--store", "st")
        assert refused.returncode == 2, refused.stderr
        assert f"epfleet {command[0]} needs epfleet's 'host' extra" in refused.stderr
        assert 'pip install "epfleet[host]"' in refused.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
