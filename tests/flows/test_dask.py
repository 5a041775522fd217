"""Task runners: the runner table, a local Dask cluster's shape, and the EPFLEET_*
variables a deployment picks its runner with (a fleet run on a Dask cluster:
tests/flows/test_dask_cluster.py)."""

from __future__ import annotations

import os

import pytest

from epfleet.errors import BadInputError
from epfleet.fleet.runs.task_runners import DaskWorkers, task_runner, unserved_resource

pytestmark = pytest.mark.fast


def test_unknown_task_runner_and_stray_address_are_refused() -> None:
    with pytest.raises(BadInputError, match="unknown task runner 'ray'; known: threads"):
        task_runner("ray")
    with pytest.raises(BadInputError, match="--dask-address needs --task-runner dask"):
        task_runner("threads", "tcp://127.0.0.1:8786")


def test_dask_without_an_address_starts_a_local_cluster_of_the_asked_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dask
    import distributed  # noqa: F401 (defines the distributed.* config defaults)

    monkeypatch.delenv("DASK_LOGGING__DISTRIBUTED", raising=False)
    before = dask.config.get("distributed.worker.daemon")
    environment = dict(os.environ)
    try:
        runner = task_runner("dask", None, workers=3)
        assert runner.cluster_kwargs == {
            "n_workers": 3,
            "threads_per_worker": 1,
            "processes": True,
            # the workers' log level, in their environment, not in this process's
            "env": {"DASK_LOGGING__DISTRIBUTED": "warning"},
        }
        assert dict(os.environ) == environment
        assert runner.address is None
        # compiles are child processes of a Dask worker: a daemonic one could not start them
        assert dask.config.get("distributed.worker.daemon") is False
    finally:
        dask.config.set({"distributed.worker.daemon": before})


def test_environment_errors_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from epfleet.fleet.runs.task_runners import from_environment

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


def test_a_runtimes_compile_is_refused_only_by_a_cluster_none_of_whose_workers_serves_it() -> None:
    remote = DaskWorkers(resources=frozenset({"runtime-qnn-2.7"}), local=False)
    assert unserved_resource("runtime-qnn-2.7", remote) is None
    assert unserved_resource(None, remote) is None  # a pair not pinned: any worker
    assert unserved_resource("runtime-qnn-2.5", None) is None  # not on Dask: here
    own = DaskWorkers(resources=frozenset(), local=True)
    assert unserved_resource("runtime-qnn-2.5", own) is None  # this machine builds it
    refused = unserved_resource("runtime-qnn-2.5", remote)
    assert refused is not None
    assert "no worker of the Dask cluster advertises resource 'runtime-qnn-2.5'" in refused
    assert refused.endswith("dask worker ADDRESS --resources 'runtime-qnn-2.5=1'")
