"""Rebuilding the device cache's state from what the cache holds, when ``state.json`` is
missing, damaged, of another schema or not a regular file.

Every file in a variant directory ``models/<model>/<prefix>-<digest12>/`` (real
directories and regular files, never through a link) is hashed; the main file is the
one the package's entry names (``executor_info.ort.model_file``), else the fleet
manifest's, else ``model.onnx``; a directory whose file set's digest does not start
with its name's is not kept. What it is, is then read from:

- the cached fleet manifest: a published variant whose sha256 is the manifest's for
  that target is verified, and taken with the manifest's fields;
- the model file's own metadata (``ep_compatibility_info.<EP>``,
  ``epfleet.source_sha256``, written by every epfleet compile) and the package's
  ``manifest.json`` entry for it (its EP and device type): a local build, or a
  published variant the fleet manifest no longer lists, is kept only if the package
  lists it;
- ``fallback-…`` is the source model itself (its sha256 is its source's).

Each model's active variant is the first one the package's manifest lists (the one an
application's ORT selects there: ``write_package`` makes sure of that) and the
previous one the second, so that what the application runs is still listed, and
kept, after the repair; a model the package lists nothing usable for takes its newest
variant. The manifest's ETag, the failed local builds and the rest start afresh: the
next manifest fetch is a whole one.
"""

from __future__ import annotations

import json
import os
import re
import stat
from datetime import datetime, timezone
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from pydantic import ValidationError

from epfleet.device.cache.layout import MODEL_FILE, VARIANT_DIR, local_target_name
from epfleet.device.cache.state import (
    CacheState,
    Installed,
    InstalledFile,
    ModelState,
    set_digest,
)
from epfleet.formats.manifest import FILE_PATH_PATTERN, NAME_PATTERN, ModelEntry, VariantEntry
from epfleet.formats.schema_version import validate_python
from epfleet.fsutil import open_nofollow, sha256_nofollow

if TYPE_CHECKING:  # the cache calls this module to rebuild its state: no import back
    from epfleet.device.cache.device_cache import DeviceCache

COMPATIBILITY_KEY = "ep_compatibility_info."
METADATA_FIELD = 14  # ModelProto.metadata_props
DEVICE_TYPES = ("cpu", "gpu", "npu")


def rebuild_state(cache: DeviceCache) -> tuple[CacheState, list[str]]:
    """A state made from the cache's variant directories, and ``model: variant`` for
    each model's active variant in it."""
    listed = package_listing(cache.package_manifest())
    fleet = fleet_entries(cache.cached_manifest())
    state = CacheState()
    kept = []
    for model in _real_dirs(cache, ("models",)):
        if not _is_name(model):
            continue
        found: dict[str, Installed] = {}
        for name in _real_dirs(cache, ("models", model)):
            if VARIANT_DIR.fullmatch(name):
                entry = listed.get(model, {}).get(name)
                installed = adopt(cache, model, name, entry, fleet.get(model))
                if installed is not None:
                    found[name] = installed
        in_package = [name for name in listed.get(model, {}) if name in found]
        newest = sorted(found, key=lambda name: found[name].mtime_ns, reverse=True)
        order = in_package + [name for name in newest if name not in in_package]
        if order:
            previous = found[order[1]] if len(order) > 1 else None
            state.models[model] = ModelState(active=found[order[0]], previous=previous)
            kept.append(f"{model}: {order[0]}")
    return state, kept


def adopt(
    cache: DeviceCache,
    model: str,
    name: str,
    listed: dict[str, Any] | None,
    fleet: ModelEntry | None,
) -> Installed | None:
    """The variant in ``models/<model>/<name>`` as the state records it, or None if it
    cannot be kept (see the module's docstring)."""
    entry = listed or {}
    prefix, short = name[:-13], name[-12:]
    published = fleet.variants.get(prefix) if fleet is not None else None
    model_file = _main_file(entry, published, fleet, prefix)
    found = _hashed_files(cache, ("models", model, name))
    if model_file not in found:
        return None
    sha256, size, mtime_ns = found.pop(model_file)
    files = [InstalledFile(path=p, sha256=h, size=n, mtime_ns=t) for p, (h, n, t) in found.items()]
    path = cache.path(("models", model, name, *model_file.split("/")))
    common: dict[str, Any] = {
        "name": name,
        "sha256": sha256,
        "size": size,
        "activated_at": datetime.fromtimestamp(mtime_ns / 1e9, timezone.utc),
        "mtime_ns": mtime_ns,
        "model_file": model_file,
        "files": files,
    }
    digest = set_digest(sha256, size, model_file, files)
    if not digest.startswith(short):
        return None  # changed since it was installed
    if prefix == "fallback":
        return Installed(
            origin="fallback",
            target=None,
            ep="CPUExecutionProvider",
            device="cpu",
            compatibility_string=None,
            provider_options={},
            source_sha256=digest,
            precision="fp32",
            **common,
        )
    if published is not None and published.digest == digest:
        return Installed(
            origin="published",
            target=prefix,
            ep=published.ep,
            device=published.device,
            compatibility_string=published.compatibility_string,
            provider_options=published.provider_options,
            source_sha256=published.source_sha256,
            precision=published.precision,
            **common,
        )
    metadata = model_metadata(path)
    strings = {
        key.removeprefix(COMPATIBILITY_KEY): value
        for key, value in metadata.items()
        if key.startswith(COMPATIBILITY_KEY)
    }
    ep, device = entry.get("ep"), entry.get("device")
    if not isinstance(ep, str) or ep not in strings or device not in DEVICE_TYPES:
        return None  # not in the package, or not what the package says it is
    string = strings[ep]
    local = prefix == local_target_name(ep)
    return Installed(
        origin="local" if local else "published",
        target=None if local else prefix,
        ep=ep,
        device=device,
        compatibility_string=string,
        provider_options={},
        source_sha256=metadata.get("epfleet.source_sha256", ""),
        **common,
    )


def _main_file(
    listed: dict[str, Any], published: VariantEntry | None, fleet: ModelEntry | None, prefix: str
) -> str:
    """The variant's main file: as the package lists it, else as the fleet manifest
    gives it (the variant's, or the source's for a fallback), else ``model.onnx``."""
    executor = listed.get("executor_info")
    named = executor.get("ort", {}).get("model_file") if isinstance(executor, dict) else None
    if isinstance(named, str) and re.fullmatch(FILE_PATH_PATTERN, named):
        return named
    if published is not None:
        return published.model_file
    if prefix == "fallback" and fleet is not None:
        return fleet.source.model_file
    return MODEL_FILE


def _hashed_files(cache: DeviceCache, parts: tuple[str, ...]) -> dict[str, tuple[str, int, int]]:
    """Every regular file under ``DIR/<parts>`` (links and what they point to left out):
    its relative path -> (sha256, size, mtime_ns)."""
    try:
        fd = cache.open_dir(parts, create=False)
    except OSError:
        return {}
    found: dict[str, tuple[str, int, int]] = {}
    try:
        for top, _, names, dir_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
            for name in names:
                info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if not stat.S_ISREG(info.st_mode):
                    continue
                relative = os.path.normpath(os.path.join(top, name))
                try:
                    sha256, size = sha256_nofollow(cache.path((*parts, *relative.split("/"))))
                except OSError:
                    continue
                found[relative] = (sha256, size, info.st_mtime_ns)
    finally:
        os.close(fd)
    return found


def package_listing(data: bytes | None) -> dict[str, dict[str, dict[str, Any]]]:
    """model -> {variant name: its package entry}, in the package's order (the active
    variant first), from the package's manifest.json; {} if it does not parse."""
    try:
        components = json.loads(data or b"")["components"]
        return {
            model: {
                name: entry
                for name, entry in component["variants"].items()
                if isinstance(entry, dict)
            }
            for model, component in components.items()
            if isinstance(component, dict) and isinstance(component.get("variants"), dict)
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}


def fleet_entries(data: bytes | None) -> dict[str, ModelEntry]:
    """The cached fleet manifest's model entries that validate."""
    try:
        document = json.loads(data or b"")
        version, items = document.get("schema_version") or "1.0", list(document["models"].items())
    except (ValueError, KeyError, TypeError, AttributeError):
        return {}
    entries = {}
    for model, entry in items:
        try:
            entries[model] = validate_python(ModelEntry, entry, "ignore", version)
        except ValidationError:
            continue
    return entries


def model_metadata(path: Path) -> dict[str, str]:
    """An ONNX model's ``metadata_props``, read without parsing its graph (the other
    top-level fields of the ModelProto are skipped); {} for a file that is not one."""
    props: dict[str, str] = {}
    try:
        with open_nofollow(path) as f:
            while (tag := _varint(f)) is not None:
                field, wire = tag >> 3, tag & 7
                if wire == 0:
                    _varint(f)
                elif wire in (1, 5):
                    f.seek(8 if wire == 1 else 4, 1)
                elif wire == 2:
                    length = _varint(f)
                    if length is None:
                        break
                    if field == METADATA_FIELD and length <= 1 << 20:
                        key, value = _entry(f.read(length))
                        props[key] = value
                    else:
                        f.seek(length, 1)
                else:
                    return {}
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return props


def _entry(data: bytes) -> tuple[str, str]:
    """A StringStringEntryProto: (key, value)."""
    fields = {1: b"", 2: b""}
    stream = BytesIO(data)
    while (tag := _varint(stream)) is not None:
        if tag & 7 != 2:
            raise ValueError("not a string entry")
        length = _varint(stream)
        if length is None:
            raise ValueError("truncated")
        fields[tag >> 3] = stream.read(length)
    return fields[1].decode(), fields[2].decode()


def _varint(f: BinaryIO) -> int | None:
    """A protobuf varint, or None at the end of the stream."""
    value = shift = 0
    while True:
        byte = f.read(1)
        if not byte:
            if shift:
                raise ValueError("truncated varint")
            return None
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _real_dirs(cache: DeviceCache, parts: tuple[str, ...]) -> list[str]:
    """Names of the real directories (not links) in ``DIR/<parts>``, itself reached
    without a link; [] if it is not there."""
    try:
        fd = cache.open_dir(parts, create=False)
    except OSError:
        return []
    try:
        with os.scandir(fd) as entries:
            return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))
    finally:
        os.close(fd)


def _is_name(name: str) -> bool:
    return re.fullmatch(NAME_PATTERN, name) is not None
