"""A compile with no Prefect API at all: it publishes without
starting Prefect's temporary API and keeps the finished run in the worker cache; the next
compile that has a Prefect API records it as a fleet-compile flow run with the artifacts of
a run that compiled, then removes it. No timing asserts. (The record's bounds:
tests/fleet/test_kept_runs.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from epfleet.hashing import store_dir_name
from epfleet.stores import open_store
from tests.support.paths import REPO
from tests.support.specs import CPU_TARGET, tiny_models, write_spec

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

pytestmark = pytest.mark.slow

# Imported by every Python process of the run (it is on PYTHONPATH): a Prefect API server
# (uvicorn) started by the run leaves a mark.
SITECUSTOMIZE = """
import os
if b"uvicorn" in open("/proc/self/cmdline", "rb").read():
    open(os.environ["EPFLEET_TEST_API_MARK"], "a").close()
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
        "EPFLEET_TEST_API_MARK": str(tmp_path / "api-started"),
    }


def kept(tmp_path: Path, store: Path | None = None) -> list[Path]:
    """The runs kept in the worker cache: ``store``'s, or every store's."""
    directory = tmp_path / "cache" / "work" / "kept-runs"
    if store is not None:
        directory /= store_dir_name(open_store(str(store)).uri)
    return sorted(directory.glob("**/*.json"))


def of_store(store: Path, runs: list[FlowRun]) -> list[FlowRun]:
    """The flow runs of ``store``, named as given or by its canonical URI (a kept run)."""
    uri = open_store(str(store)).uri
    return [r for r in runs if r.parameters.get("store") in (str(store), uri)]


def test_a_compile_with_no_api_keeps_its_run_and_a_later_one_records_it(
    tmp_path: Path, model_dir: Path, prefect_api: str
) -> None:
    from prefect.client.orchestration import get_client

    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    store = tmp_path / "store"
    argv = [sys.executable, "-m", "epfleet", "compile", str(spec), "--store", str(store)]
    env = run_env(tmp_path)
    first = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "2 compiled, 0 up to date, 0 failed" in first.stdout, first.stdout
    assert (store / "manifest.json").exists()
    # No Prefect API: none started (no uvicorn process, no database), none mentioned.
    assert not (tmp_path / "api-started").exists(), first.stderr
    assert not (tmp_path / "prefect-home" / "prefect.db").exists()
    assert "temporary API" not in first.stderr, first.stderr
    [said] = [line for line in first.stderr.splitlines() if "kept in" in line]
    assert said.startswith("epfleet: published without Prefect"), said
    assert "PREFECT_API_URL" in said and "--prefect temporary" in said, said
    [record] = kept(tmp_path)
    assert record.suffix == ".json"

    # An API that does not answer: the run stays kept, said in one line; the compile is fine.
    dead = subprocess.run(
        argv, cwd=tmp_path, env=env | {"PREFECT_API_URL": "http://127.0.0.1:9/api"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert dead.returncode == 0, dead.stderr[-3000:]
    [failed] = [line for line in dead.stderr.splitlines() if "did not record" in line]
    assert failed.endswith("; 1 run(s) still kept"), failed
    assert kept(tmp_path) == [record]

    # A later compile (up to date) with a Prefect API records the kept run, then drops it.
    again = subprocess.run(
        argv, cwd=tmp_path, env=env | {"PREFECT_API_URL": prefect_api},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 compiled, 2 up to date" in again.stdout, again.stdout
    assert "epfleet: recorded 1 kept run(s) as fleet-compile flow runs" in again.stderr
    assert "did not record" not in again.stderr, again.stderr[-3000:]
    assert kept(tmp_path) == []
    assert not (tmp_path / "api-started").exists(), "a temporary API was started"
    with get_client(sync_client=True) as client:
        [run] = of_store(store, client.read_flow_runs())
        assert run.state is not None and run.state.is_completed(), run.state
        keys = {a.key for a in client.read_artifacts() if a.flow_run_id == run.id}
    assert {
        "fleet-compile-matrix",
        "fleet-compile-details",
        "fleet-compile-summary",
        "fleet-compile-costs",
    } <= keys, keys


def test_a_compile_run_as_the_flow_records_the_kept_runs_first(
    tmp_path: Path, model_dir: Path, prefect_api: str
) -> None:
    """A compile with work to do on a Prefect API records the kept run before its own flow
    run (its compiles run meanwhile), and both are fleet-compile flow runs."""
    from prefect.client.orchestration import get_client

    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    store = tmp_path / "store"
    argv = [sys.executable, "-m", "epfleet", "compile", str(spec), "--store", str(store)]
    env = run_env(tmp_path)
    first = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert len(kept(tmp_path)) == 1
    again = subprocess.run(
        [*argv, "--force"], cwd=tmp_path, env=env | {"PREFECT_API_URL": prefect_api},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 compiled, 0 up to date, 0 failed" in again.stdout, again.stdout
    assert "epfleet: recorded 1 kept run(s) as fleet-compile flow runs" in again.stderr
    assert kept(tmp_path) == []
    with get_client(sync_client=True) as client:
        runs = of_store(store, client.read_flow_runs())
    assert [r.parameters["force"] for r in sorted(runs, key=lambda r: r.created or 0)] == [
        False,  # the kept run, recorded first
        True,  # this run, compiled as the flow run
    ]


def test_a_compile_records_only_its_own_stores_kept_runs(
    tmp_path: Path, model_dir: Path, prefect_api: str
) -> None:
    """A run kept for one store waits for a compile into that store: a compile into another
    store with a Prefect API records nothing of it."""
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    mine, other = tmp_path / "store", tmp_path / "other-store"
    env = run_env(tmp_path)

    def compile_into(store: Path, api: dict[str, str]) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "epfleet", "compile", str(spec), "--store", str(store)]
        done = subprocess.run(
            argv, cwd=tmp_path, env=env | api, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    compile_into(mine, {})
    [record] = kept(tmp_path, mine)
    recorded = compile_into(other, {"PREFECT_API_URL": prefect_api})
    assert "recorded" not in recorded.stderr and "kept run" not in recorded.stderr
    assert kept(tmp_path, mine) == [record] and kept(tmp_path, other) == []
    # A run kept before runs were kept per store (in kept-runs itself, its store as typed):
    # never recorded, said in one line while it is there.
    before = tmp_path / "cache" / "work" / "kept-runs" / "20261201T000000.000000001-0.json"
    before.write_bytes(record.read_bytes().replace(open_store(str(mine)).uri.encode(), b"store"))
    done = compile_into(mine, {"PREFECT_API_URL": prefect_api})
    [note] = [line for line in done.stderr.splitlines() if "earlier epfleet" in line]
    assert note == (
        f"epfleet: 1 run(s) kept by an earlier epfleet in {before.parent} will not be recorded "
        "(their records do not say for sure which store they were compiled into); remove "
        f"them: rm {before.parent}/*.json*"
    )
    assert "recorded 1 kept run(s)" in done.stderr
    assert kept(tmp_path) == [before]
