"""The commands a person reads, at 80 columns (``COLUMNS=80``), on a compiled store with a
rollout under way: ``epfleet compile`` (the README's, into a new store), ``sync`` on this
host (no NPU), ``manifest show`` (with ``--field``), ``rollout status``, ``device list``,
``trust status``, ``watch --dry-run``, ``retire``, ``gc`` and an error print no line
longer than the terminal, on stdout or stderr, and no text of ONNX Runtime's internals.
The fitting itself: tests/cli/test_fitted_output.py."""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

import pytest

from epfleet.fleet.publishing.publish import update_manifest
from epfleet.formats.manifest import Manifest
from epfleet.formats.rollout import Rollout, RolloutPolicy
from epfleet.stores import open_store
from tests.support.cli_runs import epfleet
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

WIDTH = 80
ROLLOUT_ID = "5c1e0d9a7b43f2e1"


def stage_a_rollout(store: Path) -> None:
    """tiny-cls's CPU variant staged against itself, as a rebuild's rollout is published."""
    now = datetime.now(timezone.utc)
    rollout = Rollout(
        id=ROLLOUT_ID,
        salt="5a17" * 8,
        policy=RolloutPolicy(stages=[5, 25, 100], min_reports=5),
        stage=0,
        started_at=now,
        stage_started_at=now,
    )

    def stage(current: Manifest | None) -> Manifest | None:
        assert current is not None
        entry = current.models["tiny-cls"]
        previous = {"x86-cpu": entry.variants["x86-cpu"]}
        staged = entry.model_copy(update={"rollout": rollout, "previous": previous})
        models = current.models | {"tiny-cls": staged}
        return Manifest(generation=current.generation + 1, published_at=now, models=models)

    update_manifest(open_store(str(store)), stage)


def test_every_command_fits_80_columns(fleet_store: Path, tmp_path: Path) -> None:
    stage_a_rollout(fleet_store)
    env = dict(
        os.environ,
        COLUMNS=str(WIDTH),
        PYTHONPATH=str(REPO),
        EPFLEET_CACHE=str(tmp_path / "worker-cache"),
    )
    env.pop("PREFECT_API_URL", None)
    store = str(fleet_store)
    spec = str(REPO / "examples" / "fleet.yaml")
    runs = {
        "compile": epfleet("compile", spec, "--store", str(tmp_path / "new-store"), env=env),
        "sync": epfleet("sync", "--store", store, "--cache", str(tmp_path / "device"), env=env),
        "manifest show": epfleet("manifest", "show", "--store", store, env=env),
        "manifest show --field": epfleet("manifest", "show", "--field", "--store", store, env=env),
        "rollout status": epfleet("rollout", "status", "--store", store, env=env),
        "device list": epfleet("device", "list", "--store", store, env=env),
        "trust status": epfleet("trust", "status", "--store", store, env=env),
        "watch --dry-run": epfleet("watch", spec, "--store", store, "--dry-run", env=env),
        "retire --dry-run": epfleet(
            "retire",
            "--store",
            store,
            "--model",
            "tiny-det",
            "--target",
            "sd8g2-htp",
            "--dry-run",
            env=env,
        ),
        "gc": epfleet("gc", "--store", store, env=env),
        "sync --help": epfleet("sync", "--help", env=env),
        "an unknown command": epfleet("trust", "show", "--store", store, env=env),
    }
    for name, done in runs.items():
        expected = 2 if name == "an unknown command" else 0
        assert done.returncode == expected, f"{name}: {done.stderr}"
        for stream in (done.stdout, done.stderr):
            long = [line for line in stream.splitlines() if len(line) > WIDTH]
            assert long == [], f"{name}: lines over {WIDTH} columns:\n" + "\n".join(long)
            assert "QnnEpFactory" not in stream and "OrtHardwareDeviceType" not in stream
    synced = runs["sync"].stdout
    assert synced.count("QNN: no NPU on this device; its variants are skipped") == 1, synced
    assert "2 of 2 models served" in synced
    compiled = runs["compile"].stdout
    assert "6 compiled, 0 up to date, 0 failed" in compiled, compiled
    assert "tiny-cls × sd8g3-htp: ok · fp16" in compiled  # the per-pair lines, wrapped
    shown = runs["manifest show"].stdout
    assert "not shown at 80 columns: compatibility" in " ".join(shown.split()), shown
    assert "sd8g3-htp: built for HTP v75 SoC 57" in shown
    status = runs["rollout status"].stdout
    assert f"rollout: {ROLLOUT_ID}" in status and "stage: 1/3 (5 %)" in status, status
