"""The fleet-evidence view (``epfleet manifest show --field``): what device reports say of
each published model × target, counted by the pure rules of ``epfleet.fleet.evidence.field_rules``."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from epfleet.fleet.evidence.field_rules import field_view, percentile, tried_first
from epfleet.fleet.views import render_field
from epfleet.formats.device_report import (
    DeviceReport,
    ManifestStatus,
    ModelReport,
    Profile,
    VariantVerdict,
)
from epfleet.formats.manifest import ArtifactRef, Manifest, ModelEntry, SourceEntry, VariantEntry
from eps.base import Verdict

pytestmark = pytest.mark.fast

NOW = datetime(2026, 12, 1, 12, tzinfo=timezone.utc)
SHA = "ab" * 32


def variant(target: str, ep: str, device: str) -> VariantEntry:
    return VariantEntry(
        ep=ep,
        device=device,  # type: ignore[arg-type]
        compatibility_string="x",
        artifact=ArtifactRef(uri=f"variants/m/{target}/{SHA}.onnx", sha256=SHA, size=5),
        ort_version="1.32.0",
        compiled_at=NOW,
        status="ok",
        source_sha256=SHA,
        fingerprint="f",
    )


MANIFEST = Manifest(
    generation=3,
    models={
        "m": ModelEntry(
            source=SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=5),
            variants={
                "htp": variant("htp", "QNNExecutionProvider", "npu"),
                "cpu": variant("cpu", "CPUExecutionProvider", "cpu"),
            },
        )
    },
)


def judged(target: str, verdict: Verdict) -> VariantVerdict:
    return VariantVerdict(target=target, ep="e", device="npu", verdict=verdict, reason="")


def report(
    device: str,
    action: str,
    target: str | None,
    p50: float | None = None,
    other_nodes: int = 0,
    considered: list[VariantVerdict] | None = None,
) -> DeviceReport:
    profile = (
        Profile(
            session_ms=1, first_run_ms=2, p50_ms=p50, p95_ms=p50, runs=5, other_nodes=other_nodes
        )
        if p50 is not None
        else None
    )
    model = ModelReport(
        model="m",
        action=action,  # type: ignore[arg-type]
        variant=None if target is None else f"{target}-x",
        target=target,
        ep=None,
        verdict=None,
        bytes_downloaded=0,
        reason="",
        considered=considered or [],
        seconds=0.1,
        profile=profile,
    )
    return DeviceReport(
        device_id=device,
        generated_at=NOW.isoformat(),
        ort_version="1.32.0",
        ep_packages={},
        devices=[],
        store="s",
        cache="c",
        manifest=ManifestStatus(status="unchanged", generation=3, body_bytes=0),
        models=[model],
        seconds=1.0,
    )


def test_each_variant_counts_devices_running_failing_and_their_latency() -> None:
    htp_first = [judged("htp", Verdict.OPTIMAL), judged("cpu", Verdict.OPTIMAL)]
    reports = [
        report("a", "downloaded", "htp", 4.0),
        report("b", "kept", "htp", 6.0, other_nodes=3),  # part of it fell back to the CPU
        report("c", "kept", "htp", 100.0),
        report("d", "kept", "cpu", 40.0),
        # failed on the HTP variant it tried first, kept running nothing
        report("e", "failed", None, considered=htp_first),
        # fell back to the CPU after the HTP variant failed: a failure of htp, cpu runs
        report("f", "fallback", "cpu", considered=htp_first),
        # an unsupported HTP variant is not tried: the failure is the CPU variant's
        report(
            "g", "failed", None, considered=[judged("htp", Verdict.UNSUPPORTED), *htp_first[1:]]
        ),
        report("h", "kept", "old-gpu", 9.0),  # a target no longer published
    ]
    rows = {row.target: row for row in field_view(MANIFEST, reports)}
    assert rows["htp"].running == 3 and rows["htp"].failed == 2
    assert (rows["htp"].p50_ms, rows["htp"].p95_ms) == (6.0, 100.0)
    assert rows["htp"].partly_on_other_eps == 1
    assert rows["cpu"].running == 1 and rows["cpu"].failed == 1 and rows["cpu"].p50_ms == 40.0
    assert rows["old-gpu"].running == 1 and not rows["old-gpu"].published
    assert rows["htp"].published and rows["cpu"].published

    text = render_field(field_view(MANIFEST, reports), len(reports))
    assert "old-gpu (no longer published)" in text and "from 8 device reports" in text


def test_a_published_variant_no_device_reports_is_listed_empty() -> None:
    rows = field_view(MANIFEST, [])
    assert [(r.target, r.running, r.failed, r.p50_ms) for r in rows] == [
        ("cpu", 0, 0, None),
        ("htp", 0, 0, None),
    ]
    assert render_field(rows, 0).startswith("no device reports yet")


def test_the_nearest_rank_percentile_and_the_variant_tried_first() -> None:
    assert percentile([], 0.5) is None
    assert percentile([3.0], 0.95) == 3.0
    assert percentile([float(v) for v in range(1, 21)], 0.95) == 19.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    unsure = report("x", "failed", None, considered=[judged("htp", Verdict.UNKNOWN)])
    assert tried_first(unsure.models[0]) is None  # "unknown" is never treated as eligible
