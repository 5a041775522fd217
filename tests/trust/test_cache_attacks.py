"""Attacks on a device's own trust state: its trust cache lost or damaged while someone who
can write to the store (and holds no keys, or only retired ones) serves older metadata.

The device keeps a high-water mark of what it accepted (in ``.epfleet/state.json``, apart
from the trust directory ``.epfleet/trust/<id>/``) and a record of every root it verified,
so that an emptied or deleted trust directory is no way to a rollback, a damaged cached
root is reported and healed only from a root shown to be the same trust, and a device that
trusted a root never falls back to a development root planted beside the store.

Real syncs of the fleet compiled by `epfleet compile` (``fleet_store``, tests/conftest.py), on a
local store and on S3 (moto over HTTP, through the fault proxy), signed by
tests/support/signed_fleet.py's small TUF writer (``Repo``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata, Root

from epfleet.device.policy import SyncPolicy
from epfleet.device.session import SyncSession, sync
from epfleet.errors import BadInputError
from epfleet.formats.device_report import DeviceReport
from epfleet.stores import open_store
from epfleet.trust.client import trust_parts
from tests.support.signed_fleet import (
    DEVICE,
    MODEL,
    SERIALIZER,
    Fleet,
    Keys,
    Repo,
    assert_refused,
    first_sync,
    only,
    synthetic_store,
    trust_of,
)
from tests.support.synced_fleet import assert_package_runs, unsigned_copy

pytestmark = [pytest.mark.fast]


def sync_with_cached_root(fleet: Fleet, **options: object) -> DeviceReport:
    """A sync given no --trust-root: the device relies on its cache alone."""
    policy = SyncPolicy(models=[MODEL])
    return sync(fleet.site.uri, fleet.cache, policy, DEVICE, **options)  # type: ignore[arg-type]


def mark_of(fleet: Fleet) -> dict:
    """The device's high-water mark of the store's repository, as state.json has it."""
    state = json.loads((fleet.cache / ".epfleet" / "state.json").read_bytes())
    return state["trust"][trust_parts(open_store(fleet.site.uri).uri)[1]]


def corrupt_signatures(path: Path) -> None:
    document = json.loads(path.read_bytes())
    for signature in document["signatures"]:
        signature["sig"] = "00" * 64
    path.write_text(json.dumps(document))


def serve_timestamp(fleet: Fleet, data: bytes) -> None:
    (fleet.repo.meta / "timestamp.json").write_bytes(data)
    fleet.site.push()


# --- the trust cache lost -------------------------------------------------------------------


def test_a_rollback_after_the_trust_cache_is_emptied_is_refused(fleet: Fleet) -> None:
    first_sync(fleet)
    old = (fleet.repo.meta / "timestamp.json").read_bytes()  # version 1, still unexpired
    fleet.republish()
    newer = only(fleet.sync())
    assert newer.action == "downloaded", newer.reason
    assert mark_of(fleet)["timestamp"] == 2 and mark_of(fleet)["snapshot"] == 2
    trust = trust_of(fleet.cache, fleet.site.uri)
    for name in ("timestamp.json", "snapshot.json"):  # the cached metadata lost ...
        (trust / name).write_bytes(b"")
    current = (fleet.repo.meta / "timestamp.json").read_bytes()
    serve_timestamp(fleet, old)  # ... and the older signed set replayed

    report = fleet.sync()

    assert_refused(report, newer, "a rollback", "timestamp version 1, older than version 2")
    assert "state.json" in (report.manifest.reason or "")
    assert (trust / "timestamp.json").read_bytes() == b""  # the old set was never written
    serve_timestamp(fleet, current)
    again = fleet.sync()
    assert again.exit_code == 0 and only(again).variant == newer.variant, again.manifest


def refused_with_none_in_force(report: DeviceReport, reason: str) -> None:
    """A device that lost its trust cache is refused as any device is, with the report (and
    its exit code 1), and no manifest in force: it syncs no model."""
    assert report.exit_code == 1 and report.models == [], report
    assert report.manifest.status == "rejected" and report.manifest.generation is None
    assert reason in (report.manifest.reason or ""), report.manifest.reason
    assert "no signed manifest is cached to fall back on" in (report.manifest.reason or "")


def test_a_lost_trust_directory_is_no_way_to_a_rollback_nor_to_unsigned(fleet: Fleet) -> None:
    first_sync(fleet)
    old = (fleet.repo.meta / "timestamp.json").read_bytes()
    fleet.republish()
    newer = only(fleet.sync())
    shutil.rmtree(trust_of(fleet.cache, fleet.site.uri))
    serve_timestamp(fleet, old)

    # never the unsigned manifest.json
    refused_with_none_in_force(
        sync_with_cached_root(fleet, allow_unsigned=True), "trust cache was lost"
    )
    refused_with_none_in_force(  # provisioned again with the root it was first given
        fleet.sync(), "a rollback: the store serves timestamp version 1"
    )
    assert_package_runs(fleet.cache, {MODEL: newer.variant or ""})


def test_a_store_hiding_newer_roots_after_the_trust_cache_is_lost_is_refused(
    fleet: Fleet,
) -> None:
    first_sync(fleet)
    old_keys, new_keys = fleet.repo.keys, Keys()
    old = (fleet.repo.meta / "timestamp.json").read_bytes()  # signed under root 1
    fleet.repo.rotate_root(new_keys, [*old_keys.root[:2], *new_keys.root[:2]])
    fleet.republish()
    rotated = only(fleet.sync())
    assert rotated.action == "downloaded" and sorted(mark_of(fleet)["roots"]) == ["1", "2"]
    shutil.rmtree(trust_of(fleet.cache, fleet.site.uri))
    (fleet.repo.meta / "2.root.json").unlink()  # root 2 hidden: root 1's keys in force again
    serve_timestamp(fleet, old)

    refused_with_none_in_force(fleet.sync(), "root version 1, older than version 2")
    assert_package_runs(fleet.cache, {MODEL: rotated.variant or ""})


def test_a_store_initialised_again_is_followed_once_the_device_is_given_its_new_root(
    fleet: Fleet, tmp_path: Path
) -> None:
    first_sync(fleet)
    fleet.republish()
    newer = only(fleet.sync())
    assert mark_of(fleet)["timestamp"] == 2
    old_root = mark_of(fleet)["roots"]["1"]
    shutil.rmtree(fleet.site.directory / "trust")  # wiped, and a new repository from version 1
    repo = Repo(fleet.site.directory)
    fleet.site.push()
    new_root = tmp_path / "new-root.json"
    shutil.copy(repo.root_file, new_root)

    assert_refused(fleet.sync(), newer, "not signed by the trusted keys", "refused")
    with pytest.raises(BadInputError, match="not the root this device already trusts"):
        fleet.sync(trust_root=new_root)
    shutil.rmtree(trust_of(fleet.cache, fleet.site.uri))  # as that error says
    report = fleet.sync(trust_root=new_root)

    assert report.exit_code == 0 and only(report).variant == newer.variant, report.manifest
    assert any("another repository's" in w for w in report.warnings), report.warnings
    mark = mark_of(fleet)  # the new repository's, from its version 1
    assert mark["timestamp"] == 1 and list(mark["roots"]) == ["1"]
    assert mark["roots"]["1"] != old_root
    repo.publish()
    fleet.site.push()
    assert sync_with_cached_root(fleet).exit_code == 0 and mark_of(fleet)["timestamp"] == 2


# --- a damaged cached root ------------------------------------------------------------------


def test_a_damaged_cached_root_is_reported_and_replaced_only_from_the_same_root(
    fleet: Fleet, tmp_path: Path
) -> None:
    good = first_sync(fleet)
    cached = trust_of(fleet.cache, fleet.site.uri) / "root_history" / "1.root.json"
    corrupt_signatures(cached)

    report = sync_with_cached_root(fleet)

    assert_refused(report, good, str(cached), "is damaged", "signatures do not verify")
    assert "--trust-root" in (report.manifest.reason or "")
    assert "not signed by the trusted keys" not in (report.manifest.reason or "")  # not the store
    other = Repo(unsigned_copy(fleet.site.directory, tmp_path / "other"))
    with pytest.raises(BadInputError, match="cannot be shown to be the root this device trusted"):
        fleet.sync(trust_root=other.root_file)
    healed = fleet.sync()  # the genuine root it was provisioned with
    assert healed.exit_code == 0 and only(healed).action == "kept", healed.manifest
    assert any("replaced from --trust-root" in w for w in healed.warnings), healed.warnings
    assert cached.read_bytes() == fleet.root.read_bytes()
    assert sync_with_cached_root(fleet).exit_code == 0


def test_a_damaged_newest_root_is_verified_again_from_the_store_and_a_forged_one_refused(
    fleet: Fleet,
) -> None:
    first_sync(fleet)
    old_keys, new_keys = fleet.repo.keys, Keys()
    fleet.repo.rotate_root(new_keys, [*old_keys.root[:2], *new_keys.root[:2]])
    fleet.republish()
    rotated = only(fleet.sync())
    history = trust_of(fleet.cache, fleet.site.uri) / "root_history"
    genuine = (history / "2.root.json").read_bytes()
    recorded = mark_of(fleet)["roots"]["2"]
    corrupt_signatures(history / "2.root.json")

    healed = sync_with_cached_root(fleet)

    assert healed.exit_code == 0 and only(healed).action == "kept", healed.manifest
    assert any("started from the intact root version 1" in w for w in healed.warnings)
    assert (history / "2.root.json").read_bytes() == genuine

    # Whoever kept the retired root keys serves another root 2, handing the online roles to
    # a key of their own, while the device's copy of root 2 is damaged.
    forged = Metadata[Root].from_bytes((fleet.repo.meta / "1.root.json").read_bytes())
    forged.signed.version = 2
    attacker = CryptoSigner.generate_ecdsa()
    for role in ("snapshot", "timestamp"):
        for keyid in list(forged.signed.roles[role].keyids):
            forged.signed.revoke_key(keyid, role)
        forged.signed.add_key(attacker.public_key, role)
    forged.signatures.clear()
    for signer in old_keys.root[:2]:
        forged.sign(signer, append=True)
    (fleet.repo.meta / "2.root.json").write_bytes(forged.to_bytes(SERIALIZER))
    fleet.site.push()
    corrupt_signatures(history / "2.root.json")

    report = sync_with_cached_root(fleet)

    assert_refused(report, rotated, "not the one this device verified", "refused")
    kept = Metadata[Root].from_bytes((history / "2.root.json").read_bytes())
    assert kept.signed_bytes != forged.signed_bytes  # the forged root was never written
    assert mark_of(fleet)["roots"]["2"] == recorded


def test_a_device_that_trusted_a_root_never_falls_back_to_a_development_root(
    tmp_path: Path,
) -> None:
    """Local store only: the development root lives beside a local store."""
    from epfleet.trust.repository import development_keys_dir, init_with_key_files

    store = synthetic_store(tmp_path / "store", 3)
    init_with_key_files(open_store(str(store)), development_keys_dir(store), bins=16, adopt=True)
    cache, policy = tmp_path / "device", SyncPolicy(models=["model-001"])
    with SyncSession(str(store), cache, policy, DEVICE) as session:  # the README's first sync
        assert session.fetch_manifest().warning, "trusts the development root, and says so"
    cached = trust_of(cache, str(store)) / "root_history" / "1.root.json"
    cached.write_bytes(cached.read_bytes()[:100])  # truncated
    planted = Repo(synthetic_store(tmp_path / "elsewhere", 3))  # someone beside the store
    (development_keys_dir(store) / "root.json").write_bytes(planted.root_file.read_bytes())

    with SyncSession(str(store), cache, policy, DEVICE) as session:
        status = session.fetch_manifest()

    assert status.status == "rejected" and status.signed and not status.warning, status
    assert f"{cached} is damaged (not root metadata" in (status.reason or "")
    assert cached.read_bytes() != planted.root_file.read_bytes()
    shutil.rmtree(cached.parent.parent)  # the whole trust directory lost: still no fallback
    with SyncSession(str(store), cache, policy, DEVICE) as session:
        status = session.fetch_manifest()
    assert status.status == "rejected" and status.generation is None, status
    assert "trust cache was lost" in (status.reason or "")


def test_a_first_sync_killed_during_its_refresh_still_trusts_the_development_root(
    tmp_path: Path,
) -> None:
    """A sync killed during its first refresh leaves a staging copy of the trust directory
    (its root written) and a temporary file in the root history: the device trusted
    nothing yet, so the next sync trusts the development root as the first would have."""
    from epfleet.trust.repository import development_keys_dir, init_with_key_files

    store = synthetic_store(tmp_path / "store", 3)
    init_with_key_files(open_store(str(store)), development_keys_dir(store), bins=16, adopt=True)
    cache, policy = tmp_path / "device", SyncPolicy(models=["model-001"])
    history = trust_of(cache, str(store)) / "root_history"
    history.mkdir(parents=True)
    (history / ".1.root.json.abcd1234.tmp").write_bytes(b'{"signed": {"_type": "ro')
    staging = history.parent.parent / f".staging-{history.parent.name}-z3ats2wl"
    (staging / "root_history").mkdir(parents=True)  # the refresh's copy, its root written
    shutil.copy(development_keys_dir(store) / "root.json", staging / "root_history" / "1.root.json")

    with SyncSession(str(store), cache, policy, DEVICE) as session:
        status = session.fetch_manifest()

    assert status.status != "rejected" and status.signed, status
    assert status.warning and "development root" in status.warning, status
    assert (history / "1.root.json").is_file()
