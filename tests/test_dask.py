"""The fleet flow with `--task-runner dask`: compile tasks run on a Dask cluster (here a
local one of two worker processes), each compile in a child process of its worker."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from epfleet.errors import BadInputError
from epfleet.manifest import Manifest
from epfleet.runners import task_runner
from tests.conftest import CPU_TARGET, HTP_TARGETS, tiny_models, write_spec


@pytest.fixture
def dask_cluster() -> Iterator[str]:
    import dask
    from distributed import LocalCluster

    # as epfleet.runners does for its own clusters: compiles are child processes
    with dask.config.set({"distributed.worker.daemon": False}):
        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        )
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


def executed_per_worker(address: str) -> dict[str, int]:
    from distributed import Client

    with Client(address) as client:
        return dict(client.run(lambda dask_worker: dask_worker.state.executed_count))


def test_fleet_compile_on_a_two_worker_dask_cluster(
    dask_cluster: str, cli_env: dict[str, str], model_dir: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir), [*HTP_TARGETS, CPU_TARGET])
    store = tmp_path / "store"
    assert sum(executed_per_worker(dask_cluster).values()) == 0
    done = subprocess.run(
        [
            *(sys.executable, "-m", "epfleet", "compile", str(spec), "--store", str(store)),
            *("--task-runner", "dask", "--dask-address", dask_cluster, "--json"),
        ],
        env=cli_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert (report["compiled"], report["failed"]) == (6, 0)
    manifest = Manifest.from_json((store / "manifest.json").read_bytes())
    for entry in manifest.models.values():
        assert sorted(entry.variants) == ["sd8g2-htp", "sd8g3-htp", "x86-cpu"]
        assert all(v.status == "ok" and v.artifact for v in entry.variants.values())
    # every compile task ran on the cluster, and both workers took some
    executed = executed_per_worker(dask_cluster)
    assert sum(executed.values()) == 6, executed
    assert all(count > 0 for count in executed.values()), executed


def test_unknown_task_runner_and_stray_address_are_refused() -> None:
    with pytest.raises(BadInputError, match="unknown task runner 'ray'; known: threads"):
        task_runner("ray")
    with pytest.raises(BadInputError, match="--dask-address needs --task-runner dask"):
        task_runner("threads", "tcp://127.0.0.1:8786")


def test_dask_without_an_address_starts_a_local_cluster_of_the_asked_size() -> None:
    import dask

    before = dask.config.get("distributed.worker.daemon")
    try:
        runner = task_runner("dask", None, workers=3)
        assert runner.cluster_kwargs == {
            "n_workers": 3,
            "threads_per_worker": 1,
            "processes": True,
        }
        assert runner.address is None
        # compiles are child processes of a Dask worker: a daemonic one could not start them
        assert dask.config.get("distributed.worker.daemon") is False
    finally:
        dask.config.set({"distributed.worker.daemon": before})


def test_environment_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from epfleet.runners import from_environment

    monkeypatch.setenv("EPFLEET_TASK_RUNNER", "ray")
    with pytest.raises(BadInputError, match="EPFLEET_TASK_RUNNER='ray': unknown task runner"):
        from_environment()
    monkeypatch.setenv("EPFLEET_TASK_RUNNER", "threads")
    monkeypatch.setenv("EPFLEET_DASK_ADDRESS", "tcp://127.0.0.1:8786")
    with pytest.raises(BadInputError, match="EPFLEET_DASK_ADDRESS is set but"):
        from_environment()
    monkeypatch.setenv("EPFLEET_TASK_RUNNER", "dask")
    monkeypatch.setenv("EPFLEET_DASK_WORKERS", "two")
    with pytest.raises(BadInputError, match="EPFLEET_DASK_WORKERS='two'"):
        from_environment()
