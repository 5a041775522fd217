"""``epfleet gc`` keeps a binary delta (``deltas/``) only while both the variant file it
makes and the file it applies to are kept, on a local store and on S3 (moto's server,
over HTTP)."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

import pytest

from epfleet.formats.keys import delta_key, variant_key
from epfleet.lifecycle.gc import collect, kind_of, render
from epfleet.stores import Store, open_store
from epfleet.stores.local import LocalStore
from tests.support.gc_fleet import NOW, OLD, Aged, keys, make_fleet

pytestmark = pytest.mark.fast


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return open_store(f"s3://{request.getfixturevalue('s3_bucket')}/fleet")


def put_delta(store: Store, model: str, target: str, sha256: str, base: str, at: datetime) -> str:
    key = delta_key(model, target, sha256, base)
    store.write(key, b"a delta")
    if isinstance(store, LocalStore):
        os.utime(store.root / key, (at.timestamp(), at.timestamp()))
    else:
        assert isinstance(store, Aged)
        store._ages[key] = at
    return key


def test_a_delta_is_kept_while_its_base_and_its_variant_are_and_goes_with_either(
    store: Store,
) -> None:
    store, fleet = make_fleet(store)
    cls = fleet.manifest.models["cls"]
    current = cls.variants["x86-cpu"].artifact
    htp = cls.variants["htp"].artifact
    assert current is not None and htp is not None
    [pinned] = [k for k in fleet.pinned]  # a build dev-1 still runs
    [superseded] = [k for k in fleet.removable if k.startswith("variants/cls/x86-cpu/")]
    pinned_sha = pinned.rsplit("/", 1)[1].removesuffix(".onnx")
    superseded_sha = superseded.rsplit("/", 1)[1].removesuffix(".onnx")
    assert variant_key("cls", "x86-cpu", pinned_sha) == pinned
    kept = {
        # to the published build from the one a device runs
        put_delta(store, "cls", "x86-cpu", current.sha256, pinned_sha, OLD),
        # to another target's build (a runtime's) from a file that is kept under another
        put_delta(store, "cls", "htp", htp.sha256, current.sha256, OLD),
    }
    young = put_delta(store, "cls", "x86-cpu", current.sha256, "c" * 64, NOW)
    removed = {
        # from a build that goes
        put_delta(store, "cls", "x86-cpu", current.sha256, superseded_sha, OLD),
        # to a build that goes
        put_delta(store, "cls", "x86-cpu", superseded_sha, pinned_sha, OLD),
        # from a file no longer in the store
        put_delta(store, "cls", "x86-cpu", current.sha256, "d" * 64, OLD),
    }
    assert {kind_of(k) for k in kept | removed | {young}} == {"delta"}

    planned = collect(store)
    candidates = {c.key for c in planned.plan.candidates if c.kind == "delta"}
    assert candidates == removed
    assert {k.key: k.reason for k in planned.plan.kept if k.kind == "delta"} == {
        young: "younger than the grace period"
    }
    assert "delta" in render(planned)

    before = keys(store)
    result = collect(store, delete=True)
    assert result.errors == []
    after = keys(store)
    assert before - after == fleet.removable | removed
    assert kept | {young} <= after
