"""What the commands a device runs load, each in a fresh interpreter.

- ``epfleet --version`` loads no command's module, no pydantic, no device engine, neither
  onnx, ORT, Prefect nor boto3; ``epfleet --help`` in the same interpreter still lists
  every command with the first line of its help (the commands are registered by name and
  imported when they run, ``epfleet.cli.app``).
- ``epfleet sync`` of a signed S3 store, as a device runs it: securesystemslib's signers
  are loaded with boto3 hidden from them (``epfleet.cli.sync``), and the S3 store then
  loads boto3 as usual and the no-op sync keeps the model, loading neither onnx, Prefect
  nor the compile command.

A no-op sync of a local store (no boto3 either): ``tests/test_device_scale.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from epfleet.cli.app import COMMANDS
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from tests.support.hand_made_fleet import make_fleet
from tests.support.paths import REPO

pytestmark = pytest.mark.slow  # fresh interpreters: what a process imports

ROOT = REPO
CPU = "CPUExecutionProvider"
PROBE = """
import contextlib, io, json, sys
from epfleet.cli.app import main
runs = []
for argv in json.loads(sys.argv[-1]):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    runs.append({"code": code, "out": out.getvalue(), "modules": sorted(sys.modules)})
print(json.dumps(runs))
"""
"""Runs ``main`` on each command line of the JSON list last on its own command line (whose
first arguments are the first command line's, as a process started with it has them), and
prints each one's exit code, output and the modules loaded by then."""


def probe(*argvs: list[str], cwd: Path) -> list[dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPFLEET_")}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argvs[0], json.dumps(argvs)],
        cwd=cwd, env=env | {"PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    runs: list[dict[str, object]] = json.loads(done.stdout.splitlines()[-1])
    return runs


def loaded(modules: object, *packages: str) -> list[str]:
    """The modules of ``packages`` (each a package or module name) among ``modules``."""
    assert isinstance(modules, list)
    return [m for m in modules if any(m == p or m.startswith(f"{p}.") for p in packages)]


def test_version_loads_no_command_and_help_still_lists_them_all(tmp_path: Path) -> None:
    version, help_ = probe(["--version"], ["--help"], cwd=tmp_path)
    assert version["code"] == 0 and str(version["out"]).startswith("epfleet ")
    heavy = ("onnx", "onnxruntime", "prefect", "boto3", "botocore", "pydantic", "numpy")
    engine = ("epfleet.device", "epfleet.fleet", "epfleet.runtime", "epfleet.trust")
    commands = [f"epfleet.cli.{m}" for m in ("compile", "sync", "serve", "store", "trust")]
    commands += ["epfleet.cli.rollout", "epfleet.cli.manifest", "epfleet.cli.prefect_api"]
    assert loaded(version["modules"], *heavy, *engine, *commands) == []
    assert help_["code"] == 0
    rows = [re.match(r"│ (\S+) +(\S.*?) *│$", line) for line in str(help_["out"]).splitlines()]
    listing = {row[1]: row[2] for row in rows if row and not row[1].startswith("-")}
    assert sorted(listing) == sorted(COMMANDS)
    assert all(description for description in listing.values()), listing


def test_a_sync_command_hides_boto3_from_the_signers_and_still_reads_s3(
    s3_bucket: str, tmp_path: Path
) -> None:
    uri, cache = f"s3://{s3_bucket}/fleet", tmp_path / "cache"
    root = make_fleet(uri, tmp_path).root  # model m, its CPU variant for this host, signed
    first = sync(uri, cache, SyncPolicy(), "dev-1", trust_root=root)  # in this process
    assert [m.action for m in first.models] == ["downloaded"], first.models
    (run,) = probe(
        ["sync", "--store", uri, "--cache", str(cache), "--device-id", "dev-1", "--json"],
        cwd=tmp_path,
    )
    report = json.loads(str(run["out"]))
    assert run["code"] == 0 and [m["action"] for m in report["models"]] == ["kept"], report
    assert loaded(run["modules"], "boto3", "securesystemslib.signer") != []
    assert loaded(run["modules"], "onnx", "prefect", "epfleet.cli.compile") == []
