"""``epfleet gc --delete`` while devices sync and a publisher supersedes a variant they use.

A local store holds two multi-file models (small real ONNX models with external data and
GenAI-like sidecars, each with a CPU variant stamped with the CPU EP's own compatibility
string: what tests/test_device_multifile.py publishes by hand), a superseded build, a
build a device report pins, and a few thousand orphans aged past the grace period
(``files/`` objects, variant main files, temp files). Two device threads sync (real
engine, real ORT, a fresh cache each time so every sync downloads every file) over and
over while ``collect(store, delete=True)`` removes the orphans; in the middle of the
removals (after its ``PUBLISH_AFTER``-th one, by construction, not by timing) a publisher
uploads a new build of ``genai`` and publishes a manifest naming it instead of the one
the devices are downloading.

A safety property, so no assertion depends on how much overlaps: every sync serves each
model with the variant of the manifest it read, byte for byte; gc removes only objects
that were unreferenced, unpinned and past the grace period (never one of the manifest in
force or the one before it), all temp files, and all the rest when it finished before
seeing the new manifest; everything the new manifest references is present afterwards.

Overlap measured on the 2-core development box (busy with other agents), local store
(the test prints an ``OVERLAP:`` line, ``pytest -s``): gc ran 1.7 s and removed 2,468 of
the 3,061 removable objects (publish after removal 800; it kept removing under its first
plan for up to ``RECHECK_SECONDS`` before it saw the new manifest, then re-planned and
deferred the rest, temp files apart); 5 syncs, 3 of them overlapping the collection, 3 on
the new manifest.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from test_device_multifile import (
    TARGET,
    assert_same_files,
    no_leftovers,
    one,
    publish,
    run_sync,
    variant_dir,
)
from test_gc import device_report

from epfleet.device_report import DeviceReport, report_key
from epfleet.gc import Collection, collect, kind_of, needed_keys
from epfleet.hashing import sha256_bytes
from epfleet.manifest import Manifest, ModelEntry, VariantEntry, files_key
from epfleet.plan import listing_key, variant_key
from epfleet.stores import MANIFEST_KEY, Store, open_store

pytestmark = pytest.mark.slow

OLD = datetime.now(timezone.utc) - timedelta(days=3)
"""Past the grace period of a day."""
ORPHAN_FILES = 2400
ORPHAN_VARIANTS = 600
ORPHAN_TEMPS = 60
PUBLISH_AFTER = 800
"""The publisher publishes right after gc's removal number ``PUBLISH_AFTER``."""
DEVICES = 2
WAIT = 600.0
"""Seconds a thread waits for another's signal before the test fails (never reached
unless something hangs: no outcome depends on it)."""


def variant_name(variant: VariantEntry) -> str:
    assert variant.digest is not None
    return f"{TARGET}-{variant.digest[:12]}"


def write_manifest(
    store: Store, models: dict[str, ModelEntry], generation: int, at: datetime
) -> Manifest:
    manifest = Manifest(generation=generation, published_at=at, models=models)
    store.write(MANIFEST_KEY, manifest.to_json())
    return manifest


def write_listing(store: Store, variant: VariantEntry) -> set[str]:
    """The ``.files.json`` a build writes beside a multi-file variant's main file; the
    variant's keys (main file, listing, files)."""
    assert variant.artifact is not None
    listing = [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in variant.files]
    key = listing_key(variant.artifact.uri)
    store.write(key, json.dumps(listing).encode())
    return {variant.artifact.uri, key} | {f.uri for f in variant.files}


def keys(store: Store) -> set[str]:
    return {o.key for o in store.list_objects("", hidden=True)}


@dataclass
class Fleet:
    store: Store
    root: Path
    work: Path
    first: Manifest
    removable: set[str]
    pinned: set[str]
    folders: dict[str, Path] = field(default_factory=dict)
    """Each published variant's name -> the folder it was built from."""


def make_fleet(tmp_path: Path) -> Fleet:
    root, work = tmp_path / "store", tmp_path / "work"
    store = open_store(str(root))
    models = {"genai": publish(store, work, "genai", seed=0), "tok": publish(store, work, "tok")}
    folders = {
        variant_name(models["genai"].variants[TARGET]): work / "genai-0-cpu",
        variant_name(models["tok"].variants[TARGET]): work / "tok-0-cpu",
    }
    for entry in models.values():
        write_listing(store, entry.variants[TARGET])
    superseded = publish(store, work, "genai", seed=7).variants[TARGET]
    write_listing(store, superseded)
    pinned_variant = publish(store, work, "genai", seed=8).variants[TARGET]
    pinned = write_listing(store, pinned_variant)
    assert pinned_variant.artifact is not None
    report = device_report(
        "dev-old",
        "genai",
        TARGET,
        pinned_variant.artifact.sha256,
        datetime.now(timezone.utc),
        variant=pinned_variant,
    )
    store.write(report_key("dev-old"), report.model_dump_json().encode())
    for i in range(ORPHAN_FILES):
        store.write(files_key(sha256_bytes(f"orphan {i}".encode())), f"orphan {i}".encode())
    for i in range(ORPHAN_VARIANTS):
        data = f"old build {i}".encode()
        store.write(variant_key("genai", TARGET, sha256_bytes(data)), data)
    for i in range(ORPHAN_TEMPS):
        folder = ("", "sources/", "files/", "variants/genai/x86-cpu/")[i % 4]
        store.write(f"{folder}.interrupted-{i}.onnx.abcd{i:04d}.tmp", b"half")
    first = write_manifest(store, models, generation=1, at=OLD)
    everything = keys(store)
    for key in everything:
        if not key.startswith("reports/") and key != MANIFEST_KEY:
            os.utime(root / key, (OLD.timestamp(), OLD.timestamp()))
    referenced = needed_keys(first)
    pinned -= referenced
    removable = everything - referenced - pinned - {MANIFEST_KEY, report_key("dev-old")}
    assert all(kind_of(k) is not None for k in removable)
    assert len(removable) >= ORPHAN_FILES + ORPHAN_VARIANTS + ORPHAN_TEMPS
    return Fleet(store, root, work, first, removable, pinned, folders)


class PublishesMidway:
    """The collector's store: after its ``PUBLISH_AFTER``-th removal it lets the publisher
    go and waits until the new manifest is written; its first removal waits until every
    device has started a sync."""

    def __init__(self, store: Store, devices_started: list[threading.Event]) -> None:
        self._store = store
        self._devices_started = devices_started
        self.deleted: list[str] = []
        self.publish_now = threading.Event()
        self.published = threading.Event()
        self.published_after: int | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def delete(self, key: str) -> None:
        if not self.deleted:
            for started in self._devices_started:
                assert started.wait(WAIT), "a device never started syncing"
        self._store.delete(key)
        self.deleted.append(key)
        if len(self.deleted) == PUBLISH_AFTER:
            self.publish_now.set()
            assert self.published.wait(WAIT), "the publisher never published"
            self.published_after = len(self.deleted)


@dataclass
class Sync:
    report: DeviceReport
    cache: Path
    started: float
    ended: float


def test_devices_syncing_during_a_collection_never_miss_an_object(tmp_path: Path) -> None:
    fleet = make_fleet(tmp_path)
    store = fleet.store
    before = keys(store)
    started = [threading.Event() for _ in range(DEVICES)]
    collecting = PublishesMidway(store, started)
    done = threading.Event()
    syncs: list[list[Sync]] = [[] for _ in range(DEVICES)]
    errors: list[BaseException] = []
    second: list[Manifest] = []

    def device(n: int) -> None:
        try:
            count = 0
            while True:
                last = done.is_set()  # one more sync after the collection ends
                cache = tmp_path / f"device-{n}-{count}"
                started[n].set()
                began = time.monotonic()
                report = run_sync(str(fleet.root), cache, recompile=False)
                syncs[n].append(Sync(report, cache, began, time.monotonic()))
                count += 1
                if last:
                    return
        except BaseException as exc:
            errors.append(exc)
            started[n].set()

    def publisher() -> None:
        try:
            assert collecting.publish_now.wait(WAIT), "gc never reached the publish point"
            newer = publish(store, fleet.work, "genai", seed=1)
            fleet.folders[variant_name(newer.variants[TARGET])] = fleet.work / "genai-1-cpu"
            write_listing(store, newer.variants[TARGET])
            models = {**fleet.first.models, "genai": newer}
            second.append(write_manifest(store, models, 2, datetime.now(timezone.utc)))
        except BaseException as exc:
            errors.append(exc)
        finally:
            collecting.published.set()

    threads = [threading.Thread(target=device, args=(n,)) for n in range(DEVICES)]
    threads.append(threading.Thread(target=publisher))
    for thread in threads:
        thread.start()
    gc_began = time.monotonic()
    try:
        result: Collection = collect(collecting, delete=True, grace_hours=24)  # type: ignore[arg-type]
    finally:
        gc_ended = time.monotonic()
        done.set()
        collecting.publish_now.set()
        for thread in threads:
            thread.join(WAIT)
    assert not errors, errors
    assert second, "the publisher did not publish"
    newest = second[0]

    # Every sync served every model with the variant of the manifest it read, intact.
    by_generation = {1: fleet.first, 2: newest}
    for sync_ in (s for device_syncs in syncs for s in device_syncs):
        report = sync_.report
        assert report.manifest.generation in by_generation, report.manifest
        manifest = by_generation[report.manifest.generation]
        assert {m.model for m in report.models} == set(manifest.models)
        for model, entry in manifest.models.items():
            result_ = one(report, model)
            name = variant_name(entry.variants[TARGET])
            assert (result_.action, result_.variant) == ("downloaded", name), result_.reason
            assert_same_files(fleet.folders[name], variant_dir(sync_.cache, model, name))
        no_leftovers(sync_.cache)

    # gc removed only what was unreferenced, unpinned and past grace, every temp file, and
    # all of it if it finished before it saw the new manifest.
    after = keys(store)
    removed = set(result.removed)
    assert result.errors == []
    assert before - after == removed
    assert removed <= fleet.removable
    assert not removed & (needed_keys(fleet.first) | needed_keys(newest) | fleet.pinned)
    temps = {k for k in fleet.removable if kind_of(k) == "temp"}
    assert temps <= removed
    replanned = any("manifest changed" in w for w in result.warnings)
    if replanned:
        assert result.generation == 2 and "generation 2" in (result.plan.deferred or "")
        assert not [c for c in result.plan.candidates if c.kind != "temp" and c.key not in removed]
    else:
        assert removed == fleet.removable
    # (after a re-plan, result.plan is the last plan's: what it removed under the first
    # plan is in result.removed only)
    assert {c.key for c in result.plan.candidates} <= removed
    assert collecting.published_after == PUBLISH_AFTER
    # What the manifest in force references is all there, and a device syncs it.
    assert needed_keys(newest) <= after
    for device_syncs in syncs:
        assert device_syncs[-1].report.manifest.generation == 2

    overlapping = [s for d in syncs for s in d if s.started < gc_ended and s.ended > gc_began]
    print(
        f"OVERLAP: gc {gc_ended - gc_began:.2f} s, removed {len(removed)} of "
        f"{len(fleet.removable)} (re-planned: {replanned}); {sum(map(len, syncs))} syncs, "
        f"{len(overlapping)} overlapping the collection, "
        f"{sum(1 for d in syncs for s in d if s.report.manifest.generation == 2)} on generation 2"
    )
