"""The Store contract for the local-directory backend."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from epfleet.errors import (
    BadInputError,
    DocumentTooLarge,
    IntegrityError,
    PreconditionFailed,
    StoreError,
)
from epfleet.hashing import sha256_bytes, sha256_file
from epfleet.stores import open_store
from epfleet.stores.local import LOCK_NAME, LocalStore

pytestmark = pytest.mark.fast


@pytest.fixture(params=["path", "file-uri"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> LocalStore:
    root = tmp_path / "store"
    uri = str(root) if request.param == "path" else root.as_uri()
    s = open_store(uri)
    assert isinstance(s, LocalStore)
    assert s.root == root and s.uri == root.as_uri()
    return s


def leftovers(root: Path) -> list[str]:
    """Files under root that are neither objects we wrote nor the lock file."""
    return sorted(p.name for p in root.rglob(".*") if p.name != LOCK_NAME)


# --- URIs -------------------------------------------------------------------------------


def test_unknown_scheme_lists_known_ones() -> None:
    with pytest.raises(BadInputError, match=r"'gs'.*file://.*s3://"):
        open_store("gs://bucket/prefix")


def test_remote_file_uri_is_bad_input() -> None:
    with pytest.raises(BadInputError, match="must be local"):
        open_store("file://otherhost/dir")


def test_store_on_a_file_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(BadInputError, match="not a directory"):
        open_store(str(tmp_path / "f"))


@pytest.mark.parametrize("key", ["../escape", "/abs/key", "a/../../b", "a\\b", ""])
def test_bad_keys(store: LocalStore, key: str) -> None:
    with pytest.raises(ValueError):
        store.write(key, b"x")
    with pytest.raises(ValueError):
        store.read(key)


# --- contract ---------------------------------------------------------------------------


def test_roundtrip(store: LocalStore) -> None:
    assert store.read("a/b.json") is None
    etag = store.write("a/b.json", b'{"x": 1}')
    got = store.read("a/b.json")
    assert got is not None and got.data == b'{"x": 1}' and got.etag == etag
    assert (store.root / "a" / "b.json").read_bytes() == b'{"x": 1}'


def test_no_temp_files_left_behind(store: LocalStore) -> None:
    store.write("a.json", b"1")
    store.write("a.json", b"2", if_match=sha256_bytes(b"1"))
    store.write("d/b.json", b"3", if_none_match=True)
    with pytest.raises(PreconditionFailed):
        store.write("a.json", b"4", if_match="stale")
    assert leftovers(store.root) == []
    assert sorted(str(p.relative_to(store.root)) for p in store.root.rglob("*.json")) == [
        "a.json",
        "d/b.json",
    ]


def test_size(store: LocalStore) -> None:
    store.write("s.bin", b"12345")
    assert store.size("s.bin") == 5
    assert store.size("missing.bin") is None


def test_upload_and_download(store: LocalStore, tmp_path: Path) -> None:
    src = tmp_path / "model.onnx"
    src.write_bytes(os.urandom(3 << 20))
    sha, size = sha256_file(src)
    store.upload("models/model.onnx", src, sha)
    assert store.size("models/model.onnx") == size
    dest = tmp_path / "out" / "model.onnx"
    store.download("models/model.onnx", dest)
    assert sha256_file(dest) == (sha, size)
    assert leftovers(store.root) == [] and sorted(os.listdir(dest.parent)) == ["model.onnx"]


def test_download_missing_key(store: LocalStore, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"nope\.onnx"):
        store.download("nope.onnx", tmp_path / "nope.onnx")
    assert not (tmp_path / "nope.onnx").exists()


# --- concurrency ------------------------------------------------------------------------


def _increment_in_process(uri: str, key: str, times: int, start: Any) -> None:
    """Run in a spawned process: a compare-and-swap loop on a JSON counter."""
    store = open_store(uri)
    start.wait(30)  # both processes are up: they really race
    for _ in range(times):
        while True:
            current = store.read(key)
            assert current is not None
            value = json.loads(current.data)["n"] + 1
            try:
                store.write(key, json.dumps({"n": value}).encode(), if_match=current.etag)
                break
            except PreconditionFailed:
                pass


def test_concurrent_compare_and_swap_across_processes(tmp_path: Path) -> None:
    uri = str(tmp_path / "store")
    store = open_store(uri)
    store.write("counter.json", b'{"n": 0}', if_none_match=True)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [
        ctx.Process(target=_increment_in_process, args=(uri, "counter.json", 20, start))
        for _ in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0, 0]
    got = store.read("counter.json")
    assert got is not None and json.loads(got.data) == {"n": 40}
    assert leftovers(tmp_path / "store") == []


def test_upload_with_the_wrong_sha256_stores_nothing(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    src = tmp_path / "a.bin"
    src.write_bytes(b"payload")
    with pytest.raises(IntegrityError):
        store.upload("variants/a.bin", src, "0" * 64)
    assert store.size("variants/a.bin") is None
    assert list((tmp_path / "store" / "variants").iterdir()) == []


def test_os_errors_become_store_errors_naming_the_store(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = open_store(str(tmp_path / "file-parent"))
    (tmp_path / "file-parent").symlink_to(blocker)
    with pytest.raises(StoreError, match="check the store directory and its permissions"):
        store.write("manifest.json", b"{}")


# --- bounded reads ------------------------------------------------------------------------


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPFLEET_MAX_MANIFEST_BYTES", "64KiB")
    monkeypatch.setenv("EPFLEET_MAX_DOCUMENT_BYTES", "16KiB")


@pytest.mark.usefixtures("small_limits")
def test_a_manifest_over_its_limit_is_refused_by_its_size(store: LocalStore) -> None:
    body = b"{" + b" " * (100 << 10) + b"}"
    store.write("manifest.json", body)
    with pytest.raises(DocumentTooLarge) as info:
        store.read("manifest.json")
    assert str(info.value) == (
        f"{store.uri}/manifest.json is 100.0 KiB, over the limit of 64 KiB for a manifest "
        "(EPFLEET_MAX_MANIFEST_BYTES); not read"
    )
    assert (info.value.key, info.value.limit) == ("manifest.json", 64 << 10)
    assert info.value.etag == sha256_bytes(body)  # hashed in chunks, never held whole
    assert store.read_if_changed("manifest.json", sha256_bytes(body)) == "unchanged"
    with pytest.raises(DocumentTooLarge):
        store.read_if_changed("manifest.json", "an older version")


@pytest.mark.usefixtures("small_limits")
def test_other_documents_have_their_own_limit(store: LocalStore) -> None:
    store.write("reports/devices/d.json", b" " * (20 << 10))
    with pytest.raises(DocumentTooLarge, match=r"20 KiB, over the limit of 16 KiB for a store "):
        store.read("reports/devices/d.json")
    store.write("manifest.json", b" " * (20 << 10))
    found = store.read("manifest.json")
    assert found is not None and len(found.data) == 20 << 10


@pytest.mark.parametrize("planted", ["fifo", "device"])
def test_anything_but_a_regular_file_at_a_key_is_refused_without_waiting(
    tmp_path: Path, planted: str
) -> None:
    """A FIFO (or a device: a terminal, a pty) at a key used to hold its reader forever: a
    device sync holding its cache's lock, until someone wrote to it."""
    store = LocalStore(tmp_path / "store")
    store.root.mkdir()
    key = "trust/metadata/timestamp.json"
    (store.root / key).parent.mkdir(parents=True)
    if planted == "fifo":
        os.mkfifo(store.root / key)
    else:
        (store.root / key).symlink_to("/dev/zero")  # endless, no size to go by
    not_regular = f"{store.uri}/{key} is not a regular file; not read"
    with pytest.raises(StoreError, match=not_regular):
        store.read(key)
    with pytest.raises(StoreError, match=not_regular):
        list(store.read_range(key, 0))
    with pytest.raises(StoreError, match=not_regular):
        store.download(key, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
