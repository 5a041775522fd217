"""``S3Store.bulk_read`` (``epfleet.stores.s3.direct``: each read signed here, sent through a
pooled connection) against ``read`` (botocore's ``get_object``), on moto's S3 server over
HTTP behind the fault proxy: the same bytes and versions, the same answer for a missing
object, a missing bucket and an oversized document, transient answers retried and then
raised as transient, a silent server bounded by the stall timeout."""

from __future__ import annotations

import gzip
import time

import pytest

from epfleet.errors import DocumentTooLarge, StoreMissing, TransferTooSlow, TransientStoreError
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
