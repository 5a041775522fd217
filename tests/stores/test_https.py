"""The read-only ``https://`` store (a mirror or CDN in front of a store), against a real HTTP
server on loopback (tests/support/http_mirror.py: Range, ETags, 304, HEAD): what it reads, what
it refuses, and that every wait is bounded, however the mirror misbehaves."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from epfleet.errors import (
    DeadlineExceeded,
    DocumentTooLarge,
    StoreError,
    TransferTooSlow,
    TransientStoreError,
)
from epfleet.limits import Deadline, within
from epfleet.settings import settings
from epfleet.stores import UNCHANGED, open_store
from epfleet.stores.https import HttpsStore
from tests.support.http_mirror import Mirror

pytestmark = pytest.mark.fast

DATA = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    root = tmp_path / "store"
    (root / "variants" / "m").mkdir(parents=True)
    (root / "variants" / "m" / "model.onnx").write_bytes(DATA)
    (root / "manifest.json").write_bytes(b'{"generation": 1}')
    served = Mirror(root)
    yield served
    served.close()


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1 s stall timeout, so that the bounded waits end quickly."""
    monkeypatch.setenv("EPFLEET_STALL_TIMEOUT", "1")
    settings.cache_clear() if hasattr(settings, "cache_clear") else None


def store(mirror: Mirror, path: str = "/") -> HttpsStore:
    opened = open_store(mirror.url + path)
    assert isinstance(opened, HttpsStore)
    return opened


def test_reads_documents_with_etags_and_conditional_gets(mirror: Mirror) -> None:
    got = store(mirror).read("manifest.json")
    assert got is not None and got.data == b'{"generation": 1}' and got.etag
    assert store(mirror).read_if_changed("manifest.json", got.etag) == UNCHANGED
    (mirror.root / "manifest.json").write_bytes(b'{"generation": 2}')
    again = store(mirror).read_if_changed("manifest.json", got.etag)
    assert again != UNCHANGED and again is not None and again.data == b'{"generation": 2}'
    assert store(mirror).read("nothing.json") is None


def test_ranged_reads_resume_where_they_stopped(mirror: Mirror) -> None:
    opened = store(mirror)
    key = "variants/m/model.onnx"
    assert b"".join(opened.read_range(key, 0)) == DATA
    assert b"".join(opened.read_range(key, 1000, 5000)) == DATA[1000:5000]
    assert b"".join(opened.read_range(key, len(DATA) - 10)) == DATA[-10:]
    mirror.faults.ignore_range = True  # a mirror that sends the whole object anyway
    assert b"".join(opened.read_range(key, 1000, 5000)) == DATA[1000:5000]
    assert opened.size(key) == len(DATA) and opened.size("none.onnx") is None
    with pytest.raises(StoreError, match="does not exist"):
        list(opened.read_range("none.onnx", 0))


def test_a_store_under_a_path_and_its_downloads(mirror: Mirror, tmp_path: Path) -> None:
    opened = store(mirror, "/variants")
    assert opened.size("m/model.onnx") == len(DATA)
    dest = tmp_path / "out" / "model.onnx"
    dest.parent.mkdir()
    opened.download("m/model.onnx", dest)
    assert dest.read_bytes() == DATA


def test_anything_that_writes_is_refused_naming_the_mirror(mirror: Mirror) -> None:
    opened = store(mirror)
    for attempt in (
        lambda: opened.write("manifest.json", b"{}"),
        lambda: opened.delete("manifest.json"),
        lambda: opened.list_keys(""),
        lambda: opened.touch("manifest.json"),
    ):
        with pytest.raises(StoreError, match="read-only mirror"):
            attempt()
    assert (mirror.root / "manifest.json").read_bytes() == b'{"generation": 1}'


def test_redirects_are_followed_a_few_times_only(mirror: Mirror) -> None:
    mirror.faults.redirect = {"/old.json": "/manifest.json"}
    got = store(mirror).read("old.json")
    assert got is not None and got.data == b'{"generation": 1}'
    mirror.faults.redirect = {"/loop.json": "/loop.json"}
    with pytest.raises(StoreError, match="more than 5 redirects"):
        store(mirror).read("loop.json")


def test_transient_answers_are_retried_then_reported(mirror: Mirror) -> None:
    mirror.faults.status = {"/manifest.json": [503, 502]}
    got = store(mirror).read("manifest.json")
    assert got is not None and got.data == b'{"generation": 1}'
    mirror.faults.status = {"/manifest.json": [503] * 10}
    with pytest.raises(TransientStoreError, match="answered 503"):
        store(mirror).read("manifest.json")
    mirror.faults.status = {"/manifest.json": [403]}
    with pytest.raises(StoreError, match="403"):
        store(mirror).read("manifest.json")


def test_a_document_past_its_limit_is_not_read(
    mirror: Mirror, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPFLEET_MAX_MANIFEST_BYTES", "8")
    with pytest.raises(DocumentTooLarge):
        store(mirror).read("manifest.json")
    monkeypatch.setenv("EPFLEET_MAX_MANIFEST_BYTES", "1MiB")
    mirror.faults.endless = {"/manifest.json"}  # no Content-Length, no end
    started = time.monotonic()
    with pytest.raises(DocumentTooLarge):
        store(mirror).read("manifest.json")
    assert time.monotonic() - started < 30


def test_an_endless_body_is_read_no_further_than_asked(mirror: Mirror) -> None:
    mirror.faults.endless = {"/model.onnx"}
    got = b"".join(store(mirror).read_range("variants/m/model.onnx", 0, 4096))
    assert len(got) == 4096


def test_trickled_headers_end_within_the_stall_timeout(mirror: Mirror, quick: None) -> None:
    mirror.faults.trickle_head = {"/manifest.json"}  # a byte each 0.5 s: a minute for a head
    mirror.faults.trickle_every = 0.5
    started = time.monotonic()
    with pytest.raises(TransientStoreError, match="no complete answer within 1 s"):
        store(mirror).read("manifest.json")
    assert time.monotonic() - started < 40  # 4 attempts of 1 s and their backoff


def test_a_stalled_body_ends_within_the_stall_timeout(mirror: Mirror, quick: None) -> None:
    mirror.faults.stall = {"/model.onnx"}
    started = time.monotonic()
    with pytest.raises(TransferTooSlow):
        b"".join(store(mirror).read_range("variants/m/model.onnx", 0))
    assert time.monotonic() - started < 30


def test_the_sync_deadline_stops_a_request_in_flight(mirror: Mirror) -> None:
    mirror.faults.trickle_head = {"/manifest.json"}
    started = time.monotonic()
    with within(Deadline.after(1.0)), pytest.raises(DeadlineExceeded):
        store(mirror).read("manifest.json")
    assert time.monotonic() - started < 20


def test_a_missing_objects_trickled_body_holds_no_read(mirror: Mirror) -> None:
    """A 404 whose 60,000-byte body comes a byte every 0.05 s (50 minutes): the read says
    the object is missing and the drain meant to keep the connection ends within its
    second, with or without a sync deadline (a sync ran 153 s past a 20 s one)."""
    mirror.faults.slow_missing = True
    mirror.faults.trickle_every = 0.05
    started = time.monotonic()
    assert store(mirror).read("trust/metadata/2.root.json") is None
    assert time.monotonic() - started < 15
    started = time.monotonic()
    with within(Deadline.after(0.5)):
        assert store(mirror).read("trust/metadata/3.root.json") is None
    assert time.monotonic() - started < 15
    mirror.heal()
    assert store(mirror).read("manifest.json") is not None  # the store still serves


def test_a_retry_after_past_the_deadline_says_so(mirror: Mirror) -> None:
    mirror.faults.status = {"/manifest.json": [503]}
    mirror.faults.retry_after = "3600"
    with within(Deadline.after(25)), pytest.raises(DeadlineExceeded) as stopped:
        store(mirror).read("manifest.json")
    said = str(stopped.value)
    assert (
        "asked to retry after 3600 s (Retry-After), later than the sync's deadline of 25 s" in said
    )
    assert "ran past" not in said
