"""The attack suite's cases that need a process of their own or Prefect: the device-sync
flow run verifying with its trust root, and `epfleet sync --report-to` through a mirror
in a fresh process, as a device runs it. The rest is in test_attacks.py (fast tier)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from epfleet.device.policy import SyncPolicy
from epfleet.formats.device_report import decode_report, report_key
from tests.support.signed_fleet import (
    DEVICE,
    MODEL,
    Fleet,
)

pytestmark = [pytest.mark.slow]


def test_the_device_sync_flow_verifies_with_its_trust_root(local_fleet: Fleet) -> None:
    from prefect.artifacts import Artifact

    from flows.device_sync import device_sync

    fleet = local_fleet
    report = device_sync(
        cache=str(fleet.cache),
        store=fleet.site.uri,
        policy=SyncPolicy(models=[MODEL]),
        device="trusting-flow",
        trust_root=str(fleet.root),
    )
    assert report.exit_code == 0 and report.manifest.signed, report.manifest
    summary = Artifact.get("device-sync-trusting-flow-summary")
    assert summary is not None and "signed)" in str(summary.data)
    assert "unsigned" not in str(summary.data) and "None" not in str(summary.data)


def test_sync_report_to_on_the_command_line(mirror_fleet: Fleet, tmp_path: Path) -> None:
    """`epfleet sync --report-to DIR` through the mirror, as a device runs it: exit 0, the
    model active, the report in DIR and none behind the mirror. In a process of its own,
    as a device runs it (that the option leaves the environment alone is tested
    in-process: tests/cli/test_edges.py)."""
    reports = tmp_path / "cli-reports"
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPFLEET_")}
    done = subprocess.run(
        [sys.executable, "-m", "epfleet", "sync", "--store", mirror_fleet.site.uri,
         "--cache", str(mirror_fleet.cache), "--model", MODEL, "--device-id", DEVICE,
         "--trust-root", str(mirror_fleet.root), "--report-to", str(reports), "--json"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout)["report_uploaded"] is True
    assert decode_report((reports / report_key(DEVICE)).read_bytes(), 1 << 20).device_id == DEVICE
    assert not (mirror_fleet.site.directory / report_key(DEVICE)).exists()
