"""``epfleet trust init|rotate|refresh|status`` (epfleet.cli.trust, run through
``epfleet.cli.app.main``): exit codes, errors naming the option, and metadata a device verifies after
each command (epfleet.trust.client, python-tuf's ngclient)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from epfleet.cli.app import main
from epfleet.errors import BadInputError
from epfleet.fleet.publishing.publish import read_manifest
from epfleet.stores import Store, open_store
from epfleet.stores.local import LocalStore
from epfleet.trust.client import verify
from epfleet.trust.keys import file_uri, generate_online_file
from epfleet.trust.repository import TIMESTAMP_KEY, development_root, latest_root
from tests.support.publish_helpers import publish_new

pytestmark = pytest.mark.fast


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def trust(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["trust", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def device_sees(store: Store, root: Path, cache: Path, model: str) -> int:
    """The signed source size of ``model`` as a device trusting ``root`` verifies it."""
    verified = verify(store, cache, root.read_bytes(), [model])
    return int(json.loads(verified.document)["models"][model]["source"]["size"])


def init(capsys: pytest.CaptureFixture[str], store_dir: Path, keys: Path) -> str:
    code, out, err = trust(
        capsys, "init", "--store", str(store_dir), "--keys", str(keys), "--bins", "16"
    )
    assert code == 0, err
    return out


def test_init_prints_what_devices_and_publishers_need(
    capsys: pytest.CaptureFixture[str],
    store_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = tmp_path / "keys"
    out = init(capsys, store_dir, keys)
    assert f"--trust-root {keys / 'root.json'}" in out
    assert f"EPFLEET_TRUST_SIGNER={file_uri(keys / 'online.pem')}" in out
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", file_uri(keys / "online.pem"))
    store = open_store(str(store_dir))
    publish_new(store, 1)
    assert device_sees(store, keys / "root.json", tmp_path / "device", "model-1") == 2

    code, _, err = trust(capsys, "init", "--store", str(store_dir), "--keys", str(tmp_path / "k2"))
    assert code == 2 and "already has trust metadata" in err
    assert not (tmp_path / "k2").exists()  # refused before any key was made
    code, _, err = trust(
        capsys, "init", "--store", str(tmp_path / "s2"), "--keys", str(keys), "--bins", "16"
    )
    assert code == 2 and f"--keys {keys} already holds keys" in err
    code, _, err = trust(
        capsys, "init", "--store", str(tmp_path / "s3"), "--keys", str(tmp_path / "k3"),
        "--bins", "100",
    )  # fmt: skip
    assert code == 2 and "--bins 100" in err
    code, _, err = trust(
        capsys, "init", "--store", str(tmp_path / "s4"), "--keys", str(tmp_path / "k4"),
        "--root-keys", "2", "--root-threshold", "3",
    )  # fmt: skip
    assert code == 2 and "--root-threshold 3" in err


def test_status_shows_versions_expiries_and_bins(
    capsys: pytest.CaptureFixture[str], store_dir: Path, tmp_path: Path
) -> None:
    init(capsys, store_dir, tmp_path / "keys")
    code, out, _ = trust(capsys, "status", "--store", str(store_dir), "--json")
    assert code == 0
    document = json.loads(out)
    assert document["bins"] == 16
    roles = {r["role"].split(" ")[0]: r for r in document["roles"]}
    assert set(roles) == {"root", "targets", "snapshot", "timestamp", "bins"}
    assert roles["timestamp"]["version"] == 1
    code, out, _ = trust(capsys, "status", "--store", str(store_dir))
    assert code == 0 and "16 hashed bins" in out
    code, _, err = trust(capsys, "status", "--store", str(tmp_path / "unsigned"))
    assert code == 2 and "epfleet trust init" in err


def test_refresh_signs_the_timestamp_again(
    capsys: pytest.CaptureFixture[str],
    store_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = tmp_path / "keys"
    init(capsys, store_dir, keys)
    store = open_store(str(store_dir))
    before = store.read(TIMESTAMP_KEY)
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    code, _, err = trust(capsys, "refresh", "--store", str(store_dir))
    assert code == 2 and "EPFLEET_TRUST_SIGNER is not set" in err
    assert store.read(TIMESTAMP_KEY) == before
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", file_uri(keys / "online.pem"))
    code, out, err = trust(capsys, "refresh", "--store", str(store_dir))
    assert code == 0, err
    assert "timestamp version 2" in out
    code, _, err = trust(capsys, "refresh", "--store", str(tmp_path / "unsigned"))
    assert code == 2 and "--store" in err and "no trust metadata" in err


def test_rotate_the_online_key_then_the_root_keys(
    capsys: pytest.CaptureFixture[str],
    store_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys = tmp_path / "keys"
    init(capsys, store_dir, keys)
    root = keys / "root.json"
    store = open_store(str(store_dir))
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", file_uri(keys / "online.pem"))
    publish_new(store, 1)
    assert device_sees(store, root, tmp_path / "device", "model-1") == 2

    code, _, err = trust(capsys, "rotate", "--store", str(store_dir), "--keys", str(keys))
    assert code == 2 and "--online-signer" in err and "--root" in err

    new_online = generate_online_file(tmp_path / "online-2.pem")
    code, out, err = trust(
        capsys, "rotate", "--store", str(store_dir), "--keys", str(keys),
        "--online-signer", new_online,
    )  # fmt: skip
    assert code == 0, err
    assert f"EPFLEET_TRUST_SIGNER={new_online}" in out
    with pytest.raises(BadInputError, match=r"holds key \w+, not .*'s online key"):
        publish_new(store, 2)  # the old online key no longer signs: refused before writing
    manifest, _ = read_manifest(store)
    assert manifest is not None and list(manifest.models) == ["model-1"]
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", new_online)
    publish_new(store, 2)
    assert device_sees(store, root, tmp_path / "device", "model-2") == 3

    old_root_keys = sorted(p.read_bytes() for p in keys.glob("root-*.pem"))
    code, out, err = trust(
        capsys, "rotate", "--store", str(store_dir), "--keys", str(keys), "--root"
    )
    assert code == 0, err
    assert latest_root(store).signed.version == 3
    assert sorted(p.read_bytes() for p in (keys / "retired" / "2").glob("root-*.pem")) == (
        old_root_keys
    )
    assert sorted(p.read_bytes() for p in keys.glob("root-*.pem")) != old_root_keys
    publish_new(store, 3)
    # A device provisioned with root 1 follows 1 -> 2 (online key) -> 3 (root keys).
    assert device_sees(store, root, tmp_path / "fresh-device", "model-3") == 4
    assert device_sees(store, root, tmp_path / "device", "model-3") == 4


def test_development_root_of_a_local_store(
    store_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    assert development_root(str(store_dir)) is None
    store = open_store(str(store_dir))
    publish_new(store, 1)  # development keys made beside the store
    root = tmp_path / "store.dev-keys" / "root.json"
    assert development_root(str(store_dir)) == root
    assert development_root(store_dir.as_uri()) == root
    assert development_root("s3://bucket/fleet") is None
    assert (tmp_path / "store.dev-keys").stat().st_mode & 0o777 == 0o700
    assert device_sees(store, root, tmp_path / "device", "model-1") == 2


def test_root_rotation_refuses_other_keys_and_keeps_the_old_ones_when_it_fails(
    capsys: pytest.CaptureFixture[str],
    store_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keys, other = tmp_path / "keys", tmp_path / "other-keys"
    init(capsys, store_dir, keys)
    init(capsys, tmp_path / "other-store", other)
    before = {p.name: p.read_bytes() for p in keys.glob("root-*.pem")}
    code, _, err = trust(
        capsys, "rotate", "--store", str(store_dir), "--keys", str(other), "--root"
    )
    assert code == 2 and f"--keys {other} holds 0 of the root keys" in err
    code, _, err = trust(
        capsys, "rotate", "--store", str(store_dir), "--keys", str(other),
        "--online-signer", file_uri(other / "online.pem"),
    )  # fmt: skip
    assert code == 2 and "holds 0 of the root keys" in err

    # Another rotation writes root 2 between this one's read of root 1 and its write.
    original = LocalStore.write

    def raced(self: LocalStore, key: str, data: bytes, **conditions: Any) -> str:
        if key == "trust/metadata/2.root.json":
            original(self, key, b"another rotation's root 2", if_none_match=True)
        return original(self, key, data, **conditions)

    monkeypatch.setattr(LocalStore, "write", raced)
    code, _, err = trust(capsys, "rotate", "--store", str(store_dir), "--keys", str(keys), "--root")
    assert code == 1 and "2.root.json appeared meanwhile" in err
    assert {p.name: p.read_bytes() for p in keys.glob("root-*.pem")} == before
    assert len(list((keys / "retired" / "1-unused").glob("root-*.pem"))) == 3
