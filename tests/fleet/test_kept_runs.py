"""Runs kept to be recorded on a Prefect API later (``epfleet.fleet.runs.kept_runs``): written
atomically, at most ``MAX_KEPT`` of them (the oldest dropped), none over ``MAX_BYTES``,
read back as written, claimed by one command at a time, and each store's apart."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.fast


def test_kept_runs_are_bounded_and_claimed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from epfleet.fleet.runs import kept_runs
    from epfleet.fleet.runs.models import RunPlan, RunReport
    from epfleet.settings import reset_settings

    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "cache"))
    reset_settings()
    monkeypatch.setattr(kept_runs, "MAX_KEPT", 3)
    plan = RunPlan(store="s", sources={}, pairs=[], generation=0, published_sources={})
    report = RunReport(generation=1, published=True, compiled=0, skipped=0, failed=0, variants=[])
    inputs = (str(tmp_path / "spec.yaml"), "file:///s", ("m",), (), False)
    paths = []
    for _ in range(4):
        path, dropped = kept_runs.keep(inputs, 2, plan, report)
        paths.append(path)
    assert dropped == [paths[0]]  # the oldest goes, so that at most MAX_KEPT stay
    assert kept_runs.pending("file:///s") == paths[1:]
    run = kept_runs.load(paths[1])
    assert (run.inputs, run.workers, run.report) == (inputs, 2, report)

    claimed = kept_runs.claim(paths[1])
    assert claimed is not None and kept_runs.claim(paths[1]) is None  # one command only
    assert kept_runs.pending("file:///s") == paths[2:]
    kept_runs.release(claimed)
    assert kept_runs.pending("file:///s") == paths[1:]

    other = (str(tmp_path / "spec.yaml"), "file:///t", ("m",), (), False)
    theirs, _ = kept_runs.keep(other, 2, plan, report)  # another store's: apart, not dropped
    assert kept_runs.pending("file:///t") == [theirs]
    assert kept_runs.pending("file:///s") == paths[1:]

    monkeypatch.setattr(kept_runs, "MAX_BYTES", 10)
    with pytest.raises(ValueError, match="over 10"):
        kept_runs.keep(inputs, 2, plan, report)
    reset_settings()


def test_runs_kept_before_runs_were_kept_per_store_are_listed_apart_and_never_pending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from epfleet.fleet.runs import kept_runs
    from epfleet.fleet.runs.models import RunPlan, RunReport
    from epfleet.settings import reset_settings

    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "cache"))
    reset_settings()
    assert kept_runs.from_before_stores() == []  # no directory yet
    plan = RunPlan(store="s", sources={}, pairs=[], generation=0, published_sources={})
    report = RunReport(generation=1, published=True, compiled=0, skipped=0, failed=0, variants=[])
    inputs = (str(tmp_path / "spec.yaml"), "file:///s", ("m",), (), False)
    mine, _ = kept_runs.keep(inputs, 2, plan, report)
    root = kept_runs.kept_root()
    old = root / "20261201T000000.000000001-00000000.json"  # the layout before: one directory
    old.write_bytes(mine.read_bytes().replace(b'"file:///s"', b'"./s"'))  # the store as typed
    claimed = root / "20261201T000000.000000002-00000000.json.recording"
    claimed.write_bytes(old.read_bytes())
    (root / ".20261201T000000.000000003-00000000.json.ab12cd34.tmp").write_bytes(b"")
    assert kept_runs.from_before_stores() == [old, claimed]
    assert kept_runs.pending("file:///s") == [mine]  # never another store's, nor "./s"
    assert kept_runs.pending("./s") == []
    reset_settings()
