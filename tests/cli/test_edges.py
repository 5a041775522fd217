"""The command line's edges an operator meets: a watch report with no Prefect
API, help that starts with the commands, options as help spells them, a misspelt spec key
with its nearest known one. Through ``epfleet.cli.app.main`` in this process."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.cli.serve import REPORT_MAX_AGE_DAYS
from epfleet.formats.device_report import decode_report, report_key
from tests.support.hand_made_fleet import DEVICE, make_fleet
from tests.support.sample_report import REPORT

pytestmark = pytest.mark.fast


def test_watch_dry_run_needs_no_flow_run(
    capsys: pytest.CaptureFixture[str], fleet_spec: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """The flow module cannot even be imported here: a dry run that started a flow run
    (and with it Prefect's temporary API) would fail."""
    monkeypatch.setitem(sys.modules, "flows.runtime_watch", None)
    store = tmp_path / "store"
    store.mkdir()
    code = main(["watch", str(fleet_spec), "--store", str(store), "--dry-run"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "tiny-cls" in out and "missing" in out


def test_watch_dry_run_on_a_bad_spec_prints_one_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "flows.runtime_watch", None)
    spec = tmp_path / "fleet.yaml"
    spec.write_text("models:\n  - name: a\n    sorce: a.onnx\ntargets: []\n")
    code = main(["watch", str(spec), "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"epfleet: error: {spec} is invalid:")
    assert "models[a].sorce: unknown key; did you mean source?" in err


def test_watch_report_age_default_is_the_flows() -> None:
    from flows.runtime_watch import runtime_watch

    default = inspect.signature(runtime_watch.fn).parameters["report_max_age_days"].default
    assert default == REPORT_MAX_AGE_DAYS


def test_watch_refuses_a_report_age_below_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["watch", "fleet.yaml", "--dry-run", "--report-max-age-days", "0"]) == 2
    assert "--report-max-age-days must be 1 or more" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--sync-every", "--watch-every"])
def test_serve_refuses_an_interval_that_is_not_positive(
    option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", option, "-1"]) == 2  # refused before Prefect is started
    err = capsys.readouterr().err
    assert f"for {option}. Must be > 0" in err and "Traceback" not in err


def test_help_is_short_with_the_commands_first(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--help"])
    out = capsys.readouterr().out
    assert out.index("Commands") < out.index("For example")
    assert "EPFLEET_CACHE" not in out and "UNKNOWN" not in out and "Arguments" not in out
    assert "docs/reference/settings.md" in out
    assert len(out.splitlines()) < 45


def test_manifest_help_has_no_unknown_arguments_panel(capsys: pytest.CaptureFixture[str]) -> None:
    main(["manifest", "--help"])
    assert "UNKNOWN" not in capsys.readouterr().out


def test_trust_status_defaults_the_store_like_every_command(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["trust", "status"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{(tmp_path / 'epfleet-store').as_uri()} has no trust metadata" in err


def test_prefer_takes_several_values(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Parsed (the sync then stops at the missing store, as it should)."""
    code = main(["sync", "--store", str(tmp_path / "s"), "--cache", str(tmp_path / "c"),
                 "--prefer", "cpu", "npu"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and "Unused Tokens" not in err and "does not exist" in err, err
    code = main(["sync", "--store", "s", "--cache", "c", "--prefer", "cpu", "tpu"])
    assert (
        code == 2 and "--prefer: Input should be 'cpu', 'gpu' or 'npu'" in capsys.readouterr().err
    )


def test_a_long_reason_is_shown_whole_once_below_the_table() -> None:
    from epfleet.device.views import render_device_report
    from epfleet.formats.device_report import DeviceReport

    report = DeviceReport.model_validate(REPORT)
    text = render_device_report(report)
    reason = report.models[0].considered[0].reason
    assert text.count(reason) == 1 and f"[1] {reason}" in text
    assert text.count("[1]") == 3  # both rows point at the one note


def test_an_offline_sync_prints_no_generation_none() -> None:
    from epfleet.device.views import render_device_report
    from epfleet.formats.device_report import DeviceReport

    offline = REPORT | {"manifest": {"status": "offline", "generation": None, "body_bytes": 0}}
    text = render_device_report(DeviceReport.model_validate(offline))
    assert "\nmanifest: offline\n" in text and "None" not in text  # no "(0 B)" either


def test_a_closed_stdout_is_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``epfleet manifest schema | head -1``: the reader went away."""

    class Closed:
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

        def fileno(self) -> int:
            return out.fileno()

    out = (tmp_path / "out").open("w")
    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["manifest", "schema"]) == 1


def test_sync_report_to_is_a_value_not_an_environment_variable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``epfleet sync --report-to DIR``: the report goes to DIR, and the option is passed
    down as a value: the process's environment is left as it was (it once set
    EPFLEET_REPORT_TO, which leaked into the next test)."""
    monkeypatch.delenv("EPFLEET_REPORT_TO", raising=False)
    fleet = make_fleet(str(tmp_path / "store"), tmp_path)
    reports = tmp_path / "reports"
    before = dict(os.environ)
    code = main(
        ["sync", "--store", fleet.uri, "--cache", str(tmp_path / "cache"), "--trust-root",
         str(fleet.root), "--device-id", DEVICE, "--report-to", str(reports), "--json"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    assert dict(os.environ) == before
    assert decode_report((reports / report_key(DEVICE)).read_bytes(), 1 << 20).device_id == DEVICE
    assert not (tmp_path / "store" / report_key(DEVICE)).exists()
