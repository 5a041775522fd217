"""What a person reads fits their terminal: tables wrap, leave out or stack columns and
never cut a word; lines wrap at spaces; help keeps its examples whole; the words a
newcomer meets say what they mean. The commands themselves at 80 columns, on a compiled
store: tests/cli/test_narrow_terminal.py."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.cli.sync import INTERRUPTED, INTERRUPTED_FIRST, interrupted_message
from epfleet.device.cache.device_cache import DeviceCache
from epfleet.device.local_eps import NO_NPU
from epfleet.device.reporting import upload_report
from epfleet.device.views import render_device_report
from epfleet.formats.device_report import DeviceReport
from epfleet.stores import open_store
from epfleet.text import output_width, table, wrap
from tests.support.sample_report import REPORT

pytestmark = pytest.mark.fast

HEADERS = ["model", "target", "verdict", "reason"]
ROWS = [
    ["ocr-det", "sd8g3-htp", "unsupported", "its provider options are not accepted here: "
     "vtcm_mb=16 is more than this SoC has"],
    ["ocr-det", "x86-cpu", "optimal", "ORT 1.32.0, x86_64/avx512"],
]  # fmt: skip


def words(text: str) -> list[str]:
    """The words of a table, sorted, without its rule of dashes."""
    return sorted(w for w in text.split() if set(w) != {"-"})


def widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


def test_a_table_that_fits_is_unchanged_and_no_width_means_whole_lines() -> None:
    assert table(HEADERS, ROWS, 200) == table(HEADERS, ROWS)
    assert widest(table(HEADERS, ROWS)) > 80


@pytest.mark.parametrize("width", [80, 60])
def test_wrapped_cells_keep_every_word(width: int) -> None:
    shown = table(HEADERS, ROWS, width, wrapped=("reason",))
    assert widest(shown) <= width
    assert words(shown) == words(table(HEADERS, ROWS))
    assert "vtcm_mb=16" in shown  # a word is wrapped whole when it fits a line


def test_columns_are_left_out_in_order_and_named() -> None:
    shown = table(HEADERS, ROWS, 40, wrapped=("reason",), droppable=("target", "verdict"))
    assert widest(shown) <= 40
    assert "sd8g3-htp" not in shown and "unsupported" in shown
    assert "not shown at 40 columns: target" in " ".join(shown.split())


def test_a_table_too_wide_for_anything_else_is_stacked_whole() -> None:
    shown = table(HEADERS, ROWS, 30)
    assert widest(shown) <= 30
    assert shown.startswith("model: ocr-det\n  target: sd8g3-htp\n")
    assert "x86_64/avx512" in shown and shown.count("model: ") == 2


def test_a_word_longer_than_the_line_is_split_not_cut() -> None:
    path = "/var/lib/" + "x" * 100 + "/root.json"
    shown = wrap(f"trusting {path} here", 40)
    assert widest(shown) <= 40
    assert "".join(line.strip() for line in shown.splitlines()).count("x") == 100


def test_the_width_is_columns_else_whole_lines_off_a_terminal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "72")
    assert output_width() == 72
    monkeypatch.delenv("COLUMNS")
    assert output_width() is None  # pytest's stdout is not a terminal


def test_a_sync_without_an_npu_says_so_in_plain_words_once() -> None:
    report = DeviceReport.model_validate(REPORT)
    for verdict in report.models[0].considered:
        verdict.reason = NO_NPU
    shown = render_device_report(report, 80)
    assert widest(shown) <= 80
    assert shown.count("QNN: no NPU on this device; its variants are skipped") == 1
    assert "OrtHardwareDeviceType" not in shown and "QnnEpFactory" not in shown


def test_a_long_reason_at_80_columns_is_wrapped_and_kept_whole() -> None:
    report = DeviceReport.model_validate(REPORT)
    shown = render_device_report(report, 80)
    assert widest(shown) <= 80
    reason = report.models[0].considered[0].reason
    assert " ".join(reason.split()) in " ".join(shown.split())  # the note, wrapped


def test_a_report_the_store_already_has_is_explained(tmp_path: Path) -> None:
    """A second sync that changed nothing does not upload its report again, and says why
    in words that need no knowledge of the heartbeat."""
    cache = DeviceCache(tmp_path / "cache")
    store = open_store(str(tmp_path / "store"))
    report = DeviceReport.model_validate(REPORT)
    assert upload_report(store, report, cache).report_uploaded is True
    again = upload_report(store, report, cache)
    assert again.report_uploaded is False
    shown = render_device_report(again, 80)
    said = " ".join(shown.split())
    assert "report not uploaded: the store has the same report, uploaded 20" in said
    assert "says what" not in said


def test_an_interrupted_first_sync_claims_no_previous_variants(tmp_path: Path) -> None:
    assert interrupted_message(tmp_path) == INTERRUPTED_FIRST
    assert "previous" not in INTERRUPTED_FIRST and len(INTERRUPTED_FIRST) <= 80
    (tmp_path / "manifest.json").write_text("{}")
    assert interrupted_message(tmp_path) == INTERRUPTED


@pytest.mark.parametrize("command", [["sync"], ["compile"], ["trust", "init"], ["--help"]])
def test_help_at_80_columns_keeps_examples_and_phrases_whole(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main([*command, "--help"] if command != ["--help"] else command) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(len(line) <= 80 for line in lines), lines
    for previous, line in itertools.pairwise(lines):
        if previous.lstrip().startswith("epfleet ") and previous.startswith("  "):
            assert line.startswith(" ") or not line, (previous, line)  # an example, whole
