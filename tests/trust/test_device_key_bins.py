"""Enrolled device keys live in signed hashed bins of their own (epfleet/trust/device_keys.py),
listed in a signed keys index, on a local store and on S3 over HTTP (moto): an enrolment
signs one key bin (two for a key new to the store: its claim's bin) and the keys index,
never the snapshot, the timestamp, the manifest or a model's bin; racing enrolments lose
nothing; a device's sync reads no key bin; readers look a device's key up in its bin only;
a key bin or keys index forged, tampered with or replayed by someone without the online
key is refused by name, and a report signed by a key only such a bin names does not count;
a store whose manifest still carries keys, or whose snapshot lists the key bins, is read
as it is until ``epfleet device migrate-keys`` (or the next enrolment) moves them."""

from __future__ import annotations

import shutil
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from securesystemslib.signer import SSlibKey
from tuf.api.metadata import Metadata, MetaFile, Snapshot, TargetFile, Targets, Timestamp

from epfleet.cli.app import main
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.errors import TrustLost, Unverified
from epfleet.fleet.evidence.enrolment import (
    enroll,
    enrolled_keys,
    key_entry,
    keys_in_force,
    local_key_bins,
    revoke,
)
from epfleet.fleet.evidence.enrolment import public_key_file as read_public_key
from epfleet.fleet.evidence.fleet_reports import index_pass
from epfleet.fleet.publishing.publish import read_in_force, read_manifest, update_manifest
from epfleet.fleet.rollout.rollouts import read_evidence
from epfleet.formats.device_report import encode_report, report_key
from epfleet.formats.manifest import Manifest, RevokedKey, utcnow
from epfleet.settings import settings
from epfleet.stores import Store
from epfleet.trust.device_keys import (
    DeviceRecord,
    KeyClaim,
    key_bins_changed,
    new_keys_index,
    record_target,
)
from epfleet.trust.keys import (
    generate_online_file,
    load_offline,
    new_key,
    online_signer,
    public_key_of,
    read_private_key,
)
from epfleet.trust.layout import KEYS_INDEX_KEY, METADATA_KEYS, TIMESTAMP_KEY, metadata_key
from epfleet.trust.pins import RECORDS_DIR
from epfleet.trust.repository import development_root, rotate_online_key
from epfleet.trust.signers import signer_for
from epfleet.trust.signing import (
    SERIALIZER,
    Changes,
    publish_signed,
    sign_metadata,
    write_versioned,
)
from epfleet.trust.state import clear_cache
from tests.support.signed_store import signed_store, stage
from tests.support.staged_rollout import MEMBERS, POLICY, ROLLOUT, report
from tests.support.tiers import on_stores

pytestmark = pytest.mark.fast

SIGNED_ROLLOUT = ROLLOUT.model_copy(
    update={"policy": POLICY.model_copy(update={"authenticated_reports": True, "min_reports": 1})}
)


@pytest.fixture(params=on_stores("local", "s3"))
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A signed store, model-0 under a rollout that counts only signed reports."""
    opened = signed_store(request, tmp_path, monkeypatch)
    stage(opened, SIGNED_ROLLOUT)
    return opened


def new_machine() -> None:
    """What a reader or publisher on another machine starts with: nothing verified, in
    memory or kept."""
    clear_cache()
    shutil.rmtree(local_key_bins(), ignore_errors=True)
    for mark in (settings().cache / RECORDS_DIR).glob("*.keys-index.json"):
        mark.unlink()


def keys_files(store: Store) -> dict[str, bytes]:
    """The keys index and every key bin file in the store, by key."""
    found = {}
    for key in store.list_keys(METADATA_KEYS):
        if key == KEYS_INDEX_KEY or ".keys-" in key:
            read = store.read(key)
            assert read is not None
            found[key] = read.data
    return found


def put_back(store: Store, files: dict[str, bytes]) -> None:
    """What a store writer without the keys can do: the keys index and key bins as they
    were (``files``), the key bin files signed since deleted."""
    for key in set(keys_files(store)) - set(files):
        store.delete(key)
    for key, data in files.items():
        store.write(key, data)


def snapshot_versions(store: Store) -> dict[str, int]:
    state = read_in_force(store).state
    assert state is not None and state.snapshot is not None
    return {name: meta.version for name, meta in state.snapshot.signed.meta.items()}


def index_versions(store: Store) -> dict[str, int]:
    """Key bin -> the version the keys index signs."""
    listing = keys_in_force(store).book.listing()
    return {name.removesuffix(".json"): meta.version for name, meta in listing.items()}


def key_bin_of(store: Store, device: str) -> tuple[str, int]:
    """The name of ``device``'s key bin and the version the keys index signs."""
    book = keys_in_force(store).book
    name = book.bin_of(record_target(DeviceRecord(device=device)).info.path)
    return name, index_versions(store)[name]


def what_devices_poll(store: Store) -> tuple[bytes, bytes]:
    """The timestamp and the snapshot it signs, as a device downloads them."""
    timestamp = store.read(TIMESTAMP_KEY)
    state = read_in_force(store).state
    assert timestamp is not None and state is not None and state.snapshot is not None
    snapshot = store.read(metadata_key("snapshot", state.snapshot.signed.version))
    assert snapshot is not None
    return timestamp.data, snapshot.data


def test_an_enrolment_signs_its_key_bins_only_and_readers_read_only_theirs(
    store: Store, tmp_path: Path
) -> None:
    polled = what_devices_poll(store)
    enroll(store, "dev-000", keys_dir=tmp_path / "keys")
    before = index_versions(store)
    generation = read_manifest(store)[0]
    enroll(store, "dev-001", keys_dir=tmp_path / "keys")
    after = index_versions(store)
    changed = sorted(n for n, v in after.items() if before.get(n) != v)
    assert 1 <= len(changed) <= 2 and all(n.startswith("keys-") for n in changed), changed
    enroll(store, "dev-002", keys_dir=tmp_path / "keys")
    revoke(store, "dev-002")
    assert what_devices_poll(store) == polled  # devices download nothing new
    assert not [n for n in snapshot_versions(store) if n.startswith("keys-")]
    manifest = read_in_force(store).manifest
    assert manifest is not None and manifest.device_keys == {}
    assert read_manifest(store)[0] == generation  # neither the manifest nor its copy moved

    new_machine()
    keys = keys_in_force(store)
    found = keys.get("dev-001")
    assert found is not None and keys.book.bins_read == 1  # its bin, no other
    wanted = enrolled_keys(store, ["dev-000", "dev-001", "dev-999"])
    assert sorted(wanted) == ["dev-000", "dev-001"] and wanted["dev-001"] == found
    assert sorted(keys) == ["dev-000", "dev-001"]
    clear_cache()  # a new process on the same machine: the bins it verified are kept
    again = keys_in_force(store)
    assert again.get("dev-001") == found and again.book.bins_read == 0


def test_racing_enrolments_and_revocations_lose_nothing(store: Store, tmp_path: Path) -> None:
    devices = [f"dev-{i:03d}" for i in range(8)]
    public = {d: public_key_file(tmp_path / "public", d) for d in devices}
    errors: list[BaseException] = []

    def enrol_some(mine: list[str]) -> None:
        try:
            for device in mine:
                enroll(store, device, public_key=public[device])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enrol_some, args=(devices[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert sorted(keys_in_force(store)) == devices
    revokers = [threading.Thread(target=revoke, args=(store, d)) for d in devices[:3]]
    for thread in revokers:
        thread.start()
    for thread in revokers:
        thread.join()
    assert sorted(keys_in_force(store)) == devices[3:]
    records = keys_in_force(store).book.every_record()
    assert all(len(records[d].revoked) == 1 for d in devices[:3])


def public_key_file(folder: Path, device: str) -> Path:
    """A public key file for ``device``, as a device that makes its own key gives it."""
    folder.mkdir(exist_ok=True)
    path = folder / f"{device}.pub.pem"
    path.write_text(new_key().public_key.keyval["public"])
    return path


def forged_bin(store: Store, name: str, version: int, device: str, key: SSlibKey) -> bytes:
    """What a store writer without the online key can make: key bin ``name`` at
    ``version`` naming ``key`` for ``device``, signed by a key of their own."""
    signed = read_in_force(store).state
    assert signed is not None
    target = record_target(DeviceRecord(device=device, key=key_entry(key)))
    forged = Targets(version=version, targets={target.info.path: target.info})
    metadata = Metadata(forged)
    metadata.sign(new_key())
    return metadata.to_bytes(SERIALIZER)


def test_forged_tampered_and_replayed_key_bins_are_refused(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    device = MEMBERS[0]
    enroll(store, device, keys_dir=tmp_path / "keys")
    member = read_private_key(tmp_path / "keys" / f"{device}.pem")
    attacker = new_key()
    assert isinstance(attacker.public_key, SSlibKey)
    name, version = key_bin_of(store, device)

    # a forged next version, which no keys index names: ignored; the attacker's report does
    # not count, the member's own does
    store.write(
        metadata_key(name, version + 1),
        forged_bin(store, name, version + 1, device, attacker.public_key),
    )
    store.write(report_key(device), encode_report(report(device, True, "kept"), attacker))
    clear_cache()
    [status] = read_evidence(store).statuses
    assert status.evidence.new.devices == 0
    assert status.evidence.not_attributed == {"bad signature": 1}
    store.write(report_key(device), encode_report(report(device, True, "failed"), member))
    [status] = read_evidence(store).statuses
    assert (status.evidence.new.devices, status.evidence.new.failed) == (1, 1)
    store.delete(metadata_key(name, version + 1))

    # the signed version replaced: forged (another key), tampered (same length), replayed
    # (an older version of the same bin, put back)
    real = store.read(metadata_key(name, version))
    assert real is not None
    revoke(store, device)
    enroll(store, device, keys_dir=tmp_path / "new-keys", force=True)
    name, latest = key_bin_of(store, device)
    current = store.read(metadata_key(name, latest))
    assert current is not None and latest > version
    at = current.data.index(b'"sig":"') + len(b'"sig":"')
    tampered = current.data[:at] + (b"0" if current.data[at : at + 1] != b"0" else b"1")
    tampered += current.data[at + 1 :]
    cases = {
        "forged": forged_bin(store, name, latest, device, attacker.public_key),
        "tampered": tampered,
        "replayed": real.data,
    }
    for case, data in cases.items():
        store.write(metadata_key(name, latest), data)
        new_machine()
        with pytest.raises(Unverified, match=f"signed key bin {name}"):
            enrolled_keys(store, [device])
        with pytest.raises(Unverified, match=f"signed key bin {name}"):
            read_evidence(store)
        assert main(["device", "list", "--store", store.uri]) != 0, case
        assert f"signed key bin {name}" in capsys.readouterr().err, case
    store.write(metadata_key(name, latest), current.data)
    clear_cache()
    new_key_of_device = enrolled_keys(store, [device])[device]
    assert new_key_of_device.keyid != member.public_key.keyid


def test_a_manifest_that_carries_keys_is_read_until_they_are_moved(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store enrolled by an older epfleet: its signed manifest carries the keys."""
    member, gone = new_key(), new_key()
    assert isinstance(member.public_key, SSlibKey) and isinstance(gone.public_key, SSlibKey)
    device = MEMBERS[0]

    def old_enrolment(current: Manifest | None) -> Manifest | None:
        assert current is not None
        revoked = {gone.public_key.keyid: RevokedKey(device="dev-old", revoked_at=utcnow())}
        return current.succeeded_by(dict(current.models), utcnow()).model_copy(
            update={
                "device_keys": {device: key_entry(member.public_key)},
                "revoked_device_keys": revoked,
            }
        )

    update_manifest(store, old_enrolment)
    assert list(keys_in_force(store)) == [device]
    store.write(report_key(device), encode_report(report(device, True, "failed"), member))
    [status] = read_evidence(store).statuses
    assert (status.evidence.new.devices, status.evidence.new.failed) == (1, 1)

    gone_file = tmp_path / "gone.pub.pem"
    gone_file.write_text(gone.public_key.keyval["public"])
    code = main(
        ["device", "enroll", "dev-new", "--store", store.uri, "--public-key", str(gone_file)]
    )
    assert code == 2 and "was revoked from device 'dev-old'" in capsys.readouterr().err

    assert main(["device", "migrate-keys", "--store", store.uri]) == 0
    assert "moved the keys of 2 devices" in capsys.readouterr().out
    manifest = read_in_force(store).manifest
    assert manifest is not None and manifest.device_keys == {}
    assert manifest.revoked_device_keys == {}
    copy = read_manifest(store)[0]
    assert copy is not None and copy.device_keys == {}
    clear_cache()
    assert list(keys_in_force(store)) == [device]
    [status] = read_evidence(store).statuses
    assert (status.evidence.new.devices, status.evidence.new.failed) == (1, 1)
    code = main(
        ["device", "enroll", "dev-new", "--store", store.uri, "--public-key", str(gone_file)]
    )
    assert code == 2 and "was revoked from device 'dev-old'" in capsys.readouterr().err
    assert main(["device", "migrate-keys", "--store", store.uri]) == 0
    assert "nothing to move" in capsys.readouterr().out


def test_a_publisher_refuses_to_sign_over_a_keys_index_put_back(
    store: Store,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    devices = [f"dev-{i:03d}" for i in range(6)]
    public = {d: public_key_file(tmp_path / "public", d) for d in devices}
    enroll(store, devices[0], public_key=public[devices[0]])
    enroll(store, devices[1], public_key=public[devices[1]])
    older = keys_files(store)
    older_version = keys_in_force(store).book.index.signed.version  # type: ignore[union-attr]
    revoke(store, devices[0])
    enroll(store, devices[2], public_key=public[devices[2]])
    newest = keys_in_force(store).book.index.signed.version  # type: ignore[union-attr]

    put_back(store, older)  # the revocation of dev-000 gone
    clear_cache()  # a new process on the publishing host
    rolled_back = keys_files(store)
    for attempt in (
        lambda: enroll(store, devices[3], public_key=public[devices[3]]),
        lambda: revoke(store, devices[1]),
    ):
        with pytest.raises(
            TrustLost, match=f"is version {older_version}, older than version {newest}"
        ):
            attempt()
        assert keys_files(store) == rolled_back  # nothing written
    code = main(
        [
            "device",
            "enroll",
            devices[3],
            "--store",
            store.uri,
            "--public-key",
            str(public[devices[3]]),
        ]
    )
    err = capsys.readouterr().err
    assert code == 1 and f"older than version {newest}" in err and "nothing was signed" in err
    assert keys_files(store) == rolled_back

    polled = what_devices_poll(store)
    assert main(["trust", "refresh", "--store", store.uri]) == 0  # the rest is signed
    assert what_devices_poll(store) != polled and keys_files(store) == rolled_back
    assert f"older than version {newest}" in caplog.text

    store.delete(KEYS_INDEX_KEY)  # the index deleted: every key would be lost
    clear_cache()
    with pytest.raises(TrustLost, match=f"is missing, but version {newest}"):
        enroll(store, devices[3], public_key=public[devices[3]])
    assert store.size(KEYS_INDEX_KEY) is None
    put_back(store, older)

    # a fresh publisher (another host, no mark) cannot tell: it signs over the rollback
    # until its index's version passes the newest; the publisher that knew the newest
    # then refuses by the key bins it saw signed later than the laundered index lists them
    mark = next((settings().cache / RECORDS_DIR).glob("*.keys-index.json"))
    kept = mark.read_bytes()
    new_machine()
    for device in devices[3:]:
        enroll(store, device, public_key=public[device])
    laundered = keys_in_force(store).book.index.signed
    assert laundered is not None and laundered.version >= newest
    assert "dev-000" in keys_in_force(store)  # its revocation lost
    mark.write_bytes(kept)
    clear_cache()
    with pytest.raises(TrustLost, match="another publisher signed it over an older keys index"):
        revoke(store, devices[1])


def test_a_device_sync_reads_no_key_bin(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for i in range(20):
        enroll(store, f"dev-{i:03d}", keys_dir=tmp_path / "keys")
    read: list[str] = []
    kind = type(store)
    plain_read, plain_range = kind.read, kind.read_range

    def reading(self: Store, key: str) -> object:
        read.append(key)
        return plain_read(self, key)

    def reading_range(self: Store, key: str, *args: object, **kwargs: object) -> object:
        read.append(key)
        return plain_range(self, key, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kind, "read", reading)
    monkeypatch.setattr(kind, "read_range", reading_range)
    root = trust_root(store, tmp_path)
    sync(store.uri, tmp_path / "device", SyncPolicy(), "dev-000", trust_root=root)
    assert any(k.endswith("snapshot.json") for k in read), read
    assert [k for k in read if ".keys-" in k or "device-key" in k] == []


def trust_root(store: Store, tmp_path: Path) -> Path:
    local = development_root(store.uri)
    return local if local is not None else tmp_path / "fleet-keys" / "root.json"


def test_target_records_are_what_the_bins_sign() -> None:
    key = new_key().public_key
    assert isinstance(key, SSlibKey)
    record = DeviceRecord(device="dev-1", key=key_entry(key))
    target = record_target(record)
    assert isinstance(target.info, TargetFile) and target.info.path == "device-keys/dev-1"
    assert DeviceRecord.model_validate_json(target.data) == record


def test_an_index_pass_reads_only_the_key_bins_that_changed(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("epfleet.fleet.evidence.index_rules.SETTLE_SECONDS", 0.0)
    devices = MEMBERS[:4]
    for device in devices:
        enroll(store, device, keys_dir=tmp_path / "keys")
        signer = read_private_key(tmp_path / "keys" / f"{device}.pem")
        store.write(report_key(device), encode_report(report(device, True, "kept"), signer))

    def one_pass() -> tuple[int, int, int]:
        """Reports read, key bins read, reports whose signature verified with a key in force."""
        if store.uri.startswith("s3://"):
            time.sleep(1.05)  # S3 lists whole seconds: what was written before is settled
        clear_cache()  # a new process: nothing verified is kept
        keys = keys_in_force(store)
        found = index_pass(store, keys)
        verified = [r for r in found.records.values() if r["signature"]["verified"]]
        return found.reports_read, keys.book.bins_read, len(verified)

    assert one_pass() == (4, len({key_bin_of(store, d)[0] for d in devices}), 4)
    assert one_pass() == (0, 0, 4)  # the key bins unchanged: none read
    revoke(store, devices[0])
    read, bins, verified = one_pass()
    assert (read, verified) == (1, 3) and bins >= 1  # the revoked device's report read again
    assert one_pass() == (0, 0, 3)


def test_an_online_key_rotation_signs_the_key_bins_again(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    enroll(store, "dev-000", keys_dir=tmp_path / "keys")
    enroll(store, "dev-001", keys_dir=tmp_path / "keys")
    local = development_root(store.uri)
    keys_dir = local.parent if local is not None else tmp_path / "fleet-keys"
    new_uri = generate_online_file(tmp_path / "new-online.pem")
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", new_uri)
    before = index_versions(store)
    index_before = keys_in_force(store).book.index.signed
    assert index_before is not None

    rotate_online_key(store, load_offline(keys_dir), online_signer(new_uri, public_key_of(new_uri)))

    clear_cache()
    after = index_versions(store)
    assert before and all(after[n] > v for n, v in before.items())  # each signed again
    index_after = keys_in_force(store).book.index.signed
    assert index_after is not None and index_after.version > index_before.version
    clear_cache()
    assert sorted(enrolled_keys(store, ["dev-000", "dev-001"])) == ["dev-000", "dev-001"]
    revoke(store, "dev-000")  # signing goes on with the new key
    assert sorted(keys_in_force(store)) == ["dev-001"]


def test_an_older_or_forged_keys_index_is_refused(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    device = MEMBERS[0]
    enroll(store, device, keys_dir=tmp_path / "keys")
    older = store.read(KEYS_INDEX_KEY)
    assert older is not None
    revoke(store, device)
    assert enrolled_keys(store, [device]) == {}  # this machine verified the newer index
    newer = store.read(KEYS_INDEX_KEY)
    assert newer is not None

    # put back: the older index, which still lists the bin naming the revoked key
    store.write(KEYS_INDEX_KEY, older.data)
    clear_cache()  # a new process on the same machine
    with pytest.raises(Unverified, match="older than version"):
        enrolled_keys(store, [device])
    assert main(["device", "list", "--store", store.uri]) != 0
    assert "older than version" in capsys.readouterr().err

    # forged: signed by another key; a snapshot (signed by the online key) in its place
    state = read_in_force(store).state
    assert state is not None and state.snapshot is not None
    forged = Metadata(new_keys_index(99, utcnow().replace(year=2099), {}))
    forged.sign(new_key())
    snapshot = store.read(metadata_key("snapshot", state.snapshot.signed.version))
    assert snapshot is not None
    for case, data in {"forged": forged.to_bytes(SERIALIZER), "a snapshot": snapshot.data}.items():
        store.write(KEYS_INDEX_KEY, data)
        new_machine()
        with pytest.raises(Unverified, match="signed keys index"):
            enrolled_keys(store, [device])
        assert main(["device", "list", "--store", store.uri]) != 0, case
        assert "keys-index.json" in capsys.readouterr().err, case
        with pytest.raises(Unverified, match="signed keys index"):
            enroll(store, "dev-other", keys_dir=tmp_path / "other-keys")
    store.write(KEYS_INDEX_KEY, newer.data)
    new_machine()
    assert enrolled_keys(store, [device]) == {}


def previous_layout(store: Store) -> None:
    """What the previous release left: the key bins listed in the snapshot, no keys index."""
    state = read_in_force(store).state
    assert state is not None and state.snapshot is not None and state.timestamp is not None
    listing = keys_in_force(store).book.listing()
    signer = signer_for(store)
    assert signer is not None
    meta = dict(state.snapshot.signed.meta)
    meta |= {name: MetaFile(m.version, length=m.length) for name, m in listing.items()}
    snapshot = Snapshot(
        version=state.snapshot.signed.version + 1, expires=state.snapshot.signed.expires, meta=meta
    )
    raw = write_versioned(store, "snapshot", snapshot, [signer])
    timestamp = Timestamp(
        version=state.timestamp.signed.version + 1,
        expires=state.timestamp.signed.expires,
        snapshot_meta=MetaFile.from_data(snapshot.version, raw, ["sha256"]),
    )
    store.write(TIMESTAMP_KEY, sign_metadata(timestamp, [signer]))
    store.delete(KEYS_INDEX_KEY)
    new_machine()


@pytest.mark.parametrize("moved_by", ["enrolment", "migrate-keys"])
def test_a_store_whose_snapshot_lists_the_key_bins_is_read_until_they_move(
    store: Store, tmp_path: Path, moved_by: str, capsys: pytest.CaptureFixture[str]
) -> None:
    enroll(store, "dev-000", keys_dir=tmp_path / "keys")
    enroll(store, "dev-001", keys_dir=tmp_path / "keys")
    previous_layout(store)
    assert [n for n in snapshot_versions(store) if n.startswith("keys-")]
    assert sorted(keys_in_force(store)) == ["dev-000", "dev-001"]
    root = trust_root(store, tmp_path)
    sync(store.uri, tmp_path / "device", SyncPolicy(), "dev-000", trust_root=root)

    listed = len(keys_in_force(store).book.listing())
    if moved_by == "enrolment":
        enroll(store, "dev-002", keys_dir=tmp_path / "keys")
    else:
        assert main(["device", "migrate-keys", "--store", store.uri]) == 0
        out = capsys.readouterr().out
        assert f"moved the listing of {listed} key bins from the snapshot" in out, out
        assert "nothing to move" not in out
    assert store.size(KEYS_INDEX_KEY) is not None
    assert not [n for n in snapshot_versions(store) if n.startswith("keys-")]
    new_machine()
    enrolled = ["dev-000", "dev-001"] + (["dev-002"] if moved_by == "enrolment" else [])
    assert sorted(keys_in_force(store)) == enrolled
    sync(store.uri, tmp_path / "device", SyncPolicy(), "dev-000", trust_root=root)
    polled = what_devices_poll(store)
    revoke(store, "dev-001")
    assert what_devices_poll(store) == polled


def test_a_batch_enrolment_signs_each_key_bin_once(
    store: Store,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = tmp_path / "batch"
    (folder / "public").mkdir(parents=True)
    given = [f"dev-{i:03d}" for i in range(30)]
    made_here = [f"dev-{i:03d}" for i in range(30, 40)]
    lines = ["# new devices, week 49", ""]
    lines += [f"{d} public/{public_key_file(folder / 'public', d).name}" for d in given]
    lines += [f"{d}  # its key made here" for d in made_here]
    batch = folder / "devices.txt"
    batch.write_text("\n".join(lines) + "\n")
    polled = what_devices_poll(store)
    written: list[str] = []
    kind = type(store)
    plain_write = kind.write

    def writing(self: Store, key: str, *args: object, **kwargs: object) -> object:
        written.append(key)
        return plain_write(self, key, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kind, "write", writing)
    keys = tmp_path / "device-keys"
    args = ["device", "enroll", "--from", str(batch), "--store", store.uri, "--keys", str(keys)]
    assert main(["device", "enroll", "--store", store.uri, "--keys", str(tmp_path / "k")]) == 2
    assert "give a DEVICE id, or --from FILE" in capsys.readouterr().err
    assert main(args) == 0
    out = capsys.readouterr().out
    signed_bins = [k for k in written if ".keys-" in k]
    assert written.count(KEYS_INDEX_KEY) == 1
    assert len(signed_bins) == len(set(signed_bins))  # each key bin signed once
    assert f"enrolled 40 devices in {store.uri} in one signed publish" in out
    assert f"({len(signed_bins)} key bins and the keys index signed)" in out
    assert sorted(written) == sorted([*signed_bins, KEYS_INDEX_KEY])  # nothing else
    assert what_devices_poll(store) == polled
    new_machine()
    assert sorted(keys_in_force(store)) == given + made_here
    assert sorted(p.stem for p in keys.glob("*.pem")) == made_here
    revoke(store, given[0])

    # one bad line refuses the whole batch, by name, before anything is written
    twin = public_key_file(folder / "public", "dev-twin")
    (folder / "public" / "not-a-key.pem").write_text("not a key")
    cases = {
        "Bad_Id": (3, "device id 'Bad_Id'"),
        "dev-100\ndev-100": (4, "is given already on"),
        "dev-100 public/missing.pem": (3, "not a readable PEM public key"),
        "dev-100 public/not-a-key.pem": (3, "not a readable PEM public key"),
        f"dev-100 public/{twin.name}\ndev-101 public/{twin.name}": (4, "is the key of 'dev-100'"),
        "dev-100 a b": (3, "has 3 fields"),
        f"{given[1]}": (3, f"device {given[1]!r} is enrolled already"),
        f"dev-100 public/{given[2]}.pub.pem": (3, f"is enrolled for device {given[2]!r}"),
        f"{given[0]} public/{given[0]}.pub.pem": (3, "was revoked on"),
    }
    before = keys_files(store)
    more_keys = tmp_path / "more-keys"
    again = [
        "device",
        "enroll",
        "--from",
        str(batch),
        "--store",
        store.uri,
        "--keys",
        str(more_keys),
    ]
    for bad, (line, why) in cases.items():
        batch.write_text(f"dev-200\ndev-201\n{bad}\ndev-202\n")
        written.clear()
        assert main(again) == 2, bad
        err = capsys.readouterr().err
        assert f"{batch}:{line}" in err and why in err, (bad, err)
        assert written == [] and keys_files(store) == before, bad
        assert not list(more_keys.glob("*.pem")), bad


def test_an_expired_keys_index_or_key_bin_is_refused_until_a_refresh(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    public = {d: public_key_file(tmp_path / "public", d) for d in ("dev-a", "dev-b", "dev-c")}
    enroll(store, "dev-a", public_key=public["dev-a"])
    late = key_entry(read_public_key(public["dev-b"]))
    signer = signer_for(store)
    assert signer is not None
    year_and_more_ago = utcnow() - timedelta(days=400)  # signed then: expired 35 days ago
    records: list[DeviceRecord | KeyClaim] = [
        DeviceRecord(device="dev-b", key=late),
        KeyClaim(keyid=late.keyid, device="dev-b"),
    ]
    publish_signed(
        store,
        signer,
        year_and_more_ago,
        Changes(keys=lambda book: key_bins_changed(book, records)),
    )
    new_machine()
    with pytest.raises(Unverified, match=r"keys-index.json expired on .*epfleet trust refresh"):
        enrolled_keys(store, ["dev-a"])
    assert main(["device", "list", "--store", store.uri]) == 1
    assert "sign it again (and the key bins near expiry) with epfleet trust refresh" in (
        capsys.readouterr().err
    )

    enroll(store, "dev-c", public_key=public["dev-c"])  # signs the keys index again
    b_bin, b_version = key_bin_of(store, "dev-b")
    assert b_bin not in {key_bin_of(store, "dev-c")[0], key_bin_of(store, "dev-a")[0]}
    new_machine()
    assert list(enrolled_keys(store, ["dev-a", "dev-c"])) == ["dev-a", "dev-c"]
    expired = f"the signed key bin {b_bin} \\(version {b_version}\\) expired on"
    with pytest.raises(Unverified, match=expired):
        enrolled_keys(store, ["dev-b"])
    assert main(["trust", "status", "--store", store.uri]) == 0
    status = capsys.readouterr().out
    first_to_expire = f"version 1      expires {year_and_more_ago + timedelta(days=365):%Y-%m-%d}"
    assert "keys index " in status and "key bins (first to expire: keys-" in status
    assert first_to_expire in status, status

    assert main(["trust", "refresh", "--store", store.uri]) == 0
    assert b_bin in capsys.readouterr().out
    new_machine()
    assert sorted(enrolled_keys(store, ["dev-a", "dev-b", "dev-c"])) == ["dev-a", "dev-b", "dev-c"]
    assert main(["trust", "refresh", "--store", store.uri]) == 0
    assert b_bin not in capsys.readouterr().out  # fresh now: not signed again
