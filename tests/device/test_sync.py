"""Device sync for real: a fleet compiled in-process as `epfleet compile` compiles it
(QNN HTP + CPU; ``tests.support.plain_fleet``, whose fidelity test is
tests/cli/test_plain_fleet_fidelity.py), published to
S3 on loopback (moto over HTTP, through a fault-injecting proxy where a test needs one),
judged here by ONNX Runtime, downloaded, health-checked and activated in a cache that
ORT opens as a model package.

This host has no NPU: QNN's validator raises for it, so every HTP variant is
unsupported here and the CPU variant (or a local CPU build) is what a device gets.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import onnx
import onnxruntime as ort
import pytest

from epfleet.cli.app import main
from epfleet.device.cache import DeviceCache
from epfleet.errors import BadInputError, StoreError
from epfleet.formats.device_report import DeviceReport, ModelReport, decode_report
from epfleet.formats.manifest import Manifest
from epfleet.hashing import sha256_bytes, sha256_file
from tests.support.plain_fleet import compile_fleet
from tests.support.s3proxy import FaultProxy
from tests.support.specs import CPU_TARGET, HTP_TARGETS
from tests.support.synced_fleet import (
    DEVICE,
    assert_package_runs,
    copy_store,
    make_readable,
    make_unreadable,
    publish_to_s3,
    read_manifest,
    republish_cpu_variant,
    republish_edited_cpu_variant,
    run_sync,
    scale_largest_weight,
    unsigned_copy,
)
from tests.support.trust_helpers import provisioned_root

pytestmark = pytest.mark.fast


def by_model(report: DeviceReport) -> dict[str, ModelReport]:
    return {m.model: m for m in report.models}


def golden_size(manifest: Manifest, model: str) -> int:
    """Bytes of the model's golden samples, which a device downloads once with its first
    variant (the health check runs them)."""
    samples = manifest.models[model].samples
    assert samples is not None
    return samples.size


# --- the acceptance path: S3, CPU activated, HTP unsupported, second sync moves nothing ---


def test_sync_activates_cpu_and_reports_htp_unsupported(
    fleet_store: Path, s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    uri = publish_to_s3(fleet_store, s3_bucket)
    cache = tmp_path / "device"
    manifest = read_manifest(fleet_store)

    report = run_sync(uri, cache)

    assert report.exit_code == 0
    assert report.manifest.status == "fetched" and report.manifest.body_bytes > 0
    models = by_model(report)
    assert sorted(models) == ["tiny-cls", "tiny-det"]
    for name, result in models.items():
        cpu = manifest.models[name].variants["x86-cpu"]
        assert cpu.artifact is not None
        assert (result.action, result.target, result.ep) == (
            "downloaded",
            "x86-cpu",
            "CPUExecutionProvider",
        )
        assert result.verdict == "optimal"
        assert result.bytes_downloaded == cpu.artifact.size + golden_size(manifest, name)
        verdicts = {v.target: v for v in result.considered}
        assert verdicts["x86-cpu"].verdict == "optimal"
        for htp in ("sd8g3-htp", "sd8g2-htp"):
            assert verdicts[htp].verdict == "unsupported"
            assert "NPU" in verdicts[htp].reason  # ORT's own reason, from QNN's validator
        # Deciding downloaded nothing: only the chosen artifact was fetched.
        assert [s.status for s in s3_proxy.seen(cpu.artifact.uri)] == [206]
        for htp in ("sd8g3-htp", "sd8g2-htp"):
            variant = manifest.models[name].variants[htp]
            assert variant.artifact is not None
            assert s3_proxy.seen(variant.artifact.uri) == []
    assert {d.ep for d in report.devices} >= {"CPUExecutionProvider", "QNNExecutionProvider"}
    assert report.ep_packages["onnxruntime"] == ort.__version__

    active = {name: m.variant for name, m in models.items() if m.variant}
    assert_package_runs(cache, active)
    uploaded = boto3.client("s3").get_object(
        Bucket=s3_bucket, Key=f"fleet/reports/devices/{DEVICE}.json"
    )
    assert uploaded["ContentEncoding"] == "gzip"  # compact JSON, gzip-compressed
    assert decode_report(uploaded["Body"].read(), 1 << 20).models[0].action == "downloaded"
    assert report.report_uploaded is True

    # Second sync: the signed timestamp says nothing changed (after the probe for a newer
    # root): nothing else fetched, nothing downloaded, everything kept.
    before = len(s3_proxy.log)
    again = run_sync(uri, cache)
    assert again.exit_code == 0 and again.manifest.signed
    assert again.manifest.status == "unchanged"
    assert [m.action for m in again.models] == ["kept", "kept"]
    assert sum(m.bytes_downloaded for m in again.models) == 0
    gets = [s for s in s3_proxy.log[before:] if s.method == "GET"]
    assert [(s.path.rsplit("/", 1)[-1], s.status) for s in gets] == [
        ("2.root.json", 404),
        ("timestamp.json", 200),
    ]
    assert again.manifest.body_bytes == gets[-1].body_bytes
    assert_package_runs(cache, active)


def test_cli_sync_json(
    fleet_store: Path,
    s3_bucket: str,
    tmp_path: Path,
    aws_env: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The command's JSON report and its exit code for a model the manifest lacks (run
    in-process: what the process does is tested in tests/device/test_faults.py)."""
    uri = publish_to_s3(fleet_store, s3_bucket)
    cache = tmp_path / "device"
    root = str(provisioned_root(uri))
    code = main(["sync", "--store", uri, "--cache", str(cache), "--json", "--trust-root", root])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    assert [(m["model"], m["action"]) for m in report["models"]] == [
        ("tiny-cls", "downloaded"),
        ("tiny-det", "downloaded"),
    ]
    assert set(report["models"][0]) >= {
        "model",
        "action",
        "variant",
        "ep",
        "verdict",
        "bytes_downloaded",
        "reason",
    }
    bad = main(["sync", "--store", uri, "--cache", str(cache), "--model", "nope"])
    assert bad == 2
    assert "model 'nope' is not in the manifest" in capsys.readouterr().err


# --- recompile, fallback, switching --------------------------------------------------------


def test_only_htp_published_recompiles_for_cpu_then_switches_to_a_published_cpu_variant(
    htp_only_store: Path, model_dir: Path, tmp_path: Path
) -> None:
    store = copy_store(htp_only_store, tmp_path / "store")
    cache = tmp_path / "device"

    first = run_sync(str(store), cache)
    assert first.exit_code == 0
    for result in first.models:
        assert (result.action, result.ep, result.target) == (
            "recompiled",
            "CPUExecutionProvider",
            None,
        )
        assert result.variant is not None and result.variant.startswith("local-cpu-")
        assert result.bytes_downloaded > 0  # the source
        assert all(v.verdict == "unsupported" for v in result.considered)
    local = {m.model: m.variant for m in first.models if m.variant}
    assert_package_runs(cache, local)

    second = run_sync(str(store), cache)
    assert [m.action for m in second.models] == ["kept", "kept"]
    assert {m.model: m.variant for m in second.models} == local

    # The fleet now publishes a CPU variant too: the next sync switches to it and keeps
    # the local build for rollback.
    assert compile_fleet(tmp_path, model_dir, [*HTP_TARGETS, CPU_TARGET]) == store
    third = run_sync(str(store), cache)
    assert [(m.action, m.target) for m in third.models] == [("downloaded", "x86-cpu")] * 2
    package = json.loads((cache / "manifest.json").read_text())
    for result in third.models:
        listed = list(package["components"][result.model]["variants"])
        assert listed == [result.variant, local[result.model]]  # active first, then rollback
    assert_package_runs(cache, {m.model: m.variant for m in third.models if m.variant})


def test_no_recompile_falls_back_to_the_source_on_cpu(htp_only_store: Path, tmp_path: Path) -> None:
    cache = tmp_path / "device"
    report = run_sync(str(htp_only_store), cache, recompile=False)
    assert report.exit_code == 1
    manifest = read_manifest(htp_only_store)
    for result in report.models:
        assert result.action == "fallback"
        assert result.bytes_downloaded == manifest.models[result.model].source.size + golden_size(
            manifest, result.model
        )
        assert "source model on the CPU EP" in result.reason
    assert_package_runs(cache, {m.model: m.variant for m in report.models if m.variant})
    again = run_sync(str(htp_only_store), cache, recompile=False)
    assert [(m.action, m.bytes_downloaded) for m in again.models] == [("fallback", 0)] * 2


# --- integrity: nothing unverified is ever activated ----------------------------------------


def unrunnable(model: onnx.ModelProto) -> None:
    model.graph.node[0].op_type = "NoSuchOperator"  # loads as ONNX, cannot run anywhere


def test_tampered_artifact_is_never_activated(fleet_store: Path, tmp_path: Path) -> None:
    store = copy_store(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    first = run_sync(str(store), cache, models=["tiny-cls"])
    [good] = first.models
    assert good.action == "downloaded" and good.variant

    original = read_manifest(store).models["tiny-cls"].variants["x86-cpu"]
    assert original.artifact is not None
    data = bytearray((store / original.artifact.uri).read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, the size unchanged
    republish_cpu_variant(store, "tiny-cls", bytes(data), sha256_bytes(b"a new build"))

    report = run_sync(str(store), cache, models=["tiny-cls"])
    [result] = report.models
    assert report.exit_code == 1
    assert result.action == "failed"
    assert "sha256" in result.reason and "not activated" in result.reason
    assert result.variant == good.variant  # the previous variant stays active ...
    assert_package_runs(cache, {"tiny-cls": good.variant})  # ... and still runs
    assert list((cache / ".epfleet" / "partial").iterdir()) == []  # the bad bytes are gone


def test_artifact_whose_string_differs_from_the_manifest_is_not_activated(
    fleet_store: Path, tmp_path: Path
) -> None:
    store = copy_store(fleet_store, tmp_path / "store")

    def forge(model: onnx.ModelProto) -> None:
        for prop in model.metadata_props:
            if prop.key == "ep_compatibility_info.CPUExecutionProvider":
                prop.value += ";forged"

    republish_edited_cpu_variant(store, forge)

    report = run_sync(str(store), tmp_path / "device", models=["tiny-cls"])
    [result] = report.models
    assert "ep_compatibility_info.CPUExecutionProvider" in result.reason
    # Never activated: this fresh device built its own CPU variant instead.
    assert result.action == "recompiled" and result.target is None
    assert [p.name for p in (tmp_path / "device" / "models" / "tiny-cls").iterdir()] == [
        result.variant
    ]


def test_variant_that_does_not_run_fails_its_health_check(
    fleet_store: Path, tmp_path: Path
) -> None:
    store = copy_store(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    [good] = run_sync(str(store), cache, models=["tiny-cls"]).models
    republish_edited_cpu_variant(store, unrunnable)

    [result] = run_sync(str(store), cache, models=["tiny-cls"]).models
    assert result.action == "failed"
    assert "CPUExecutionProvider cannot load" in result.reason
    assert result.variant == good.variant
    assert_package_runs(cache, {"tiny-cls": good.variant})


def test_active_file_changed_on_disk_is_replaced(fleet_store: Path, tmp_path: Path) -> None:
    cache = tmp_path / "device"
    [first] = run_sync(str(fleet_store), cache, models=["tiny-cls"]).models
    assert first.variant
    active = cache / "models" / "tiny-cls" / first.variant / "model.onnx"
    active.write_bytes(active.read_bytes() + b"\0")
    [again] = run_sync(str(fleet_store), cache, models=["tiny-cls"]).models
    assert again.action == "downloaded" and again.variant == first.variant
    assert "changed on disk" in again.reason
    cpu = read_manifest(fleet_store).models["tiny-cls"].variants["x86-cpu"]
    assert cpu.artifact is not None
    assert sha256_file(active) == (cpu.artifact.sha256, cpu.artifact.size)


# --- resuming, offline, bad manifests ----------------------------------------------------


def test_interrupted_download_resumes_with_a_range_request(
    fleet_store: Path, s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    uri = publish_to_s3(fleet_store, s3_bucket)
    cpu = read_manifest(fleet_store).models["tiny-cls"].variants["x86-cpu"]
    assert cpu.artifact is not None
    path = f"/{s3_bucket}/fleet/{cpu.artifact.uri}"
    cut = cpu.artifact.size // 3
    s3_proxy.cut_next_get_responses(path, after=cut)

    [result] = run_sync(uri, tmp_path / "device", models=["tiny-cls"]).models

    assert result.action == "downloaded", result.reason
    gets = s3_proxy.seen(cpu.artifact.uri)
    last = cpu.artifact.size - 1
    assert [(g.range, g.body_bytes) for g in gets] == [
        (f"bytes=0-{last}", cut),
        (f"bytes={cut}-{last}", cpu.artifact.size - cut),
    ]
    assert result.bytes_downloaded == cpu.artifact.size + golden_size(
        read_manifest(fleet_store), "tiny-cls"
    )


def test_parallel_segments_resume_each_where_it_stopped(
    fleet_store: Path,
    s3_bucket: str,
    s3_proxy: FaultProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Large artifacts come down in parallel ranged segments (4 of them here: the minimum
    segment size is cut to 4 KiB so that a small model has several); a segment cut mid-way
    resumes from its own last byte."""
    monkeypatch.setattr("epfleet.device.download.SEGMENT", 4096)
    uri = publish_to_s3(fleet_store, s3_bucket)
    cpu = read_manifest(fleet_store).models["tiny-cls"].variants["x86-cpu"]
    assert cpu.artifact is not None and cpu.artifact.size > 4 * 4096
    segment = -(-cpu.artifact.size // 4)
    s3_proxy.cut_next_get_responses(f"/{s3_bucket}/fleet/{cpu.artifact.uri}", after=1000)

    [result] = run_sync(uri, tmp_path / "device", models=["tiny-cls"]).models

    assert result.action == "downloaded", result.reason
    gets = s3_proxy.seen(cpu.artifact.uri)
    assert len(gets) == 4 + 1  # four segments, one of them resumed
    assert sum(g.body_bytes for g in gets) == cpu.artifact.size  # no byte fetched twice
    starts = sorted(int((g.range or "").split("=")[1].split("-")[0]) for g in gets)
    assert sum(start % segment == 1000 for start in starts) == 1
    assert result.bytes_downloaded == cpu.artifact.size + golden_size(
        read_manifest(fleet_store), "tiny-cls"
    )


def test_partial_download_left_by_an_earlier_sync_is_resumed(
    fleet_store: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "device"
    cpu = read_manifest(fleet_store).models["tiny-cls"].variants["x86-cpu"]
    assert cpu.artifact is not None
    half = (fleet_store / cpu.artifact.uri).read_bytes()[: cpu.artifact.size // 2]
    DeviceCache(cache).partial(cpu.artifact.sha256).write_bytes(half)

    [result] = run_sync(str(fleet_store), cache, models=["tiny-cls"]).models

    assert result.action == "downloaded"
    assert result.bytes_downloaded == cpu.artifact.size - len(half) + golden_size(
        read_manifest(fleet_store), "tiny-cls"
    )


def test_offline_device_keeps_what_it_runs(
    fleet_store: Path, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = publish_to_s3(fleet_store, s3_bucket)
    cache = tmp_path / "device"
    first = run_sync(uri, cache)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")

    report = run_sync(uri, cache)

    assert report.manifest.status == "offline"
    assert "cannot reach the S3 endpoint" in (report.manifest.reason or "")
    assert report.manifest.generation == first.manifest.generation
    assert [m.action for m in report.models] == ["kept", "kept"]
    assert report.exit_code == 0
    assert report.report_uploaded is False
    with pytest.raises(StoreError, match="no usable manifest"):
        run_sync(uri, tmp_path / "fresh-device")


# A publisher signs no manifest that fails validation: the device's own checks of one are
# met on a store that publishes manifest.json alone (those of signed ones: tests/trust/).


@pytest.mark.usefixtures("unsigned_allowed")
def test_invalid_manifest_is_rejected_whole(fleet_store: Path, tmp_path: Path) -> None:
    store = unsigned_copy(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    first = run_sync(str(store), cache)
    document = json.loads((store / "manifest.json").read_text())
    document["models"]["../../escape"] = document["models"]["tiny-cls"]
    document["generation"] += 1
    (store / "manifest.json").write_text(json.dumps(document))

    report = run_sync(str(store), cache)

    assert report.manifest.status == "rejected"
    assert "models" in (report.manifest.reason or "")
    assert report.manifest.generation == first.manifest.generation
    assert [m.action for m in report.models] == ["kept", "kept"]
    assert not (tmp_path / "escape").exists()


def test_unknown_model_is_bad_input(fleet_store: Path, tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="'nope' is not in the manifest"):
        run_sync(str(fleet_store), tmp_path / "device", models=["nope"])


# --- what review found: each of these once went wrong -------------------------------------


@pytest.mark.usefixtures("unsigned_allowed")  # offline: see make_unreadable
def test_being_offline_does_not_block_a_later_recompile(
    htp_only_store: Path, tmp_path: Path
) -> None:
    store = unsigned_copy(htp_only_store, tmp_path / "store")
    cache = tmp_path / "device"
    first = run_sync(str(store), cache, models=["tiny-cls"], recompile=False)
    assert [m.action for m in first.models] == ["fallback"]
    held = make_unreadable(store)
    offline = run_sync(str(store), cache, models=["tiny-cls"])
    assert offline.manifest.status == "offline"
    assert [m.action for m in offline.models] == ["fallback"]  # still runs the source
    make_readable(store, held)
    online = run_sync(str(store), cache, models=["tiny-cls"])
    assert [m.action for m in online.models] == ["recompiled"]


def test_a_cached_manifest_that_no_longer_validates_is_fetched_again(
    fleet_store: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "device"
    run_sync(str(fleet_store), cache)
    cached = cache / ".epfleet" / "fleet-manifest.json"
    document = json.loads(cached.read_text())
    document["models"]["Tiny-Old"] = document["models"]["tiny-cls"]  # e.g. an older rule
    cached.write_text(json.dumps(document))
    report = run_sync(str(fleet_store), cache)
    assert report.manifest.status == "fetched"
    assert [m.action for m in report.models] == ["kept", "kept"]


@pytest.mark.usefixtures("unsigned_allowed")
def test_artifact_uri_outside_the_store_rejects_the_manifest(
    fleet_store: Path, tmp_path: Path
) -> None:
    store = unsigned_copy(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    run_sync(str(store), cache)
    document = json.loads((store / "manifest.json").read_text())
    variant = document["models"]["tiny-cls"]["variants"]["x86-cpu"]
    variant["artifact"]["uri"] = "../elsewhere/model.onnx"
    document["generation"] += 1
    (store / "manifest.json").write_text(json.dumps(document))
    report = run_sync(str(store), cache)
    assert report.manifest.status == "rejected"
    assert "relative POSIX path inside the store" in (report.manifest.reason or "")
    assert [m.action for m in report.models] == ["kept", "kept"]
    with pytest.raises(StoreError, match="no valid manifest is cached"):
        run_sync(str(store), tmp_path / "fresh-device")


def test_a_fresh_device_whose_optimal_variant_fails_still_gets_a_model(
    fleet_store: Path, tmp_path: Path
) -> None:
    store = copy_store(fleet_store, tmp_path / "store")
    data = republish_edited_cpu_variant(store, unrunnable)
    cache = tmp_path / "device"
    report = run_sync(str(store), cache, models=["tiny-cls"])
    [result] = report.models
    assert result.action == "recompiled"
    assert "download x86-cpu: " in result.reason and "cannot load" in result.reason
    manifest = read_manifest(store)
    assert result.bytes_downloaded == (
        len(data) + manifest.models["tiny-cls"].source.size + golden_size(manifest, "tiny-cls")
    )
    assert list((cache / ".epfleet" / "partial").iterdir()) == []
    assert_package_runs(cache, {"tiny-cls": result.variant or ""})


@pytest.mark.usefixtures("unsigned_allowed")  # the other store publishes manifest.json alone
def test_a_manifest_cached_from_another_store_is_not_used(
    fleet_store: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "device"
    run_sync(str(fleet_store), cache)
    other = tmp_path / "other-store"
    other.mkdir()
    (other / "manifest.json").mkdir()  # unreadable: offline
    with pytest.raises(StoreError, match="no usable manifest"):
        run_sync(str(other), cache)


def test_resume_against_a_server_that_ignores_range(
    fleet_store: Path, s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    uri = publish_to_s3(fleet_store, s3_bucket)
    cpu = read_manifest(fleet_store).models["tiny-cls"].variants["x86-cpu"]
    assert cpu.artifact is not None
    s3_proxy.ignore_range = True
    s3_proxy.cut_next_get_responses(f"/{s3_bucket}/fleet/{cpu.artifact.uri}", after=5000)
    [result] = run_sync(uri, tmp_path / "device", models=["tiny-cls"]).models
    assert result.action == "downloaded", result.reason
    assert [g.body_bytes for g in s3_proxy.seen(cpu.artifact.uri)] == [5000, cpu.artifact.size]


@pytest.mark.usefixtures("unsigned_allowed")  # a signed manifest is written whole
def test_a_manifest_relying_on_defaults_syncs(fleet_store: Path, tmp_path: Path) -> None:
    store = unsigned_copy(fleet_store, tmp_path / "store")
    document = json.loads((store / "manifest.json").read_text())
    for field in ("generation", "published_at"):
        document.pop(field)  # both have defaults in the schema
    (store / "manifest.json").write_text(json.dumps(document))
    report = run_sync(str(store), tmp_path / "device")
    assert report.manifest.generation == 0
    assert [m.action for m in report.models] == ["downloaded", "downloaded"]


@pytest.mark.usefixtures("unsigned_allowed")  # offline: see make_unreadable
def test_a_valid_cached_manifest_from_an_older_epfleet_is_validated_again(
    fleet_store: Path, tmp_path: Path
) -> None:
    """A state written before the cached manifest's sha256 and rules were recorded (or a
    crash between the two writes): the cached manifest is validated whole and used."""
    store = unsigned_copy(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    run_sync(str(store), cache)
    state_file = cache / ".epfleet" / "state.json"
    state = json.loads(state_file.read_text())
    del state["manifest_sha256"], state["manifest_rules"]
    state_file.write_text(json.dumps(state))
    make_unreadable(store)
    offline = run_sync(str(store), cache)
    assert offline.manifest.status == "offline"
    assert [m.action for m in offline.models] == ["kept", "kept"]


def test_a_wrong_variant_fails_the_golden_samples_and_the_previous_stays(
    fleet_store: Path, tmp_path: Path
) -> None:
    store = copy_store(fleet_store, tmp_path / "store")
    cache = tmp_path / "device"
    [good] = run_sync(str(store), cache, models=["tiny-cls"]).models
    assert good.action == "downloaded"
    golden = read_manifest(store).models["tiny-cls"].samples
    assert golden is not None
    assert (cache / ".epfleet" / "samples" / f"{golden.sha256}.npz").stat().st_size == golden.size

    # Published past the compile host's verification (a bug, a hand edit): true sha256 and
    # string, runs fine on zero inputs, wrong on real ones.
    republish_edited_cpu_variant(store, scale_largest_weight)
    report = run_sync(str(store), cache, models=["tiny-cls"])
    [result] = report.models
    assert report.exit_code == 1 and result.action == "failed"
    assert "on its golden samples: output 0 differs from the source by" in result.reason
    assert (
        "(tolerance 0.1%; " in result.reason
        and "absolute floor of 1e-05); not activated" in result.reason
    )
    assert result.variant == good.variant
    artifact = read_manifest(store).models["tiny-cls"].variants["x86-cpu"].artifact
    assert artifact is not None and result.bytes_downloaded == artifact.size  # samples cached
    assert_package_runs(cache, {"tiny-cls": good.variant or ""})
