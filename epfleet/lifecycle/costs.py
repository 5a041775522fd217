"""What a store costs: bytes per model and per target, and the store's total split into
what the manifest references, what ``epfleet gc`` could collect, and the rest.

``costs`` reads the store's listing (one LIST, no object is read); ``cost_table`` and
``cost_markdown`` render it for ``epfleet manifest show`` and the fleet flow's artifact.
A file two models share (one source, say), or a sidecar a source and its variants share,
counts in each row that has it but once in the store's totals. A source's and a
variant's bytes are those of all their files.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from epfleet.formats.manifest import Manifest, delta_keys, referenced_keys
from epfleet.lifecycle.gc import kind_of, needed_keys
from epfleet.stores import Store
from epfleet.text import format_bytes, table, wrap


class ModelCost(BaseModel):
    model: str
    source: int = Field(description="Bytes of its source (all its files)")
    samples: int = Field(description="Bytes of its golden samples (0 without)")
    variants: dict[str, int] = Field(description="Bytes of its variant per target (all its files)")
    total: int


class TargetCost(BaseModel):
    target: str
    variants: int = Field(description="How many models have a variant for it")
    bytes: int


class StoreCost(BaseModel):
    objects: int = Field(description="Objects in the store, temp files included")
    total: int = Field(description="Their bytes, with incomplete multipart uploads' parts")
    referenced: int = Field(description="Bytes of the files the manifest references")
    unreferenced: int = Field(
        description="Bytes of sources, samples, variants and temp files nothing references "
        "(what epfleet gc collects once past its grace period), with incomplete uploads"
    )
    other: int = Field(description="Bytes of everything else: manifest, reports, trust, runs")
    missing: list[str] = Field(
        default_factory=list, description="Keys the manifest references that the store lacks"
    )


class Costs(BaseModel):
    store: str
    generation: int | None
    models: list[ModelCost]
    targets: list[TargetCost]
    totals: StoreCost


def costs(store: Store, manifest: Manifest | None) -> Costs:
    """Bytes per model and target (from the manifest) and the store's own (its listing)."""
    models: list[ModelCost] = []
    by_target: dict[str, TargetCost] = {}
    for name, entry in sorted((manifest.models if manifest else {}).items()):
        variants = {
            target: variant.total_size
            for target, variant in sorted(entry.variants.items())
            if variant.artifact is not None
        }
        samples = entry.samples.size if entry.samples else 0
        total = entry.source.total_size + samples + sum(variants.values())
        models.append(
            ModelCost(
                model=name,
                source=entry.source.total_size,
                samples=samples,
                variants=variants,
                total=total,
            )
        )
        for target, size in variants.items():
            cost = by_target.setdefault(target, TargetCost(target=target, variants=0, bytes=0))
            cost.variants += 1
            cost.bytes += size
    referenced = needed_keys(manifest) | delta_keys(manifest)
    listed = store.list_objects("", hidden=True)
    uploads = store.incomplete_uploads()
    present = {o.key for o in listed}
    totals = StoreCost(
        objects=len(listed),
        total=sum(o.size for o in listed) + sum(u.size for u in uploads),
        referenced=sum(o.size for o in listed if o.key in referenced),
        unreferenced=sum(
            o.size for o in listed if o.key not in referenced and kind_of(o.key) is not None
        )
        + sum(u.size for u in uploads),
        other=sum(o.size for o in listed if o.key not in referenced and kind_of(o.key) is None),
        missing=sorted(referenced_keys(manifest) - present),
    )
    return Costs(
        store=store.uri,
        generation=manifest.generation if manifest else None,
        models=models,
        targets=sorted(by_target.values(), key=lambda t: t.target),
        totals=totals,
    )


def _rows(data: Costs) -> tuple[list[str], list[list[str]]]:
    targets = [t.target for t in data.targets]
    headers = ["model", "source", "samples", *targets, "total"]
    rows = [
        [
            m.model,
            format_bytes(m.source),
            format_bytes(m.samples) if m.samples else "-",
            *(format_bytes(m.variants[t]) if t in m.variants else "-" for t in targets),
            format_bytes(m.total),
        ]
        for m in data.models
    ]
    rows.append(
        [
            "all models",
            format_bytes(sum(m.source for m in data.models)),
            format_bytes(sum(m.samples for m in data.models)),
            *(format_bytes(t.bytes) for t in data.targets),
            format_bytes(sum(m.total for m in data.models)),
        ]
    )
    return headers, rows


def _store_line(data: Costs) -> str:
    t = data.totals
    line = (
        f"store {data.store}: {format_bytes(t.total)} in {t.objects} objects; "
        f"referenced {format_bytes(t.referenced)}, unreferenced {format_bytes(t.unreferenced)} "
        f"(epfleet gc), other {format_bytes(t.other)} (manifest, reports, trust, runs)"
    )
    if t.missing:
        line += f"; MISSING {len(t.missing)} referenced file(s): {', '.join(t.missing[:5])}"
    return line


def cost_table(store: Store, manifest: Manifest | None, width: int | None = None) -> str:
    """The costs as a plain-text table and a line for the store's total, fitted to
    ``width`` columns."""
    data = costs(store, manifest)
    headers, rows = _rows(data)
    return table(headers, rows, width) + "\n" + wrap(_store_line(data), width)


def cost_markdown(data: Costs) -> str:
    """The costs as a Markdown table (a Prefect markdown artifact)."""
    headers, rows = _rows(data)
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n\n" + _store_line(data) + "\n"
