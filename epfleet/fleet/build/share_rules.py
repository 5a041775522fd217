"""How much a rate metric's count shows (pure: numbers in, numbers out).

A rate metric (``argmax_agreement``, ``topk_agreement``, ``sequence_match``) counts the
rows or sequences on which a variant agrees with its source: ``hits`` of ``trials``. The
count is weighed against the metric's ``min`` with exact (Clopper-Pearson) binomial bounds,
each one-sided at ``CONFIDENCE``, so the interval between them is a 90 % two-sided one:

- the evidence shows the variant *reaches* ``min`` when the lower bound is at least ``min``;
- it shows the variant *misses* ``min`` when the upper bound is below ``min``;
- otherwise it is *undecided*, and the point value decides (published when
  ``hits / trials >= min``), as it did before bounds were weighed. Whatever the evidence,
  the verdict is the point value's: the bounds say how far it can be trusted, how many
  more inputs would settle it, and when the inputs already run have settled it, so that
  verification may stop early.

12 of 12 has a lower bound of 0.779: no count of 12 can show 0.99, and 299 agreeing
inputs are the fewest that can (0.05 ** (1 / 299) >= 0.99).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

CONFIDENCE = 0.95
"""Each bound's one-sided confidence: a verdict shown either way is wrong 5 % of the time
at most (for independent trials)."""

Evidence = Literal["reaches", "misses", "undecided"]


def lower_bound(hits: int, trials: int, confidence: float = CONFIDENCE) -> float:
    """The lowest rate consistent with ``hits`` of ``trials`` (one-sided, exact)."""
    _check(hits, trials)
    if hits == 0:
        return 0.0
    alpha = 1.0 - confidence
    # The rate p at which seeing ``hits`` or more has probability alpha.
    return _solve(lambda p: 1.0 - _binomial_cdf(hits - 1, trials, p) - alpha, rising=True)


def upper_bound(hits: int, trials: int, confidence: float = CONFIDENCE) -> float:
    """The highest rate consistent with ``hits`` of ``trials`` (one-sided, exact)."""
    _check(hits, trials)
    if hits == trials:
        return 1.0
    alpha = 1.0 - confidence
    # The rate p at which seeing ``hits`` or fewer has probability alpha.
    return _solve(lambda p: _binomial_cdf(hits, trials, p) - alpha, rising=False)


def evidence(hits: int, trials: int, minimum: float, confidence: float = CONFIDENCE) -> Evidence:
    """What ``hits`` of ``trials`` shows about a rate's ``minimum``."""
    if lower_bound(hits, trials, confidence) >= minimum:
        return "reaches"
    if upper_bound(hits, trials, confidence) < minimum:
        return "misses"
    return "undecided"


def trials_to_decide(
    rate: float, minimum: float, confidence: float = CONFIDENCE, limit: int = 10_000_000
) -> int | None:
    """The fewest trials at which a count at ``rate`` would settle ``minimum`` either way:
    show it reached (``rate > minimum``) or missed (``rate < minimum``). None when no count
    can (``rate == minimum``, or a ``minimum`` of 1 or more, which no finite count shows) or
    it would take more than ``limit``."""
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"a rate lies in 0..1, not {rate}")
    if rate == minimum or (rate > minimum and minimum >= 1.0):
        return None
    if rate > minimum and minimum <= 0.0:
        return 1

    def settles(n: int) -> bool:
        hits = min(n, max(0, round(rate * n)))
        return evidence(hits, n, minimum, confidence) != "undecided"

    high = 1
    while not settles(high):
        if high > limit:
            return None
        high *= 2
    low = high // 2
    while high - low > 1:  # the first n that settles, within rounding of the rate
        middle = (low + high) // 2
        if settles(middle):
            high = middle
        else:
            low = middle
    return high


@dataclass(frozen=True)
class ShareVerdict:
    """A rate metric's count weighed against its ``minimum``."""

    hits: int
    trials: int
    minimum: float
    low: float
    high: float
    evidence: Evidence
    to_show_reached: int | None
    """Agreeing trials that would show ``minimum`` reached, every one of them agreeing."""
    to_settle: int | None
    """Trials that would settle ``minimum`` at the observed rate."""

    @property
    def rate(self) -> float:
        return self.hits / self.trials

    @property
    def passed(self) -> bool:
        return self.rate >= self.minimum

    def doubt(self, kind: str, unit: str = "trials") -> str | None:
        """What the count cannot show, and how many ``unit`` would (None once settled):
        ``sequence_match 11/12 = 0.917; 12 inputs cannot show >= 0.99 either way: about 299
        all agreeing would show it reached, about 18 at this rate would show it missed``."""
        if self.evidence != "undecided":
            return None
        said = (
            f"{kind} {self.hits}/{self.trials} = {self.rate:.3g}; {self.trials} {unit} cannot "
            f"show >= {self.minimum:g} either way"
        )
        ways = []
        if self.to_show_reached is not None:
            ways.append(f"about {self.to_show_reached} all agreeing would show it reached")
        if self.to_settle is not None and self.rate != 1.0:
            missed = "reached" if self.passed else "missed"
            ways.append(f"about {self.to_settle} at this rate would show it {missed}")
        if not ways:
            return said + " (no count can show a minimum of 1 reached; a miss can refute it)"
        return said + ": " + ", ".join(ways)


def weigh(hits: int, trials: int, minimum: float, confidence: float = CONFIDENCE) -> ShareVerdict:
    """``hits`` of ``trials`` weighed against ``minimum``: bounds, evidence, and what
    would settle it."""
    _check(hits, trials)
    if trials == 0:
        raise ValueError("a rate needs at least one trial")
    rate = hits / trials
    return ShareVerdict(
        hits=hits,
        trials=trials,
        minimum=minimum,
        low=lower_bound(hits, trials, confidence),
        high=upper_bound(hits, trials, confidence),
        evidence=evidence(hits, trials, minimum, confidence),
        to_show_reached=trials_to_decide(1.0, minimum, confidence) if minimum < 1.0 else None,
        to_settle=trials_to_decide(rate, minimum, confidence),
    )


def _check(hits: int, trials: int) -> None:
    if trials < 0 or not 0 <= hits <= trials:
        raise ValueError(f"{hits} hits of {trials} trials is not a count")


def _solve(f: object, rising: bool) -> float:
    """The root of ``f`` in [0, 1] by bisection; ``rising``: f grows with p."""
    assert callable(f)
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if (f(middle) < 0) == rising:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def _binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), as the regularised incomplete beta I_{1-p}(n-k, k+1)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 0.0
    return _incomplete_beta(n - k, k + 1, 1.0 - p)


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 10_000):
        step = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        for term in (step, -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + term * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + term / c
            c = c if abs(c) > tiny else tiny
            result *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return result
