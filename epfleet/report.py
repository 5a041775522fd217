"""Readable renderings of run reports and manifests: CLI tables and Prefect artifact rows."""

from __future__ import annotations

from collections.abc import Sequence

from epfleet.device_report import DeviceReport
from epfleet.manifest import Manifest, VariantEntry
from epfleet.runs import PairResult, RunReport


def format_bytes(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


GENERATED_MARK = "†"
GENERATED_LEGEND = (
    f"{GENERATED_MARK} an NPU variant checked on generated inputs only: it may pass on them "
    "and be wrong on real ones; give the model spec samples (real inputs)"
)


def generated_only(device: str | None, origin: str | None) -> bool:
    """An NPU variant verified on generated inputs only (flagged: it computes in a reduced
    precision, and uniform inputs in [-1, 1) may miss the ranges real inputs reach)."""
    return device == "npu" and origin == "generated"


def precision_text(precision: str | None, lost: Sequence[str]) -> str | None:
    """``w8a16 (fp16 failed)``: the precision a variant was built at and those of its
    ladder that failed first; None when its entry records none (built before precisions)."""
    if precision is None:
        return None
    return precision + (f" ({', '.join(lost)} failed)" if lost else "")


def cell(result: PairResult) -> str:
    parts: list[str] = [result.status]
    if shown := precision_text(result.precision, result.precisions_lost):
        parts.append(shown)
    if result.seconds is not None:
        parts.append(f"{result.seconds:.2f} s")
    if result.size is not None:
        parts.append(format_bytes(result.size))
    if result.coverage is not None:
        parts.append(f"{result.coverage:.0%} on EP")
    mark = GENERATED_MARK if generated_only(result.device, result.samples_origin) else ""
    if result.verification == "passed" and result.max_rel_error is not None:
        parts.append(f"verified {result.max_rel_error:.2%}{mark}")
    elif result.verification == "failed":
        error = "" if result.max_rel_error is None else f" {result.max_rel_error:.2%}"
        parts.append(f"verification failed{error}{mark}")
    elif result.verification is not None:
        parts.append(result.verification + mark)
    return " · ".join(parts)


def matrix_rows(report: RunReport) -> list[dict[str, str]]:
    """One row per model, one column per target: the compile matrix."""
    targets = list(dict.fromkeys(r.target for r in report.variants))
    rows: dict[str, dict[str, str]] = {}
    for result in report.variants:
        row = rows.setdefault(result.model, {"model": result.model} | dict.fromkeys(targets, ""))
        row[result.target] = cell(result)
    return list(rows.values())


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


def render_report(report: RunReport) -> str:
    rows = matrix_rows(report)
    headers = list(rows[0]) if rows else ["model"]
    out = [table(headers, [[row[h] for h in headers] for row in rows])]
    if any(GENERATED_MARK in cell for row in rows for cell in row.values()):
        out.append(GENERATED_LEGEND)
    for result in report.variants:
        if result.status == "failed":
            out.append(f"FAILED {result.model} × {result.target}: {result.error}")
    out.append(
        f"{report.compiled} compiled, {report.skipped} up to date, {report.failed} failed; "
        f"manifest generation {report.generation}"
        + (" (published)" if report.published else " (unchanged)")
    )
    return "\n".join(out)


def render_manifest(manifest: Manifest, store: str) -> str:
    rows, failures = [], []
    for model_name, model in sorted(manifest.models.items()):
        for target, v in model.variants.items():
            lost = [t.precision for t in v.precision_tried]
            rows.append(
                [
                    model_name,
                    target,
                    v.ep.removesuffix("ExecutionProvider"),
                    v.device,
                    v.status,
                    precision_text(v.precision, lost) or "-",
                    format_bytes(v.artifact.size if v.artifact else None),
                    f"{v.coverage.fraction:.0%}" if v.coverage else "-",
                    _verified(v),
                    v.compiled_at.strftime("%Y-%m-%d %H:%M"),
                    v.compatibility_string or "-",
                ]
            )
            if v.status == "failed":
                failures.append(f"FAILED {model_name} × {target}: {v.error}")
    header = (
        f"{store}/manifest.json  generation {manifest.generation}  "
        f"published {manifest.published_at:%Y-%m-%d %H:%M:%S %Z}"
        if manifest.published_at
        else f"{store}/manifest.json  generation {manifest.generation}"
    )
    headers = ["model", "target", "ep", "device", "status", "precision", "size", "coverage"]
    headers += ["verified", "compiled", "compatibility"]
    verified = headers.index("verified")
    legend = [GENERATED_LEGEND] if any(GENERATED_MARK in row[verified] for row in rows) else []
    return "\n".join([header, table(headers, rows), *legend, *failures])


def _verified(variant: VariantEntry) -> str:
    check = variant.verification
    if check is None:
        return "-"
    mark = GENERATED_MARK if generated_only(variant.device, check.samples_origin) else ""
    if check.status in ("passed", "failed") and check.max_rel_error is not None:
        return f"{check.status} {check.max_rel_error:.2%}{mark}"
    return check.status + mark


def device_rows(report: DeviceReport) -> list[dict[str, str]]:
    """One row per model: what the sync did and why."""
    return [
        {
            "model": m.model,
            "action": m.action,
            "variant": m.variant or "-",
            "ep": (m.ep or "-").removesuffix("ExecutionProvider"),
            "precision": m.precision or "-",
            "verdict": m.verdict.value if m.verdict else "-",
            "downloaded": format_bytes(m.bytes_downloaded),
            "reason": m.reason,
        }
        for m in report.models
    ]


def verdict_rows(report: DeviceReport) -> list[dict[str, str]]:
    """One row per published variant considered: how this device judged it."""
    return [
        {
            "model": m.model,
            "target": v.target,
            "ep": v.ep.removesuffix("ExecutionProvider"),
            "device": v.device,
            "verdict": v.verdict.value,
            "reason": v.reason,
        }
        for m in report.models
        for v in m.considered
    ]


def _signing(signed: bool | None, version: int | None) -> str:
    if signed is None:
        return ""
    if not signed:
        return ", unsigned"
    return f", signed, timestamp v{version}" if version is not None else ", signed"


def render_device_report(report: DeviceReport) -> str:
    devices = ", ".join(
        f"{d.ep.removesuffix('ExecutionProvider')}:{d.type}" for d in report.devices
    )
    manifest = report.manifest
    out = [
        f"device {report.device_id}  ORT {report.ort_version}  devices: {devices}",
        f"manifest: {manifest.status} (generation {manifest.generation}, "
        f"{format_bytes(manifest.body_bytes)}{_signing(manifest.signed, manifest.signed_version)})"
        + (f": {manifest.reason}" if manifest.reason else "")
        + (f" [warning: {manifest.warning}]" if manifest.warning else ""),
    ]
    verdicts = verdict_rows(report)
    if verdicts:
        headers = list(verdicts[0])
        out.append(table(headers, [[_clip(row[h]) for h in headers] for row in verdicts]))
    rows = device_rows(report)
    if rows:
        headers = list(rows[0])
        out.append(table(headers, [[_clip(row[h]) for h in headers] for row in rows]))
    served = sum(m.action in ("kept", "downloaded", "recompiled") for m in report.models)
    out.append(f"{served} of {len(report.models)} models served in {report.seconds:.2f} s")
    if report.report_uploaded is False:
        out.append(f"report not uploaded: {report.report_error}")
    out.extend(f"warning: {warning}" for warning in report.warnings)
    return "\n".join(out)


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
