"""Shadow runs on canaries, end to end: ``epfleet compile`` (in this process, on the test
Prefect API, real ORT compiles) publishes tiny-cls with ``rollout: {shadow: {samples: 4},
stages: [10, 100], canary: [dev-000]}``; real device caches sync from the signed store
(health checks and shadow runs in worker processes), and the rollout gate judges their
reports.

A candidate built to disagree (tiny-cls with its last layer perturbed: two columns of the
classifier's weights swapped, a new version that passes its own health check) is kept off
every member device by its shadow run, beside the variant each runs, on the app's inputs
(the canary's hook) or the golden samples' inputs; their reports look healthy (nothing
failed, latency as before) and the gate halts the canary stage on the shadow agreement,
with the figures in its reason. An equivalent candidate (the same source compiled again at
another graph optimisation level) agrees, is activated, and the gate advances.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from epfleet.cli.app import main
from epfleet.device.cache import DeviceCache
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.fleet.publishing.publish import read_in_force
from epfleet.fleet.rollout.rollouts import check_index, read_evidence, run_gate
from epfleet.fleet.rollout.rules import judge
from epfleet.formats.device_report import ModelReport
from epfleet.formats.manifest import ModelEntry
from epfleet.formats.rollout import is_member
from epfleet.stores import open_store
from tests.support.specs import CPU_TARGET, tiny_models, write_spec

pytestmark = pytest.mark.slow

MODEL = "tiny-cls"
TARGET = CPU_TARGET["name"]
DEVICES = [f"dev-{i:03d}" for i in range(8)]
# The latency gate is wide open: these sub-millisecond runs vary several-fold between
# devices on a shared 2-core machine, and a device that kept its variant reports that
# variant's profile, the same build the devices outside the stage run.
ROLLOUT = (
    "rollout:\n  stages: [10, 100]\n  canary: [dev-000, dev-odd]\n  min_reports: 1\n  min_hours: 0\n"
    "  max_latency_regression: 100\n  shadow:\n    samples: 4\n"
)


def perturbed(model_dir: Path, out: Path) -> Path:
    """tiny-cls with its last layer's weights for classes 0 and 1 swapped."""
    model = onnx.load(str(model_dir / "tiny-cls.onnx"))
    [weights] = [i for i in model.graph.initializer if i.name == "fc.w"]
    array = numpy_helper.to_array(weights).copy()
    array[:, [0, 1]] = array[:, [1, 0]]
    weights.CopyFrom(numpy_helper.from_array(array, "fc.w"))
    path = out / "tiny-cls-perturbed.onnx"
    onnx.save(model, str(path))
    return path


def publish(tmp_path: Path, source: Path, optimization: str = "all") -> ModelEntry:
    [model] = [m for m in tiny_models(source.parent) if m["name"] == MODEL]
    model["source"] = str(source)
    write_spec(tmp_path, [model], [CPU_TARGET | {"graph_optimization": optimization}])
    spec = tmp_path / "fleet.yaml"
    spec.write_text(spec.read_text() + ROLLOUT)
    assert main(["compile", str(spec), "--store", str(tmp_path / "store"), "--workers", "1"]) == 0
    manifest = read_in_force(open_store(str(tmp_path / "store"))).manifest
    assert manifest is not None
    return manifest.models[MODEL]


APP_INPUTS = [
    {"x": np.random.default_rng(k).uniform(0, 1, (1, 3, 48, 192)).astype(np.float32)}
    for k in range(6)
]


def app_inputs(model: str, samples: int) -> list[dict[str, np.ndarray]]:
    """The canary's app: its own inputs (more than asked for: the run takes 4)."""
    assert model == MODEL and samples == 4
    return APP_INPUTS


def wrong_inputs(model: str, samples: int) -> list[dict[str, np.ndarray]]:
    """An app whose inputs do not fit the model: an input it does not have."""
    return [{"image": np.zeros((1, 3, 48, 192), np.float32)}]


def sync_all(
    tmp_path: Path, devices: list[str] = DEVICES, hook: object = None
) -> dict[str, ModelReport]:
    """Each device's sync, shadow runs in worker processes; the canary's app feeds its
    inputs, the others give none (the golden samples' inputs), but ``hook``."""
    root = tmp_path / "store.dev-keys" / "root.json"
    results = {}
    for device in devices:
        report = sync(
            str(tmp_path / "store"),
            tmp_path / "devices" / device,
            SyncPolicy(),
            device,
            trust_root=root,
            shadow_inputs=hook or (app_inputs if device == "dev-000" else None),  # type: ignore[arg-type]
        )
        [results[device]] = report.models
    return results


def variant_dirs(tmp_path: Path, device: str) -> set[str]:
    return {p.name for p in (tmp_path / "devices" / device / "models" / MODEL).iterdir()}


@pytest.mark.usefixtures("prefect_api")
def test_a_candidate_that_disagrees_is_halted_by_its_shadow_runs(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "cache"))
    first = publish(tmp_path, model_dir / "tiny-cls.onnx")
    v1 = first.variants[TARGET].digest
    assert {r.artifact_sha256 for r in sync_all(tmp_path, [*DEVICES, "dev-odd"]).values()} == {v1}

    second = publish(tmp_path, perturbed(model_dir, tmp_path))
    rollout = second.rollout
    assert rollout is not None and rollout.policy.shadow is not None
    v2 = second.variants[TARGET].digest
    members = {d for d in DEVICES if is_member(rollout, d)}
    assert "dev-000" in members and v2 != v1

    reached = sync_all(tmp_path)
    for device, found in reached.items():
        # nobody switched, nothing failed: every device serves the first version
        assert found.action in ("kept", "downloaded") and found.artifact_sha256 == v1, found
        assert found.profile is not None
        assert found.rollout is not None and found.rollout.member == (device in members)
        shadow = found.rollout.shadow
        if device not in members:
            assert shadow is None
            continue
        assert shadow is not None and not shadow.within, found.reason
        app = device == "dev-000"
        assert shadow.inputs == ("app" if app else "golden")
        assert shadow.samples == 4 if app else shadow.samples >= 1  # the golden samples: 1
        assert shadow.max_rel_error is not None and shadow.tolerance is not None
        assert shadow.max_rel_error > 10 * shadow.tolerance  # two classes swapped
        assert shadow.candidate_p50_ms > 0 and shadow.active_p50_ms > 0
        assert "outside the model's bounds" in found.reason
        state = DeviceCache(tmp_path / "devices" / device).load_state().models[MODEL]
        assert state.active is not None and state.active.digest == v1
        assert len(variant_dirs(tmp_path, device)) == 1  # the candidate's files are gone

    store = open_store(str(tmp_path / "store"))
    reading = read_evidence(store)
    [status] = reading.statuses
    new = status.evidence.new
    assert new.devices == len(members) and new.failed == 0
    assert new.shadow_runs == len(members) and new.shadow_outside == len(members)
    # the same evidence, judged without the shadow runs, would advance the stage
    blind = rollout.model_copy(
        update={"policy": rollout.policy.model_copy(update={"shadow": None})}
    )
    assert judge(blind, status.evidence, status.rollout.stage_started_at).decision == "advance"
    assert status.verdict.decision == "halt"
    assert "shadow runs found the candidate outside the model's bounds" in status.verdict.reason
    assert "largest error" in status.verdict.reason and "tolerance" in status.verdict.reason
    assert check_index(store)[1] == []  # the index and a full recount agree

    _, moves = run_gate(store)
    assert [(m.move, m.published) for m in moves] == [("halt", True)]
    halted = read_in_force(store).manifest.models[MODEL].rollout  # type: ignore[union-attr]
    assert halted is not None and halted.state == "halted"
    assert halted.reason is not None and "largest error" in halted.reason

    # the next sync downloads nothing again and still reports its shadow run
    again = sync_all(tmp_path, ["dev-000"])["dev-000"]
    assert again.bytes_downloaded == 0 and again.artifact_sha256 == v1
    assert again.rollout is not None and again.rollout.shadow is not None
    assert not again.rollout.shadow.within and "an earlier sync" in again.reason

    # a member whose app gives inputs that do not fit: the model fails, naming the array,
    # the active variant stays; with inputs that fit, its shadow run keeps it off too
    odd = sync_all(tmp_path, ["dev-odd"], wrong_inputs)["dev-odd"]
    assert odd.action == "failed" and "the app's shadow inputs do not fit" in odd.reason
    assert "'image'" in odd.reason and "still running" in odd.reason
    assert odd.artifact_sha256 == v1 and len(variant_dirs(tmp_path, "dev-odd")) == 1
    odd = sync_all(tmp_path, ["dev-odd"], app_inputs)["dev-odd"]
    assert odd.action == "kept" and odd.artifact_sha256 == v1
    assert odd.rollout is not None and odd.rollout.shadow is not None
    assert not odd.rollout.shadow.within and odd.rollout.state == "halted"

    capsys_out = tmp_path / "status.txt"
    with capsys_out.open("w") as out, pytest.MonkeyPatch.context() as patch:
        patch.setattr("sys.stdout", out)
        assert main(["rollout", "status", "--store", str(tmp_path / "store")]) == 0
    assert f"shadow runs: 0 of {len(members) + 1} within" in capsys_out.read_text()  # dev-odd

    # completing the rollout by hand sends every device to the candidate, those that kept
    # their variant included
    uri = str(tmp_path / "store")
    assert main(["rollout", "resume", "--store", uri, "--model", MODEL]) == 0
    for _ in range(2):
        assert main(["rollout", "advance", "--store", uri, "--model", MODEL]) == 0
    done = sync_all(tmp_path, ["dev-000"])["dev-000"]
    assert done.action == "downloaded" and done.artifact_sha256 == v2, done.reason


@pytest.mark.usefixtures("prefect_api")
def test_an_equivalent_candidate_passes_its_shadow_runs(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "cache"))
    first = publish(tmp_path, model_dir / "tiny-cls.onnx")
    v1 = first.variants[TARGET].digest
    sync_all(tmp_path)

    rebuilt = publish(tmp_path, model_dir / "tiny-cls.onnx", "basic")
    rollout = rebuilt.rollout
    assert rollout is not None
    v2 = rebuilt.variants[TARGET].digest
    assert v2 != v1  # another build of the same source
    members = {d for d in DEVICES if is_member(rollout, d)}

    reached = sync_all(tmp_path)
    for device, found in reached.items():
        assert found.artifact_sha256 == (v2 if device in members else v1), found.reason
        shadow = found.rollout.shadow if found.rollout else None
        assert (shadow is not None) == (device in members)
        if shadow is not None:
            assert shadow.within and shadow.samples >= 1, found.reason
            assert shadow.max_rel_error is not None and shadow.tolerance is not None
            assert shadow.max_rel_error <= shadow.tolerance
            assert "shadow run" in found.reason and "agreed" in found.reason

    store = open_store(str(tmp_path / "store"))
    _, moves = run_gate(store)
    assert [(m.move, m.published) for m in moves] == [("advance", True)]
    assert f"{len(members)} of {len(members)} shadow runs within" in moves[0].reason
