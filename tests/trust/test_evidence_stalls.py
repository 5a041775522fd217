"""A store that stops answering under the evidence index, the rollout gate and the key bins
it reads: S3 (moto over HTTP) behind the fault proxy, one GET stalled after its first bytes
(a shard, the head, a report, a key bin, the keys index), a LIST stalled mid-answer (every
device's keys, the inbox), or every read of the pass stalled at once. Each pass ends within
a few stall timeouts (``EPFLEET_STALL_TIMEOUT``, per attempt) with an error naming what it
was reading, counts nothing it did not read, and leaves an index that, once the store
answers again, agrees with a full recount."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from epfleet.device.reporting import upload_report
from epfleet.errors import StoreError, Unverified
from epfleet.fleet.evidence.enrolment import enroll, keys_in_force, local_key_bins
from epfleet.fleet.evidence.index import head_key, index_key, shard_key
from epfleet.fleet.evidence.index_rules import SHARDS, shard_of
from epfleet.fleet.rollout.rollouts import GateReading, read_evidence
from epfleet.formats.device_report import encode_report, report_key
from epfleet.stores import Store, open_store
from epfleet.stores.s3 import S3Store
from epfleet.trust.device_keys import DeviceRecord, record_target
from epfleet.trust.keys import read_private_key
from epfleet.trust.layout import KEYS_INDEX_KEY, metadata_key
from epfleet.trust.state import clear_cache
from tests.support.evidence_passes import same_as_recount
from tests.support.s3proxy import FaultProxy
from tests.support.signed_store import signed_store, stage
from tests.support.staged_rollout import (
    MEMBERS,
    OUTSIDE,
    POLICY,
    ROLLOUT,
    put,
    real_fleet,
    report,
    settled,
    settled_at_once,  # noqa: F401 (autouse)
    staged_store,  # noqa: F401 (the fixture store)
)

pytestmark = pytest.mark.slow

STALL_SECONDS = 5
"""Set only for the pass that meets the stall: short, and still well above what an answer
from moto takes on a busy machine, so that it fails on the read stalled, not on one merely
slow (the reads before and after it keep the default)."""
ATTEMPTS = 2
BOUND_SECONDS = 90.0
"""Far above what a pass takes here (a stalled read's attempts, 6-20 s), far below what a
stall left alone takes: the proxy holds a stalled answer until the client gives up."""
FAILING = OUTSIDE[5:10]


@pytest.fixture(autouse=True)
def _few_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", str(ATTEMPTS))
    monkeypatch.setattr("epfleet.stores.s3.direct.MAX_BACKOFF", 0.05)


LISTING = S3Store.iter_objects


def list_stalled_at(
    monkeypatch: pytest.MonkeyPatch, prefix: str, stall: Callable[[], None]
) -> None:
    """``stall`` armed as a pass starts listing ``prefix`` (and not before: the pass's
    clock is listed first)."""
    listing = LISTING

    def armed(self: S3Store, at: str, **options: Any) -> Iterator[Any]:
        if at.startswith(prefix):
            stall()
        return listing(self, at, **options)

    monkeypatch.setattr(S3Store, "iter_objects", armed)


def bounded(read: Callable[[], GateReading]) -> str:
    """The error a pass that cannot finish ends with, within the bound (``read`` opens the
    store it reads: its limits are those in force when it is opened)."""
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as short, pytest.raises(StoreError) as ended:
        short.setenv("EPFLEET_STALL_TIMEOUT", str(STALL_SECONDS))
        read()
    assert time.monotonic() - started < BOUND_SECONDS
    return str(ended.value)


@pytest.mark.parametrize("store", ["s3"], indirect=True)
@pytest.mark.parametrize(
    "stalled", ["shard", "head", "report", "every device's key", "inbox", "every read"]
)
def test_a_pass_over_a_stalled_store_ends_in_time_and_a_recount_agrees_after(
    store: Store,
    s3_proxy: FaultProxy,
    s3_bucket: str,
    monkeypatch: pytest.MonkeyPatch,
    stalled: str,
) -> None:
    monkeypatch.setenv("EPFLEET_EVIDENCE_FULL_LISTING_EVERY", "1" if stalled != "inbox" else "4")
    real_fleet(store, "advance")
    for device in OUTSIDE[5:15]:
        put(store, report(device, False, "kept"))
    first = same_as_recount(store)
    proxied = open_store(store.uri)  # through the proxy
    for device in FAILING:
        done = upload_report(proxied, report(device, False, "failed"))  # and its notice
        assert done.report_uploaded, done.report_error
    settled(store)
    root, key = f"/{s3_bucket}/fleet/", index_key()
    shard = shard_key(key, shard_of(report_key(FAILING[0])))
    every = ATTEMPTS * 2
    if stalled == "shard":
        s3_proxy.stall_next_get_responses(root + shard, after=10, n=every)
        named = shard
    elif stalled == "head":
        s3_proxy.stall_next_get_responses(root + head_key(key), after=10, n=every)
        named = head_key(key)
    elif stalled == "report":
        s3_proxy.stall_next_get_responses(root + report_key(FAILING[0]), after=10, n=every)
        named = report_key(FAILING[0])
    elif stalled == "every read":
        for device in [*OUTSIDE[:15], *MEMBERS[:1], "dev-000"]:
            s3_proxy.stall_next_get_responses(root + report_key(device), n=every)
        for n in range(SHARDS):
            s3_proxy.stall_next_get_responses(root + shard_key(key, n), n=every)
        named = "aborted"
    else:
        prefix = "reports/devices/" if stalled == "every device's key" else "reports/inbox/"
        list_stalled_at(
            monkeypatch,
            prefix,
            lambda: s3_proxy.stall_next_get_responses(f"/{s3_bucket}", after=200, n=every),
        )
        named = f"listing {store.uri}/{prefix}"
    error = bounded(lambda: read_evidence(open_store(store.uri)))
    assert named in error and "EPFLEET_STALL_TIMEOUT" in error
    monkeypatch.setattr(S3Store, "iter_objects", LISTING)  # the store answers again
    monkeypatch.setenv("EPFLEET_EVIDENCE_FULL_LISTING_EVERY", "1")  # every key listed
    s3_proxy._slow_get.clear()
    settled(store)
    after = same_as_recount(proxied)
    assert after.statuses[0].evidence.previous.failed == len(FAILING)
    assert after.read == first.read


SIGNED_ROLLOUT = ROLLOUT.model_copy(
    update={"policy": POLICY.model_copy(update={"authenticated_reports": True, "min_reports": 1})}
)


@pytest.fixture
def signed(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Store:
    """A signed S3 store (opened before the proxy), model-0 under a rollout that counts
    only signed reports."""
    request.param = "s3"
    opened = signed_store(request, tmp_path, monkeypatch)
    stage(opened, SIGNED_ROLLOUT)
    return opened


def new_machine() -> None:
    """A reader on another machine: no key bin verified, in memory or kept."""
    clear_cache()
    shutil.rmtree(local_key_bins(), ignore_errors=True)


@pytest.mark.parametrize("stalled", ["key bin", "keys index"])
def test_a_stalled_key_bin_or_keys_index_ends_the_pass_and_counts_no_signed_report_less(
    signed: Store,
    s3_proxy: FaultProxy,
    s3_bucket: str,
    tmp_path: Path,
    stalled: str,
) -> None:
    devices = MEMBERS[:3]
    for device in devices:
        enroll(signed, device, keys_dir=tmp_path / "keys")
        signer = read_private_key(tmp_path / "keys" / f"{device}.pem")
        failed = encode_report(report(device, True, "failed"), signer)
        signed.write(report_key(device), failed)
    settled(signed)
    new_machine()
    halted = same_as_recount(signed)
    assert halted.statuses[0].evidence.new.failed == len(devices)
    assert halted.statuses[0].verdict.decision == "halt"
    book = keys_in_force(signed).book
    if stalled == "key bin":
        name = book.bin_of(record_target(DeviceRecord(device=devices[0])).info.path)
        where = metadata_key(name, book.listing()[f"{name}.json"].version)
    else:
        where = KEYS_INDEX_KEY
    proxied = open_store(signed.uri)
    new_machine()
    s3_proxy.stall_next_get_responses(f"/{s3_bucket}/fleet/{where}", after=10, n=ATTEMPTS * 2)
    started = time.monotonic()
    try:
        with pytest.MonkeyPatch.context() as short:
            short.setenv("EPFLEET_STALL_TIMEOUT", str(STALL_SECONDS))
            found: GateReading | None = read_evidence(open_store(signed.uri))
    except (StoreError, Unverified) as exc:
        found = None
        assert where in str(exc) or "stall" in str(exc).lower(), exc
    assert time.monotonic() - started < BOUND_SECONDS
    if found is not None:  # answered: then with every signed report counted
        assert found.statuses[0].evidence.new.failed == len(devices)
    s3_proxy._slow_get.clear()
    new_machine()
    again = same_as_recount(proxied)
    assert again.statuses == halted.statuses
