"""The evidence bench's fit (pure): terms recovered from synthetic passes, terms it cannot
separate left out and said so, inconsistent passes warned about, and the hour composed
from the terms as the schedule runs the passes."""

from __future__ import annotations

import pytest

from epfleet.fleet.pass_cost_rules import (
    FOLDING,
    FULL_LISTING,
    Measured,
    Schedule,
    Terms,
    fit_pass,
    fit_terms,
    hour,
    totals,
)

pytestmark = pytest.mark.fast

SIZES = (10_000, 30_000, 100_000)


def synthetic(fixed: float, per_device: float, per_new: float, shares=(0.05, 0.2)):
    return [
        (n, int(n * share), fixed + per_device * n + per_new * int(n * share))
        for n in SIZES
        for share in shares
    ]


def test_the_fit_recovers_known_terms():
    terms = fit_terms(synthetic(514.0, 0.002, 2.5))
    assert terms.fixed == pytest.approx(514.0)
    assert terms.per_device == pytest.approx(0.002)
    assert terms.per_new == pytest.approx(2.5)
    assert terms.warnings == ()
    assert terms.at(1_000_000, 50_000) == pytest.approx(514 + 2_000 + 125_000)


def test_noise_moves_the_terms_little_and_is_not_warned_about():
    noisy = [
        (n, r, cost * (1.03 if k % 2 else 0.97))
        for k, (n, r, cost) in enumerate(synthetic(0.5, 2e-4, 4e-3))
    ]
    terms = fit_terms(noisy)
    assert terms.per_new == pytest.approx(4e-3, rel=0.15)
    assert terms.per_device == pytest.approx(2e-4, rel=0.15)
    assert terms.warnings == ()


def test_new_reports_always_the_same_share_of_n_are_not_separated():
    terms = fit_terms(synthetic(10.0, 0.01, 1.0, shares=(0.05,)), "gate, GET")
    assert terms.per_new == 0.0
    assert terms.per_device == pytest.approx(0.01 + 0.05 * 1.0)
    assert any("not separable" in w and w.startswith("gate, GET") for w in terms.warnings)


def test_one_size_gives_no_per_device_term_and_says_so():
    terms = fit_terms([(10_000, 500, 1_500.0), (10_000, 2_000, 3_000.0)], "cpu")
    assert terms.per_device == 0.0
    assert terms.per_new == pytest.approx(1.0)
    assert any("one N only" in w for w in terms.warnings)


def test_a_negative_term_is_warned_about():
    # a cost that falls as the fleet grows: something in the measured passes is off
    terms = fit_terms(synthetic(5_000.0, -0.02, 1.0), "PUT")
    assert terms.per_device == pytest.approx(-0.02)
    assert any("negative per device term" in w for w in terms.warnings)


def test_passes_the_terms_do_not_fit_are_warned_about():
    # a cost that grows as N squared is not fixed + per device + per new report
    curved = [(n, r, 1e-8 * n * n) for n, r, _ in synthetic(0, 0, 0)]
    terms = fit_terms(curved, "cpu")
    assert any("not linear" in w for w in terms.warnings)


def test_no_passes_is_an_error_naming_the_measure():
    with pytest.raises(ValueError, match="cpu: no measured passes"):
        fit_terms([], "cpu")


def test_the_hour_counts_each_pass_as_often_as_the_schedule_runs_it():
    fits = {
        FOLDING: {"GET": Terms(500.0, 0.001, 2.0)},
        FULL_LISTING: {"GET": Terms(0.0, 0.001, 0.0)},
        "sharing": {"GET": Terms(514.0, 0.0, 0.0)},
    }
    once = Schedule("once", folding=1, sharing={"sharing": 2}, full_listing_every=12)
    spent = hour(fits, once, 1_000_000, 50_000)
    assert spent[FOLDING]["GET"] == pytest.approx((500.0, 1_000.0, 100_000.0))
    assert spent["sharing"]["GET"] == pytest.approx((1_028.0, 0.0, 0.0))
    assert spent[FULL_LISTING]["GET"] == pytest.approx((0.0, 1_000 / 12, 0.0))
    six = Schedule("six", folding=6, sharing={"sharing": 2}, full_listing_every=12)
    more = totals(hour(fits, six, 1_000_000, 50_000))["GET"]
    # six folding passes pay the fixed and per-device parts six times, the new reports once
    assert more == pytest.approx((6 * 500.0 + 1_028.0, 6_000.0 + 500.0, 100_000.0))


def test_fit_pass_fits_each_measure_of_a_kind_of_pass():
    passes = [
        Measured(n, r, {"GET": 514 + 2.0 * r, "cpu": 0.5 + 1e-4 * n + 4e-3 * r})
        for n, r, _ in synthetic(0, 0, 0)
    ]
    fits = fit_pass(passes, ("GET", "cpu"), "gate")
    assert fits["GET"].fixed == pytest.approx(514.0)
    assert fits["GET"].per_new == pytest.approx(2.0)
    assert fits["cpu"].per_device == pytest.approx(1e-4)
    assert fits["cpu"].per_new == pytest.approx(4e-3)


def test_a_difference_of_passes_is_judged_against_the_passes_not_itself():
    # a full listing's cost beyond the folding pass: near zero, each figure +-30 GETs of noise
    points = [(10_000, 0, -28.0), (30_000, 0, -1.0), (100_000, 0, 20.0)]
    alone = fit_terms(points, "GET")
    assert any("not linear" in w for w in alone.warnings)
    judged = fit_terms(points, "GET", sizes=[1_239.0, 2_269.0, 5_770.0])
    assert judged.warnings == ()
