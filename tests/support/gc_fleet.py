"""Stores for gc, retire and costs tests: a fleet with retired models, superseded builds,
orphans and aged objects written by hand, the device reports that pin builds, and which
keys the manifest references."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone

from epfleet.formats.device_report import DeviceReport, ManifestStatus, ModelReport, report_key
from epfleet.formats.keys import (
    files_key,
    listing_key,
    samples_key,
    signature_key,
    source_key,
    variant_key,
)
from epfleet.formats.manifest import (
    ArtifactRef,
    Manifest,
    ModelEntry,
    PackageFile,
    SamplesRef,
    SourceEntry,
    VariantEntry,
)
from epfleet.hashing import sha256_bytes
from epfleet.lifecycle.gc import (
    needed_keys,
)
from epfleet.stores import MANIFEST_KEY, Store
from epfleet.stores.base import StoredObject
from epfleet.stores.local import LocalStore
from epfleet.stores.s3 import S3Store

NOW = datetime.now(timezone.utc).replace(microsecond=0)
OLD = NOW - timedelta(days=3)
"""Before the grace period (a day by default)."""


def put(store: Store, key_for: object, data: bytes) -> ArtifactRef:
    sha256 = sha256_bytes(data)
    key = key_for(sha256)  # type: ignore[operator]
    store.write(key, data)
    return ArtifactRef(uri=key, sha256=sha256, size=len(data))


def ok_variant(
    artifact: ArtifactRef, source_sha256: str, files: list[PackageFile] | None = None
) -> VariantEntry:
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
        files=files or [],
    )


def put_files(store: Store, files: dict[str, bytes]) -> list[PackageFile]:
    """Files beside a main file, stored under files/<sha256>."""
    return [PackageFile(path=p, **put(store, files_key, d).model_dump()) for p, d in files.items()]


def multi_file_variant(
    store: Store, model: str, target: str, main: bytes, files: dict[str, bytes], source: str
) -> VariantEntry:
    """A variant with files beside its main file, stored as a build stores one: the main
    file, each file under files/, and the listing beside the main file."""
    artifact = put(store, lambda sha: variant_key(model, target, sha), main)
    refs = put_files(store, files)
    listing = [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in refs]
    store.write(listing_key(artifact.uri), json.dumps(listing, indent=1).encode())
    return ok_variant(artifact, source, refs)


def keys_of(variant: VariantEntry) -> set[str]:
    """A multi-file variant's store keys: main file, listing, and its files."""
    assert variant.artifact is not None
    return {variant.artifact.uri, listing_key(variant.artifact.uri)} | {
        f.uri for f in variant.files
    }


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


def device_report(
    device: str,
    model: str,
    target: str,
    sha256: str,
    at: datetime,
    variant: VariantEntry | None = None,
) -> DeviceReport:
    """A device running the build of main file ``sha256``. Given the ``variant`` entry,
    the report is a current device's: the variant named from its set's digest, with its
    main file's sha256 (``artifact_sha256``); else an older device's, with the name only."""
    digest = variant.digest if variant is not None else sha256
    assert digest is not None
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
                variant=f"{target}-{digest[:12]}",
                target=target,
                artifact_sha256=sha256 if variant is not None else None,
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
    pinned_by: dict[str, str] = field(default_factory=dict)
    """Each pinned key's device."""
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
        return sorted(self.iter_objects(prefix, hidden=hidden), key=lambda o: o.key)

    def iter_objects(self, prefix: str, *, hidden: bool = False) -> Iterator[StoredObject]:
        listed = self._store.iter_objects(prefix, hidden=hidden)
        return (replace(o, modified=self._ages.get(o.key, o.modified)) for o in listed)

    def incomplete_uploads(self) -> list[StoredObject]:
        return [replace(o, modified=OLD) for o in self._store.incomplete_uploads()]

    def touch(self, key: str, min_age: float = 0.0) -> bool:
        self._ages.pop(key, None)  # its real (fresh) modification time counts from now on
        return self._store.touch(key, min_age)

    def delete_if_older(self, key: str, cutoff: datetime) -> bool:
        aged = self._ages.get(key)
        if aged is None:
            return self._store.delete_if_older(key, cutoff)
        if aged >= cutoff:
            return False
        self._store.delete(key)
        return True


def multi_file_model(store: Store) -> tuple[ModelEntry, VariantEntry, VariantEntry]:
    """A model whose source has a data file, which every build of it shares, and builds
    each with a context file of its own: the current one (in the entry), one superseded,
    and one a device still runs."""
    shared = {"model.onnx.data": b"W" * 300}
    main = put(store, source_key, b"llm source" * 10)
    llm = ModelEntry(source=SourceEntry(**main.model_dump(), files=put_files(store, shared)))

    def build(n: int) -> VariantEntry:
        context = {"model_ctx.bin": f"context {n}".encode() * 20}
        data = f"llm build {n}".encode() * 30
        return multi_file_variant(store, "llm", "x86-cpu", data, shared | context, main.sha256)

    llm.variants["x86-cpu"] = build(2)
    return llm, build(1), build(0)


def make_fleet(
    store: Store, multi_file: bool = False, signatures: bool = False
) -> tuple[Store, Fleet]:
    """The fleet store; with ``multi_file``, also the model of ``multi_file_model``, its
    pinned build run by a current device (dev-3), and an orphan files/ object; with
    ``signatures``, a model signature (``<artifact key>.sig``) beside every variant's main
    file, which goes or stays with it."""
    current = model_entry(store, "cls", {"x86-cpu": b"cls build 2" * 50, "htp": b"cls htp" * 20})
    superseded = put(store, lambda sha: variant_key("cls", "x86-cpu", sha), b"cls build 1" * 40)
    pinned = put(store, lambda sha: variant_key("cls", "x86-cpu", sha), b"cls build 0" * 30)
    # no samples: the first removal (in key order) is then a temp file, not the retired
    # model's, so that the racing publish lands before their turn
    retired = model_entry(store, "old-det", {"x86-cpu": b"det build" * 60}, samples=False)
    models = {"cls": current}
    reports = {
        # an older device's report: the variant's name only, <target>-<12 digits>
        "dev-1": device_report("dev-1", "cls", "x86-cpu", pinned.sha256, NOW - timedelta(days=2)),
        # past the retention window: pins nothing
        "dev-2": device_report(
            "dev-2", "cls", "x86-cpu", superseded.sha256, NOW - timedelta(days=60)
        ),
    }
    removable = {superseded.uri} | referenced_by(retired)
    pinned_by = {pinned.uri: "dev-1"}
    if multi_file:
        models["llm"], llm_superseded, llm_pinned = multi_file_model(store)
        assert llm_pinned.artifact is not None
        # a current device's report, naming the variant's main file
        reports["dev-3"] = device_report(
            "dev-3",
            "llm",
            "x86-cpu",
            llm_pinned.artifact.sha256,
            NOW - timedelta(days=2),
            variant=llm_pinned,
        )
        # the data file the builds share stays referenced: its main file, listing and
        # context file go (or stay pinned) with each build
        shared = {f.uri for f in models["llm"].source.files}
        removable |= keys_of(llm_superseded) - shared
        removable.add(put(store, files_key, b"a context file no listing names").uri)
        pinned_by |= dict.fromkeys(keys_of(llm_pinned) - shared, "dev-3")
        assert len(keys_of(llm_superseded) - shared) == len(keys_of(llm_pinned) - shared) == 3
    manifest = write_manifest(store, models, generation=3, at=OLD)
    for device, report in reports.items():
        store.write(report_key(device), report.model_dump_json().encode())
    # a temp file at the store's root: it comes first in key order (before files/)
    temp = ".manifest.json.abcd1234.tmp"
    store.write(temp, b"half a manifest")
    untouchable = {
        MANIFEST_KEY,
        *(report_key(device) for device in reports),
        "trust/metadata/3.snapshot.json",  # (no 1.root.json: the store is unsigned)
        f"trust/targets/{'a' * 64}.manifest.json",
        "runs/0b7e5c5e-5b0f-4a8e-9d6e-3f1f0e0e0e0e-1-1700000000/pool.json",
        "notes/what-is-this.txt",
        "sources/not-a-digest.onnx",
    }
    for key in untouchable - {MANIFEST_KEY, *(report_key(device) for device in reports)}:
        store.write(key, b"{}")
    young = put(store, lambda sha: variant_key("cls", "htp", sha), b"a build in flight" * 9)
    fleet = Fleet(
        manifest=manifest,
        retired=retired,
        removable=removable | {temp},
        pinned=set(pinned_by),
        pinned_by=pinned_by,
        young={young.uri},
        untouchable=untouchable,
    )
    if signatures:
        for key in keys(store):
            if is_variant_file(key):
                store.write(signature_key(key), b"a model signature")
        fleet.removable |= {signature_key(k) for k in fleet.removable if is_variant_file(k)}
        fleet.pinned_by |= {signature_key(k): d for k, d in pinned_by.items() if is_variant_file(k)}
        fleet.pinned = set(fleet.pinned_by)
        fleet.young.add(signature_key(young.uri))
    assert not (fleet.removable | fleet.pinned) & needed_keys(manifest)
    everything = {o.key for o in store.list_objects("", hidden=True)}
    ages = dict.fromkeys(everything - fleet.young, OLD)
    for device, report in reports.items():
        ages[report_key(device)] = datetime.fromisoformat(report.generated_at)
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


def is_variant_file(key: str) -> bool:
    return key.startswith("variants/") and key.endswith(".onnx")


def referenced_by(entry: ModelEntry) -> set[str]:
    """The keys of a model's source, samples and variants, with every file they list and
    the listings of multi-file variants."""
    found = {entry.source.uri} | {f.uri for f in entry.source.files}
    found |= {entry.samples.uri} if entry.samples else set()
    for variant in entry.variants.values():
        if variant.artifact is not None:
            found |= keys_of(variant) if variant.files else {variant.artifact.uri}
    return found


def keys(store: Store) -> set[str]:
    return {o.key for o in store.list_objects("", hidden=True)}


def referenced(manifest: Manifest) -> set[str]:
    return set().union(*(referenced_by(entry) for entry in manifest.models.values()))


def run_cli(argv: list[str]) -> int:
    """``epfleet.cli.app.main``: its exit codes and error lines."""
    from epfleet.cli.app import main

    return main(argv)
