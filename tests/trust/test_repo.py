"""The publishing side of signed distribution: the TUF metadata epfleet.trust.repository
writes, checked by the device side's client (python-tuf's ngclient over the store), on a
local store and on S3 (moto over HTTP).

The slow tests at the end run the whole path: ``epfleet compile`` publishes to a store
with trust metadata (development keys made for a local store, or ``trust init`` on S3),
and a device that trusts only that root syncs and activates the variants.
"""

from __future__ import annotations

import fcntl
import json
import stat
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from epfleet.errors import BadInputError, StoreError
from epfleet.fleet.publishing.publish import read_manifest, update_manifest
from epfleet.formats.manifest import Manifest, ModelEntry
from epfleet.stores import MANIFEST_KEY, Store, open_store
from epfleet.trust import rotation
from epfleet.trust.client import ROOT_HISTORY, verify
from epfleet.trust.keys import generate_online_file, load_offline, new_key
from epfleet.trust.repository import (
    TIMESTAMP_KEY,
    development_keys_dir,
    init_with_key_files,
    latest_root,
    publish_trust,
    read_state,
    refresh,
    rotate_online_key,
    rotate_root_keys,
)
from epfleet.trust.signers import DEVELOPMENT_LOCK, signer_for
from tests.support.publish_helpers import publish_new, race
from tests.support.signed_records import (
    Records,
    entry,
    signed_manifest,
    signed_models,
    write_manifest,
)
from tests.support.trust_helpers import make_trusted_store, online_key

pytestmark = pytest.mark.fast


def metadata_files(store: Store) -> set[str]:
    return set(store.list_keys("trust/metadata/"))


@pytest.fixture
def trusted(tmp_path: Path) -> tuple[Store, Path, bytes]:
    """A local store with 12 models, signed (16 bins); its keys directory and root."""
    store = open_store(str(tmp_path / "store"))
    write_manifest(store, [f"model-{i}" for i in range(12)])
    root = make_trusted_store(store, tmp_path / "keys", bins=16)
    return store, tmp_path / "keys", root.read_bytes()


# --- what init and publish write ------------------------------------------------------------


def test_init_writes_a_repository_the_client_verifies(
    trusted: tuple[Store, Path, bytes], tmp_path: Path
) -> None:
    store, keys, root = trusted
    got = signed_models(store, tmp_path / "device", root, ["model-3", "model-11"])
    # Only the ok variants are signed: a device never judges a failed one.
    assert {m: sorted(e["variants"]) for m, e in got.items()} == {
        "model-3": ["cpu"],
        "model-11": ["cpu"],
    }
    assert (
        ModelEntry.model_validate(got["model-3"]).variants["cpu"]
        == entry("model-3").variants["cpu"]
    )
    whole = signed_manifest(store, tmp_path / "everything", root)
    assert whole == Manifest.from_json(store.read(MANIFEST_KEY).data)  # type: ignore[union-attr]
    state = read_state(store)
    assert state.succinct.number_of_bins == 16
    assert (
        state.root.signed.roles["root"].threshold == 2
        and len(state.root.signed.roles["root"].keyids) == 3
    )
    for name in ("root-1.pem", "root-2.pem", "root-3.pem", "targets.pem", "online.pem"):
        assert stat.S_IMODE((keys / name).stat().st_mode) == 0o600, name
    assert not any(k.endswith(".pem") for k in store.list_keys(""))  # no key inside the store


def test_one_target_per_model_with_its_ok_variants_in_the_custom_field(
    trusted: tuple[Store, Path, bytes],
) -> None:
    store, _, _ = trusted
    state = read_state(store)
    targets = {p: t for b in state.bins.values() for p, t in b.targets.items()}
    assert sorted(targets) == sorted([MANIFEST_KEY, *(f"models/model-{i}" for i in range(12))])
    custom = json.loads(targets["models/model-5"].custom["epfleet"])
    assert (
        sorted(custom["variants"]) == ["cpu"] and custom["source"]["uri"] == "sources/model-5.onnx"
    )
    # Each target is where consistent snapshots put it, named by its hash.
    for path, target in targets.items():
        folder, _, name = path.rpartition("/")
        key = f"trust/targets/{folder + '/' if folder else ''}{target.hashes['sha256']}.{name}"
        assert store.size(key) == target.length, key


def test_unchanged_publish_writes_nothing(trusted: tuple[Store, Path, bytes]) -> None:
    store, keys, _ = trusted
    before = metadata_files(store)
    stamp = store.read(TIMESTAMP_KEY)
    done = publish_trust(store, online_key(keys))
    assert not done.written and done.bins == []
    assert metadata_files(store) == before
    assert store.read(TIMESTAMP_KEY) == stamp


def changing(name: str, new: ModelEntry | None) -> Callable[[Manifest | None], Manifest]:
    """A publisher's change to the signed document: ``name``'s entry set (None: removed)."""

    def change(current: Manifest | None) -> Manifest:
        assert current is not None
        models = {n: e for n, e in current.models.items() if n != name}
        if new is not None:
            models[name] = new
        return Manifest(generation=current.generation + 1, models=models)

    return change


def test_one_model_changed_signs_its_bin_again_with_snapshot_and_timestamp(
    trusted: tuple[Store, Path, bytes], tmp_path: Path
) -> None:
    store, keys, root = trusted
    state = read_state(store)
    before = metadata_files(store)

    rebuilt = entry("model-7", fingerprint="rebuilt")
    done = publish_trust(store, online_key(keys), changing("model-7", rebuilt))

    model_bin = state.succinct.get_role_for_target("models/model-7")
    manifest_bin = state.succinct.get_role_for_target(MANIFEST_KEY)
    # The model's bin, and the bin of manifest.json (which changed with it); no other bin.
    assert done.written and done.bins == sorted({model_bin, manifest_bin})
    new = metadata_files(store) - before
    versions = {b: state.bins[b].version + 1 for b in done.bins}
    assert new == {
        *(f"trust/metadata/{v}.{b}.json" for b, v in versions.items()),
        f"trust/metadata/{state.snapshot.signed.version + 1}.snapshot.json",  # type: ignore[union-attr]
    }
    got = signed_models(store, tmp_path / "device", root, ["model-7"])
    assert got["model-7"]["variants"]["cpu"]["fingerprint"] == "model-7-rebuilt"


def test_a_retired_model_leaves_the_signed_metadata(
    trusted: tuple[Store, Path, bytes], tmp_path: Path
) -> None:
    store, keys, root = trusted
    publish_trust(store, online_key(keys), changing("model-2", None))
    with pytest.raises(BadInputError, match="has no target models/model-2"):
        verify(store, tmp_path / "device", root, ["model-2"])


# --- publishing through epfleet.fleet.publishing.publish ------------------------------------------------------


def signer_env(monkeypatch: pytest.MonkeyPatch, keys: Path) -> None:
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", f"file2:{keys / 'online.pem'}")


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_racing_publishers_lose_no_model_in_the_signed_metadata(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    uri = str(tmp_path / "store") if backend == "local" else request.getfixturevalue("s3_store_uri")
    root = make_trusted_store(open_store(uri), tmp_path / "keys", bins=16).read_bytes()
    signer_env(monkeypatch, tmp_path / "keys")

    race(uri)

    store = open_store(uri)
    names = [f"model-{i}" for i in range(16)]
    manifest, _ = read_manifest(store)
    assert manifest is not None and sorted(manifest.models) == sorted(names)
    assert signed_manifest(store, tmp_path / "all", root) == manifest  # the last one, signed
    assert sorted(signed_models(store, tmp_path / "some", root, names)) == sorted(names)


def test_a_crash_between_signing_and_the_copy_is_put_right_by_the_next_publish(
    trusted: tuple[Store, Path, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, keys, root = trusted
    signer_env(monkeypatch, keys)
    # A publisher signed its change and died before writing manifest.json, its copy.
    publish_trust(store, online_key(keys), changing("late", entry("late")))
    assert "late" in signed_models(store, tmp_path / "device", root, ["late"])
    assert "late" not in read_manifest(store)[0].models  # type: ignore[union-attr]

    outcome = update_manifest(store, lambda current: None)  # nothing to change

    assert not outcome.published and outcome.signed_version is not None
    assert outcome.tampered == []  # a late copy is not a tampered one
    copy = read_manifest(store)[0]
    assert copy is not None and "late" in copy.models
    assert copy == signed_manifest(store, tmp_path / "everything", root)


def test_store_with_trust_metadata_and_no_signer_is_refused_before_publishing(
    s3_store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_store(s3_store_uri)
    write_manifest(store, ["model-0"])
    make_trusted_store(store, tmp_path / "keys", bins=16)
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    before = store.read(MANIFEST_KEY)
    with pytest.raises(BadInputError, match="EPFLEET_TRUST_SIGNER is not set"):
        publish_new(store, 1)
    assert store.read(MANIFEST_KEY) == before


def test_s3_store_without_trust_metadata_is_published_unsigned_with_a_warning(
    s3_store_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    store = open_store(s3_store_uri)
    logged = Records()
    with logged:
        outcome = publish_new(store, 0)
    assert outcome.published and outcome.signed_version is None
    assert store.list_keys("trust/") == []  # never initialised on S3
    assert "epfleet trust init" in logged.text


def test_local_store_gets_development_keys_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    store = open_store(str(tmp_path / "store"))
    logged = Records()
    with logged:
        publish_new(store, 0)
    keys = development_keys_dir(tmp_path / "store")
    assert keys == tmp_path / "store.dev-keys"
    assert "development keys" in logged.text and "not for production" in logged.text
    assert not any(k.endswith(".pem") for k in store.list_keys(""))
    root = (keys / "root.json").read_bytes()
    assert root == store.read("trust/metadata/1.root.json").data  # type: ignore[union-attr]
    publish_new(store, 1)  # later publishes sign with the same development key
    assert sorted(signed_models(store, tmp_path / "device", root, ["model-0", "model-1"])) == [
        "model-0",
        "model-1",
    ]


def test_a_publisher_that_finds_development_keys_on_their_way_waits_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two first publishes to one new local store: the one making its development keys
    writes the store's trust metadata, then moves the keys in (all or nothing). The other,
    seeing the metadata in between, waits on the lock beside the keys instead of refusing
    the store for want of a signer (1 of 22 races under load did, before)."""
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    store = open_store(str(tmp_path / "store"))
    staged = tmp_path / "staged-keys"
    init_with_key_files(store, staged, bins=16)  # the metadata is there, the keys not yet
    keys = development_keys_dir(tmp_path / "store")
    keys.mkdir()
    got: list[object] = []
    with open(keys / DEVELOPMENT_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first publisher, moving its keys in
        other = threading.Thread(target=lambda: got.append(signer_for(store)))
        other.start()
        other.join(timeout=1.0)
        assert other.is_alive() and got == []  # waiting, not refused
        for key_file in staged.iterdir():
            key_file.rename(keys / key_file.name)
    other.join(timeout=30)
    assert not other.is_alive() and len(got) == 1 and got[0] is not None
    publish_new(store, 0)  # and it signs with them


def test_a_local_store_whose_trust_was_made_elsewhere_still_needs_its_signer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    store = open_store(str(tmp_path / "store"))
    make_trusted_store(store, tmp_path / "keys", bins=16)
    with pytest.raises(BadInputError, match="EPFLEET_TRUST_SIGNER is not set"):
        signer_for(store)
    assert not development_keys_dir(tmp_path / "store").exists()  # nothing made beside it


# --- keeping it fresh, and rotating keys ------------------------------------------------------


def test_refresh_extends_every_expiry_due(
    trusted: tuple[Store, Path, bytes], tmp_path: Path
) -> None:
    store, keys, root = trusted
    before = read_state(store)
    later = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=5)

    done = refresh(store, online_key(keys), now=later)

    after = read_state(store)
    assert done.written
    assert after.timestamp.signed.version == before.timestamp.signed.version + 1  # type: ignore[union-attr]
    assert after.timestamp.signed.expires > before.timestamp.signed.expires  # type: ignore[union-attr]
    assert after.snapshot.signed.expires > before.snapshot.signed.expires  # type: ignore[union-attr]
    # Five days into their seven, every bin was past half its life: all signed again.
    assert sorted(done.bins) == sorted(before.bins)
    assert min(b.expires for b in after.bins.values()) > max(
        b.expires for b in before.bins.values()
    )
    # And a device still verifies it (its clock is now: nothing is expired).
    assert "model-1" in signed_models(store, tmp_path / "device", root, ["model-1"])


def test_refresh_soon_after_a_publish_signs_only_timestamp_and_snapshot(
    trusted: tuple[Store, Path, bytes],
) -> None:
    store, keys, _ = trusted
    before = metadata_files(store)
    done = refresh(store, online_key(keys))
    assert done.written and done.bins == []
    assert [k for k in metadata_files(store) - before if "snapshot" not in k] == []


def test_online_key_rotation_is_followed_and_the_old_key_refused(
    trusted: tuple[Store, Path, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, keys, root = trusted
    device = tmp_path / "device"
    signed_models(store, device, root, ["model-1"])  # the device knows root 1
    old = online_key(keys)
    new_uri = generate_online_file(tmp_path / "new-online.pem")
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", new_uri)
    new = online_key_from(new_uri)

    rotate_online_key(store, load_offline(keys), new)

    state = read_state(store)
    assert state.root.signed.version == 2
    assert state.root.signed.roles["timestamp"].keyids == [new.public_key.keyid]
    assert all(b.version >= 2 for b in state.bins.values())  # every bin signed by the new key
    publish_new(store, 99)  # publishing goes on with the new key
    assert "model-99" in signed_models(store, device, root, ["model-99"])
    assert (device / ROOT_HISTORY / "2.root.json").is_file()  # the device followed the chain
    with pytest.raises(BadInputError, match=r"not the online key|cannot sign"):
        publish_trust(store, old)


def online_key_from(uri: str):
    from epfleet.trust.keys import online_signer, public_key_of

    return online_signer(uri, public_key_of(uri))


def test_root_rotation_is_followed_and_signed_by_both_thresholds(
    trusted: tuple[Store, Path, bytes], tmp_path: Path
) -> None:
    store, keys, root = trusted
    device = tmp_path / "device"
    signed_models(store, device, root, ["model-1"])
    offline = load_offline(keys)
    new_root_keys = [new_key() for _ in range(3)]

    raw = rotate_root_keys(store, offline, new_root_keys)

    rotated = json.loads(raw)
    old_ids = {s.public_key.keyid for s in offline.root}
    new_ids = {s.public_key.keyid for s in new_root_keys}
    signed_by = {s["keyid"] for s in rotated["signatures"]}
    assert len(signed_by & old_ids) >= 2 and len(signed_by & new_ids) >= 2
    assert set(rotated["signed"]["roles"]["root"]["keyids"]) == new_ids
    # A device provisioned with root 1 walks to root 2 and goes on verifying.
    assert "model-4" in signed_models(store, device, root, ["model-4"])
    assert (device / ROOT_HISTORY / "2.root.json").read_bytes() == raw
    # A fresh device given only the first root follows too.
    assert "model-4" in signed_models(store, tmp_path / "fresh", root, ["model-4"])


def test_an_interrupted_online_key_rotation_is_finished_by_running_it_again(
    trusted: tuple[Store, Path, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, keys, root = trusted
    device = tmp_path / "device"
    signed_models(store, device, root, ["model-1"])
    new = online_key_from(generate_online_file(tmp_path / "new-online.pem"))
    offline = load_offline(keys)

    class Killed(Exception):
        pass

    def killed(*args: object, **kwargs: object) -> bytes:
        raise Killed  # the rotation dies once its new root is written

    with monkeypatch.context() as patch:
        patch.setattr(rotation, "write_versioned", killed)
        with pytest.raises(Killed):
            rotate_online_key(store, offline, new)
    assert latest_root(store).signed.version == 2  # the new root is out
    with pytest.raises(StoreError, match="rotation stopped half-way"):
        publish_trust(store, new)  # a publish meanwhile is told how to finish it

    rotate_online_key(store, offline, new)

    state = read_state(store)
    assert state.root.signed.roles["timestamp"].keyids == [new.public_key.keyid]
    assert state.succinct.keyids == [new.public_key.keyid]
    assert "model-1" in signed_models(store, device, root, ["model-1"])
    assert publish_trust(store, new).version == state.timestamp.signed.version  # type: ignore[union-attr]
