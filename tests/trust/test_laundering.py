"""The signer signs only what the publisher built: whoever can write to a signed store but
holds no key gets nothing signed, whatever they write there.

The attack (found on an earlier version, which derived the signed state from
``manifest.json`` as stored): rewrite ``manifest.json`` to point a model at one's own
artifact, with the loosest tolerance the manifest's rules allow, and wait for a routine refresh or a
publish of another model to sign it. Here every routine operation of the publishing
side runs on a store so tampered (local, and S3 through moto over HTTP): the signed entry
stays the genuine one, the publisher names the entry that was changed, and
``manifest.json`` is put right from the signed manifest. Forged signed metadata (a bin,
the timestamp, the signed document) is refused or healed, never built on.

The end-to-end attack through ``epfleet trust refresh``, ``epfleet compile`` and the
trust-refresh flow, with a device that syncs before and after, is in
tests/trust/test_laundering_e2e.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epfleet.errors import StoreError, Unverified
from epfleet.fleet.publishing.publish import (
    put_copy_right,
    read_in_force,
    read_manifest,
    update_manifest,
)
from epfleet.formats.manifest import ArtifactRef, Manifest, Verification
from epfleet.stores import MANIFEST_KEY, Store, open_store
from epfleet.stores.memory import forget
from epfleet.trust.layout import TIMESTAMP_KEY, metadata_key, target_key
from epfleet.trust.repository import publish_trust, read_state, refresh
from epfleet.trust.state import clear_cache
from tests.support.publish_helpers import publish_new
from tests.support.signed_records import (
    Records,
    entry,
    signed_manifest,
    signed_models,
    write_manifest,
)
from tests.support.tiers import on_stores
from tests.support.trust_helpers import make_trusted_store, online_key

pytestmark = pytest.mark.fast

EVIL = "ee" * 32
TARGET = "model-3"


@pytest.fixture(params=on_stores("local", "s3", "memory"))
def signed(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Store, Path, bytes]:
    """A signed store of 8 models (local, S3 through the fault proxy, or in memory), its
    keys and root; EPFLEET_TRUST_SIGNER is its online key."""
    if request.param == "local":
        uri = str(tmp_path / "store")
    elif request.param == "memory":
        uri = f"memory://{tmp_path.name}"
        request.addfinalizer(lambda: forget(tmp_path.name))
    else:
        request.getfixturevalue("s3_proxy")
        uri = request.getfixturevalue("s3_store_uri")
    store = open_store(uri)
    write_manifest(store, [f"model-{i}" for i in range(8)])
    root = make_trusted_store(store, tmp_path / "keys", bins=16)
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", f"file2:{tmp_path / 'keys' / 'online.pem'}")
    return store, tmp_path / "keys", root.read_bytes()


def tamper(store: Store) -> Manifest:
    """What an attacker without keys does: point TARGET's CPU variant at their artifact,
    with the loosest tolerance the rules allow, in manifest.json; and upload the artifact."""
    manifest, _ = read_manifest(store)
    assert manifest is not None
    variant = manifest.models[TARGET].variants["cpu"]
    evil = ArtifactRef(uri=f"variants/{TARGET}/cpu/{EVIL}.onnx", sha256=EVIL, size=9)
    variant.artifact = evil
    variant.verification = Verification(status="passed", tolerance=0.25, abs_tolerance=0.05)
    manifest.generation += 1
    store.write(evil.uri, b"evil bits")
    store.write(MANIFEST_KEY, manifest.to_json())
    return manifest


def genuine_cpu(store: Store, device: Path, root: bytes) -> dict:
    return signed_models(store, device, root, [TARGET])[TARGET]["variants"]["cpu"]


def assert_genuine(store: Store, tmp_path: Path, root: bytes, name: str) -> None:
    """A device verifies TARGET's genuine entry, and manifest.json is the signed copy."""
    cpu = genuine_cpu(store, tmp_path / name, root)
    assert cpu["artifact"]["sha256"] != EVIL and cpu["verification"] is None
    whole = signed_manifest(store, tmp_path / f"{name}-all", root)
    assert whole.models[TARGET] == entry(TARGET)
    copy, _ = read_manifest(store)
    assert copy == whole


def test_a_refresh_signs_nothing_from_a_tampered_manifest_json(
    signed: tuple[Store, Path, bytes], tmp_path: Path
) -> None:
    store, keys, root = signed
    tamper(store)
    logged = Records()
    with logged:
        done = refresh(store, online_key(keys))
        tampered = put_copy_right(store)
    assert done.written and done.bins == []  # timestamp and snapshot only
    assert tampered == [TARGET]
    assert TARGET in logged.text and "without the keys" in logged.text
    assert_genuine(store, tmp_path, root, "device")


def test_a_publish_of_another_model_signs_nothing_of_the_tampered_one(
    signed: tuple[Store, Path, bytes], tmp_path: Path
) -> None:
    store, _, root = signed
    tamper(store)
    outcome = publish_new(store, 42)  # a routine compile's publish of another model
    assert outcome.published and outcome.tampered == [TARGET]
    assert "model-42" in outcome.manifest.models  # type: ignore[union-attr]
    assert "model-42" in signed_models(store, tmp_path / "new", root, ["model-42"])
    assert_genuine(store, tmp_path, root, "device")


def test_a_publish_that_changes_nothing_puts_the_copy_right(
    signed: tuple[Store, Path, bytes], tmp_path: Path
) -> None:
    store, _, root = signed
    tamper(store)
    outcome = update_manifest(store, lambda current: None)
    assert not outcome.published and outcome.tampered == [TARGET]
    assert_genuine(store, tmp_path, root, "device")


def test_the_compile_side_plans_on_the_signed_manifest(
    signed: tuple[Store, Path, bytes],
) -> None:
    store, _, _ = signed
    tamper(store)
    in_force = read_in_force(store)
    assert in_force.key == TIMESTAMP_KEY and in_force.manifest is not None
    assert in_force.manifest.models[TARGET] == entry(TARGET)


def test_a_late_copy_is_put_right_without_an_alarm(
    signed: tuple[Store, Path, bytes], tmp_path: Path
) -> None:
    store, keys, root = signed
    before, _ = read_manifest(store)
    publish_trust(store, online_key(keys), lambda current: Manifest(generation=2))
    assert read_manifest(store)[0] == before  # signed, not yet copied
    assert put_copy_right(store) == []
    assert read_manifest(store)[0] == signed_manifest(store, tmp_path / "all", root)


def forge(store: Store, key: str, edit: object) -> None:
    """Rewrite the JSON at ``key`` with ``edit`` (signatures left as they were)."""
    found = store.read(key)
    assert found is not None
    document = json.loads(found.data)
    edit(document)  # type: ignore[operator]
    store.write(key, json.dumps(document).encode())


def test_a_forged_bin_is_never_built_on_and_is_signed_again_from_the_signed_manifest(
    signed: tuple[Store, Path, bytes], tmp_path: Path
) -> None:
    store, keys, root = signed
    state = read_state(store)
    name = state.succinct.get_role_for_target(f"models/{TARGET}")
    assert state.snapshot is not None
    key = metadata_key(name, state.snapshot.signed.meta[f"{name}.json"].version)

    def point_at_evil(document: dict) -> None:
        target = document["signed"]["targets"][f"models/{TARGET}"]
        text = json.loads(target["custom"]["epfleet"])
        text["variants"]["cpu"]["artifact"]["sha256"] = EVIL
        target["custom"]["epfleet"] = json.dumps(text)

    forge(store, key, point_at_evil)
    clear_cache()  # a publisher in another process, which never verified the genuine bin
    fresh = read_state(store)
    assert name in fresh.refused and name not in fresh.bins
    logged = Records()
    with logged:
        done = refresh(store, online_key(keys))
    assert name in done.bins and name in done.healed
    assert key in logged.text and "signing it again" in logged.text
    assert genuine_cpu(store, tmp_path / "device", root)["artifact"]["sha256"] != EVIL


def test_a_forged_timestamp_is_refused_and_nothing_is_written(
    signed: tuple[Store, Path, bytes],
) -> None:
    store, keys, _ = signed

    def newer(document: dict) -> None:
        document["signed"]["version"] += 10

    forge(store, TIMESTAMP_KEY, newer)
    before = store.list_keys("trust/")
    with pytest.raises(Unverified, match=r"timestamp\.json is not signed by the online key"):
        refresh(store, online_key(keys))
    with pytest.raises(Unverified):
        publish_new(store, 9)
    assert store.list_keys("trust/") == before


def test_a_forged_signed_document_is_refused(signed: tuple[Store, Path, bytes]) -> None:
    store, keys, _ = signed
    state = read_state(store)
    bin_name = state.succinct.get_role_for_target(MANIFEST_KEY)
    info = state.bins[bin_name].targets[MANIFEST_KEY]
    key = target_key(MANIFEST_KEY, info.hashes["sha256"])
    forge(store, key, lambda document: document["models"].pop(TARGET))
    clear_cache()  # a publisher in another process, which never read the genuine one
    with pytest.raises(StoreError, match="not the signed manifest document"):
        refresh(store, online_key(keys))


def test_nobody_without_the_keys_widens_or_narrows_a_rollout(
    signed: tuple[Store, Path, bytes], tmp_path: Path
) -> None:
    """A model's rollout state rides in its signed entry: writing a wider stage (or a
    reverted state) into manifest.json reaches no device and is never signed."""
    from datetime import datetime, timezone

    from epfleet.fleet.rollout.rules import Begin, start
    from epfleet.formats.rollout import RolloutPolicy

    store, keys, root = signed

    def staged(current: Manifest | None) -> Manifest:
        assert current is not None
        entry = current.models[TARGET].model_copy(deep=True)
        before = entry.variants["cpu"]
        entry.variants["cpu"] = before.model_copy(update={"fingerprint": "rebuilt"})
        begin = Begin(now=datetime.now(timezone.utc), id="1" * 16, salt="2" * 32)
        entry = start(entry, {"cpu": before}, RolloutPolicy(stages=[10, 100]), begin)
        return Manifest(generation=current.generation + 1, models=current.models | {TARGET: entry})

    publish_trust(store, online_key(keys), staged)
    put_copy_right(store)
    for widened in ({"stage": 1}, {"state": "reverted"}, {"state": "complete"}):
        copy, _ = read_manifest(store)
        assert copy is not None and copy.models[TARGET].rollout is not None
        rollout = copy.models[TARGET].rollout.model_copy(update=widened)
        copy.models[TARGET].rollout = rollout
        store.write(MANIFEST_KEY, copy.to_json())
        refresh(store, online_key(keys))
        assert put_copy_right(store) == [TARGET]
        signed_entry = signed_models(store, tmp_path / f"device-{len(widened)}", root, [TARGET])
        assert signed_entry[TARGET]["rollout"]["stage"] == 0
        assert signed_entry[TARGET]["rollout"]["state"] == "active"
