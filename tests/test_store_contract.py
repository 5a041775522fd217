"""Compare-and-swap, the part of the Store contract the manifest relies on, checked
against both backends: a local directory and S3 (moto over HTTP)."""

from __future__ import annotations

from pathlib import Path

import pytest

from epfleet.errors import PreconditionFailed
from epfleet.stores import Store, open_store


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    return open_store(f"s3://{request.getfixturevalue('s3_bucket')}/some/prefix")


def test_if_none_match_on_existing_object(store: Store) -> None:
    store.write("m.json", b"one", if_none_match=True)
    with pytest.raises(PreconditionFailed) as raised:
        store.write("m.json", b"two", if_none_match=True)
    assert f"{store.uri}/m.json" in str(raised.value)
    got = store.read("m.json")
    assert got is not None and got.data == b"one"


def test_if_match(store: Store) -> None:
    stale = store.write("m.json", b"v1")
    current = store.write("m.json", b"v2")
    with pytest.raises(PreconditionFailed):
        store.write("m.json", b"v3", if_match=stale)
    got = store.read("m.json")
    assert got is not None and (got.data, got.etag) == (b"v2", current)
    new = store.write("m.json", b"v3", if_match=current)
    got = store.read("m.json")
    assert got is not None and (got.data, got.etag) == (b"v3", new)


def test_if_match_on_missing_object(store: Store) -> None:
    with pytest.raises(PreconditionFailed):
        store.write("gone.json", b"x", if_match='"0123"')
