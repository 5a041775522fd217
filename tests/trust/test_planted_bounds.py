"""What someone who can write a signed store but holds no key can plant in ``manifest.json``
past the bounds a spec gives: 200,000 ``folded_io`` inputs (14 MB, whose validation once
grew quadratically and kept ``epfleet trust refresh`` busy past 1,000 s), a rollout with
``min_hours: inf`` or a canary id ``../../x``. ``epfleet trust refresh`` (in this process,
through ``epfleet.cli.app.main``) refuses the copy as a whole, signs nothing from it and puts
the signed copy back, on a local store, in memory and on S3 (moto over HTTP). How long the
refresh takes is measured by bench/planted_folded_io.py, not here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.stores import MANIFEST_KEY, Store, open_store
from epfleet.stores.memory import forget
from tests.support.signed_records import Records, signed_manifest, write_manifest
from tests.support.tiers import on_stores
from tests.support.trust_helpers import make_trusted_store

pytestmark = pytest.mark.fast

TARGET = "model-1"
PLANTED_INPUTS = 200_000


@pytest.fixture(params=on_stores("local", "memory", "s3"))
def signed(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Store, bytes]:
    """A signed store of 3 models and its root; EPFLEET_TRUST_SIGNER is its online key."""
    if request.param == "local":
        uri = str(tmp_path / "store")
    elif request.param == "memory":
        uri = f"memory://{tmp_path.name}"
        request.addfinalizer(lambda: forget(tmp_path.name))
    else:
        uri = request.getfixturevalue("s3_store_uri")
    store = open_store(uri)
    write_manifest(store, [f"model-{i}" for i in range(3)])
    root = make_trusted_store(store, tmp_path / "keys", bins=16)
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", f"file2:{tmp_path / 'keys' / 'online.pem'}")
    return store, root.read_bytes()


def folded_inputs(document: dict) -> None:
    tensors = [
        {"name": f"input-{i}", "dtype": "uint8", "scale": 0.5, "zero_point": 0}
        for i in range(PLANTED_INPUTS)
    ]
    document["models"][TARGET]["variants"]["cpu"]["folded_io"] = {"inputs": tensors}


def rollout(**policy: object) -> Callable[[dict], None]:
    def plant(document: dict) -> None:
        document["models"][TARGET]["rollout"] = {
            "id": "0" * 16,
            "salt": "1" * 32,
            "policy": {"stages": [10, 100]} | policy,
            "stage": 0,
            "started_at": "2026-12-01T00:00:00Z",
            "stage_started_at": "2026-12-01T00:00:00Z",
        }
        document["models"][TARGET]["previous"] = {"cpu": None}

    return plant


@pytest.mark.parametrize(
    "plant",
    [folded_inputs, rollout(min_hours=float("inf")), rollout(canary=["../../x"])],
    ids=["200,000 folded inputs", "min_hours inf", "canary ../../x"],
)
def test_trust_refresh_refuses_a_planted_copy_and_puts_the_signed_one_back(
    signed: tuple[Store, bytes],
    plant: Callable[[dict], None],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store, root = signed
    found = store.read(MANIFEST_KEY)
    assert found is not None
    document = json.loads(found.data)
    plant(document)
    store.write(MANIFEST_KEY, json.dumps(document).replace("Infinity", "1e999").encode())
    logged = Records()
    with logged:
        assert main(["trust", "refresh", "--store", store.uri]) == 0, capsys.readouterr().err
    assert "manifest.json as a whole (it fails validation)" in logged.text, logged.text
    restored = store.read(MANIFEST_KEY)
    assert restored is not None and restored.data == found.data
    signed_copy = signed_manifest(store, tmp_path / "device", root)
    assert signed_copy.models[TARGET].rollout is None
    assert signed_copy.models[TARGET].variants["cpu"].folded_io is None
