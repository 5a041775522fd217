"""The error measure: error over every element of every sample, divided by the output's
range over all samples (not within one), with a dtype floor for constant outputs; tails;
non-finite and out-of-domain variants refused."""

import numpy as np
import pytest

from epfleet.runtime.samples import compare

pytestmark = pytest.mark.fast


def _scalar_samples(values: list[float]) -> list[list[np.ndarray]]:
    return [[np.array([v], np.float32)] for v in values]


def test_a_scalar_output_is_measured_against_its_range_over_all_samples() -> None:
    reference = _scalar_samples([0.1, 0.5, 0.9])
    got = _scalar_samples([0.1, 0.52, 0.9])
    result = compare(got, reference)
    assert result.outputs[0].span == pytest.approx(0.8)
    assert result.max_rel_error == pytest.approx(0.025, rel=1e-3)
    assert result.failure(0.05) is None
    assert "2.5% of its range" in (result.failure(0.01) or "")


def test_the_range_spans_samples_not_the_widest_single_sample() -> None:
    reference = [[np.array([0.0, 1.0], np.float32)], [np.array([9.0, 10.0], np.float32)]]
    got = [[np.array([0.0, 1.0], np.float32)], [np.array([9.0, 10.5], np.float32)]]
    result = compare(got, reference)
    assert result.outputs[0].span == pytest.approx(10.0)
    assert result.max_rel_error == pytest.approx(0.05)


def test_a_constant_output_is_divided_by_the_dtype_floor_not_reported_infinite() -> None:
    reference = _scalar_samples([0.5, 0.5])
    exact = compare(reference, reference)
    assert exact.max_rel_error == 0.0
    off = compare(_scalar_samples([0.5, 0.5 + 2**-20]), reference)
    output = off.outputs[0]
    assert output.span == 0.0
    assert output.floor == pytest.approx(float(np.finfo(np.float32).eps))
    assert np.isfinite(off.max_rel_error) and off.max_rel_error > 1


def test_a_non_finite_output_where_the_source_is_finite_is_refused_naming_where() -> None:
    reference = _scalar_samples([0.2, 0.3])
    got = _scalar_samples([0.2, float("-inf")])
    with pytest.raises(ValueError, match=r"output 0 has NaN or inf \(-inf\) at sample 1"):
        compare(got, reference)


def test_a_probability_outside_zero_one_is_refused_naming_the_value() -> None:
    reference = _scalar_samples([0.0, 0.4, 1.0])
    got = _scalar_samples([0.0, 0.4, 1.03])
    result = compare(got, reference)
    # 3% of the range: within a 5% tolerance, yet beyond [0, 1] by more than the floor.
    assert result.failure(0.05, abs_tolerance=0.01) == (
        "output 0 gives 1.03, outside [0, 1] where every source value lies (allowance 0.01)"
    )
    assert result.failure(0.05, abs_tolerance=0.1) is None
    assert compare(_scalar_samples([0.0, 0.4, 1.0]), reference).failure(0.0) is None


def test_tails_report_the_max_and_the_p99_9_over_every_element() -> None:
    reference = [[np.zeros(1000, np.float32)], [np.zeros(1000, np.float32)]]
    second = np.zeros(1000, np.float32)
    second[0] = 7.0
    result = compare([[np.full(1000, 0.001, np.float32)], [second]], reference)
    output = result.outputs[0]
    assert output.max_abs_error == pytest.approx(7.0)
    assert output.tail_abs_error == pytest.approx(0.001, rel=1e-3)


def test_a_reused_verification_with_a_null_error_is_described_not_crashed() -> None:
    from epfleet.fleet.build.variant import describe_verification
    from epfleet.formats.variant_checks import Verification

    reused = Verification(status="passed", max_rel_error=None, tolerance=0.02, reused=True)
    text = describe_verification(reused)
    assert text.startswith("passed (error relative to range not recorded, tolerance 2.00%")
    assert "reused" in text
