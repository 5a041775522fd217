"""A fleet as runtime-watch sees it: a spec, a runtime, the variants published for it."""

from __future__ import annotations

from datetime import datetime, timezone

from epfleet.fleet.watch.rules import Runtime
from epfleet.formats.manifest import (
    ArtifactRef,
    Manifest,
    ModelEntry,
    SourceEntry,
    VariantEntry,
)
from epfleet.formats.spec_file import parse_spec

NOW = datetime(2026, 11, 29, 12, tzinfo=timezone.utc)
SHA = "c" * 64
QNN, CPU = "QNNExecutionProvider", "CPUExecutionProvider"
RUNTIME = Runtime(
    ort_version="1.32.0",
    ep_versions={QNN: "2.7.0", CPU: "1.32.0"},
    ep_packages={QNN: "onnxruntime-qnn", CPU: "onnxruntime"},
)


SPEC = parse_spec(
    {
        "models": [{"name": "det", "source": "det.onnx"}, {"name": "cls", "source": "cls.onnx"}],
        "targets": [
            {"name": "sd8g3-htp", "ep": QNN, "provider_options": {"soc_model": 57}},
            {"name": "x86-cpu", "ep": CPU},
            {"name": "cloud-gpu", "ep": CPU, "work_pool": "gpu-compilers", "models": ["det"]},
        ],
    }
)


def variant(
    ep: str, ort: str = "1.32.0", ep_version: str = "2.7.0", status: str = "ok"
) -> VariantEntry:
    ok = status == "ok"
    return VariantEntry(
        ep=ep,
        device="npu" if ep == QNN else "cpu",
        compatibility_string="s" if ok else None,
        artifact=ArtifactRef(uri=f"variants/m/t/{SHA}.onnx", sha256=SHA, size=5) if ok else None,
        ort_version=ort,
        ep_version=ep_version,
        compiled_at=NOW,
        status=status,  # type: ignore[arg-type]
        error=None if ok else "QNN said no",
        source_sha256=SHA,
        fingerprint="f",
    )


def manifest(**variants: dict[str, VariantEntry]) -> Manifest:
    source = SourceEntry(uri=f"sources/{SHA}.onnx", sha256=SHA, size=10)
    return Manifest(
        generation=3,
        models={name: ModelEntry(source=source, variants=v) for name, v in variants.items()},
    )


def current_fleet() -> Manifest:
    return manifest(
        det={
            "sd8g3-htp": variant(QNN),
            "x86-cpu": variant(CPU, ep_version="1.32.0"),
            "cloud-gpu": variant(CPU, ep_version="0.1"),
        },
        cls={"sd8g3-htp": variant(QNN), "x86-cpu": variant(CPU, ep_version="1.32.0")},
    )
