"""A signed store for the field-ranking tests: model ``m`` with two real CPU variants
(``cpu-a`` declared first, ``cpu-b``), both optimal on this host, and enrolled reporter
devices; devices of two hardware profiles (``HARDWARE_A`` is this host's EP devices,
``HARDWARE_B`` the same with another CPU id), and their reports written and signed as
devices write them, with the latencies a test chooses."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from securesystemslib.signer import Signer

import eps
from epfleet import ort_version
from epfleet.device.local_eps import LocalEps, discover, ep_versions
from epfleet.fleet.evidence.enrolment import key_entry
from epfleet.formats.device_report import (
    DeviceInfo,
    DeviceReport,
    ManifestStatus,
    ModelReport,
    Profile,
    encode_report,
    report_key,
)
from epfleet.formats.keys import source_key, variant_key
from epfleet.formats.manifest import Manifest, ModelEntry, SourceEntry, VariantEntry
from epfleet.stores import MANIFEST_KEY, Store, open_store
from epfleet.trust.keys import new_key
from epfleet.trust.repository import init_with_key_files
from eps.base import Verdict
from tests.support.hand_made_fleet import CPU, upload, write_model

MODEL = "m"
TARGETS = ("cpu-a", "cpu-b")


class OtherHardware(LocalEps):
    """This host's EPs, its CPU device named with another device id: a second hardware
    profile (the profile is what the EP devices say; the verdicts are this host's)."""

    def __init__(self) -> None:
        found = discover()
        super().__init__(found.devices, found.absent)
        self.releases = found.releases

    def describe(self) -> list[DeviceInfo]:
        return [
            d.model_copy(update={"device_id": d.device_id + 0x7000}) if d.type == "cpu" else d
            for d in super().describe()
        ]


def hardware_a() -> list[DeviceInfo]:
    return discover().describe()


def hardware_b() -> list[DeviceInfo]:
    return OtherHardware().describe()


def make_ranked_fleet(
    uri: str, tmp_path: Path, reporters: list[str]
) -> tuple[Store, Path, str, dict[str, Signer]]:
    """The store, the root devices trust, the online signer's URI (for the gate:
    EPFLEET_TRUST_SIGNER) and each reporter's signing key (enrolled)."""
    work = tmp_path / "work"
    work.mkdir()
    store = open_store(uri)
    write_model(work / "source.onnx", label="m source", stamp=False)
    source = upload(store, work / "source.onnx", source_key("{sha}"))
    variants = {}
    for target in TARGETS:
        write_model(work / f"{target}.onnx", label=f"m {target}", stamp=True)
        artifact = upload(store, work / f"{target}.onnx", variant_key(MODEL, target, "{sha}"))
        variants[target] = VariantEntry(
            ep=CPU,
            device="cpu",
            compatibility_string=eps.load(CPU).generate_compatibility_string(
                work / f"{target}.onnx"
            ),
            artifact=artifact,
            ort_version=ort_version(),
            compiled_at=datetime.now(timezone.utc),
            status="ok",
            source_sha256=source.sha256,
            fingerprint=f"by-hand-{target}",
        )
    keys: dict[str, Signer] = {device: new_key() for device in reporters}
    manifest = Manifest(
        generation=1,
        models={
            MODEL: ModelEntry(
                source=SourceEntry(uri=source.uri, sha256=source.sha256, size=source.size),
                variants=variants,
                preference=list(TARGETS),
            )
        },
        device_keys={d: key_entry(k.public_key) for d, k in keys.items()},  # type: ignore[arg-type]
    )
    store.write(MANIFEST_KEY, manifest.to_json())
    root, signer = init_with_key_files(store, tmp_path / "keys", bins=16, adopt=True)
    return store, root, signer, keys


def latency_report(
    store: Store,
    device: str,
    hardware: list[DeviceInfo],
    target: str,
    p50_ms: float,
    *,
    generated_at: str | None = None,
) -> DeviceReport:
    """What a device of ``hardware`` running ``target`` of ``m`` reports."""
    manifest = Manifest.from_json(store.read(MANIFEST_KEY).data)  # type: ignore[union-attr]
    artifact = manifest.models[MODEL].variants[target].artifact
    assert artifact is not None
    return DeviceReport(
        device_id=device,
        generated_at=generated_at or datetime.now(timezone.utc).isoformat(),
        ort_version=ort_version(),
        ep_packages=ep_versions(),
        devices=hardware,
        store=store.uri,
        cache="/dev/null",
        manifest=ManifestStatus(status="unchanged", generation=1, body_bytes=0, signed=True),
        models=[
            ModelReport(
                model=MODEL,
                action="downloaded",
                variant=f"{target}-x",
                target=target,
                artifact_sha256=artifact.sha256,
                ep=CPU,
                verdict=Verdict.OPTIMAL,
                bytes_downloaded=0,
                reason="",
                considered=[],
                seconds=0.1,
                profile=Profile(
                    session_ms=1.0, first_run_ms=1.0, p50_ms=p50_ms, p95_ms=p50_ms, runs=8
                ),
            )
        ],
        seconds=0.2,
    )


def put_signed(
    store: Store, report: DeviceReport, key: Signer | None, under: str | None = None
) -> None:
    """The report stored as its device stores it (signed with ``key``; None: unsigned),
    under its own key or ``under`` another device's."""
    key_of = report_key(under or report.device_id)
    store.write(key_of, encode_report(report, key), content_encoding="gzip")
