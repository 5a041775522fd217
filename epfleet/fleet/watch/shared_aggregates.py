"""Runtime-watch's aggregates kept up to date by whichever pass folds the reports.

Runtime-watch judges reports against what only it knows (the fleet spec, its pair checks,
the compile workers' runtime, its report window: a ``WatchContext``). It leaves that
context in the store, sealed under the index key beside its aggregates
(``reports/evidence-index/<key id>/aggregates/watch/context.json.gz``), so that the gate's
and the field view's passes, which fold the new reports, fold runtime-watch's aggregates of
the shards they change too: runtime-watch's own pass then finds its sums current and
writes nothing. A context that does not verify, or that the reader cannot read back to the
same digest, is not used (runtime-watch folds its own, as before); an older one put back
costs computing, never a finding: a sum counts only under the context digest its reader
judges against.
"""

from __future__ import annotations

import gzip
import logging
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from epfleet.errors import StoreError
from epfleet.fleet.evidence.aggregate_rules import seal, unseal
from epfleet.fleet.evidence.aggregates import ShardAggregates
from epfleet.fleet.evidence.index import _index_folder, reading_from
from epfleet.fleet.watch.aggregate_rules import WatchContext, context_digest, contribution
from epfleet.fleet.watch.rules import PairCheck, Runtime
from epfleet.formats.spec import FleetSpec
from epfleet.stores import DocumentTooLarge, Store
from epfleet.text import printable

logger = logging.getLogger(__name__)

KIND = "watch"
_CONTEXT = "watch context"
_PLACE = -1


def context_key(key: bytes) -> str:
    return f"{_index_folder(key)}/aggregates/{KIND}/context.json.gz"


def watch_aggregates(
    reports: Store, key: bytes, context: WatchContext, now: int, written_only: bool = False
) -> ShardAggregates:
    """Runtime-watch's aggregates judged against ``context`` at ``now`` (microseconds);
    with ``written_only``, of the shards the pass writes alone (another reader's pass)."""
    return ShardAggregates(
        reports,
        key,
        KIND,
        context_digest(context),
        lambda report_key, record: contribution(reading_from(report_key, record), context),
        now,
        written_only=written_only,
    )


def keep_context(reports: Store, key: bytes, context: WatchContext) -> None:
    """Leave ``context`` in the store for the other readers' passes (written only when it
    changed; a store this reader cannot write keeps the one it has)."""
    digest = context_digest(context)
    kept = _read(reports, key)
    if kept is not None and kept.get("digest") == digest:
        return
    body = {
        "digest": digest,
        "spec": context.spec.model_dump(mode="json"),
        "checks": [c.model_dump(mode="json") for c in context.checks],
        "runtime": context.runtime.model_dump(mode="json"),
        "max_age": context.max_age.total_seconds(),
    }
    data = gzip.compress(seal(_CONTEXT, _PLACE, body, key), 6, mtime=0)
    try:
        reports.write(context_key(key), data)
    except StoreError as exc:
        logger.info("runtime-watch's context not left in the store: %s", exc)


def stored_context(reports: Store, key: bytes) -> WatchContext | None:
    """The context runtime-watch left in the store; None when there is none or it is not
    usable (then the reason is logged)."""
    body = _read(reports, key)
    if body is None:
        return None
    try:
        context = WatchContext(
            spec=FleetSpec.model_validate(body["spec"]),
            checks=[PairCheck.model_validate(c) for c in body["checks"]],
            runtime=Runtime.model_validate(body["runtime"]),
            max_age=timedelta(seconds=float(body["max_age"])),
        )
    except (ValidationError, KeyError, TypeError, ValueError) as exc:
        logger.warning("runtime-watch's stored context not used: %s", printable(str(exc)))
        return None
    if context_digest(context) != body.get("digest"):
        logger.warning("runtime-watch's stored context does not read back the same: not used")
        return None
    return context


def _read(reports: Store, key: bytes) -> dict[str, Any] | None:
    where = context_key(key)
    try:
        stored = reports.read(where)
        if stored is None:
            return None
        return unseal(_CONTEXT, _PLACE, gzip.decompress(stored.data), key)
    except (DocumentTooLarge, ValueError, KeyError, TypeError, OSError, EOFError) as exc:
        logger.warning("runtime-watch's stored context not used: %s", printable(f"{where}: {exc}"))
        return None
