"""Task metrics (pure): what each kind measures over every golden sample, the spec's
rules for them, and custom metrics loaded by name with errors that name what is wrong."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from epfleet.formats.task_metric import MetricSpec
from epfleet.runtime.metrics import MetricError, load_function, measure, output_index

pytestmark = pytest.mark.fast


def spec(**fields: object) -> MetricSpec:
    return MetricSpec.model_validate({"min": 0.5, **fields})


def logits(*rows: list[float]) -> np.ndarray:
    return np.array(rows, np.float32)


def test_argmax_agreement_counts_rows_over_every_sample() -> None:
    source = [logits([1, 2, 0], [3, 0, 0]), logits([0, 0, 1], [0, 1, 0])]
    variant = [logits([1, 2, 0], [0, 3, 0]), logits([0, 0, 1], [0, 1, 0])]
    assert measure(spec(kind="argmax_agreement"), variant, source) == 0.75
    assert measure(spec(kind="argmax_agreement"), source, source) == 1.0


def test_topk_agreement_asks_for_the_source_argmax_among_the_top_k() -> None:
    source = [logits([5, 4, 3, 2, 1])]
    second = [logits([4, 5, 3, 2, 1])]
    last = [logits([1, 2, 3, 4, 5])]
    assert measure(spec(kind="topk_agreement", k=2), second, source) == 1.0
    assert measure(spec(kind="topk_agreement", k=2), last, source) == 0.0
    with pytest.raises(MetricError, match="k=9, but the output has 5 classes"):
        measure(spec(kind="topk_agreement", k=9), second, source)


def test_cosine_and_snr_report_the_worst_sample() -> None:
    rng = np.random.default_rng(0)
    source = [rng.normal(size=64).astype(np.float32) for _ in range(3)]
    variant = [source[0], source[1] + 0.01, -source[2]]
    assert measure(spec(kind="cosine", min=0.9), variant, source) == pytest.approx(-1.0)
    close = [s + 0.01 for s in source]
    snr = measure(spec(kind="snr_db", min=20), close, source)
    expected = min(10 * np.log10(np.sum(s.astype(float) ** 2) / (64 * 0.01**2)) for s in source)
    assert snr == pytest.approx(expected, abs=0.01)
    assert measure(spec(kind="snr_db", min=20), source, source) == 200.0


def test_sequence_match_compares_whole_sequences_and_decodes_ctc() -> None:
    # [B=2, T=4, C=3] scores; class 0 is the CTC blank.
    source = np.zeros((2, 4, 3), np.float32)
    for b, path in enumerate([[1, 1, 0, 2], [2, 0, 2, 1]]):
        source[b, np.arange(4), path] = 1
    variant = source.copy()
    variant[0, 1] = [0, 0, 0]  # argmax 0: the path [1, 0, 0, 2] decodes as [1, 2] too
    variant[0, 1, 0] = 1
    assert measure(spec(kind="sequence_match"), [variant], [source]) == 0.5
    assert measure(spec(kind="sequence_match", blank=0), [variant], [source]) == 1.0
    broken = source.copy()
    broken[1, 3] = [0, 0, 1]  # [2, 0, 2, 2] decodes as [2, 2], not [2, 2, 1]
    assert measure(spec(kind="sequence_match", blank=0), [broken], [source]) == 0.5
    ids = [np.array([[3, 1, 4, 1]], np.int64)]
    assert measure(spec(kind="sequence_match"), ids, ids) == 1.0


def test_sequence_match_reads_a_time_major_output_along_its_time_axis() -> None:
    """ddddocr's captcha reader (PyPI ddddocr 1.6.1) gives [T, 1, C]: one string of T steps.
    Read as [B, T, C] it would be T one-step "sequences", and a variant that misreads one
    character of a 4-step string would score 0.75 instead of 0."""
    source = np.zeros((4, 1, 3), np.float32)
    source[np.arange(4), 0, [1, 0, 2, 2]] = 1
    misread = source.copy()
    misread[3, 0] = [0, 1, 0]  # the last step reads class 1: the string differs
    time_major = spec(kind="sequence_match", blank=0, time_axis=0)
    assert measure(time_major, [misread], [source]) == 0.0
    assert measure(time_major, [source], [source]) == 1.0
    assert measure(spec(kind="sequence_match", blank=0), [misread], [source]) == 0.75
    # [T=4, B=2, C=3]: two strings, the second misread at its first step
    pair = np.concatenate([source, source], axis=1)
    one_off = pair.copy()
    one_off[0, 1] = [0, 0, 1]
    assert measure(time_major, [one_off], [pair]) == 0.5
    # [T, B] integer ids with their time axis first
    ids = np.array([[3, 5], [1, 5], [4, 9]], np.int64)
    other = ids.copy()
    other[2, 1] = 8
    assert measure(spec(kind="sequence_match", time_axis=0), [other], [ids]) == 0.5
    with pytest.raises(MetricError, match=r"time_axis 2: the output's shape is \[4, 1, 3\]"):
        measure(spec(kind="sequence_match", time_axis=2), [source], [source])


def test_a_metric_that_does_not_suit_the_output_says_why() -> None:
    with pytest.raises(
        MetricError, match=r"class scores along the last axis; .* shape is \[4, 1\]"
    ):
        measure(spec(kind="argmax_agreement"), [np.zeros((4, 1))], [np.zeros((4, 1))])
    with pytest.raises(MetricError, match="names output 'prob'; the model's outputs are 'a', 'b'"):
        output_index(spec(kind="cosine", output="prob"), ["a", "b"])
    assert output_index(spec(kind="cosine", output="b"), ["a", "b"]) == 1
    assert output_index(spec(kind="cosine"), ["a", "b"]) == 0


def test_custom_metrics_load_by_name_and_must_give_a_finite_number() -> None:
    values = [np.array([0.12, 0.5]), np.array([0.3, 0.9])]
    shifted = [v + 0.04 for v in values]
    entry = "tests.support.task_metrics:rounded_match"
    allowed = "numpy, tests.support"
    assert measure(spec(kind="custom", function=entry), shifted, values, allowed) == 0.5
    with pytest.raises(MetricError, match=r"returned nan, not a finite number"):
        nan = spec(kind="custom", function="tests.support.task_metrics:not_a_number")
        measure(nan, values, values, allowed)
    with pytest.raises(MetricError, match=r"cannot import 'no_such_pkg.metrics'.* install"):
        load_function("no_such_pkg.metrics:score", "no_such_pkg")
    with pytest.raises(MetricError, match=r"tests.support.task_metrics has no function 'absent'"):
        load_function("tests.support.task_metrics:absent", allowed)


def test_a_custom_metric_runs_only_from_modules_the_host_allows() -> None:
    """A spec's custom metric is code the compile host runs: only from the modules
    EPFLEET_METRIC_MODULES names (and their submodules); nothing is imported otherwise."""
    import sys

    values = [np.array([0.1])]
    for allowed in ("", "tests.supp", "numpy", "tests.support.task_metrics.other"):
        with pytest.raises(MetricError, match=r"module 'tests.support.task_metrics' is not "):
            load_function("tests.support.task_metrics:rounded_match", allowed)
    assert (
        measure(
            spec(kind="custom", function="tests.support.task_metrics:rounded_match"),
            values,
            values,
            " tests.support.task_metrics ,acme",
        )
        == 1.0
    )
    sys.modules.pop("json.tool", None)
    with pytest.raises(MetricError, match="EPFLEET_METRIC_MODULES"):
        load_function("json.tool:main", "")
    assert "json.tool" not in sys.modules


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"kind": "argmax_agreement", "min": 99}, "argmax_agreement is a share; give 0..1"),
        ({"kind": "cosine", "min": 2}, "cosine lies in -1..1"),
        ({"kind": "topk_agreement", "min": 0.9}, "topk_agreement needs k"),
        ({"kind": "cosine", "min": 0.9, "k": 5}, "only topk_agreement takes k"),
        ({"kind": "snr_db", "min": 20, "blank": 0}, "only sequence_match takes blank"),
        ({"kind": "argmax_agreement", "min": 1, "time_axis": 0}, "only sequence_match takes"),
        ({"kind": "sequence_match", "min": 1, "time_axis": -1}, "greater than or equal to 0"),
        ({"kind": "custom", "min": 1}, "kind custom needs function"),
        ({"kind": "cosine", "min": 0.9, "function": "a:b"}, "only kind custom takes a function"),
        ({"kind": "custom", "min": 1, "function": "not an entry"}, "should match pattern"),
        ({"kind": "snr_db", "min": float("nan")}, "finite number"),
        ({"kind": "accuracy", "min": 0.9}, "argmax_agreement"),
    ],
)
def test_the_spec_refuses_a_metric_it_cannot_judge(fields: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        MetricSpec.model_validate(fields)
