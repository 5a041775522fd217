"""What a failed integer rung advises (pure): the next precision the target makes that
the ladder has not tried, then per-channel weights when off, the calibration method, and
the layers the failure names."""

from __future__ import annotations

import pytest

import eps
from epfleet.runtime.quantize import ladder_advice
from epfleet.runtime.requests import QuantizeOptions

pytestmark = pytest.mark.fast

QNN = eps.load("QNNExecutionProvider")
V73 = {"backend_type": "htp", "htp_arch": "73"}
V69 = {"backend_type": "htp", "htp_arch": "69"}
V68 = {"backend_type": "htp", "htp_arch": "68"}


def advice(precision, options, ladder, **quantize) -> str:  # type: ignore[no-untyped-def]
    return ladder_advice(
        precision,
        QNN.precisions(options),
        ladder,
        QuantizeOptions(calibration=None, **quantize),
        QNN.precision_limits(options),
    )


def test_after_w8a16_fails_it_names_w16a16_not_w8a16_again() -> None:
    said = advice("w8a16", V73, ["w8a16"])
    assert "1) w16a16, the next precision this target makes (precision: [w8a16, w16a16])" in said
    assert "(w8a16)" not in said
    assert "2) per-channel weights (quantization.per_channel: true)" in said
    assert "entropy or percentile; this one minmax" in said
    assert said.index("per-channel") < said.index("calibrate_method") < said.index("float")


def test_a_ladder_s_own_next_rung_is_named_as_such_and_tried_ones_skipped() -> None:
    assert "1) the ladder's next rung, w8a16" in advice("w8a8", V73, ["w8a8", "w8a16"])
    said = advice("w8a8", V73, ["w8a8", "w16a16"])
    assert (
        "1) w8a16, the next precision this target makes (precision: [w8a8, w8a16, w16a16])" in said
    )
    # fp16 and w8a16 lost before w8a8: the next untried wider one is w16a16
    said = advice("w8a8", V73, ["fp16", "w8a16", "w8a8"], per_channel=True)
    assert "1) w16a16" in said and "per-channel" not in said


def test_v69_goes_from_w8a16_to_fp16_and_v68_has_nothing_wider() -> None:
    assert "1) fp16, the next precision" in advice("w8a16", V69, ["w8a16"])
    said = advice("w8a8", V68, ["w8a8"], calibrate_method="entropy")
    assert "1) no wider precision to try (HTP v68" in said
    assert "minmax or percentile; this one entropy" in said


def test_qnn_names_its_memory_and_op_refusals_and_keeps_quiet_otherwise() -> None:
    mem = "Failed to finalize QNN graph. Error: QNN_COMMON_ERROR_MEM_ALLOC: Memory allocation"
    assert "ran out of memory" in (QNN.compile_error_advice(mem) or "")
    layout = (
        "Node 'n_token_1' OpType:Conv with domain:com.ms.internal.nhwc was inserted using the "
        "NHWC format as requested by QNNExecutionProvider, but was not selected by that EP."
    )
    assert "the HTP refused a Conv for its data types" in (QNN.compile_error_advice(layout) or "")
    nothing = "FAIL : Unable to compile any nodes. Check that the session EPs support"
    assert "QNN took no node of the model" in (QNN.compile_error_advice(nothing) or "")
    assert QNN.compile_error_advice("Invalid input name: x2") is None
    assert eps.load("CPUExecutionProvider").compile_error_advice(mem) is None
