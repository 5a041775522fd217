"""Commands that need no flow run start no Prefect API, and do not even import Prefect:
each runs in a fresh interpreter, which then reports whether ``prefect`` was
imported. ``watch --dry-run`` took 15-40 s when it ran the flow; an up-to-date compile
answers from the plan; a compile with no Prefect API and nothing that needs Prefect
publishes without it and keeps its run to be recorded later."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO
from tests.support.specs import CPU_TARGET, tiny_models, write_spec

pytestmark = pytest.mark.slow


PROBE = """
import contextlib, io, json, sys
from epfleet.cli.app import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = main(sys.argv[1:])
print(json.dumps({"code": code, "prefect": "prefect" in sys.modules}))
"""


def probe(*argv: str, cwd: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env |= {"PYTHONPATH": str(REPO), "EPFLEET_CACHE": str(cwd / "cache")}
    env["PREFECT_HOME"] = str(cwd / "prefect-home")  # never the user's
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_commands_without_a_flow_run_import_no_prefect(tmp_path: Path, model_dir: Path) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    store, cache = str(tmp_path / "store"), str(tmp_path / "device")
    first = probe("compile", str(spec), "--store", store, "--workers", "1", cwd=tmp_path)
    # It compiles and publishes, and keeps its run to be recorded: no Prefect API to use.
    assert first == {"code": 0, "prefect": False}
    assert len(list((tmp_path / "cache" / "work" / "kept-runs").glob("*/*.json"))) == 1
    for argv in [
        # Up to date: answered from the plan (the kept run waits for a Prefect API).
        ["compile", str(spec), "--store", store],
        ["watch", str(spec), "--store", store, "--dry-run"],
        ["sync", "--store", store, "--cache", cache],
        ["manifest", "show", "--store", store],
        ["gc", "--store", store],
        ["trust", "status", "--store", store],
        ["retire", "--store", store, "--model", "tiny-cls", "--dry-run"],
    ]:
        result = probe(*argv, cwd=tmp_path)
        assert result == {"code": 0, "prefect": False}, (argv, result)


def test_a_flow_run_refused_for_bad_input_prints_one_line(tmp_path: Path) -> None:
    """``sync --flow`` against a store that is not there: the flow run fails on the
    temporary API, and the terminal gets the one line (the run's traceback stays in its
    logs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "EPFLEET_"))}
    env |= {"PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect-home")}
    done = subprocess.run(
        [sys.executable, "-m", "epfleet", "sync", "--flow", "--store", str(tmp_path / "nope"),
         "--cache", str(tmp_path / "device")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.splitlines() == [
        f"epfleet: error: store {(tmp_path / 'nope').as_uri()} does not exist (no directory "
        f"{tmp_path / 'nope'}): check --store; a fleet publishes there with epfleet compile"
    ], done.stderr[-3000:]
