"""The device's choice rules (pure): every verdict combination, preference and tie-breaks."""

from __future__ import annotations

import itertools

import pytest

from epfleet.device.selection import (
    DEFAULT_PREFERENCE,
    ActiveVariant,
    Considered,
    Step,
    decide,
    rank,
)
from eps.base import DeviceType, Verdict

pytestmark = pytest.mark.fast

SOURCE = "5" * 64
V = Verdict


def variant(
    target: str, verdict: Verdict, device: DeviceType = "npu", declared: int | None = None
) -> Considered:
    return Considered(
        target=target,
        ep="CPUExecutionProvider" if device == "cpu" else "QNNExecutionProvider",
        device=device,
        sha256=(target.encode().hex() * 64)[:64],
        compatibility_string=f"s-{target}",
        verdict=verdict,
        reason=verdict.value,
        declared_rank=declared,
    )


def active_of(c: Considered, verdict: Verdict | None = None) -> ActiveVariant:
    return ActiveVariant(
        origin="published",
        target=c.target,
        sha256=c.sha256,
        source_sha256=SOURCE,
        verdict=verdict or c.verdict,
    )


def steps(*pairs: tuple[str, str | None]) -> list[Step]:
    return [Step(kind=kind, target=target) for kind, target in pairs]  # type: ignore[arg-type]


def test_rank_orders_by_verdict_then_preference_then_manifest_order() -> None:
    considered = [
        variant("cpu-prefer", V.PREFER_RECOMPILATION, "cpu"),
        variant("npu-prefer", V.PREFER_RECOMPILATION, "npu"),
        variant("cpu-a", V.OPTIMAL, "cpu"),
        variant("gpu", V.OPTIMAL, "gpu"),
        variant("cpu-b", V.OPTIMAL, "cpu"),
        variant("bad", V.UNSUPPORTED, "npu"),
        variant("unknown", V.UNKNOWN, "npu"),
    ]
    ranked = [c.target for c in rank(considered, ("npu", "gpu", "cpu"))]
    assert ranked == ["gpu", "cpu-a", "cpu-b", "npu-prefer", "cpu-prefer"]
    assert [c.target for c in rank(considered, ("cpu", "gpu", "npu"))][:3] == [
        "cpu-a",
        "cpu-b",
        "gpu",
    ]


def test_declared_preference_breaks_ties_between_equally_good_variants() -> None:
    """Same verdict and device type: the target the spec lists first wins; targets it does
    not list come after the listed ones, in manifest order."""
    considered = [
        variant("unlisted-a", V.OPTIMAL, "npu"),
        variant("htp-fp16", V.OPTIMAL, "npu", declared=2),
        variant("unlisted-b", V.OPTIMAL, "npu"),
        variant("htp-w8a8", V.OPTIMAL, "npu", declared=0),
        variant("htp-w8a16", V.OPTIMAL, "npu", declared=1),
    ]
    ranked = [c.target for c in rank(considered, ("npu", "gpu", "cpu"))]
    assert ranked == ["htp-w8a8", "htp-w8a16", "htp-fp16", "unlisted-a", "unlisted-b"]


def test_declared_preference_never_outranks_verdict_or_device_type() -> None:
    considered = [
        variant("cpu-first", V.OPTIMAL, "cpu", declared=0),
        variant("npu-prefer", V.PREFER_RECOMPILATION, "npu", declared=1),
        variant("npu-last", V.OPTIMAL, "npu", declared=2),
    ]
    ranked = [c.target for c in rank(considered, ("npu", "gpu", "cpu"))]
    assert ranked == ["npu-last", "cpu-first", "npu-prefer"]
    ranked = [c.target for c in rank(considered, ("cpu", "npu"))]
    assert ranked == ["cpu-first", "npu-last", "npu-prefer"]


def test_a_reordered_preference_switches_the_active_variant() -> None:
    """The fleet now lists the other of two equally good variants first: the device
    downloads it, and keeps the active one if that download fails."""
    first, second = variant("a", V.OPTIMAL, "cpu", 0), variant("b", V.OPTIMAL, "cpu", 1)
    got = decide(
        [first, second], active_of(first), SOURCE, recompile=True, recompile_failed_before=False
    )
    assert got == steps(("keep", "a"))
    reordered = [
        first.model_copy(update={"declared_rank": 1}),
        second.model_copy(update={"declared_rank": 0}),
    ]
    got = decide(reordered, active_of(first), SOURCE, recompile=True, recompile_failed_before=False)
    assert got == steps(("download", "b"), ("keep", "a"))


@pytest.mark.parametrize("recompile_suboptimal", [False, True])
@pytest.mark.parametrize("verdicts", list(itertools.product(list(Verdict), repeat=2)))
def test_every_pair_of_verdicts(
    verdicts: tuple[Verdict, Verdict], recompile_suboptimal: bool
) -> None:
    """Two published variants (npu then cpu), nothing active, recompiling allowed."""
    npu, cpu = variant("npu", verdicts[0], "npu"), variant("cpu", verdicts[1], "cpu")
    got = decide(
        [npu, cpu],
        None,
        SOURCE,
        recompile=True,
        recompile_failed_before=False,
        recompile_suboptimal=recompile_suboptimal,
    )
    optimal = [c for c in (npu, cpu) if c.verdict == V.OPTIMAL]
    prefer = [c for c in (npu, cpu) if c.verdict == V.PREFER_RECOMPILATION]
    # A fresh device: the optimal variants first, then the rest of the ladder: the verified
    # prefer-recompilation variants before a local build, unless the policy asks otherwise.
    expected = [Step(kind="download", target=c.target) for c in optimal]
    suboptimal = [Step(kind="download", target=c.target) for c in prefer]
    if recompile_suboptimal:
        expected += [Step(kind="recompile"), *suboptimal]
    else:
        expected += [*suboptimal, Step(kind="recompile")]
    expected += [Step(kind="fallback")]
    assert got == expected
    # Unknown (EP_NOT_APPLICABLE) and unsupported are never downloaded.
    downloaded = {s.target for s in got if s.kind == "download"}
    assert all(
        c.verdict in (V.OPTIMAL, V.PREFER_RECOMPILATION)
        for c in (npu, cpu)
        if c.target in downloaded
    )


def test_active_optimal_choice_is_kept() -> None:
    npu, cpu = variant("npu", V.OPTIMAL, "npu"), variant("cpu", V.OPTIMAL, "cpu")
    got = decide([npu, cpu], active_of(npu), SOURCE, recompile=True, recompile_failed_before=False)
    assert got == steps(("keep", "npu"))


def test_active_but_not_first_choice_switches_or_keeps_the_active_one() -> None:
    npu, cpu = variant("npu", V.OPTIMAL, "npu"), variant("cpu", V.OPTIMAL, "cpu")
    gpu = variant("gpu", V.OPTIMAL, "gpu")
    got = decide(
        [npu, gpu, cpu], active_of(gpu), SOURCE, recompile=True, recompile_failed_before=False
    )
    # If the npu variant cannot be fetched, the active gpu one is kept, not downloaded again.
    assert got == steps(("download", "npu"), ("keep", "gpu"))


def test_device_running_something_does_not_recompile_when_optimal_downloads_fail() -> None:
    cpu = variant("cpu", V.OPTIMAL, "cpu")
    fallback = ActiveVariant(
        origin="fallback", target=None, sha256=SOURCE, source_sha256=SOURCE, verdict=V.UNKNOWN
    )
    got = decide([cpu], fallback, SOURCE, recompile=True, recompile_failed_before=False)
    assert got == steps(("download", "cpu"))


def test_prefer_recompilation_active_ranked_second_is_kept() -> None:
    npu = variant("npu", V.PREFER_RECOMPILATION, "npu")
    cpu = variant("cpu", V.PREFER_RECOMPILATION, "cpu")
    got = decide([npu, cpu], active_of(cpu), SOURCE, recompile=False, recompile_failed_before=False)
    assert got == steps(("download", "npu"), ("keep", "cpu"), ("fallback", None))


def test_same_target_new_artifact_is_downloaded() -> None:
    cpu = variant("cpu", V.OPTIMAL, "cpu")
    stale = active_of(cpu).model_copy(update={"sha256": "0" * 64})
    got = decide([cpu], stale, SOURCE, recompile=True, recompile_failed_before=False)
    assert got == steps(("download", "cpu"))  # a failure keeps the stale one running


def test_only_htp_published_recompiles_then_falls_back() -> None:
    htp = [variant("v75", V.UNSUPPORTED), variant("v73", V.UNSUPPORTED)]
    got = decide(htp, None, SOURCE, recompile=True, recompile_failed_before=False)
    assert got == steps(("recompile", None), ("fallback", None))


def test_no_recompile_policy_or_failed_before_goes_to_fallback() -> None:
    htp = [variant("v75", V.UNSUPPORTED)]
    assert decide(htp, None, SOURCE, recompile=False, recompile_failed_before=False) == steps(
        ("fallback", None)
    )
    assert decide(htp, None, SOURCE, recompile=True, recompile_failed_before=True) == steps(
        ("fallback", None)
    )


def test_local_build_kept_until_an_optimal_variant_is_published() -> None:
    local = ActiveVariant(
        origin="local", target=None, sha256="1" * 64, source_sha256=SOURCE, verdict=V.OPTIMAL
    )
    htp = variant("v75", V.UNSUPPORTED)
    got = decide([htp], local, SOURCE, recompile=True, recompile_failed_before=False)
    assert got == steps(("keep", None))
    published = variant("cpu", V.OPTIMAL, "cpu")
    got = decide([htp, published], local, SOURCE, recompile=True, recompile_failed_before=False)
    assert got == steps(("download", "cpu"))


def test_local_build_of_an_old_source_is_rebuilt() -> None:
    local = ActiveVariant(
        origin="local", target=None, sha256="1" * 64, source_sha256="9" * 64, verdict=V.OPTIMAL
    )
    got = decide([], local, SOURCE, recompile=True, recompile_failed_before=False)
    assert got == steps(("recompile", None), ("fallback", None))


def test_prefer_recompilation_active_is_kept_when_recompiling_is_off() -> None:
    cpu = variant("cpu", V.PREFER_RECOMPILATION, "cpu")
    got = decide([cpu], active_of(cpu), SOURCE, recompile=False, recompile_failed_before=False)
    assert got == steps(("keep", "cpu"), ("fallback", None))


def test_nothing_and_no_source_means_no_step() -> None:
    assert (
        decide([variant("x", V.UNKNOWN)], None, None, recompile=True, recompile_failed_before=False)
        == []
    )


def test_a_verified_prefer_recompilation_variant_runs_before_a_local_build() -> None:
    """A real QNN device judges a binary built for another VTCM size prefer-recompilation:
    the fleet's verified variant is taken, and a local build only if it fails."""
    npu = variant("npu", V.PREFER_RECOMPILATION, "npu")
    got = decide([npu], None, SOURCE, recompile=True, recompile_failed_before=False)
    assert got == steps(("download", "npu"), ("recompile", None), ("fallback", None))
    got = decide([npu], active_of(npu), SOURCE, recompile=True, recompile_failed_before=False)
    assert got[0] == Step(kind="keep", target="npu")


def test_recompile_suboptimal_builds_before_taking_a_prefer_recompilation_variant() -> None:
    npu = variant("npu", V.PREFER_RECOMPILATION, "npu")
    got = decide(
        [npu],
        None,
        SOURCE,
        recompile=True,
        recompile_failed_before=False,
        recompile_suboptimal=True,
    )
    assert got == steps(("recompile", None), ("download", "npu"), ("fallback", None))
    off = decide(
        [npu],
        None,
        SOURCE,
        recompile=False,
        recompile_failed_before=False,
        recompile_suboptimal=True,
    )
    assert off == steps(("download", "npu"), ("fallback", None))


def test_a_targets_variants_of_several_runtimes_rank_by_release_after_the_declared_order() -> None:
    """Two targets declared w8a8 first, each built under two runtimes: the declared order
    decides between targets, and within one the device's own release, then the newest."""
    w8a8_new = variant("w8a8.qnn-2.7", V.OPTIMAL, "npu", declared=0).model_copy(
        update={"runtime_rank": 1}
    )
    w8a8_own = variant("w8a8.qnn-2.5", V.OPTIMAL, "npu", declared=0)
    fp16_own = variant("fp16.qnn-2.5", V.OPTIMAL, "npu", declared=1)
    ranked = rank([fp16_own, w8a8_new, w8a8_own], DEFAULT_PREFERENCE)
    assert [c.target for c in ranked] == ["w8a8.qnn-2.5", "w8a8.qnn-2.7", "fp16.qnn-2.5"]


def measured(c: Considered, place: int) -> Considered:
    return c.model_copy(update={"measured_rank": place})


def test_a_field_ranking_reorders_only_the_variants_it_measured_within_their_verdict() -> None:
    npu = variant("npu", V.OPTIMAL, "npu")
    gpu = variant("gpu", V.OPTIMAL, "gpu")
    cpu = variant("cpu", V.OPTIMAL, "cpu")
    npu_prefer = variant("npu-prefer", V.PREFER_RECOMPILATION, "npu")
    unsupported = variant("npu-unsupported", V.UNSUPPORTED, "npu")
    # measured: cpu fastest, then npu, then the unsupported one (never taken), then
    # the prefer-recompilation one (still after every optimal variant); gpu not measured
    considered = [
        measured(npu, 1),
        gpu,
        measured(cpu, 0),
        measured(npu_prefer, 3),
        measured(unsupported, 2),
    ]
    assert [c.target for c in rank(considered, DEFAULT_PREFERENCE)] == [
        "cpu",
        "gpu",
        "npu",
        "npu-prefer",
    ]
    # with no ranking, today's order
    plain = [npu, gpu, cpu, npu_prefer, unsupported]
    assert [c.target for c in rank(plain, DEFAULT_PREFERENCE)] == [
        "npu",
        "gpu",
        "cpu",
        "npu-prefer",
    ]
    active = active_of(npu)
    assert decide(considered, active, SOURCE, recompile=True, recompile_failed_before=False) == (
        steps(("download", "cpu"), ("download", "gpu"), ("keep", "npu"))
    )
