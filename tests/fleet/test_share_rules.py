"""A rate metric's count weighed against its minimum (pure): exact one-sided bounds, what
they show, and how many trials would settle what they cannot."""

from __future__ import annotations

import math

import pytest

from epfleet.fleet.build.share_rules import (
    evidence,
    lower_bound,
    trials_to_decide,
    upper_bound,
    weigh,
)

pytestmark = pytest.mark.fast


def at_least(k: int, n: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


def test_no_count_of_twelve_shows_ninety_nine_percent() -> None:
    assert lower_bound(12, 12) == pytest.approx(0.05 ** (1 / 12))  # 0.779
    assert lower_bound(12, 12) < 0.78
    assert evidence(12, 12, 0.99) == "undecided"
    assert evidence(11, 12, 0.99) == "undecided"


@pytest.mark.parametrize(("hits", "trials"), [(1, 5), (11, 12), (30, 40), (97, 100), (3, 7)])
def test_the_bounds_are_exact_binomial_tails(hits: int, trials: int) -> None:
    low, high = lower_bound(hits, trials), upper_bound(hits, trials)
    assert low < hits / trials < high
    assert at_least(hits, trials, low) == pytest.approx(0.05, abs=1e-9)
    assert 1 - at_least(hits + 1, trials, high) == pytest.approx(0.05, abs=1e-9)
    assert lower_bound(trials - hits, trials) == pytest.approx(1 - high, abs=1e-12)


def test_the_ends_of_the_scale() -> None:
    assert lower_bound(0, 5) == 0.0 and upper_bound(5, 5) == 1.0
    assert upper_bound(0, 5) == pytest.approx(1 - 0.05 ** (1 / 5))
    with pytest.raises(ValueError):
        lower_bound(6, 5)
    with pytest.raises(ValueError):
        weigh(0, 0, 0.5)


def test_a_clear_miss_is_shown_and_a_long_clean_run_shows_the_minimum() -> None:
    assert evidence(14, 16, 0.99) == "misses"  # two misread strings of 16
    assert evidence(298, 298, 0.99) == "undecided"
    assert evidence(299, 299, 0.99) == "reaches"
    assert trials_to_decide(1.0, 0.99) == 299


def test_what_would_settle_it() -> None:
    assert trials_to_decide(0.99, 0.99) is None  # a rate at its minimum never settles
    assert trials_to_decide(1.0, 1.0) is None  # no finite count shows a minimum of 1
    assert trials_to_decide(0.5, 0.0) == 1
    settle = trials_to_decide(11 / 12, 0.99)
    assert settle is not None and 12 < settle < 40
    hits = round(11 / 12 * settle)
    assert evidence(hits, settle, 0.99) == "misses"
    assert evidence(round(11 / 12 * (settle - 1)), settle - 1, 0.99) == "undecided"


def test_an_undecided_count_says_how_many_more_would_decide() -> None:
    verdict = weigh(11, 12, 0.99)
    assert verdict.evidence == "undecided" and not verdict.passed
    assert (round(verdict.low, 3), round(verdict.high, 3)) == (0.661, 0.996)
    assert verdict.doubt("sequence_match", "inputs") == (
        "sequence_match 11/12 = 0.917; 12 inputs cannot show >= 0.99 either way: about 299 "
        "all agreeing would show it reached, about 18 at this rate would show it missed"
    )
    clean = weigh(12, 12, 0.99)
    assert clean.passed and clean.doubt("argmax_agreement") == (
        "argmax_agreement 12/12 = 1; 12 trials cannot show >= 0.99 either way: about 299 all "
        "agreeing would show it reached"
    )
    assert weigh(14, 16, 0.99).doubt("x") is None  # settled: nothing to add
    assert "no count can show a minimum of 1" in (weigh(5, 5, 1.0).doubt("x") or "")


@pytest.mark.parametrize(
    ("hits", "trials", "minimum", "shown", "published"),
    [
        # Counts measured with bench/verification_cases.py on ddddocr's reader (PyPI
        # ddddocr 1.6.1, common.onnx), HTP v73 and v68, 96 calibration inputs, 12 samples.
        (11, 12, 0.97, "undecided", False),  # w8a8 and w8a16, whole paths on the samples
        (155, 160, 0.99, "misses", False),  # w8a8, strings on 160 held-out captchas
        (158, 160, 0.97, "undecided", True),  # w8a16, strings held out (as a captcha CRNN's w8a8)
        # The figures that set the default's bound (decision_rules.DEFAULT_DECISION_MIN).
        (138, 160, 0.97, "misses", False),  # a text reader's w8a8 (0.863)
        (61, 64, 0.97, "undecided", False),  # ddddocr's w8a8 at 64x160 (0.953)
    ],
)
def test_the_measured_counts_against_their_minimums(
    hits: int, trials: int, minimum: float, shown: str, published: bool
) -> None:
    verdict = weigh(hits, trials, minimum)
    assert verdict.evidence == shown
    assert verdict.passed is published  # the point value decides an undecided count


def test_the_default_on_twelve_samples_says_how_many_inputs_would_settle_it() -> None:
    """ddddocr's w8a8 reader on HTP v73, 11 of 12 whole paths: the refusal names the
    calibration inputs that would settle it."""
    said = weigh(11, 12, 0.97).doubt("sequence_match", "inputs")
    assert said == (
        "sequence_match 11/12 = 0.917; 12 inputs cannot show >= 0.97 either way: about 99 all "
        "agreeing would show it reached, about 55 at this rate would show it missed"
    )
