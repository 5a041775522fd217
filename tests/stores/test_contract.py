"""The parts of the Store contract the manifest and devices rely on (compare-and-swap,
conditional GET, ranged reads), checked against the writable backends: a local directory,
S3 (moto over HTTP) and the in-memory store unit tests use in their place."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from epfleet.errors import PreconditionFailed, StoreError
from epfleet.hashing import sha256_file
from epfleet.stores import UNCHANGED, Store, open_store
from epfleet.stores.memory import forget
from epfleet.stores.s3 import S3Store

pytestmark = pytest.mark.fast


@pytest.fixture(params=["local", "s3", "memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    if request.param == "memory":
        request.addfinalizer(lambda: forget(tmp_path.name))
        return open_store(f"memory://{tmp_path.name}")
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


def test_conditional_read(store: Store) -> None:
    etag = store.write("m.json", b"v1")
    assert store.read_if_changed("m.json", etag) == UNCHANGED
    newer = store.write("m.json", b"v2")
    got = store.read_if_changed("m.json", etag)
    assert got != UNCHANGED and got is not None
    assert (got.data, got.etag) == (b"v2", newer)
    assert store.read_if_changed("missing.json", etag) is None


def test_read_range(store: Store) -> None:
    data = bytes(range(256)) * 8192  # 2 MiB: more than one chunk
    store.write("blob", data)
    assert b"".join(store.read_range("blob", 0)) == data
    assert b"".join(store.read_range("blob", 1_000_001)) == data[1_000_001:]
    assert b"".join(store.read_range("blob", 5, 1_500_000)) == data[5:1_500_000]
    assert b"".join(store.read_range("blob", 0, 1)) == data[:1]
    with pytest.raises(StoreError, match="missing"):
        list(store.read_range("missing", 0))


def test_list_keys_and_delete(store: Store) -> None:
    assert store.list_keys("reports/devices/") == []
    store.write("reports/devices/b.json", b"{}")
    store.write("reports/devices/a.json", b"{}")
    store.write("reports/other.json", b"{}")
    store.write("manifest.json", b"{}")
    assert store.list_keys("reports/devices/") == [
        "reports/devices/a.json",
        "reports/devices/b.json",
    ]
    assert "manifest.json" in store.list_keys("")
    store.delete("reports/devices/a.json")
    store.delete("reports/devices/a.json")  # already gone: not an error
    assert store.list_keys("reports/devices/") == ["reports/devices/b.json"]
    assert store.read("reports/devices/a.json") is None
    store.write("reportsx/other.json", b"{}")
    store.write("reports/devices/.hidden/c.json", b"{}")
    assert store.list_keys("reports/") == ["reports/devices/b.json", "reports/other.json"]
    with pytest.raises(ValueError, match="'reports' must be empty or end with '/'"):
        store.list_keys("reports")


def test_list_objects_with_sizes_and_times(store: Store) -> None:
    before = datetime.now(timezone.utc) - timedelta(minutes=5)
    store.write("sources/a.onnx", b"12345")
    store.write("samples/b.npz", b"1")
    store.write("reports/devices/d.json", b"{}")
    listed = store.list_objects("")
    assert [(o.key, o.size) for o in listed] == [
        ("reports/devices/d.json", 2),
        ("samples/b.npz", 1),
        ("sources/a.onnx", 5),
    ]
    assert all(
        before < o.modified < datetime.now(timezone.utc) + timedelta(minutes=5) for o in listed
    )
    assert [o.key for o in store.list_objects("sources/")] == ["sources/a.onnx"]
    assert store.list_objects("nothing/") == []


def test_list_objects_hidden(store: Store) -> None:
    store.write("sources/a.onnx", b"x")
    store.write("sources/.a.onnx.abcdefgh.tmp", b"partial")
    store.write("m.json", b"{}", if_none_match=True)  # the local store's lock file appears
    assert [o.key for o in store.list_objects("")] == ["m.json", "sources/a.onnx"]
    hidden = [o.key for o in store.list_objects("", hidden=True)]
    assert hidden == ["m.json", "sources/.a.onnx.abcdefgh.tmp", "sources/a.onnx"]


def test_incomplete_uploads(store: Store) -> None:
    assert store.incomplete_uploads() == []
    if not isinstance(store, S3Store):
        return  # a local store has none: its leftovers are hidden temp files
    key = f"{store.prefix}/variants/m/t/x.onnx"
    started = store.client.create_multipart_upload(Bucket=store.bucket, Key=key)
    store.client.upload_part(
        Bucket=store.bucket, Key=key, UploadId=started["UploadId"], PartNumber=1, Body=b"z" * 1000
    )
    (upload,) = store.incomplete_uploads()
    assert (upload.key, upload.size) == ("variants/m/t/x.onnx", 1000)
    assert store.list_objects("") == []
    assert store.clean_up_incomplete(older_than=0) == ["variants/m/t/x.onnx"]
    assert store.incomplete_uploads() == []


def test_touch_and_delete_if_older(store: Store, tmp_path: Path) -> None:
    """What keeps gc off an object a publish reuses: a touch renews its modification time
    (content and sha256 unchanged), and gc's delete_if_older spares what is newer than
    its cutoff."""
    source = tmp_path / "weights.bin"
    source.write_bytes(b"w" * 1000)
    sha, _ = sha256_file(source)
    store.upload("files/w", source, sha)
    written = store.list_objects("files/")[0].modified
    assert store.delete_if_older("files/w", written - timedelta(seconds=1)) is False
    assert store.size("files/w") == 1000
    assert store.touch("files/w", min_age=3600) is True  # younger: left as it is
    assert store.list_objects("files/")[0].modified == written
    future = datetime.now(timezone.utc) + timedelta(minutes=5)
    assert store.delete_if_older("files/w", future) is True
    assert store.size("files/w") is None
    assert store.delete_if_older("files/w", future) is True  # already gone
    assert store.touch("files/w") is False
    store.upload("files/w", source, sha)
    first = store.list_objects("files/")[0].modified
    deadline = first + timedelta(seconds=1.1)  # S3 times have a resolution of a second
    while datetime.now(timezone.utc) < deadline:
        pass
    assert store.touch("files/w") is True
    touched = store.list_objects("files/")[0].modified
    assert touched > first
    assert store.delete_if_older("files/w", touched) is False
    assert b"".join(store.read_range("files/w", 0)) == b"w" * 1000
    if isinstance(store, S3Store):
        head = store.client.head_object(Bucket=store.bucket, Key=store.object_key("files/w"))
        assert head["Metadata"].get("sha256") == sha  # the object's own sha256 kept
