"""The command line's edges an operator meets (issue 20): a watch report with no Prefect
API, help that starts with the commands, options as help spells them, a misspelt spec key
with its nearest known one. Through ``epfleet.cli.app.main`` in this process."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.cli.serve import REPORT_MAX_AGE_DAYS

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
