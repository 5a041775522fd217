"""What a compile prints while it runs: each pair's outcome line says how it
ended (verified, failed verification, compile failed), its verification is announced when
it starts; and the worker processes' native banners (QNN's `` # LIBNATIVE:`` lines) are
filtered at the fd level while every other byte, including what a dying worker wrote last,
reaches stderr."""

from __future__ import annotations

import io
import sys
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from epfleet.errors import WorkerDied
from epfleet.logs import CompileProgress, pair_progress
from epfleet.runtime.workers import IsolatedWorkers
from tests.support.native_writers import write_like_qnn, write_then_die

pytestmark = pytest.mark.fast


def finished(seconds: float) -> Future[object]:
    future: Future[object] = Future()
    future.set_result(SimpleNamespace(seconds=seconds))
    return future


def failed(message: str) -> Future[object]:
    future: Future[object] = Future()
    future.set_exception(RuntimeError(message))
    return future


def test_each_pair_ends_with_how_it_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    compiles = [("m × a", finished(0.9)), ("m × b", finished(66.79)), ("m × c", failed("boom"))]
    progress = CompileProgress(compiles)
    pair_progress("m × a", "compiled in 0.90 s; verifying fp16")
    pair_progress("m × a", "verified in 2.41 s (1.15% of range; compiled in 0.90 s)", final=True)
    pair_progress("m × b", "compiled in 66.79 s; verifying fp16")
    pair_progress("m × b", "failed verification: output 0 differs by 37%", final=True)
    pair_progress("other × x", "verified", final=True)  # not this run's: ignored
    progress.close()
    pair_progress("m × a", "after close", final=True)  # no longer listening
    lines = err.getvalue().splitlines()
    assert lines == [
        "epfleet: [1/3] m × c: compile failed: boom",
        "epfleet: m × a: compiled in 0.90 s; verifying fp16",
        "epfleet: [2/3] m × a: verified in 2.41 s (1.15% of range; compiled in 0.90 s)",
        "epfleet: m × b: compiled in 66.79 s; verifying fp16",
        "epfleet: [3/3] m × b: failed verification: output 0 differs by 37%",
    ]
    assert not any("compiled in 66.79 s" in line and "[" in line for line in lines)


def test_native_banners_are_dropped_and_real_errors_kept(
    capfd: pytest.CaptureFixture[str],
) -> None:
    workers = IsolatedWorkers(1)  # started now: its fds are capfd's
    try:
        assert workers.call(write_like_qnn, None, timeout=120) == "done"
        with pytest.raises(WorkerDied):
            workers.call(write_then_die, None, timeout=120)
    finally:
        workers.shutdown()
    # The filter is a process of its own that outlives the worker: what it forwards
    # reaches stderr when it gets to it (seconds later on a busy machine), so the test
    # reads until both real errors are there, or gives up after a minute (it forwards in
    # order: every banner was judged before the last words).
    out = err = ""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = capfd.readouterr()
        out, err = out + got.out, err + got.err
        if "last words before the abort" in err and "something broke" in err:
            break
        time.sleep(0.1)
    assert "LIBNATIVE" not in out + err
    assert "real native error: something broke" in err
    assert "last words before the abort" in err  # the filter outlives the worker
