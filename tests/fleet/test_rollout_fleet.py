"""Staged rollouts on a simulated fleet: twenty real device caches with distinct ids sync from
one signed store that ``epfleet compile`` publishes to (development keys, the CPU EP).

A second build of a model reaches the canary and about a tenth of the devices, the
others keep the first; ``epfleet rollout revert`` brings every device back at its next
sync, ``epfleet rollout advance`` to the last stage brings all forward; a build whose
health check fails on the devices it reaches is halted by the rollout-gate flow without
a person, and its artifact says why. Every report carries the profile of what runs. A
device offline from the first build to the end lands on what every device runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.artifacts import Artifact

from epfleet.cli.app import main
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.fleet.publishing.publish import read_in_force
from epfleet.formats.device_report import ModelReport
from epfleet.formats.manifest import ModelEntry
from epfleet.stores import open_store
from flows.rollout_gate import rollout_gate
from tests.support.specs import CPU_TARGET, tiny_models, write_spec

pytestmark = pytest.mark.slow

MODEL = "tiny-cls"
TARGET = CPU_TARGET["name"]
DEVICES = [f"dev-{i:03d}" for i in range(20)]
LATE = "dev-late"
"""A device that syncs the first build, then is offline until every device runs the third."""
ROLLOUT = {"stages": [10, 100], "canary": ["dev-000"], "min_reports": 1, "min_hours": 0}


def publish(tmp_path: Path, model_dir: Path, optimization: str, env: dict[str, str]) -> None:
    """A build of tiny-cls for the CPU at ``optimization``: each level another artifact."""
    target = CPU_TARGET | {"graph_optimization": optimization}
    models = [m for m in tiny_models(model_dir) if m["name"] == MODEL]
    spec = tmp_path / "fleet.yaml"
    write_spec(tmp_path, models, [target])
    text = (
        spec.read_text()
        + "rollout:\n"
        + "".join(f"  {key}: {value}\n" for key, value in ROLLOUT.items())
    )
    spec.write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "epfleet", "compile", str(spec), "--store", str(tmp_path / "store")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def sync_all(tmp_path: Path, devices: list[str] = DEVICES) -> dict[str, ModelReport]:
    root = tmp_path / "store.dev-keys" / "root.json"
    results = {}
    for device in devices:
        report = sync(
            str(tmp_path / "store"),
            tmp_path / "devices" / device,
            SyncPolicy(models=[MODEL]),
            device,
            trust_root=root,
        )
        [results[device]] = report.models
    return results


def entry(tmp_path: Path) -> ModelEntry:
    manifest = read_in_force(open_store(str(tmp_path / "store"))).manifest
    assert manifest is not None
    return manifest.models[MODEL]


def runs(reports: dict[str, ModelReport], digest: str | None) -> set[str]:
    return {d for d, r in reports.items() if r.artifact_sha256 == digest}


@pytest.mark.health_in_worker  # devices fail the check by its time limit (0.001 s)
def test_a_rollout_reaches_its_stage_reverts_advances_and_is_halted_by_the_gate(
    tmp_path: Path,
    model_dir: Path,
    prefect_api: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    env = dict(os.environ, PREFECT_API_URL=prefect_api, EPFLEET_CACHE=str(tmp_path / "cache"))
    publish(tmp_path, model_dir, "all", env)
    first = entry(tmp_path)
    assert first.rollout is None  # a first publish is not staged
    v1 = first.variants[TARGET].artifact.sha256  # type: ignore[union-attr]
    before = sync_all(tmp_path, [*DEVICES, LATE])  # LATE then stays offline till the end
    assert runs(before, v1) == {*DEVICES, LATE}
    del before[LATE]
    assert all(r.profile is not None and r.profile.runs >= 5 for r in before.values())

    publish(tmp_path, model_dir, "extended", env)  # a second build: staged
    staged = entry(tmp_path)
    assert staged.rollout is not None and staged.rollout.percent == 10
    v2 = staged.variants[TARGET].artifact.sha256  # type: ignore[union-attr]
    assert v2 != v1 and staged.previous[TARGET].artifact.sha256 == v1  # type: ignore[union-attr]
    reached = sync_all(tmp_path)
    on_new = runs(reached, v2)
    assert on_new == {d for d in DEVICES if staged.for_device(d) is staged} and "dev-000" in on_new
    # about a tenth: the canary and Binomial(19, 0.1) others (9 or more of them: p < 1e-4)
    assert 1 <= len(on_new) <= 9, sorted(on_new)
    assert runs(reached, v1) == set(DEVICES) - on_new  # the others keep the first build
    assert all(
        r.rollout is not None and r.rollout.member == (d in on_new) for d, r in reached.items()
    )

    assert main(["rollout", "revert", "--store", str(tmp_path / "store"), "--model", MODEL]) == 0
    assert runs(sync_all(tmp_path), v1) == set(DEVICES)  # every device back

    publish(tmp_path, model_dir, "basic", env)  # a third build, staged again
    third = entry(tmp_path)
    v3 = third.variants[TARGET].artifact.sha256  # type: ignore[union-attr]
    assert third.previous[TARGET].artifact.sha256 == v1  # type: ignore[union-attr]
    assert main(["rollout", "advance", "--store", str(tmp_path / "store"), "--model", MODEL]) == 0
    assert entry(tmp_path).rollout.percent == 100  # type: ignore[union-attr]
    forward = sync_all(tmp_path)
    assert runs(forward, v3) == set(DEVICES)
    assert all(r.profile is not None for r in forward.values())
    # offline through a staged, a reverted and an advanced rollout: it lands where all are
    assert runs(sync_all(tmp_path, [LATE]), v3) == {LATE}
    assert main(["rollout", "advance", "--store", str(tmp_path / "store"), "--model", MODEL]) == 0
    assert entry(tmp_path).rollout.state == "complete"  # type: ignore[union-attr]

    publish(tmp_path, model_dir, "disable", env)  # a fourth build that fails where it goes
    fourth = entry(tmp_path)
    assert fourth.rollout is not None and fourth.rollout.state == "active"
    reached_ids = {d for d in DEVICES if fourth.for_device(d) is fourth}
    monkeypatch.setenv("EPFLEET_HEALTH_TIMEOUT", "0.001")  # these devices cannot run it in time
    failing = sync_all(tmp_path, sorted(reached_ids))
    assert all(r.action == "failed" for r in failing.values()), failing
    monkeypatch.delenv("EPFLEET_HEALTH_TIMEOUT")
    sync_all(tmp_path, sorted(set(DEVICES) - reached_ids))

    moved = rollout_gate(store=str(tmp_path / "store"))
    assert [m["move"] for m in moved] == ["halt"], moved
    halted = entry(tmp_path).rollout
    assert halted is not None and halted.state == "halted" and "failed" in (halted.reason or "")
    table = Artifact.get("rollout-gate")
    assert table is not None and "halt" in str(table.data) and "failed" in str(table.data)
    field = Artifact.get("fleet-field")
    assert field is not None and MODEL in str(field.data) and TARGET in str(field.data)

    # the fleet's evidence per model x target, from the same reports
    capsys.readouterr()
    store = str(tmp_path / "store")
    assert main(["manifest", "show", "--store", store, "--field", "--json"]) == 0
    [row] = [r for r in json.loads(capsys.readouterr().out) if r["model"] == MODEL]
    assert row["target"] == TARGET and row["failed"] == len(reached_ids)
    assert row["running"] == len(DEVICES) - len(reached_ids) + 1  # LATE too
    assert row["p50_ms"] is not None and row["p95_ms"] >= row["p50_ms"]
