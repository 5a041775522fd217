"""Which variants a model keeps in the cache state: new variants, activation, rollback (pure).

A variant's name is its target (or ``local-<ep>``, or ``fallback``) and the first 12
hex digits of its digest (its file's sha256 when it is one file; the file set's digest,
``epfleet.formats.manifest.set_digest``, when it has files beside the main one); it is also its
directory in the cache. A model keeps its
active variant and the one before it, for rollback; the cache's files follow the state
(``epfleet.device.cache``; the state models are in ``epfleet.device.cache.state``).
"""

from __future__ import annotations

from datetime import datetime

from epfleet.device.cache.layout import MODEL_FILE, local_target_name
from epfleet.device.cache.state import Installed, InstalledFile, ModelState, Origin
from epfleet.formats.manifest import FoldedIo, PackageFile, SourceEntry, VariantEntry
from eps.base import DeviceType, LocalTarget, Precision


def variant_name(prefix: str, sha256: str) -> str:
    return f"{prefix}-{sha256[:12]}"


def published_variant(target: str, variant: VariantEntry, now: datetime) -> Installed:
    """The manifest's variant for ``target``, as it will be installed at ``now``."""
    artifact = variant.artifact
    assert artifact is not None and variant.compatibility_string is not None
    return _new(
        prefix=target,
        origin="published",
        target=target,
        ep=variant.ep,
        device=variant.device,
        compatibility_string=variant.compatibility_string,
        provider_options=variant.provider_options,
        sha256=artifact.sha256,
        size=artifact.size,
        source_sha256=variant.source_sha256,
        model_file=variant.model_file,
        files=installed_files(variant.files),
        precision=variant.precision,
        folded_io=variant.folded_io,
        now=now,
    )


def local_variant(
    ep: str,
    local: LocalTarget,
    compatibility_string: str,
    sha256: str,
    size: int,
    source: str,
    *,
    now: datetime,
    model_file: str = MODEL_FILE,
    files: list[InstalledFile] | None = None,
    precision: Precision | None = None,
) -> Installed:
    """A variant built here for ``ep`` from the source whose digest is ``source``: its
    main file (``sha256``, ``size``) and the ``files`` beside it; ``precision`` is what
    the EP computes it in (its module's default for these options)."""
    return _new(
        prefix=local_target_name(ep),
        origin="local",
        target=None,
        ep=ep,
        device=local.device,
        compatibility_string=compatibility_string,
        provider_options=local.provider_options,
        sha256=sha256,
        size=size,
        source_sha256=source,
        model_file=model_file,
        files=files or [],
        precision=precision,
        now=now,
    )


def fallback_variant(source: SourceEntry, now: datetime) -> Installed:
    """The source model itself (with the files beside it), run on the CPU EP."""
    return _new(
        prefix="fallback",
        origin="fallback",
        target=None,
        ep="CPUExecutionProvider",
        device="cpu",
        compatibility_string=None,
        provider_options={},
        sha256=source.sha256,
        size=source.size,
        source_sha256=source.digest,
        model_file=source.model_file,
        files=installed_files(source.files),
        precision="fp32",  # as the CPU EP module says it computes (eps/cpu.py)
        now=now,
    )


def installed_files(files: list[PackageFile]) -> list[InstalledFile]:
    """The manifest's files of a set, as the state records them (mtimes once installed)."""
    return [InstalledFile(path=f.path, sha256=f.sha256, size=f.size) for f in files]


def _new(
    *,
    prefix: str,
    origin: Origin,
    target: str | None,
    ep: str,
    device: DeviceType,
    compatibility_string: str | None,
    provider_options: dict[str, str],
    sha256: str,
    size: int,
    source_sha256: str,
    model_file: str,
    files: list[InstalledFile],
    precision: Precision | None,
    folded_io: FoldedIo | None = None,
    now: datetime,
) -> Installed:
    """The one place an ``Installed`` is made, activated at ``now`` (to the second); the
    cache stamps its mtimes when it installs it."""
    installed = Installed(
        name="",
        origin=origin,
        target=target,
        ep=ep,
        device=device,
        compatibility_string=compatibility_string,
        provider_options=provider_options,
        sha256=sha256,
        size=size,
        source_sha256=source_sha256,
        activated_at=now.replace(microsecond=0),
        mtime_ns=0,
        model_file=model_file,
        files=files,
        precision=precision,
        folded_io=folded_io,
    )
    return installed.model_copy(update={"name": variant_name(prefix, installed.digest)})


def promote(state: ModelState, installed: Installed) -> None:
    """Make ``installed`` active and keep the old active one for rollback (a variant is
    never its own rollback)."""
    old = state.active
    if old is not None and old.name != installed.name:
        state.previous = old
    elif state.previous is not None and state.previous.name == installed.name:
        state.previous = None
    state.active = installed


def drop_changed_active(state: ModelState, previous_intact: bool) -> str:
    """The active variant's file changed on disk: roll back to the previous variant if its
    file is intact, else run nothing. Returns the note for the model's report."""
    changed, previous = state.active, state.previous
    assert changed is not None
    rolled_back = previous if previous_intact else None
    state.active, state.previous = rolled_back, None
    note = f"active variant {changed.name} changed on disk"
    return note + (f"; rolled back to {rolled_back.name}" if rolled_back else "")
