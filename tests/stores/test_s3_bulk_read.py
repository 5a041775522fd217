"""``S3Store.bulk_read`` (``epfleet.stores.s3.direct``: each read signed here, sent through a
pooled connection) against ``read`` (botocore's ``get_object``), on moto's S3 server over
HTTP behind the fault proxy: the same bytes and versions, the same answer for a missing
object, a missing bucket and an oversized document, transient answers retried and then
raised as transient, a silent server bounded by the stall timeout; and on moto checking
signatures, reads it accepts and a forged one it refuses."""

from __future__ import annotations

import gzip
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.request import Request, urlopen

import boto3
import pytest

from epfleet.errors import (
    DocumentTooLarge,
    StoreError,
    StoreMissing,
    TransferTooSlow,
    TransientStoreError,
)
from epfleet.stores import bulk_reader, open_store
from epfleet.stores.s3 import S3Store
from epfleet.stores.s3.direct import DirectReads
from tests.support.s3proxy import FaultProxy

pytestmark = pytest.mark.fast

KEYS = [
    "reports/devices/dev-1.json",
    "reports/inbox/20261207T20/dev 2+x~y.json",  # quoted as botocore quotes a key
    "reports/devices/d\u00e9v-3.json",
]


@pytest.fixture
def store(s3_bucket: str, s3_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "2")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    monkeypatch.setattr("epfleet.stores.s3.direct.MAX_BACKOFF", 0.05)
    found = open_store(f"s3://{s3_bucket}/p")
    assert isinstance(found, S3Store)
    return found


def test_bulk_reads_give_what_get_object_gives(store: S3Store) -> None:
    for n, key in enumerate(KEYS):
        store.write(key, gzip.compress(b'{"n": %d}' % n), content_encoding="gzip")
    read = bulk_reader(store)
    for key in KEYS:
        assert read(key) == store.read(key)  # bytes as written (still gzip) and the ETag
    assert isinstance(store._direct, DirectReads)  # the direct path served them
    assert read("reports/devices/nobody.json") is None


def test_a_transient_answer_is_retried_and_one_that_stays_is_transient(
    store: S3Store, s3_bucket: str, s3_proxy: FaultProxy
) -> None:
    key = KEYS[0]
    store.write(key, b"{}")
    s3_proxy.slow_down_next(f"/{s3_bucket}/p/{key}", n=2)
    before = len(s3_proxy.seen(key))
    assert store.bulk_read(key) is not None
    assert len(s3_proxy.seen(key)) - before == 3  # two SlowDown, then the object
    s3_proxy.slow_down_next(f"/{s3_bucket}/p/{key}", n=3)
    with pytest.raises(TransientStoreError, match=r"503 SlowDown \(3 attempts\); retry later"):
        store.bulk_read(key)


def test_refusals_are_the_stores_errors(store: S3Store, s3_bucket: str) -> None:
    big = b"x" * 2048
    store.write(KEYS[0], big)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EPFLEET_MAX_DOCUMENT_BYTES", "1024")
        with pytest.raises(DocumentTooLarge) as refused:
            store.bulk_read(KEYS[0])
    assert refused.value.key == KEYS[0] and "not read" in str(refused.value)
    gone = open_store(f"s3://{s3_bucket}-gone/p")
    assert isinstance(gone, S3Store)
    with pytest.raises(StoreMissing, match="does not exist"):
        gone.bulk_read(KEYS[0])


def test_a_silent_server_is_bounded_by_the_stall_timeout(
    store: S3Store, s3_bucket: str, s3_proxy: FaultProxy
) -> None:
    store.write(KEYS[0], b"{}")
    s3_proxy.trickle_next_response_heads(f"/{s3_bucket}/p/{KEYS[0]}", interval=0.5, n=3)
    started = time.monotonic()
    with pytest.raises(TransferTooSlow, match="EPFLEET_STALL_TIMEOUT; 3 attempts"):
        store.bulk_read(KEYS[0])
    assert time.monotonic() - started < 30  # three attempts of ~2 s, not minutes of trickle
    s3_proxy.heal()


def test_a_body_that_stalls_or_is_cut_is_bounded_and_transient(
    store: S3Store, s3_bucket: str, s3_proxy: FaultProxy
) -> None:
    key = KEYS[0]
    store.write(key, b"{" + b" " * 4000 + b"}")
    s3_proxy.stall_next_get_responses(f"/{s3_bucket}/p/{key}", after=100)
    started = time.monotonic()
    with pytest.raises(TransferTooSlow):
        store.bulk_read(key)
    assert time.monotonic() - started < 30
    s3_proxy.cut_next_get_responses(f"/{s3_bucket}/p/{key}", after=100)
    with pytest.raises(TransientStoreError, match="dropped"):
        store.bulk_read(key)
    got = store.bulk_read(key)  # the next read, on a new connection, is whole
    assert got is not None and len(got.data) == 4002


def test_connections_are_kept_alive_and_a_server_that_closes_them_is_read_all_the_same(
    s3_bucket: str, s3_proxy: FaultProxy
) -> None:
    """Through the proxy (which keeps connections alive) reads share one connection; moto
    itself answers each request with ``Connection: close``, and each read opens its own."""
    through = open_store(f"s3://{s3_bucket}/p")
    assert isinstance(through, S3Store)
    for n, key in enumerate(KEYS):
        through.write(key, b'{"n": %d}' % n)
    for key in KEYS * 3:
        assert through.bulk_read(key) == through.read(key)
    reads = through._direct
    assert isinstance(reads, DirectReads) and len(reads._pool._idle) == 1
    direct = S3Store(s3_bucket, "p")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(
            "AWS_ENDPOINT_URL",
            s3_proxy.endpoint_url.replace(
                str(s3_proxy._server.server_address[1]), str(s3_proxy.upstream[1])
            ),
        )
        direct = S3Store(s3_bucket, "p")
        for key in KEYS * 2:
            assert direct.bulk_read(key) == through.read(key)
    assert isinstance(direct._direct, DirectReads) and not direct._direct._pool._idle


PLAIN_TEXT = {"Content-Type": "text/plain"}  # else the server parses the count as a form


@pytest.fixture
def enforced_auth(moto_server: str) -> Iterator[tuple[str, str]]:
    """moto checking every request's signature against an IAM user's keys (its auth mode,
    off by default); yields the user's access key and secret."""
    iam = boto3.client("iam", endpoint_url=moto_server, region_name="us-east-1")
    user = f"reader-{uuid.uuid4().hex[:8]}"
    iam.create_user(UserName=user)
    allow_all = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
    }
    iam.put_user_policy(UserName=user, PolicyName="all", PolicyDocument=json.dumps(allow_all))
    made = iam.create_access_key(UserName=user)["AccessKey"]
    urlopen(Request(f"{moto_server}/moto-api/reset-auth", data=b"0", headers=PLAIN_TEXT)).read()
    try:
        yield made["AccessKeyId"], made["SecretAccessKey"]
    finally:
        urlopen(
            Request(f"{moto_server}/moto-api/reset-auth", data=b"inf", headers=PLAIN_TEXT)
        ).read()


def test_a_server_that_checks_signatures_takes_the_bulk_reads_and_refuses_a_forged_one(
    s3_bucket: str, enforced_auth: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    access_key, secret = enforced_auth
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    store = S3Store(s3_bucket, "p")
    for n, key in enumerate(KEYS):
        store.write(key, b'{"n": %d}' % n)
    for key in KEYS:
        assert store.bulk_read(key) == store.read(key)
    assert isinstance(store._direct, DirectReads)
    assert store.list_keys("") == sorted(KEYS)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret[:-1] + ("x" if secret[-1] != "x" else "y"))
    forged = S3Store(s3_bucket, "p")
    with pytest.raises(StoreError, match="access denied \\(SignatureDoesNotMatch\\)"):
        forged.bulk_read(KEYS[1])
    with pytest.raises(StoreError, match=r"listing .*access denied"):
        forged.list_keys("")


ODD_KEYS = [
    "reports/inbox/20261207T2359/a & b <c> 'd' \"e\".json",  # XML entities in the page
    "reports/inbox/20261207T2359/plus+and space.json",  # S3 URL-encodes a space as +
    "reports/inbox/20261207T2359/\u00e9t\u00e9 \u4e2d\u6587 %41 ~.json",
    "reports/inbox/20261207T2359/",  # a folder marker: not an object a store wrote
]


def test_listings_give_what_botocore_lists_across_pages(
    store: S3Store, s3_bucket: str, moto_server: str
) -> None:
    many = [f"reports/inbox/20261207T2359/dev-{i:05d}.json" for i in range(1003)]
    plain = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")  # no proxy
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: plain.put_object(Bucket=s3_bucket, Key=f"p/{k}"), many + ODD_KEYS))
    store.write("reports/other.json", b"{}")
    pages = store.client.get_paginator("list_objects_v2").paginate(
        Bucket=s3_bucket, Prefix="p/reports/inbox/"
    )
    botocore = [(o["Key"], o["Size"], o["LastModified"]) for p in pages for o in p["Contents"]]
    reads = store._direct_reads()
    assert reads is not None
    direct = list(reads.listing("p/reports/inbox/"))
    assert direct == botocore and len(direct) == 1003 + len(ODD_KEYS)
    listed = store.list_objects("reports/inbox/")
    assert [o.key for o in listed] == sorted(many + ODD_KEYS[:3])
    assert store.list_keys("reports/inbox/20261207T2359/") == sorted(many + ODD_KEYS[:3])


def test_listing_errors_are_the_stores(
    store: S3Store, s3_bucket: str, s3_proxy: FaultProxy
) -> None:
    store.write(KEYS[0], b"{}")
    s3_proxy.slow_down_next(f"/{s3_bucket}", n=2)
    assert store.list_keys("reports/") == sorted(KEYS[:1])  # two SlowDown, then the page
    s3_proxy.slow_down_next(f"/{s3_bucket}", n=3)
    with pytest.raises(TransientStoreError, match=r"listing .*503 SlowDown \(3 attempts\)"):
        store.list_keys("reports/")
    gone = open_store(f"s3://{s3_bucket}-gone/p")
    with pytest.raises(StoreMissing, match="does not exist"):
        gone.list_keys("reports/")
