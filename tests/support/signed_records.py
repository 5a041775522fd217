"""Manifests written by hand for the signed repository's tests, and ``Records`` of what the
signer signed."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path

from epfleet.formats.manifest import ArtifactRef, Manifest, ModelEntry, SourceEntry, VariantEntry
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.trust.client import verify

SHA = "ab" * 32


def variant(
    status: str = "ok", fingerprint: str = "fp", ep: str = "CPUExecutionProvider"
) -> VariantEntry:
    ok = status == "ok"
    return VariantEntry(
        ep=ep,
        device="cpu",
        compatibility_string="epfleet-cpu/1;ort=1.32.0" if ok else None,
        artifact=ArtifactRef(uri=f"variants/{fingerprint}.onnx", sha256=SHA, size=7)
        if ok
        else None,
        ort_version="1.32.0",
        compiled_at=datetime(2026, 11, 30, tzinfo=timezone.utc),
        status=status,  # type: ignore[arg-type]
        error=None if ok else "the EP refused it",
        source_sha256=SHA,
        fingerprint=fingerprint,
    )


def entry(name: str, fingerprint: str = "fp") -> ModelEntry:
    return ModelEntry(
        source=SourceEntry(uri=f"sources/{name}.onnx", sha256=SHA, size=10),
        variants={
            "cpu": variant(fingerprint=f"{name}-{fingerprint}"),
            "htp": variant("failed", f"{name}-htp", "QNNExecutionProvider"),
        },
    )


def write_manifest(store: Store, names: list[str], generation: int = 1) -> Manifest:
    manifest = Manifest(generation=generation, models={n: entry(n) for n in names})
    store.write(MANIFEST_KEY, manifest.to_json())
    return manifest


def signed_models(store: Store, device: Path, root: bytes, models: list[str]) -> dict:
    """What a device verifies for ``models`` (their bins only), as plain JSON."""
    return json.loads(verify(store, device, root, models).document)["models"]


def signed_manifest(store: Store, device: Path, root: bytes) -> Manifest:
    """The manifest.json a device wanting every model verifies."""
    return Manifest.from_json(verify(store, device, root, None).document)


class Records(logging.Handler):
    """What epfleet logs, caught on its own logger (a CLI test in the same process may
    have stopped it propagating to the root logger, where pytest's caplog listens)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def __enter__(self) -> None:
        logging.getLogger("epfleet").addHandler(self)

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("epfleet").removeHandler(self)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)
