"""Runtime environments: what names one, what an environment must hold to serve as a
compile runtime, and a worker entering one (building one with pip, and compiling in it,
are in tests/fleet/test_runtimes.py, slow tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

from epfleet.errors import BadInputError
from epfleet.runtime import environments
from epfleet.runtime.environments import RuntimeEnvironment, environment_key
from epfleet.runtime.workers import enter_runtime

pytestmark = pytest.mark.fast


def dist(site: Path, name: str, version: str, requires: list[str] = ()) -> None:  # type: ignore[assignment]
    """A distribution's metadata as pip installs it into ``site``."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n")


def test_the_key_follows_the_requirements_not_their_order() -> None:
    a = environment_key(["onnxruntime==1.32.0", "onnxruntime-qnn==2.5.0"])
    assert a == environment_key(["onnxruntime-qnn==2.5.0", "onnxruntime==1.32.0"])
    assert a != environment_key(["onnxruntime==1.32.0", "onnxruntime-qnn==2.6.0"])


def test_an_environment_that_serves_as_a_runtime_is_accepted(tmp_path: Path) -> None:
    dist(tmp_path, "onnxruntime", "1.32.0")
    dist(tmp_path, "onnxruntime-qnn", "2.5.0", ["numpy>=1.21.6", "onnxruntime>=1.24.2"])
    versions = environments._installed(tmp_path)
    assert versions == {"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.5.0"}
    environments._check_installed("qnn-2.5", versions, tmp_path)


@pytest.mark.parametrize(
    ("ort", "qnn_needs", "message"),
    [
        ("1.20.1", "onnxruntime>=1.20", "onnxruntime 1.20.1 is older than this epfleet compiles"),
        ("1.32.0", "onnxruntime==1.24.4", "onnxruntime-qnn 2.3.0 needs onnxruntime==1.24.4"),
    ],
)
def test_an_environment_that_cannot_serve_is_refused_naming_the_runtime(
    tmp_path: Path, ort: str, qnn_needs: str, message: str
) -> None:
    dist(tmp_path, "onnxruntime", ort)
    dist(tmp_path, "onnxruntime-qnn", "2.3.0", [qnn_needs])
    with pytest.raises(BadInputError, match=f"runtime 'old': {message}"):
        environments._check_installed("old", environments._installed(tmp_path), tmp_path)


def test_a_built_environment_is_found_without_pip(tmp_path: Path) -> None:
    requirements = ["onnxruntime==1.32.0", "onnxruntime-qnn==2.5.0"]
    home = tmp_path / environment_key(requirements)
    (home / "site").mkdir(parents=True)
    (home / environments.VERSIONS_FILE).write_text('{"onnxruntime": "1.32.0"}')
    found = environments.ensure_environment("qnn-2.5", requirements, tmp_path)
    assert found == RuntimeEnvironment(
        name="qnn-2.5",
        requirements=requirements,
        key=home.name,
        site=str(home / "site"),
        versions={"onnxruntime": "1.32.0"},
    )


def test_a_worker_that_loaded_onnxruntime_cannot_enter_a_runtime(tmp_path: Path) -> None:
    import onnxruntime  # noqa: F401  (this process has; a fresh worker has not)

    with pytest.raises(RuntimeError, match="is loaded in this worker already"):
        enter_runtime(str(tmp_path))
    enter_runtime(None)  # the host's own: nothing to do


def test_a_runtime_installs_onnxruntime_and_ep_packages_only_unless_the_host_allows_more(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A compile host installs and imports what a runtime names: a spec naming another
    package is refused before any environment is built, unless EPFLEET_RUNTIME_PACKAGES
    names it."""
    from epfleet.fleet.planning.plan import check_runtime_packages

    runtimes = {"odd": ["onnxruntime==1.32.0", "onnxruntime_qnn==2.5.0", "requests==2.32.0"]}
    with pytest.raises(BadInputError) as raised:
        check_runtime_packages(runtimes)
    assert str(raised.value).startswith(
        "runtimes[odd]: requests==2.32.0 is not onnxruntime or an EP package (allowed here: "
        "onnxruntime, onnxruntime-ep-nv-tensorrt-rtx, onnxruntime-ep-openvino, onnxruntime-qnn)"
    )
    monkeypatch.setenv("EPFLEET_RUNTIME_PACKAGES", "Requests")
    check_runtime_packages(runtimes)
