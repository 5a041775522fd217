"""The device cache: a directory that is itself an ONNX Runtime model package.

    DIR/manifest.json                      ORT model package: component per model
    DIR/models/<model>/<variant>/model.onnx
    DIR/.epfleet/state.json                epfleet's own state (written atomically)
    DIR/.epfleet/fleet-manifest.json       the last valid fleet manifest (offline use)
    DIR/.epfleet/partial/<sha256>.part     interrupted downloads, resumed by range
    DIR/.epfleet/last-report.json          the last sync's device report
    DIR/.epfleet/lock                      one sync at a time

An application with no epfleet code runs a model with
``onnxruntime.ModelPackageContext(DIR).select_component(model, options).create_session()``.
Each component lists the active variant first and the previous one (kept for
rollback) after it; ORT's selection prefers the first when the scores tie, and
``write_package`` checks with ORT that it selects the active one.

The state is the record of truth; the package manifest is rendered from it after
every change, so a crash between the two is mended by the next sync.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from epfleet import ort_version
from epfleet.device.local_eps import ep_versions
from epfleet.errors import BadInputError, EpfleetError
from epfleet.fsutil import atomic_write_bytes, fsync_dir
from epfleet.hashing import sha256_file
from epfleet.manifest import Name
from eps.base import DeviceType

PACKAGE_MANIFEST = "manifest.json"
PACKAGE_NAME = "epfleet-device-cache"
MODEL_FILE = "model.onnx"
STATE_DIR = ".epfleet"
PARTIAL_MAX_AGE = 7 * 24 * 3600.0


class CacheBusy(EpfleetError):
    """Another sync holds the cache."""


Origin = Literal["published", "local", "fallback"]


class Installed(BaseModel):
    """A variant present in the cache (made by ``epfleet.device.activation``)."""

    name: str = Field(description="Variant name in the package, and its directory")
    origin: Origin
    target: str | None = Field(description="The fleet target it was published for")
    ep: str
    device: DeviceType
    compatibility_string: str | None
    provider_options: dict[str, str] = Field(default_factory=dict)
    sha256: str
    size: int
    source_sha256: str
    activated_at: datetime
    mtime_ns: int = Field(description="The file's mtime when activated: a cheap tamper check")


class ModelState(BaseModel):
    active: Installed | None = None
    previous: Installed | None = Field(default=None, description="Kept for rollback")
    recompile_failed: dict[str, str] = Field(
        default_factory=dict, description="Local build key -> why it failed; not retried"
    )


class CacheState(BaseModel):
    schema_version: Literal["1"] = "1"
    store: str | None = None
    manifest_etag: str | None = None
    manifest_generation: int | None = None
    manifest_sha256: str | None = Field(
        default=None, description="Of the cached manifest, as validated when it was fetched"
    )
    manifest_rules: str | None = Field(
        default=None, description="epfleet's validation rules it was validated under"
    )
    package_checked_with: str | None = Field(
        default=None, description="ORT and EP versions the package's selection was checked with"
    )
    models: dict[Name, ModelState] = Field(default_factory=dict)


class DeviceCache:
    def __init__(self, root: Path) -> None:
        if root.exists() and not root.is_dir():
            raise BadInputError(f"cache {root} is a file, not a directory")
        self.root = root.resolve()
        self.meta = self.root / STATE_DIR

    # --- locking and state -------------------------------------------------------------

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the cache for one sync; a second concurrent sync fails fast."""
        self.meta.mkdir(parents=True, exist_ok=True)
        with open(self.meta / "lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise CacheBusy(
                    f"another epfleet sync is using {self.root} (it holds {self.meta / 'lock'})"
                ) from None
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def load_state(self) -> CacheState:
        path = self.meta / "state.json"
        try:
            return CacheState.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return CacheState()
        except ValidationError as exc:
            raise EpfleetError(
                f"{path} is not an epfleet cache state ({exc.errors()[0]['msg']}); "
                "move the cache aside and sync again"
            ) from None

    def save_state(self, state: CacheState) -> None:
        data = state.model_dump_json(indent=2).encode()
        path = self.meta / "state.json"
        if _read(path) != data:
            atomic_write_bytes(path, data)

    def cached_manifest(self) -> bytes | None:
        try:
            return (self.meta / "fleet-manifest.json").read_bytes()
        except FileNotFoundError:
            return None

    def save_manifest(self, data: bytes) -> None:
        atomic_write_bytes(self.meta / "fleet-manifest.json", data)

    def save_last_report(self, data: bytes) -> None:
        atomic_write_bytes(self.meta / "last-report.json", data)

    # --- files ---------------------------------------------------------------------------

    def model_file(self, model: str, variant: Installed) -> Path:
        return self.root / "models" / model / variant.name / MODEL_FILE

    def partial(self, sha256: str) -> Path:
        path = self.meta / "partial" / f"{sha256}.part"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def samples_file(self, sha256: str) -> Path:
        """Where a model's golden samples are kept, content-addressed."""
        path = self.meta / "samples" / f"{sha256}.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def scratch(self) -> Path:
        path = self.meta / "scratch"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def install(self, model: str, variant: Installed, verified: Path) -> Installed:
        """Move a verified file into the variant's directory and stamp its mtime."""
        dest = self.model_file(model, variant)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(verified, dest)
        fsync_dir(dest.parent)
        return variant.model_copy(update={"mtime_ns": dest.stat().st_mtime_ns})

    def intact(self, model: str, variant: Installed, *, rehash: bool = False) -> bool:
        """The active file is still what was activated: same size and mtime (or, with
        ``rehash``, the same sha256)."""
        path = self.model_file(model, variant)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return False
        if stat.st_size != variant.size:
            return False
        if rehash or stat.st_mtime_ns != variant.mtime_ns:
            return sha256_file(path) == (variant.sha256, variant.size)
        return True

    def prune(self, model: str, state: ModelState) -> list[str]:
        """Remove the model's variant directories that are neither active nor previous."""
        keep = {v.name for v in (state.active, state.previous) if v is not None}
        directory = self.root / "models" / model
        removed = []
        if directory.is_dir():
            for child in directory.iterdir():
                if child.name not in keep:
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child.name)
        return removed

    def tidy(self, max_age_seconds: float = PARTIAL_MAX_AGE) -> None:
        """Remove compile scratch, and partial downloads nobody resumed for a while."""
        shutil.rmtree(self.meta / "scratch", ignore_errors=True)
        cutoff = time.time() - max_age_seconds
        partial = self.meta / "partial"
        if partial.is_dir():
            for path in partial.iterdir():
                if path.stat().st_mtime < cutoff:
                    path.unlink(missing_ok=True)

    # --- the ORT model package ----------------------------------------------------------

    def package_json(self, state: CacheState) -> bytes:
        components = {}
        for model, entry in sorted(state.models.items()):
            listed = [entry.active, entry.previous]
            variants = {
                v.name: _package_variant(model, v)
                for v in listed
                if v is not None and self.model_file(model, v).exists()
            }  # a missing directory would make ORT refuse the whole package
            if variants:
                components[model] = {"variants": variants}
        document = {
            "schema_version": "1.0",
            "package_name": PACKAGE_NAME,
            "components": components,
        }
        return (json.dumps(document, indent=2) + "\n").encode()

    def write_package(self, state: CacheState) -> list[str]:
        """Render the package manifest from ``state`` (only if it changed), then check with
        ORT that every component selects its active variant. Where ORT would pick the
        rollback variant instead, the package lists the active one alone. Returns the
        models whose rollback entry had to be left out."""
        path = self.root / PACKAGE_MANIFEST
        data = self.package_json(state)
        runtime = json.dumps([ort_version(), ep_versions()], sort_keys=True)
        if _read(path) == data and state.package_checked_with == runtime:
            return []  # checked with this ORT and these EPs when it was written
        state.package_checked_with = runtime
        atomic_write_bytes(path, data)
        outvoted = [
            model
            for model, entry in state.models.items()
            if entry.active is not None
            and entry.previous is not None
            and self.selected(model) not in (None, entry.active.name)
        ]
        if outvoted:
            alone = state.model_copy(
                update={
                    "models": {
                        m: e.model_copy(update={"previous": None}) if m in outvoted else e
                        for m, e in state.models.items()
                    }
                }
            )
            atomic_write_bytes(path, self.package_json(alone))
        return outvoted

    def selected(self, model: str) -> str | None:
        """The variant ORT's model package selection picks for ``model`` here."""
        import onnxruntime as ort

        try:
            context = ort.ModelPackageContext(str(self.root))
            chosen = context.select_component(model, ort.ModelPackageOptions(ort.SessionOptions()))
        except RuntimeError:
            return None
        return str(chosen.get_selected_variant_name())


def _package_variant(model: str, variant: Installed) -> dict[str, object]:
    entry: dict[str, object] = {"ep": variant.ep, "device": variant.device}
    if variant.compatibility_string:
        entry["compatibility_string"] = variant.compatibility_string
    entry["variant_directory"] = f"models/{model}/{variant.name}"
    entry["executor_info"] = {"ort": {"model_file": MODEL_FILE}}
    return entry


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
