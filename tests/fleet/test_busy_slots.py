"""``--workers N`` bounds a pair's compile and its verification together: two pairs built
at once with one worker never have one verifying while the other compiles (found: three
busy processes with --workers 1). Real compiles and verifications on the CPU EP; the
probe only records when each step starts and ends."""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import pytest

from epfleet.fleet.build import variant as build
from epfleet.fleet.planning.plan import plan_run
from tests.support.specs import CPU_TARGET, tiny_models, write_spec

pytestmark = pytest.mark.slow


def test_one_worker_never_verifies_beside_a_compile(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    store_uri = str(tmp_path / "store")
    plan = plan_run(spec, store_uri)
    assert len(plan.pairs) == 2
    spans: list[tuple[str, float, float]] = []
    lock = threading.Lock()

    def timed(kind: str, step):  # type: ignore[no-untyped-def]
        def run(*args, **kwargs):  # type: ignore[no-untyped-def]
            started = time.monotonic()
            try:
                return step(*args, **kwargs)
            finally:
                with lock:
                    spans.append((kind, started, time.monotonic()))

        return run

    real_pool = build.shared_pool

    class TimedPool:
        def __init__(self, workers: int, site: str | None = None) -> None:
            self.pool = real_pool(workers, site)

        def run(self, job):  # type: ignore[no-untyped-def]
            return timed("compile", self.pool.run)(job)

    monkeypatch.setattr(build, "shared_pool", TimedPool)
    monkeypatch.setattr(build, "verify_output", timed("verify", build.verify_output))
    from epfleet.stores import open_store

    results: list[object] = []
    threads = [
        threading.Thread(
            target=lambda r=pair.request: results.append(
                build.build_at(r, open_store(store_uri), 1)
            )
        )
        for pair in plan.pairs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(results) == 2
    kinds = sorted(kind for kind, _, _ in spans)
    assert kinds == ["compile", "compile", "verify", "verify"]
    ordered = sorted(spans, key=lambda span: span[1])
    for (_, _, ended), (kind, started, _) in itertools.pairwise(ordered):
        assert started >= ended, f"a {kind} started before the step before it ended: {ordered}"
