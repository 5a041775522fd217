"""epfleet gc on a local store and on S3 (moto over HTTP): a store with a retired model,
superseded builds (single-file and multi-file), orphan temp and files/ objects, an
incomplete multipart upload and device reports pinning old builds (one multi-file, pinned
by its main file's sha256 with its listing and files). It removes exactly the
unreferenced, unpinned objects past the grace period; a dry run removes nothing; a
publish racing it is safe."""

from __future__ import annotations

import itertools
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from pydantic import ValidationError

from epfleet.fleet.rollout.rules import advance
from epfleet.formats.device_report import DeviceReport, report_key
from epfleet.formats.keys import files_key, samples_key, source_key, variant_key
from epfleet.formats.manifest import (
    ArtifactRef,
    Manifest,
    ModelEntry,
    PackageFile,
    PreviousVersion,
    SourceEntry,
    VariantEntry,
)
from epfleet.formats.rollout import Rollout, RolloutPolicy
from epfleet.lifecycle.gc import (
    collect,
    kind_of,
    pinned_prefixes,
    plan_collection,
    render,
)
from epfleet.stores import MANIFEST_KEY, Store, open_store
from epfleet.stores.base import StoredObject
from tests.support.fake_clock import FakeClock
from tests.support.gc_fleet import (
    NOW,
    OLD,
    Aged,
    device_report,
    keys,
    keys_of,
    make_fleet,
    model_entry,
    multi_file_variant,
    ok_variant,
    put,
    referenced,
    referenced_by,
    run_cli,
    write_manifest,
)

pytestmark = pytest.mark.fast


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return open_store(f"s3://{request.getfixturevalue('s3_bucket')}/fleet")


def test_dry_run_lists_and_removes_nothing(store: Store) -> None:
    store, fleet = make_fleet(store, multi_file=True)
    before = keys(store)
    result = collect(store)
    assert {c.key for c in result.plan.candidates if c.kind != "multipart"} == fleet.removable
    assert keys(store) == before and result.removed == []
    totals = result.plan.totals()
    assert totals["temp"].count == 1 and totals["source"].count == 1
    # cls and old-det superseded and retired; llm's superseded main file and its listing
    assert totals["variant"].count == 4
    assert totals["file"].count == 2  # that build's context file, and the orphan
    assert totals["multipart"].count == (1 if isinstance(store, Aged) else 0)
    kept = {k.key: k.reason for k in result.plan.kept}
    assert len(fleet.pinned) == 4  # cls's old build; llm's main file, listing, context
    for key, device in fleet.pinned_by.items():
        assert f"device {device} reported" in kept[key], key
    assert "grace" in kept[next(iter(fleet.young))]
    text = render(result)
    assert "would remove" in text and "--delete" in text
    assert f"would remove {len(fleet.removable) + totals['multipart'].count} object(s)" in text


def test_delete_removes_exactly_the_unreferenced_unpinned_old_objects(store: Store) -> None:
    store, fleet = make_fleet(store, multi_file=True)
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


def test_a_model_signature_is_removed_with_its_variant_and_kept_with_it(store: Store) -> None:
    store, fleet = make_fleet(store, multi_file=True, signatures=True)
    signatures = {key for key in keys(store) if key.endswith(".onnx.sig")}
    assert len(signatures & fleet.removable) == 3  # cls's superseded build, old-det, llm's
    assert len(signatures & fleet.pinned) == 2  # the builds dev-1 and dev-3 run
    before = keys(store)
    result = collect(store, delete=True)
    assert result.errors == []
    after = keys(store)
    assert before - after == fleet.removable
    for signature in signatures:
        assert (signature in after) == (signature.removesuffix(".sig") in after), signature


def test_grace_and_retention_are_options(store: Store) -> None:
    store, fleet = make_fleet(store, multi_file=True)
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
    store, fleet = make_fleet(store, multi_file=True)
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
    aged, fleet = make_fleet(store, multi_file=True)
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


class SlowRemovals:
    """A store on which each removal takes ``seconds`` on ``clock``, and that records when
    (on the clock) the collector looked at the manifest and removed an object."""

    def __init__(self, store: Store, clock: FakeClock, seconds: float) -> None:
        self._store, self._clock, self._seconds = store, clock, seconds
        self.looked: list[float] = []
        self.removed: list[tuple[str, float]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def read_if_changed(self, key: str, etag: str) -> object:
        self.looked.append(self._clock.elapsed)
        return self._store.read_if_changed(key, etag)

    def size(self, key: str) -> int | None:
        if key == MANIFEST_KEY:
            self.looked.append(self._clock.elapsed)
        return self._store.size(key)

    def delete_if_older(self, key: str, cutoff: datetime) -> bool:
        self.removed.append((key, self._clock.elapsed))
        self._clock.advance(self._seconds)
        return self._store.delete_if_older(key, cutoff)


def test_the_manifest_is_looked_at_again_once_the_recheck_interval_has_passed(
    store: Store,
) -> None:
    """On a fake clock: gc asks whether the manifest changed before a removal once its last
    look is ``recheck_seconds`` old, and not more often (the racing publish above is the
    same rule on the real clock)."""
    aged, _ = make_fleet(store, multi_file=True)
    clock = FakeClock(start=datetime.now(timezone.utc))  # the fleet's objects are real files
    slow = SlowRemovals(aged, clock, seconds=0.4)
    result = collect(slow, delete=True, recheck_seconds=1.0, clock=clock)  # type: ignore[arg-type]
    assert len(slow.removed) >= 4 and not result.errors
    assert 1 <= len(slow.looked) < len(slow.removed)
    looks = [0.0, *slow.looked]  # the plan is the first look
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(looks))  # not more often
    for _, at in slow.removed:  # and never a removal on a look older than the interval
        assert at - max(t for t in looks if t <= at) < 1.0


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


def test_gc_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, fleet = make_fleet(open_store(str(tmp_path / "store")), multi_file=True)
    assert run_cli(["gc", "--store", store.uri, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {c["key"] for c in listed["plan"]["candidates"]} == fleet.removable
    assert listed["deleted"] is False and listed["removed"] == [] and listed["freed"] == 0
    assert fleet.removable <= keys(store)
    # the environment sets the defaults of --retention-days and --grace
    monkeypatch.setenv("EPFLEET_GC_RETENTION_DAYS", "1")
    assert run_cli(["gc", "--store", store.uri, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {c["key"] for c in listed["plan"]["candidates"]} == fleet.removable | fleet.pinned
    monkeypatch.setenv("EPFLEET_GC_GRACE_HOURS", "100000")
    assert run_cli(["gc", "--store", store.uri, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plan"]["candidates"] == []
    monkeypatch.delenv("EPFLEET_GC_RETENTION_DAYS")
    monkeypatch.delenv("EPFLEET_GC_GRACE_HOURS")
    assert run_cli(["gc", "--store", store.uri, "--delete", "--retention-days", "1"]) == 0
    out = capsys.readouterr().out
    assert f"removed {len(fleet.removable) + len(fleet.pinned)} object(s)" in out  # pins expired
    assert not (fleet.removable | fleet.pinned) & keys(store)
    assert referenced(fleet.manifest) <= keys(store)
    assert run_cli(["gc", "--store", store.uri, "--grace", "-1"]) == 2
    assert "--grace must be 0 to 876,000 hours (a century), got -1" in capsys.readouterr().err
    for option, value in (("--grace", "inf"), ("--grace", "nan"), ("--retention-days", "1e12")):
        assert run_cli(["gc", "--store", store.uri, option, value]) == 2  # was a traceback
        assert f"{option} must be 0 to " in capsys.readouterr().err
    store.write(MANIFEST_KEY, b'{"models": 3}')
    assert run_cli(["gc", "--store", store.uri, "--delete"]) == 1
    assert "manifest.json fails validation" in capsys.readouterr().err


def test_an_unreadable_recent_report_keeps_every_variant(store: Store) -> None:
    store, fleet = make_fleet(store, multi_file=True)
    store.write(report_key("broken"), b"{not json")
    result = collect(store)
    assert not [c for c in result.plan.candidates if c.kind in ("variant", "file")]
    kept = {k.key: k.reason for k in result.plan.kept}
    retired_variant = next(k for k in fleet.removable if kind_of(k) == "variant" and "old-det" in k)
    assert "1 device report(s) could not be read" in kept[retired_variant]
    assert any("reports/devices/broken.json" in w for w in result.warnings)
    assert {c.key for c in result.plan.candidates if c.kind == "source"} == {
        fleet.retired.source.uri
    }


def test_what_it_leaves_alone_is_counted(store: Store) -> None:
    store, fleet = make_fleet(store, multi_file=True)
    plan = collect(store).plan
    # notes/what-is-this.txt and sources/not-a-digest.onnx
    assert plan.unrecognised == 2
    assert plan.protected == len(fleet.untouchable) - 2


def test_a_report_pins_the_main_file_it_names_and_an_older_one_the_name_prefix() -> None:
    digest, sha = "d" * 64, "5" * 64
    files = [PackageFile(path="model_ctx.bin", uri=files_key("c" * 64), sha256="c" * 64, size=1)]
    variant = ok_variant(ArtifactRef(uri=variant_key("llm", "t", sha), sha256=sha, size=9), digest)
    variant = VariantEntry.model_validate(variant.model_dump() | {"files": files})
    assert variant.digest is not None and variant.digest != sha
    current = device_report("dev-3", "llm", "t", sha, NOW, variant=variant)
    assert current.models[0].variant == f"t-{variant.digest[:12]}"
    older = device_report("dev-1", "cls", "t", "a" * 64, NOW)
    # exactly the main file and its listing, never another build sharing its first digits
    assert pinned_prefixes([current, older]) == {
        f"variants/llm/t/{sha}.": "dev-3",
        f"variants/cls/t/{'a' * 12}": "dev-1",
    }
    local = current.model_copy(deep=True)
    local.models[0] = local.models[0].model_copy(
        update={"variant": "local-cpu-0123456789ab", "target": None, "artifact_sha256": None}
    )
    assert pinned_prefixes([local]) == {}


def test_device_reports_without_the_artifact_field_still_parse() -> None:
    report = device_report("dev-1", "cls", "t", "a" * 64, NOW)
    old = json.loads(report.model_dump_json())
    for model in old["models"]:
        del model["artifact_sha256"]
    parsed = DeviceReport.model_validate(old)
    assert parsed.models[0].artifact_sha256 is None
    assert pinned_prefixes([parsed]) == {f"variants/cls/t/{'a' * 12}": "dev-1"}
    old["models"][0]["artifact_sha256"] = "../../sources/x"
    with pytest.raises(ValidationError, match="artifact_sha256"):
        DeviceReport.model_validate(old)


def test_a_version_rollout_keeps_the_whole_previous_version_until_it_completes(
    store: Store,
) -> None:
    """Under a staged rollout of a new source, gc keeps what a revert sends devices back
    to: the previous version's source, golden samples, calibration inputs and variant (its
    main file, listing and files); once the rollout completes, it collects them."""
    first = model_entry(store, "m", {})
    assert first.samples is not None
    old = multi_file_variant(
        store, "m", "cpu", b"v1 main" * 5, {"model.onnx.data": b"v1 data" * 5}, first.source.sha256
    )
    calibration = put(store, samples_key, b"v1 calibration" * 3)
    source = put(store, source_key, b"v2 source" * 10)
    new = multi_file_variant(
        store, "m", "cpu", b"v2 main" * 5, {"model.onnx.data": b"v2 data" * 5}, source.sha256
    )
    staged = ModelEntry(
        source=SourceEntry(**source.model_dump()),
        variants={"cpu": new},
        rollout=Rollout(
            id="0" * 16,
            salt="5a17" * 8,
            policy=RolloutPolicy(stages=[10, 100]),
            stage=0,
            started_at=OLD,
            stage_started_at=OLD,
        ),
        previous={"cpu": old},
        previous_version=PreviousVersion(
            source=first.source, samples=first.samples, calibration=calibration
        ),
    )
    write_manifest(store, {"m": staged}, 5, OLD)
    later = datetime.now(timezone.utc) + timedelta(days=3)  # every object past the grace
    way_back = {first.source.uri, first.samples.uri, calibration.uri} | keys_of(old)
    assert collect(store, delete=True, now=later).plan.candidates == []
    assert way_back <= keys(store)
    write_manifest(store, {"m": advance(advance(staged, OLD), OLD)}, 6, OLD)
    done = collect(store, delete=True, now=later)
    assert {c.key for c in done.plan.candidates} == way_back
    assert not way_back & keys(store) and keys_of(new) <= keys(store)


def test_notices_past_the_grace_period_go_and_the_reports_they_name_stay() -> None:
    notice, young = (
        "reports/inbox/20261201T1040/dev-1.json",
        "reports/inbox/20261207T1040/dev-2.json",
    )
    objects = [
        StoredObject(notice, 0, OLD),
        StoredObject(young, 0, NOW),
        StoredObject(report_key("dev-1"), 900, OLD),
        StoredObject("reports/inbox/not-a-partition/dev-3.json", 0, OLD),
        StoredObject("reports/evidence-index/0123456789abcdef/head.json", 300, OLD),
    ]
    assert kind_of(notice) == "notice" and kind_of(report_key("dev-1")) is None
    plan = plan_collection(objects, [], None, {}, NOW, timedelta(days=1))  # no manifest
    assert [(c.key, c.kind) for c in plan.candidates] == [(notice, "notice")]
    assert [k.key for k in plan.kept] == [young]
    assert plan.protected == 3
