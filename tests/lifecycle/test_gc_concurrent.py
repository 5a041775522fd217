"""``epfleet gc --delete`` while devices sync and a publisher supersedes a variant they use.

A store (local, and S3 on moto) holds two multi-file models (small real ONNX models with
external data and GenAI-like sidecars, each with a CPU variant stamped with the CPU EP's
own compatibility string: what tests/support/multifile_store.py publishes by hand), a
superseded build, a build a device report pins, and orphans aged past the grace period
(3,060 on the local store, 312 on S3: ``files/`` objects, variant main files, temp
files). Two device threads sync (real engine, real ORT, a fresh cache each time so every
sync downloads every file) over and over while ``collect(store, delete=True)`` removes
them; in the middle of the removals (right after the ``PUBLISH_AFTER``-th, by
construction, not by timing) a publisher uploads a new build of ``genai`` and publishes a
manifest naming it instead of the one the devices are downloading.

A safety property, so no assertion depends on how much overlaps: every sync serves each
model with the variant of the manifest it read, byte for byte; gc removes only objects
that were unreferenced, unpinned and past the grace period (never one of the manifest in
force or the one before it), all temp files, and all the rest when it finished before
seeing the new manifest; everything the new manifest references is present afterwards.
It runs gc on the real clock with its default recheck interval (``RECHECK_SECONDS``): the
interval's rule itself is tested on a fake clock in tests/lifecycle/test_gc.py.

The ``rollback`` case publishes the superseded build again instead (a deterministic
rebuild, or a rollback: its files are all in the store, so nothing is uploaded), right
when gc, having checked the manifest, is about to remove that build's weights file. The
publish touches the objects it reuses (``publishing.check_present``) and gc deletes only
what is still older than its cutoff (``Store.delete_if_older``), so the file stays and
is reported kept ("touched since planned"). (On S3 the age check and the removal are a
HEAD and a DELETE; a touch landing between those two is not exercised here.) Before
that fix gc removed the file and every device syncing the manifest in force failed
("... does not exist").

Overlap measured on the 2-core development box (busy with other agents); the test prints
an ``OVERLAP`` line (``pytest -s``). Local: gc ran 1.1 to 1.7 s; in one run it removed
2,468 of the 3,061 removable objects (it kept removing under its first plan for up to
``RECHECK_SECONDS`` after the publish, then re-planned and deferred the rest, temp files
apart), in another all 3,061 (it finished within ``RECHECK_SECONDS`` of the publish and
never saw the new manifest: safe here, as the new manifest names none of them); 5 to 6
syncs, 3 to 4 of them overlapping the collection, 3 to 4 on the new manifest. S3: gc ran
1.7 s, removed 87 of 313 before re-planning; 6 syncs, 4 overlapping, 2 on the new one.
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

from epfleet.fleet.publishing.publish import check_present
from epfleet.formats.device_report import DeviceReport, report_key
from epfleet.formats.keys import files_key, listing_key, variant_key
from epfleet.formats.manifest import Manifest, ModelEntry, VariantEntry, referenced_keys
from epfleet.hashing import sha256_bytes
from epfleet.lifecycle.gc import Collection, collect, kind_of, needed_keys
from epfleet.stores import MANIFEST_KEY, Store, open_store
from epfleet.stores.local import LocalStore
from tests.support.gc_fleet import Aged, device_report
from tests.support.multifile_store import (
    TARGET,
    assert_same_files,
    no_leftovers,
    one,
    publish,
    run_sync,
    variant_dir,
)

pytestmark = pytest.mark.slow

OLD = datetime.now(timezone.utc) - timedelta(days=3)
"""Past the grace period of a day."""
ORPHANS = {"local": (2400, 600, 60), "s3": (240, 60, 12)}
"""Orphan files/ objects, variant main files and temp files, per store: a removal on S3
(moto) is a DELETE of some 10 ms, 100 times a local one."""
PUBLISH_AFTER = {"local": 800, "s3": 80}
"""The publisher publishes right before gc's removal number ``PUBLISH_AFTER + 1``."""
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
    uri: str
    collected: Store
    """The store gc collects: on S3, one whose listing shows every object written as
    aged past the grace period (``tests.support.gc_fleet.Aged``: S3 sets LastModified itself)."""
    work: Path
    first: Manifest
    removable: set[str]
    pinned: set[str]
    superseded: ModelEntry
    """An older build of genai the manifest no longer names (its weights file is
    removable): what a rollback publishes again."""
    folders: dict[str, Path] = field(default_factory=dict)
    """Each published variant's name -> the folder it was built from."""


def make_fleet(tmp_path: Path, uri: str, kind: str) -> Fleet:
    work = tmp_path / "work"
    store = open_store(uri)
    models = {"genai": publish(store, work, "genai", seed=0), "tok": publish(store, work, "tok")}
    folders = {
        variant_name(models["genai"].variants[TARGET]): work / "genai-0-cpu",
        variant_name(models["tok"].variants[TARGET]): work / "tok-0-cpu",
    }
    for entry in models.values():
        write_listing(store, entry.variants[TARGET])
    superseded = publish(store, work, "genai", seed=7)
    write_listing(store, superseded.variants[TARGET])
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
    orphan_files, orphan_variants, orphan_temps = ORPHANS[kind]
    for i in range(orphan_files):
        store.write(files_key(sha256_bytes(f"orphan {i}".encode())), f"orphan {i}".encode())
    for i in range(orphan_variants):
        data = f"old build {i}".encode()
        store.write(variant_key("genai", TARGET, sha256_bytes(data)), data)
    for i in range(orphan_temps):
        folder = ("", "sources/", "files/", "variants/genai/x86-cpu/")[i % 4]
        store.write(f"{folder}.interrupted-{i}.onnx.abcd{i:04d}.tmp", b"half")
    first = write_manifest(store, models, generation=1, at=OLD)
    everything = keys(store)
    aged = {k for k in everything if not k.startswith("reports/") and k != MANIFEST_KEY}
    if isinstance(store, LocalStore):
        for key in aged:
            os.utime(store.root / key, (OLD.timestamp(), OLD.timestamp()))
        collected = store
    else:
        collected = Aged(store, dict.fromkeys(aged, OLD))  # type: ignore[assignment]
    referenced = needed_keys(first)
    pinned -= referenced
    removable = everything - referenced - pinned - {MANIFEST_KEY, report_key("dev-old")}
    assert all(kind_of(k) is not None for k in removable)
    assert len(removable) >= sum(ORPHANS[kind])
    folders[variant_name(superseded.variants[TARGET])] = work / "genai-7-cpu"
    return Fleet(store, uri, collected, work, first, removable, pinned, superseded, folders)


class PublishesMidway:
    """The collector's store: right before it removes a key of ``publish_before`` (when
    given, else after ``PUBLISH_AFTER`` removals) it lets the publisher go and waits until
    the new manifest is written; its first removal waits until every device has started a
    sync."""

    def __init__(
        self,
        store: Store,
        devices_started: list[threading.Event],
        publish_after: int,
        publish_before: set[str],
    ) -> None:
        self._store = store
        self._publish_after = publish_after
        self._devices_started = devices_started
        self._publish_before = publish_before
        self.deleted: list[str] = []
        self.publish_now = threading.Event()
        self.published = threading.Event()
        self.published_after: int | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def delete_if_older(self, key: str, cutoff: datetime) -> bool:
        self._before_removal(key)
        gone = self._store.delete_if_older(key, cutoff)
        if gone:
            self.deleted.append(key)
        return gone

    def delete(self, key: str) -> None:
        self._before_removal(key)
        self._store.delete(key)
        self.deleted.append(key)

    def _before_removal(self, key: str) -> None:
        if not self.deleted:
            for started in self._devices_started:
                assert started.wait(WAIT), "a device never started syncing"
        if self.published_after is None and (
            key in self._publish_before
            if self._publish_before
            else len(self.deleted) == self._publish_after
        ):
            self.publish_now.set()
            assert self.published.wait(WAIT), "the publisher never published"
            self.published_after = len(self.deleted)


@dataclass
class Sync:
    report: DeviceReport
    cache: Path
    started: float
    ended: float


@pytest.fixture(params=["local", "s3"])
def store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    return str(request.getfixturevalue("s3_store_uri"))


@pytest.mark.parametrize(
    "rollback",
    [
        pytest.param(False, id="new-build"),
        pytest.param(True, id="rollback"),
    ],
)
def test_devices_syncing_during_a_collection_never_miss_an_object(
    unsigned_allowed: None,  # gc races manifests published by hand, unsigned, as devices sync them
    tmp_path: Path,
    store_uri: str,
    rollback: bool,
) -> None:
    """With ``rollback``, the publisher puts back the superseded build (its weights file is
    one of gc's candidates), right when gc, having checked the manifest, removes it."""
    kind = "local" if "://" not in store_uri else "s3"
    fleet = make_fleet(tmp_path, store_uri, kind)
    store = fleet.store
    before = keys(store)
    started = [threading.Event() for _ in range(DEVICES)]
    again = needed_keys(Manifest(models={"genai": fleet.superseded})) & fleet.removable
    assert len(again) == 1  # the weights (the graph and sidecars are genai's current ones)
    collecting = PublishesMidway(
        fleet.collected, started, PUBLISH_AFTER[kind], again if rollback else set()
    )
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
                report = run_sync(fleet.uri, cache, recompile=False)
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
            if rollback:  # every file is in the store: nothing to upload
                newer = fleet.superseded
            else:
                newer = publish(store, fleet.work, "genai", seed=1)
                fleet.folders[variant_name(newer.variants[TARGET])] = fleet.work / "genai-1-cpu"
                write_listing(store, newer.variants[TARGET])
            models = {**fleet.first.models, "genai": newer}
            # what epfleet.fleet.publishing.publish.update_manifest checks before it writes the manifest
            added = referenced_keys(Manifest(models=models)) - referenced_keys(fleet.first)
            check_present(fleet.collected, added)  # (on S3, through the aged listing's clock)
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
    touched = {k.key for k in result.plan.kept if k.reason.startswith("touched since planned")}
    assert not touched & removed
    # the rollback's publish landed right before gc's removal of the file it reuses
    assert touched == (again if rollback else set())
    replanned = any("manifest changed" in w for w in result.warnings)
    if replanned:
        assert result.generation == 2 and "generation 2" in (result.plan.deferred or "")
        assert not [c for c in result.plan.candidates if c.kind != "temp" and c.key not in removed]
    else:
        assert removed == fleet.removable - touched
    assert {c.key for c in result.plan.candidates} == removed  # across re-plans too
    assert collecting.published_after is not None
    assert rollback or collecting.published_after == PUBLISH_AFTER[kind]
    # What the manifest in force references is all there, and a device syncs it.
    # (model signatures are needed where they were made; this test's publisher makes none)
    assert {k for k in needed_keys(newest) if not k.endswith(".sig")} <= after
    for device_syncs in syncs:
        assert device_syncs[-1].report.manifest.generation == 2

    overlapping = [s for d in syncs for s in d if s.started < gc_ended and s.ended > gc_began]
    print(
        f"OVERLAP ({kind}): gc {gc_ended - gc_began:.2f} s, removed {len(removed)} of "
        f"{len(fleet.removable)} (re-planned: {replanned}); {sum(map(len, syncs))} syncs, "
        f"{len(overlapping)} overlapping the collection, "
        f"{sum(1 for d in syncs for s in d if s.report.manifest.generation == 2)} on generation 2"
    )
