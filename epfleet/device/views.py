"""Readable renderings of a device report: the ``epfleet sync`` table and its Prefect artifacts."""

from __future__ import annotations

from epfleet.device.local_eps import NO_NPU
from epfleet.formats.device_report import DeviceReport, ManifestStatus
from epfleet.text import format_bytes, printable_lines, table, wrap


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


def manifest_facts(status: ManifestStatus) -> str:
    """``generation 4, 3.3 KB, signed, timestamp v9``: what is known, no zero transfer."""
    facts = [f"generation {status.generation}"] if status.generation is not None else []
    if status.body_bytes:
        facts.append(format_bytes(status.body_bytes))
    if status.signed is not None:
        facts.append("signed" if status.signed else "unsigned")
        if status.signed and status.signed_version is not None:
            facts.append(f"timestamp v{status.signed_version}")
    return ", ".join(facts)


def render_device_report(report: DeviceReport, width: int | None = None) -> str:
    """The report of ``epfleet sync``, every line fitted to ``width`` columns."""
    devices = ", ".join(
        f"{d.ep.removesuffix('ExecutionProvider')}:{d.type}" for d in report.devices
    )
    manifest = report.manifest
    facts = manifest_facts(manifest)
    out = [
        f"device {report.device_id}  ORT {report.ort_version}  devices: {devices}",
        f"manifest: {manifest.status}{f' ({facts})' if facts else ''}"
        + (f": {manifest.reason}" if manifest.reason else "")
        + (f" [warning: {manifest.warning}]" if manifest.warning else ""),
        *skipped_eps(report),
    ]
    out = [wrap(printable_lines(line), width) for line in out]
    notes: dict[str, int] = {}
    for rows, droppable in (
        (verdict_rows(report), ("device",)),
        (device_rows(report), ("verdict", "precision", "downloaded")),
    ):
        if rows:
            headers = list(rows[0])
            cells = [[_noted(row[h], notes) for h in headers] for row in rows]
            out.append(table(headers, cells, width, wrapped=("reason",), droppable=droppable))
    out.extend(wrap(printable_lines(f"[{number}] {text}"), width) for text, number in notes.items())
    served = sum(m.action in ("kept", "downloaded", "recompiled") for m in report.models)
    tail = [f"{served} of {len(report.models)} models served in {report.seconds:.2f} s"]
    if report.report_skipped:
        tail.append(f"report not uploaded: {report.report_skipped}")
    elif report.report_uploaded is False:
        tail.append(f"report not uploaded: {report.report_error}")
    tail.extend(f"warning: {warning}" for warning in report.warnings)
    out.extend(wrap(printable_lines(line), width) for line in tail)
    return "\n".join(out)


def skipped_eps(report: DeviceReport) -> list[str]:
    """``QNN: no NPU on this device; its variants are skipped``, once per such EP."""
    eps = dict.fromkeys(
        v.ep.removesuffix("ExecutionProvider")
        for m in report.models
        for v in m.considered
        if v.reason == NO_NPU
    )
    return [f"{ep}: {NO_NPU}; its variants are skipped" for ep in eps]


NOTE_AT = 100
"""A cell longer than this (an EP validator's reason can run to 200 characters) becomes a
numbered note below the tables, in full: one note for each distinct text."""


def _noted(text: str, notes: dict[str, int]) -> str:
    if len(text) <= NOTE_AT:
        return text
    number = notes.setdefault(text, len(notes) + 1)
    return f"{text[: NOTE_AT - 40].rstrip()}... [{number}]"
