"""Attacks on signed distribution: a device that trusts a TUF root refuses what an attacker
with write access to the store (and no signing keys, or too few) serves, keeps its
active variants, and says why in its report.

Real syncs of a fleet compiled by `epfleet compile` (``fleet_store``, tests/conftest.py), on
a local store and on S3 (moto over HTTP, through the fault proxy). The repository side
here is a small TUF writer on python-tuf's API (``Repo``), so that each attack can sign
exactly what it needs: older versions replayed, a bin from another snapshot, metadata
signed with the wrong key or too few root keys, an expired timestamp.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import boto3
import onnx
import pytest
from securesystemslib.signer import CryptoSigner, Signer
from tuf.api.metadata import (
    Metadata,
    Root,
)

from epfleet.cli.app import main
from epfleet.device.cache import DeviceCache
from epfleet.device.manifest_cache import fetch_manifest, lock_held
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.errors import BadInputError
from epfleet.fleet.watch.inputs import read_reports
from epfleet.formats.device_report import DeviceReport, decode_report, report_key
from epfleet.hashing import sha256_bytes
from epfleet.stores import open_store
from epfleet.trust.client import verify
from tests.support.s3proxy import FaultProxy
from tests.support.signed_fleet import (
    DEVICE,
    MODEL,
    SERIALIZER,
    Fleet,
    Keys,
    Repo,
    Site,
    assert_refused,
    first_sync,
    in_days,
    only,
    rebuilt,
    synthetic_store,
    trust_of,
)
from tests.support.synced_fleet import (
    assert_package_runs,
    read_manifest,
    republish_cpu_variant,
    republish_edited_cpu_variant,
    unsigned_copy,
)

pytestmark = [pytest.mark.fast]


# --- the attacks ----------------------------------------------------------------------------


def test_an_artifact_and_manifest_json_rewritten_together_are_refused(fleet: Fleet) -> None:
    good = first_sync(fleet)
    store = fleet.site.directory
    republish_edited_cpu_variant(store, rebuilt)  # a genuine new build, signed
    fleet.repo.publish()
    # The attacker replaces that build's bytes and manifest.json's sha256 and size for it.
    evil = onnx.load_from_string((store / artifact_key(store)).read_bytes())
    evil.doc_string = "the attacker's build"
    data = evil.SerializeToString()
    (store / artifact_key(store)).write_bytes(data)
    manifest = read_manifest(store)
    artifact = manifest.models[MODEL].variants["x86-cpu"].artifact
    assert artifact is not None
    artifact.sha256, artifact.size = sha256_bytes(data), len(data)
    (store / "manifest.json").write_bytes(manifest.to_json())
    fleet.site.push()

    report = fleet.sync()

    result = only(report)
    assert report.exit_code == 1 and result.action == "failed"
    assert "sha256" in result.reason and "not activated" in result.reason, result.reason
    assert result.variant == good.variant
    assert_package_runs(fleet.cache, {MODEL: good.variant or ""})


def artifact_key(store: Path) -> str:
    artifact = read_manifest(store).models[MODEL].variants["x86-cpu"].artifact
    assert artifact is not None
    return artifact.uri


@pytest.mark.parametrize("role", ["timestamp", "snapshot", "bin"])
def test_rollback_of_each_role_is_refused(fleet: Fleet, role: str) -> None:
    first_sync(fleet)
    meta = fleet.repo.meta
    old = {p.name: p.read_bytes() for p in meta.iterdir()}
    fleet.republish()
    newer = only(fleet.sync())
    assert newer.action == "downloaded", newer.reason
    # The attacker serves version 1 of the role again where version 2 is expected.
    bin_name = fleet.repo.bin_of(MODEL)
    if role == "timestamp":
        (meta / "timestamp.json").write_bytes(old["timestamp.json"])
    else:  # a version 3 of everything, the role's version 1 served as its version 3
        version = fleet.repo.publish()
        name = "snapshot" if role == "snapshot" else bin_name
        (meta / f"{version}.{name}.json").write_bytes(old[f"1.{name}.json"])
    fleet.site.push()

    report = fleet.sync()

    words = ["refused"] if role != "timestamp" else ["rollback", "refused"]
    assert_refused(report, newer, *words)


def test_a_frozen_timestamp_is_refused_once_expired(fleet: Fleet) -> None:
    good = first_sync(fleet)
    fleet.repo.publish(timestamp_expires=in_days(-1 / 24))  # what a frozen device ends up with
    fleet.site.push()

    assert_refused(fleet.sync(), good, "expired", "refused")


def test_mix_and_match_a_bin_from_another_snapshot_is_refused(fleet: Fleet) -> None:
    good = first_sync(fleet)
    meta, bin_name = fleet.repo.meta, fleet.repo.bin_of(MODEL)
    old_bin = (meta / f"1.{bin_name}.json").read_bytes()
    republish_edited_cpu_variant(fleet.site.directory, rebuilt)
    version = fleet.repo.publish()
    (meta / f"{version}.{bin_name}.json").write_bytes(old_bin)  # the current snapshot, an old bin
    fleet.site.push()

    assert_refused(fleet.sync(), good, "refused")


def test_a_bin_padded_past_its_signed_length_is_refused(fleet: Fleet) -> None:
    good = first_sync(fleet)
    republish_edited_cpu_variant(fleet.site.directory, rebuilt)
    version = fleet.repo.publish()
    path = fleet.repo.meta / f"{version}.{fleet.repo.bin_of(MODEL)}.json"
    path.write_bytes(path.read_bytes() + b" " * (6 << 20))  # still valid JSON, and signed
    fleet.site.push()

    report = fleet.sync()

    assert_refused(report, good, "longer than its signed", "refused")


def test_an_artifact_padded_past_its_signed_length_is_read_no_further(fleet: Fleet) -> None:
    good = first_sync(fleet)
    data = republish_edited_cpu_variant(fleet.site.directory, rebuilt)
    fleet.repo.publish()
    path = fleet.site.directory / artifact_key(fleet.site.directory)
    path.write_bytes(b"\0" * (4 * len(data)))  # replaced by an attacker: longer, other bytes
    fleet.site.push()

    report = fleet.sync()

    result = only(report)
    assert report.exit_code == 1 and result.action == "failed", result.reason
    assert "sha256" in result.reason and "not activated" in result.reason
    assert result.bytes_downloaded <= len(data)  # never past the signed length
    assert result.variant == good.variant
    assert_package_runs(fleet.cache, {MODEL: good.variant or ""})


def test_metadata_signed_with_the_wrong_key_is_refused(fleet: Fleet) -> None:
    good = first_sync(fleet)
    evil = onnx.load_from_string(
        (fleet.site.directory / artifact_key(fleet.site.directory)).read_bytes()
    )
    evil.doc_string = "the attacker's build"
    data = evil.SerializeToString()
    republish_cpu_variant(fleet.site.directory, MODEL, data, sha256_bytes(data))
    fleet.repo.publish(online=CryptoSigner.generate_ecdsa())  # the attacker's own key
    fleet.site.push()

    assert_refused(fleet.sync(), good, "not signed by the trusted keys", "refused")


def test_a_root_below_its_threshold_is_refused(fleet: Fleet) -> None:
    good = first_sync(fleet)
    attacker = Keys()
    fleet.repo.rotate_root(attacker, [fleet.repo.keys.root[0], *attacker.root[:2]])  # 1 of 2 old
    republish_edited_cpu_variant(fleet.site.directory, rebuilt)
    fleet.repo.publish()
    fleet.site.push()

    assert_refused(fleet.sync(), good, "root", "refused")


def test_a_rotated_root_is_followed_and_the_old_keys_are_refused_afterwards(
    fleet: Fleet,
) -> None:
    first_sync(fleet)
    old = fleet.repo.keys
    new = Keys()
    fleet.repo.rotate_root(new, [*old.root[:2], *new.root[:2]])  # old and new thresholds
    fleet.republish()

    rotated = fleet.sync()
    assert rotated.exit_code == 0 and only(rotated).action == "downloaded", rotated.manifest
    history = trust_of(fleet.cache, fleet.site.uri) / "root_history"
    assert sorted(p.name for p in history.iterdir()) == ["1.root.json", "2.root.json"]

    # Someone still holding the old keys signs a root 3 and new metadata: refused.
    fleet.repo.rotate_root(Keys(), old.root[:2])
    fleet.repo.publish(online=old.online)
    fleet.site.push()
    assert_refused(fleet.sync(), only(rotated), "refused")


def test_an_online_key_rotation_is_followed_and_the_old_key_refused_afterwards(
    fleet: Fleet,
) -> None:
    first_sync(fleet)
    old = fleet.repo.rotate_online_key()
    fleet.republish()
    rotated = fleet.sync()
    assert rotated.exit_code == 0 and only(rotated).action == "downloaded", rotated.manifest

    republish_edited_cpu_variant(fleet.site.directory, rebuilt)
    fleet.repo.publish(online=old)
    fleet.site.push()
    assert_refused(fleet.sync(), only(rotated), "not signed by the trusted keys", "refused")


def test_a_store_without_trust_metadata_is_refused(fleet: Fleet) -> None:
    good = first_sync(fleet)
    shutil.rmtree(fleet.site.directory / "trust")
    republish_edited_cpu_variant(fleet.site.directory, rebuilt)
    fleet.site.push()

    assert_refused(fleet.sync(), good, "does not exist", "refused")
    fresh = Fleet(fleet.site, fleet.repo, fleet.root, fleet.cache.with_name("fresh-device"))
    refused = fresh.sync()
    assert refused.exit_code == 1 and refused.models == []
    assert refused.manifest.status == "rejected" and refused.manifest.generation is None
    assert "no signed manifest is cached to fall back on" in (refused.manifest.reason or "")


def test_slow_retrieval_of_metadata_ends_within_a_bounded_time(
    fleet_on_s3: Fleet, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    fleet = fleet_on_s3
    good = first_sync(fleet)
    fleet.republish()
    proxy: FaultProxy = request.getfixturevalue("s3_proxy")
    monkeypatch.setenv("EPFLEET_MIN_RATE", "1KiB")
    monkeypatch.setenv("EPFLEET_RATE_WINDOW", "2")
    bucket = fleet.site.uri.removeprefix("s3://").split("/")[0]
    snapshot = f"/{bucket}/fleet/trust/metadata/{fleet.repo.version}.snapshot.json"
    proxy.trickle_next_get_responses(snapshot, interval=0.5, after=10)

    started = time.monotonic()
    report = fleet.sync()

    assert time.monotonic() - started < 30  # the window and the sync's work, not the trickle
    assert_refused(report, good, "slow retrieval", "refused")


def test_offline_with_expired_metadata_keeps_the_active_variant_and_says_so(
    fleet_on_s3: Fleet, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = fleet_on_s3
    good = first_sync(fleet)
    # Days pass: the signed timestamp this device cached has expired by now ...
    cached = trust_of(fleet.cache, fleet.site.uri) / "timestamp.json"
    stamp = json.loads(cached.read_bytes())
    stamp["signed"]["expires"] = "2020-01-01T00:00:00Z"
    cached.write_text(json.dumps(stamp))
    # ... and the store cannot be reached.
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")

    report = fleet.sync()

    assert report.manifest.status == "offline" and report.manifest.signed
    reason = report.manifest.reason or ""
    assert "cannot refresh the signed metadata" in reason, reason
    assert "expired at 2020-01-01" in reason, reason
    assert report.exit_code == 0 and only(report).action == "kept"
    assert only(report).variant == good.variant
    assert_package_runs(fleet.cache, {MODEL: good.variant or ""})


def test_a_store_signed_by_epfleets_publisher_is_followed_through_its_key_rotations(
    site: Site, tmp_path: Path
) -> None:
    """The publisher's side (epfleet.trust.repository, 16 bins here) and this device agree:
    a publish is synced, rotations of the online key and of the root keys are followed,
    and a root signed by the retired root keys alone is refused."""
    from epfleet.trust.keys import load_offline, new_key
    from epfleet.trust.repository import rotate_online_key, rotate_root_keys
    from tests.support.trust_helpers import make_trusted_store, online_key, publish_new_build

    site.push()
    keys, cache = tmp_path / "keys", tmp_path / "device"
    root = make_trusted_store(site.publish_uri, keys)
    store = open_store(site.publish_uri)

    def run() -> DeviceReport:
        return sync(site.uri, cache, SyncPolicy(models=[MODEL]), DEVICE, trust_root=root)

    def new_build(online: Signer) -> None:
        publish_new_build(store, online, MODEL, "x86-cpu")

    first = only(run())
    assert first.action == "downloaded", first.reason
    new_build(online_key(keys))
    assert only(run()).action == "downloaded"

    offline, online = load_offline(keys), new_key()
    rotate_online_key(store, offline, online)
    new_build(online)
    after_online = only(run())
    assert after_online.action == "downloaded", after_online.reason

    retired = offline.root
    rotate_root_keys(store, offline, [new_key() for _ in range(3)])
    new_build(online)
    rotated = run()
    assert rotated.exit_code == 0 and only(rotated).action == "downloaded", rotated.manifest
    history = trust_of(cache, site.uri) / "root_history"
    assert sorted(p.name for p in history.iterdir()) == [f"{v}.root.json" for v in (1, 2, 3)]

    # Whoever kept the retired root keys signs a root 4 that hands them the online role.
    got = store.read("trust/metadata/3.root.json")
    assert got is not None
    forged = Metadata[Root].from_bytes(got.data)
    forged.signed.version = 4
    attacker = CryptoSigner.generate_ecdsa()
    for role in ("snapshot", "timestamp"):
        for keyid in list(forged.signed.roles[role].keyids):
            forged.signed.revoke_key(keyid, role)
        forged.signed.add_key(attacker.public_key, role)
    forged.signatures.clear()
    for signer in retired:
        forged.sign(signer, append=True)
    store.write("trust/metadata/4.root.json", forged.to_bytes(SERIALIZER))

    assert_refused(run(), only(rotated), "root", "refused")


# --- the device side's plumbing ----------------------------------------------------------------


def test_the_root_is_kept_in_the_cache_and_a_device_without_one_is_refused(
    fleet: Fleet, tmp_path: Path
) -> None:
    first_sync(fleet)
    again = sync(fleet.site.uri, fleet.cache, SyncPolicy(models=[MODEL]), device=DEVICE)
    assert again.exit_code == 0 and again.manifest.signed  # the cached root, no --trust-root
    assert only(again).action == "kept"

    with pytest.raises(BadInputError, match="--trust-root"):
        sync(fleet.site.uri, tmp_path / "new", SyncPolicy(models=[MODEL]), device=DEVICE)
    other = Repo(unsigned_copy(fleet.site.directory, tmp_path / "other"))
    with pytest.raises(BadInputError, match="not the root this device already trusts"):
        fleet.sync(trust_root=other.root_file)

    lax = tmp_path / "lax"
    unsigned = sync(fleet.site.uri, lax, SyncPolicy(models=[MODEL]), DEVICE, allow_unsigned=True)
    assert unsigned.exit_code == 0 and unsigned.manifest.signed is False
    assert "--allow-unsigned" in (unsigned.manifest.warning or "")


def test_a_device_wanting_every_model_takes_the_signed_manifest_json_and_refuses_a_forged_one(
    fleet: Fleet,
) -> None:
    everything = SyncPolicy(models=None)
    first = sync(fleet.site.uri, fleet.cache, everything, DEVICE, trust_root=fleet.root)
    assert first.exit_code == 0 and first.manifest.signed, first.manifest
    assert first.manifest.generation == read_manifest(fleet.site.directory).generation
    assert sorted(m.model for m in first.models) == ["tiny-cls", "tiny-det"]
    kept = {m.model: m.variant for m in first.models}

    # The attacker rewrites the signed manifest.json target in place (and the plain one).
    manifest = read_manifest(fleet.site.directory)
    manifest.models.pop("tiny-det")
    manifest.generation += 1
    forged = manifest.to_json()
    (fleet.site.directory / "manifest.json").write_bytes(forged)
    [target] = (fleet.site.directory / "trust" / "targets").glob("*.manifest.json")
    target.write_bytes(forged)
    fleet.site.push()
    shutil.rmtree(trust_of(fleet.cache, fleet.site.uri) / "targets")  # downloaded again

    report = sync(fleet.site.uri, fleet.cache, everything, DEVICE, trust_root=fleet.root)

    assert report.exit_code == 1 and report.manifest.status == "rejected", report.manifest
    assert "refused" in (report.manifest.reason or "")
    assert {m.model: m.variant for m in report.models} == kept  # both still there, unchanged
    assert all(m.action == "kept" for m in report.models)


def test_the_cli_syncs_with_a_trust_root_and_refuses_without_one(
    local_fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = local_fleet
    base = ["sync", "--store", fleet.site.uri, "--model", MODEL, "--device-id", DEVICE, "--json"]
    code = main([*base, "--cache", str(fleet.cache), "--trust-root", str(fleet.root)])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = DeviceReport.model_validate_json(out)
    assert report.manifest.signed and only(report).action == "downloaded"

    refused = main([*base, "--cache", str(tmp_path / "unprovisioned")])
    err = capsys.readouterr().err
    assert refused == 2 and "--trust-root" in err, err


# --- no compiled fleet needed ------------------------------------------------------------------


def test_a_device_wanting_2_of_n_models_fetches_only_their_bins(tmp_path: Path) -> None:
    store = synthetic_store(tmp_path / "store", 40)
    repo = Repo(store, bins=16)
    wanted = ["model-003", "model-031"]
    trust = tmp_path / "trust"
    trust.mkdir()

    verified = verify(open_store(str(store)), trust, repo.root_file.read_bytes(), wanted)

    bins = sorted(k.rsplit(".", 2)[1] for k in verified.fetched if ".bin-" in k)
    assert bins == sorted({repo.bin_of(m) for m in wanted})  # 2 of 16 bins
    entries = json.loads(verified.document)["models"]
    assert sorted(entries) == wanted
    assert entries["model-003"]["source"]["sha256"] == sha256_bytes(b"3")

    again = verify(open_store(str(store)), trust, repo.root_file.read_bytes(), wanted)
    assert again.fetched == ["trust/metadata/timestamp.json"] and not again.changed


def test_the_state_is_written_only_under_the_cache_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from epfleet.device.cache import CacheState
    from epfleet.device.session import SyncSession

    store = synthetic_store(tmp_path / "store", 3)
    cache = DeviceCache(tmp_path / "device")
    with pytest.raises(RuntimeError, match="only while the cache's lock is held"):
        fetch_manifest(open_store(str(store)), cache, CacheState())
    assert not (cache.meta / "state.json").exists()

    writes: list[bool] = []
    real = DeviceCache.save_state

    def checked(self: DeviceCache, state: CacheState) -> None:
        writes.append(lock_held(self))
        real(self, state)

    monkeypatch.setattr(DeviceCache, "save_state", checked)
    repo = Repo(store)
    for root in (None, repo.root_file):  # unsigned, then signed
        policy = SyncPolicy(models=["model-001"])
        with SyncSession(
            str(store), cache.root, policy, DEVICE, trust_root=root, allow_unsigned=True
        ) as session:
            assert session.fetch_manifest().status == "fetched"
    assert len(writes) >= 4 and all(writes)
    assert not lock_held(cache)


def test_a_link_in_place_of_the_root_history_is_removed_not_followed(tmp_path: Path) -> None:
    from epfleet.device.session import SyncSession

    store = synthetic_store(tmp_path / "store", 3)
    repo, cache = Repo(store), tmp_path / "device"
    policy = SyncPolicy(models=["model-001"])
    with SyncSession(str(store), cache, policy, DEVICE, trust_root=repo.root_file) as session:
        assert session.fetch_manifest().signed
    # Someone points the cached root chain at roots of their own.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    forged = Repo(synthetic_store(tmp_path / "other", 3))
    (elsewhere / "1.root.json").write_bytes(forged.root_file.read_bytes())
    history = trust_of(cache, str(store)) / "root_history"
    shutil.rmtree(history)
    history.symlink_to(elsewhere)

    with SyncSession(str(store), cache, policy, DEVICE) as session:  # no root left to trust
        refused = session.fetch_manifest()
    assert refused.status == "rejected" and refused.signed, refused
    assert "trust cache was lost" in (refused.reason or "") and "--trust-root" in refused.reason
    assert not history.is_symlink() and (elsewhere / "1.root.json").exists()
    with SyncSession(str(store), cache, policy, DEVICE, trust_root=repo.root_file) as session:
        status = session.fetch_manifest()
    assert status.signed and status.status == "unchanged", status  # provisioned again


def test_a_local_store_with_development_keys_is_verified_with_their_root(tmp_path: Path) -> None:
    """The README's first commands: epfleet compile makes development keys beside a local
    store, and a sync from that store with no --trust-root verifies with their root."""
    from epfleet.device.session import SyncSession
    from epfleet.trust.repository import development_keys_dir, init_with_key_files

    store = synthetic_store(tmp_path / "store", 3)
    root, _ = init_with_key_files(
        open_store(str(store)), development_keys_dir(store), bins=16, adopt=True
    )
    policy = SyncPolicy(models=["model-001"])
    with SyncSession(str(store), tmp_path / "device", policy, DEVICE) as session:
        status = session.fetch_manifest()
    assert status.signed and status.status == "fetched", status
    assert f"trusting the development root {root}" in (status.warning or "")


def test_a_device_behind_a_mirror_reports_where_report_to_says(
    mirror_fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device that reads through a read-only mirror cannot put its report there: without
    EPFLEET_REPORT_TO the sync still activates its model and the report names the mirror
    as read-only (nothing is written behind it); with it, the report goes there, and the
    fleet side (gc's pins, runtime-watch and the rollout gate's reader) reads it there."""
    report = mirror_fleet.sync()
    assert report.models[0].served and not report.report_uploaded
    assert "read-only mirror" in (report.report_error or ""), report.report_error
    assert not (mirror_fleet.site.directory / report_key(DEVICE)).exists()

    reports = tmp_path / "reports-store"
    monkeypatch.setenv("EPFLEET_REPORT_TO", str(reports))
    report = mirror_fleet.sync()
    assert report.report_uploaded, report.report_error
    assert decode_report((reports / report_key(DEVICE)).read_bytes(), 1 << 20).device_id == DEVICE
    assert not (mirror_fleet.site.directory / report_key(DEVICE)).exists()
    origin = open_store(mirror_fleet.site.publish_uri)
    assert [r.device_id for r in read_reports(origin)[0]] == [DEVICE]
    monkeypatch.delenv("EPFLEET_REPORT_TO")
    assert read_reports(origin) == ([], [])

    monkeypatch.setenv("EPFLEET_REPORT_TO", "ftp://nowhere/reports")
    with pytest.raises(BadInputError, match="EPFLEET_REPORT_TO"):
        mirror_fleet.sync()


def test_a_device_without_credentials_reads_a_public_bucket_unsigned(
    fleet_on_s3: Fleet, s3_proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EPFLEET_S3_UNSIGNED: a device with no AWS credentials at all syncs the signed fleet
    from a public bucket (moto, with a bucket policy letting anyone GET), every request
    it sends unsigned; its trust still comes from the signed metadata alone."""
    bucket = fleet_on_s3.site.uri.removeprefix("s3://").split("/")[0]
    public_read = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": "*",
                "Action": "s3:GetObject",
                "Resource": f"arn:aws:s3:::{bucket}/*",
            }
        ],
    }
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.put_bucket_policy(Bucket=bucket, Policy=json.dumps(public_read))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("EPFLEET_REPORT_TO", str(tmp_path / "reports"))
    refused = fleet_on_s3.sync()  # signing requests with no credentials: nothing can be read
    assert refused.exit_code == 1 and refused.models == [], refused
    assert "no usable AWS credentials" in (refused.manifest.reason or "")

    monkeypatch.setenv("EPFLEET_S3_UNSIGNED", "1")
    s3_proxy.log.clear()
    report = fleet_on_s3.sync()
    assert report.models[0].served and not report.manifest.offline, report.models[0].reason
    assert report.report_uploaded, report.report_error
    assert s3_proxy.log and not [seen for seen in s3_proxy.log if seen.signed]
