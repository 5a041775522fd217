"""The ORT model package manifest of the device cache, rendered from its state.

An application with no epfleet code runs a model with
``onnxruntime.ModelPackageContext(DIR).select_component(model, options).create_session()``.
Each component lists the active variant first and the previous one (kept for
rollback) after it; ORT's selection prefers the first when the scores tie, and
``write_package`` checks with ORT that it selects the active one.
"""

from __future__ import annotations

import json
from pathlib import Path

from epfleet import ort_version
from epfleet.device.cache.layout import PACKAGE_MANIFEST, PACKAGE_NAME
from epfleet.device.cache.space import CacheSpace
from epfleet.device.cache.state import CacheState, Installed
from epfleet.device.local_eps import ep_versions


def package_json(cache: CacheSpace, state: CacheState) -> bytes:
    """The package manifest listing each model's active and previous variant whose
    directory holds its main file (``executor_info.ort.model_file``)."""
    components = {}
    for model, entry in sorted(state.models.items()):
        listed = [entry.active, entry.previous]
        variants = {
            v.name: _package_variant(model, v)
            for v in listed
            if v is not None
            and cache.regular_file(("models", model, v.name, *v.model_file.split("/"))) is not None
        }  # a missing directory would make ORT refuse the whole package
        if variants:
            components[model] = {"variants": variants}
    document = {
        "schema_version": "1.0",
        "package_name": PACKAGE_NAME,
        "components": components,
    }
    return (json.dumps(document, indent=2) + "\n").encode()


def write_package(cache: CacheSpace, state: CacheState) -> list[str]:
    """Render the package manifest from ``state`` (only if it changed), then check with
    ORT that every component selects its active variant. Where ORT would pick the
    rollback variant instead, the package lists the active one alone. Returns the
    models whose rollback entry had to be left out."""
    data = package_json(cache, state)
    runtime = json.dumps([ort_version(), ep_versions()], sort_keys=True)
    if cache.read((PACKAGE_MANIFEST,)) == data and state.package_checked_with == runtime:
        return []  # checked with this ORT and these EPs when it was written
    state.package_checked_with = runtime
    cache.write((PACKAGE_MANIFEST,), data)
    outvoted = [
        model
        for model, entry in state.models.items()
        if entry.active is not None
        and entry.previous is not None
        and selected(cache.root, model) not in (None, entry.active.name)
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
        cache.write((PACKAGE_MANIFEST,), package_json(cache, alone))
    return outvoted


def selected(root: Path, model: str) -> str | None:
    """The variant ORT's model package selection picks for ``model`` in the package at
    ``root``."""
    import onnxruntime as ort

    try:
        context = ort.ModelPackageContext(str(root))
        chosen = context.select_component(model, ort.ModelPackageOptions(ort.SessionOptions()))
    except RuntimeError:
        return None
    return str(chosen.get_selected_variant_name())


def _package_variant(model: str, variant: Installed) -> dict[str, object]:
    entry: dict[str, object] = {"ep": variant.ep, "device": variant.device}
    if variant.compatibility_string:
        entry["compatibility_string"] = variant.compatibility_string
    entry["variant_directory"] = f"models/{model}/{variant.name}"
    entry["executor_info"] = {"ort": {"model_file": variant.model_file}}
    return entry
