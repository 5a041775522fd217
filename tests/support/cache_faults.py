"""What the device-cache fault tests (tests/device/test_faults*.py) check a sync left: the
cache's entries, the active variant, the warnings; and the unsigned copy of the fleet's
store they edit."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import onnx

from epfleet.formats.device_report import DeviceReport
from tests.support.synced_fleet import (
    copy_store,
)

MODEL = "tiny-cls"


def rebuilt(model: onnx.ModelProto) -> None:
    """A new build that runs like the old one: only its doc string differs."""
    model.doc_string = f"rebuilt {time.time_ns()}"


def snapshot(directory: Path) -> dict[str, bytes | None]:
    """Every entry under ``directory`` and the bytes of its files."""
    return {
        str(p.relative_to(directory)): p.read_bytes() if p.is_file() else None
        for p in sorted(directory.rglob("*"))
    }


def active(report: DeviceReport, model: str = MODEL) -> str:
    [found] = [m for m in report.models if m.model == model]
    assert found.variant
    return found.variant


def package_variants(cache: Path, model: str = MODEL) -> list[str]:
    package = json.loads((cache / "manifest.json").read_text())
    return list(package["components"][model]["variants"])


def warned(report: DeviceReport, *words: str) -> bool:
    return any(all(w in warning for w in words) for warning in report.warnings)


def unsigned_copy(fleet_store: Path, dest: Path) -> Path:
    """A copy of the store without its development keys: the device syncs from the
    unsigned manifest.json (EPFLEET_ALLOW_UNSIGNED), which these tests edit in place."""
    store = copy_store(fleet_store, dest)
    shutil.rmtree(store.with_name(f"{store.name}.dev-keys"), ignore_errors=True)
    return store
