"""The device side seen from fresh processes (slow tier: each starts an interpreter or a
shell): a no-op ``epfleet sync`` loads neither ``onnx`` nor the compile side nor Prefect,
and the documented shell line computes a device's poll offset as epfleet does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from epfleet.device.jitter import jitter_seconds
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport
from tests.support.hand_made_fleet import DEVICE, make_fleet
from tests.support.paths import REPO

pytestmark = pytest.mark.slow

NOT_ON_A_NO_OP = (
    "onnx",
    "ml_dtypes",
    "prefect",
    "dask",
    "flows",
    "tasks",
    "epfleet.fleet",
    "epfleet.lifecycle",
    "epfleet.runtime.compiler",
    "epfleet.runtime.compile_pool",
    "epfleet.runtime.quantize",
    "epfleet.runtime.shapes",
    "epfleet.device.health",
    "epfleet.trust.signing",
    "epfleet.trust.creation",
    "epfleet.runtime",
    "epfleet.cli.compile",
    "boto3",  # a local store's sync: not even for securesystemslib's AWS KMS signer
    "botocore",
    "pydantic_settings",
)
"""What a sync that keeps every model never loads: the compile side, Prefect, publishing,
the other commands, and for a local store anything of AWS."""


def test_a_no_op_sync_loads_no_compile_side_and_no_prefect(tmp_path: Path) -> None:
    fleet = make_fleet(str(tmp_path / "store"), tmp_path)
    cache = tmp_path / "cache"
    first = sync(fleet.uri, cache, SyncPolicy(), DEVICE, trust_root=fleet.root)
    assert [m.action for m in first.models] == ["downloaded"], first.models
    loaded = tmp_path / "loaded.json"
    probe = (
        "import json, sys\n"
        "from epfleet.cli.app import main\n"
        "code = main(sys.argv[1:])\n"
        f"open({str(loaded)!r}, 'w').write(json.dumps([code, sorted(sys.modules)]))\n"
    )
    command = ["sync", "--store", fleet.uri, "--cache", str(cache), "--json"]
    done = subprocess.run(
        [sys.executable, "-c", probe, *command, "--device-id", DEVICE],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    code, modules = json.loads(loaded.read_text())
    report = DeviceReport.model_validate_json(done.stdout)
    assert code == 0 and [m.action for m in report.models] == ["kept"]
    heavy = sorted(
        m for m in modules if any(m == name or m.startswith(f"{name}.") for name in NOT_ON_A_NO_OP)
    )
    assert heavy == [], f"a no-op sync loaded {heavy}"
    assert "onnxruntime" in modules  # it did judge the kept variant with ORT


def test_the_documented_shell_line_computes_the_poll_offset() -> None:
    """The first 32 bits of sha256(device id), modulo the interval."""
    line = 'echo $(( 0x$(printf %s "dev-1" | sha256sum | cut -c1-8) % 900 ))'
    shell = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True)
    assert int(shell.stdout) == jitter_seconds("dev-1", 900)
