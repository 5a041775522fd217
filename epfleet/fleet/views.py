"""Readable renderings of run reports and manifests: CLI tables and Prefect artifact rows."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import eps
from epfleet.fleet.evidence.field_rules import FieldRow
from epfleet.fleet.evidence.ranking_rules import ProfileChoice
from epfleet.fleet.rollout.rollouts import RolloutStatus
from epfleet.fleet.rollout.rules import SideEvidence, shadow_figures
from epfleet.fleet.runs.models import PairResult, RunReport
from epfleet.formats.manifest import Manifest, PrecisionTried, VariantEntry
from epfleet.text import format_bytes, plural, printable, printable_lines, share, table, wrap

GENERATED_MARK = "†"


GENERATED_LEGEND = (
    f"{GENERATED_MARK} an NPU variant checked on generated inputs only: it may pass on them "
    "and be wrong on real ones; give the model spec samples (real inputs)"
)


FOLDED_MARK = "folded"
"""After the precision of a variant compiled with its boundary Q/DQ folded (integer I/O)."""


def generated_only(device: str | None, origin: str | None) -> bool:
    """An NPU variant verified on generated inputs only (flagged: it computes in a reduced
    precision, and uniform inputs in [-1, 1) may miss the ranges real inputs reach)."""
    return device == "npu" and origin == "generated"


def precision_text(
    precision: str | None, lost: Sequence[str | PrecisionTried], folded: bool = False
) -> str | None:
    """``w8a16 (fp16 verification failed in 2.31 s)``: the precision a variant was built at
    (``w8a8 folded``: with its boundary Q/DQ folded, so it takes and gives integers) and
    those of its ladder that failed first, each with how and the seconds it took when
    recorded (``fp16 failed`` from records before 1.3); None when its entry records no
    precision (built before precisions)."""
    if precision is None:
        return None
    shown = precision + (f" {FOLDED_MARK}" if folded else "")
    return shown + (f" ({', '.join(map(lost_text, lost))})" if lost else "")


def lost_text(tried: str | PrecisionTried) -> str:
    if isinstance(tried, str):
        return f"{tried} failed"
    how: str = tried.outcome or "failed"
    if how == "below min_coverage":
        how = "compiled below min_coverage"
    took = "" if tried.seconds is None else f" in {tried.seconds:.2f} s"
    return f"{tried.precision} {how}{took}"


def coverage_text(fraction: float | None, boundary_qdq: int = 0) -> str:
    """``100%``, ``75%``, or ``99.9% (2 I/O Q/DQ on CPU)``: the share of the graph on the
    target's EP, rounded down (only a full compile reads 100%), and the (de)quantisation of
    the graph's inputs and outputs a QDQ variant leaves to ORT's CPU EP, which keeps it
    from loading with CPU fallback disabled."""
    if fraction is None:
        return "-"
    shown = share(fraction)
    return shown + (f" ({boundary_qdq} I/O Q/DQ on CPU)" if boundary_qdq else "")


def _checked_text(result: PairResult) -> str:
    mark = GENERATED_MARK if generated_only(result.device, result.samples_origin) else ""
    if result.verification in ("passed", "failed") and result.max_rel_error is not None:
        return f"{result.max_rel_error:.2%}{mark}"
    return (result.verification or "-") + mark


def cell(result: PairResult) -> str:
    """A compile matrix cell, short enough for three targets on a laptop: status, precision
    and the verified error (``ok fp16 0.03%``), with ``EP 75%`` when the EP took less than
    the whole graph; ``detail`` has the rest."""
    parts: list[str] = [result.status]
    if result.precision is not None:
        parts.append(result.precision + (f" {FOLDED_MARK}" if result.folded else ""))
    parts.append(_checked_text(result))
    if result.coverage is not None and result.coverage < 1:
        parts.append(f"EP {share(result.coverage)}")
    return " ".join(parts)


def detail(result: PairResult) -> str:
    """Everything the run measured of a pair, in a line: precision and the ladder's losers,
    compile seconds, size, coverage and verification."""
    parts: list[str] = [result.status]
    lost = result.precision_tried or result.precisions_lost
    if shown := precision_text(result.precision, lost, result.folded):
        parts.append(shown)
    if result.seconds is not None:
        parts.append(f"{result.seconds:.2f} s")
    if result.size is not None:
        parts.append(format_bytes(result.size))
    if result.coverage is not None:
        parts.append(graph_on_ep(result.coverage, result.coverage_boundary_qdq, result.ep))
    mark = GENERATED_MARK if generated_only(result.device, result.samples_origin) else ""
    metric = f", {result.metric}" if result.metric else ""
    if result.verification == "passed" and result.max_rel_error is not None:
        twin = twin_text(result.verification_twin_of, result.target)
        parts.append(f"verified within {result.max_rel_error:.2%} of range{metric}{mark}{twin}")
    elif result.verification == "failed":
        error = "" if result.max_rel_error is None else f": {result.max_rel_error:.2%} of range"
        parts.append(f"verification failed{error}{metric}{mark}")
    elif result.verification is not None:
        parts.append(result.verification + mark)
    return " · ".join(parts)


def graph_on_ep(fraction: float, boundary_qdq: int, ep: str) -> str:
    """``whole graph on QNN``, ``75% of the graph on QNN``: how much of the model the
    target's EP took (the rest runs on ORT's CPU EP)."""
    name = ep.removesuffix("ExecutionProvider")
    shown = f"{share(fraction)} of the graph on {name}"
    if fraction >= 1:
        shown = f"whole graph on {name}"
    return shown + (f" ({boundary_qdq} I/O Q/DQ on CPU)" if boundary_qdq else "")


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
    """One row per model, one column per target: the compile matrix, short cells."""
    targets = list(dict.fromkeys(r.target for r in report.variants))
    rows: dict[str, dict[str, str]] = {}
    for result in report.variants:
        row = rows.setdefault(result.model, {"model": result.model} | dict.fromkeys(targets, ""))
        row[result.target] = cell(result)
    return list(rows.values())


DETAIL_HEADERS = ["model", "target", "status", "precision", "seconds", "size", "coverage"]
DETAIL_HEADERS += ["verification"]


def detail_rows(report: RunReport) -> list[dict[str, str]]:
    """One row per pair, every measurement: the compile matrix's details."""
    rows = []
    for r in report.variants:
        verified = "-"
        if r.verification is not None:
            verified = (
                f"{r.verification} {_checked_text(r)}"
                if r.max_rel_error is not None
                else _checked_text(r)
            ) + twin_text(r.verification_twin_of, r.target)
        cells = [
            r.model,
            r.target,
            r.status,
            precision_text(r.precision, r.precision_tried or r.precisions_lost, r.folded) or "-",
            "-" if r.seconds is None else f"{r.seconds:.2f}",
            format_bytes(r.size),
            coverage_text(r.coverage, r.coverage_boundary_qdq),
            verified,
        ]
        rows.append(dict(zip(DETAIL_HEADERS, cells, strict=True)))
    return rows


CLI_COLUMNS = 100
"""The width the compile matrix is fitted to off a terminal: long model names are shortened
in it (never in the details below it)."""
SHORTEST_NAME = 16


def _fitted(
    rows: list[dict[str, str]], headers: list[str], width: int | None
) -> list[dict[str, str]]:
    """``rows`` with model names shortened (``…``) so that the matrix fits ``width`` (else
    ``CLI_COLUMNS``), as long as the shortened names stay distinct and at least
    ``SHORTEST_NAME`` long."""
    others = sum(max(len(h), *(len(r[h]) for r in rows)) + 2 for h in headers[1:])
    room = max((width or CLI_COLUMNS) - others, SHORTEST_NAME)
    names = [r["model"] for r in rows]
    short = [n if len(n) <= room else n[: room - 1] + "…" for n in names]
    if len(set(short)) < len(short):
        return rows
    return [r | {"model": name} for r, name in zip(rows, short, strict=True)]


MATRIX_LEGEND = (
    "each cell: status, precision, and the largest difference from the source model's "
    "outputs, as a share of their range"
)


def render_report(report: RunReport, width: int | None = None) -> str:
    """What ``epfleet compile`` prints: the matrix, its legends, a line per pair and the
    totals, fitted to ``width`` columns."""
    rows = matrix_rows(report)
    headers = list(rows[0]) if rows else ["model"]
    cells = [[row[h] for h in headers] for row in _fitted(rows, headers, width)]
    out = [table(headers, cells, width)]
    legends = [MATRIX_LEGEND] if rows else []
    if any(GENERATED_MARK in cell for row in rows for cell in row.values()):
        legends.append(GENERATED_LEGEND)
    if any("EP " in cell for row in rows for cell in row.values()):
        legends.append(PARTIAL_LEGEND)
    lines = legends
    if report.variants:
        lines.append("")
        lines += [f"{r.model} × {r.target}: {detail(r)}" for r in report.variants]
    for result in report.variants:
        if result.status == "failed":
            lines.append(f"FAILED {result.model} × {result.target}: {result.error}")
    lines.append(
        f"{report.compiled} compiled, {report.skipped} up to date, {report.failed} failed; "
        f"manifest generation {report.generation}"
        + (" (published)" if report.published else " (unchanged)")
    )
    out += [wrap(printable_lines(line), width) for line in lines]
    return "\n".join(out)


PARTIAL_LEGEND = (
    "EP n%: the share of the graph the target's EP took; the rest (named in the details) "
    "runs on ORT's CPU EP, so the variant does not load with CPU fallback disabled"
)


def render_manifest(manifest: Manifest, store: str, width: int | None = None) -> str:
    """What ``epfleet manifest show`` prints: a row per variant, then what each target was
    built for and each runtime serves, fitted to ``width`` columns (the columns a device
    or the JSON also says, left out first)."""
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
                    precision_text(v.precision, v.precision_tried, v.folded_io is not None) or "-",
                    format_bytes(v.artifact.size if v.artifact else None),
                    coverage_text(v.coverage.fraction, v.coverage.boundary_qdq)
                    if v.coverage
                    else "-",
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
    legend = [MANIFEST_LEGEND] if rows else []
    if any(GENERATED_MARK in row[verified] for row in rows):
        legend.append(GENERATED_LEGEND)
    lines = [header, *legend, *built_for(manifest), *runtime_lines(manifest), *failures]
    shown = table(
        headers,
        rows,
        width,
        wrapped=("precision", "verified"),
        droppable=("compatibility", "compiled", "device", "ep"),
    )
    lines = [wrap(printable_lines(line), width) for line in lines]
    return "\n".join([lines[0], shown, *lines[1:]])


MANIFEST_LEGEND = (
    "coverage: the share of the graph the target's EP runs; verified: passed or failed, and "
    "the largest difference from the source model's outputs, as a share of their range"
)


RUNTIME_WIDTH = 80


def runtime_lines(manifest: Manifest, width: int = RUNTIME_WIDTH) -> list[str]:
    """Per runtime the variants were built under: a line of its releases (the SDK's where
    the EP names it), then the targets whose variants serve it, with how many models
    each; wrapped within ``width`` columns."""
    served: dict[str, dict[str, int]] = {}
    releases: dict[str, list[str]] = {}
    for model in manifest.models.values():
        for target, variant in model.variants.items():
            runtime = variant.runtime
            if runtime is None or variant.status != "ok":
                continue
            said = f"onnxruntime {runtime.onnxruntime}"
            if runtime.ep_package != "onnxruntime":  # the CPU EP's package is ORT's own
                said += f", {runtime.ep_package} {runtime.ep_version}"
            if runtime.sdk_version:
                said += f" (SDK {runtime.sdk_version})"
            if said not in releases.setdefault(runtime.name, []):
                releases[runtime.name].append(said)
            counts = served.setdefault(runtime.name, {})
            counts[target] = counts.get(target, 0) + 1
    lines = []
    for name in sorted(served):
        head = f"runtime {name}: {'; '.join(sorted(releases[name]))}"
        lines += textwrap.wrap(head, width, subsequent_indent="    ", break_on_hyphens=False)
        targets = sorted(served[name].items())
        serving = ", ".join(f"{target} ({plural(count, 'model')})" for target, count in targets)
        lines += textwrap.wrap(
            f"served by {serving}",
            width,
            initial_indent="  ",
            subsequent_indent="    ",
            break_on_hyphens=False,
        )
    return lines


def built_for(manifest: Manifest) -> list[str]:
    """One line per target whose EP reads its strings: the hardware and runtime its
    variants were built for (a QNN target's HTP arch, SoC and VTCM size)."""
    said: dict[str, list[str]] = {}
    for model in manifest.models.values():
        for target, variant in model.variants.items():
            string = variant.compatibility_string
            if string is None or variant.ep not in eps.known():
                continue
            words = eps.load(variant.ep).explain_string(string)
            if words is not None and words not in said.setdefault(target, []):
                said[target].append(words)
    return [f"{target}: {'; '.join(words)}" for target, words in sorted(said.items()) if words]


def _verified(variant: VariantEntry, target: str) -> str:
    check = variant.verification
    if check is None:
        return "-"
    mark = GENERATED_MARK if generated_only(variant.device, check.samples_origin) else ""
    twin = twin_text(check.twin_of, target, check.samples)
    metric = f", {check.metric.shown()}" if check.metric else ""
    if check.status in ("passed", "failed") and check.max_rel_error is not None:
        return f"{check.status} {check.max_rel_error:.2%}{metric}{mark}{twin}"
    return check.status + metric + mark + twin


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


def render_field(rows: list[FieldRow], reports: int, width: int | None = None) -> str:
    """The fleet-evidence table of ``manifest show --field``, fitted to ``width``."""
    if not reports:
        return "no device reports yet: devices report after each sync"
    counted = f"from {reports} device report{'s' if reports != 1 else ''}"
    latency = "latency: each running device's median run when it activated the variant"
    shown = table(FIELD_HEADERS, field_table_rows(rows), width, wrapped=("target",))
    return f"{shown}\n\n{wrap(f'{counted}; {latency}', width)}"


def render_choices(choices: list[ProfileChoice], width: int | None = None) -> str:
    """Why each hardware profile (and runtime) takes what it takes, per model: the field
    rankings part of ``manifest show --field``, each line fitted to ``width``."""
    if not choices:
        return "field rankings: no device reported a latency the gate counts"
    lines = ["field rankings (what the rollout gate signs from these reports):"]
    for choice in choices:
        head = f"{choice.model} on {choice.profile}: {choice.hardware}; {choice.runtime}"
        lines.append(wrap(printable(head), width))
        lines.extend(wrap(printable(f"  {why}"), width, "    ") for why in choice.why)
    return "\n".join(lines)


ROLLOUT_HEADERS = ["model", "rollout", "stage", "state", "new", "previous", "p50 change", "gate"]


def side_text(side: SideEvidence) -> str:
    """``12 devices, 1 failed (8%), p50 10.2 ms, 2 (18%) partly on other EPs``, and the
    side's shadow runs when it has any (``shadow_text``)."""
    p50 = side.median_p50_ms
    return (
        f"{side.devices} devices, {side.failed} failed ({side.failure_rate:.0%}), p50 "
        + ("-" if p50 is None else f"{p50:.1f} ms")
        + f", {side.partly_on_other_eps} ({side.other_eps_share:.0%}) partly on other EPs"
        + (f"; {shadow_text(side)}" if side.shadow_runs else "")
    )


def shadow_text(side: SideEvidence) -> str:
    """``shadow runs: 3 of 4 within the bounds (largest error ...)``: the agreement of the
    side's candidate with the variants it ran beside, on this stage."""
    within = side.shadow_runs - side.shadow_outside
    return f"shadow runs: {within} of {side.shadow_runs} within the bounds ({shadow_figures(side)})"


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


def rollout_runtime_lines(status: RolloutStatus) -> list[str]:
    """A rollout's counted evidence by the runtime its devices run, each side on a line of
    its own: what ``epfleet rollout status`` prints under its table (wrapped to the
    terminal), and the rollout-gate flow's artifact."""
    lines = [printable(f"{status.model} {status.rollout.id} by runtime:")]
    for runtime, sides in sorted(status.evidence.runtimes.items()):
        lines.append(printable(f"  {runtime}"))
        for name, side in (("new", sides.new), ("previous", sides.previous)):
            if side.devices:
                lines.append(f"    {name:9}{short_side_text(side)}")
    return lines


def short_side_text(side: SideEvidence) -> str:
    """``12 devices, 1 failed (8%), p50 10.2 ms``, and ``, shadow runs 3 of 4 within``."""
    p50 = side.median_p50_ms
    shadow = ""
    if side.shadow_runs:
        within = side.shadow_runs - side.shadow_outside
        shadow = f", shadow runs {within} of {side.shadow_runs} within"
    return (
        f"{side.devices} devices, {side.failed} failed ({side.failure_rate:.0%}), p50 "
        + ("-" if p50 is None else f"{p50:.1f} ms")
        + shadow
    )
