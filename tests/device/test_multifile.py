"""Multi-file variants and sources on the device, and dropping models the
manifest no longer lists.

A small model with external data (``model.onnx`` + ``model.onnx.data``) in a GenAI-like
folder (``genai_config.json``, ``tokenizer.json``, ``tokenizer/vocab.txt``) is published
by hand through the store API under the contract's keys (main files under
``sources/``/``variants/``, every other file under ``files/<sha256>``), with a CPU
variant stamped with the CPU EP's own compatibility string; then a real device sync
(moto S3 or a local store, real ORT) downloads, verifies, assembles and activates it.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import onnxruntime as ort
import pytest

from epfleet.device.cache import DISK_MARGIN, DeviceCache, Installed
from epfleet.formats.keys import files_key
from epfleet.formats.manifest import (
    ArtifactRef,
    PackageFile,
    VariantEntry,
)
from epfleet.hashing import sha256_file
from epfleet.stores import open_store
from epfleet.text import MB
from tests.support.disks import fill
from tests.support.multifile_store import (
    CPU,
    SIDECARS,
    TARGET,
    assert_runs,
    assert_same_files,
    no_leftovers,
    one,
    publish,
    put_manifest,
    run_sync,
    variant_dir,
    weights,
)

pytestmark = pytest.mark.slow


# --- a multi-file variant over S3 ----------------------------------------------------------


def test_a_multi_file_variant_arrives_byte_for_byte_and_runs(
    s3_store_uri: str, tmp_path: Path
) -> None:
    store = open_store(s3_store_uri)
    entry = publish(store, tmp_path / "work", "genai")
    put_manifest(store, {"genai": entry}, 1)
    cache = tmp_path / "device"
    variant = entry.variants[TARGET]
    name = f"{TARGET}-{variant.digest[:12]}"  # type: ignore[index]
    assert variant.digest != variant.artifact.sha256  # type: ignore[union-attr]

    report = run_sync(s3_store_uri, cache)

    result = one(report, "genai")
    assert (result.action, result.variant) == ("downloaded", name), result.reason
    assert result.bytes_downloaded == variant.total_size
    assert variant.artifact is not None and result.artifact_sha256 == variant.artifact.sha256
    assert_same_files(tmp_path / "work" / "genai-0-cpu", variant_dir(cache, "genai", name))
    assert_runs(cache, "genai", name, weights(0))
    package = json.loads((cache / "manifest.json").read_bytes())
    listed = package["components"]["genai"]["variants"][name]
    assert listed["executor_info"]["ort"]["model_file"] == "model.onnx"
    no_leftovers(cache)

    again = run_sync(s3_store_uri, cache, verify=True)  # every file re-hashed: intact
    assert (one(again, "genai").action, one(again, "genai").bytes_downloaded) == ("kept", 0)

    # A sidecar changed in place (same size): the cheap check sees its mtime, --verify its
    # bytes; the variant is fetched again whole.
    vocab = variant_dir(cache, "genai", name) / "tokenizer" / "vocab.txt"
    vocab.write_bytes(b"HELLO\nWORLD\n")
    mended = run_sync(s3_store_uri, cache)
    assert one(mended, "genai").action == "downloaded"
    assert "changed on disk" in one(mended, "genai").reason
    assert vocab.read_bytes() == SIDECARS["tokenizer/vocab.txt"]
    assert_runs(cache, "genai", name, weights(0))


def test_a_main_file_in_a_subdirectory_is_what_the_package_names(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    entry = publish(store, tmp_path / "work", "nested", model_file="onnx/decoder.onnx")
    put_manifest(store, {"nested": entry}, 1)
    cache = tmp_path / "device"

    result = one(run_sync(str(store_dir), cache, recompile=False), "nested")

    assert result.action == "downloaded" and result.variant is not None, result.reason
    installed = variant_dir(cache, "nested", result.variant)
    assert_same_files(tmp_path / "work" / "nested-0-cpu", installed)
    assert (installed / "onnx" / "decoder.onnx.data").is_file()
    package = json.loads((cache / "manifest.json").read_bytes())
    listed = package["components"]["nested"]["variants"][result.variant]
    assert listed["executor_info"]["ort"]["model_file"] == "onnx/decoder.onnx"
    assert_runs(cache, "nested", result.variant, weights(0))


def test_a_tampered_file_is_refused_and_the_previous_variant_kept(
    s3_store_uri: str, tmp_path: Path
) -> None:
    store = open_store(s3_store_uri)
    first = publish(store, tmp_path / "work", "genai", seed=0)
    put_manifest(store, {"genai": first}, 1)
    cache = tmp_path / "device"
    before = one(run_sync(s3_store_uri, cache), "genai").variant
    assert before is not None

    second = publish(store, tmp_path / "work", "genai", seed=1)
    data = next(f for f in second.variants[TARGET].files if f.path == "model.onnx.data")
    tampered = tmp_path / "tampered"
    tampered.write_bytes(b"\x01" * data.size)  # same size, other bytes, under its key
    store.upload(data.uri, tampered, sha256_file(tampered)[0])
    put_manifest(store, {"genai": second}, 2)

    report = run_sync(s3_store_uri, cache, recompile=False)

    result = one(report, "genai")
    assert result.action == "failed" and result.variant == before, result.reason
    assert "sha256" in result.reason, result.reason
    assert sorted(p.name for p in (cache / "models" / "genai").iterdir()) == [before]
    assert_runs(cache, "genai", before, weights(0))
    no_leftovers(cache)


def test_a_set_too_large_for_the_disk_is_refused_before_any_download(
    tmp_path: Path,
    small_disk: Path,
) -> None:
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    big = {"weights.bin": os.urandom(3 * MB), "more.bin": os.urandom(3 * MB)}
    entry = publish(store, tmp_path / "work", "big", extra=big)
    put_manifest(store, {"big": entry}, 1)
    cache = small_disk / "device"
    cache.mkdir()
    fill(small_disk, DISK_MARGIN + 5 * MB)  # room for each file, not for the set

    report = run_sync(str(store_dir), cache, recompile=False)

    result = one(report, "big")
    assert result.action == "failed", result.reason
    assert "not enough disk space" in result.reason and "files" in result.reason, result.reason
    assert result.bytes_downloaded == 0
    assert not (cache / "models" / "big").exists() or not any((cache / "models" / "big").iterdir())
    no_leftovers(cache)

    (small_disk / "filler").unlink()
    again = run_sync(str(store_dir), cache, recompile=False)
    assert one(again, "big").action == "downloaded"


# --- multi-file sources: fallback and a local build ------------------------------------------


def test_the_fallback_of_a_multi_file_source_is_its_folder(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    entry = publish(store, tmp_path / "work", "src", variant=False)
    put_manifest(store, {"src": entry}, 1)
    cache = tmp_path / "device"

    report = run_sync(str(store_dir), cache, recompile=False)

    result = one(report, "src")
    name = f"fallback-{entry.source.digest[:12]}"
    assert (result.action, result.variant) == ("fallback", name), result.reason
    assert result.artifact_sha256 is None  # nothing of the fleet's for gc to keep
    assert_same_files(tmp_path / "work" / "src-0-src", variant_dir(cache, "src", name))
    assert_runs(cache, "src", name, weights(0))
    again = run_sync(str(store_dir), cache, recompile=False)
    assert (one(again, "src").action, one(again, "src").bytes_downloaded) == ("fallback", 0)


def test_a_multi_file_source_is_built_here_with_its_sidecars(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    entry = publish(store, tmp_path / "work", "local", variant=False)
    put_manifest(store, {"local": entry}, 1)
    cache = tmp_path / "device"

    report = run_sync(str(store_dir), cache)

    result = one(report, "local")
    assert result.action == "recompiled", result.reason
    assert result.artifact_sha256 is None
    assert result.variant is not None
    installed = variant_dir(cache, "local", result.variant)
    for path, data in SIDECARS.items():
        assert (installed / path).read_bytes() == data
    assert_runs(cache, "local", result.variant, weights(0))
    state = DeviceCache(cache).load_state()
    active = state.models["local"].active
    assert active is not None and active.source_sha256 == entry.source.digest
    assert {f.path for f in active.files} >= set(SIDECARS)
    no_leftovers(cache)


# --- state repair ----------------------------------------------------------------------------


def test_a_lost_state_is_rebuilt_from_a_multi_file_directory(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    entry = publish(store, tmp_path / "work", "genai")
    put_manifest(store, {"genai": entry}, 1)
    cache = tmp_path / "device"
    name = one(run_sync(str(store_dir), cache, recompile=False), "genai").variant
    saved = DeviceCache(cache).load_state().models["genai"].active
    assert saved is not None and len(saved.files) == 1 + len(SIDECARS)

    (cache / ".epfleet" / "state.json").unlink()
    device = DeviceCache(cache)
    with device.locked():
        rebuilt = device.load_state().models["genai"].active

    assert rebuilt is not None and rebuilt.name == name
    assert (rebuilt.origin, rebuilt.target, rebuilt.digest) == ("published", TARGET, saved.digest)
    assert sorted(f.path for f in rebuilt.files) == sorted(f.path for f in saved.files)
    assert any("rebuilt from the variant directories" in note for note in device.repairs)
    again = run_sync(str(store_dir), cache, recompile=False)
    assert (one(again, "genai").action, one(again, "genai").bytes_downloaded) == ("kept", 0)


def test_the_installed_digest_is_the_manifests() -> None:
    entry = VariantEntry(
        ep=CPU,
        device="cpu",
        compatibility_string="x",
        artifact=ArtifactRef(uri="variants/m/t/a.onnx", sha256="a" * 64, size=3),
        model_file="decoder/model.onnx",
        files=[
            PackageFile(path="z.bin", uri=files_key("b" * 64), sha256="b" * 64, size=5),
            PackageFile(
                path="decoder/model.onnx.data", uri=files_key("c" * 64), sha256="c" * 64, size=7
            ),
        ],
        ort_version="1",
        compiled_at=datetime.now(timezone.utc),
        status="ok",
        source_sha256="d" * 64,
        fingerprint="f",
    )
    from epfleet.device.activation import published_variant

    installed = published_variant(TARGET, entry, datetime.now(timezone.utc))
    assert installed.digest == entry.digest
    assert installed.name == f"{TARGET}-{entry.digest[:12]}"  # type: ignore[index]
    assert installed.total_size == entry.total_size
    old = Installed.model_validate(
        {k: v for k, v in installed.model_dump().items() if k not in ("model_file", "files")}
    )  # a state.json written before multi-file variants
    assert (old.model_file, old.files, old.digest) == ("model.onnx", [], "a" * 64)


# --- dropping models the manifest no longer lists --------------------------------------------


def test_unlisted_models_are_dropped_only_when_asked_and_the_manifest_is_valid(
    tmp_path: Path,
) -> None:
    store_dir = tmp_path / "store"
    store = open_store(str(store_dir))
    keep = publish(store, tmp_path / "work", "keep", seed=0)
    gone = publish(store, tmp_path / "work", "gone", seed=1)
    put_manifest(store, {"keep": keep, "gone": gone}, 1)
    cache = tmp_path / "device"
    first = run_sync(str(store_dir), cache, recompile=False)
    gone_variant = one(first, "gone").variant
    assert gone_variant is not None

    put_manifest(store, {"keep": keep}, 2)  # "gone" retired from the manifest
    default = run_sync(str(store_dir), cache, recompile=False)
    assert [m.model for m in default.models] == ["keep"]
    assert (cache / "models" / "gone" / gone_variant).is_dir()
    assert_runs(cache, "gone", gone_variant, weights(1))  # off by default: still served

    timestamp = store_dir / "trust" / "metadata" / "timestamp.json"
    signed = timestamp.read_bytes()
    timestamp.write_bytes(b'{"signed": 7}')  # metadata that does not verify
    rejected = run_sync(str(store_dir), cache, recompile=False, drop_unlisted=True)
    assert rejected.manifest.status == "rejected"
    assert (cache / "models" / "gone" / gone_variant).is_dir()  # never on a stale list
    assert not any("dropped model" in w for w in rejected.warnings)
    timestamp.write_bytes(signed)

    put_manifest(store, {"keep": keep}, 3)
    subset = run_sync(str(store_dir), cache, recompile=False, drop_unlisted=True, models=["keep"])
    assert subset.manifest.status == "fetched"
    assert (cache / "models" / "gone" / gone_variant).is_dir()  # --model: not its to judge
    assert not any("dropped model" in w for w in subset.warnings)

    dropped = run_sync(str(store_dir), cache, recompile=False, drop_unlisted=True)
    assert dropped.manifest.generation == 3 and dropped.manifest.status != "rejected"
    assert [w for w in dropped.warnings if "dropped model gone" in w], dropped.warnings
    assert not (cache / "models" / "gone").exists()
    assert "gone" not in DeviceCache(cache).load_state().models
    context = ort.ModelPackageContext(str(cache))
    assert sorted(context.get_component_names()) == ["keep"]
    assert_runs(cache, "keep", one(dropped, "keep").variant or "", weights(0))
