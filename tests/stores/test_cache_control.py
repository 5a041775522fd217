"""What a CDN in front of a store may cache: every object written once for good, the
timestamp and manifest.json never without asking the origin, device reports not at all;
and the S3 store stores each object with its ``Cache-Control`` (moto over HTTP)."""

from __future__ import annotations

from pathlib import Path

import boto3
import pytest

from epfleet.stores import open_store
from epfleet.stores.caching import IMMUTABLE, PRIVATE, REVALIDATE, cache_control

pytestmark = pytest.mark.fast

SHA = "ab" * 32


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (f"sources/{SHA}.onnx", IMMUTABLE),
        (f"samples/{SHA}.npz", IMMUTABLE),
        (f"files/{SHA}", IMMUTABLE),
        (f"variants/m/t/{SHA}.onnx", IMMUTABLE),
        (f"variants/m/t/{SHA}.files.json", IMMUTABLE),
        (f"trust/targets/models/{SHA}.m", IMMUTABLE),
        ("trust/metadata/7.snapshot.json", IMMUTABLE),
        ("trust/metadata/3.bin-0a.json", IMMUTABLE),
        ("trust/metadata/timestamp.json", REVALIDATE),
        ("manifest.json", REVALIDATE),
        ("reports/devices/d.json", PRIVATE),
        ("runs/x/pool.json", PRIVATE),
    ],
)
def test_each_key_s_cache_control(key: str, expected: str) -> None:
    assert cache_control(key) == expected


def test_the_s3_store_writes_each_object_with_its_cache_control(
    s3_store_uri: str, tmp_path: Path
) -> None:
    store = open_store(s3_store_uri)
    bucket = s3_store_uri.removeprefix("s3://").split("/")[0]
    s3 = boto3.client("s3", region_name="us-east-1")
    store.write("trust/metadata/timestamp.json", b"{}")
    store.write("trust/metadata/2.snapshot.json", b"{}")
    path = tmp_path / "model.onnx"
    path.write_bytes(b"model")
    store.upload(f"sources/{SHA}.onnx", path, SHA)
    store.touch(f"sources/{SHA}.onnx")  # a copy onto itself keeps it
    for key, expected in [
        ("trust/metadata/timestamp.json", REVALIDATE),
        ("trust/metadata/2.snapshot.json", IMMUTABLE),
        (f"sources/{SHA}.onnx", IMMUTABLE),
    ]:
        head = s3.head_object(Bucket=bucket, Key=f"fleet/{key}")
        assert head.get("CacheControl") == expected, key
