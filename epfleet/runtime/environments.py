"""Runtime environments: the ONNX Runtime and EP packages a fleet's devices run, installed
side by side on a compile host, so one host compiles and verifies each target under
every runtime the spec names.

A runtime is a name and a list of pip requirements (the spec's ``runtimes``). Its
environment is a directory of those packages, installed once with
``pip install --no-deps --target`` (from the package index, or from
``EPFLEET_RUNTIME_WHEELS`` on a host without one) into the worker cache under
``runtimes/<key>/``, where ``key`` is a digest of the requirements, this Python and this
platform: a changed requirement list gets a new environment, the others are reused. It is
built in a temporary directory and renamed into place, under a lock, so concurrent runs
build it once and a killed build leaves nothing that looks complete.

A compile or verification worker of that runtime puts the directory first on its import
path before it imports ONNX Runtime (``epfleet.runtime.workers.enter_runtime``); what the
requirements do not name (numpy, protobuf, onnx, epfleet itself) comes from the host's
environment. So a runtime must pin ``onnxruntime`` itself, at a version this worker code
supports (``MIN_ONNXRUNTIME``), and each EP package's own requirement on onnxruntime must
hold: both are checked when the environment is built, before anything compiles.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version
from pydantic import BaseModel, Field

from epfleet.errors import BadInputError

logger = logging.getLogger(__name__)

MIN_ONNXRUNTIME = Version("1.24")
"""The oldest onnxruntime this worker code compiles and verifies with: the plugin-EP API
(``register_execution_provider_library``, ``get_ep_devices``) and ``ModelCompiler`` with
``graph_optimization_level`` (measured: onnxruntime-qnn 2.3.0 runs on 1.24.4)."""
ENVIRONMENTS = "runtimes"
"""The worker cache's directory of runtime environments."""
VERSIONS_FILE = "versions.json"
PIP_TIMEOUT_SECONDS = 1800.0


class RuntimeEnvironment(BaseModel):
    """A built runtime environment: where its packages are and which versions they are."""

    name: str
    requirements: list[str]
    key: str
    site: str = Field(description="The directory a worker puts first on its import path")
    versions: dict[str, str] = Field(description="Distribution name -> version, as installed")

    @property
    def onnxruntime(self) -> str:
        return self.versions["onnxruntime"]

    def version_of(self, package: str) -> str | None:
        return self.versions.get(_canonical(package))


def environment_key(requirements: list[str]) -> str:
    """What names an environment: its requirements (as given, sorted), this Python and this
    platform (the wheels pip picks follow both)."""
    basis = {
        "requirements": sorted(requirements),
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "platform": f"{sys.platform}-{platform.machine()}",
    }
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


BASE_PACKAGES = frozenset({"onnxruntime"})


def refused_packages(requirements: list[str], allowed: frozenset[str]) -> list[str]:
    """The requirements naming a package outside ``allowed`` (canonical names): a runtime
    installs ONNX Runtime and EP packages, never other code a spec would have the compile
    host run."""
    return [text for text in requirements if _canonical(Requirement(text).name) not in allowed]


def allowed_packages(extra: str) -> frozenset[str]:
    """onnxruntime, the package of every EP epfleet knows, and ``extra`` (the
    comma-separated EPFLEET_RUNTIME_PACKAGES)."""
    import eps

    known = {getattr(eps.load(name), "package", None) for name in eps.known()}
    named = {part.strip() for part in extra.split(",") if part.strip()}
    return frozenset(_canonical(p) for p in (BASE_PACKAGES | named | known) if p)


def ensure_environment(
    name: str, requirements: list[str], root: Path, wheels: Path | None = None
) -> RuntimeEnvironment:
    """The runtime's environment under ``root`` (the worker cache's ``runtimes/``), built
    now if it is not there. BadInputError naming the runtime when pip cannot install its
    requirements or what it installed cannot serve as a compile runtime."""
    key = environment_key(requirements)
    home = root / key
    found = _load(home, name, requirements, key)
    if found is not None:
        return found
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f"{key}.lock"):
        found = _load(home, name, requirements, key)
        if found is not None:
            return found
        logger.warning(
            "building the environment of runtime %s (%s) in %s: once per requirement list",
            name,
            ", ".join(requirements),
            home,
        )
        for killed in root.glob(f"{key}.building-*"):  # a build killed before its rename
            shutil.rmtree(killed, ignore_errors=True)
        scratch = root / f"{key}.building-{os.getpid()}"
        try:
            _pip_install(name, requirements, scratch / "site", wheels)
            versions = _installed(scratch / "site")
            _check_installed(name, versions, scratch / "site")
            (scratch / VERSIONS_FILE).write_text(json.dumps(versions, sort_keys=True))
            shutil.rmtree(home, ignore_errors=True)
            scratch.rename(home)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    built = _load(home, name, requirements, key)
    assert built is not None
    return built


def _load(home: Path, name: str, requirements: list[str], key: str) -> RuntimeEnvironment | None:
    try:
        versions = json.loads((home / VERSIONS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return RuntimeEnvironment(
        name=name,
        requirements=list(requirements),
        key=key,
        site=str(home / "site"),
        versions=versions,
    )


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pip_install(name: str, requirements: list[str], site: Path, wheels: Path | None) -> None:
    # Wheels only: building a source distribution would run its code on this host.
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary"]
    command += [":all:", "--target", str(site), "--disable-pip-version-check"]
    command += ["--no-warn-script-location"]
    if wheels is not None:
        command += ["--no-index", "--find-links", str(wheels)]
    command += requirements
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=PIP_TIMEOUT_SECONDS, check=False
        )
    except subprocess.TimeoutExpired:
        raise BadInputError(
            f"runtime {name!r}: pip did not install {', '.join(requirements)} within "
            f"{PIP_TIMEOUT_SECONDS:g} s"
        ) from None
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        where = f" from {wheels}" if wheels is not None else ""
        raise BadInputError(
            f"runtime {name!r}: pip cannot install {', '.join(requirements)}{where}: "
            + ("; ".join(said) or done.stderr.strip()[-500:] or f"exit code {done.returncode}")
        )


def _installed(site: Path) -> dict[str, str]:
    return {
        _canonical(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions(path=[str(site)])
    }


def _check_installed(name: str, versions: dict[str, str], site: Path) -> None:
    ort = versions.get("onnxruntime")
    if ort is None:
        raise BadInputError(f"runtime {name!r} installs no onnxruntime")
    if Version(ort) < MIN_ONNXRUNTIME:
        raise BadInputError(
            f"runtime {name!r}: onnxruntime {ort} is older than this epfleet compiles with "
            f"(at least {MIN_ONNXRUNTIME}); pin a newer onnxruntime and an EP package "
            "release built for it"
        )
    for dist in importlib.metadata.distributions(path=[str(site)]):
        for text in dist.requires or []:
            requirement = Requirement(text)
            if _canonical(requirement.name) != "onnxruntime" or requirement.marker:
                continue
            if not requirement.specifier.contains(ort, prereleases=True):
                raise BadInputError(
                    f"runtime {name!r}: {dist.metadata['Name']} {dist.version} needs "
                    f"onnxruntime{requirement.specifier}, and the runtime pins {ort}"
                )


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
