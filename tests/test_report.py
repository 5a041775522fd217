"""The CLI's renderings of a run and of the manifest (pure): measurements of failed pairs,
and the flag on NPU variants verified on generated inputs only."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from epfleet.manifest import ArtifactRef, Manifest, ModelEntry, SourceEntry, VariantEntry
from epfleet.manifest_checks import Coverage, Verification
from epfleet.report import GENERATED_LEGEND, render_manifest, render_report
from epfleet.runs import PairResult, RunReport

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
    assert "ok · 0.41 s · 2.0 KB · 100% on EP · verified 0.04%†" in row
    assert row.count("†") == 1  # not the NPU variant checked on the spec's samples, not CPU
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
    assert "failed · 0.41 s · 100% on EP · verification failed 37.20%†" in shown
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
    assert lines[-1] == GENERATED_LEGEND
