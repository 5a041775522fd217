"""epfleet's environment: every ``EPFLEET_*`` variable, typed and described in one model.

Command-line options win over these where both exist (``epfleet sync --device-id``,
``epfleet compile --task-runner``); the variables are for what has no command line of
its own: a deployment's workers (``job_variables.env`` in ``deployments/prefect.yaml``)
and the compile worker processes. An empty variable counts as unset. ``settings()``
parses the environment once per process and hands out that one (frozen) ``Settings``
while the ``EPFLEET_*`` variables (and ``HOME``) stay as they were: building the model
costs milliseconds, and a device sync asks several times per model. A process that
changes a variable (a test, a worker) gets a fresh parse on its next call;
``reset_settings()`` drops the cached ones. A bad value is a ``BadInputError`` that
names the variable.

Every setting is a scalar, so a plain pydantic model validates the variables' strings
(``EPFLEET_`` dropped, any case, empty ones left out) as pydantic-settings did, in lax
mode: ``4``, ``true``, ``10GiB``; without importing pydantic-settings, which with what it
loads (asyncio, dotenv, argparse) cost a device's every sync ~0.1 s of CPU.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from pydantic import BaseModel, ByteSize, ConfigDict, Field, SecretStr, ValidationError

from epfleet import MAX_WORKERS
from epfleet.errors import BadInputError
from epfleet.formats.manifest import NAME_PATTERN

ENV_PREFIX = "EPFLEET_"


class Settings(BaseModel):
    """The ``EPFLEET_*`` environment."""

    model_config = ConfigDict(extra="ignore", frozen=True, validate_default=True)

    cache: Path = Field(
        default_factory=lambda: Path.home() / ".cache" / "epfleet",
        description="Worker-local scratch of the compile workers (fetched sources, fresh "
        "artifacts), and this host's record of the signed stores it read "
        "(signed-stores/); default ~/.cache/epfleet",
    )
    runtime_packages: str = Field(
        default="",
        max_length=2000,
        description="Comma-separated packages a spec's runtimes may install besides "
        "onnxruntime and the EP packages epfleet knows (e.g. a vendor's EP plugin). Empty, "
        "the default: those only, as a runtime would otherwise have the compile host "
        "install and run any code a spec names",
    )
    runtime_wheels: Path | None = Field(
        default=None,
        description="A directory of wheels to build the spec's runtime environments from "
        "(pip --no-index --find-links), for a compile host without a package index; unset: "
        "pip's configured index",
    )
    cache_max_bytes: ByteSize = Field(
        default=ByteSize(10 << 30),
        ge=0,
        description="Bound on the sources and golden samples EPFLEET_CACHE keeps, e.g. 10GiB "
        "(the default); each compile run first evicts the least recently used beyond it "
        "and removes temp files and scratch older than an hour; 0 keeps none",
    )
    embed_context_max_bytes: ByteSize = Field(
        default=ByteSize(256 << 20),
        ge=0,
        description="A variant embeds its EP context binaries in the model when the source "
        "(with its external data) totals less than this, e.g. 256MiB (the default); larger "
        "ones get them as files beside the model. A target's embed_context overrides it",
    )
    device_id: str | None = Field(
        default=None,
        pattern=NAME_PATTERN,
        description="This device's id in its sync reports (--device-id wins); default the "
        "host name",
    )
    device_key: Path | None = Field(
        default=None,
        description="This device's report-signing key (PEM), made by epfleet device enroll: "
        "its reports go up signed, as rollouts with authenticated_reports require",
    )
    task_runner: str = Field(
        default="threads",
        description="Where a deployment's fleet-compile and compile-pairs runs execute their "
        "compile tasks: threads (the default) or dask (epfleet[dask]); --task-runner on the "
        "command line",
    )
    dask_address: str | None = Field(
        default=None,
        description="The Dask scheduler for task runner dask, e.g. tcp://10.0.0.5:8786; "
        "default a local cluster",
    )
    dask_workers: int = Field(
        default=2,
        ge=1,
        le=MAX_WORKERS,
        description="Worker processes of that local Dask cluster (1 to 64; default 2)",
    )
    stall_timeout: float = Field(
        default=30.0,
        gt=0,
        description="Seconds a store transfer (download, upload, document read) may go "
        "without moving a byte before it is aborted, and the most the head of a store's "
        "answer (status line and headers) may take to arrive whole, per attempt; a connect "
        "(but an upload's) waits no longer either, nor more than 10 s; default 30",
    )
    min_rate: ByteSize = Field(
        default=ByteSize(1024),
        ge=0,
        description="Bytes per second a store transfer must average over EPFLEET_RATE_WINDOW, "
        "e.g. 1KiB (the default) or 50KB; 0 turns the check off",
    )
    rate_window: float = Field(
        default=30.0,
        gt=0,
        description="Seconds over which EPFLEET_MIN_RATE is averaged; default 30",
    )
    sync_deadline: float = Field(
        default=3600.0,
        gt=0,
        description="Seconds one device sync may take: every store request, download and "
        "worker call in flight stops when it passes, models not done by then are reported "
        "failed and keep their previous variant, and the report still goes up within "
        "EPFLEET_STALL_TIMEOUT more; default 3600",
    )
    health_timeout: float = Field(
        default=300.0,
        gt=0,
        description="Seconds a device's health check of one variant may run before its worker "
        "is killed; default 300",
    )
    local_compile_timeout: float = Field(
        default=1800.0,
        gt=0,
        description="Seconds a device's local build of one model may run before its worker is "
        "killed; default 1800",
    )
    max_manifest_bytes: ByteSize = Field(
        default=ByteSize(256 << 20),
        gt=0,
        description="Largest manifest.json read from a store, e.g. 256MiB (the default); a "
        "larger one is not read",
    )
    max_document_bytes: ByteSize = Field(
        default=ByteSize(16 << 20),
        gt=0,
        description="Largest other document read from a store (device reports, hand-over "
        "files under runs/), e.g. 16MiB (the default)",
    )
    gc_grace_hours: float = Field(
        default=24.0,
        ge=0,
        description="Hours a store object (and the manifest in force) must be older than for "
        "epfleet gc to collect it (--grace wins); default 24",
    )
    gc_retention_days: float = Field(
        default=30.0,
        ge=0,
        description="epfleet gc keeps every variant a device reported active within this many "
        "days (--retention-days wins); default 30",
    )
    report_to: str | None = Field(
        default=None,
        description="Where device reports are, when not in the fleet's store: a directory or "
        "s3://bucket/prefix. Devices upload their sync reports there (--report-to wins; for a "
        "device that reads through a read-only HTTPS mirror and holds no credentials for the "
        "store behind it: give it write access to reports/devices/ only), and epfleet gc, "
        "runtime-watch and the rollout gate read them from there (set it where they run "
        "too); default the store itself",
    )
    report_heartbeat: float = Field(
        default=86400.0,
        gt=0,
        description="A device uploads its sync report when what it says changed (active "
        "variants, failures, EPs and runtime) and otherwise once this many seconds have "
        "passed since its last upload, so that an unchanged poll writes nothing; default "
        "86400 (a day). Set the same value where epfleet gc and runtime-watch run: their "
        "windows (EPFLEET_GC_RETENTION_DAYS, report_max_age_days) must be at least this long",
    )
    evidence_key: SecretStr | None = Field(
        default=None,
        min_length=32,
        description="The key sealing the evidence index that the rollout gate, the field view "
        "and runtime-watch keep of the device reports (reports/evidence-index/), at least 32 "
        "characters: give the same secret to every machine that runs them so that they share "
        "one index; never to a device. Unset: a key kept in the worker cache "
        "(EPFLEET_CACHE/work/evidence-index.key), so each such machine keeps its own index",
    )
    evidence_full_listing_every: int = Field(
        default=12,
        ge=1,
        le=10_000,
        description="Every this many passes the evidence index lists every device's report "
        "key (reports/devices/: one LIST per 1,000 devices); the passes between list only the "
        "recent partitions of reports/inbox/, where devices of this release leave a notice "
        "beside each upload. Reports of older devices (no notice) are counted at these full "
        "listings; default 12 (with hourly passes, twice a day); 1: every pass lists every key",
    )
    evidence_fresh_seconds: float = Field(
        default=600.0,
        ge=0,
        description="A reader of the evidence index (the field view, runtime-watch, a gate "
        "that does not advance) that finds it brought up to date by a pass that started less "
        "than this many seconds ago (the store's clock) answers from it without listing the "
        "reports; a gate about to advance a rollout always brings it up to date first. "
        "Default 600; 0: every reader lists",
    )
    evidence_skew_seconds: float = Field(
        default=600.0,
        ge=0,
        le=86_400,
        description="How far a device's clock may be from the store's and its notices still be "
        "found by the next pass of the evidence index (a notice is filed under the device's "
        "own time); a device further off is counted at the next full listing "
        "(EPFLEET_EVIDENCE_FULL_LISTING_EVERY). Default 600",
    )
    ranking_min_devices: int = Field(
        default=5,
        ge=1,
        le=1_000_000,
        description="Distinct devices of one hardware profile and runtime that must report a "
        "variant's latency before the rollout gate ranks it for them (a profile is ranked "
        "once two variants are); default 5. Only reports the gate itself could count vote: "
        "one a device, signed with its enrolled key when the fleet enrols any",
    )
    ranking_max_age_days: float = Field(
        default=7.0,
        gt=0,
        description="Device reports older than this many days give no latency to the field "
        "rankings (a device's report is renewed at least every EPFLEET_REPORT_HEARTBEAT); "
        "default 7",
    )
    multipart_grace: float = Field(
        default=86400.0,
        ge=0,
        description="Seconds after which an incomplete S3 multipart upload under the store's "
        "prefix is aborted by the next compile run; default 86400 (a day)",
    )
    trust_root: Path | None = Field(
        default=None,
        description="The TUF root.json a device trusts (--trust-root wins); copied into the "
        "device cache on first use, later syncs follow the root chain cached there",
    )
    s3_unsigned: bool = Field(
        default=False,
        description="Read s3:// stores with unsigned requests (botocore's UNSIGNED): for a "
        "device that reads a public bucket and holds no AWS credentials. What it may write "
        "(its reports) then needs a store of its own (EPFLEET_REPORT_TO); default false",
    )
    allow_unsigned: bool = Field(
        default=False,
        description="Let a device with no trusted root sync from manifest.json, unsigned "
        "(--allow-unsigned); the device report warns. Default false: refused",
    )
    drop_unlisted: bool = Field(
        default=False,
        description="A device sync removes models the manifest no longer lists from its cache "
        "(--drop-unlisted), never on an offline or rejected manifest nor a --model subset; "
        "default false: they stay as they were",
    )
    trust_signer: str | None = Field(
        default=None,
        description="The online signing key of a store's TUF metadata (bins, snapshot, "
        "timestamp), as a securesystemslib signer URI: file2:<path> in development, "
        "awskms:, gcpkms:, azurekms: or hv: in production. Needed to publish to a store "
        "with trust metadata; a local store without any gets development keys",
    )
    model_signer: str | None = Field(
        default=None,
        description="The key of a store's OpenSSF model signatures (a Sigstore bundle beside "
        "each published variant), as a securesystemslib signer URI: file2:<path> to a PEM "
        "key, or a KMS. Needed to publish to a store that publishes a model-signing key "
        "(trust/model-signing.pub); a local store with development keys gets one beside them",
    )
    metric_modules: str = Field(
        default="",
        max_length=2000,
        description="Comma-separated modules whose functions a spec's custom task metric may "
        "call, their submodules included (e.g. acme.metrics). Empty, the default: no "
        "custom metric runs, as a spec would otherwise name code for the compile host to run",
    )


def env_name(field: str) -> str:
    """The environment variable of a ``Settings`` field: ``cache`` -> ``EPFLEET_CACHE``."""
    return ENV_PREFIX + field.upper()


def settings() -> Settings:
    """The ``EPFLEET_*`` environment as it is now: parsed on the first call with these
    values, the same object afterwards (a look at ``os.environ`` per call, microseconds)."""
    return _parsed(_environment())


def reset_settings() -> None:
    """Forget the parsed settings: the next ``settings()`` reads the environment again."""
    _parsed.cache_clear()


def _environment() -> tuple[tuple[str, str], ...]:
    """What a parse depends on: every ``EPFLEET_*`` variable (any case) and ``HOME`` (the
    default cache)."""
    prefix = ENV_PREFIX.lower()
    found = [(k, v) for k, v in os.environ.items() if k.lower().startswith(prefix)]
    return (*sorted(found), ("HOME", os.environ.get("HOME", "")))


@functools.lru_cache(maxsize=8)
def _parsed(environment: tuple[tuple[str, str], ...]) -> Settings:
    """The settings for ``environment`` (``_environment()``'s); a bad value is not cached."""
    prefix = len(ENV_PREFIX)
    values = {
        name[prefix:].lower(): value
        for name, value in environment
        if name.upper().startswith(ENV_PREFIX) and value != ""  # an empty one is unset
    }
    try:
        return Settings.model_validate(values)
    except ValidationError as exc:
        raise BadInputError(
            "; ".join(
                f"{env_name(str(error['loc'][0]))}={error['input']!r}: {error['msg']}"
                for error in exc.errors()
            )
        ) from None


def describe() -> list[tuple[str, str]]:
    """Each variable with its description, for the docs (docs/reference/settings.md)."""
    return [
        (env_name(name), field.description or "") for name, field in Settings.model_fields.items()
    ]
