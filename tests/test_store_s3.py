"""S3Store against a real moto server over HTTP (no boto3 patching), with a fault proxy."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import boto3
import pytest
from s3proxy import FaultProxy

from epfleet.errors import BadInputError, PreconditionFailed, StoreError, TransientStoreError
from epfleet.hashing import sha256_bytes, sha256_file
from epfleet.stores import open_store
from epfleet.stores.s3 import MiB, S3Store

pytestmark = pytest.mark.fast


@pytest.fixture
def store(s3_bucket: str) -> S3Store:
    s = open_store(f"s3://{s3_bucket}/some/prefix")
    assert isinstance(s, S3Store)
    return s


def raw_get(bucket: str, key: str) -> bytes:
    client = boto3.client("s3", region_name="us-east-1")
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()


# --- URIs -------------------------------------------------------------------------------


def test_open_parses_bucket_and_prefix() -> None:
    s = open_store("s3://bkt/a/b/")
    assert isinstance(s, S3Store)
    assert (s.bucket, s.prefix, s.uri) == ("bkt", "a/b", "s3://bkt/a/b")
    bare = open_store("s3://bkt")
    assert isinstance(bare, S3Store)
    assert (bare.prefix, bare._key("x/y.onnx")) == ("", "x/y.onnx")


def test_open_without_bucket_is_bad_input() -> None:
    with pytest.raises(BadInputError, match="bucket"):
        open_store("s3:///prefix")


@pytest.mark.parametrize("key", ["../escape", "/abs", "a/../../b", ""])
def test_bad_keys(key: str) -> None:
    with pytest.raises(ValueError):
        S3Store("bkt", "p")._key(key)


# --- contract ---------------------------------------------------------------------------


def test_roundtrip_and_metadata(store: S3Store, s3_bucket: str) -> None:
    assert store.read("a/b.json") is None
    etag = store.write("a/b.json", b'{"x": 1}')
    got = store.read("a/b.json")
    assert got is not None and got.data == b'{"x": 1}' and got.etag == etag
    assert raw_get(s3_bucket, "some/prefix/a/b.json") == b'{"x": 1}'
    head = boto3.client("s3").head_object(Bucket=s3_bucket, Key="some/prefix/a/b.json")
    assert head["Metadata"]["sha256"] == sha256_bytes(b'{"x": 1}')


def _increment(store: S3Store, key: str, times: int) -> int:
    conflicts = 0
    for _ in range(times):
        while True:
            current = store.read(key)
            assert current is not None
            value = json.loads(current.data)["n"] + 1
            try:
                store.write(key, json.dumps({"n": value}).encode(), if_match=current.etag)
                break
            except PreconditionFailed:
                conflicts += 1
    return conflicts


def test_concurrent_compare_and_swap_loses_no_update(store: S3Store) -> None:
    store.write("counter.json", b'{"n": 0}', if_none_match=True)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            _increment(store, "counter.json", 20)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    got = store.read("counter.json")
    assert got is not None and json.loads(got.data) == {"n": 40}


def test_size(store: S3Store) -> None:
    store.write("s.bin", b"12345")
    assert store.size("s.bin") == 5
    assert store.size("missing.bin") is None


def test_multipart_upload_and_download(s3_bucket: str, tmp_path: Path) -> None:
    store = S3Store(s3_bucket, "p", multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    src = tmp_path / "big.onnx"
    src.write_bytes(os.urandom(11 * MiB))
    sha, size = sha256_file(src)
    store.upload("models/big.onnx", src, sha)
    assert store.size("models/big.onnx") == size
    head = boto3.client("s3").head_object(Bucket=s3_bucket, Key="p/models/big.onnx")
    assert head["Metadata"]["sha256"] == sha
    assert "-" in head["ETag"]  # a multipart ETag: not the content's MD5, let alone sha256
    dest = tmp_path / "out" / "big.onnx"
    store.download("models/big.onnx", dest)
    assert sha256_file(dest) == (sha, size)
    assert sorted(p.name for p in dest.parent.iterdir()) == ["big.onnx"]


def test_download_missing_key(store: S3Store, tmp_path: Path) -> None:
    with pytest.raises(StoreError, match=r"s3://.*/some/prefix/nope\.onnx"):
        store.download("nope.onnx", tmp_path / "nope.onnx")
    assert list(tmp_path.iterdir()) == []


# --- failures ---------------------------------------------------------------------------


def test_unreachable_endpoint_is_transient(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    store = S3Store("bkt", "p", max_attempts=1, connect_timeout=2)
    with pytest.raises(TransientStoreError, match=r"s3://bkt/p/k.*AWS_ENDPOINT_URL"):
        store.read("k")
    with pytest.raises(TransientStoreError):
        store.write("k", b"x")


def test_missing_bucket(aws_env: str) -> None:
    store = open_store("s3://no-such-bucket-epfleet/p")
    with pytest.raises(StoreError, match=r"no-such-bucket-epfleet.*does not exist") as info:
        store.write("k", b"x")
    assert not isinstance(info.value, TransientStoreError)
    with pytest.raises(StoreError, match="no-such-bucket-epfleet"):
        store.read("k")


def test_region_falls_back_to_us_east_1(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    store = S3Store("bkt")
    assert store.client.meta.region_name == "us-east-1"


# --- faults through the proxy ------------------------------------------------------------


def test_409_conflict_is_precondition_failed(s3_bucket: str, s3_proxy: FaultProxy) -> None:
    store = S3Store(s3_bucket, "p")
    etag = store.write("m.json", b"v1")
    s3_proxy.conflict_next_conditional_puts(1)
    with pytest.raises(PreconditionFailed, match="conflict"):
        store.write("m.json", b"v2", if_match=etag)
    assert s3_proxy.counts["PUT"] == 2  # 409 is not retried by botocore
    assert raw_get(s3_bucket, "p/m.json") == b"v1"
    store.write("m.json", b"v2", if_match=etag)  # the caller's retry goes through
    assert raw_get(s3_bucket, "p/m.json") == b"v2"


@pytest.mark.parametrize("conditional", ["if_match", "if_none_match"])
def test_lost_response_put_is_read_back_as_success(
    s3_bucket: str, s3_proxy: FaultProxy, conditional: str
) -> None:
    store = S3Store(s3_bucket, "p")
    kwargs: dict[str, object] = {}
    if conditional == "if_match":
        kwargs["if_match"] = store.write("m.json", b"v1")
    else:
        kwargs["if_none_match"] = True
    puts_before = s3_proxy.counts["PUT"]
    s3_proxy.lose_next_put_responses(f"/{s3_bucket}/p/m.json", 1)
    etag = store.write("m.json", b"v2", **kwargs)  # type: ignore[arg-type]
    assert s3_proxy.lost == [f"/{s3_bucket}/p/m.json"]
    assert s3_proxy.counts["PUT"] - puts_before == 2  # moto got it, botocore retried: 412
    got = store.read("m.json")
    assert got is not None and (got.data, got.etag) == (b"v2", etag)


def test_conflicting_write_still_raises_after_read_back(
    s3_bucket: str, s3_proxy: FaultProxy
) -> None:
    store = S3Store(s3_bucket, "p")
    stale = store.write("m.json", b"v1")
    store.write("m.json", b"v2")
    gets_before = s3_proxy.counts["GET"]
    with pytest.raises(PreconditionFailed, match="changed"):
        store.write("m.json", b"v2", if_match=stale)  # same bytes, but not our write
    assert s3_proxy.counts["GET"] - gets_before == 1  # it did read back
    with pytest.raises(PreconditionFailed):
        store.write("m.json", b"v3", if_match=stale)
    assert raw_get(s3_bucket, "p/m.json") == b"v2"
