"""The steps a model's sync tries: keep, download, build here, or run the source on the CPU.

Each ends with a variant in the cache: the one already there (keep) or a new one installed.

Every new variant passes its checks before it is installed: the sha256 and size the
manifest gives (``epfleet.device.download``), the compatibility string ORT reads from
the file (for a published variant), and a health check in a worker process, on the
model's golden samples when the manifest has them. A step that fails raises an
``EpfleetError`` naming why; nothing it leaves behind is active.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import eps
from epfleet.device.activation import fallback_variant, local_variant, published_variant
from epfleet.device.cache import DeviceCache, Installed, InstalledFile, ModelState
from epfleet.device.cache.repair import COMPATIBILITY_KEY
from epfleet.device.delta_fetch import FromDelta, fetch_by_delta
from epfleet.device.fetching import Fetcher
from epfleet.device.local_build import local_request, local_targets
from epfleet.device.local_eps import LocalEps
from epfleet.device.selection import Considered, Step
from epfleet.device.variant_sets import fetch_set, is_file_set
from epfleet.errors import (
    CompileError,
    DeadlineExceeded,
    EpfleetError,
    HealthCheckError,
    IntegrityError,
)
from epfleet.formats.device_report import Action
from epfleet.formats.field_ranking import ProfileRanking
from epfleet.formats.manifest import ModelEntry, VariantEntry
from epfleet.formats.task_metric import TaskMetric
from epfleet.limits import time_limit
from epfleet.settings import settings
from epfleet.text import plural
from eps.base import (
    DeviceType,
    Judgement,
    LocalTarget,
    Tolerance,
    Verdict,
    effective_tolerance,
)

if TYPE_CHECKING:
    from epfleet.device.health import Health, HealthJob, HealthRunner, ShadowOutcome
    from epfleet.device.shadow import ShadowAsk
    from epfleet.runtime.compile_pool import CompilePool

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Done:
    """A step that succeeded: what is now installed, and how the report says it."""

    installed: Installed
    action: Action
    verdict: Verdict | None
    reason: str
    delta_from: str | None = None
    """The variant whose file a delta turned into this one (None: not made from a delta)."""


class Steps:
    """The steps, with what they share for one sync: the fetcher, the cache, the local EPs
    and one worker process (started on first use; ``close`` stops it).

    The worker, the health check and the build are imported when a step first needs them:
    a sync that keeps every model (most polls) never loads the compile side (``onnx``).

    ``health`` runs the health checks (None: in the worker process, killed past its time
    limit; ``epfleet.device.health.in_thread``: in this thread)."""

    def __init__(
        self,
        fetcher: Fetcher,
        cache: DeviceCache,
        local: LocalEps,
        prefer: Sequence[DeviceType],
        health: HealthRunner | None = None,
    ) -> None:
        self.fetcher = fetcher
        self.cache = cache
        self.local = local
        self.prefer = prefer
        self.health_runner: HealthRunner = health or self.in_worker
        self.measured: dict[str, ProfileRanking] = {}
        """Model -> the signed field ranking of this device's hardware profile and runtime
        (``epfleet.formats.field_ranking``), for the models that have one."""
        self._worker: CompilePool | None = None

    @property
    def worker(self) -> CompilePool:
        if self._worker is None:
            from epfleet.runtime.compile_pool import CompilePool

            self._worker = CompilePool(1)
        return self._worker

    def in_worker(self, job: HealthJob, doing: str, timeout: float | None) -> Health:
        """The default ``HealthRunner``: the check in this sync's worker process."""
        from epfleet.device.health import check_health

        return self.worker.call(check_health, job, doing, timeout=timeout)

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()
            self._worker = None

    def judge_installed(self, installed: Installed) -> Judgement:
        if installed.compatibility_string is None:
            return Judgement(Verdict.UNKNOWN, "the source model, not compiled for any EP")
        return self.local.judge(installed.ep, installed.compatibility_string)

    def run(
        self,
        step: Step,
        model: str,
        entry: ModelEntry,
        state: ModelState,
        considered: list[Considered],
    ) -> Done:
        if step.kind == "keep":
            assert state.active is not None
            return self.keep(state.active)
        if step.kind == "download":
            assert step.target is not None
            chosen = next(c for c in considered if c.target == step.target)
            return self.download(model, entry, chosen, state)
        if step.kind == "recompile":
            return self.recompile(model, entry)
        return self.fallback(model, entry, state.active)

    # -- the steps --

    def keep(self, active: Installed) -> Done:
        verdict = self.judge_installed(active)
        return Done(
            installed=active,
            action="kept",
            verdict=verdict.verdict,
            reason=f"{active.name} is still the best choice here ({verdict.reason})",
        )

    def download(
        self, model: str, entry: ModelEntry, chosen: Considered, state: ModelState
    ) -> Done:
        """The published variant ``chosen``, from the cache's rollback slot if it is there."""
        variant = entry.variants[chosen.target]
        artifact = variant.artifact
        assert artifact is not None
        installed = published_variant(chosen.target, variant, self.fetcher.clock.now())
        previous = state.previous
        if (
            previous is not None
            and previous.name == installed.name
            and self.cache.intact(model, previous)
        ):
            return Done(
                installed=previous,
                action="downloaded",
                verdict=chosen.verdict,
                reason=f"rolled back to {previous.name}, kept in the cache: {chosen.reason}",
            )
        self.fetcher.require_store()
        made = fetch_by_delta(self.fetcher, model, variant, state)
        if isinstance(made, FromDelta):
            got = made.fetched
        else:
            got = fetch_set(
                self.fetcher, installed.name, artifact, variant.model_file, variant.files
            )
        try:
            check_string(got.main, variant)
            health = self.health(got.main, installed, entry)
            installed = got.install(model, installed.model_copy(update={"profile": health.profile}))
        except (IntegrityError, HealthCheckError):
            got.drop()  # verified bytes, but not what the manifest says or they do not run
            raise
        finally:
            got.close()
        logger.debug(  # the sync's own line says it once, with the bytes prefetched too
            "%s: fetched %s (%d bytes not prefetched), health check passed%s",
            model,
            installed.name,
            got.moved,
            f" on {plural(health.samples, 'golden sample')}" if health.samples else "",
        )
        reason = chosen.reason
        if isinstance(made, FromDelta):
            reason += (
                f"; a delta of {made.delta.size:,} B from {made.base.name} "
                f"(whole file {artifact.size:,} B)"
            )
        elif made is not None:
            reason += f"; {made}"
        return Done(
            installed=installed,
            action="downloaded",
            verdict=chosen.verdict,
            reason=reason,
            delta_from=made.base.name if isinstance(made, FromDelta) else None,
        )

    def recompile(self, model: str, entry: ModelEntry) -> Done:
        """Build the published source here, for the first EP (in preference order) whose
        build judges optimal and passes its health check."""
        self.fetcher.require_store()
        targets = local_targets(self.local, self.prefer)
        if not targets:
            raise EpfleetError("no EP here builds for this device's hardware")
        source = entry.source
        got = fetch_set(
            self.fetcher, f"the source of {model}", source, source.model_file, source.files
        )
        try:
            # A build writes about the source's size twice (the EP's output, then the
            # stamped artifact): no room for that fails the step before a compile, and is
            # not recorded as a build that cannot work (DiskFull).
            scratch = self.cache.scratch()
            self.cache.make_room(2 * source.total_size, scratch, f"building {model} here")
            failures = []
            for ep, local in targets:
                try:
                    done = self.build_locally(model, entry, got.main, ep, local)
                except DeadlineExceeded:
                    raise  # not a build that cannot work: the next sync tries it again
                except EpfleetError as exc:
                    failures.append(f"{ep}: {exc}")
                    continue
                got.drop()
                return done
        finally:
            got.close()
        # The verified source stays in partial/: the fallback step runs it without a
        # second download (and tidy() removes it if nothing does).
        raise EpfleetError("; ".join(failures))

    def build_locally(
        self, model: str, entry: ModelEntry, source: Path, ep: str, local: LocalTarget
    ) -> Done:
        from epfleet.errors import TimeLimitExceeded
        from epfleet.runtime.compiler import CompileJob, discard

        request = local_request(model, entry, ep, local)
        logger.info("%s: recompiling locally for %s (%s)", model, ep, local.device)
        workdir = str(self.cache.scratch())
        job = CompileJob(request=request, source_path=str(source), workdir=workdir)
        limit, deadline = time_limit(settings().local_compile_timeout, f"the local build for {ep}")
        try:
            output = self.worker.run(job, timeout=limit)
        except TimeLimitExceeded:
            if deadline is not None:
                raise deadline.exceeded(f"the local build for {ep} was stopped") from None
            raise CompileError(
                f"the local build for {ep} ran past its time limit of {limit:g} s "
                "(EPFLEET_LOCAL_COMPILE_TIMEOUT); its worker was killed"
            ) from None
        try:
            judged = self.local.judge(ep, output.compatibility_string)
            if judged.verdict != Verdict.OPTIMAL:
                raise EpfleetError(
                    f"the local build judges {judged.verdict.value} here ({judged.reason})"
                )
            installed = local_variant(
                ep,
                local,
                output.compatibility_string,
                output.sha256,
                output.size,
                entry.source.digest,
                now=self.fetcher.clock.now(),
                model_file=output.model_file,
                files=[InstalledFile(path=p, sha256=h, size=n) for p, h, n in output.files],
                precision=eps.load(ep).precisions(local.provider_options)[0],
            )
            artifact = Path(output.artifact_path)
            health = self.health(artifact, installed, entry)
            installed = installed.model_copy(update={"profile": health.profile})
            if is_file_set(installed.model_file, output.files):
                installed = self.cache.place(model, installed, artifact.parent)
            else:
                installed = self.cache.install(model, installed, artifact)
        finally:
            discard(output)
        return Done(
            installed=installed,
            action="recompiled",
            verdict=judged.verdict,
            reason=f"nothing published is optimal here; built locally for {ep} in "
            f"{output.seconds:.2f} s ({judged.reason})",
        )

    def fallback(self, model: str, entry: ModelEntry, active: Installed | None) -> Done:
        source = entry.source
        reason = "nothing published or built here runs on this device's EPs; running the "
        reason += "source model on the CPU EP"
        installed = fallback_variant(source, self.fetcher.clock.now())
        if active is not None and active.origin == "fallback" and active.name == installed.name:
            return Done(installed=active, action="fallback", verdict=None, reason=reason)
        self.fetcher.require_store()
        got = fetch_set(self.fetcher, installed.name, source, source.model_file, source.files)
        try:
            health = self.health(got.main, installed, entry)
            installed = got.install(model, installed.model_copy(update={"profile": health.profile}))
        except HealthCheckError:
            got.drop()
            raise
        finally:
            got.close()
        return Done(installed=installed, action="fallback", verdict=None, reason=reason)

    # -- the shadow run --

    def shadow(
        self,
        model: str,
        candidate: Installed,
        active: Installed,
        entry: ModelEntry,
        ask: ShadowAsk,
    ) -> ShadowOutcome | None:
        """Run ``candidate`` beside ``active`` (both in the cache) on the app's inputs, else
        the golden samples' (``epfleet.device.shadow``), in the worker process within
        ``EPFLEET_HEALTH_TIMEOUT``; None when there are no inputs to run. HealthCheckError
        when either cannot run them, or past the time limit."""
        from epfleet.device.health import ShadowJob, run_shadow
        from epfleet.errors import TimeLimitExceeded
        from epfleet.runtime.samples import write_samples

        try:
            given = ask.inputs(model, ask.samples) if ask.inputs is not None else None
        except Exception as exc:  # the app's code: its failure is this model's, named
            raise HealthCheckError(
                f"the app's shadow inputs hook failed for {model}: {type(exc).__name__}: {exc}"
            ) from None
        written: Path | None = None
        kind: Literal["app", "golden"]
        if isinstance(given, Path):
            inputs_path, kind = given, "app"
        elif given:
            written = self.cache.scratch() / f"shadow-{model}.npz"
            try:
                write_samples(written, [dict(sample) for sample in given][: ask.samples])
            except (ValueError, TypeError) as exc:
                written.unlink(missing_ok=True)
                raise HealthCheckError(f"the app's shadow inputs for {model}: {exc}") from None
            inputs_path, kind = written, "app"
        else:
            golden = self.fetcher.golden(entry)
            if golden is None:
                return None
            inputs_path, kind = golden, "golden"
        job = ShadowJob(
            candidate=self.health_job(self.cache.model_file(model, candidate), candidate, entry),
            active=self.health_job(self.cache.model_file(model, active), active, entry),
            inputs_path=str(inputs_path),
            inputs=kind,
            samples=ask.samples,
        )
        doing = f"the shadow run of {candidate.name} beside {active.name}"
        limit, deadline = time_limit(settings().health_timeout, doing)
        try:
            return self.worker.call(run_shadow, job, doing, timeout=limit)
        except TimeLimitExceeded:
            if deadline is not None:
                raise deadline.exceeded(f"{doing} was stopped") from None
            raise HealthCheckError(
                f"{doing} ran past its time limit of {limit:g} s (EPFLEET_HEALTH_TIMEOUT); "
                "its worker was killed; not activated"
            ) from None
        except EpfleetError as exc:
            if isinstance(exc, HealthCheckError):
                raise
            raise HealthCheckError(f"{doing}: {exc}") from None
        finally:
            if written is not None:
                written.unlink(missing_ok=True)

    def health_job(self, path: Path, installed: Installed, entry: ModelEntry) -> HealthJob:
        """The health check of ``installed`` at ``path``, with its bounds from ``entry``."""
        from epfleet.device.health import HealthJob

        golden = self.fetcher.golden(entry)
        return HealthJob(
            label=installed.name,
            path=str(path),
            ep=installed.ep,
            device=installed.device,
            provider_options=installed.provider_options,
            input_shapes=entry.source.input_shapes,
            golden_path=str(golden) if golden else None,
            tolerance=tolerance(installed, entry),
            metric=published_metric(installed, entry),
            folded_io=installed.folded_io,
        )

    # -- the health check --

    def health(self, path: Path, installed: Installed, entry: ModelEntry) -> Health:
        """Run the variant before activating it: on the model's golden samples, compared
        with the source's outputs within the variant's tolerance, or on zero inputs when
        the manifest has no samples for the model. A variant that fails is deleted."""
        from epfleet.errors import TimeLimitExceeded

        job = self.health_job(path, installed, entry)
        limit, deadline = time_limit(
            settings().health_timeout, f"the health check of {installed.name}"
        )
        try:
            return self.health_runner(job, f"health-checking {installed.name}", limit)
        except TimeLimitExceeded:
            if deadline is not None:  # the bytes may be fine: kept for the next sync
                raise deadline.exceeded(
                    f"the health check of {installed.name} was stopped"
                ) from None
            path.unlink(missing_ok=True)
            raise HealthCheckError(
                f"the health check of {installed.name} ran past its time limit of {limit:g} s "
                "(EPFLEET_HEALTH_TIMEOUT); its worker was killed; not activated"
            ) from None
        except EpfleetError as exc:
            path.unlink(missing_ok=True)  # verified bytes, but they do not run here
            if isinstance(exc, HealthCheckError):
                raise
            raise HealthCheckError(str(exc)) from None


def tolerance(installed: Installed, entry: ModelEntry) -> Tolerance:
    """What the compile host verified the variant with, else its precision's default
    (``effective_tolerance``)."""
    variant = entry.variants.get(installed.target or "")
    verified = variant.verification if variant and installed.origin == "published" else None
    relative = verified.tolerance if verified is not None else None
    precision = variant.precision if variant is not None else None
    return effective_tolerance(
        relative,
        # a record without a relative tolerance carries none: the default's pair
        verified.abs_tolerance if verified is not None and relative is not None else None,
        precision=precision,
        module=eps.load(installed.ep) if precision is None else None,
        provider_options=installed.provider_options,
    )


def published_metric(installed: Installed, entry: ModelEntry) -> TaskMetric | None:
    """The task metric the compile host verified a published variant with, if any."""
    variant = entry.variants.get(installed.target or "")
    verified = variant.verification if variant and installed.origin == "published" else None
    return verified.metric if verified else None


def embedded_string(path: Path, ep: str) -> str | None:
    """The compatibility string ``path``'s metadata carries for ``ep``, read by ORT; by
    the model's metadata where ORT has no reader for it (onnxruntime 1.24)."""
    try:
        from onnxruntime.capi._pybind_state import get_compatibility_info_from_model
    except ImportError:
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        props = {p.key: p.value for p in model.metadata_props}
        return props.get(COMPATIBILITY_KEY + ep)
    return get_compatibility_info_from_model(str(path), ep)


def check_string(path: Path, variant: VariantEntry) -> None:
    """The artifact carries the compatibility string the manifest gives for it (the
    verdict was reached on the manifest's); a file that does not is deleted."""
    try:
        embedded = embedded_string(path, variant.ep)
    except Exception as exc:
        path.unlink(missing_ok=True)
        raise IntegrityError(f"the artifact is not a model ORT reads: {exc}") from None
    if embedded != variant.compatibility_string:
        path.unlink(missing_ok=True)
        raise IntegrityError(
            f"the artifact's ep_compatibility_info.{variant.ep} is {embedded!r}, "
            f"the manifest says {variant.compatibility_string!r}; not activated"
        )
