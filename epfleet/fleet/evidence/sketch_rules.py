"""A mergeable quantile sketch of latencies (pure): DDSketch-style logarithmic buckets.

A value ``x > 0`` falls in bucket ``i = ceil(log(x) / log(GAMMA))``, the interval
``(GAMMA**(i-1), GAMMA**i]``, with ``GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)``;
the bucket stands for ``2 * GAMMA**i / (GAMMA + 1)``, within ``RELATIVE_ERROR`` (1 %) of
every value in it. Zero has a bucket of its own, a negative value the bucket of its
magnitude, mirrored. Two sketches merge by adding their buckets' counts, so a shard's
sketch and the fleet's are sums; a quantile read from a sketch is within 1 % of the value
of that rank in the values themselves (the median of an even count: of the mean of the two
middle ones).

Quantiles are read from ``(value, count)`` pairs: a sketch's representatives, or the exact
values when every one was kept (then they equal ``statistics.median`` and the
nearest-rank percentile of the values, to the bit).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

RELATIVE_ERROR = 0.01
GAMMA = (1 + RELATIVE_ERROR) / (1 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(GAMMA)
SMALLEST = 1e-9
"""Magnitudes below this count as zero."""

Bucket = tuple[int, int]
"""(sign: -1, 0 or 1, index)."""


def bucket_of(value: float) -> Bucket:
    """The bucket holding ``value`` (finite)."""
    if abs(value) < SMALLEST:
        return 0, 0
    return (1 if value > 0 else -1), math.ceil(math.log(abs(value)) / _LOG_GAMMA)


def representative(bucket: Bucket) -> float:
    """The value a bucket stands for: within ``RELATIVE_ERROR`` of every value in it."""
    sign, index = bucket
    return sign * 2 * GAMMA**index / (GAMMA + 1)


def sketched(buckets: Iterable[tuple[Bucket, int]]) -> list[tuple[float, int]]:
    """Bucket counts as ``(representative, count)`` pairs in increasing order."""
    return sorted((representative(b), n) for b, n in buckets if n > 0)


def _at_rank(pairs: list[tuple[float, int]], rank: int) -> float:
    """The value of 1-based ``rank`` among ``pairs`` (increasing)."""
    seen = 0
    for value, count in pairs:
        seen += count
        if seen >= rank:
            return value
    raise ValueError(f"rank {rank} past the {seen} values")


def total(pairs: list[tuple[float, int]]) -> int:
    return sum(n for _, n in pairs)


def median(pairs: list[tuple[float, int]]) -> float | None:
    """The median of the values ``pairs`` count (increasing), as ``statistics.median``
    takes it: the middle one, or the mean of the two middle ones; None when empty."""
    n = total(pairs)
    if n == 0:
        return None
    if n % 2:
        return _at_rank(pairs, n // 2 + 1)
    return (_at_rank(pairs, n // 2) + _at_rank(pairs, n // 2 + 1)) / 2


def percentile(pairs: list[tuple[float, int]], share: float) -> float | None:
    """The nearest-rank percentile (``share`` in 0..1), as
    ``epfleet.fleet.evidence.field_rules.percentile`` takes it; None when empty."""
    n = total(pairs)
    if n == 0:
        return None
    rank = max(1, -(-n * share // 1))
    return _at_rank(pairs, int(rank))


def within_error(estimate: float, exact: float) -> bool:
    """Whether ``estimate`` (read from a sketch) is within ``RELATIVE_ERROR`` of ``exact``
    (a ratio of two such, a latency regression, within twice that of ``1 + exact``)."""
    return abs(estimate - exact) <= RELATIVE_ERROR * abs(exact) + 1e-12
