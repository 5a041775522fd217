"""The spec's runtimes: a target built under several EP versions becomes one target per
runtime, and bad runtime input is refused naming the runtime."""

from __future__ import annotations

from typing import Any

import pytest

from epfleet.errors import BadInputError
from epfleet.formats.spec import FleetSpec
from epfleet.formats.spec_file import parse_spec

pytestmark = pytest.mark.fast

QNN_2_5 = ["onnxruntime==1.32.0", "onnxruntime-qnn==2.5.0"]
QNN_2_7 = ["onnxruntime==1.32.0", "onnxruntime-qnn==2.7.0"]
X_ELITE = {"backend_type": "htp", "htp_arch": "73", "soc_model": "60"}


def spec(defined: dict[str, Any], **target: Any) -> dict[str, Any]:
    htp = {"name": "sd-x-elite", "ep": "QNNExecutionProvider", "provider_options": X_ELITE}
    return {
        "models": [{"name": "m", "source": "m.onnx"}],
        "runtimes": defined,
        "targets": [{**htp, **target}, {"name": "cpu", "ep": "CPUExecutionProvider"}],
    }


def test_a_target_becomes_one_target_per_runtime_in_its_order() -> None:
    parsed = parse_spec(
        spec({"qnn-2.5": QNN_2_5, "qnn-2.7": QNN_2_7}, runtimes=["qnn-2.7", "qnn-2.5"])
    )
    assert [(t.name, t.runtime) for t in parsed.targets] == [
        ("sd-x-elite.qnn-2.7", "qnn-2.7"),
        ("sd-x-elite.qnn-2.5", "qnn-2.5"),
        ("cpu", None),
    ]
    assert all(t.runtimes is None for t in parsed.targets)
    assert parsed.targets[0].provider_options == X_ELITE
    # Validated again (a flow's parameter round trip), it stays as it is.
    again = FleetSpec.model_validate(parsed.model_dump())
    assert [t.name for t in again.targets] == [t.name for t in parsed.targets]
    assert [t.name for _, t in parsed.pairs()] == [t.name for t in parsed.targets]


@pytest.mark.parametrize(
    ("runtimes", "target", "message"),
    [
        (
            {},
            {"runtimes": ["qnn-2.5"]},
            "names unknown runtime(s) qnn-2.5; the spec's runtimes: none: add a runtimes section",
        ),
        ({"qnn-2.5": QNN_2_5}, {"runtimes": ["qnn-2.6"]}, "runtimes: qnn-2.5"),
        (
            {"qnn-2.5": ["onnxruntime-qnn==2.5.0"]},
            {"runtimes": ["qnn-2.5"]},
            "runtime 'qnn-2.5' does not pin onnxruntime",
        ),
        (
            {"qnn-2.5": ["onnxruntime==1.32.0", "onnxruntime-qnn=2.5.0"]},
            {},
            "runtime 'qnn-2.5': 'onnxruntime-qnn=2.5.0' is not a pip requirement",
        ),
        ({"qnn-2.5": []}, {}, "runtime 'qnn-2.5' lists no requirements"),
        (
            {"qnn-2.5": ["onnxruntime @ https://example.com/onnxruntime.whl"]},
            {},
            "names a URL; name a release of the package index",
        ),
        ({"QNN 2.5": QNN_2_5}, {}, "runtimes: 'QNN 2.5' is not a valid name"),
        (
            {"qnn-2.5": {"requirements": QNN_2_5, "work_pool": "qnn-hosts"}},
            {"runtimes": ["qnn-2.5"], "work_pool": "arm"},
            "names work pool 'arm' and its runtime 'qnn-2.5' work pool 'qnn-hosts'",
        ),
        (
            {"qnn-2.5": {"requirements": QNN_2_5, "work_pool": "a pool"}},
            {"runtimes": ["qnn-2.5"]},
            "runtimes.qnn-2.5.work_pool",
        ),
        ({"qnn-2.5": {"requirements": QNN_2_5, "gpu": 1}}, {}, "runtimes.qnn-2.5.gpu"),
        (
            {"qnn-2.5": {"requirements": ["onnxruntime-qnn==2.5.0"], "dask_resource": True}},
            {},
            "runtime 'qnn-2.5' does not pin onnxruntime",
        ),
    ],
)
def test_bad_runtime_input_is_refused_naming_the_runtime(
    runtimes: dict[str, Any], target: dict[str, Any], message: str
) -> None:
    with pytest.raises(BadInputError) as raised:
        parse_spec(spec(runtimes, **target))
    assert message in str(raised.value)


def test_an_expanded_name_that_clashes_with_another_target_is_refused() -> None:
    document = spec({"qnn-2.5": QNN_2_5}, runtimes=["qnn-2.5"])
    document["targets"].append({**document["targets"][0], "name": "sd-x-elite.qnn-2.5"})
    del document["targets"][-1]["runtimes"]
    with pytest.raises(BadInputError) as raised:
        parse_spec(document)
    assert "duplicate name 'sd-x-elite.qnn-2.5'" in str(raised.value)


def test_a_runtime_pinned_to_a_work_pool_or_dask_workers_says_where_its_pairs_compile() -> None:
    parsed = parse_spec(
        spec(
            {
                "qnn-2.5": QNN_2_5,
                "qnn-2.7": {"requirements": QNN_2_7, "work_pool": "qnn-2-7", "dask_resource": True},
            },
            runtimes=["qnn-2.5", "qnn-2.7"],
        )
    )
    assert [(t.name, t.work_pool) for t in parsed.targets] == [
        ("sd-x-elite.qnn-2.5", None),
        ("sd-x-elite.qnn-2.7", "qnn-2-7"),
        ("cpu", None),
    ]
    assert parsed.runtime_requirements() == {"qnn-2.5": QNN_2_5, "qnn-2.7": QNN_2_7}
    assert (parsed.runtimes["qnn-2.5"].dask_resource, parsed.runtimes["qnn-2.7"].dask_resource) == (
        False,
        True,
    )
    assert parsed.runtimes["qnn-2.7"].pins == {"onnxruntime": "1.32.0", "onnxruntime-qnn": "2.7.0"}
    # Validated again (a flow's parameter round trip), the placement and the pins stay.
    again = FleetSpec.model_validate(parsed.model_dump())
    assert [(t.name, t.work_pool) for t in again.targets] == [
        (t.name, t.work_pool) for t in parsed.targets
    ]
    assert again.runtimes["qnn-2.7"].pins == parsed.runtimes["qnn-2.7"].pins


def test_a_target_of_a_work_pool_builds_its_runtimes_on_that_pool() -> None:
    parsed = parse_spec(spec({"qnn-2.5": QNN_2_5}, runtimes=["qnn-2.5"], work_pool="arm"))
    assert [(t.name, t.runtime, t.work_pool) for t in parsed.targets] == [
        ("sd-x-elite.qnn-2.5", "qnn-2.5", "arm"),
        ("cpu", None, None),
    ]


def test_pins_are_exact_releases_only() -> None:
    parsed = parse_spec(
        spec({"r": ["onnxruntime==1.32.0", "Onnxruntime_QNN>=2.5,<2.8"]}, runtimes=["r"])
    )
    assert parsed.runtimes["r"].pins == {"onnxruntime": "1.32.0"}
