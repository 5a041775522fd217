"""epfleet as operators run it: a real `prefect server` on loopback, the `epfleet` and
`gpu-compilers` process work pools, `prefect deploy --all --prefect-file
deployments/prefect.yaml` from this checkout, process workers, runs started through the
API as the UI starts them, and the events epfleet emits read back from the server.

The `gpu-compilers` pool stands in for a pool of GPU machines: its target compiles for the
CPU EP here (this host has no GPU), which is all the routing and merging needs.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prefect.client.base import PrefectHttpxSyncClient

from epfleet.fleet.publishing.publish import update_manifest
from epfleet.formats.device_report import DeviceInfo, DeviceReport, ManifestStatus, ModelReport
from epfleet.formats.manifest import Manifest, utcnow
from epfleet.stores import open_store
from tests.support.paths import REPO
from tests.support.specs import CPU_TARGET, HTP_TARGETS, tiny_models, write_spec

# one worker under pytest-xdist (--dist loadgroup): its module fixtures start a Prefect
# server and work-pool workers, once
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deployments")]

POOL_TARGET = {"name": "pool-cpu", "ep": "CPUExecutionProvider", "work_pool": "gpu-compilers"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Server:
    """A `prefect server start` process and the environment that points clients at it."""

    def __init__(self, home: Path) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}/api"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")} | {
            "PREFECT_HOME": str(home),
            "PREFECT_API_URL": self.url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_LOGGING_LEVEL": "WARNING",
        }
        server_env = self.env | {
            "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home}/prefect.db",
            "PREFECT_SERVER_UI_ENABLED": "false",
            "PREFECT_SERVER_LOGGING_LEVEL": "WARNING",
            "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "0.5",
        }
        self.log = open(home / "server.log", "wb")  # noqa: SIM115
        # No scheduler: the interval schedules would start runs of their own mid-test.
        # Tests read the schedules and start runs as the UI's "Run" button does.
        self.process = subprocess.Popen(
            [
                *(sys.executable, "-m", "prefect", "server", "start"),
                *("--host", "127.0.0.1", "--port", str(port), "--no-scheduler"),
            ],
            env=server_env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        # Prefect's own HTTP client: a server on SQLite answers 503 while the database is
        # busy (a worker, the event persister and this test all write to it), and Prefect's
        # clients retry those with backoff; a plain httpx client failed the test instead.
        self.http = PrefectHttpxSyncClient(base_url=self.url, timeout=30, raise_on_all_errors=False)

        def healthy() -> bool:
            assert self.process.poll() is None, (home / "server.log").read_text()[-3000:]
            try:
                return self.http.get("/health").status_code == 200
            except httpx.TransportError:
                return False

        wait_until(healthy, 120, "prefect server to answer")

    def prefect(self, *args: str, cwd: Path = REPO) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "prefect", *args],
            env=self.env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def deployment(self, name: str) -> dict[str, Any]:
        got = self.http.get(f"/deployments/name/{name}")
        assert got.status_code == 200, f"{name}: {got.text}"
        return dict(got.json())

    def start_run(self, deployment: str, parameters: dict[str, Any]) -> str:
        got = self.http.post(
            f"/deployments/{self.deployment(deployment)['id']}/create_flow_run",
            json={"parameters": parameters},
        )
        assert got.status_code == 201, got.text
        return str(got.json()["id"])

    def flow_run(self, run_id: str) -> dict[str, Any]:
        return dict(self.http.get(f"/flow_runs/{run_id}").json())

    def wait_for_run(self, run_id: str, timeout: float = 300) -> dict[str, Any]:
        def final() -> dict[str, Any] | None:
            run = self.flow_run(run_id)
            state = run.get("state") or {}
            return run if state.get("type") in FINAL_STATES else None

        return dict(wait_until(final, timeout, f"flow run {run_id} to end", interval=1))

    def flow_runs(self, deployment: str) -> list[dict[str, Any]]:
        got = self.http.post(
            "/flow_runs/filter",
            json={"deployments": {"id": {"any_": [self.deployment(deployment)["id"]]}}},
        )
        return list(got.json())

    def artifact(self, run_id: str, key: str) -> str:
        got = self.http.post(
            "/artifacts/filter",
            json={"artifacts": {"flow_run_id": {"any_": [run_id]}, "key": {"any_": [key]}}},
        )
        assert got.status_code == 200, got.text
        found = got.json()
        assert len(found) == 1, found
        return str(found[0]["data"])

    def events(self, name: str) -> list[dict[str, Any]]:
        got = self.http.post(
            "/events/filter",
            json={
                "filter": {
                    "event": {"name": [name]},
                    "occurred": {"since": "2020-01-01T00:00:00Z"},
                    "order": "ASC",
                },
                "limit": 50,
            },
        )
        assert got.status_code == 200, got.text
        return list(got.json()["events"])

    def stop(self) -> None:
        self.http.close()
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


FINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    running = Server(tmp_path_factory.mktemp("prefect-server"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def deployment_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet") / "store"


@pytest.fixture(scope="module")
def deployed(server: Server, deployment_store: Path) -> Server:
    """The docs' Prefect server steps (docs/get-started/prefect-server.md): set the store
    in deployments/prefect.yaml (a copy: the checkout is left alone), create the pools,
    deploy everything from this clone."""
    shipped = (REPO / "deployments" / "prefect.yaml").read_text()
    assert shipped.count("./epfleet-store") == 1, "the store is set in one place"
    edited = deployment_store.parent / "prefect.yaml"
    edited.write_text(shipped.replace("./epfleet-store", str(deployment_store)))
    server.prefect("work-pool", "create", "epfleet", "--type", "process")
    server.prefect("work-pool", "create", "gpu-compilers", "--type", "process")
    server.prefect("--no-prompt", "deploy", "--all", "--prefect-file", str(edited))
    return server


class Workers:
    """`prefect worker start --pool P` processes, started outside the checkout (the pull
    step moves each flow run into it)."""

    def __init__(self, server: Server, where: Path, env: dict[str, str]) -> None:
        self.processes: list[subprocess.Popen[bytes]] = []
        self.server, self.where, self.env = server, where, env

    def start(self, pool: str, *options: str) -> None:
        log = open(self.where / f"worker-{pool}.log", "wb")  # noqa: SIM115
        self.processes.append(
            subprocess.Popen(
                [sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, *options],
                env=self.server.env | self.env | {"PREFECT_WORKER_QUERY_SECONDS": "1"},
                cwd=self.where,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )

    def logs(self) -> str:
        return "\n".join(p.read_text()[-3000:] for p in self.where.glob("worker-*.log"))

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGINT)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture
def workers(deployed: Server, tmp_path: Path) -> Iterator[Workers]:
    running = Workers(deployed, tmp_path, {"EPFLEET_CACHE": str(tmp_path / "worker-cache")})
    # compile workers: the `devices` queue (device-sync) is for the machine that syncs
    running.start("epfleet", "--work-queue", "default")
    running.start("gpu-compilers")
    try:
        yield running
    finally:
        running.stop()


def unserved_report(device_id: str) -> str:
    """The report `epfleet sync` uploads from a PC whose OpenVINO NPU no target is for."""
    report = DeviceReport(
        device_id=device_id,
        generated_at=utcnow().isoformat(),
        ort_version="1.32.0",
        ep_packages={"onnxruntime": "1.32.0", "onnxruntime-ep-openvino": "1.8.1"},
        devices=[
            DeviceInfo(
                ep="OpenVINOExecutionProvider",
                type="npu",
                vendor="Intel",
                vendor_id=0x8086,
                device_id=0x643E,
                ep_vendor="Intel",
            )
        ],
        store="s3://fleet",
        cache="/var/lib/app/models",
        manifest=ManifestStatus(status="fetched", generation=1, body_bytes=100),
        models=[
            ModelReport(
                model="tiny-det",
                action="fallback",
                variant="source",
                target=None,
                ep="CPUExecutionProvider",
                verdict=None,
                bytes_downloaded=0,
                reason="no published variant is optimal here",
                considered=[],
                seconds=0.2,
            )
        ],
        seconds=0.5,
    )
    return report.model_dump_json()


def read_manifest(store: Path) -> Manifest:
    return Manifest.from_json((store / "manifest.json").read_bytes())


def test_deployments_have_the_schedules_and_forms_of_prefect_yaml(
    deployed: Server, deployment_store: Path
) -> None:
    nightly = deployed.deployment("fleet-compile/nightly")
    assert [s["schedule"] for s in nightly["schedules"]] == [
        {"cron": "0 2 * * *", "timezone": "UTC", "day_or": True}
    ]
    assert nightly["parameters"] == {"spec": "examples/fleet.yaml", "store": str(deployment_store)}
    assert nightly["work_pool_name"] == "epfleet"
    assert nightly["global_concurrency_limit"]["limit"] == 1  # one nightly at a time
    periodic = deployed.deployment("device-sync/periodic")
    assert [s["schedule"]["interval"] for s in periodic["schedules"]] == [900.0]
    assert all(s["active"] for s in periodic["schedules"] + nightly["schedules"])
    gate = deployed.deployment("rollout-gate/gate")
    assert gate["global_concurrency_limit"]["limit"] == 1  # one gate run at a time
    assert gate["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"
    hourly = deployed.deployment("runtime-watch/hourly")
    assert [s["schedule"]["interval"] for s in hourly["schedules"]] == [3600.0]
    on_demand = deployed.deployment("fleet-compile/on-demand")
    assert on_demand["schedules"] == []
    form = on_demand["parameter_openapi_schema"]
    assert {"spec", "store", "models", "targets", "force"} <= set(form["properties"])
    models = form["properties"]["models"]
    assert models["description"] == "Only these models (empty: every model of the spec)."
    assert models["type"] == "array" and models["default"] == []  # a list, not list | None
    assert form["required"] == ["spec"]
    assert deployed.deployment("compile-pairs/gpu-compilers")["work_pool_name"] == "gpu-compilers"
    # the pull step runs each flow in this checkout, as recorded when it was deployed
    assert nightly["pull_steps"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
    ]


def test_on_demand_run_compiles_on_both_pools_and_publishes(
    deployed: Server, workers: Workers, deployment_store: Path, model_dir: Path, tmp_path: Path
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir), [HTP_TARGETS[0], CPU_TARGET, POOL_TARGET])
    store = deployment_store  # the deployment's own: the form's store left as it is
    run_id = deployed.start_run("fleet-compile/on-demand", {"spec": str(spec), "workers": 2})
    run = deployed.wait_for_run(run_id)
    assert run["state"]["type"] == "COMPLETED", workers.logs()
    manifest = read_manifest(store)
    assert manifest.generation == 1
    for model in ("tiny-cls", "tiny-det"):
        variants = manifest.models[model].variants
        assert sorted(variants) == ["pool-cpu", "sd8g3-htp", "x86-cpu"]
        assert all(v.status == "ok" for v in variants.values()), variants
        for v in variants.values():
            assert v.artifact is not None
            assert (store / v.artifact.uri).stat().st_size == v.artifact.size
    # the pool-bound pairs were compiled by a compile-pairs run on the gpu-compilers pool,
    # a child of this run, whose hand-over file was removed after the merge
    children = deployed.flow_runs("compile-pairs/gpu-compilers")
    assert [c["state"]["type"] for c in children] == ["COMPLETED"]
    assert children[0]["work_pool_name"] == "gpu-compilers"
    assert children[0]["parent_task_run_id"] is not None
    assert not (store / "runs").exists() or not any((store / "runs").rglob("*.json"))

    published = wait_until(
        lambda: (e := deployed.events("epfleet.variant.published")) and len(e) >= 6 and e,
        30,
        "six epfleet.variant.published events",
    )
    resources = sorted(e["resource"]["prefect.resource.id"] for e in published)
    assert resources == sorted(
        f"epfleet.variant.{m}.{t}"
        for m in ("tiny-cls", "tiny-det")
        for t in ("pool-cpu", "sd8g3-htp", "x86-cpu")
    )
    assert {e["resource"]["epfleet.store"] for e in published} == {str(store)}

    # the automation prefect.yaml attaches to device-sync/periodic: six variants published to
    # its store start one sync (at most one a minute)
    syncs = wait_until(
        lambda: deployed.flow_runs("device-sync/periodic"), 30, "the automation's device sync"
    )
    automations = deployed.http.post("/automations/filter", json={}).json()
    (sync_on_publish,) = [
        a for a in automations if a["trigger"].get("expect") == ["epfleet.variant.published"]
    ]
    trigger = sync_on_publish["trigger"]
    assert trigger["match"]["epfleet.store"] == str(store) and trigger["within"] == 60.0
    assert [a["deployment_id"] for a in sync_on_publish["actions"]] == [
        deployed.deployment("device-sync/periodic")["id"]
    ]
    time.sleep(2)  # a second run for the same minute would have been created by now
    syncs = deployed.flow_runs("device-sync/periodic")
    assert len(syncs) == 1
    assert syncs[0]["parameters"]["store"] == str(store)
    assert syncs[0]["parameters"]["cache"] == "./epfleet-device"

    # unchanged inputs: the pool finds its pairs up to date by its own packages, so nothing
    # compiles anywhere and nothing is published
    again = deployed.wait_for_run(
        deployed.start_run("fleet-compile/on-demand", {"spec": str(spec)})
    )
    assert again["state"]["type"] == "COMPLETED", workers.logs()
    children = deployed.flow_runs("compile-pairs/gpu-compilers")
    assert sorted(c["state"]["type"] for c in children) == ["COMPLETED", "COMPLETED"]
    assert read_manifest(store) == manifest
    summary = deployed.artifact(again["id"], "fleet-compile-summary")
    assert summary.startswith("**0 compiled, 6 up to date, 0 failed**"), summary

    # runtime-watch: the manifest now says one pair was compiled with an older QNN EP (as
    # workers with onnxruntime-qnn 2.6.0 would have published it: its fingerprint differs
    # too), published and signed as any publish is (the store has development keys)
    def older_ep(current: Manifest | None) -> Manifest:
        assert current is not None
        entry = current.models["tiny-det"].model_copy(deep=True)
        older = entry.variants["sd8g3-htp"]
        older.ep_version, older.fingerprint = "2.6.0", "0" * 64
        models = current.models | {"tiny-det": entry}
        return Manifest(generation=current.generation + 1, models=models)

    assert update_manifest(open_store(str(store)), older_ep).published
    # and a device whose NPU no target is for runs det on the CPU fallback
    (store / "reports" / "devices").mkdir(parents=True)
    (store / "reports" / "devices" / "npu-pc-1.json").write_text(unserved_report("npu-pc-1"))

    watch_id = deployed.start_run("runtime-watch/hourly", {"spec": str(spec), "store": str(store)})
    watch = deployed.wait_for_run(watch_id)
    assert watch["state"]["type"] == "COMPLETED", workers.logs()
    triggered = [
        r for r in deployed.flow_runs("fleet-compile/on-demand") if "runtime-watch" in r["tags"]
    ]
    assert len(triggered) == 1
    assert triggered[0]["parameters"]["models"] == ["tiny-det"]
    assert triggered[0]["parameters"]["targets"] == ["sd8g3-htp"]
    assert deployed.wait_for_run(triggered[0]["id"])["state"]["type"] == "COMPLETED"
    recompiled = read_manifest(store)
    fresh = recompiled.models["tiny-det"].variants["sd8g3-htp"]
    assert fresh.ep_version == manifest.models["tiny-det"].variants["sd8g3-htp"].ep_version
    changed = [
        (m, t)
        for m, entry in recompiled.models.items()
        for t, v in entry.variants.items()
        if v.compiled_at != manifest.models[m].variants[t].compiled_at
    ]
    assert changed == [("tiny-det", "sd8g3-htp")]

    unserved = wait_until(
        lambda: deployed.events("epfleet.device.unserved"), 30, "an epfleet.device.unserved event"
    )
    assert unserved[0]["payload"]["devices"] == ["npu-pc-1"]
    assert unserved[0]["payload"]["models"]["tiny-det"].startswith(
        "no target in the spec for OpenVINOExecutionProvider"
    )

    # the next watch finds every pair current and starts nothing
    again = deployed.start_run("runtime-watch/hourly", {"spec": str(spec), "store": str(store)})
    assert deployed.wait_for_run(again)["state"]["type"] == "COMPLETED"
    assert (
        len(
            [
                r
                for r in deployed.flow_runs("fleet-compile/on-demand")
                if "runtime-watch" in r["tags"]
            ]
        )
        == 1
    )


def test_serve_py_serves_every_deployment_and_keeps_schedules_on_shutdown(
    prefect_api: str, model_dir: Path, tmp_path: Path
) -> None:
    """`python deployments/serve.py`: one process, no work pool. A compile and a device sync
    started through the API run in it; after SIGTERM the schedules are still active."""
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.exceptions import ObjectNotFound

    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    store, cache = tmp_path / "store", tmp_path / "device"
    env = dict(os.environ, PREFECT_API_URL=prefect_api, PREFECT_LOGGING_LEVEL="WARNING")
    served = subprocess.Popen(
        [
            *(sys.executable, str(REPO / "deployments" / "serve.py")),
            *("--spec", str(spec), "--store", str(store), "--cache", str(cache)),
            *("--nightly", "30 3 * * *", "--sync-every", "600"),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def started(name: str) -> Any:
        assert served.poll() is None, served.communicate()[1][-3000:]
        try:  # the test API schedules nothing by itself: start runs as the UI would
            return run_deployment(name, timeout=0)
        except ObjectNotFound:
            return None  # not served yet

    try:
        wait_until(lambda: started("fleet-compile/on-demand"), 120, "fleet-compile/on-demand")
        wait_until(lambda: (store / "manifest.json").exists(), 120, "the compile to publish")
        wait_until(lambda: started("device-sync/periodic"), 30, "device-sync/periodic")
        report = store / "reports" / "devices"
        wait_until(lambda: report.exists() and any(report.iterdir()), 120, "a device report")
    finally:
        served.send_signal(signal.SIGTERM)
        _, stderr = served.communicate(timeout=60)  # it exits: no hang on shutdown
    assert (store / "manifest.json").exists(), stderr[-3000:]
    assert sorted(read_manifest(store).models) == ["tiny-cls", "tiny-det"]
    assert (cache / "manifest.json").exists()

    names = ["fleet-compile/nightly", "fleet-compile/on-demand", "device-sync/periodic"]
    names += ["runtime-watch/hourly", "rollout-gate/gate"]
    with get_client(sync_client=True) as client:
        nightly, _, periodic, hourly, gate = (client.read_deployment_by_name(n) for n in names)
        for name in names:  # other tests of this API serve deployments of these names
            client.delete_deployment(client.read_deployment_by_name(name).id)
    assert nightly.schedules[0].schedule.cron == "30 3 * * *"  # type: ignore[union-attr]
    assert nightly.global_concurrency_limit is not None
    assert nightly.global_concurrency_limit.limit == 1
    assert periodic.schedules[0].schedule.interval.total_seconds() == 600  # type: ignore[union-attr]
    assert hourly.schedules[0].schedule.interval.total_seconds() == 3600  # type: ignore[union-attr]
    assert gate.schedules[0].schedule.interval.total_seconds() == 3600  # type: ignore[union-attr]
    assert gate.parameters == {"store": str(store)}
    assert not periodic.paused and periodic.schedules[0].active, "schedule paused on shutdown"
    assert nightly.parameters["store"] == str(store)


def test_serve_py_after_prefect_deploy_runs_the_flows_here(
    deployed: Server, deployment_store: Path, model_dir: Path, tmp_path: Path
) -> None:
    """`prefect deploy` first, then `python deployments/serve.py` against the same API:
    serving used to update those deployments without their path, so every run crashed with
    FileNotFoundError: .../None. Now the served ones replace them and a run completes."""
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    store = tmp_path / "store"
    assert deployed.deployment("fleet-compile/on-demand")["work_pool_name"] == "epfleet"
    served = subprocess.Popen(
        [
            *(sys.executable, str(REPO / "deployments" / "serve.py")),
            *("--spec", str(spec), "--store", str(store), "--cache", str(tmp_path / "device")),
            *("--nightly", "45 4 * * *"),
        ],
        env=deployed.env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def served_here() -> bool:
        assert served.poll() is None, served.communicate()[1][-3000:]
        got = deployed.http.get("/deployments/name/fleet-compile/nightly")
        schedules = got.json().get("schedules") if got.status_code == 200 else None
        # serve.py takes the deployed ones over (deletes them) and then serves its own one
        # by one: the on-demand one may follow the nightly one by a moment
        on_demand = deployed.http.get("/deployments/name/fleet-compile/on-demand")
        return (
            bool(schedules)
            and schedules[0]["schedule"].get("cron") == "45 4 * * *"
            and on_demand.status_code == 200
        )

    try:
        wait_until(served_here, 120, "serve.py to serve its deployments")
        run = deployed.wait_for_run(deployed.start_run("fleet-compile/on-demand", {}))
    finally:
        served.send_signal(signal.SIGTERM)
        _, stderr = served.communicate(timeout=60)
        # Put back the deployments of prefect.yaml for the other tests of this module.
        deployed.prefect(
            "--no-prompt",
            "deploy",
            "--all",
            "--prefect-file",
            str(deployment_store.parent / "prefect.yaml"),
        )
    assert run["state"]["type"] == "COMPLETED", (run["state"], stderr[-3000:])
    assert sorted(read_manifest(store).models) == ["tiny-cls", "tiny-det"]
    assert (
        "serving fleet-compile/on-demand here instead of its deployment (work pool epfleet)"
        in stderr
    )


def test_a_runtime_pinned_to_a_work_pool_compiles_there_in_its_own_environment(
    deployed: Server, workers: Workers, model_dir: Path, tmp_path: Path
) -> None:
    """Runtime ``ort`` names the gpu-compilers pool: its pairs go to a compile-pairs run
    there, whose worker builds the runtime's environment in its own cache and fingerprints
    with it, exactly as this host would (the same spec without the pool plans nothing)."""
    from epfleet.fleet.planning.plan import plan_run

    runtime = {"requirements": ["onnxruntime==1.32.0"]}
    targets = [CPU_TARGET, {"name": "rt-cpu", "ep": "CPUExecutionProvider", "runtimes": ["ort"]}]
    spec = write_spec(
        tmp_path,
        tiny_models(model_dir),
        targets,
        runtimes={"ort": runtime | {"work_pool": "gpu-compilers"}},
    )
    store = tmp_path / "store"
    children_before = len(deployed.flow_runs("compile-pairs/gpu-compilers"))
    run = deployed.wait_for_run(
        deployed.start_run("fleet-compile/on-demand", {"spec": str(spec), "store": str(store)})
    )
    assert run["state"]["type"] == "COMPLETED", workers.logs()
    children = deployed.flow_runs("compile-pairs/gpu-compilers")
    assert len(children) == children_before + 1
    (child,) = [c for c in children if c["parameters"]["store"].endswith(str(store))]
    assert child["state"]["type"] == "COMPLETED"
    assert (
        sorted(p["request"]["target"] for p in child["parameters"]["pairs"]) == ["rt-cpu.ort"] * 2
    )
    manifest = read_manifest(store)
    for model in ("tiny-cls", "tiny-det"):
        entry = manifest.models[model].variants["rt-cpu.ort"]
        assert entry.status == "ok" and entry.runtime is not None
        assert (entry.runtime.name, entry.runtime.onnxruntime) == ("ort", "1.32.0")
    built = list((tmp_path / "worker-cache" / "runtimes").glob("*/versions.json"))
    assert len(built) == 1, "the pool's worker built the runtime's environment"

    unpinned = write_spec(
        tmp_path, tiny_models(model_dir), targets, name="here.yaml", runtimes={"ort": runtime}
    )
    plan = plan_run(unpinned, str(store))
    assert [(p.request.target, p.action) for p in plan.pairs] == [
        ("x86-cpu", "skip"),
        ("rt-cpu.ort", "skip"),
    ] * 2
