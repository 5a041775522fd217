"""One device sync as a session: lock, state, manifest, EPs and worker shared by its models.

The session holds the cache's lock, its state, the manifest in force, the local EPs
and one worker process for every model the sync wants, then writes the device report.

    with SyncSession(store_uri, cache_dir, policy) as session:
        session.fetch_manifest()
        session.drop_unlisted()
        for model in session.wanted():
            session.sync_model(model)
        report = session.finish()

``sync`` is that loop (the CLI's ``epfleet sync``); the ``device-sync`` flow runs the
same session with a Prefect task per step (``tasks/sync.py``). Progress goes to the
``epfleet.device`` loggers (``epfleet.logs.log_to_stderr`` for a terminal). A session
serves one thread at a time.

The manifest in force comes from the store's signed (TUF) metadata when the device has a
trusted root (``--trust-root``, or the root chain kept in the cache since it was first
given; for a local store that ``epfleet compile`` made development keys for, in a cache
that never trusted anything, the root it wrote beside them, with a warning): see
``epfleet.device.provisioning`` and ``epfleet.device.signed_manifest``. A device with no
trusted root refuses to sync unless it is configured ``--allow-unsigned``
(``EPFLEET_ALLOW_UNSIGNED``), which syncs from the unsigned manifest.json with a warning
in the report; a device that trusted the store before never does.

A write that fails in the cache (a full disk, a read-only mount) fails what needed it
with one line in the report: the report is still printed, and what is active stays so.
"""

from __future__ import annotations

import functools
import logging
import shutil
import time
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar

from epfleet import ort_version
from epfleet.clock import SYSTEM_CLOCK, Clock
from epfleet.device import model_sync
from epfleet.device.cache import CacheState, DeviceCache
from epfleet.device.fetching import Fetcher
from epfleet.device.local_eps import LocalEps, discover, ep_versions
from epfleet.device.manifest_cache import cached_manifest, fetch_manifest, manifest_in_force
from epfleet.device.policy import SyncPolicy
from epfleet.device.prefetch import DEPTH, Prefetch
from epfleet.device.provisioning import trusted_root
from epfleet.device.reporting import device_id, rollout_seen, upload_report
from epfleet.device.shadow import ShadowInputs, asked, reported
from epfleet.device.signed_manifest import fetch_signed_manifest, untrusted
from epfleet.device.steps import Steps
from epfleet.device.unlisted import drop_models, unlisted
from epfleet.device.views import manifest_facts
from epfleet.disk import cannot_write
from epfleet.errors import BadInputError, CacheNotWritable, DiskFull, EpfleetError
from epfleet.formats.device_report import DeviceReport, ManifestStatus, ModelReport
from epfleet.formats.field_ranking import ModelRanking, hardware_profile, runtime_label
from epfleet.formats.manifest import Manifest, utcnow
from epfleet.limits import Deadline, within
from epfleet.settings import settings
from epfleet.stores import open_store, reports_store
from epfleet.stores.probe import store_absence
from epfleet.text import format_bytes

if TYPE_CHECKING:
    from epfleet.device.health import HealthRunner

logger = logging.getLogger(__name__)

UNSIGNED = (
    "the manifest is not signed: this device has no trusted root and syncs from "
    "manifest.json as --allow-unsigned (EPFLEET_ALLOW_UNSIGNED) lets it, so anyone who can "
    "write to the store decides what it runs; provision it with --trust-root"
)


class SyncSession:
    """One sync of the cache at ``cache_dir`` against the store at ``store_uri``.

    Entering it takes the cache's lock (``CacheBusy`` if another sync holds it) and loads
    the cache's state; the manifest in force is parsed once, the local EPs discovered
    once and one worker process started, on first need. Leaving it stops the worker,
    writes the state and the package manifest, tidies the cache and releases the lock,
    whether or not ``finish`` ran.

    The sync has a deadline, ``EPFLEET_SYNC_DEADLINE`` seconds from entering: the manifest
    fetch (the signed metadata's refresh) and each model's sync run within it
    (``epfleet.limits.within``), so that a store request, download or worker call in
    flight stops when it passes (``epfleet.stores.s3.bounds``), and a model not reached
    by then is reported failed with its previous variant kept. The report's upload runs
    within it too, with at least a stall timeout left (``_report_deadline``).

    Trust: ``trust_root`` (default ``EPFLEET_TRUST_ROOT``) is the root metadata file the
    device is provisioned with, ``allow_unsigned`` (default ``EPFLEET_ALLOW_UNSIGNED``)
    lets a device with no trusted root sync from the unsigned manifest.json. Entering
    the session fails with BadInputError naming ``--trust-root`` when there is neither.
    Its report goes to ``report_to`` (default ``EPFLEET_REPORT_TO``, else the store).

    ``health`` runs the health checks of the variants the sync installs (default
    ``default_health``: None, the session's worker process, killed past the check's time
    limit; ``epfleet.device.health.in_thread`` runs them in this thread).

    ``shadow_inputs`` is the app's hook for shadow runs: a rollout whose policy asks for
    ``shadow`` has a device in its stage run the candidate beside its active variant on
    the inputs it returns (else the golden samples' inputs) before switching
    (``epfleet.device.shadow``)."""

    default_health: ClassVar[HealthRunner | None] = None
    """The ``health`` of a session not given one. The worker process in production; the
    test suite sets ``in_thread`` (tests/conftest.py), but for the tests about crashes and
    time limits."""

    def __init__(
        self,
        store_uri: str,
        cache_dir: Path,
        policy: SyncPolicy,
        device: str | None = None,
        *,
        local: LocalEps | None = None,
        trust_root: Path | None = None,
        allow_unsigned: bool | None = None,
        report_to: str | None = None,
        health: HealthRunner | None = None,
        clock: Clock = SYSTEM_CLOCK,
        shadow_inputs: ShadowInputs | None = None,
    ) -> None:
        self.device = device_id(device)  # a bad id fails before anything is touched
        self.clock = clock
        """Times the sync's deadline and its downloads' stalls and rates."""
        configured = settings()
        self.trust_root = trust_root if trust_root is not None else configured.trust_root
        self.allow_unsigned = (
            configured.allow_unsigned if allow_unsigned is None else allow_unsigned
        )
        self.root: bytes | None = None
        """The root metadata the sync trusts (None: unsigned, as allowed, or a problem)."""
        self.root_problem: str | None = None
        """Why a device that trusts signed metadata only has no root now (a damaged root,
        a lost trust cache): the signed manifest last verified stays in force."""
        self.trust_warning: str | None = None
        """Why the sync trusts less than a provisioned root (a development root)."""
        self.started = time.perf_counter()
        self.store_uri, self.cache_dir, self.policy = store_uri, cache_dir, policy
        self.store = open_store(store_uri)
        self.report_store = reports_store(self.store, report_to or configured.report_to)
        self.cache = DeviceCache(cache_dir)
        self.fetcher = Fetcher(self.store, self.cache, offline=False, clock=clock)
        self.status: ManifestStatus | None = None
        """The manifest fetch's outcome; before ``fetch_manifest``, the store counts as
        reachable and the cached manifest is in force."""
        self.reports: list[ModelReport] = []
        self._given_local = local
        self.health = health or self.default_health
        self.shadow_inputs = shadow_inputs
        """The app's inputs for shadow runs (``epfleet.device.shadow``); None: the golden
        samples' inputs."""
        self._state: CacheState | None = None
        self._stack = ExitStack()
        self._closed = False
        self.deadline = Deadline.after(settings().sync_deadline, clock)
        """Counted again from entering the session (the lock taken)."""

    # -- the session's lifetime --

    def __enter__(self) -> SyncSession:
        if not self.cache_dir.exists():  # a first sync: refused input leaves no cache behind
            absent = store_absence(self.store)  # a store that is not there
            if isinstance(absent, BadInputError):
                raise absent
            # No root, or one that cannot be read or is no root: refused by the checks made
            # again below, here on the empty cache, which they only read.
            trusted_root(self.cache, CacheState(), self.store, self.trust_root, self.allow_unsigned)
        with ExitStack() as stack:
            stack.enter_context(self.cache.locked())
            self.deadline = Deadline.after(self.deadline.seconds, self.clock)
            try:
                self.cache.check_layout()  # links and odd entries in epfleet's paths
                self._state = self.cache.load_state()  # rebuilt from the cache if damaged
                trust = trusted_root(
                    self.cache, self._state, self.store, self.trust_root, self.allow_unsigned
                )
            except OSError as exc:  # a cache that cannot be written at all: one line
                raise cannot_write(Path(exc.filename or self.cache.root), exc) from None
            self.root, self.root_problem = trust.root, trust.problem
            self.trust_warning = trust.warning
            stack.callback(self._close)
            self._stack = stack.pop_all()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stack.close()

    def _close(self) -> None:
        """Stop the worker, write what the models' syncs changed, tidy (once). A write that
        fails (a full disk) is a warning in the report, not the end of the sync: the state
        on disk and the package stay as the last successful write left them, consistent,
        and the next sync writes them again."""
        if self._closed:
            return
        self._closed = True
        self.prefetch.close()  # before tidy: its partial files are in use until it ends
        if "steps" in self.__dict__:
            self.steps.close()
        state = self.state
        for doing, write in (
            ("write the package manifest", lambda: self.cache.write_package(state)),
            ("save the cache state", lambda: self.cache.save_state(state)),
            ("tidy the cache", self.cache.tidy),
        ):
            try:
                write()
            except (OSError, EpfleetError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                self.cache.note(f"could not {doing} in {self.cache.root}: {reason}")

    @property
    def signed(self) -> bool:
        """The sync trusts only signed metadata."""
        return self.root is not None or self.root_problem is not None

    @property
    def state(self) -> CacheState:
        if self._state is None:
            raise RuntimeError("a SyncSession is used inside its `with` block")
        return self._state

    @functools.cached_property
    def local(self) -> LocalEps:
        """This device's EPs, discovered once per session."""
        return self._given_local or discover()

    @functools.cached_property
    def steps(self) -> Steps:
        return Steps(self.fetcher, self.cache, self.local, self.policy.prefer, self.health)

    @functools.cached_property
    def manifest(self) -> Manifest:
        """The wanted models' part of the manifest in force, parsed once per session. A
        new manifest the cache could not keep (a full disk) leaves none in force in a new
        cache: no model is synced, and the report says why."""
        cached = cached_manifest(self.cache, self.state, self.store.uri, signed=self.signed)
        if cached is None and self.status is not None and self.status.status == "rejected":
            return Manifest.model_construct(generation=0, models={})
        return manifest_in_force(cached, self.policy.models, self.store_uri, self.cache_dir)

    # -- the sync --

    def fetch_manifest(self) -> ManifestStatus:
        """Refresh the signed metadata (with a trusted root), else fetch the manifest (a
        conditional GET). An unreachable store (offline: the steps then do not ask it for
        anything), metadata that does not verify or an invalid manifest leaves the one
        in force before in force."""
        with within(self.deadline):
            try:
                if self.root_problem is not None:
                    status = untrusted(self.store, self.cache, self.state, self.root_problem)
                elif self.root is not None:
                    rankings: dict[str, ModelRanking | str] = {}
                    status = fetch_signed_manifest(
                        self.store, self.cache, self.state, self.root, self.policy.models, rankings
                    )
                    if status.status in ("fetched", "unchanged"):
                        self._take_rankings(rankings)
                    if self.trust_warning:
                        status = status.model_copy(update={"warning": self.trust_warning})
                        logger.warning("%s", self.trust_warning)
                else:
                    status = fetch_manifest(self.store, self.cache, self.state)
                    status = status.model_copy(update={"signed": False, "warning": UNSIGNED})
                    logger.warning("%s", UNSIGNED)
            except (CacheNotWritable, DiskFull) as exc:  # the report must still be printed
                status = ManifestStatus(
                    status="rejected",
                    generation=self.state.manifest_generation,
                    body_bytes=0,
                    reason=f"the new manifest could not be kept (any kept before stays in "
                    f"force): {exc}",
                    signed=self.signed,
                )
        self.status = status
        self.fetcher.offline = status.offline
        self.__dict__.pop("manifest", None)  # a newly fetched one is in force
        facts = manifest_facts(status)
        logger.log(
            logging.WARNING if status.reason else logging.INFO,
            "manifest: %s%s%s",
            status.status,
            f" ({facts})" if facts else "",
            f": {status.reason}" if status.reason else "",
        )
        return status

    def _take_rankings(self, rankings: dict[str, ModelRanking | str]) -> None:
        """This device's part of the verified field rankings, for the steps to order
        variants by; a refused one is said (the report's warnings), and its model's variants
        ordered as with no evidence."""
        profile, _ = hardware_profile(self.local.describe())
        runtime = runtime_label(ort_version(), ep_versions())
        for model, ranking in rankings.items():
            if isinstance(ranking, str):
                self.cache.note(f"{ranking}: its variants are ordered as with no evidence")
                continue
            mine = ranking.for_device(profile, runtime)
            if mine is not None:
                self.steps.measured[model] = mine

    def wanted(self) -> list[str]:
        """The models this sync is for: the policy's, else every model in the manifest.
        BadInputError names a model the manifest does not have."""
        return list(self.manifest.models)

    def drop_unlisted(self) -> list[str]:
        """With ``drop_unlisted`` (the policy's, or EPFLEET_DROP_UNLISTED), remove the models
        the manifest in force no longer lists (``epfleet.device.unlisted``); the models
        dropped."""
        if not (self.policy.drop_unlisted or settings().drop_unlisted):
            return []
        subset = bool(self.policy.models)  # empty: every model
        gone = unlisted(self.state, set(self.manifest.models), self.status, subset)
        drop_models(self.cache, self.state, gone)
        return gone

    def sync_model(self, model: str) -> ModelReport:
        """Sync one wanted model; anything it raises beyond a step's failure is reported as
        the model's failure, not raised, so that it does not starve the others."""
        if self._closed:
            raise RuntimeError("this SyncSession has finished")
        entry = self.manifest.models.get(model)
        if entry is None:
            raise BadInputError(
                f"model {model!r} is not among this sync's models: {', '.join(self.wanted())}"
            )
        ahead = self.prefetch.wait(model)
        try:
            if self.deadline.passed():
                report = self._not_reached(model)
            else:
                with within(self.deadline):
                    self._fetch_ahead(model)
                    # a staged rollout decides, from the signed entry, what this device runs
                    mine = entry.for_device(self.device)
                    ask = asked(entry, mine, self.shadow_inputs)
                    report = model_sync.sync_model(
                        self.steps, model, mine, self.state, self.policy, ask
                    )
                if entry.rollout is not None:
                    shadow = reported(entry, self.state.models.get(model))
                    seen = rollout_seen(entry, mine, shadow)
                    report = report.model_copy(update={"rollout": seen})
        except Exception as exc:
            report = model_sync.unexpected(model, self.state, exc)
        if ahead:
            report = report.model_copy(update={"bytes_downloaded": report.bytes_downloaded + ahead})
        moved = f" ({format_bytes(report.bytes_downloaded)})" if report.bytes_downloaded else ""
        variant = f" {report.variant}" if report.variant else ""
        logger.info("%s: %s%s%s: %s", model, report.action, variant, moved, report.reason)
        self.reports.append(report)
        return report

    @functools.cached_property
    def prefetch(self) -> Prefetch:
        return Prefetch(self.store, self.cache, self.deadline)

    @functools.cached_property
    def _order(self) -> tuple[list[str], dict[str, int]]:
        wanted = self.wanted()
        return wanted, {model: i for i, model in enumerate(wanted)}

    def _fetch_ahead(self, model: str) -> None:
        """Download what the next models' syncs download first while ``model`` is synced."""
        wanted, position = self._order
        unchanged = self.status is not None and self.status.status == "unchanged"
        if self.fetcher.offline or unchanged or model not in position:
            return  # (with the manifest unchanged, its steps keep what they have)
        following = wanted[position[model] + 1 : position[model] + 1 + DEPTH]
        upcoming = [
            (m, self.manifest.models[m].for_device(self.device), self.state.models.get(m))
            for m in following
        ]
        self.prefetch.ahead_of(upcoming, self.steps, self.policy)

    def _not_reached(self, model: str) -> ModelReport:
        """A model the sync had no time left for: failed, its active variant kept."""
        mstate = self.state.models.get(model)
        kept = mstate.active if mstate is not None else None
        reason = f"not synced: {self.deadline.describe()}"
        if kept is not None:
            reason += f" (still running {kept.name})"
        return model_sync.failed(model, kept, reason, [], 0, 0.0)

    def _report_deadline(self) -> Deadline:
        """The report's upload ends by the sync's deadline, or, when less than a stall
        timeout is left (a sync that ran out of time has the most to report), a stall
        timeout from now: a sync ends within EPFLEET_SYNC_DEADLINE plus EPFLEET_STALL_TIMEOUT."""
        grace = settings().stall_timeout
        if self.deadline.remaining() >= grace:
            return self.deadline
        return Deadline(self.clock.monotonic() + grace, self.deadline.seconds, self.clock)

    def finish(self) -> DeviceReport:
        """Write and tidy the cache, then the device report of the models synced so far:
        uploaded to the store when it accepts writes and says something new, or its
        heartbeat is due (``epfleet.device.reporting``), and kept in the cache."""
        if self.status is None:
            raise RuntimeError("fetch_manifest() comes before finish()")
        self._close()
        report = DeviceReport(
            device_id=self.device,
            generated_at=utcnow().isoformat(),
            ort_version=ort_version(),
            ep_packages=ep_versions(),
            devices=self.local.describe(),
            store=self.store_uri,
            cache=str(self.cache.root),
            manifest=self.status,
            models=list(self.reports),
            seconds=round(time.perf_counter() - self.started, 3),
            warnings=list(self.cache.repairs),
        )
        with within(self._report_deadline()):
            report = upload_report(self.report_store, report, self.cache)
        try:
            self.cache.save_last_report(report.model_dump_json(indent=2).encode())
        except (OSError, EpfleetError) as exc:  # the report is returned (and printed) anyway
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            unsaved = f"could not save {self.cache.meta / 'last-report.json'}: {reason}"
            report = report.model_copy(update={"warnings": [*report.warnings, unsaved]})
        return report


def sync(
    store_uri: str,
    cache_dir: Path,
    policy: SyncPolicy,
    device: str | None = None,
    *,
    trust_root: Path | None = None,
    allow_unsigned: bool | None = None,
    report_to: str | None = None,
    health: HealthRunner | None = None,
    clock: Clock = SYSTEM_CLOCK,
    shadow_inputs: ShadowInputs | None = None,
    local: LocalEps | None = None,
) -> DeviceReport:
    """One whole device sync, without Prefect. A first sync (no cache yet) whose manifest
    is rejected (a trusted root that is not the store's, metadata that does not verify)
    leaves no cache behind: it synced nothing and has nothing worth keeping; its report
    says why, as any sync's does."""
    first = not cache_dir.exists()
    with SyncSession(
        store_uri,
        cache_dir,
        policy,
        device,
        local=local,
        trust_root=trust_root,
        allow_unsigned=allow_unsigned,
        report_to=report_to,
        health=health,
        clock=clock,
        shadow_inputs=shadow_inputs,
    ) as session:
        session.fetch_manifest()
        session.drop_unlisted()
        for model in session.wanted():
            session.sync_model(model)
        report = session.finish()
    if first and report.manifest.status == "rejected" and not report.models:
        shutil.rmtree(cache_dir, ignore_errors=True)  # its lock, its state, the root given
    return report
