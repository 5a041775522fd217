"""Readable renderings of run reports and manifests: CLI tables and Prefect artifact rows."""

from __future__ import annotations

from collections.abc import Sequence

from epfleet.fleet.field_rules import FieldRow
from epfleet.fleet.rollout_rules import SideEvidence
from epfleet.fleet.rollouts import RolloutStatus
from epfleet.fleet.runs import PairResult, RunReport
from epfleet.formats.manifest import Manifest, PrecisionTried, VariantEntry
from epfleet.text import format_bytes, printable, table

GENERATED_MARK = "†"


GENERATED_LEGEND = (
    f"{GENERATED_MARK} an NPU variant checked on generated inputs only: it may pass on them "
    "and be wrong on real ones; give the model spec samples (real inputs)"
)


def generated_only(device: str | None, origin: str | None) -> bool:
    """An NPU variant verified on generated inputs only (flagged: it computes in a reduced
    precision, and uniform inputs in [-1, 1) may miss the ranges real inputs reach)."""
    return device == "npu" and origin == "generated"


def precision_text(precision: str | None, lost: Sequence[str | PrecisionTried]) -> str | None:
    """``w8a16 (fp16 verification failed in 2.31 s)``: the precision a variant was built at
    and those of its ladder that failed first, each with how and the seconds it took when
    recorded (``fp16 failed`` from records before 1.2); None when its entry records no
    precision (built before precisions)."""
    if precision is None:
        return None
    return precision + (f" ({', '.join(map(lost_text, lost))})" if lost else "")


def lost_text(tried: str | PrecisionTried) -> str:
    if isinstance(tried, str):
        return f"{tried} failed"
    how: str = tried.outcome or "failed"
    if how == "below min_coverage":
        how = "compiled below min_coverage"
    took = "" if tried.seconds is None else f" in {tried.seconds:.2f} s"
    return f"{tried.precision} {how}{took}"


def cell(result: PairResult) -> str:
    parts: list[str] = [result.status]
    lost = result.precision_tried or result.precisions_lost
    if shown := precision_text(result.precision, lost):
        parts.append(shown)
    if result.seconds is not None:
        parts.append(f"{result.seconds:.2f} s")
    if result.size is not None:
        parts.append(format_bytes(result.size))
    if result.coverage is not None:
        parts.append(f"{result.coverage:.0%} on EP")
    mark = GENERATED_MARK if generated_only(result.device, result.samples_origin) else ""
    if result.verification == "passed" and result.max_rel_error is not None:
        twin = twin_text(result.verification_twin_of, result.target)
        parts.append(f"verified {result.max_rel_error:.2%}{mark}{twin}")
    elif result.verification == "failed":
        error = "" if result.max_rel_error is None else f" {result.max_rel_error:.2%}"
        parts.append(f"verification failed{error}{mark}")
    elif result.verification is not None:
        parts.append(result.verification + mark)
    return " · ".join(parts)


def twin_text(twin_of: str | None, target: str, samples: int | None = None) -> str:
    """`` (twin of sd8g2)``: checked on its first golden sample(s) only, as a numerics twin
    of that target (`` (a rebuild, its numerics verified before)`` when that is its own
    earlier build); "" for a variant verified on every sample."""
    if twin_of is None:
        return ""
    counted = "" if samples is None else f", {samples} sample{'' if samples == 1 else 's'}"
    if twin_of == target:
        return f" (a rebuild, its numerics verified before{counted})"
    return f" (twin of {twin_of}{counted})"


def matrix_rows(report: RunReport) -> list[dict[str, str]]:
    """One row per model, one column per target: the compile matrix."""
    targets = list(dict.fromkeys(r.target for r in report.variants))
    rows: dict[str, dict[str, str]] = {}
    for result in report.variants:
        row = rows.setdefault(result.model, {"model": result.model} | dict.fromkeys(targets, ""))
        row[result.target] = cell(result)
    return list(rows.values())


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
            rows.append(
                [
                    model_name,
                    target,
                    v.ep.removesuffix("ExecutionProvider"),
                    v.device,
                    v.status,
                    precision_text(v.precision, v.precision_tried) or "-",
                    format_bytes(v.artifact.size if v.artifact else None),
                    f"{v.coverage.fraction:.0%}" if v.coverage else "-",
                    _verified(v, target),
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


def _verified(variant: VariantEntry, target: str) -> str:
    check = variant.verification
    if check is None:
        return "-"
    mark = GENERATED_MARK if generated_only(variant.device, check.samples_origin) else ""
    twin = twin_text(check.twin_of, target, check.samples)
    if check.status in ("passed", "failed") and check.max_rel_error is not None:
        return f"{check.status} {check.max_rel_error:.2%}{mark}{twin}"
    return check.status + mark + twin


def field_table_rows(rows: list[FieldRow]) -> list[list[str]]:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    return [
        [
            printable(r.model),  # a report's names: anyone who writes one chooses them
            printable(r.target if r.published else f"{r.target} (no longer published)"),
            str(r.running),
            str(r.failed),
            ms(r.p50_ms),
            ms(r.p95_ms),
            str(r.partly_on_other_eps),
        ]
        for r in rows
    ]


FIELD_HEADERS = ["model", "target", "running", "failed", "p50 ms", "p95 ms", "partly on other EPs"]


def render_field(rows: list[FieldRow], reports: int) -> str:
    """The fleet-evidence table of ``manifest show --field``."""
    if not reports:
        return "no device reports yet: devices report after each sync"
    counted = f"from {reports} device report{'s' if reports != 1 else ''}"
    latency = "latency: each running device's median run when it activated the variant"
    return f"{table(FIELD_HEADERS, field_table_rows(rows))}\n\n{counted}; {latency}"


ROLLOUT_HEADERS = ["model", "rollout", "stage", "state", "new", "previous", "p50", "gate"]


def side_text(side: SideEvidence) -> str:
    """``12 devices, 1 failed (8%), p50 10.2 ms, 2 (18%) partly on other EPs``."""
    p50 = side.median_p50_ms
    return (
        f"{side.devices} devices, {side.failed} failed ({side.failure_rate:.0%}), p50 "
        + ("-" if p50 is None else f"{p50:.1f} ms")
        + f", {side.partly_on_other_eps} ({side.other_eps_share:.0%}) partly on other EPs"
    )


def rollout_row(status: RolloutStatus) -> dict[str, str]:
    """A rollout's stage, its evidence side by side (the devices on the new variants and on
    the previous ones, counted from attributed reports only) and the gate's decision: a
    row of ``epfleet rollout status`` and of the rollout-gate artifact."""
    ev, ro = status.evidence, status.rollout
    regression = ev.latency_regression
    cells = [
        status.model,
        ro.id,
        f"{ro.stage + 1}/{len(ro.policy.stages)} ({ro.percent:g} %)",
        ro.state,
        side_text(ev.new),
        side_text(ev.previous),
        "-" if regression is None else f"{regression:+.0%}",
        f"{status.verdict.decision}: {status.verdict.reason}",
    ]
    return dict(zip(ROLLOUT_HEADERS, (printable(c) for c in cells), strict=True))
