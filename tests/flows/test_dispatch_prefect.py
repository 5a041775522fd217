"""Work-pool dispatch on the Prefect test API: pool pairs without a deployment or a
worker fail alone, and the sweep of hand-over files left by ended or unknown fleet runs
(a pool's own planning: tests/fleet/test_dispatch.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from epfleet.formats.manifest import Manifest
from epfleet.stores import open_store

pytestmark = pytest.mark.slow

CPU = "CPUExecutionProvider"


def test_pool_pairs_without_a_deployment_or_a_worker_fail_alone(
    prefect_api: str, model_dir: Path, tmp_path: Path
) -> None:
    """On the Prefect test API (no workers): one target names a pool with no compile-pairs
    deployment, another a deployment nobody runs. Their pairs fail, each saying why, the
    idle child run is cancelled, and the local pairs are still published."""
    from prefect.client.orchestration import get_client

    from flows.compile_pairs import compile_pairs
    from flows.fleet_compile import fleet_compile
    from tests.support.specs import CPU_TARGET, tiny_models, write_spec

    idle = compile_pairs.to_deployment("idle-pool").apply()
    targets = [
        CPU_TARGET,
        {"name": "nowhere-cpu", "ep": CPU, "work_pool": "nowhere"},
        {"name": "idle-cpu", "ep": CPU, "work_pool": "idle-pool"},
    ]
    spec = write_spec(tmp_path, tiny_models(model_dir)[:1], targets)
    store = tmp_path / "store"
    try:
        report = fleet_compile(str(spec), str(store), workers=1, work_pool_timeout=3)
        first = Manifest.from_json((store / "manifest.json").read_bytes())
        # while the pools stay down, later runs report the same failures and publish nothing
        again = fleet_compile(str(spec), str(store), workers=1, work_pool_timeout=3)
        with get_client(sync_client=True) as client:
            children = [r for r in client.read_flow_runs() if r.deployment_id == idle]
    finally:
        with get_client(sync_client=True) as client:
            client.delete_deployment(idle)
    by_target = {v.target: v for v in report.variants}
    assert by_target["x86-cpu"].status == "ok"
    assert by_target["nowhere-cpu"].status == "failed"
    assert "no deployment compile-pairs/nowhere" in (by_target["nowhere-cpu"].error or "")
    assert by_target["idle-cpu"].status == "failed"
    assert "no worker of work pool 'idle-pool' started" in (by_target["idle-cpu"].error or "")
    assert [c.state.type.value for c in children if c.state] == ["CANCELLED", "CANCELLED"]
    # the new pool pairs' failures are recorded once, beside the published local pair
    assert first.generation == 1
    variants = first.models["tiny-cls"].variants
    assert variants["x86-cpu"].status == "ok"
    assert variants["idle-cpu"].status == variants["nowhere-cpu"].status == "failed"
    assert [v.status for v in again.variants] == ["skipped", "failed", "failed"]
    assert not again.published
    assert Manifest.from_json((store / "manifest.json").read_bytes()) == first


def test_sweep_removes_hand_overs_of_ended_or_unknown_fleet_runs_only(
    prefect_api: str, tmp_path: Path
) -> None:
    from datetime import timedelta
    from uuid import uuid4

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Running

    from epfleet.fleet.runs.handover import results_key
    from tasks.dispatch import sweep_results

    @flow
    def ended() -> None:
        pass

    state = ended(return_state=True)
    done_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        running = client.create_flow_run(ended, state=Running())
    store = open_store(str(tmp_path))
    now, two_days_ago = int(time.time()), int(time.time()) - 2 * 86400
    keys = {
        "ended": results_key(f"{done_id}-1-{now}", "gpu"),
        "running": results_key(f"{running.id}-1-{two_days_ago}", "gpu"),
        "unknown-old": results_key(f"{uuid4()}-1-{two_days_ago}", "gpu"),
        "unknown-new": results_key(f"{uuid4()}-1-{now}", "gpu"),  # another API's live run?
    }
    for key in keys.values():
        store.write(key, b"{}")
    assert sweep_results(store.uri, timedelta(hours=1)) == [keys["unknown-old"]]
    assert sweep_results(store.uri, timedelta(0)) == [keys["ended"]]
    assert sorted(store.list_keys("runs/")) == sorted([keys["running"], keys["unknown-new"]])
