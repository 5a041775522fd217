"""A target built under several runtimes (the spec's ``runtimes``): each runtime's
environment built from the package index into the worker cache, each variant compiled and
verified in its own runtime's workers, and what an older runtime does with a newer one's
binary, for real (onnxruntime-qnn 2.5.0 and 2.7.0, and 2.6.0 for a changed runtime)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from epfleet.errors import BadInputError
from epfleet.formats.device_report import ModelReport
from epfleet.formats.manifest import Manifest
from epfleet.runtime.environments import ENVIRONMENTS, ensure_environment
from epfleet.runtime.workers import shared_workers
from tests.support.plain_fleet import compile_spec
from tests.support.runtime_probe import run_htp

# One worker (--dist loadgroup): the tests share the runtime environments they build.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("runtimes")]

QNN_2_5 = ["onnxruntime==1.32.0", "onnxruntime-qnn==2.5.0"]
QNN_2_7 = ["onnxruntime==1.32.0", "onnxruntime-qnn==2.7.0"]
QNN_2_6 = ["onnxruntime==1.32.0", "onnxruntime-qnn==2.6.0"]
X_ELITE = {"backend_type": "htp", "htp_arch": "73", "soc_model": "60"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The worker cache the module's compiles share (its runtimes/ are built once)."""
    return tmp_path_factory.mktemp("worker-cache")


def write(directory: Path, model_dir: Path, runtimes: dict[str, list[str]]) -> Path:
    spec = {
        "models": [
            {
                "name": "tiny-cls",
                "source": str(model_dir / "tiny-cls.onnx"),
                "input_shapes": {"x": [1, 3, 48, 192]},
            }
        ],
        "runtimes": runtimes,
        "targets": [
            {
                "name": "sd-x-elite",
                "ep": "QNNExecutionProvider",
                "provider_options": X_ELITE,
                "runtimes": list(runtimes),
            },
            {"name": "x86-cpu", "ep": "CPUExecutionProvider"},
        ],
    }
    path = directory / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_target_is_built_under_each_runtime_and_a_changed_runtime_rebuilds_its_pairs_alone(
    tmp_path: Path, model_dir: Path, cache: Path
) -> None:
    store = tmp_path / "store"
    spec = write(tmp_path, model_dir, {"qnn-2.5": QNN_2_5, "qnn-2.7": QNN_2_7})
    report = compile_spec(spec, store, cache)
    assert report.exit_code == 0, [(r.target, r.error) for r in report.variants]
    variants = Manifest.from_json((store / "manifest.json").read_bytes()).models["tiny-cls"]
    old, new = variants.variants["sd-x-elite.qnn-2.5"], variants.variants["sd-x-elite.qnn-2.7"]
    assert old.compatibility_string == "v2:6:2.49.40:5.49.0:73:60:8:0"
    assert new.compatibility_string == "v2:6:2.51.0:5.51.0:73:60:8:0"
    for entry, version, sdk in ((old, "2.5.0", "2.49.40"), (new, "2.7.0", "2.51.0")):
        assert entry.runtime is not None and entry.ep_version == version
        assert (entry.runtime.ep_package, entry.runtime.ep_version) == ("onnxruntime-qnn", version)
        assert entry.runtime.sdk_version == sdk
        assert entry.verification is not None and entry.verification.status == "passed"
    assert variants.variants["x86-cpu"].runtime is None
    assert variants.preference == ["sd-x-elite.qnn-2.5", "sd-x-elite.qnn-2.7", "x86-cpu"]

    again = compile_spec(spec, store, cache)
    assert [r.status for r in again.variants] == ["skipped"] * 3

    spec = write(tmp_path, model_dir, {"qnn-2.5": QNN_2_5, "qnn-2.7": QNN_2_6})
    changed = compile_spec(spec, store, cache)
    compiled = {r.target for r in changed.variants if r.status != "skipped"}
    assert compiled == {"sd-x-elite.qnn-2.7"}
    rebuilt = Manifest.from_json((store / "manifest.json").read_bytes()).models["tiny-cls"]
    assert rebuilt.variants["sd-x-elite.qnn-2.7"].ep_version == "2.6.0"
    assert rebuilt.variants["sd-x-elite.qnn-2.5"].fingerprint == old.fingerprint


def test_each_runtimes_workers_load_its_own_onnxruntime_qnn_and_an_older_one_refuses_newer_binaries(
    tmp_path: Path, model_dir: Path, cache: Path
) -> None:
    store = tmp_path / "store"
    report = compile_spec(
        write(tmp_path, model_dir, {"qnn-2.5": QNN_2_5, "qnn-2.7": QNN_2_7}), store, cache
    )
    assert report.exit_code == 0
    entry = Manifest.from_json((store / "manifest.json").read_bytes()).models["tiny-cls"]
    old, new = (
        str(store / entry.variants[t].artifact.uri)  # type: ignore[union-attr]
        for t in ("sd-x-elite.qnn-2.5", "sd-x-elite.qnn-2.7")
    )
    root = cache / ENVIRONMENTS
    older = shared_workers(ensure_environment("qnn-2.5", QNN_2_5, root).site)
    newer = shared_workers(ensure_environment("qnn-2.7", QNN_2_7, root).site)
    assert older.call(run_htp, old, 300) == ("1.32.0", "2.5.0")
    assert newer.call(run_htp, old, 300) == ("1.32.0", "2.7.0")  # a newer runtime loads it
    assert newer.call(run_htp, new, 300) == ("1.32.0", "2.7.0")
    with pytest.raises(Exception, match=r"QNN_CONTEXT_ERROR_INVALID_ARGUMENT|context"):
        older.call(run_htp, new, 300)


def test_a_device_takes_its_runtimes_variant_as_it_moves_up_and_back(
    tmp_path: Path, model_dir: Path, cache: Path
) -> None:
    """Judged as a Snapdragon X Elite's QNN validator would judge them
    (``tests.support.qnn_device``), a device on onnxruntime-qnn 2.5.0 refuses 2.7.0's
    binary and runs 2.5.0's; moved to 2.7.0 it judges both optimal and runs the one built
    with its own release, although the spec lists 2.5.0 first; moved back, 2.5.0's
    again, from its cache, never a local build."""
    from epfleet.device.policy import SyncPolicy
    from epfleet.device.session import SyncSession
    from eps.qnn import HtpRuntime
    from tests.support.qnn_device import QnnDeviceEps

    store = tmp_path / "store"
    spec = write(tmp_path, model_dir, {"qnn-2.5": QNN_2_5, "qnn-2.7": QNN_2_7})
    assert compile_spec(spec, store, cache).exit_code == 0
    on_2_5 = HtpRuntime(arch=73, vtcm_mb=8, backend_api=(5, 49, 0), sdk=(2, 49, 40))
    on_2_7 = HtpRuntime(arch=73, vtcm_mb=8, backend_api=(5, 51, 0), sdk=(2, 51, 0))
    device = tmp_path / "device"

    def sync_on(runtime: HtpRuntime, release: str) -> tuple[str, str | None, str]:
        with SyncSession(
            str(store), device, SyncPolicy(), "dev-1", local=QnnDeviceEps(runtime, release),
        ) as session:  # fmt: skip
            session.fetch_manifest()
            session.sync_model("tiny-cls")
            report = session.finish().models[0]
        return report.action, report.target, report.reason

    assert sync_on(on_2_5, "2.5.0")[:2] == ("downloaded", "sd-x-elite.qnn-2.5")
    assert sync_on(on_2_7, "2.7.0")[:2] == ("downloaded", "sd-x-elite.qnn-2.7")
    assert sync_on(on_2_7, "2.7.0")[:2] == ("kept", "sd-x-elite.qnn-2.7")
    action, target, reason = sync_on(on_2_5, "2.5.0")
    assert (action, target) == ("downloaded", "sd-x-elite.qnn-2.5")
    assert reason.startswith("rolled back to sd-x-elite.qnn-2.5")


QNN_2_3 = ["onnxruntime==1.24.4", "onnxruntime-qnn==2.3.0"]


def test_the_oldest_runtime_epfleet_compiles_with_and_one_older_refused_at_plan_time(
    tmp_path: Path, model_dir: Path, cache: Path
) -> None:
    """onnxruntime-qnn 2.3.0 (QAIRT 2.47) needs onnxruntime 1.24.4, which has no reader of
    compatibility strings: its variant is compiled and verified all the same, with the
    older six-field string, and a 2.7.0 worker runs it. A runtime on onnxruntime 1.23.2 is
    refused when the plan builds its environment, naming it, before anything compiles."""
    store = tmp_path / "store"
    report = compile_spec(write(tmp_path, model_dir, {"qnn-2.3": QNN_2_3}), store, cache)
    assert report.exit_code == 0, [(r.target, r.error) for r in report.variants]
    entry = Manifest.from_json((store / "manifest.json").read_bytes()).models["tiny-cls"]
    built = entry.variants["sd-x-elite.qnn-2.3"]
    assert built.compatibility_string == "6:2.47.0:5.47.0:0.0.0:73:0"
    assert built.runtime is not None and built.verification is not None
    assert (built.runtime.onnxruntime, built.runtime.sdk_version) == ("1.24.4", "2.47.0")
    assert built.verification.status == "passed"
    assert built.artifact is not None
    newer = shared_workers(ensure_environment("qnn-2.7", QNN_2_7, cache / ENVIRONMENTS).site)
    assert newer.call(run_htp, str(store / built.artifact.uri), 300) == ("1.32.0", "2.7.0")

    older = {"qnn-old": ["onnxruntime==1.23.2", "onnxruntime-qnn==2.3.0"]}
    with pytest.raises(BadInputError) as refused:
        compile_spec(write(tmp_path, model_dir, older), tmp_path / "other", cache)
    message = str(refused.value)
    assert message.startswith("runtime 'qnn-old': ")
    assert "onnxruntime 1.23.2 is older than this epfleet compiles with (at least 1.24)" in message
    assert not (tmp_path / "other" / "manifest.json").exists()


def test_a_device_moved_to_a_newer_runtime_gets_its_variant_as_a_delta(
    tmp_path: Path, model_dir: Path, cache: Path
) -> None:
    """A runtime added to a target builds its variant beside the one devices hold, with a
    delta from it under half the file; a device on 2.5.0's variant upgraded to 2.7.0
    downloads the delta alone, and activates 2.7.0's file byte for byte."""
    from epfleet.device.policy import SyncPolicy
    from epfleet.device.session import SyncSession
    from epfleet.hashing import sha256_file
    from eps.qnn import HtpRuntime
    from tests.support.qnn_device import QnnDeviceEps
    from tests.support.synced_fleet import copy_store

    store = tmp_path / "store"
    assert (
        compile_spec(write(tmp_path, model_dir, {"qnn-2.5": QNN_2_5}), store, cache).exit_code == 0
    )
    device = tmp_path / "device"

    def sync_on(runtime: HtpRuntime, release: str, where: Path) -> ModelReport:
        with SyncSession(
            str(where), device, SyncPolicy(), "dev-1", local=QnnDeviceEps(runtime, release),
        ) as session:  # fmt: skip
            session.fetch_manifest()
            session.sync_model("tiny-cls")
            return session.finish().models[0]

    served = copy_store(store, tmp_path / "served")
    on_2_5 = HtpRuntime(arch=73, vtcm_mb=8, backend_api=(5, 49, 0), sdk=(2, 49, 40))
    held = sync_on(on_2_5, "2.5.0", served)
    assert (held.action, held.target) == ("downloaded", "sd-x-elite.qnn-2.5")
    both = write(tmp_path, model_dir, {"qnn-2.5": QNN_2_5, "qnn-2.7": QNN_2_7})
    assert compile_spec(both, store, cache).exit_code == 0
    shutil.rmtree(served)
    copy_store(store, served)
    variant = Manifest.from_json((served / "manifest.json").read_bytes()).models["tiny-cls"]
    new = variant.variants["sd-x-elite.qnn-2.7"]
    assert new.artifact is not None
    [delta] = new.deltas
    assert delta.base_sha256 == held.artifact_sha256
    assert delta.size < new.artifact.size / 2, (delta.size, new.artifact.size)

    on_2_7 = HtpRuntime(arch=73, vtcm_mb=8, backend_api=(5, 51, 0), sdk=(2, 51, 0))
    moved = sync_on(on_2_7, "2.7.0", served)
    assert (moved.action, moved.target) == ("downloaded", "sd-x-elite.qnn-2.7"), moved.reason
    assert (moved.delta_from, moved.bytes_downloaded) == (held.variant, delta.size)
    active = device / "models" / "tiny-cls" / (moved.variant or "") / "model.onnx"
    assert sha256_file(active) == (new.artifact.sha256, new.artifact.size)
