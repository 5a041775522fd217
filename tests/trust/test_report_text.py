"""What a device report carries is shown escaped: whoever can write the
reports prefix chooses every string in a report, and the key it sits under. Escape
sequences, line breaks, bidi overrides, Markdown table pipes and ``../`` reach a terminal,
a log line, a table artifact or a Markdown artifact only as visible text.

Checked where each reaches its reader: an unreadable report's reason (gc's warnings, the
field view's and the gate's counts), a rollout row (``epfleet rollout status`` and the
rollout-gate artifact), a field row (``manifest show --field`` and the fleet-field
artifact) and the runtime-watch Markdown summary's text. ``manifest show --field`` and
``rollout status`` themselves are run in tests/trust/test_report_attacks.py."""

from __future__ import annotations

import gzip
import json
from datetime import datetime, timezone
from pathlib import Path

import pytest

from epfleet.fleet.evidence.field_rules import FieldRow
from epfleet.fleet.rollout.rollouts import RolloutStatus
from epfleet.fleet.rollout.rules import Evidence, Verdict
from epfleet.fleet.views import FIELD_HEADERS, field_table_rows, rollout_row
from epfleet.fleet.watch.inputs import read_reports
from epfleet.formats.rollout import Rollout, RolloutPolicy
from epfleet.stores import open_store
from epfleet.text import markdown_cells, markdown_text

pytestmark = pytest.mark.fast

HOSTILE = "m\x1b[2J\x1b]8;;http://x\x07|x\r\n../../evil\u202e[red]*b*[a](http://x)<img>"
ESCAPED = "m\\x1b[2J\\x1b]8;;http://x\\x07|x\\x0d\\x0a../../evil\\u202e"
"""``HOSTILE`` as a terminal is shown it: every control and format character visible."""


def assert_inert(shown: str) -> None:
    assert not any(c in shown for c in "\x1b\x07\r\n\u202e"), repr(shown)


def test_an_unreadable_reports_reason_is_escaped(tmp_path: Path) -> None:
    store = open_store(str(tmp_path / "store"))
    forged = {
        "device_id": "dev-001",
        "generated_at": datetime.now(timezone.utc).isoformat(),
        "ort_version": "1.32.0",
        "ep_packages": {HOSTILE: 5},  # a name the report chose, and a value it may not hold
        "devices": [],
        "store": "s",
        "cache": "c",
        "manifest": {"status": "unchanged", "generation": 2, "body_bytes": 0},
        "models": [],
        "seconds": 1.0,
    }
    store.write("reports/devices/dev-001.json", gzip.compress(json.dumps(forged).encode()))
    reports, unreadable = read_reports(store)
    assert reports == [] and len(unreadable) == 1
    [reason] = unreadable
    assert reason.startswith("reports/devices/dev-001.json: ep_packages.m\\x1b[2J")
    assert_inert(reason)


def test_a_field_row_escapes_the_reports_names() -> None:
    row = FieldRow(
        model=HOSTILE,
        target=HOSTILE,
        published=False,
        running=1,
        failed=0,
        p50_ms=None,
        p95_ms=None,
        partly_on_other_eps=0,
    )
    [cells] = field_table_rows([row])
    for cell in cells:
        assert_inert(cell)
    assert cells[0].startswith(ESCAPED) and cells[1].startswith(ESCAPED)


def test_markdown_text_leaves_no_table_cell_link_or_tag() -> None:
    shown = markdown_text(HOSTILE)
    assert_inert(shown)
    assert "|" not in shown.replace("\\|", "")
    assert "](" not in shown.replace("\\](", "")
    assert "<" not in shown and "&lt;img" in shown
    assert "\\*b\\*" in shown


def test_a_rollout_row_escapes_the_gates_reason() -> None:
    now = datetime.now(timezone.utc)
    rollout = Rollout(
        id="0" * 16,
        salt="5a17" * 8,
        policy=RolloutPolicy(stages=[10, 100]),
        stage=0,
        started_at=now,
        stage_started_at=now,
    )
    status = RolloutStatus(
        model="model-0",
        rollout=rollout,
        evidence=Evidence(),
        verdict=Verdict(decision="wait", reason=HOSTILE),
    )
    row = rollout_row(status)
    for cell in row.values():
        assert_inert(cell)
    assert ESCAPED in row["gate"]


def test_a_table_artifacts_cells_are_markdown_escaped() -> None:
    """The Prefect UI renders a table artifact's cells as Markdown: the rollout-gate and
    fleet-field artifacts' rows go through ``markdown_cells``."""
    row = FieldRow(
        model=HOSTILE,
        target="cpu",
        published=True,
        running=1,
        failed=0,
        p50_ms=1.0,
        p95_ms=2.0,
        partly_on_other_eps=0,
    )
    [cells] = field_table_rows([row])
    shown = markdown_cells(dict(zip(FIELD_HEADERS, cells, strict=True)))
    assert list(shown) == FIELD_HEADERS
    assert_inert(shown["model"])
    assert "|" not in shown["model"].replace("\\|", "")
    assert "<" not in shown["model"] and "](" not in shown["model"].replace("\\](", "")
    assert shown["running"] == "1"
