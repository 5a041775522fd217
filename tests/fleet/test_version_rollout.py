"""A new model version under a staged rollout, end to end: ``epfleet compile``
(in this process, on the test Prefect API, real ORT compiles) publishes tiny-cls, then a
retrained tiny-cls (other weights: a new source, new golden samples) with ``rollout:
{stages: [10, 100], canary: [dev-000]}``; twenty real device caches with distinct ids
sync from the signed store.

The canary and about a tenth of the devices run the new version; the others keep the
previous one, and a fresh device outside the stage downloads the previous version's
variant and passes its health check on the previous version's golden samples (the new
samples would not match its outputs). Each report names the source its device runs, and
a device outside the stage never fetches the new version's samples. ``epfleet rollout
revert`` brings every device back to the previous version (one that only ever ran the new
one downloads the previous one and checks it on the previous samples); a rebuild of the new version is staged again over the same
previous version, ``rollout advance`` to the last stage brings every device forward, and
completing the rollout drops the previous version.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from epfleet.cli.app import main
from epfleet.device.cache import STATE_DIR, DeviceCache
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.fleet.publishing.publish import read_in_force
from epfleet.formats.device_report import ModelReport
from epfleet.formats.manifest import ModelEntry
from epfleet.formats.rollout import is_member
from epfleet.stores import open_store
from tests.support.specs import CPU_TARGET, tiny_models, write_spec

pytestmark = pytest.mark.slow

MODEL = "tiny-cls"
TARGET = CPU_TARGET["name"]
DEVICES = [f"dev-{i:03d}" for i in range(20)]
ROLLOUT = {"stages": [10, 100], "canary": ["dev-000"], "min_reports": 1, "min_hours": 0}


def retrained(model_dir: Path, out: Path) -> Path:
    """tiny-cls with every float weight scaled: the same graph, other outputs."""
    model = onnx.load(str(model_dir / "tiny-cls.onnx"))
    for init in model.graph.initializer:
        weights = numpy_helper.to_array(init)
        if weights.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(weights * np.float32(1.7) + 0.05, init.name))
    path = out / "tiny-cls-v2.onnx"
    onnx.save(model, str(path))
    return path


def publish(tmp_path: Path, source: Path, optimization: str = "all") -> ModelEntry:
    [model] = [m for m in tiny_models(source.parent) if m["name"] == MODEL]
    model["source"] = str(source)
    write_spec(tmp_path, [model], [CPU_TARGET | {"graph_optimization": optimization}])
    spec = tmp_path / "fleet.yaml"
    spec.write_text(
        spec.read_text() + "rollout:\n" + "".join(f"  {k}: {v}\n" for k, v in ROLLOUT.items())
    )
    assert main(["compile", str(spec), "--store", str(tmp_path / "store"), "--workers", "1"]) == 0
    return entry(tmp_path)


def entry(tmp_path: Path) -> ModelEntry:
    manifest = read_in_force(open_store(str(tmp_path / "store"))).manifest
    assert manifest is not None
    return manifest.models[MODEL]


def sync_all(tmp_path: Path, devices: list[str] = DEVICES) -> dict[str, ModelReport]:
    """Each device's sync; every other one takes the signed manifest.json whole, the others
    their model's signed bin alone (both must carry the previous version)."""
    root = tmp_path / "store.dev-keys" / "root.json"
    results = {}
    for i, device in enumerate(devices):
        report = sync(
            str(tmp_path / "store"),
            tmp_path / "devices" / device,
            SyncPolicy(models=None if i % 2 else [MODEL]),
            device,
            trust_root=root,
        )
        assert report.manifest.signed and report.manifest.status != "rejected", report.manifest
        [results[device]] = report.models
    return results


def samples_held(tmp_path: Path, device: str) -> set[str]:
    """The sha256 of every set of golden samples the device fetched to health-check."""
    held = tmp_path / "devices" / device / STATE_DIR / "samples"
    return {path.stem for path in held.glob("*.npz")}


def source_run(tmp_path: Path, device: str) -> str:
    """The source sha256 of the variant active in the device's cache."""
    state = DeviceCache(tmp_path / "devices" / device).load_state()
    active = state.models[MODEL].active
    assert active is not None
    return active.source_sha256


def runs(reports: dict[str, ModelReport], digest: str | None) -> set[str]:
    return {d for d, r in reports.items() if r.artifact_sha256 == digest}


def test_a_new_model_version_is_staged_reverted_and_advanced(
    tmp_path: Path,
    model_dir: Path,
    prefect_api: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "cache"))
    first = publish(tmp_path, model_dir / "tiny-cls.onnx")
    assert first.rollout is None  # a first publish is not staged
    v1 = first.variants[TARGET].artifact.sha256  # type: ignore[union-attr]
    assert runs(sync_all(tmp_path), v1) == set(DEVICES)

    second = publish(tmp_path, retrained(model_dir, tmp_path))
    assert second.rollout is not None and second.rollout.percent == 10
    assert second.previous_version is not None
    assert second.previous_version.source == first.source
    assert second.previous_version.samples == first.samples
    assert second.samples != first.samples  # the new version's own golden samples
    v2 = second.variants[TARGET].artifact.sha256  # type: ignore[union-attr]
    assert v2 != v1 and second.source.sha256 != first.source.sha256

    reached = sync_all(tmp_path)
    on_new = runs(reached, v2)
    assert on_new == {d for d in DEVICES if is_member(second.rollout, d)} and "dev-000" in on_new
    # about a tenth: the canary and Binomial(19, 0.1) others (9 or more of them: p < 1e-4)
    assert 1 <= len(on_new) <= 9, sorted(on_new)
    share = sum(is_member(second.rollout, f"id-{i}") for i in range(2000)) / 2000
    assert 0.07 <= share <= 0.13, share  # this salt's stage reaches a tenth of any fleet
    assert runs(reached, v1) == set(DEVICES) - on_new  # the others keep the first version
    assert all(
        r.rollout is not None and r.rollout.member == (d in on_new) for d, r in reached.items()
    )
    assert {source_run(tmp_path, d) for d in on_new} == {second.source.sha256}
    # each report names the version its device runs; only members checked the new samples
    s1, s2 = first.source.sha256, second.source.sha256
    assert {d for d, r in reached.items() if r.source_sha256 == s2} == on_new
    assert {d for d, r in reached.items() if r.source_sha256 == s1} == set(DEVICES) - on_new
    assert first.samples is not None and second.samples is not None
    new_samples = second.samples.sha256
    assert {d for d in DEVICES if new_samples in samples_held(tmp_path, d)} == on_new

    # fresh devices: one outside the stage health-checks the previous version's variant on
    # the previous version's samples; one inside takes the new version
    rollout = second.rollout
    outside = next(f"fresh-{i}" for i in range(1000) if not is_member(rollout, f"fresh-{i}"))
    inside = next(f"fresh-{i}" for i in range(1000) if is_member(rollout, f"fresh-{i}"))
    fresh = sync_all(tmp_path, [outside, inside])
    assert fresh[outside].action == "downloaded" and fresh[outside].artifact_sha256 == v1
    assert fresh[outside].profile is not None  # its health check ran and passed
    assert source_run(tmp_path, outside) == first.source.sha256
    assert samples_held(tmp_path, outside) == {first.samples.sha256}
    assert fresh[inside].action == "downloaded" and fresh[inside].artifact_sha256 == v2
    assert samples_held(tmp_path, inside) == {new_samples}

    store = str(tmp_path / "store")
    assert main(["rollout", "revert", "--store", store, "--model", MODEL]) == 0
    back = sync_all(tmp_path, [*DEVICES, inside])
    assert runs(back, v1) == {*DEVICES, inside}  # every device back on the first version
    assert {source_run(tmp_path, d) for d in back} == {first.source.sha256}
    assert {r.source_sha256 for r in back.values()} == {s1}
    # the device that only ever ran the new version fetched the first and checked it on
    # the first version's samples
    assert back[inside].action == "downloaded" and back[inside].profile is not None
    assert samples_held(tmp_path, inside) == {first.samples.sha256, new_samples}

    third = publish(tmp_path, tmp_path / "tiny-cls-v2.onnx", "extended")  # a rebuild of v2
    assert third.rollout is not None and third.rollout.state == "active"
    assert third.previous_version == second.previous_version  # still the proven version
    v3 = third.variants[TARGET].artifact.sha256  # type: ignore[union-attr]
    assert main(["rollout", "advance", "--store", store, "--model", MODEL]) == 0
    forward = sync_all(tmp_path)
    assert runs(forward, v3) == set(DEVICES)
    assert {source_run(tmp_path, d) for d in DEVICES} == {third.source.sha256}
    assert main(["rollout", "advance", "--store", store, "--model", MODEL]) == 0
    done = entry(tmp_path)
    assert done.rollout is not None and done.rollout.state == "complete"
    assert done.previous_version is None and done.previous == {}
