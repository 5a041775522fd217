"""Passes of the evidence index checked against a full recount of the reports, and the store
wrappers that put another reader or a crash between a pass's reads and its writes: the
index's, its inbox's and its aggregates' tests (on the staged store of
tests/support/staged_rollout.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from epfleet.fleet.evidence.index import INDEX_PREFIX, update
from epfleet.fleet.rollout.rollouts import GateReading, read_evidence
from epfleet.stores import Store
from tests.support.fake_clock import FakeClock
from tests.support.staged_rollout import MEMBERS, put, report, settled


def same_as_recount(store: Store, clock: FakeClock | None = None) -> GateReading:
    """A pass of the index once what was written is settled, checked against a full
    recount (on ``clock`` when given)."""
    settled(store)
    kwargs = {"clock": clock} if clock is not None else {}
    reading = read_evidence(store, **kwargs)  # type: ignore[arg-type]
    recount = read_evidence(store, full=True, **kwargs)  # type: ignore[arg-type]
    assert reading.model_dump(exclude={"index"}) == recount.model_dump(exclude={"index"})
    return reading


def shard_objects(store: Store) -> list[str]:
    """The index's shards (not the aggregates kept beside them)."""
    return [
        k
        for k in store.list_keys(f"{INDEX_PREFIX}/")
        if k.endswith(".json.gz") and "/aggregates/" not in k
    ]


def put_back_after_failures(store: Store, objects: list[str]) -> tuple[GateReading, GateReading]:
    """``objects`` of the index (genuinely sealed) put back as they were before three
    members failed: the reading that halted on the failures, and the one after."""
    old = {where: store.read(where) for where in objects}
    for device in MEMBERS[1:4]:
        put(store, report(device, True, "failed"))
    halted = same_as_recount(store)
    assert halted.statuses[0].verdict.decision == "halt"
    for where, stored in old.items():
        assert stored is not None
        store.write(where, stored.data)
    return halted, same_as_recount(store)


class Interposed:
    """A store whose shard writes run ``before`` first, with how many so far (another
    reader's pass, a crash): what happens between a reader's reads and its writes."""

    def __init__(self, inner: Store, before: Callable[[int], None]) -> None:
        self.inner, self.before, self.writes = inner, before, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def write(self, key: str, data: bytes, **options: Any) -> str:
        if key.endswith(".json.gz"):
            self.writes += 1
            self.before(self.writes)
        return self.inner.write(key, data, **options)


class Killed(BaseException):
    """A reader killed mid-pass (not an Exception: nothing in the pass catches it)."""


def pass_killed_at_write(store: Store, write: int = 3) -> None:
    """A pass of the index, once what was written is settled, killed as it makes its
    ``write``-th shard write."""

    def kill(writes: int) -> None:
        if writes == write:
            raise Killed

    settled(store)
    with pytest.raises(Killed):
        update(Interposed(store, kill), {})  # type: ignore[arg-type]
