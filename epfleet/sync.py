"""Device sync: fetch the manifest, judge the published variants here, then keep, download,
recompile or fall back, and activate atomically in the device cache.

Nothing is downloaded to decide: verdicts come from compatibility strings alone
(``epfleet.local_eps``) and the choice from ``epfleet.selection``. Anything that
runs an EP's native code on an artifact (a local compile, a health check) runs in
a worker process. A failure at any step keeps the previous active variant.

The steps are plain functions so that the CLI runs them without Prefect and the
``device-sync`` flow runs them as tasks.
"""

from __future__ import annotations

import gc
import json
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

import eps
from epfleet import RECIPE_VERSION, ort_version
from epfleet.compiler import CompileJob, discard
from epfleet.device_report import (
    REPORTS_PREFIX,
    Action,
    DeviceReport,
    ManifestStatus,
    ModelReport,
    VariantVerdict,
)
from epfleet.devicecache import CacheState, DeviceCache, Installed, ModelState
from epfleet.download import Transfer
from epfleet.errors import (
    BadInputError,
    EpfleetError,
    HealthCheckError,
    IntegrityError,
    StoreError,
    TransientStoreError,
)
from epfleet.hashing import sha256_bytes, sha256_file
from epfleet.health import Health, HealthJob, check_health
from epfleet.local_eps import LocalEps, discover, ep_versions
from epfleet.manifest import (
    NAME_PATTERN,
    VALIDATION_RULES,
    Manifest,
    ModelEntry,
    VariantEntry,
    utcnow,
)
from epfleet.plan import CompileRequest, fingerprinted
from epfleet.pool import CompilePool
from epfleet.selection import DEFAULT_PREFERENCE, ActiveVariant, Considered, Step, decide
from epfleet.stores import MANIFEST_KEY, UNCHANGED, Store, open_store
from eps.base import DeviceType, Judgement, LocalTarget, Verdict

DOWNLOAD_ATTEMPTS = 3

Log = Callable[[str], None]


def _quiet(message: str) -> None:
    pass


class SyncPolicy(BaseModel):
    models: list[str] | None = Field(default=None, description="Only these (default: all)")
    recompile: bool = Field(
        default=True, description="Recompile locally when nothing published is optimal here"
    )
    prefer: list[DeviceType] = Field(
        default=list(DEFAULT_PREFERENCE), description="Device types, most preferred first"
    )
    verify: bool = Field(
        default=False,
        description="Re-hash active files (default: trust size and mtime as activated)",
    )


# --- manifest --------------------------------------------------------------------------


def fetch_manifest(store_uri: str, cache_dir: Path) -> ManifestStatus:
    """Fetch the manifest with a conditional GET on the cached ETag, and keep the last valid
    one in the cache. An unreachable store or an invalid manifest leaves the cached one in
    force. A fetched manifest is validated whole; the cached copy is trusted afterwards only
    while its bytes and epfleet's validation rules are the ones it was validated with."""
    store = open_store(store_uri)
    cache = DeviceCache(cache_dir)
    with cache.locked():
        state = cache.load_state()
        trusted = _cached_manifest(cache, state, store.uri) is not None
        generation = state.manifest_generation if trusted else None
        try:
            if trusted and state.manifest_etag:
                got = store.read_if_changed(MANIFEST_KEY, state.manifest_etag)
            else:
                got = store.read(MANIFEST_KEY)
        except StoreError as exc:
            return ManifestStatus(
                status="offline", generation=generation, body_bytes=0, reason=str(exc)
            )
        if got == UNCHANGED:
            return ManifestStatus(status="unchanged", generation=generation, body_bytes=0)
        if got is None:
            raise BadInputError(
                f"no manifest at {store.uri}/{MANIFEST_KEY}: publish one with epfleet compile"
            )
        try:
            manifest = Manifest.from_json(got.data)
        except ValidationError as exc:
            error = exc.errors()[0]
            reason = (
                f"{store.uri}/{MANIFEST_KEY} fails validation at "
                f"{'.'.join(map(str, error['loc']))}: {error['msg']}"
            )
            if not trusted:
                raise StoreError(f"{reason}; no valid manifest is cached to fall back on") from None
            return ManifestStatus(
                status="rejected",
                generation=generation,
                body_bytes=len(got.data),
                reason=f"{reason}; the cached manifest (generation {generation}) stays in force",
            )
        cache.save_manifest(got.data)
        state.store, state.manifest_etag = store.uri, got.etag
        state.manifest_generation = manifest.generation
        state.manifest_sha256, state.manifest_rules = sha256_bytes(got.data), VALIDATION_RULES
        cache.save_state(state)
        return ManifestStatus(
            status="fetched", generation=manifest.generation, body_bytes=len(got.data)
        )


def _cached_manifest(cache: DeviceCache, state: CacheState, store_uri: str) -> bytes | None:
    """The manifest cached from this store, if it is valid under today's rules: trusted by
    its sha256 when it was validated under them, else validated whole again now (a cache
    from an older epfleet, or a crash between writing it and the state)."""
    data = cache.cached_manifest() if state.store == store_uri else None
    if data is None:
        return None
    digest = sha256_bytes(data)
    if state.manifest_rules == VALIDATION_RULES and state.manifest_sha256 == digest:
        return data
    try:
        manifest = Manifest.from_json(data)
    except ValidationError:
        return None
    state.manifest_sha256, state.manifest_rules = digest, VALIDATION_RULES
    state.manifest_generation = manifest.generation
    state.manifest_etag = None  # it may be the ETag of another copy: fetch whole next time
    cache.save_state(state)
    return data


def manifest_in_force(store_uri: str, cache_dir: Path, models: list[str] | None) -> Manifest:
    """The wanted models' part of the last valid manifest fetched from this store.

    Only the wanted entries are validated again (the whole manifest was when it was
    fetched): a device that wants 20 models of a 1,000-model manifest should not pay for
    the other 980 on every sync."""
    cache = DeviceCache(cache_dir)
    data = _cached_manifest(cache, cache.load_state(), open_store(store_uri).uri)
    if data is None:
        raise StoreError(
            f"no usable manifest: {store_uri} could not be read and no manifest from it is "
            f"cached in {cache_dir}; sync again once the store is reachable"
        )
    gc.disable()  # json.loads of a large manifest makes ~100k objects: no cyclic garbage
    try:
        document = json.loads(data)
    finally:
        gc.enable()
    entries = document.get("models", {})
    try:
        wanted = {
            name: ModelEntry.model_validate(entries[name])
            for name in wanted_models(list(entries), models)
        }
    except ValidationError as exc:
        raise StoreError(f"the cached manifest in {cache_dir} is damaged: {exc}") from None
    return Manifest.model_construct(generation=document.get("generation", 0), models=wanted)


def wanted_models(available: list[str], models: list[str] | None) -> list[str]:
    if not models:
        return available
    unknown = [m for m in models if m not in available]
    if unknown:
        raise BadInputError(
            f"model {', '.join(map(repr, unknown))} is not in the manifest; "
            f"it has: {', '.join(available) or 'no models'}"
        )
    return list(dict.fromkeys(models))


# --- one model -------------------------------------------------------------------------


def variant_name(prefix: str, sha256: str) -> str:
    return f"{prefix}-{sha256[:12]}"


def local_target_name(ep: str) -> str:
    return "local-" + ep.lower().removesuffix("executionprovider")


class _Done(BaseModel):
    installed: Installed
    action: Action
    verdict: Verdict | None
    reason: str


class ModelSync:
    """Everything one model's sync needs: the store, the cache, the local EPs, a worker."""

    def __init__(
        self,
        store: Store,
        cache: DeviceCache,
        local: LocalEps,
        policy: SyncPolicy,
        offline: bool,
        log: Log = _quiet,
    ) -> None:
        self.store = store
        self.cache = cache
        self.local = local
        self.policy = policy
        self.offline = offline
        self.log = log
        self._worker: CompilePool | None = None
        self.moved = 0
        """Bytes downloaded so far by this sync, failed attempts included."""

    @property
    def worker(self) -> CompilePool:
        if self._worker is None:
            self._worker = CompilePool(1)
        return self._worker

    def close(self) -> None:
        if self._worker is not None:
            self._worker.shutdown()

    # -- judging --

    def considered(self, entry: ModelEntry) -> list[Considered]:
        judged = []
        for target, variant in entry.variants.items():
            if variant.status != "ok" or variant.artifact is None:
                continue
            string = variant.compatibility_string or ""
            judgement = self.local.judge(variant.ep, string)
            judged.append(
                Considered(
                    target=target,
                    ep=variant.ep,
                    device=variant.device,
                    sha256=variant.artifact.sha256,
                    compatibility_string=string,
                    verdict=judgement.verdict,
                    reason=judgement.reason,
                )
            )
        return judged

    def judge_installed(self, installed: Installed) -> Judgement:
        if installed.compatibility_string is None:
            return Judgement(Verdict.UNKNOWN, "the source model, not compiled for any EP")
        return self.local.judge(installed.ep, installed.compatibility_string)

    # -- the whole model --

    def sync(self, model: str, entry: ModelEntry, state: CacheState) -> ModelReport:
        started, moved_before = time.perf_counter(), self.moved
        mstate = state.models.setdefault(model, ModelState())
        considered = self.considered(entry)
        notes: list[str] = []
        verify = self.policy.verify
        if mstate.active is not None and not self.cache.intact(model, mstate.active, rehash=verify):
            previous = mstate.previous
            usable = previous is not None and self.cache.intact(model, previous, rehash=True)
            notes.append(
                f"active variant {mstate.active.name} changed on disk"
                + (f"; rolled back to {previous.name}" if usable and previous else "")
            )
            mstate.active, mstate.previous = (previous if usable else None), None
        active = mstate.active
        active_view = (
            ActiveVariant(
                origin=active.origin,
                target=active.target,
                sha256=active.sha256,
                source_sha256=active.source_sha256,
                verdict=self.judge_installed(active).verdict,
            )
            if active is not None
            else None
        )
        build_key = self._build_key(entry)
        steps = decide(
            considered,
            active_view,
            entry.source.sha256,
            recompile=self.policy.recompile,
            recompile_failed_before=build_key in mstate.recompile_failed,
            preference=self.policy.prefer,
        )
        failures: list[str] = []
        done: _Done | None = None
        for step in steps:
            try:
                done = self._run(step, model, entry, mstate, active, considered)
                break
            except EpfleetError as exc:
                failures.append(f"{_describe(step)}: {exc}")
                self.log(f"{model}: {_describe(step)} failed: {exc}")
                if step.kind == "recompile" and not isinstance(exc, StoreError):
                    mstate.recompile_failed[build_key] = str(exc)  # a build that cannot work
        verdicts = [
            VariantVerdict(
                target=c.target, ep=c.ep, device=c.device, verdict=c.verdict, reason=c.reason
            )
            for c in considered
        ]
        seconds = round(time.perf_counter() - started, 3)
        if done is None:
            kept = mstate.active
            reason = "; ".join(notes + failures) or "nothing published can run here"
            if kept is not None and self.cache.intact(model, kept):
                reason += f" (still running {kept.name})"
            return _failed(model, kept, reason, verdicts, self.moved - moved_before, seconds)
        if done.installed is not mstate.active:
            self._activate(model, mstate, done.installed, state)
        return ModelReport(
            model=model,
            action=done.action,
            variant=done.installed.name,
            target=done.installed.target,
            ep=done.installed.ep,
            verdict=done.verdict,
            bytes_downloaded=self.moved - moved_before,
            reason="; ".join([*notes, *failures, done.reason]),
            considered=verdicts,
            seconds=seconds,
        )

    def unexpected(self, model: str, state: CacheState, exc: Exception) -> ModelReport:
        kept = state.models.get(model, ModelState()).active
        return _failed(model, kept, f"unexpected {type(exc).__name__}: {exc}", [], 0, 0.0)

    def _build_key(self, entry: ModelEntry) -> str:
        """Identifies a local build: a new source, ORT or EP package retries a failed one."""
        return sha256_bytes(
            json.dumps([RECIPE_VERSION, entry.source.sha256, ort_version(), ep_versions()]).encode()
        )[:16]

    def _run(
        self,
        step: Step,
        model: str,
        entry: ModelEntry,
        mstate: ModelState,
        active: Installed | None,
        considered: list[Considered],
    ) -> _Done:
        if step.kind == "keep":
            assert active is not None
            verdict = self.judge_installed(active)
            return _Done(
                installed=active,
                action="kept",
                verdict=verdict.verdict,
                reason=f"{active.name} is still the best choice here ({verdict.reason})",
            )
        if step.kind == "download":
            assert step.target is not None
            chosen = next(c for c in considered if c.target == step.target)
            return self._download(model, entry, step.target, chosen, mstate)
        if step.kind == "recompile":
            return self._recompile(model, entry)
        return self._fallback(model, entry, active)

    # -- steps --

    def _download(
        self,
        model: str,
        entry: ModelEntry,
        target: str,
        chosen: Considered,
        mstate: ModelState,
    ) -> _Done:
        variant = entry.variants[target]
        artifact = variant.artifact
        assert artifact is not None and variant.compatibility_string is not None
        installed = Installed(
            name=variant_name(target, artifact.sha256),
            origin="published",
            target=target,
            ep=variant.ep,
            device=variant.device,
            compatibility_string=variant.compatibility_string,
            provider_options=variant.provider_options,
            sha256=artifact.sha256,
            size=artifact.size,
            source_sha256=variant.source_sha256,
            activated_at=utcnow(),
            mtime_ns=0,
        )
        previous = mstate.previous
        if (
            previous is not None
            and previous.name == installed.name
            and self.cache.intact(model, previous)
        ):
            return _Done(
                installed=previous,
                action="downloaded",
                verdict=chosen.verdict,
                reason=f"rolled back to {previous.name}, kept in the cache: {chosen.reason}",
            )
        self._require_store()
        part = self.cache.partial(artifact.sha256)
        moved = self.download(artifact.uri, artifact.sha256, artifact.size, part)
        self._check_string(part, variant)
        health = self._health(part, installed, entry)
        installed = self.cache.install(model, installed, part)
        self.log(
            f"{model}: downloaded {installed.name} ({moved} bytes), health check passed"
            + (f" on {health.samples} golden samples" if health.samples else "")
        )
        return _Done(
            installed=installed,
            action="downloaded",
            verdict=chosen.verdict,
            reason=chosen.reason,
        )

    def download(self, key: str, sha256: str, size: int, part: Path) -> int:
        """Download ``key`` into ``part`` (resumable, parallel ranged GETs) and verify size
        and sha256 (see ``epfleet.download``). Returns the bytes moved."""
        transfer = Transfer(self.store, key, sha256, size, part, self.log)
        try:
            return transfer.run()
        finally:
            self.moved += transfer.moved

    def _check_string(self, path: Path, variant: VariantEntry) -> None:
        from onnxruntime.capi._pybind_state import get_compatibility_info_from_model

        try:
            embedded = get_compatibility_info_from_model(str(path), variant.ep)
        except Exception as exc:
            path.unlink(missing_ok=True)
            raise IntegrityError(f"the artifact is not a model ORT reads: {exc}") from None
        if embedded != variant.compatibility_string:
            path.unlink(missing_ok=True)
            raise IntegrityError(
                f"the artifact's ep_compatibility_info.{variant.ep} is {embedded!r}, "
                f"the manifest says {variant.compatibility_string!r}; not activated"
            )

    def _health(self, path: Path, installed: Installed, entry: ModelEntry) -> Health:
        """Run the variant before activating it: on the model's golden samples, compared
        with the source's outputs within the variant's tolerance, or on zero inputs when
        the manifest has no samples for the model."""
        golden = self._golden(entry)
        job = HealthJob(
            label=installed.name,
            path=str(path),
            ep=installed.ep,
            device=installed.device,
            provider_options=installed.provider_options,
            input_shapes=entry.source.input_shapes,
            golden_path=str(golden) if golden else None,
            tolerance=self._tolerance(installed, entry),
        )
        try:
            return self.worker.call(check_health, job, f"health-checking {installed.name}")
        except EpfleetError as exc:
            path.unlink(missing_ok=True)  # verified bytes, but they do not run here
            if isinstance(exc, HealthCheckError):
                raise
            raise HealthCheckError(str(exc)) from None

    def _golden(self, entry: ModelEntry) -> Path | None:
        """The model's golden samples in the cache, downloaded and verified once."""
        samples = entry.samples
        if samples is None:
            return None
        path = self.cache.samples_file(samples.sha256)
        if path.exists() and sha256_file(path) == (samples.sha256, samples.size):
            return path
        self._require_store()
        part = self.cache.partial(samples.sha256)
        self.download(samples.uri, samples.sha256, samples.size, part)
        os.replace(part, path)
        return path

    @staticmethod
    def _tolerance(installed: Installed, entry: ModelEntry) -> float:
        """What the compile host verified the variant with, else its EP's default."""
        variant = entry.variants.get(installed.target or "")
        verified = variant.verification if variant and installed.origin == "published" else None
        if verified is not None and verified.tolerance is not None:
            return verified.tolerance
        return eps.load(installed.ep).default_tolerance(installed.provider_options)

    def _require_store(self) -> None:
        """Each step checks this where it first needs the store, after what the cache alone
        can do (a rollback, an already active fallback)."""
        if self.offline:
            raise TransientStoreError("the store is unreachable (offline)")

    def _recompile(self, model: str, entry: ModelEntry) -> _Done:
        self._require_store()
        targets = self._local_targets()
        if not targets:
            raise EpfleetError("no EP here builds for this device's hardware")
        source = entry.source
        part = self.cache.partial(source.sha256)
        self.download(source.uri, source.sha256, source.size, part)
        failures = []
        for ep, local in targets:
            try:
                done = self._build_locally(model, entry, part, ep, local)
            except EpfleetError as exc:
                failures.append(f"{ep}: {exc}")
                continue
            part.unlink(missing_ok=True)
            return done
        # The verified source stays in partial/: the fallback step runs it without a
        # second download (and tidy() removes it if nothing does).
        raise EpfleetError("; ".join(failures))

    def _local_targets(self) -> list[tuple[str, LocalTarget]]:
        order = {device: i for i, device in enumerate(self.policy.prefer)}
        found = []
        for ep, devices in self.local.devices.items():
            local = eps.load(ep).local_target(devices)
            if local is not None and local.device in order:
                found.append((ep, local))
        return sorted(found, key=lambda pair: order[pair[1].device])

    def _build_locally(
        self, model: str, entry: ModelEntry, source: Path, ep: str, local: LocalTarget
    ) -> _Done:
        target = local_target_name(ep)
        module = eps.load(ep)
        request = fingerprinted(
            CompileRequest(
                model=model,
                target=target,
                ep=ep,
                device=local.device,
                provider_options=local.provider_options,
                input_shapes=entry.source.input_shapes,
                source_key=entry.source.uri,
                source_sha256=entry.source.sha256,
                source_size=entry.source.size,
                graph_optimization=module.default_graph_optimization,
                tolerance=module.default_tolerance(local.provider_options),
                samples=entry.samples,
                fingerprint="",
            ),
            ort_version(),
            module.build_identity(),
        )
        self.log(f"{model}: recompiling locally for {ep} ({local.device})")
        workdir = str(self.cache.scratch())
        job = CompileJob(request=request, source_path=str(source), workdir=workdir)
        output = self.worker.run(job)
        try:
            judged = self.local.judge(ep, output.compatibility_string)
            if judged.verdict != Verdict.OPTIMAL:
                raise EpfleetError(
                    f"the local build judges {judged.verdict.value} here ({judged.reason})"
                )
            installed = Installed(
                name=variant_name(target, output.sha256),
                origin="local",
                target=None,
                ep=ep,
                device=local.device,
                compatibility_string=output.compatibility_string,
                provider_options=local.provider_options,
                sha256=output.sha256,
                size=output.size,
                source_sha256=entry.source.sha256,
                activated_at=utcnow(),
                mtime_ns=0,
            )
            artifact = Path(output.artifact_path)
            self._health(artifact, installed, entry)
            installed = self.cache.install(model, installed, artifact)
        finally:
            discard(output)
        return _Done(
            installed=installed,
            action="recompiled",
            verdict=judged.verdict,
            reason=f"nothing published is optimal here; built locally for {ep} in "
            f"{output.seconds:.2f} s ({judged.reason})",
        )

    def _fallback(self, model: str, entry: ModelEntry, active: Installed | None) -> _Done:
        source = entry.source
        reason = "nothing published or built here runs on this device's EPs; running the "
        reason += "source model on the CPU EP"
        if active is not None and active.origin == "fallback" and active.sha256 == source.sha256:
            return _Done(installed=active, action="fallback", verdict=None, reason=reason)
        self._require_store()
        installed = Installed(
            name=variant_name("fallback", source.sha256),
            origin="fallback",
            target=None,
            ep="CPUExecutionProvider",
            device="cpu",
            compatibility_string=None,
            sha256=source.sha256,
            size=source.size,
            source_sha256=source.sha256,
            activated_at=utcnow(),
            mtime_ns=0,
        )
        part = self.cache.partial(source.sha256)
        self.download(source.uri, source.sha256, source.size, part)
        self._health(part, installed, entry)
        installed = self.cache.install(model, installed, part)
        return _Done(
            installed=installed,
            action="fallback",
            verdict=None,
            reason=reason,
        )

    # -- activation --

    def _activate(
        self, model: str, mstate: ModelState, installed: Installed, state: CacheState
    ) -> None:
        """Make ``installed`` active, keep the old active for rollback, write the state and
        then the package manifest, and only then remove what neither references."""
        old = mstate.active
        if old is not None and old.name != installed.name:
            mstate.previous = old
        elif mstate.previous is not None and mstate.previous.name == installed.name:
            mstate.previous = None
        mstate.active = installed
        self.cache.save_state(state)
        outvoted = self.cache.write_package(state)
        if model in outvoted:
            self.log(f"{model}: ORT would select the rollback variant; listing the active alone")
        self.cache.prune(model, mstate)


def _failed(
    model: str,
    kept: Installed | None,
    reason: str,
    considered: list[VariantVerdict],
    moved: int,
    seconds: float,
) -> ModelReport:
    """A model nothing could be done for; ``kept`` (if any) is still what runs."""
    return ModelReport(
        model=model,
        action="failed",
        variant=kept.name if kept else None,
        target=kept.target if kept else None,
        ep=kept.ep if kept else None,
        verdict=None,
        bytes_downloaded=moved,
        reason=reason,
        considered=considered,
        seconds=seconds,
    )


def _describe(step: Step) -> str:
    return f"{step.kind} {step.target}" if step.target else step.kind


# --- the whole sync ----------------------------------------------------------------------


def sync_models(
    store_uri: str,
    cache_dir: Path,
    policy: SyncPolicy,
    offline: bool,
    local: LocalEps | None = None,
    log: Log = _quiet,
) -> list[ModelReport]:
    """Sync every wanted model against the manifest in force in the cache."""
    cache = DeviceCache(cache_dir)
    with cache.locked():
        manifest = manifest_in_force(store_uri, cache_dir, policy.models)
        wanted = list(manifest.models)
        state = cache.load_state()
        runner = ModelSync(open_store(store_uri), cache, local or discover(), policy, offline, log)
        reports = []
        try:
            for model in wanted:
                try:
                    report = runner.sync(model, manifest.models[model], state)
                except Exception as exc:  # one model's surprise must not starve the others
                    report = runner.unexpected(model, state, exc)
                log(f"{model}: {report.action} {report.variant or ''} ({report.reason})")
                reports.append(report)
        finally:
            runner.close()
            cache.write_package(state)
            cache.save_state(state)
            cache.tidy()
        return reports


def device_id(given: str | None) -> str:
    """The device's id in reports: ``given``, else $EPFLEET_DEVICE_ID, else the host name."""
    chosen = given or os.environ.get("EPFLEET_DEVICE_ID")
    if chosen:
        if not re.fullmatch(NAME_PATTERN, chosen):
            raise BadInputError(
                f"device id {chosen!r} must match {NAME_PATTERN} (lowercase letters, digits, "
                "'.', '_' and '-')"
            )
        return chosen
    host = re.sub(r"[^a-z0-9._-]+", "-", socket.gethostname().lower()).strip("-._")
    return host or "device"


def upload_report(store_uri: str, report: DeviceReport) -> DeviceReport:
    """Put the report at reports/devices/<id>.json when the store accepts writes."""
    if report.manifest.offline:
        return report.model_copy(
            update={"report_uploaded": False, "report_error": "offline: not uploaded"}
        )
    data = report.model_dump_json(indent=2, exclude={"report_uploaded", "report_error"})
    try:
        open_store(store_uri).write(f"{REPORTS_PREFIX}/{report.device_id}.json", data.encode())
    except StoreError as exc:
        return report.model_copy(update={"report_uploaded": False, "report_error": str(exc)})
    return report.model_copy(update={"report_uploaded": True})


def build_report(
    device: str,
    store_uri: str,
    cache_dir: Path,
    local: LocalEps,
    manifest: ManifestStatus,
    models: list[ModelReport],
    seconds: float,
) -> DeviceReport:
    return DeviceReport(
        device_id=device,
        generated_at=utcnow().isoformat(),
        ort_version=ort_version(),
        ep_packages=ep_versions(),
        devices=local.describe(),
        store=store_uri,
        cache=str(cache_dir.resolve()),
        manifest=manifest,
        models=models,
        seconds=round(seconds, 3),
    )


def sync(
    store_uri: str,
    cache_dir: Path,
    policy: SyncPolicy,
    device: str | None = None,
    log: Log = _quiet,
) -> DeviceReport:
    """One whole device sync, without Prefect (the ``device-sync`` flow runs these same
    steps as tasks)."""
    started = time.perf_counter()
    identity = device_id(device)
    status = fetch_manifest(store_uri, cache_dir)
    log(
        f"manifest: {status.status} (generation {status.generation}, {status.body_bytes} bytes)"
        + (f": {status.reason}" if status.reason else "")
    )
    local = discover()
    models = sync_models(store_uri, cache_dir, policy, status.offline, local, log)
    report = build_report(
        identity, store_uri, cache_dir, local, status, models, time.perf_counter() - started
    )
    report = upload_report(store_uri, report)
    DeviceCache(cache_dir).save_last_report(report.model_dump_json(indent=2).encode())
    return report
