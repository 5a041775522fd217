"""The fleet side reads a signed store as devices do, through the roots pinned for it
(epfleet.trust.pins): a store whose trust metadata was deleted, replaced or rolled back by
someone who can write it but holds no key is refused by every fleet-side command, which
then publishes nothing; and trust init signs nothing it did not verify. Through
``epfleet.cli.app.main`` in this process, on a local store and on S3 (moto over HTTP)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.errors import TrustLost
from epfleet.fleet.evidence.enrolment import key_entry
from epfleet.fleet.publishing.publish import read_in_force, update_manifest
from epfleet.fleet.rollout.rollouts import run_gate
from epfleet.formats.manifest import Manifest, utcnow
from epfleet.stores import MANIFEST_KEY, Store, open_store
from epfleet.trust.keys import new_key
from epfleet.trust.layout import FIRST_ROOT_KEY, TIMESTAMP_KEY
from epfleet.trust.pins import pin_problem, record_path
from epfleet.trust.repository import development_keys_dir, init_with_key_files
from epfleet.trust.state import clear_cache
from tests.support.signed_fleet import synthetic_store
from tests.support.specs import CPU_TARGET, tiny_models, write_spec
from tests.support.tiers import on_stores

pytestmark = pytest.mark.fast

MISSING_ROOT = f"{FIRST_ROOT_KEY} is missing, but the store was signed"


@dataclass
class Signed:
    uri: str
    keys: Path
    """trust init's --keys: root.json, the online key."""

    @property
    def store(self) -> Store:
        return open_store(self.uri)


@pytest.fixture(params=on_stores("local", "s3", in_tier=("local", "s3")))
def signed(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Signed:
    """A store of three models signed by trust init with key files (its root recorded in
    this host's worker cache), EPFLEET_TRUST_SIGNER set to its online key."""
    directory = synthetic_store(tmp_path / "made", 3)
    uri = (
        str(tmp_path / "store")
        if request.param == "local"
        else request.getfixturevalue("s3_store_uri")
    )
    store = open_store(uri)
    store.write(MANIFEST_KEY, (directory / MANIFEST_KEY).read_bytes())
    _, signer = init_with_key_files(store, tmp_path / "keys", bins=16, adopt=True)
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", signer)
    return Signed(uri, tmp_path / "keys")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    lines = [
        line
        for line in err.splitlines()
        if line.startswith("epfleet") and not line.startswith("epfleet: planning")  # progress
    ]
    return code, out, "\n".join(lines)


def contents(store: Store) -> dict[str, bytes]:
    """Every object of the store and its bytes."""
    found = {}
    for key in store.list_keys(""):
        read = store.read(key)
        assert read is not None
        found[key] = read.data
    return found


def forge(store: Store) -> None:
    """What a store writer without keys does: delete the first root, then put a model and
    a device key of their own in manifest.json."""
    if store.size(FIRST_ROOT_KEY) is not None:
        store.delete(FIRST_ROOT_KEY)
    read = store.read(MANIFEST_KEY)
    assert read is not None
    manifest = Manifest.from_json(read.data)
    planted = manifest.models["model-000"].model_copy()
    keys = manifest.device_keys | {"planted-device": key_entry(new_key().public_key)}
    forged = manifest.model_copy(
        update={"models": manifest.models | {"forged": planted}, "device_keys": keys}
    )
    store.write(MANIFEST_KEY, forged.to_json())
    clear_cache()  # what a new process starts with


def fleet_commands(signed: Signed, spec: Path) -> dict[str, list[str]]:
    store = ["--store", signed.uri]
    return {
        "rollout status": ["rollout", "status", *store],
        "device list": ["device", "list", *store],
        "compile": ["compile", str(spec), *store],
        "manifest show": ["manifest", "show", *store],
        "rollout halt": ["rollout", "halt", *store, "--model", "model-000"],
        "device enroll": ["device", "enroll", "dev-1", *store, "--keys", str(spec.parent / "d")],
        "device revoke": ["device", "revoke", "dev-1", *store],
        "retire": ["retire", *store, "--model", "model-001"],
        "gc": ["gc", *store, "--delete", "--grace", "0"],
        "trust refresh": ["trust", "refresh", *store],
        "watch --dry-run": ["watch", str(spec), *store, "--dry-run"],
    }


COMMANDS = [
    "rollout status",
    "device list",
    "compile",
    "manifest show",
    "rollout halt",
    "device enroll",
    "device revoke",
    "retire",
    "gc",
    "trust refresh",
    "watch --dry-run",
]


@pytest.mark.parametrize("command", COMMANDS)
def test_with_its_first_root_deleted_a_signed_store_is_refused_and_nothing_published(
    capsys: pytest.CaptureFixture[str],
    signed: Signed,
    tmp_path: Path,
    model_dir: Path,
    command: str,
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    forge(signed.store)
    before = contents(signed.store)
    code, out, err = run(capsys, *fleet_commands(signed, spec)[command])
    assert code == 1, (out, err)
    assert len(err.splitlines()) == 1, err  # one line, naming what is missing
    assert f"{signed.uri}/{MISSING_ROOT}" in err, err
    assert f"recorded in {record_path(signed.store.uri)}" in err, err
    assert "planted-device" not in out and "forged" not in out
    assert contents(signed.store) == before  # nothing published, nothing removed


def test_the_rollout_gate_refuses_a_signed_store_whose_first_root_was_deleted(
    signed: Signed,
) -> None:
    """The gate as its flow runs it (``run_gate``), which moves rollouts on what it reads."""
    forge(signed.store)
    before = contents(signed.store)
    with pytest.raises(TrustLost, match=MISSING_ROOT):
        run_gate(signed.store)
    assert contents(signed.store) == before


def test_trust_init_refuses_a_store_that_was_signed_before(
    capsys: pytest.CaptureFixture[str], signed: Signed, tmp_path: Path
) -> None:
    """Deleting trust/ and running trust init, as an error once advised, signs nothing."""
    store = signed.store
    for key in store.list_keys("trust/"):
        store.delete(key)
    forge_after_wipe = store.read(MANIFEST_KEY)
    assert forge_after_wipe is not None
    clear_cache()
    new_keys = tmp_path / "new-keys"
    init = ["trust", "init", "--store", signed.uri, "--keys", str(new_keys), "--bins", "16"]
    code, _, err = run(capsys, *init, "--adopt")
    assert code == 2, err
    assert f"{signed.uri} was signed before (recorded in {record_path(store.uri)})" in err
    assert "restore its trust/ from a backup" in err
    assert store.list_keys("trust/") == [] and not new_keys.exists()


def test_trust_init_lists_an_unsigned_manifest_and_signs_it_only_with_adopt(
    capsys: pytest.CaptureFixture[str],
    signed: Signed,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host that never saw the store signed (another worker cache), and a store that
    never had development keys: what init would sign is listed, and signed on --adopt."""
    store = signed.store
    for key in store.list_keys("trust/"):
        store.delete(key)
    forge(store)  # its root is gone already: only the manifest is forged
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "another-host"))
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER")
    init = ["trust", "init", "--store", signed.uri, "--keys", str(tmp_path / "k2"), "--bins", "16"]
    code, _, err = run(capsys, *init)
    assert code == 2, err
    assert (
        f"{signed.uri}/manifest.json is unsigned and trust init would sign it as it is: "
        "4 models (forged, model-000, model-001, model-002), 0 variants (0 ok), 3 store "
        "objects, 0 rollouts, 1 device key (planted-device); check that this is what you "
        "published (epfleet manifest show), then run again with --adopt"
    ) in err
    assert store.list_keys("trust/") == [] and not (tmp_path / "k2").exists()
    code, out, err = run(capsys, *init, "--adopt")
    assert code == 0, err
    assert "signed the manifest.json it held: 4 models (forged, " in out
    assert "planted-device" in out


def test_a_replaced_repository_is_refused(
    capsys: pytest.CaptureFixture[str], signed: Signed, tmp_path: Path
) -> None:
    """A writer without the keys deletes trust/ and makes a repository of their own keys:
    it verifies on its own, but its root is not the one pinned."""
    store = signed.store
    for key in store.list_keys("trust/"):
        store.delete(key)
    clear_cache()
    record = record_path(store.uri)
    kept = record.read_bytes()
    record.unlink()  # their own trust init records theirs: put back what this host knew
    init_with_key_files(store, tmp_path / "their-keys", bins=16, adopt=True)
    record.write_bytes(kept)
    clear_cache()
    before = contents(store)
    code, _, err = run(capsys, "rollout", "halt", "--store", signed.uri, "--model", "model-000")
    assert code == 1
    assert (
        f"{signed.uri}/trust/metadata/1.root.json is not the root version 1 pinned: the "
        "signed metadata was replaced"
    ) in err
    assert contents(store) == before


@pytest.mark.parametrize("how", ["put back", "deleted"])
def test_a_rolled_back_or_deleted_timestamp_is_refused(
    capsys: pytest.CaptureFixture[str], signed: Signed, how: str
) -> None:
    store = signed.store
    old = store.read(TIMESTAMP_KEY)
    assert old is not None
    update_manifest(
        store, lambda current: current.succeeded_by(current.models, utcnow()) if current else None
    )
    assert read_in_force(store).manifest is not None  # this host verified the new timestamp
    if how == "put back":
        store.write(TIMESTAMP_KEY, old.data)  # the older signed timestamp
    else:
        store.delete(TIMESTAMP_KEY)
    clear_cache()
    before = contents(store)
    code, _, err = run(capsys, "retire", "--store", signed.uri, "--model", "model-000")
    assert code == 1
    says = {
        "put back": "is version 1, older than version 2 verified here: the signed metadata "
        "was rolled back",
        "deleted": "is missing, but version 2 was verified here: the signed metadata was damaged",
    }
    assert f"{signed.uri}/{TIMESTAMP_KEY} {says[how]}" in err, err
    assert contents(store) == before


def test_a_given_trust_root_pins_a_store_this_host_never_saw(
    capsys: pytest.CaptureFixture[str],
    signed: Signed,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "another-host"))
    forge(signed.store)
    given = ["--trust-root", str(signed.keys / "root.json")]
    code, out, err = run(capsys, "device", "list", "--store", signed.uri, *given)
    assert code == 1 and MISSING_ROOT in err and "planted-device" not in out
    code, _, err = run(capsys, "rollout", "status", "--store", signed.uri)  # kept: pinned
    assert code == 1 and MISSING_ROOT in err


def test_a_trust_root_of_another_repository_is_refused(
    capsys: pytest.CaptureFixture[str],
    signed: Signed,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    other = synthetic_store(tmp_path / "other", 1)
    other_root, _ = init_with_key_files(
        open_store(str(other)), tmp_path / "ok", bins=16, adopt=True
    )
    code, _, err = run(
        capsys, "device", "list", "--store", signed.uri, "--trust-root", str(other_root)
    )
    assert code == 2
    assert f"--trust-root {other_root} (root version 1) is not the root pinned for" in err
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "another-host"))
    code, _, err = run(
        capsys, "device", "list", "--store", signed.uri, "--trust-root", str(other_root)
    )
    assert code == 1
    assert "1.root.json is not the root version 1 pinned: the signed metadata was replaced" in err


def test_a_local_store_is_pinned_by_its_development_keys(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first publish to a local store makes development keys beside it; their root.json
    pins it, even on a host whose worker cache never saw it."""
    store = open_store(str(synthetic_store(tmp_path / "store", 2)))
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    update_manifest(
        store, lambda current: current.succeeded_by(current.models, utcnow()) if current else None
    )
    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "another-host"))
    forge(store)
    code, _, err = run(capsys, "retire", "--store", str(tmp_path / "store"), "--model", "model-000")
    assert code == 1
    root = development_keys_dir(tmp_path / "store") / "root.json"
    assert f"{MISSING_ROOT} (its root is in the development keys' {root})" in err


def test_a_publish_with_a_signer_set_never_goes_unsigned(
    capsys: pytest.CaptureFixture[str], s3_store_uri: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """An S3 store this host never saw signed, without trust metadata: with
    EPFLEET_TRUST_SIGNER set, a publish is refused rather than made unsigned."""
    store = open_store(s3_store_uri)
    store.write(MANIFEST_KEY, (synthetic_store(tmp_path / "made", 2) / MANIFEST_KEY).read_bytes())
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", "file2:/nowhere/online.pem")
    before = contents(store)
    code, _, err = run(capsys, "retire", "--store", s3_store_uri, "--model", "model-000")
    assert code == 2
    assert (
        f"{s3_store_uri} has no trust metadata ({FIRST_ROOT_KEY} is missing) and "
        "EPFLEET_TRUST_SIGNER is set: refusing to publish it unsigned"
    ) in err
    assert contents(store) == before


@pytest.mark.parametrize(
    ("chain", "timestamp", "says"),
    [
        ({1: "a", 2: "b", 3: "c"}, 3, None),
        ({1: "a"}, 3, "trust/metadata/2.root.json is missing, but root version 2 is pinned"),
        ({1: "x", 2: "b"}, 3, "trust/metadata/1.root.json is not the root version 1 pinned"),
        ({1: "a", 2: "b"}, None, "timestamp.json is missing, but version 2 was verified here"),
        ({1: "a", 2: "b"}, 1, "timestamp.json is version 1, older than version 2 verified"),
    ],
)
def test_what_a_store_must_hold_of_what_is_pinned(
    chain: dict[int, str], timestamp: int | None, says: str | None
) -> None:
    problem = pin_problem({1: "a", 2: "b"}, 2, chain, timestamp)
    assert problem is None if says is None else says in (problem or ""), problem


def test_a_store_deleted_whole_starts_again_only_when_it_is_local(signed: Signed) -> None:
    """``rm -rf`` of a local store and its keys, then a compile: a new store, its old record
    dropped (whoever deletes a local store's directory and keys owns this machine). The
    same emptiness on S3, or anything left in the local directory, is still refused."""
    import shutil

    from epfleet.trust.pins import signed_store

    store = signed.store
    for key in list(store.list_keys("")):
        store.delete(key)
    clear_cache()
    if store.uri.startswith("s3://"):
        with pytest.raises(TrustLost, match="is missing, but the store was signed"):
            signed_store(store)
        return
    root = Path(store.uri.removeprefix("file://"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "leftover").write_bytes(b"x")
    with pytest.raises(TrustLost):
        signed_store(store)
    shutil.rmtree(root)
    assert record_path(store.uri).exists()
    assert signed_store(store) is False
    assert not record_path(store.uri).exists()
