"""A device holding the previous variant gets the new one as a binary delta, on real QNN
HTP compiles: a one-layer retrain and a recompile under a newer onnxruntime-qnn each reach
it as a delta under half the file, and what it activates is the published file byte for
byte; a corrupted, truncated, forged, missing or wrongly based delta is refused and the
whole file downloaded, the active variant untouched until the new one is verified."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from epfleet.deltas import make_delta
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import SyncSession
from epfleet.formats.device_report import ModelReport
from epfleet.formats.manifest import Manifest, VariantEntry
from epfleet.hashing import sha256_bytes, sha256_file
from eps.qnn import HtpRuntime
from tests.support.plain_fleet import compile_spec
from tests.support.qnn_device import QnnDeviceEps
from tests.support.retrain import retrained
from tests.support.synced_fleet import copy_store, edit_manifest

pytestmark = pytest.mark.slow

MODEL, TARGET = "tiny-cls", "sd-x-elite"
X_ELITE = {"backend_type": "htp", "htp_arch": "73", "soc_model": "60"}
ON_2_7 = HtpRuntime(arch=73, vtcm_mb=8, backend_api=(5, 51, 0), sdk=(2, 51, 0))


def write(directory: Path, source: Path) -> Path:
    spec = {
        "models": [{"name": MODEL, "source": str(source), "input_shapes": {"x": [1, 3, 48, 192]}}],
        "targets": [{"name": TARGET, "ep": "QNNExecutionProvider", "provider_options": X_ELITE}],
    }
    path = directory / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def sync_once(store: Path, device: Path) -> ModelReport:
    """One sync of ``store``, trusting the root its development keys signed."""
    with SyncSession(
        str(store), device, SyncPolicy(), "dev-1", local=QnnDeviceEps(ON_2_7, "2.7.0"),
        trust_root=root_of(store),
    ) as session:  # fmt: skip
        session.fetch_manifest()
        session.sync_model(MODEL)
        return session.finish().models[0]


def published(store: Path) -> VariantEntry:
    return Manifest.from_json((store / "manifest.json").read_bytes()).models[MODEL].variants[TARGET]


def active_file(device: Path, report: ModelReport) -> Path:
    return device / "models" / MODEL / (report.variant or "") / "model.onnx"


@pytest.fixture(scope="module")
def retrain(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path
) -> tuple[Path, Path, ModelReport]:
    """A signed store holding tiny-cls retrained in one layer over its first build, with
    a device that synced the first build from it (``signed-device``), and one that synced
    it from a copy of the store (``device``, at ``before``)."""
    work = tmp_path_factory.mktemp("retrain")
    store, cache = work / "store", work / "cache"
    assert compile_spec(write(work, model_dir / "tiny-cls.onnx"), store, cache).exit_code == 0
    before = copy_store(store, work / "before")
    first = sync_once(before, work / "device")
    assert (first.action, first.target, first.delta_from) == ("downloaded", TARGET, None)
    signed = sync_once(store, work / "signed-device")
    assert (signed.variant, signed.delta_from) == (first.variant, None)
    changed = work / "retrained.onnx"
    retrained(model_dir / "tiny-cls.onnx", changed)
    assert compile_spec(write(work, changed), store, cache).exit_code == 0
    return store, work / "device", first


def root_of(store: Path) -> Path:
    """The root the store's development keys signed (a device's trust root)."""
    return store.with_name(f"{store.name}.dev-keys") / "root.json"


def test_a_device_trusting_the_signed_metadata_gets_the_retrain_as_a_delta(
    retrain: tuple[Path, Path, ModelReport], tmp_path: Path
) -> None:
    store, device, first = retrain
    copy = tmp_path / "signed-device"
    shutil.copytree(device.with_name("signed-device"), copy, symlinks=True)
    report = sync_once(store, copy)
    variant = published(store)
    assert variant.artifact is not None
    assert (report.action, report.delta_from) == ("downloaded", first.variant), report.reason
    assert sha256_file(active_file(copy, report)) == (
        variant.artifact.sha256,
        variant.artifact.size,
    )


def after(retrain: tuple[Path, Path, ModelReport], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the retrained store, the device's store now, and a copy of the device that
    holds the first build."""
    store, device, _ = retrain
    here = copy_store(store, tmp_path / "before")  # the device's store, now the new build
    shutil.copytree(device, tmp_path / "device", symlinks=True)
    return here, tmp_path / "device"


def test_a_one_layer_retrain_reaches_the_device_as_a_delta_under_half_the_file(
    retrain: tuple[Path, Path, ModelReport], tmp_path: Path
) -> None:
    store, device = after(retrain, tmp_path)
    first = retrain[2]
    variant = published(store)
    assert variant.artifact is not None and first.artifact_sha256 is not None
    [delta] = variant.deltas
    assert delta.base_sha256 == first.artifact_sha256
    assert delta.uri.startswith(f"deltas/{MODEL}/{TARGET}/")
    assert delta.size < variant.artifact.size / 2, (delta.size, variant.artifact.size)
    report = sync_once(store, device)
    assert (report.action, report.delta_from) == ("downloaded", first.variant), report.reason
    samples = Manifest.from_json((store / "manifest.json").read_bytes()).models[MODEL].samples
    assert samples is not None  # the retrained model's golden samples are new too
    assert report.bytes_downloaded == delta.size + samples.size
    assert "delta" in report.reason
    assert sha256_file(active_file(device, report)) == (
        variant.artifact.sha256,
        variant.artifact.size,
    )
    assert not list((device / ".epfleet" / "partial").glob("*"))


def _corrupted(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


def _signed_ref_kept(store: Path, data: bytes) -> None:
    """The delta's object replaced by ``data``, its manifest entry (sha256, size) left."""
    (store / published(store).deltas[0].uri).write_bytes(data)


def _listed(store: Path, data: bytes) -> None:
    """``data`` put in the delta's place and published, signed, with its own sha256 and
    size: as a publisher that got the base wrong would list it."""
    _signed_ref_kept(store, data)

    def relist(document: dict) -> None:
        [ref] = document["models"][MODEL]["variants"][TARGET]["deltas"]
        ref.update(sha256=sha256_bytes(data), size=len(data))

    edit_manifest(store, relist)


def _wrong_base(store: Path, delta: bytes) -> bytes:
    """A delta to the new file from other bytes than the device holds."""
    new = (store / (published(store).artifact.uri)).read_bytes()  # type: ignore[union-attr]
    made = make_delta(_corrupted(new), new)
    assert made is not None
    return made


TAMPERED: dict[str, Callable[[Path, bytes], None]] = {
    "corrupted": lambda store, delta: _signed_ref_kept(store, _corrupted(delta)),
    "truncated": lambda store, delta: _signed_ref_kept(store, delta[: len(delta) // 2]),
    "forged": lambda store, delta: _listed(store, _corrupted(delta)),
    "wrong base": lambda store, delta: _listed(store, _wrong_base(store, delta)),
    "missing": lambda store, delta: (store / published(store).deltas[0].uri).unlink(),
}


@pytest.mark.parametrize("fault", list(TAMPERED))
def test_a_bad_delta_is_refused_and_the_whole_file_downloaded(
    retrain: tuple[Path, Path, ModelReport], tmp_path: Path, fault: str
) -> None:
    store, device = after(retrain, tmp_path)
    first = retrain[2]
    variant = published(store)
    assert variant.artifact is not None
    held = active_file(device, first).read_bytes()
    TAMPERED[fault](store, (store / variant.deltas[0].uri).read_bytes())
    report = sync_once(store, device)
    assert report.action == "downloaded" and report.delta_from is None, report.reason
    assert "not used" in report.reason and "downloading the whole file" in report.reason
    assert report.bytes_downloaded >= variant.artifact.size
    assert report.artifact_sha256 == variant.artifact.sha256
    assert sha256_file(active_file(device, report)) == (
        variant.artifact.sha256,
        variant.artifact.size,
    )
    assert active_file(device, first).read_bytes() == held  # kept for rollback, unchanged
    assert not list((device / ".epfleet" / "partial").glob("*"))
