"""The fidelity test of the session's compiled fleet: ``compiled_fleet`` (tests/conftest.py)
is compiled in-process through the compile's plain runner (``tests.support.plain_fleet``)
and stands, in every device-sync and trust-attack test, for a real ``epfleet compile``
run as the fleet-compile flow under a Prefect API. Both compile the same spec here, and
their stores must agree: the same models, targets and variants, compatibility strings,
precisions, coverage and verification outcomes (relative errors included), the same
sources, golden samples and signed-metadata layout.

Artifact hashes: the CPU variants (ORT-optimised models) are byte-identical run to run,
and are compared. The QNN HTP context binaries are not byte-stable (two compiles of the
same model differ in a few bytes, in size too: measured here, as DESIGN.md says), so of
those the test compares everything but the bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_runs import compile_fleet as compile_with_the_cli
from tests.support.plain_fleet import compile_fleet as compile_in_process
from tests.support.specs import CPU_TARGET, HTP_TARGETS
from tests.support.synced_fleet import read_manifest

pytestmark = pytest.mark.slow

TARGETS = [*HTP_TARGETS, CPU_TARGET]
WHEN = {"compiled_at", "published_at", "seconds"}
"""What differs between any two runs: when they ran and how long each step took."""


def without(value: Any, keys: set[str]) -> Any:
    """``value`` (JSON) with ``keys`` dropped at every depth."""
    if isinstance(value, dict):
        return {k: without(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [without(v, keys) for v in value]
    return value


def comparable(store: Path) -> dict[str, Any]:
    """The store's manifest less run times, and less the bytes of the HTP variants (their
    artifact: sha256, size and the content-addressed key)."""
    manifest = without(read_manifest(store).model_dump(mode="json"), WHEN)
    for model in manifest["models"].values():
        for variant in model["variants"].values():
            if variant["ep"] == "QNNExecutionProvider":
                variant["artifact"] = None
    return manifest


def files(store: Path) -> set[str]:
    """The store's files but the HTP variants and what names their bytes (the signed
    targets of the models and the manifest)."""
    return {
        path.relative_to(store).as_posix()
        for path in store.rglob("*")
        if path.is_file() and "htp" not in path.parent.name and "targets" not in path.parts
    }


def test_the_in_process_fleet_is_the_fleet_epfleet_compile_makes_under_prefect(
    tmp_path: Path, model_dir: Path, prefect_api: str
) -> None:
    (tmp_path / "cli").mkdir()
    (tmp_path / "plain").mkdir()
    real = compile_with_the_cli(tmp_path / "cli", model_dir, TARGETS, prefect_api)
    stand_in = compile_in_process(tmp_path / "plain", model_dir, TARGETS)

    real_manifest, stand_in_manifest = comparable(real), comparable(stand_in)
    assert sorted(real_manifest["models"]) == ["tiny-cls", "tiny-det"]
    for model in real_manifest["models"].values():
        assert sorted(model["variants"]) == sorted(t["name"] for t in TARGETS)
        assert all(v["status"] == "ok" for v in model["variants"].values())
        assert all(v["verification"]["status"] == "passed" for v in model["variants"].values())
    assert stand_in_manifest == real_manifest

    # The CPU variants are the same bytes; the HTP ones the same size within a few bytes.
    for name, model in read_manifest(real).models.items():
        for target, variant in model.variants.items():
            other = read_manifest(stand_in).models[name].variants[target]
            assert variant.artifact is not None and other.artifact is not None
            if variant.ep == "CPUExecutionProvider":
                assert other.artifact == variant.artifact
            else:
                assert abs(other.artifact.size - variant.artifact.size) < 64

    # The same files: sources, golden samples, CPU variants, signed metadata of each role.
    assert files(stand_in) == files(real)
    keys = {p.name for p in (real.parent / f"{real.name}.dev-keys").iterdir()}
    assert {p.name for p in (stand_in.parent / f"{stand_in.name}.dev-keys").iterdir()} == keys
