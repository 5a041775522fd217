"""A fleet as runtime-watch sees it: a spec, a runtime, the variants published for it, and
the reports its devices upload."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from epfleet.fleet.watch.rules import Runtime
from epfleet.formats.device_report import (
    DeviceInfo,
    DeviceReport,
    ManifestStatus,
    ModelReport,
    VariantVerdict,
)
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


def watch_report(
    device_id: str,
    devices: list[tuple[str, str, int]],
    actions: dict[str, str],
    age: timedelta = timedelta(hours=1),
    considered: list[VariantVerdict] | None = None,
    ep_packages: dict[str, str] | None = None,
) -> DeviceReport:
    """A report made ``age`` before ``NOW`` by a device with ``devices`` (EP, type, vendor
    id) on ORT 1.32.0, each model of ``actions`` with its action and no variant."""
    return DeviceReport(
        device_id=device_id,
        generated_at=(NOW - age).isoformat(),
        ort_version="1.32.0",
        ep_packages=ep_packages or {"onnxruntime": "1.32.0"},
        devices=[
            DeviceInfo(ep=ep, type=kind, vendor="v", vendor_id=vid, device_id=1, ep_vendor="x")
            for ep, kind, vid in devices
        ],
        store="s3://b",
        cache="/c",
        manifest=ManifestStatus(status="fetched", generation=3, body_bytes=1),
        models=[
            ModelReport(
                model=model,
                action=action,  # type: ignore[arg-type]
                variant=None,
                target=None,
                ep=None,
                verdict=None,
                bytes_downloaded=0,
                reason="",
                considered=considered or [],
                seconds=0.1,
            )
            for model, action in actions.items()
        ],
        seconds=1.0,
    )
