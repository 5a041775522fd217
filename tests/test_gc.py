"""epfleet gc on a local store and on S3 (moto over HTTP): a store with a retired model,
superseded builds, orphan temp files, an incomplete multipart upload and device reports
pinning an old build. It removes exactly the unreferenced, unpinned objects past the
grace period; a dry run removes nothing; a publish racing it is safe."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from epfleet.device_report import DeviceReport, ManifestStatus, ModelReport, report_key
from epfleet.gc import collect, kind_of, plan_collection, render
from epfleet.hashing import sha256_bytes
from epfleet.manifest import (
    ArtifactRef,
    Manifest,
    ModelEntry,
    SamplesRef,
    SourceEntry,
    VariantEntry,
)
from epfleet.plan import samples_key, source_key, variant_key
from epfleet.stores import MANIFEST_KEY, Store, open_store
from epfleet.stores.base import StoredObject
from epfleet.stores.local import LocalStore
from epfleet.stores.s3 import S3Store

pytestmark = pytest.mark.fast

NOW = datetime.now(timezone.utc).replace(microsecond=0)
OLD = NOW - timedelta(days=3)
"""Before the grace period (a day by default)."""


def put(store: Store, key_for: object, data: bytes) -> ArtifactRef:
    sha256 = sha256_bytes(data)
    key = key_for(sha256)  # type: ignore[operator]
    store.write(key, data)
    return ArtifactRef(uri=key, sha256=sha256, size=len(data))


def ok_variant(artifact: ArtifactRef, source_sha256: str) -> VariantEntry:
    return VariantEntry(
        ep="CPUExecutionProvider",
        device="cpu",
        compatibility_string="cpu:1",
        artifact=artifact,
        ort_version="1.23.0",
        compiled_at=OLD,
        status="ok",
        source_sha256=source_sha256,
        fingerprint=artifact.sha256,
    )


def model_entry(
    store: Store, name: str, targets: dict[str, bytes], samples: bool = True
) -> ModelEntry:
    source = put(store, source_key, f"source of {name}".encode() * 10)
    golden = put(store, samples_key, f"samples of {name}".encode()) if samples else None
    entry = ModelEntry(
        source=SourceEntry(**source.model_dump()),
        samples=None if golden is None else SamplesRef(**golden.model_dump(), count=1, basis="b"),
    )
    for target, data in targets.items():
        ref = put(store, lambda sha, t=target: variant_key(name, t, sha), data)
        entry.variants[target] = ok_variant(ref, source.sha256)
    return entry


def write_manifest(
    store: Store, models: dict[str, ModelEntry], generation: int, at: datetime
) -> Manifest:
    manifest = Manifest(generation=generation, published_at=at, models=models)
    store.write(MANIFEST_KEY, manifest.to_json())
    return manifest


def device_report(device: str, model: str, target: str, sha256: str, at: datetime) -> DeviceReport:
    return DeviceReport(
        device_id=device,
        generated_at=at.isoformat(),
        ort_version="1.23.0",
        ep_packages={},
        devices=[],
        store="s",
        cache="c",
        manifest=ManifestStatus(status="fetched", generation=1, body_bytes=1),
        models=[
            ModelReport(
                model=model,
                action="kept",
                variant=f"{target}-{sha256[:12]}",
                target=target,
                ep="CPUExecutionProvider",
                verdict=None,
                bytes_downloaded=0,
                reason="up to date",
                considered=[],
                seconds=0.1,
            )
        ],
        seconds=0.1,
    )


@dataclass
class Fleet:
    """The store the tests collect, and what it should keep and remove."""

    manifest: Manifest
    retired: ModelEntry
    removable: set[str] = field(default_factory=set)
    pinned: set[str] = field(default_factory=set)
    young: set[str] = field(default_factory=set)
    untouchable: set[str] = field(default_factory=set)


class Aged:
    """A store whose listing reports chosen keys as written at chosen times (and every
    incomplete upload as started at ``OLD``): S3 sets LastModified itself, so this stands
    in for time passing."""

    def __init__(self, store: Store, ages: dict[str, datetime]) -> None:
        self._store, self._ages = store, ages

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def list_objects(self, prefix: str, *, hidden: bool = False) -> list[StoredObject]:
        listed = self._store.list_objects(prefix, hidden=hidden)
        return [replace(o, modified=self._ages.get(o.key, o.modified)) for o in listed]

    def incomplete_uploads(self) -> list[StoredObject]:
        return [replace(o, modified=OLD) for o in self._store.incomplete_uploads()]


def make_fleet(store: Store) -> tuple[Store, Fleet]:
    current = model_entry(store, "cls", {"x86-cpu": b"cls build 2" * 50, "htp": b"cls htp" * 20})
    superseded = put(store, lambda sha: variant_key("cls", "x86-cpu", sha), b"cls build 1" * 40)
    pinned = put(store, lambda sha: variant_key("cls", "x86-cpu", sha), b"cls build 0" * 30)
    # no samples: the first removal (in key order) is then a temp file, not the retired
    # model's, so that the racing publish lands before their turn
    retired = model_entry(store, "old-det", {"x86-cpu": b"det build" * 60}, samples=False)
    manifest = write_manifest(store, {"cls": current}, generation=3, at=OLD)
    store.write(
        report_key("dev-1"),
        device_report("dev-1", "cls", "x86-cpu", pinned.sha256, NOW - timedelta(days=2))
        .model_dump_json()
        .encode(),
    )
    # a report past the retention window pins nothing
    store.write(
        report_key("dev-2"),
        device_report("dev-2", "cls", "x86-cpu", superseded.sha256, NOW - timedelta(days=60))
        .model_dump_json()
        .encode(),
    )
    temp = f"sources/.{'e' * 64}.onnx.abcd1234.tmp"
    store.write(temp, b"half a source")
    untouchable = {
        MANIFEST_KEY,
        report_key("dev-1"),
        report_key("dev-2"),
        "trust/metadata/1.root.json",
        f"trust/targets/{'a' * 64}.manifest.json",
        "runs/0b7e5c5e-5b0f-4a8e-9d6e-3f1f0e0e0e0e-1-1700000000/pool.json",
        "notes/what-is-this.txt",
        "sources/not-a-digest.onnx",
    }
    for key in untouchable - {MANIFEST_KEY, report_key("dev-1"), report_key("dev-2")}:
        store.write(key, b"{}")
    young = put(store, lambda sha: variant_key("cls", "htp", sha), b"a build in flight" * 9)
    fleet = Fleet(
        manifest=manifest,
        retired=retired,
        removable={superseded.uri, temp} | referenced_by(retired),
        pinned={pinned.uri},
        young={young.uri},
        untouchable=untouchable,
    )
    everything = {o.key for o in store.list_objects("", hidden=True)}
    ages = dict.fromkeys(everything - fleet.young, OLD)
    ages[report_key("dev-1")] = NOW - timedelta(days=2)
    ages[report_key("dev-2")] = NOW - timedelta(days=60)  # past the retention window
    if isinstance(store, LocalStore):
        for key, at in ages.items():
            os.utime(store.root / key, (at.timestamp(), at.timestamp()))
        return store, fleet
    assert isinstance(store, S3Store)
    key = f"{store.prefix}/variants/cls/x86-cpu/{'f' * 64}.onnx"
    started = store.client.create_multipart_upload(Bucket=store.bucket, Key=key)
    store.client.upload_part(
        Bucket=store.bucket, Key=key, UploadId=started["UploadId"], PartNumber=1, Body=b"p" * 100
    )
    return Aged(store, ages), fleet  # type: ignore[return-value]


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return open_store(f"s3://{request.getfixturevalue('s3_bucket')}/fleet")


def referenced_by(entry: ModelEntry) -> set[str]:
    found = {entry.source.uri} | ({entry.samples.uri} if entry.samples else set())
    return found | {v.artifact.uri for v in entry.variants.values() if v.artifact}


def keys(store: Store) -> set[str]:
    return {o.key for o in store.list_objects("", hidden=True)}


def referenced(manifest: Manifest) -> set[str]:
    return set().union(*(referenced_by(entry) for entry in manifest.models.values()))


def test_dry_run_lists_and_removes_nothing(store: Store) -> None:
    store, fleet = make_fleet(store)
    before = keys(store)
    result = collect(store)
    assert {c.key for c in result.plan.candidates if c.kind != "multipart"} == fleet.removable
    assert keys(store) == before and result.removed == []
    totals = result.plan.totals()
    assert totals["temp"].count == 1 and totals["source"].count == 1
    assert totals["variant"].count == 2
    assert totals["multipart"].count == (1 if isinstance(store, Aged) else 0)
    kept = {k.key: k.reason for k in result.plan.kept}
    assert "dev-1" in kept[next(iter(fleet.pinned))]
    assert "grace" in kept[next(iter(fleet.young))]
    text = render(result)
    assert "would remove" in text and "--delete" in text
    assert f"would remove {len(fleet.removable) + totals['multipart'].count} object(s)" in text


def test_delete_removes_exactly_the_unreferenced_unpinned_old_objects(store: Store) -> None:
    store, fleet = make_fleet(store)
    before = keys(store)
    result = collect(store, delete=True)
    after = keys(store)
    assert before - after == fleet.removable
    assert referenced(fleet.manifest) | fleet.pinned | fleet.young | fleet.untouchable <= after
    assert store.incomplete_uploads() == []
    assert result.errors == []
    assert result.freed == sum(c.size for c in result.plan.candidates) > 0
    assert "removed" in render(result)
    again = collect(store, delete=True)
    assert [c for c in again.plan.candidates] == []


def test_grace_and_retention_are_options(store: Store) -> None:
    store, fleet = make_fleet(store)
    # a retention window of a day: the device report of two days ago no longer pins
    result = collect(store, retention_days=1)
    assert fleet.pinned <= {c.key for c in result.plan.candidates}
    # a grace period of four days: everything is too young, and so is the manifest
    result = collect(store, grace_hours=96)
    assert result.plan.candidates == []
    assert result.plan.deferred and "grace" in result.plan.deferred


def test_a_fresh_publish_defers_collection(store: Store) -> None:
    """A device that read the manifest before the last publish may still be downloading
    what it referenced: unreferenced objects wait until the manifest in force is older
    than the grace period (temp files do not)."""
    store, fleet = make_fleet(store)
    write_manifest(store, fleet.manifest.models, generation=4, at=datetime.now(timezone.utc))
    before = keys(store)
    result = collect(store, delete=True)
    gone = before - keys(store)
    assert gone == {k for k in fleet.removable if kind_of(k) == "temp"}
    assert "generation 4" in (result.plan.deferred or "")


class PublishesDuringDeletes:
    """A store on which another publisher re-adds the retired model right after the
    collector's first removal: between its planning and the rest of its removals."""

    def __init__(self, store: Store, manifest: Manifest, retired: ModelEntry) -> None:
        self._store, self._manifest, self._retired = store, manifest, retired
        self.deleted: list[str] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def delete(self, key: str) -> None:
        self._store.delete(key)
        self.deleted.append(key)
        if len(self.deleted) == 1:
            models = {**self._manifest.models, "old-det": self._retired}
            write_manifest(self._store, models, generation=4, at=datetime.now(timezone.utc))


def test_a_racing_publish_keeps_what_it_references(store: Store) -> None:
    aged, fleet = make_fleet(store)
    plain = collect(aged)  # what it would remove without the race
    first = plain.plan.candidates[0].key
    assert kind_of(first) == "temp" and referenced_by(fleet.retired) <= {
        c.key for c in plain.plan.candidates
    }
    racing = PublishesDuringDeletes(aged, fleet.manifest, fleet.retired)
    result = collect(racing, delete=True, recheck_seconds=0)  # type: ignore[arg-type]
    assert racing.deleted == [first]
    assert any("manifest changed" in w for w in result.warnings)
    now = store.read(MANIFEST_KEY)
    assert now is not None
    in_force = Manifest.from_json(now.data)
    assert referenced(in_force) <= keys(store)  # a device syncing now finds every file
    assert in_force.generation == 4
    assert referenced_by(fleet.retired) <= keys(store)


def test_kind_of_recognises_only_what_it_collects() -> None:
    digest = "0" * 64
    assert kind_of(f"sources/{digest}.onnx") == "source"
    assert kind_of(f"samples/{digest}.npz") == "samples"
    assert kind_of(f"variants/m/t/{digest}.onnx") == "variant"
    assert kind_of(f"sources/.{digest}.onnx.abcd_123.tmp") == "temp"
    assert kind_of(".manifest.json.abcdefgh.tmp") == "temp"
    for key in (
        MANIFEST_KEY,
        "reports/devices/d.json",
        "reports/devices/.d.json.abcdefgh.tmp",
        f"trust/targets/{digest}.manifest.json",
        "runs/x/pool.json",
        f"sources/{digest}.onnx.bak",
        f"variants/m/{digest}.onnx",
        "other/file",
    ):
        assert kind_of(key) is None, key


def test_no_manifest_collects_only_temp_files() -> None:
    objects = [
        StoredObject(f"sources/{'1' * 64}.onnx", 10, OLD),
        StoredObject(f"sources/.{'1' * 64}.onnx.abcdefgh.tmp", 5, OLD),
    ]
    plan = plan_collection(objects, [], None, {}, NOW, timedelta(hours=1))
    assert [c.key for c in plan.candidates] == [objects[1].key]
    assert plan.deferred and "no manifest.json" in plan.deferred


def run_cli(argv: list[str]) -> int:
    """``epfleet.cli.main``: its exit codes and error lines."""
    from epfleet import cli

    return cli.main(argv)


def test_gc_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store, fleet = make_fleet(open_store(str(tmp_path / "store")))
    assert run_cli(["gc", "--store", store.uri, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {c["key"] for c in listed["plan"]["candidates"]} == fleet.removable
    assert listed["deleted"] is False and listed["removed"] == [] and listed["freed"] == 0
    assert fleet.removable <= keys(store)
    assert run_cli(["gc", "--store", store.uri, "--delete", "--retention-days", "1"]) == 0
    out = capsys.readouterr().out
    assert f"removed {len(fleet.removable) + 1} object(s)" in out  # the pin expired too
    assert not (fleet.removable | fleet.pinned) & keys(store)
    assert run_cli(["gc", "--store", store.uri, "--grace", "-1"]) == 2
    assert "--grace must be 0 hours or more, got -1" in capsys.readouterr().err
    store.write(MANIFEST_KEY, b'{"models": 3}')
    assert run_cli(["gc", "--store", store.uri, "--delete"]) == 1
    assert "manifest.json fails validation" in capsys.readouterr().err


def test_an_unreadable_recent_report_keeps_every_variant(store: Store) -> None:
    store, fleet = make_fleet(store)
    store.write(report_key("broken"), b"{not json")
    result = collect(store)
    assert not [c for c in result.plan.candidates if c.kind == "variant"]
    kept = {k.key: k.reason for k in result.plan.kept}
    retired_variant = next(k for k in fleet.removable if kind_of(k) == "variant" and "old-det" in k)
    assert "1 device report(s) could not be read" in kept[retired_variant]
    assert any("reports/devices/broken.json" in w for w in result.warnings)
    assert {c.key for c in result.plan.candidates if c.kind == "source"} == {
        fleet.retired.source.uri
    }


def test_what_it_leaves_alone_is_counted(store: Store) -> None:
    store, fleet = make_fleet(store)
    plan = collect(store).plan
    # notes/what-is-this.txt and sources/not-a-digest.onnx
    assert plan.unrecognised == 2
    assert plan.protected == len(fleet.untouchable) - 2
