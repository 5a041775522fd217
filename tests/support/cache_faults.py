"""What the device-cache fault tests (tests/device/test_faults*.py) check a sync left: the
cache's entries, the active variant, the warnings."""

from __future__ import annotations

import json
from pathlib import Path

from epfleet.formats.device_report import DeviceReport
from tests.support.synced_fleet import MODEL, rebuilt

__all__ = ["MODEL", "active", "package_variants", "rebuilt", "snapshot", "warned"]


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
