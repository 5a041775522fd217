"""Fleet spec validation: bad input is refused with an error naming the field, before compiling."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import yaml

import eps
from epfleet.errors import BadInputError
from epfleet.fleet.planning.plan import plan_run
from epfleet.fleet.planning.rules import ladder_of
from epfleet.formats.spec_file import load_spec, parse_spec
from tests.support.paths import REPO

pytestmark = pytest.mark.fast

QNN = {"name": "htp", "ep": "QNNExecutionProvider", "provider_options": {"htp_arch": 75}}


def spec(models=None, targets=None) -> dict:
    return {
        "models": models if models is not None else [{"name": "m", "source": "m.onnx"}],
        "targets": targets if targets is not None else [QNN],
    }


def test_valid_spec_fills_defaults_and_stringifies_options() -> None:
    parsed = parse_spec(spec(targets=[QNN, {"name": "cpu", "ep": "CPUExecutionProvider"}]))
    assert parsed.targets[0].device == "npu"
    assert parsed.targets[0].provider_options == {"htp_arch": "75"}
    assert parsed.targets[1].device == "cpu"
    assert [(m.name, t.name) for m, t in parsed.pairs()] == [("m", "htp"), ("m", "cpu")]


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (
            spec(models=[{"name": "m", "source": "a"}, {"name": "m", "source": "b"}]),
            "models: duplicate name 'm'",
        ),
        (spec(targets=[QNN, QNN]), "targets: duplicate name 'htp'"),
        (
            spec(targets=[{"name": "t", "ep": "FancyExecutionProvider"}]),
            "targets[t].ep: unknown execution provider 'FancyExecutionProvider'",
        ),
        (
            spec(models=[{"name": "m", "source": "m.onnx", "input_shapes": {"x": [1, -1, 3]}}]),
            "models[m].input_shapes",
        ),
        (
            spec(models=[{"name": "m", "source": "m.onnx", "input_shapes": {"x": [1, "?"]}}]),
            "models[m].input_shapes.x[1]",
        ),
        (spec(models=[{"name": "Bad Name", "source": "m.onnx"}]), "models[Bad Name].name"),
        (
            spec(models=[{"name": "m", "source": "m.onnx", "colour": "red"}]),
            "models[m].colour: unknown key; known keys: name, source",
        ),
        (
            spec(models=[{"name": "m", "sorce": "m.onnx"}]),
            "models[m].sorce: unknown key; did you mean source?",
        ),
        (
            spec(targets=[{**QNN, "tolerence": 0.1}]),
            "tolerence: unknown key; did you mean tolerance?",
        ),
        (
            spec(targets=[{**QNN, "provider_options": {"htp_arch": "42"}}]),
            "htp_arch '42' is not one of",
        ),
        (spec(targets=[{**QNN, "models": ["nope"]}]), "target 'htp' names unknown models ['nope']"),
        (spec(targets=[{**QNN, "device": "tpu"}]), "targets[htp].device"),
        ({"models": []}, "models: List should have at least 1 item"),
        (
            spec(targets=[{"name": "c", "ep": "CPUExecutionProvider", "device": "npu"}]),
            "targets[c]: device 'npu': CPUExecutionProvider targets cpu",
        ),
        (
            spec(targets=[{**QNN, "provider_options": {"htp_arch": None}}]),
            "provider option 'htp_arch' must be a string, number or boolean, got None",
        ),
    ],
)
def test_bad_spec_names_the_offending_field(document: dict, expected: str) -> None:
    with pytest.raises(BadInputError) as raised:
        parse_spec(document)
    assert expected in str(raised.value)


def test_unknown_subset_names_are_refused() -> None:
    parsed = parse_spec(spec())
    with pytest.raises(BadInputError, match="unknown target nope; the spec has htp"):
        parsed.pairs(targets=["nope"])


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(BadInputError, match="cannot read spec"):
        load_spec(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [\n")
    with pytest.raises(BadInputError, match="not valid YAML"):
        load_spec(broken)


def test_encoding_nesting_and_syntax_errors_are_one_line_with_file_and_line(
    tmp_path: Path,
) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"models:\n  - name: m\n    source: m.onnx  # caf\xe9\n")
    deep = tmp_path / "deep.yaml"
    deep.write_text("models: " + "[" * 50_000 + "]" * 50_000 + "\n")  # a RecursionError
    indented = tmp_path / "indented.yaml"
    indented.write_text("models:\n" + "".join(" " * i + "a:\n" for i in range(1, 200)))
    broken = tmp_path / "broken.yaml"
    broken.write_text("models: [a\n  b: {\n")
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"targets: []\nmodels: \x00\n")
    expected = {
        latin1: f"{latin1}:3: not UTF-8 text (byte 0xe9); save the spec as UTF-8",
        deep: f"{deep}:1: nested more than 32 levels deep (a fleet spec needs 5)",
        indented: f"{indented}:32: nested more than 32 levels deep (a fleet spec needs 5)",
        broken: f"{broken}:2: not valid YAML: expected ',' or ']', but got ':' "
        "(while parsing a flow sequence)",
        nul: f"{nul}:2: not valid YAML: unacceptable character #x0000: special characters "
        "are not allowed",
    }
    for path, message in expected.items():
        with pytest.raises(BadInputError) as raised:
            load_spec(path)
        assert str(raised.value) == message


def test_a_spec_nesting_as_deep_as_allowed_loads(tmp_path: Path) -> None:
    nested = {"name": "m", "source": "m.onnx", "input_shapes": {"x": [1, 3, 8, 8]}}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec(models=[nested]), sort_keys=False))
    assert load_spec(path).models[0].input_shapes == {"x": [1, 3, 8, 8]}


def test_tolerances_looser_than_any_device_accepts_are_refused_naming_the_target() -> None:
    loose = [
        {"name": "loose-rel", "ep": "CPUExecutionProvider", "tolerance": 0.3},
        {"name": "loose-abs", "ep": "CPUExecutionProvider", "abs_tolerance": 1e9},
        {"name": "nan", "ep": "CPUExecutionProvider", "tolerance": float("nan")},
    ]
    with pytest.raises(BadInputError) as raised:
        parse_spec(spec(targets=loose))
    message = str(raised.value)
    assert (
        "targets[loose-rel].tolerance: 0.3 is looser than any variant may be verified with "
        "(0.25): a device refuses such an entry"
    ) in message
    assert "targets[loose-abs].abs_tolerance: 1e+09 is looser than any variant" in message
    assert "targets[nan].tolerance: Input should be greater than 0" in message
    edge = {"name": "edge", "ep": "CPUExecutionProvider", "tolerance": 0.25, "abs_tolerance": 0.05}
    assert parse_spec(spec(targets=[edge])).targets[0].tolerance == 0.25


def test_missing_source_is_refused_before_compiling(tmp_path: Path) -> None:
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(
        "models: [{name: m, source: nowhere.onnx}]\n"
        "targets: [{name: cpu, ep: CPUExecutionProvider}]\n"
    )
    store = tmp_path / "store"
    with pytest.raises(BadInputError, match=r"models\[m\]\.source .*nowhere.onnx does not exist"):
        plan_run(spec_path, str(store))
    assert not (store / "manifest.json").exists()


def test_shape_that_does_not_fit_the_model_is_refused(tmp_path: Path, model_dir: Path) -> None:
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(
        f"models: [{{name: m, source: {model_dir / 'tiny-cls.onnx'}, "
        "input_shapes: {x: [1, 4, 8, 8]}}]\n"
        "targets: [{name: cpu, ep: CPUExecutionProvider}]\n"
    )
    with pytest.raises(BadInputError, match=r"models\[m\].*x\[1\] is fixed at 3 in the model"):
        plan_run(spec_path, str(tmp_path / "store"))


def test_npu_target_requires_static_shapes(tmp_path: Path, model_dir: Path) -> None:
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(
        f"models: [{{name: m, source: {model_dir / 'tiny-cls.onnx'}}}]\n"
        "targets: [{name: htp, ep: QNNExecutionProvider, provider_options: {soc_model: 57}}]\n"
    )
    with pytest.raises(
        BadInputError, match=r"needs static input shapes.*give them in the model's input_shapes"
    ):
        plan_run(spec_path, str(tmp_path / "store"))


def test_an_external_data_source_without_its_data_file_is_refused(
    tmp_path: Path, model_dir: Path
) -> None:
    model = onnx.load(str(model_dir / "tiny-cls.onnx"))
    onnx.save(
        model,
        tmp_path / "split.onnx",
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="split.data",
        size_threshold=0,
    )
    (tmp_path / "split.data").unlink()
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(
        "models: [{name: m, source: split.onnx}]\n"
        "targets: [{name: cpu, ep: CPUExecutionProvider}]\n"
    )
    with pytest.raises(
        BadInputError, match=r"models\[m\].*external data files are missing: split.data"
    ):
        plan_run(spec_path, str(tmp_path / "store"))


def test_sources_can_live_in_s3(tmp_path: Path, model_dir: Path, s3_bucket: str) -> None:
    import boto3

    from epfleet.hashing import sha256_file

    boto3.client("s3").upload_file(str(model_dir / "tiny-det.onnx"), s3_bucket, "models/det.onnx")
    spec_path = tmp_path / "fleet.yaml"
    spec_path.write_text(
        f"models: [{{name: det, source: 's3://{s3_bucket}/models/det.onnx'}}]\n"
        "targets: [{name: cpu, ep: CPUExecutionProvider}]\n"
    )
    store = tmp_path / "store"
    plan = plan_run(spec_path, str(store))
    sha256, size = sha256_file(model_dir / "tiny-det.onnx")
    assert (plan.sources["det"].sha256, plan.sources["det"].size) == (sha256, size)
    assert sha256_file(store / plan.sources["det"].uri) == (sha256, size)
    missing = spec_path.read_text().replace("det.onnx'", "gone.onnx'")
    spec_path.write_text(missing)
    with pytest.raises(
        BadInputError,
        match=rf"models\[\w+\]\.source s3://{s3_bucket}/models/gone.onnx cannot be fetched",
    ):
        plan_run(spec_path, str(store))


def test_misspelled_provider_option_is_refused_naming_the_close_match() -> None:
    target = {"name": "sd8g3", "ep": "QNNExecutionProvider", "provider_options": {"htp_arc": 75}}
    with pytest.raises(BadInputError) as raised:
        parse_spec(spec(targets=[target]))
    assert (
        "targets[sd8g3].provider_options.htp_arc: unknown QNNExecutionProvider option; "
        "did you mean htp_arch?"
    ) in str(raised.value)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (
            {"name": "sd8g3", "ep": "QNNExecutionProvider", "provider_options": {"npu_turbo": 1}},
            "targets[sd8g3].provider_options.npu_turbo: unknown QNNExecutionProvider option; "
            "known: backend_path, backend_type, device_id,",
        ),
        (
            {
                "name": "ov",
                "ep": "OpenVINOExecutionProvider",
                "provider_options": {"load_confg": "{}"},
            },
            "targets[ov].provider_options.load_confg: unknown OpenVINOExecutionProvider option; "
            "did you mean load_config?",
        ),
        (
            {
                "name": "rtx",
                "ep": "NvTensorRTRTXExecutionProvider",
                "provider_options": {"nv_target_sm": "sm86"},
            },
            "targets[rtx].provider_options.nv_target_sm: unknown NvTensorRTRTXExecutionProvider option",
        ),
        (
            {
                "name": "cpu",
                "ep": "CPUExecutionProvider",
                "provider_options": {"intra_op_num_threads": 2},
            },
            "targets[cpu]: provider_options: CPUExecutionProvider takes only arch, isa "
            "(to pin the machine class it is built for), got intra_op_num_threads",
        ),
        (
            {
                "name": "ov",
                "ep": "OpenVINOExecutionProvider",
                "provider_options": {"precision": "FP16"},
            },
            "targets[ov]: provider_options: precision is ignored by the OpenVINO plugin EP",
        ),
    ],
)
def test_unknown_provider_option_is_refused_for_every_ep(target: dict, expected: str) -> None:
    with pytest.raises(BadInputError) as raised:
        parse_spec(spec(targets=[target]))
    assert expected in str(raised.value)


def test_provider_options_in_use_today_are_accepted() -> None:
    from tests.support.specs import CPU_TARGET, HTP_TARGETS

    example = load_spec(REPO / "examples" / "fleet.yaml")
    assert {t.name for t in example.targets} == {"sd8g3-htp", "sd8g2-htp", "x86-cpu"}
    in_use = [  # README, bench/ and tests/ (conftest's targets below)
        ("QNNExecutionProvider", {"backend_type": "htp", "htp_arch": "75", "soc_model": "57"}),
        ("QNNExecutionProvider", {"htp_arch": "81", "soc_model": "87"}),
        ("QNNExecutionProvider", {"soc_model": 57}),
        ("CPUExecutionProvider", {"arch": "x86_64", "isa": "avx2"}),
        ("OpenVINOExecutionProvider", {}),
        ("NvTensorRTRTXExecutionProvider", {}),
    ]
    targets = [*HTP_TARGETS, CPU_TARGET] + [
        {"name": f"t{i}", "ep": ep, "provider_options": options}
        for i, (ep, options) in enumerate(in_use)
    ]
    assert len(parse_spec(spec(targets=targets)).targets) == len(targets)


def test_recipe_and_verification_defaults_come_from_the_ep_module() -> None:
    parsed = parse_spec(
        spec(
            targets=[
                {"name": "htp", "ep": "QNNExecutionProvider", "provider_options": {"htp_arch": 75}},
                {
                    "name": "qnn-cpu",
                    "ep": "QNNExecutionProvider",
                    "provider_options": {"backend_type": "cpu"},
                },
                {"name": "cpu", "ep": "CPUExecutionProvider"},
                {
                    "name": "ov",
                    "ep": "OpenVINOExecutionProvider",
                    "graph_optimization": "extended",
                    "tolerance": 0.1,
                    "min_coverage": 0.9,
                    "verify": False,
                },
            ]
        )
    )
    by_name = {t.name: t for t in parsed.targets}
    # the precision each computes in by default, and that precision's tolerances
    rungs = {name: ladder_of(target, eps.load(target.ep)) for name, target in by_name.items()}
    assert [r.precision for r in rungs["htp"]] == ["fp16"]
    assert rungs["htp"][0].provider_options["enable_htp_fp16_precision"] == "1"
    assert by_name["htp"].graph_optimization == "basic"
    assert (rungs["htp"][0].tolerance, rungs["htp"][0].abs_tolerance) == (0.05, 1e-3)
    assert (rungs["cpu"][0].precision, rungs["cpu"][0].abs_tolerance) == ("fp32", 1e-5)
    assert (rungs["qnn-cpu"][0].precision, rungs["qnn-cpu"][0].tolerance) == ("fp32", 0.001)
    assert (by_name["cpu"].graph_optimization, rungs["cpu"][0].tolerance) == ("all", 0.001)
    ov = by_name["ov"]
    assert (ov.graph_optimization, rungs["ov"][0].tolerance, ov.min_coverage, ov.verify) == (
        "extended",
        0.1,
        0.9,
        False,
    )


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        (
            "graph_optimization",
            "max",
            "targets[t].graph_optimization: Input should be 'disable', 'basic', 'extended' or 'all'",
        ),
        ("min_coverage", 1.5, "targets[t].min_coverage: Input should be less than or equal to 1"),
        ("tolerance", 0, "targets[t].tolerance: Input should be greater than 0"),
        ("verify_timeout", -1, "targets[t].verify_timeout: Input should be greater than 0"),
        ("verify_timeout", float("inf"), "targets[t].verify_timeout: Input should be a finite"),
        ("verify_timeout", 1e12, "targets[t].verify_timeout: Input should be less than or equal"),
    ],
)
def test_bad_verification_settings_are_refused(field: str, value: object, expected: str) -> None:
    target = {"name": "t", "ep": "QNNExecutionProvider", field: value}
    with pytest.raises(BadInputError) as raised:
        parse_spec(spec(targets=[target]))
    assert expected in str(raised.value)


def test_the_recipe_is_part_of_the_fingerprint(tmp_path: Path) -> None:
    from epfleet.runtime.requests import CompileRequest, fingerprinted

    base = CompileRequest(
        model="m",
        target="t",
        ep="QNNExecutionProvider",
        device="npu",
        provider_options={},
        input_shapes={},
        source_key="sources/x.onnx",
        source_sha256="a" * 64,
        source_size=1,
        fingerprint="",
    )
    prints = {
        fingerprinted(base.model_copy(update=change), "1.32.0", {"version": "2.7.0"}).fingerprint
        for change in (
            {},
            {"graph_optimization": "disable"},
            {"min_coverage": 1.0},
            {"verify": False},
            {"tolerance": 0.01},
        )
    }
    assert len(prints) == 5


def test_a_name_longer_than_a_directory_name_allows_is_refused() -> None:
    target = {"name": "t" * 101, "ep": "CPUExecutionProvider"}
    with pytest.raises(
        BadInputError, match=r"targets\[t+\]\.name: String should have at most 100 characters"
    ):
        parse_spec(spec(targets=[target]))


@pytest.mark.parametrize(
    ("rollout", "expected"),
    [
        ({"min_hours": float("inf")}, "rollout.min_hours: Input should be a finite number"),
        ({"min_hours": 1e12}, "rollout.min_hours: Input should be less than or equal to 8760"),
        ({"min_reports": 10**9}, "rollout.min_reports: Input should be less than or equal to"),
        ({"max_failure_rate": float("nan")}, "rollout.max_failure_rate: Input should be a finite"),
        ({"max_failure_rate": 1.5}, "rollout.max_failure_rate: Input should be less than or"),
        ({"max_latency_regression": 1e9}, "rollout.max_latency_regression: Input should be less"),
        ({"stages": [10, float("inf")]}, "rollout.stages[1]: Input should be a finite number"),
        ({"stages": [float("nan"), 100]}, "rollout.stages[0]: Input should be a finite number"),
        ({"stages": [50, 10, 100]}, "percentages from 0 to 100, increasing"),
        ({"canary": ["../../x"]}, "rollout.canary[0]: String should match pattern"),
        ({"canary": ["dev-1\x1b[2J"]}, "rollout.canary[0]: String should match pattern"),
    ],
)
def test_a_rollout_policy_out_of_range_is_refused_at_spec_load(
    rollout: dict, expected: str
) -> None:
    for document in (
        spec() | {"rollout": rollout},
        spec(models=[{"name": "m", "source": "m.onnx", "rollout": rollout}]),
    ):
        with pytest.raises(BadInputError) as raised:
            parse_spec(document)
        assert expected.removeprefix("rollout.") in str(raised.value), str(raised.value)


def test_a_rollout_policy_from_yaml_infinity_is_refused_with_the_file_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec()) + "rollout:\n  min_hours: .inf\n")
    from epfleet.cli.app import main

    assert main(["compile", str(path), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "rollout.min_hours: Input should be a finite number" in err


BOMB = """models:
  - name: m
    source: m.onnx
targets:
  - name: htp
    ep: QNNExecutionProvider
    provider_options:
      a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
      b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
      c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
      d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
      e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
      f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
      g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
      h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
      i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def test_a_yaml_alias_bomb_is_refused_with_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(BOMB)  # 9**9 values once expanded: minutes and gigabytes before
    with pytest.raises(BadInputError) as refused:
        load_spec(path)
    assert str(refused.value) == (
        f"{path}:13: expands to more than 100,000 values through YAML aliases (*name); "
        "write the repeated part out, or use fewer aliases"
    )


def test_a_long_text_repeated_through_aliases_is_refused_with_the_file_and_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(  # 1.1 MB of text once expanded, from a 100 kB file: 100 GB with 1e5 aliases
        "models: [{name: m, source: m.onnx}]\n"
        "targets: [{name: t, ep: CPUExecutionProvider}]\n"
        f"x-long: &long {'x' * 100_000}\n"
        "x-many:\n" + "  - *long\n" * 11
    )
    with pytest.raises(BadInputError) as refused:
        load_spec(path)
    assert str(refused.value) == (
        f"{path}:15: repeats more than 1,000,000 characters of text through YAML aliases "
        "(*name); write the repeated part out, or use fewer aliases"
    )


def test_a_spec_sharing_options_through_aliases_loads(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "models: [{name: m, source: m.onnx}]\n"
        "targets:\n"
        "  - {name: a, ep: QNNExecutionProvider, provider_options: &opts {htp_arch: 75}}\n"
        "  - {name: b, ep: QNNExecutionProvider, provider_options: *opts}\n"
    )
    assert [t.provider_options for t in load_spec(path).targets] == [{"htp_arch": "75"}] * 2


def test_fold_io_needs_an_integer_precision_and_is_a_boolean() -> None:
    folded = {**QNN, "name": "q", "precision": ["w8a8", "fp16"], "fold_io": True}
    parsed = parse_spec(spec(targets=[folded]))
    assert parsed.targets[0].fold_io is True
    assert parse_spec(spec()).targets[0].fold_io is False
    floats = {**QNN, "name": "f16", "precision": "fp16", "fold_io": True}
    with pytest.raises(BadInputError) as raised:
        parse_spec(spec(targets=[floats]))
    assert (
        "targets[f16].fold_io: precision fp16 has no integer precision whose Quantize/Dequantize "
        "to fold; add w8a8, w8a16 or w16a16 to it, or remove fold_io"
    ) in str(raised.value)
    with pytest.raises(BadInputError) as raised:
        parse_spec(spec(targets=[{**folded, "fold_io": "yes"}]))
    assert "targets[q].fold_io: must be true or false, got 'yes'" in str(raised.value)


def test_fold_io_is_part_of_the_fingerprint_only_when_asked(tmp_path: Path) -> None:
    from epfleet.runtime.requests import CompileRequest, fingerprinted

    request = CompileRequest.model_validate(
        {
            "model": "m",
            "target": "t",
            "ep": "QNNExecutionProvider",
            "device": "npu",
            "provider_options": {},
            "input_shapes": {},
            "source_key": "sources/a.onnx",
            "source_sha256": "a" * 64,
            "source_size": 1,
            "precision": "w8a8",
            "fingerprint": "",
        }
    )
    plain = fingerprinted(request, "1.32.0", {"version": "2.7.0"})
    folded = fingerprinted(
        request.model_copy(update={"fold_io": True}), "1.32.0", {"version": "2.7.0"}
    )
    assert plain.fingerprint != folded.fingerprint and folded.folds_io and not plain.folds_io
    fp16 = request.model_copy(update={"fold_io": True, "precision": "fp16"})
    assert not fp16.folds_io  # a float rung of a folding target compiles as it is


def test_an_escape_code_in_a_model_name_is_shown_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec(models=[{"name": "evil\x1b[2Jred", "source": "m.onnx"}])))
    from epfleet.cli.app import main

    assert main(["compile", str(path), "--store", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err
    assert "models[evil\\x1b[2Jred].name: String should match pattern" in err, err
    assert "\x1b" not in err


def test_a_spec_error_names_a_hostile_key_escaped_wherever_it_is_shown() -> None:
    """parse_spec's message is also a flow's error (a Prefect log), not only the CLI's."""
    with pytest.raises(BadInputError) as raised:
        parse_spec(spec(models=[{"name": "m", "source": "m.onnx", "sour\x1b[2Jce": 1}]))
    assert "models[m].sour\\x1b[2Jce: unknown key" in str(raised.value)
    assert "\x1b" not in str(raised.value)


def test_a_metric_of_kind_none_turns_the_default_for_class_scores_off() -> None:
    def model(metric: object) -> dict:
        return {"name": "m", "source": "m.onnx", "metric": metric}

    named = {"kind": "argmax_agreement", "min": 0.99}
    off = parse_spec(spec(models=[model({"kind": "none"})])).models[0]
    default = parse_spec(spec(models=[{"name": "m", "source": "m.onnx"}])).models[0]
    judged = parse_spec(spec(models=[model(named)])).models[0]
    assert (off.named_metric, off.decision_default) == (None, False)
    assert (default.named_metric, default.decision_default) == (None, True)
    assert judged.named_metric is not None and not judged.decision_default
    for metric, expected in [
        ({"kind": "argmax_agreement"}, "models[m].metric.min: Field required"),
        ({"kind": "none", "min": 0.9}, "models[m].metric.min: unknown key; known keys: kind"),
        (named | {"mn": 1}, "models[m].metric.mn: unknown key; did you mean min?"),
        ({"kind": "nothing"}, "models[m].metric: Input tag 'nothing' found using 'kind'"),
    ]:
        with pytest.raises(BadInputError) as caught:
            parse_spec(spec(models=[model(metric)]))
        assert expected in str(caught.value)
