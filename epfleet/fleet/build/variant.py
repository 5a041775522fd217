"""Building one variant on a compile host: compile, check coverage, verify, upload.

The compile runs in a worker process; the variant is verified on the model's golden
samples and uploaded content-addressed only once it passed.

The compile task of the fleet flow (and of a work pool's compile-pairs run) calls
``build_variant``, which tells the run's progress display (``epfleet.logs``) when a
pair starts verifying and how it ended; ``verify_output`` and ``describe_verification``
are the compile host's verification glue around ``epfleet.fleet.build.verify``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

import eps
from epfleet.errors import CompileError, RejectedBuild, summarize
from epfleet.fleet.build.staging import (
    built_with,
    cache_dir,
    compile_job_for,
    fetch_verified,
    runtime_site,
)
from epfleet.fleet.build.verify import VerifyJob, skipped, verify_artifact
from epfleet.fleet.build.verify_cache import (
    judged_on_sets,
    key_for,
    numerics_key_for,
    recalled,
    recalled_backing,
    remember,
    remember_backing,
    reused,
    verified_dir,
)
from epfleet.fleet.runs.outcomes import CompiledVariant, failed_entry, ok_entry
from epfleet.formats.keys import files_key, listing_key, source_key, variant_key
from epfleet.formats.manifest import PrecisionTried, Quantization, Verification
from epfleet.logs import pair_progress
from epfleet.runtime.compile_pool import busy_slots, shared_pool
from epfleet.runtime.compiler import CompileOutput, check_coverage, discard
from epfleet.runtime.requests import CompileRequest
from epfleet.settings import settings
from epfleet.stores import Store
from eps.base import Precision

VERIFY_FAILED = "verification failed: "


def build_variant(request: CompileRequest, store: Store, workers: int) -> CompiledVariant:
    """``build_ladder``, telling the run's progress display how the pair ended."""
    label = f"{request.model} × {request.target}"
    try:
        built = build_ladder(request, store, workers)
    except Exception as exc:  # told, then raised as it was
        pair_progress(label, failure_text(exc), final=True)
        raise
    pair_progress(label, outcome_text(built), final=True)
    return built


def failure_text(exc: Exception) -> str:
    """How a pair that was not published ended, for a progress line (its verification's
    reason once, not "failed verification: verification failed: ...")."""
    entry = exc.entry if isinstance(exc, RejectedBuild) else None
    verified = entry.verification if entry else None
    if verified and verified.status == "failed":
        return "failed verification: " + summarize(exc, 200).removeprefix(VERIFY_FAILED)
    return f"failed: {summarize(exc, 200)}"


def percent_of_range(rel_error: float | None) -> str:
    """A recorded relative error for a line; a record from before the error had a floor
    may hold null (an infinite error of a constant output, stored as JSON null)."""
    if rel_error is None:
        return "error relative to range not recorded"
    return f"{rel_error:.2%} of range"


def outcome_text(built: CompiledVariant) -> str:
    """How a published pair ended, for a progress line."""
    verified = built.entry.verification
    if verified is None or verified.status != "passed":
        reason = verified.reason if verified else "not run"
        return f"compiled in {built.seconds:.2f} s, not verified ({reason})"
    measured = percent_of_range(verified.max_rel_error)
    if verified.metric:
        measured += f", {verified.metric.shown()}"
    if verified.reused:
        return f"verified before, same artifact ({measured}; compiled in {built.seconds:.2f} s)"
    if verified.twin_of:
        return (
            f"checked on {verified.samples} golden sample(s) in {verified.seconds or 0:.2f} s, "
            f"its numerics verified in full as {verified.twin_of}'s "
            f"({measured}; compiled in {built.seconds:.2f} s)"
        )
    return (
        f"verified in {verified.seconds or 0:.2f} s ({measured}; compiled in {built.seconds:.2f} s)"
    )


def build_ladder(request: CompileRequest, store: Store, workers: int) -> CompiledVariant:
    """Build one pair at each precision of its ladder in turn (``build_at``) and publish
    the first that passes its checks; its entry names the precisions that lost, how, why
    and the seconds each took. An integer precision that fails verification says what to
    change next (``ladder_advice``). With one precision, what ``build_at`` raises raises
    through (with that advice); when every precision of a ladder fails, RejectedBuild with
    each one's reason."""
    rungs = request.rungs
    tried: list[PrecisionTried] = []
    seconds = 0.0
    last: CompileError | None = None
    for rung in rungs:
        started = time.perf_counter()
        try:
            built = build_at(rung, store, workers)
        except CompileError as exc:
            exc = with_advice(exc, rung, [r.precision for r in rungs if r.precision])
            if len(rungs) == 1:
                raise exc from None
            last = exc
            rejected = exc.entry if isinstance(exc, RejectedBuild) else None
            seconds += exc.seconds if isinstance(exc, RejectedBuild) else 0.0
            verified = rejected.verification if rejected else None
            tried.append(
                PrecisionTried(
                    precision=rung.precision or "fp32",
                    reason=str(exc)[:TRIED_REASON_CHARS],
                    max_rel_error=verified.max_rel_error if verified else None,
                    outcome=lost_how(exc),
                    seconds=rung_seconds(exc, time.perf_counter() - started),
                )
            )
            continue
        entry = built.entry.model_copy(update={"precision_tried": tried})
        return CompiledVariant(entry=entry, seconds=round(seconds + built.seconds, 3))
    assert last is not None
    summary = "no precision of the ladder passed: " + "; ".join(
        f"{t.precision}: {t.reason}" for t in tried
    )
    base = last.entry if isinstance(last, RejectedBuild) else failed_entry(rungs[-1], summary)
    entry = base.model_copy(update={"error": summary, "precision_tried": tried[:-1]})
    raise RejectedBuild(entry, round(seconds, 3))


def rung_seconds(exc: CompileError, wall: float) -> float:
    """What a lost rung cost: its compile (quantising included) and verification seconds,
    as measured in the worker; for a compile that failed, the wall time of the attempt."""
    if isinstance(exc, RejectedBuild):
        verified = exc.entry.verification
        return round(exc.seconds + ((verified.seconds or 0.0) if verified else 0.0), 2)
    return round(wall, 2)


def lost_how(
    exc: CompileError,
) -> Literal["compile failed", "below min_coverage", "verification failed"]:
    """How a rung lost: it did not compile (or quantise), the EP took less of the graph
    than the target's floor, or its outputs were off."""
    if not isinstance(exc, RejectedBuild):
        return "compile failed"
    verified = exc.entry.verification
    return (
        "verification failed" if verified and verified.status == "failed" else "below min_coverage"
    )


def with_advice(exc: CompileError, rung: CompileRequest, ladder: list[Precision]) -> CompileError:
    """``exc`` with what to change next when an integer rung failed verification (the next
    untried precision the target makes, per-channel weights, calibration, layers), its
    diagnosis cut so that the advice stays within ``TRIED_REASON_CHARS``; as it is else."""
    from epfleet.runtime.quantize import ladder_advice

    if not (isinstance(exc, RejectedBuild) and rung.integer and rung.quantize is not None):
        return exc
    if lost_how(exc) != "verification failed" or rung.precision is None:
        return exc
    module = eps.load(rung.ep)
    advice = ladder_advice(
        rung.precision,
        module.precisions(rung.provider_options),
        ladder,
        rung.quantize,
        module.precision_limits(rung.provider_options),
    )
    error = exc.entry.error or ""
    room = TRIED_REASON_CHARS - len(advice)
    if len(error) > room:
        error = error[: room - 3] + "..."
    return RejectedBuild(exc.entry.model_copy(update={"error": error + advice}), exc.seconds)


TRIED_REASON_CHARS = 1500


def build_at(request: CompileRequest, store: Store, workers: int) -> CompiledVariant:
    """Compile one pair at its precision in this machine's shared pool of ``workers``
    processes and upload its artifact once it passed its checks. RejectedBuild (a
    CompileError carrying the failed entry and its measurements) when it compiles short
    of its coverage floor or fails verification; CompileError when it does not compile;
    store errors raise through."""
    job = compile_job_for(request, store)
    site = runtime_site(request)
    # The pair's compile and its verification hold one of ``workers`` slots: with
    # --workers 1 no verification runs beside the next pair's compile.
    with busy_slots(workers):
        output = shared_pool(workers, site).run(job)
        try:
            verification = checked(request, output, store, job.source_path)
        except BaseException:
            discard(output)
            raise
    key = variant_key(request.model, request.target, output.sha256)
    try:
        quantization = stage_qdq(store, output)
        upload_variant(store, output, key)
    finally:
        discard(output)
    entry = ok_entry(request, output, key, verification)
    return CompiledVariant(
        entry=entry.model_copy(update={"quantization": quantization}), seconds=output.seconds
    )


def checked(
    request: CompileRequest, output: CompileOutput, store: Store, source_path: str
) -> Verification:
    """The fresh variant's coverage and verification; RejectedBuild when it falls short."""
    try:
        check_coverage(request, output.coverage)
    except CompileError as exc:
        rejected = failed_entry(request, str(exc), output.coverage, output=output)
        raise RejectedBuild(rejected, output.seconds) from None
    # A QDQ variant's failure is traced in the float model it was quantised from.
    source = output.qdq_float_path or source_path
    if request.verify:
        pair_progress(
            f"{request.model} × {request.target}",
            f"compiled in {output.seconds:.2f} s; verifying {request.precision or ''}".strip(),
        )
    verification = verify_output(request, output, store, source)
    if verification.status == "failed":
        error = f"{VERIFY_FAILED}{verification.reason}"
        rejected = failed_entry(request, error, output.coverage, verification, output)
        raise RejectedBuild(rejected, output.seconds)
    return verification


def stage_qdq(store: Store, output: CompileOutput) -> Quantization | None:
    """Keep the QDQ model an integer variant was compiled from in the store, as sources
    are kept (content-addressed, once for every target compiled from it)."""
    done = output.quantization
    if done is None or output.qdq_path is None or output.qdq_float_path == output.qdq_path:
        return done  # a float variant, or a source that was QDQ already
    key = source_key(done.qdq_sha256)
    path = Path(output.qdq_path)
    if store.size(key) != path.stat().st_size:
        store.upload(key, path, done.qdq_sha256)
    return done.model_copy(update={"qdq_uri": key})


def upload_variant(store: Store, output: CompileOutput, key: str) -> None:
    """Upload the variant's main file at ``key`` and each other file under files/<sha256>,
    from their paths (streamed), skipping those the store holds at their size."""
    directory = Path(output.artifact_path).parent
    uploads = [(key, Path(output.artifact_path), output.sha256, output.size)]
    uploads += [(files_key(sha), directory / path, sha, size) for path, sha, size in output.files]
    for store_key, path, sha256, size in uploads:
        if store.size(store_key) != size:
            store.upload(store_key, path, sha256)
    if output.files:
        listing = [{"path": p, "sha256": h, "size": n} for p, h, n in output.files]
        store.write(listing_key(key), json.dumps(listing, indent=1).encode())


def verify_output(
    request: CompileRequest, output: CompileOutput, store: Store, source_path: str | None = None
) -> Verification:
    """Run the fresh variant with its own EP on the model's golden samples, in a killable
    worker, and compare with the source's outputs (``source_path``: the source, to say
    why a variant computing in fp16 failed). A variant this machine verified before, same
    bytes, samples, EP and ORT builds and tolerances, is not run again (``verify_cache``).
    A numerics twin (``request.twin_of``), or a variant whose numerics this machine
    verified on every sample before, runs its first golden sample only."""
    if not request.verify:
        return skipped("not run: verify is false for this target")
    if request.samples is None:
        problem = request.samples_problem or "the model has no golden samples"
        return Verification(
            status="failed",
            reason=f"{problem}; nothing to compare the variant with (set verify: false "
            "on the target to publish it unverified)",
        )
    built = built_with(request.ep, request.runtime)
    key = key_for(request, output, built)
    verified = verified_dir(cache_dir(), store.uri)
    earlier = recalled(verified, key)
    if earlier is not None:
        return reused(earlier)
    numerics = numerics_key_for(request, built)
    backing = recalled_backing(verified, numerics)
    samples = request.samples
    golden = fetch_verified(store, samples.uri, samples.sha256, samples.size)
    more = samples.metric_inputs if judged_on_sets(request) else None
    sets = fetch_verified(store, more.uri, more.sha256, more.size) if more else None
    job = VerifyJob(
        label=f"{request.model} × {request.target}",
        artifact_path=output.artifact_path,
        golden_path=str(golden),
        ep=request.ep,
        device=request.device,
        provider_options=request.provider_options,
        tolerance=request.tolerance,
        abs_tolerance=request.abs_tolerance,
        source_path=source_path,
        samples_origin=request.samples_origin,
        precision=request.precision,
        qdq_path=output.qdq_path,
        twin_of=request.twin_of or (backing.target if backing else None),
        metric=request.metric,
        metric_modules=settings().metric_modules,
        folded_io=output.folded_io,
        sets_path=str(sets) if sets else None,
        decision_default=request.decision_default,
    )
    verification = verify_artifact(job, request.verify_timeout, runtime_site(request))
    remember(verified, key, verification)
    remember_backing(verified, numerics, request.target, verification)
    return verification


def describe_verification(verification: Verification) -> str:
    if verification.status == "passed":
        spent = "reused" if verification.reused else f"{verification.seconds:.2f} s"
        if verification.twin_of:
            spent += (
                f", on its first {verification.samples} sample(s), its numerics verified in "
                f"full as {verification.twin_of}'s"
            )
        metric = f", {verification.metric.shown()}" if verification.metric else ""
        return (
            f"passed ({percent_of_range(verification.max_rel_error)}, tolerance "
            f"{verification.tolerance:.2%}{metric}, {spent}, on "
            f"{verification.samples_origin or 'golden'} inputs)"
        )
    return f"{verification.status}: {verification.reason}"
