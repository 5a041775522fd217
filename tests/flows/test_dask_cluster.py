"""The fleet flow with `--task-runner dask`: compile tasks run on a Dask cluster (here a
local one of two worker processes), each compile in a child process of its worker."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from epfleet.formats.manifest import Manifest
from tests.support.specs import CPU_TARGET, HTP_TARGETS, tiny_models, write_spec

pytestmark = pytest.mark.slow


@pytest.fixture
def dask_cluster() -> Iterator[str]:
    import dask
    from distributed import LocalCluster

    # as epfleet.fleet.runs.task_runners does for its own clusters: compiles are child processes.
    # Set for the cluster's whole life: a worker its nanny starts again (one lost under load,
    # its task rescheduled) reads the setting then, and a daemonic one cannot start a
    # compile ("daemonic processes are not allowed to have children", seen on a busy run).
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


RUNTIME = ["onnxruntime==1.32.0"]


def test_a_runtime_pinned_to_dask_workers_compiles_on_those_that_advertise_it(
    dask_cluster: str, cli_env: dict[str, str], model_dir: Path, tmp_path: Path
) -> None:
    """Of a two-worker cluster and a third worker started as the docs say, with
    ``--resources runtime-ort=1``, only the third compiles runtime ``ort``'s pairs (and
    builds its environment); runtime ``nowhere``, pinned to a resource no worker
    advertises, fails at once, naming it, instead of waiting forever."""
    from distributed import Client

    spec = write_spec(
        tmp_path,
        tiny_models(model_dir),
        [{"name": "cpu", "ep": "CPUExecutionProvider", "runtimes": ["ort", "nowhere"]}],
        runtimes={
            "ort": {"requirements": RUNTIME, "dask_resource": True},
            "nowhere": {"requirements": RUNTIME, "dask_resource": True},
        },
    )
    worker_log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "distributed.cli.dask_worker", dask_cluster),
            *("--nthreads", "1", "--resources", "runtime-ort=1", "--no-dashboard"),
        ],
        # compiles are child processes of the worker (epfleet.fleet.runs.task_runners)
        env=cli_env | {"DASK_DISTRIBUTED__WORKER__DAEMON": "False"},
        stdout=worker_log,
        stderr=subprocess.STDOUT,
    )
    try:
        with Client(dask_cluster) as client:
            client.wait_for_workers(3, timeout=120)
            (advertising,) = [
                address
                for address, info in client.scheduler_info(n_workers=-1)["workers"].items()
                if info.get("resources")
            ]
        done = subprocess.run(
            [
                *(sys.executable, "-m", "epfleet", "compile", str(spec)),
                *("--store", str(tmp_path / "store"), "--task-runner", "dask"),
                *("--dask-address", dask_cluster, "--json"),
            ],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        executed = executed_per_worker(dask_cluster)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
        worker_log.close()
    report = json.loads(done.stdout)
    outcomes = {(r["model"], r["target"]): r for r in report["variants"]}
    for model in ("tiny-cls", "tiny-det"):
        assert outcomes[(model, "cpu.ort")]["status"] == "ok", done.stderr[-3000:]
        failed = outcomes[(model, "cpu.nowhere")]
        assert failed["status"] == "failed"
        assert "advertises resource 'runtime-nowhere'" in failed["error"]
        assert "--resources 'runtime-nowhere=1'" in failed["error"]
    # both of runtime ort's compiles ran on the worker advertising it, none elsewhere
    assert executed.pop(advertising) == 2, executed
    assert sum(executed.values()) == 0, executed
    manifest = Manifest.from_json((tmp_path / "store" / "manifest.json").read_bytes())
    entry = manifest.models["tiny-cls"].variants["cpu.ort"]
    assert entry.runtime is not None and entry.runtime.name == "ort"
