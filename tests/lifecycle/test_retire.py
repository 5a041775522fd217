"""Retiring models and targets: only what is named, or what the spec no longer lists when
asked; written with compare-and-swap on a local store and on S3 (moto over HTTP)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epfleet.errors import BadInputError
from epfleet.fleet.publishing.publish import read_manifest
from epfleet.formats.manifest import Manifest
from epfleet.formats.spec import FleetSpec
from epfleet.formats.spec_file import parse_spec
from epfleet.lifecycle.retire import Selection, apply_retirement, retire, unlisted
from epfleet.stores import MANIFEST_KEY, Store, open_store
from tests.support.gc_fleet import OLD, model_entry, run_cli, write_manifest

pytestmark = pytest.mark.fast


def fleet(store: Store) -> Manifest:
    models = {
        "cls": model_entry(store, "cls", {"x86-cpu": b"cls cpu" * 9, "htp": b"cls htp" * 9}),
        "det": model_entry(store, "det", {"x86-cpu": b"det cpu" * 9, "old-npu": b"det npu" * 9}),
        "gone": model_entry(store, "gone", {"x86-cpu": b"gone cpu" * 9}),
    }
    return write_manifest(store, models, generation=5, at=OLD)


def spec(models: list[str], targets: list[dict[str, object]]) -> FleetSpec:
    return parse_spec(
        {
            "models": [{"name": m, "source": f"{m}.onnx"} for m in models],
            "targets": [{"ep": "CPUExecutionProvider", **t} for t in targets],
        }
    )


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return open_store(f"s3://{request.getfixturevalue('s3_bucket')}/fleet")


@pytest.fixture
def local(tmp_path: Path) -> Store:
    return open_store(str(tmp_path / "store"))


def test_unlisted_models_targets_and_pairs(local: Store) -> None:
    manifest = fleet(local)
    fleet_spec = spec(["cls", "det"], [{"name": "x86-cpu"}, {"name": "htp", "models": ["det"]}])
    assert unlisted(manifest, fleet_spec) == Selection(
        models=["gone"], targets=["old-npu"], pairs=[("cls", "htp")]
    )
    after, done = retire(manifest, unlisted(manifest, fleet_spec))
    assert after is not None and after.generation == 6
    assert sorted(after.models) == ["cls", "det"]
    assert sorted(after.models["cls"].variants) == ["x86-cpu"]
    assert sorted(after.models["det"].variants) == ["x86-cpu"]
    assert done.models == ["gone"]
    assert done.variants == ["cls/htp", "det/old-npu"]
    gone = manifest.models["gone"]
    assert done.bytes == gone.source.size + (gone.samples.size if gone.samples else 0) + sum(
        v.artifact.size for v in gone.variants.values() if v.artifact
    ) + len(b"cls htp" * 9) + len(b"det npu" * 9)


def test_a_spec_listing_everything_retires_nothing(local: Store) -> None:
    manifest = fleet(local)
    everything = spec(
        ["cls", "det", "gone"], [{"name": "x86-cpu"}, {"name": "htp"}, {"name": "old-npu"}]
    )
    assert unlisted(manifest, everything).empty
    assert retire(manifest, unlisted(manifest, everything)) == (
        None,
        retire(manifest, Selection())[1],
    )
    assert retire(manifest, Selection())[0] is None


def test_a_shared_file_is_not_counted_as_released(local: Store) -> None:
    manifest = fleet(local)
    twin = manifest.models["cls"].model_copy(deep=True)
    manifest.models["twin"] = twin
    _, done = retire(manifest, Selection(models=["twin"]))
    assert done.models == ["twin"] and done.bytes == 0


def test_retire_named_models_and_targets(store: Store) -> None:
    fleet(store)
    done = apply_retirement(store, models=["gone"], targets=["old-npu"])
    assert done.written and done.models == ["gone"] and done.variants == ["det/old-npu"]
    # a local store is signed with development keys; this S3 bucket has no trust metadata
    assert (done.signed_version is not None) == store.uri.startswith("file://")
    manifest, _ = read_manifest(store)
    assert manifest is not None and manifest.generation == 6 == done.generation
    assert sorted(manifest.models) == ["cls", "det"]
    assert "old-npu" not in manifest.models["det"].variants
    again = apply_retirement(
        store, spec=spec(["cls", "det"], [{"name": "x86-cpu"}, {"name": "htp"}])
    )
    assert not again.written and again.empty
    assert read_manifest(store)[0] == manifest


def test_retire_never_changes_the_manifest_it_is_given(local: Store) -> None:
    manifest = fleet(local)
    before = manifest.model_dump_json()
    after, done = retire(manifest, Selection(models=["gone"], targets=["old-npu"]))
    assert after is not None and done.variants == ["det/old-npu"]
    assert manifest.model_dump_json() == before


def test_dry_run_writes_nothing(store: Store) -> None:
    fleet(store)
    before = store.read(MANIFEST_KEY)
    done = apply_retirement(store, spec=spec(["cls"], [{"name": "x86-cpu"}]), dry_run=True)
    assert done.models == ["det", "gone"] and done.variants == ["cls/htp"] and not done.written
    assert store.read(MANIFEST_KEY) == before


def test_names_it_lacks_and_no_choice_are_refused(local: Store) -> None:
    fleet(local)
    before = local.read(MANIFEST_KEY)
    with pytest.raises(
        BadInputError, match=r"model 'clss' is not in .*manifest.json \(it has: cls, det, gone\)"
    ):
        apply_retirement(local, models=["clss"])
    with pytest.raises(BadInputError, match="target 'arm-cpu' is not in"):
        apply_retirement(local, targets=["arm-cpu"], dry_run=True)
    with pytest.raises(BadInputError, match="name the models or targets"):
        apply_retirement(local)
    assert local.read(MANIFEST_KEY) == before


def test_no_manifest(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="no manifest at"):
        apply_retirement(open_store(str(tmp_path / "empty")), models=["cls"])


def test_retire_command(
    local: Store,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fleet(local)
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(
        "models:\n  - {name: cls, source: cls.onnx}\n"
        "targets:\n  - {name: x86-cpu, ep: CPUExecutionProvider}\n"
    )
    uri = local.uri
    for argv, error in [
        (["--spec", str(spec_path)], "needs --unlisted"),
        (["--unlisted"], "--unlisted needs --spec"),
        (["--spec", str(spec_path), "--unlisted", "--model", "cls"], "not both"),
        ([], "name what to retire"),
        (["--model", "nope"], "model 'nope' is not in"),
    ]:
        assert run_cli(["retire", "--store", uri, *argv]) == 2, argv
        assert error in capsys.readouterr().err
    before = local.read(MANIFEST_KEY)
    argv = ["retire", "--store", uri, "--spec", str(spec_path), "--unlisted", "--dry-run"]
    assert run_cli([*argv, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["models"] == ["det", "gone"] and planned["variants"] == ["cls/htp"]
    assert planned["dry_run"] is True and local.read(MANIFEST_KEY) == before
    assert run_cli(argv[:-1]) == 0
    out = capsys.readouterr().out
    assert "retired model det (all its variants)" in out and "retired variant cls/htp" in out
    assert "manifest generation 6" in out
    manifest, _ = read_manifest(local)
    assert manifest is not None and list(manifest.models) == ["cls"]
    assert run_cli(argv[:-1]) == 0
    assert "nothing to retire" in capsys.readouterr().out


def test_a_runtime_the_spec_dropped_stays_while_devices_run_its_release(local: Store) -> None:
    """The spec no longer builds under onnxruntime-qnn 2.5.0: its variants stay while
    devices report running 2.5.0 (a device left on it would otherwise lose its binary),
    and go once none does; a target without a runtime goes as before."""
    from epfleet.formats.manifest import VariantRuntime

    manifest = fleet(local)
    runtime = VariantRuntime(
        name="qnn-2.5", onnxruntime="1.32.0", ep_package="onnxruntime-qnn", ep_version="2.5.0"
    )
    det = manifest.models["det"]
    variants = {**det.variants, "htp.qnn-2.5": det.variants["old-npu"].model_copy(
        update={"runtime": runtime})}  # fmt: skip
    manifest.models["det"] = det.model_copy(update={"variants": variants})
    fleet_spec = spec(["cls", "det", "gone"], [{"name": "x86-cpu"}, {"name": "htp"}])
    in_use = {("onnxruntime-qnn", "2.5.0"), ("onnxruntime", "1.32.0")}
    assert unlisted(manifest, fleet_spec, in_use) == Selection(
        targets=["old-npu"], kept=["htp.qnn-2.5"]
    )
    _, done = retire(manifest, unlisted(manifest, fleet_spec, in_use))
    assert done.variants == ["det/old-npu"] and done.kept == ["htp.qnn-2.5"]
    moved_on = {("onnxruntime-qnn", "2.7.0")}
    assert unlisted(manifest, fleet_spec, moved_on).targets == ["htp.qnn-2.5", "old-npu"]


def test_retire_unlisted_keeps_a_runtime_devices_reported_and_says_so(
    local: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``epfleet retire --spec --unlisted`` (which replaces ``compile --prune``) reads the
    device reports: a target built under a runtime a device reported running stays."""
    from datetime import datetime, timezone

    from epfleet.formats.device_report import (
        DeviceReport,
        ManifestStatus,
        encode_report,
        report_key,
    )
    from epfleet.formats.manifest import VariantRuntime

    manifest = fleet(local)
    runtime = VariantRuntime(
        name="qnn-2.5", onnxruntime="1.32.0", ep_package="onnxruntime-qnn", ep_version="2.5.0"
    )
    det = manifest.models["det"]
    old = det.variants["old-npu"].model_copy(update={"runtime": runtime})
    models = {**manifest.models, "det": det.model_copy(update={"variants": {"old-npu": old}})}
    write_manifest(local, models, generation=6, at=OLD)
    report = DeviceReport(
        device_id="dev-1",
        generated_at=datetime.now(timezone.utc).isoformat(),
        ort_version="1.32.0",
        ep_packages={"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.5.0"},
        devices=[],
        store=local.uri,
        cache="/c",
        manifest=ManifestStatus(status="fetched", generation=6, body_bytes=1),
        models=[],
        seconds=0.1,
    )
    local.write(report_key("dev-1"), encode_report(report))
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(
        "models:\n  - {name: cls, source: cls.onnx}\n  - {name: det, source: det.onnx}\n"
        "targets:\n  - {name: x86-cpu, ep: CPUExecutionProvider}\n"
    )
    argv = ["retire", "--store", local.uri, "--spec", str(spec_path), "--unlisted"]
    assert run_cli(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "retired model gone" in out and "retired variant cls/htp" in out
    assert "kept target old-npu (no longer in the spec): devices that reported" in out
    after, _ = read_manifest(local)
    assert after is not None and "old-npu" in after.models["det"].variants


def test_the_releases_in_use_are_those_of_recent_reports(local: Store) -> None:
    from datetime import datetime, timezone

    from epfleet.formats.device_report import (
        DeviceReport,
        ManifestStatus,
        encode_report,
        report_key,
    )
    from epfleet.lifecycle.retire import releases_in_use

    report = DeviceReport(
        device_id="dev-1",
        generated_at=datetime.now(timezone.utc).isoformat(),
        ort_version="1.32.0",
        ep_packages={"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.5.0"},
        devices=[],
        store=local.uri,
        cache="/c",
        manifest=ManifestStatus(status="fetched", generation=1, body_bytes=1),
        models=[],
        seconds=0.1,
    )
    local.write(report_key("dev-1"), encode_report(report))
    long_ago = datetime(2000, 1, 1, tzinfo=timezone.utc)
    assert releases_in_use(local, long_ago) == {
        ("onnxruntime", "1.32.0"),
        ("onnxruntime-qnn", "2.5.0"),
    }
    assert releases_in_use(local, datetime(2999, 1, 1, tzinfo=timezone.utc)) == set()
