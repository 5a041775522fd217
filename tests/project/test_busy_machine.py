"""The README's first command on a busy machine: two CPU hogs (`yes > /dev/null`) run while
`epfleet compile examples/fleet.yaml` and `epfleet sync` run in fresh processes with a fresh
worker cache. It used to die with "Timed out while attempting to connect to ephemeral
Prefect API server", then to fall back to compiling without Prefect (no flow run), then to
wait for the temporary API to record its run; now it must succeed
without starting Prefect's temporary API at all (no PREFECT_API_URL: its run is kept in
the worker cache to be recorded later, no Prefect database is made) and activate the CPU
variants."""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from epfleet.formats.device_report import DeviceReport
from tests.support.paths import REPO

pytestmark = pytest.mark.slow


def readme_first_command(store: Path, cache: Path) -> list[list[str]]:
    """The epfleet commands of the README's set-up line (the pip install left out), with
    this test's store and cache."""
    [line] = [
        line
        for line in (REPO / "README.md").read_text().splitlines()
        if "-m epfleet compile examples/fleet.yaml" in line
    ]
    line = line.replace("./epfleet-store", str(store)).replace("./epfleet-device", str(cache))
    commands = [shlex.split(part) for part in line.split("&&")]
    assert commands[0][2:4] == ["pip", "install"], line
    return [[sys.executable, *command[1:]] for command in commands[1:]]


@pytest.fixture
def cpu_hogs() -> Iterator[None]:
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)]
    try:
        yield
    finally:
        for hog in hogs:  # by pid, ours only
            with contextlib.suppress(ProcessLookupError):
                hog.kill()
            hog.wait()


def test_the_readme_first_command_succeeds_on_a_busy_machine(
    tmp_path: Path, cpu_hogs: None
) -> None:
    store, cache = tmp_path / "epfleet-store", tmp_path / "epfleet-device"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "EPFLEET_"))}
    env |= {"EPFLEET_CACHE": str(tmp_path / "worker-cache"), "PYTHONPATH": str(REPO)}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")  # a new database: the slowest start
    for command in readme_first_command(store, cache):
        done = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, f"{shlex.join(command[1:])}:\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, done.stderr[-3000:]
        assert "temporary API did not start" not in done.stderr, done.stderr[-3000:]
    assert not (tmp_path / "prefect-home" / "prefect.db").exists(), "a temporary API started"
    kept = list((tmp_path / "worker-cache" / "work" / "kept-runs").glob("*/*.json"))
    assert len(kept) == 1, "the compile kept no record of its run"
    report = DeviceReport.model_validate_json((cache / ".epfleet" / "last-report.json").read_text())
    assert {m.model: (m.action, m.target) for m in report.models} == {
        "tiny-cls": ("downloaded", "x86-cpu"),
        "tiny-det": ("downloaded", "x86-cpu"),
    }
