"""S3Store against a real moto server over HTTP (no boto3 patching), with a fault proxy:
conditional writes, lost responses, and the transfer limits (stalls, trickles, endless
bodies, uploads the store barely reads) and incomplete multipart uploads."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest
from botocore.utils import parse_timestamp

from epfleet.errors import (
    BadInputError,
    DocumentTooLarge,
    PreconditionFailed,
    StoreError,
    TransferTooSlow,
    TransientStoreError,
)
from epfleet.hashing import sha256_bytes, sha256_file
from epfleet.stores import open_store
from epfleet.stores.s3 import S3Store
from epfleet.stores.s3.client import parse_s3_timestamp
from epfleet.stores.s3.store import MiB
from tests.support.s3proxy import HOLD_MAX, FaultProxy

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
    assert (bare.prefix, bare.object_key("x/y.onnx")) == ("", "x/y.onnx")


def test_open_without_bucket_is_bad_input() -> None:
    with pytest.raises(BadInputError, match="bucket"):
        open_store("s3:///prefix")


@pytest.mark.parametrize("key", ["../escape", "/abs", "a/../../b", ""])
def test_bad_keys(key: str) -> None:
    with pytest.raises(ValueError):
        S3Store("bkt", "p").object_key(key)


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


@pytest.mark.parametrize(
    "value",
    [
        "2026-12-07T18:00:00.000Z",
        "2026-12-07T18:00:00Z",
        "2026-12-07T18:00:00.123456Z",
        "2026-12-07T18:00:00+01:00",
        "Mon, 07 Dec 2026 18:00:00 GMT",
        "Mon, 7 Dec 2026 08:05:09 GMT",
        "Mon, 07 Dec 2026 18:00:00 +0100",
        "1796666981",
    ],
)
def test_timestamps_parse_as_botocore_parses_them(value: str) -> None:
    ours = parse_s3_timestamp(value)
    assert ours == parse_timestamp(value) and ours.utcoffset() is not None


def test_a_listing_and_a_head_give_an_object_the_same_time(store: S3Store, s3_bucket: str) -> None:
    store.write("a/b.json", b"{}")
    [listed] = store.list_objects("a/")
    head = boto3.client("s3").head_object(Bucket=s3_bucket, Key="some/prefix/a/b.json")
    assert listed.modified.replace(microsecond=0) == head["LastModified"]
    assert abs(listed.modified - datetime.now(timezone.utc)) < timedelta(minutes=5)


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


# --- deadlines and bounded reads (faults through the proxy) ------------------------------


@pytest.fixture
def fast_limits(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Transfer limits a test can hit in about a second (stores opened afterwards)."""
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "1")
    monkeypatch.setenv("EPFLEET_MIN_RATE", "1KiB")
    monkeypatch.setenv("EPFLEET_RATE_WINDOW", "1")
    monkeypatch.setenv("EPFLEET_MAX_MANIFEST_BYTES", "64KiB")
    monkeypatch.setenv("EPFLEET_MAX_DOCUMENT_BYTES", "16KiB")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    return monkeypatch


def timed(call: object) -> tuple[BaseException, float]:
    started = time.monotonic()
    with pytest.raises(Exception) as info:
        call()  # type: ignore[operator]
    return info.value, time.monotonic() - started


@pytest.mark.usefixtures("fast_limits")
def test_a_document_that_trickles_is_aborted_below_the_minimum_rate(
    s3_bucket: str, s3_proxy: FaultProxy
) -> None:
    store = S3Store(s3_bucket, "p")
    store.write("runs/r1/results.json", b"x" * 4000)
    s3_proxy.trickle_next_get_responses(f"/{s3_bucket}/p/runs/r1/results.json", interval=0.1)
    error, seconds = timed(lambda: store.read("runs/r1/results.json"))
    assert isinstance(error, TransferTooSlow)
    assert re.fullmatch(
        r"s3://\S+/p moved \d+ B in 1 s, below the minimum rate of 1 KiB/s "
        r"\(EPFLEET_MIN_RATE over EPFLEET_RATE_WINDOW\): read of runs/r1/results.json aborted",
        str(error),
    ), error
    assert 1.0 <= seconds < 20.0  # the window, not the 40 s the body would take


@pytest.mark.usefixtures("fast_limits")
def test_a_document_that_stalls_is_aborted_after_the_stall_timeout(
    s3_bucket: str, s3_proxy: FaultProxy
) -> None:
    store = S3Store(s3_bucket, "p")
    store.write("reports/devices/d1.json", b"{}" * 100)
    s3_proxy.stall_next_get_responses(f"/{s3_bucket}/p/reports/devices/d1.json", after=10)
    error, seconds = timed(lambda: store.read("reports/devices/d1.json"))
    assert isinstance(error, TransferTooSlow)
    assert "moved nothing for 1 s (EPFLEET_STALL_TIMEOUT): read of reports/devices" in str(error)
    assert 1.0 <= seconds < HOLD_MAX / 4  # aborted by the stall timeout, not the proxy's hold
    assert store.read("reports/devices/d1.json") is not None  # the next read is not stalled


@pytest.mark.usefixtures("fast_limits")
@pytest.mark.parametrize("content_length", [None, 2 << 30], ids=["chunked", "2-GiB-length"])
def test_an_endless_manifest_is_refused_within_its_limit(
    s3_bucket: str, s3_proxy: FaultProxy, content_length: int | None
) -> None:
    store = S3Store(s3_bucket, "p")
    s3_proxy.serve_endless(f"/{s3_bucket}/p/manifest.json", content_length=content_length)
    error, seconds = timed(lambda: store.read("manifest.json"))
    assert isinstance(error, DocumentTooLarge) and error.key == "manifest.json"
    held = "goes on past" if content_length is None else "is 2 GiB, over"
    assert str(error) == (
        f"s3://{s3_bucket}/p/manifest.json {held} the limit of 64 KiB for a manifest "
        "(EPFLEET_MAX_MANIFEST_BYTES); not read"
    )
    assert error.etag == '"endless"' and error.limit == 64 << 10
    assert seconds < HOLD_MAX / 4  # the reader stopped at its limit, not the proxy's hold
    with pytest.raises(DocumentTooLarge):  # the conditional form is bounded too
        store.read_if_changed("manifest.json", '"another"')


@pytest.mark.usefixtures("fast_limits")
def test_documents_other_than_the_manifest_have_their_own_limit(s3_bucket: str) -> None:
    store = S3Store(s3_bucket, "p")
    store.write("reports/devices/big.json", b" " * (20 << 10))
    store.write("manifest.json", b" " * (20 << 10))
    with pytest.raises(DocumentTooLarge, match=r"20 KiB, over the limit of 16 KiB for a store "):
        store.read("reports/devices/big.json")
    got = store.read("manifest.json")  # 64 KiB for a manifest
    assert got is not None and len(got.data) == 20 << 10


@pytest.mark.usefixtures("fast_limits")
def test_an_upload_the_store_barely_reads_is_aborted(
    s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPFLEET_MIN_RATE", "1MiB")
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "5")  # the rate alone
    store = S3Store(s3_bucket, "p")
    src = tmp_path / "big.onnx"
    src.write_bytes(os.urandom(4 * MiB))
    s3_proxy.trickle_next_request_bodies(f"/{s3_bucket}/p/variants/", rate=20_000)
    error, seconds = timed(lambda: store.upload("variants/big.onnx", src, "0" * 64))
    assert isinstance(error, TransferTooSlow)
    assert "below the minimum rate of 1 MiB/s" in str(error)
    assert "upload of variants/big.onnx aborted" in str(error)
    assert seconds < 30.0  # 200 s at the proxy's pace
    assert store.size("variants/big.onnx") is None


@pytest.mark.usefixtures("fast_limits")
def test_an_upload_the_store_stops_reading_is_aborted_after_the_stall_timeout(
    s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPFLEET_MIN_RATE", "0")  # the stall alone
    store = S3Store(s3_bucket, "p")
    src = tmp_path / "big.onnx"
    src.write_bytes(os.urandom(16 * MiB))
    s3_proxy.trickle_next_request_bodies(f"/{s3_bucket}/p/sources/", rate=1)
    error, seconds = timed(lambda: store.upload("sources/big.onnx", src, "0" * 64))
    assert isinstance(error, TransferTooSlow)
    assert "moved nothing for 1 s (EPFLEET_STALL_TIMEOUT): upload of sources/big.onnx" in str(error)
    assert seconds < 30.0  # not the proxy's 120 s


@pytest.mark.usefixtures("fast_limits")
def test_a_download_that_trickles_is_aborted_and_leaves_nothing(
    s3_bucket: str, s3_proxy: FaultProxy, tmp_path: Path
) -> None:
    store = S3Store(s3_bucket, "p")
    store.write("sources/s.onnx", os.urandom(5000))
    s3_proxy.trickle_next_get_responses(f"/{s3_bucket}/p/sources/s.onnx", interval=0.1)
    error, seconds = timed(lambda: store.download("sources/s.onnx", tmp_path / "s.onnx"))
    assert isinstance(error, TransferTooSlow) and "download of sources/s.onnx" in str(error)
    assert seconds < 30.0  # not the 500 s the body would take
    assert list(tmp_path.iterdir()) == []
    store.download("sources/s.onnx", tmp_path / "s.onnx")  # and without the fault, whole
    assert (tmp_path / "s.onnx").stat().st_size == 5000


def test_a_ranged_download_in_parts_is_of_one_version(s3_bucket: str, tmp_path: Path) -> None:
    store = S3Store(s3_bucket, "p", multipart_threshold=1 * MiB, multipart_chunksize=1 * MiB)
    data = os.urandom(3 * MiB + 7)
    store.write("sources/big.onnx", data)
    store.download("sources/big.onnx", tmp_path / "big.onnx")
    assert (tmp_path / "big.onnx").read_bytes() == data


def test_incomplete_multipart_uploads_past_the_grace_are_aborted(
    s3_bucket: str, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = boto3.client("s3", region_name="us-east-1")
    for key in ("fleet/variants/m/t/a.onnx", "fleet/sources/b.onnx", "other/c.onnx"):
        client.create_multipart_upload(Bucket=s3_bucket, Key=key)
    store = S3Store(s3_bucket, "fleet")

    def left() -> list[str]:
        found = client.list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
        return sorted(upload["Key"] for upload in found)

    now = datetime.now(timezone.utc)
    s3_proxy.uploads_initiated = now - timedelta(hours=23)
    assert store.clean_up_incomplete() == []  # within a day's grace: maybe a live run's
    assert len(left()) == 3
    s3_proxy.uploads_initiated = now - timedelta(hours=25)
    assert sorted(store.clean_up_incomplete()) == ["sources/b.onnx", "variants/m/t/a.onnx"]
    assert left() == ["other/c.onnx"]  # outside the store's prefix: not this store's
    client.create_multipart_upload(Bucket=s3_bucket, Key="fleet/x.onnx")
    monkeypatch.setenv("EPFLEET_MULTIPART_GRACE", "0")
    s3_proxy.uploads_initiated = now
    assert store.clean_up_incomplete() == ["x.onnx"]
