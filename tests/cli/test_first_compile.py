"""The first compile with ``--prefect temporary`` (without it, a compile
with no Prefect API starts none: tests/cli/test_kept_runs.py): it publishes while Prefect's
temporary API starts, says how far it got before the API is up, records the finished run on
the API once it answers (the same artifacts as a flow run that compiled), and a second run
with nothing to compile starts no API. Ordering, never timing: the API's process is held at start-up by a
gate file until the test has seen the run published."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.specs import CPU_TARGET, tiny_models, write_spec

pytestmark = pytest.mark.slow

# Imported by every Python process of the run (it is on PYTHONPATH); only Prefect's
# temporary API (uvicorn) waits, until the gate file exists.
SITECUSTOMIZE = """
import os, time
if b"uvicorn" in open("/proc/self/cmdline", "rb").read():
    gate = os.environ["EPFLEET_TEST_API_GATE"]
    deadline = time.monotonic() + 600
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
"""


def run_env(tmp_path: Path) -> dict[str, str]:
    hook = tmp_path / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "EPFLEET_"))}
    return env | {
        "PYTHONPATH": f"{REPO}{os.pathsep}{hook}",
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "EPFLEET_CACHE": str(tmp_path / "cache"),
        "EPFLEET_TEST_API_GATE": str(tmp_path / "gate"),
    }


def test_first_compile_publishes_before_the_api_is_up_and_records_after(
    tmp_path: Path, model_dir: Path
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    argv = [sys.executable, "-m", "epfleet", "compile", str(spec), "--store", "store"]
    argv += ["--prefect", "temporary"]
    env = run_env(tmp_path)
    cli = subprocess.Popen(
        argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    assert cli.stderr is not None
    reader = threading.Thread(target=lambda: lines.extend(cli.stderr or []), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 300
        while not any("waiting for Prefect's temporary API" in line for line in lines):
            assert cli.poll() is None and time.monotonic() < deadline, "".join(lines)
            time.sleep(0.1)
        # The API is held at start-up: the run is published already.
        assert (tmp_path / "store" / "manifest.json").exists()
        (tmp_path / "gate").touch()
        assert cli.wait(300) == 0, "".join(lines)
    finally:
        cli.kill()
    reader.join(10)
    said = [line.rstrip("\n") for line in lines]
    order = [
        next(k for k, line in enumerate(said) if line.startswith(prefix))
        for prefix in (
            "epfleet: planning ",
            "epfleet: 2 of 2 pairs (model × target) to compile",
            "epfleet: starting Prefect's temporary API",
            "epfleet: [2/2] ",
            "epfleet: published (manifest generation 1); waiting for Prefect's temporary API",
            "epfleet: Prefect's temporary API answered",
        )
    ]
    assert order == sorted(order), said
    assert not any("did not" in line for line in said), said  # started, and recorded
    # Recorded as a fleet-compile flow run, with the artifacts of one that compiled.
    with sqlite3.connect(tmp_path / "prefect-home" / "prefect.db") as db:
        flows = {name for (name,) in db.execute("select name from flow")}
        keys = {key for (key,) in db.execute("select key from artifact")}
    assert "fleet-compile" in flows
    assert {"fleet-compile-matrix", "fleet-compile-summary", "fleet-compile-costs"} <= keys

    # A second run has nothing to compile: no Prefect API is started, none waited for.
    again = subprocess.run(
        argv, cwd=tmp_path, env=env | {"EPFLEET_TEST_API_GATE": str(tmp_path / "no-gate")},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "temporary API" not in again.stderr, again.stderr
    assert "0 compiled, 2 up to date" in again.stdout, again.stdout
