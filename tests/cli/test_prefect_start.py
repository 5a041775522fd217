"""`epfleet compile --prefect temporary` and Prefect's temporary API (without the option,
a compile with no Prefect API starts none: tests/cli/test_kept_runs.py): a temporary API that fails to start is
not fatal (the run compiles and publishes without Prefect, says so in one line, prints no
traceback); compiles show a line each as they finish; Prefect's INFO lines stay out of the
CLI's output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from epfleet.formats.manifest import Manifest
from tests.support.paths import REPO
from tests.support.processes import processes_with
from tests.support.specs import CPU_TARGET, HTP_TARGETS, tiny_models, write_spec

pytestmark = pytest.mark.slow

PAIRS = 2 * (len(HTP_TARGETS) + 1)


def compile_cli(tmp_path: Path, model_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    spec = write_spec(tmp_path, tiny_models(model_dir), [*HTP_TARGETS, CPU_TARGET])
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    environment |= {"EPFLEET_CACHE": str(tmp_path / "worker-cache"), "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "epfleet", "compile", str(spec)),
            *("--store", str(tmp_path / "store"), "--json", "--prefect", "temporary"),
        ],
        cwd=REPO,
        env=environment | env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert not processes_with(f"EPFLEET_CACHE={tmp_path / 'worker-cache'}"), "a process left"
    return done


def assert_published_everything(done: subprocess.CompletedProcess[str], store: Path) -> None:
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["compiled"] == PAIRS and report["failed"] == 0
    manifest = Manifest.model_validate_json((store / "manifest.json").read_bytes())
    assert manifest.generation == report["generation"]
    assert sum(len(m.variants) for m in manifest.models.values()) == PAIRS
    progress = [line for line in done.stderr.splitlines() if line.startswith("epfleet: [")]
    assert len(progress) == PAIRS and f"[{PAIRS}/{PAIRS}]" in progress[-1], done.stderr


def test_a_temporary_api_that_cannot_start_is_not_fatal(tmp_path: Path, model_dir: Path) -> None:
    """The temporary API's database cannot be opened, so its server exits at start-up."""
    done = compile_cli(
        tmp_path,
        model_dir,
        PREFECT_API_DATABASE_CONNECTION_URL="sqlite+aiosqlite:////proc/no-such-dir/prefect.db",
    )  # the default start-up timeout: a server that exits is not waited for
    assert_published_everything(done, tmp_path / "store")
    said = [line for line in done.stderr.splitlines() if "temporary API did not start" in line]
    assert len(said) == 1, done.stderr
    assert "unable to open database file" in said[0], said
    assert "published without Prefect" in said[0]


def test_prefect_info_lines_stay_out_of_the_output(tmp_path: Path, model_dir: Path) -> None:
    done = compile_cli(tmp_path, model_dir, PREFECT_LOGGING_LEVEL="INFO")
    assert_published_everything(done, tmp_path / "store")
    assert "| INFO" not in done.stderr, done.stderr[-3000:]
    assert "temporary API did not start" not in done.stderr
    # One format, and no native banners (QNN's LIBNATIVE lines come with every compile).
    assert all(line.startswith("epfleet: ") for line in done.stderr.splitlines()), done.stderr
    assert "LIBNATIVE" not in done.stderr
    assert "created development keys" in done.stderr  # a warning, in that same format
    outcomes = [line for line in done.stderr.splitlines() if line.startswith("epfleet: [")]
    assert all(": verified in " in line for line in outcomes), outcomes
