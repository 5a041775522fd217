"""One key belongs to one device, and a revoked key stays revoked (epfleet/fleet/evidence/enrolment.py):
``epfleet device enroll`` refuses a key enrolled for another device or revoked from one,
publishing nothing, and enrols a revoked key again only with ``--force``, for the device
it was revoked from, saying that its old reports count again; on a local store and on S3
over HTTP (moto)."""

from __future__ import annotations

from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.fleet.evidence.enrolment import keys_in_force
from epfleet.fleet.publishing.publish import read_in_force
from epfleet.formats.manifest import DeviceKey
from epfleet.stores import Store
from epfleet.trust.keys import read_private_key
from tests.support.signed_store import signed_store
from tests.support.tiers import on_stores

pytestmark = pytest.mark.fast


@pytest.fixture(params=on_stores("local", "s3"))
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Store:
    """A signed store with one model."""
    opened = signed_store(request, tmp_path, monkeypatch)
    return opened


def timestamp_version(store: Store) -> int:
    state = read_in_force(store).state
    assert state is not None and state.timestamp is not None
    return state.timestamp.signed.version


def keys(store: Store) -> dict[str, DeviceKey]:
    """The keys in force, from the signed key bins."""
    return dict(keys_in_force(store))


def revoked(store: Store) -> dict[str, str]:
    """Revoked key id -> the device it was revoked from, from the signed key bins."""
    records = keys_in_force(store).book.every_record()
    return {keyid: device for device, r in records.items() for keyid in r.revoked}


def public_key_of(private: Path, into: Path) -> Path:
    """The public half of a device key file, as ``--public-key`` takes it."""
    into.write_text(read_private_key(private).public_key.keyval["public"])
    return into


def enroll(store: Store, device: str, *extra: str) -> int:
    return main(["device", "enroll", device, "--store", store.uri, *extra])


def test_a_revoked_key_is_enrolled_again_only_with_force_and_says_so(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert enroll(store, "dev-000", "--keys", str(tmp_path / "keys")) == 0
    public = public_key_of(tmp_path / "keys" / "dev-000.pem", tmp_path / "dev-000.pub.pem")
    keyid = keys(store)["dev-000"].keyid
    assert main(["device", "revoke", "dev-000", "--store", store.uri]) == 0
    assert revoked(store) == {keyid: "dev-000"}
    version = timestamp_version(store)
    capsys.readouterr()

    assert enroll(store, "dev-000", "--public-key", str(public)) == 2
    err = capsys.readouterr().err
    assert f"key {keyid[:12]} of device 'dev-000' was revoked on" in err
    assert "a revoked key stays revoked" in err and "--force" in err
    assert timestamp_version(store) == version  # nothing published
    assert "dev-000" not in keys(store)

    assert enroll(store, "dev-000", "--public-key", str(public), "--force") == 0
    out, err = capsys.readouterr()
    assert f"enrolled dev-000 in {store.uri}: key {keyid[:12]}" in out
    assert "is enrolled again (--force): the reports it signed before its revocation" in err
    assert keys(store)["dev-000"].keyid == keyid
    assert revoked(store) == {}  # enrolled: no longer on the revoked list


def test_one_key_belongs_to_one_device(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert enroll(store, "dev-000", "--keys", str(tmp_path / "keys")) == 0
    public = public_key_of(tmp_path / "keys" / "dev-000.pem", tmp_path / "dev-000.pub.pem")
    keyid = keys(store)["dev-000"].keyid
    version = timestamp_version(store)
    capsys.readouterr()

    for extra in ([], ["--force"]):
        assert enroll(store, "dev-001", "--public-key", str(public), *extra) == 2
        err = capsys.readouterr().err
        assert f"key {keyid[:12]} is enrolled for device 'dev-000'" in err
        assert "one key belongs to one device; give 'dev-001' a key of its own" in err
    assert timestamp_version(store) == version
    assert set(keys(store)) == {"dev-000"}

    # revoked from dev-000, it still cannot become dev-001's, even with --force
    assert main(["device", "revoke", "dev-000", "--store", store.uri]) == 0
    capsys.readouterr()
    assert enroll(store, "dev-001", "--public-key", str(public), "--force") == 2
    err = capsys.readouterr().err
    assert f"key {keyid[:12]} was revoked from device 'dev-000' on" in err
    assert keys(store) == {}


def test_a_new_key_for_a_device_whose_key_was_revoked_is_enrolled(
    store: Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert enroll(store, "dev-000", "--keys", str(tmp_path / "old")) == 0
    old = keys(store)["dev-000"].keyid
    assert main(["device", "revoke", "dev-000", "--store", store.uri]) == 0
    capsys.readouterr()
    assert enroll(store, "dev-000", "--keys", str(tmp_path / "new")) == 0
    assert "revoked" not in capsys.readouterr().err
    assert keys(store)["dev-000"].keyid != old
    assert revoked(store) == {old: "dev-000"}  # the old key stays revoked
