"""A pool decides its own pairs: fingerprints from the pool's ORT and EP packages."""

from __future__ import annotations

from pathlib import Path

import pytest

import eps
from epfleet import ort_version
from epfleet.fleet.planning.plan import plan_on_pool
from epfleet.fleet.runs.handover import PoolPair
from epfleet.formats.manifest import ArtifactRef, VariantEntry, utcnow
from epfleet.runtime.requests import CompileRequest, fingerprinted
from epfleet.stores import open_store

pytestmark = pytest.mark.fast

SHA = "a" * 64
CPU = "CPUExecutionProvider"


def request(fingerprint: str = "planned-elsewhere") -> CompileRequest:
    return CompileRequest(
        model="det",
        target="pool-cpu",
        ep=CPU,
        device="cpu",
        provider_options={},
        input_shapes={"x": [1, 3, 8, 8]},
        source_key=f"sources/{SHA}.onnx",
        source_sha256=SHA,
        source_size=10,
        fingerprint=fingerprint,
    )


def built(fingerprint: str) -> VariantEntry:
    return VariantEntry(
        ep=CPU,
        device="cpu",
        compatibility_string="s",
        artifact=ArtifactRef(uri=f"variants/det/pool-cpu/{SHA}.onnx", sha256=SHA, size=3),
        ort_version=ort_version(),
        ep_version="x",
        compiled_at=utcnow(),
        status="ok",
        source_sha256=SHA,
        fingerprint=fingerprint,
    )


def test_the_pool_skips_what_it_built_and_rebuilds_after_its_own_upgrade(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    store.write(f"variants/det/pool-cpu/{SHA}.onnx", b"abc")
    here = fingerprinted(request(), ort_version(), eps.load(CPU).build_identity()).fingerprint
    assert here != "planned-elsewhere"

    todo, skipped = plan_on_pool(
        [PoolPair(request=request(), previous=built(here))], store.uri, False
    )
    assert (todo, skipped) == ([], [("det", "pool-cpu")])

    older = fingerprinted(request(), ort_version(), {"package": "onnxruntime", "version": "1.31.0"})
    todo, skipped = plan_on_pool(
        [PoolPair(request=request(), previous=built(older.fingerprint))], store.uri, False
    )
    assert [r.fingerprint for r in todo] == [here] and skipped == []

    todo, _ = plan_on_pool([PoolPair(request=request(), previous=built(here))], store.uri, True)
    assert [r.fingerprint for r in todo] == [here]

    store.delete(f"variants/det/pool-cpu/{SHA}.onnx")  # artifact gone from the store
    todo, _ = plan_on_pool([PoolPair(request=request(), previous=built(here))], store.uri, False)
    assert len(todo) == 1


def test_events_name_only_failures_and_builds_that_changed_the_manifest() -> None:
    from epfleet.fleet.planning.rules import PlannedPair
    from epfleet.fleet.publishing.rules import news
    from epfleet.fleet.runs.models import PairResult, RunPlan, RunReport

    same, new = (
        built("f1"),
        built("f2").model_copy(
            update={"artifact": ArtifactRef(uri="variants/det/x/new.onnx", sha256="b" * 64, size=3)}
        ),
    )
    pairs = [
        PlannedPair(
            request=request().model_copy(update={"target": t}),
            action="compile",
            reason="",
            previous=same,
        )
        for t in ("rebuilt-same", "rebuilt-new", "broken")
    ]
    plan = RunPlan(store="s", sources={}, pairs=pairs, generation=1, published_sources={})
    results = [
        PairResult.of(pairs[0].request, same, "ok", 1.0),
        PairResult.of(pairs[1].request, new, "ok", 1.0),
        PairResult.of(
            pairs[2].request,
            built("f3").model_copy(update={"status": "failed", "error": "x"}),
            "failed",
            None,
        ),
    ]

    def report(published: bool) -> RunReport:
        return RunReport(
            generation=2, published=published, compiled=2, skipped=0, failed=1, variants=results
        )

    assert [r.target for r in news(plan, report(True))] == ["rebuilt-new", "broken"]
    assert [r.target for r in news(plan, report(False))] == ["broken"]


def test_a_pool_installs_no_package_its_own_machine_does_not_allow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compile-pairs run's parameters carry each pair's runtime requirements: a forged
    one naming another package is refused on the pool's machine, naming the runtime,
    before pip runs (EPFLEET_RUNTIME_PACKAGES of that machine decides)."""
    from epfleet.errors import BadInputError
    from epfleet.runtime.requests import RuntimeRef

    monkeypatch.setenv("EPFLEET_CACHE", str(tmp_path / "cache"))
    forged = request().model_copy(
        update={
            "runtime": RuntimeRef(name="ort", requirements=["onnxruntime==1.32.0", "evil==1.0"])
        }
    )
    store = open_store(str(tmp_path / "store"))
    with pytest.raises(BadInputError) as refused:
        plan_on_pool([PoolPair(request=forged)], store.uri, False)
    assert str(refused.value).startswith("runtime 'ort': evil==1.0 is not onnxruntime or an EP")
    assert not (tmp_path / "cache" / "runtimes").exists()
