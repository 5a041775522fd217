"""The device report: what a device's sync did, as it is stored under ``reports/devices/``.

A shared format: the device writes it (``epfleet.device``), the fleet side reads it
(``epfleet.fleet.watch.rules``), so this module imports only pydantic and epfleet's pure modules,
never ONNX Runtime.

Stored form: compact JSON, gzip-compressed (``encode_report``), under the same key as
before; reports of older devices are plain JSON. A device that holds an enrolled key
(``EPFLEET_DEVICE_KEY``) stores its report signed: a DSSE envelope (payload type
``REPORT_PAYLOAD_TYPE``, the report's JSON as payload, one signature), gzip-compressed
the same way. ``decode_report`` reads all three (a gzip body starts with 1f 8b, JSON never
does; an envelope starts ``{"payload"``), keeps an envelope's signatures with the report
(``signed_envelope``) for the rollout gate to verify, and never inflates one past a size
limit.
``content_digest`` is what a report says, without what changes on every sync (times,
bytes moved, the manifest's version, its number): a device uploads a report whose digest
differs from the last one it uploaded, and otherwise only once per heartbeat
(``EPFLEET_REPORT_HEARTBEAT``).

A device numbers the reports it uploads (``sequence``, increasing; inside the signed
payload when it signs), so that the fleet side can tell its newest report from an older
one put back in its place (``epfleet.fleet.evidence.rules.newest``). Reports of older
devices have no number; a reader of an older epfleet ignores it (a report's unknown keys
are ignored), so adding it needed no version.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from eps.base import DeviceType, Precision, Verdict

if TYPE_CHECKING:  # imported where used: a device that signs nothing never loads them
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import Signer

    from epfleet.formats.manifest import DeviceKey

REPORTS_PREFIX = "reports/devices"
"""Store key prefix of the device reports: ``reports/devices/<device id>.json``."""

Action = Literal["kept", "downloaded", "recompiled", "fallback", "failed"]
SERVED_ACTIONS: frozenset[str] = frozenset({"kept", "downloaded", "recompiled"})
"""Actions after which a model runs a variant built for this device's EPs; the others
(``fallback``, ``failed``) make a sync exit non-zero."""
GZIP_MAGIC = b"\x1f\x8b"
LOCAL_FIELDS = frozenset({"report_uploaded", "report_error", "report_skipped"})
"""What the device says of the upload itself: printed and kept in the cache, not uploaded."""


MAX_MS = 86_400_000.0
"""The longest time a report may give in milliseconds (a day): a larger one, or one that
is not a finite number, makes the report unreadable (an ``inf`` or ``NaN`` would turn the
rollout gate's medians off)."""
MAX_SECONDS = 7 * 86_400.0
MAX_COUNT = 1 << 53


class _Bounded(BaseModel):
    """Every number of a report finite (no inf, no NaN)."""

    model_config = ConfigDict(allow_inf_nan=False)


def report_key(device_id: str) -> str:
    """The store key of a device's report."""
    return f"{REPORTS_PREFIX}/{device_id}.json"


def key_device(key: str) -> str | None:
    """The device id a report's key names (``reports/devices/<id>.json``), or None for a
    key that is not a device report's."""
    prefix, suffix = f"{REPORTS_PREFIX}/", ".json"
    if not key.startswith(prefix) or not key.endswith(suffix):
        return None
    device = key[len(prefix) : -len(suffix)]
    return device if device and "/" not in device else None


INBOX_PREFIX = "reports/inbox"
"""Where a device of this release leaves a notice (an empty object) beside each report it
uploads: ``reports/inbox/<partition>/<device id>.json``, the partition its own UTC time
(``inbox_partition``). The report itself stays at ``report_key``: the notice only tells
the evidence index whose report to read, so that a pass lists the recent partitions, not
every device's key."""
INBOX_PARTITION_SECONDS = 600


def inbox_partition(at: datetime) -> str:
    """The inbox partition of the UTC time ``at``: ``YYYYMMDDTHHMM``, the minutes rounded
    down to a multiple of ten."""
    at = at.astimezone(timezone.utc)
    return at.replace(minute=at.minute - at.minute % 10).strftime("%Y%m%dT%H%M")


def inbox_key(device_id: str, at: datetime) -> str:
    """The key of the notice a device leaves at its time ``at``."""
    return f"{INBOX_PREFIX}/{inbox_partition(at)}/{device_id}.json"


def inbox_device(key: str) -> str | None:
    """The device id a notice's key names (``reports/inbox/<partition>/<id>.json``), or
    None for a key that is not a notice's."""
    prefix, suffix = f"{INBOX_PREFIX}/", ".json"
    if not key.startswith(prefix) or not key.endswith(suffix):
        return None
    partition, _, device = key[len(prefix) : -len(suffix)].partition("/")
    return device if partition and device and "/" not in device else None


class DeviceInfo(BaseModel):
    """One OrtEpDevice, as a device report lists it."""

    ep: str
    type: str
    vendor: str
    vendor_id: int
    device_id: int
    ep_vendor: str


class ManifestStatus(_Bounded):
    status: Literal["fetched", "unchanged", "offline", "rejected"]
    generation: int | None = Field(description="Generation of the manifest in force")
    body_bytes: int = Field(description="Manifest bytes transferred by this fetch")
    reason: str | None = None
    signed: bool | None = Field(
        default=None,
        description="The manifest in force comes from signed (TUF) metadata; false for an "
        "unsigned manifest.json (--allow-unsigned); None in reports of older devices",
    )
    signed_version: int | None = Field(
        default=None, description="Version of the signed timestamp in force"
    )
    warning: str | None = Field(
        default=None, description="Why the sync trusted less than it should"
    )

    @property
    def offline(self) -> bool:
        return self.status == "offline"


class VariantVerdict(BaseModel):
    target: str
    ep: str
    device: DeviceType
    verdict: Verdict
    reason: str


class Profile(_Bounded):
    """How a variant ran on this device when it was activated: its health check's session
    and runs on the model's golden samples, timed."""

    session_ms: float = Field(ge=0, le=MAX_MS, description="Creating its inference session")
    first_run_ms: float = Field(ge=0, le=MAX_MS)
    p50_ms: float = Field(ge=0, le=MAX_MS)
    p95_ms: float = Field(ge=0, le=MAX_MS)
    runs: int = Field(ge=0, le=MAX_COUNT)
    ep_nodes: int | None = Field(default=None, ge=0, le=MAX_COUNT, description="Nodes its EP took")
    other_nodes: int | None = Field(
        default=None, ge=0, le=MAX_COUNT, description="Nodes left to other EPs"
    )


MAX_ERROR = 1e12
"""The largest relative error a shadow run may give (a larger one, or one that is not finite,
makes the report unreadable): past it a candidate is outside any bound anyway."""


class ShadowRun(_Bounded):
    """The shadow run of a rollout's candidate on this device, before it switched: the
    candidate beside the variant it was running, on the device's own inputs (they never
    leave it: only these figures do), judged by the model's verification bounds."""

    candidate: str = Field(description="The candidate variant's name in the device cache")
    active: str = Field(description="The variant it ran beside (the one running then)")
    samples: int = Field(ge=0, le=MAX_COUNT, description="Inputs both ran on")
    inputs: Literal["app", "golden"] = Field(
        description="Whose inputs: the app's (the sync's shadow inputs hook), else the "
        "model's golden samples' inputs"
    )
    within: bool = Field(
        description="The candidate's outputs are within the model's bounds of the active "
        "variant's: it was activated; false: the active variant was kept"
    )
    max_rel_error: float | None = Field(
        default=None, ge=0, le=MAX_ERROR, description="Of the candidate against the active one"
    )
    tolerance: float | None = Field(
        default=None, ge=0, le=MAX_ERROR, description="The relative tolerance it was judged by"
    )
    metric: str | None = Field(
        default=None, description="The task metric it was judged by (kind), if the spec names one"
    )
    metric_value: float | None = Field(
        default=None, ge=-MAX_ERROR, le=MAX_ERROR, description="Its value, candidate against active"
    )
    metric_min: float | None = Field(default=None, ge=-MAX_ERROR, le=MAX_ERROR)
    candidate_p50_ms: float = Field(ge=0, le=MAX_MS)
    active_p50_ms: float = Field(ge=0, le=MAX_MS)
    seconds: float = Field(ge=0, le=MAX_SECONDS, description="The whole shadow run, on the device")


class RolloutSeen(_Bounded):
    """The staged rollout a device acted on for a model, as its report says."""

    id: str
    member: bool = Field(description="The rollout reached this device: it runs the new variants")
    stage: int = Field(ge=0, le=MAX_COUNT)
    state: str
    shadow: ShadowRun | None = Field(
        default=None,
        exclude_if=lambda shadow: shadow is None,
        description="The device's shadow run of this rollout's candidate (the policy's "
        "shadow); left out when it ran none and in reports of older devices",
    )


class ModelReport(_Bounded):
    model: str
    action: Action
    variant: str | None = Field(description="The active variant's name in the device cache")
    target: str | None = Field(description="The fleet target it was published for")
    artifact_sha256: str | None = Field(
        default=None,
        pattern="^[0-9a-f]{64}$",
        description="The sha256 of the active variant's main file when the fleet published "
        "it (its store key is variants/<model>/<target>/<sha256>.onnx, which epfleet gc "
        "keeps with its files while the report is recent); None for a local build, the "
        "fallback, and in reports of older devices",
    )
    ep: str | None
    source_sha256: str | None = Field(
        default=None,
        pattern="^[0-9a-f]{64}$",
        exclude_if=lambda sha256: sha256 is None,
        description="The source (its file set's digest) the active variant was built from: "
        "which version of the model this device runs; left out when nothing runs and in "
        "reports of older devices",
    )
    verdict: Verdict | None
    bytes_downloaded: int = Field(ge=0, le=MAX_COUNT)
    delta_from: str | None = Field(
        default=None,
        exclude_if=lambda name: name is None,
        description="The variant whose file a binary delta (bytes_downloaded) turned into "
        "the one activated; left out when none was used and in reports of older devices",
    )
    reason: str
    considered: list[VariantVerdict]
    seconds: float = Field(ge=0, le=MAX_SECONDS)
    precision: Precision | None = Field(
        default=None,
        exclude_if=lambda precision: precision is None,
        description="What the active variant computes in (fp32, fp16, w8a16, w8a8): a "
        "published variant's as its manifest entry records it, a local build's as its EP "
        "module says, fp32 for the source on the CPU EP; left out when unknown (a variant "
        "published before precisions were recorded) and in reports of older devices",
    )

    profile: Profile | None = Field(
        default=None,
        exclude_if=lambda profile: profile is None,
        description="How the active variant ran when this device activated it",
    )
    rollout: RolloutSeen | None = Field(
        default=None,
        exclude_if=lambda rollout: rollout is None,
        description="The staged rollout of the model this sync acted on (the rollout-gate "
        "flow reads it); left out when the model has none",
    )

    @property
    def served(self) -> bool:
        return self.action in SERVED_ACTIONS


class DeviceReport(_Bounded):
    _envelope: Any = PrivateAttr(default=None)

    device_id: str
    generated_at: str
    ort_version: str
    ep_packages: dict[str, str]
    devices: list[DeviceInfo]
    store: str
    cache: str
    manifest: ManifestStatus
    models: list[ModelReport]
    seconds: float = Field(ge=0, le=MAX_SECONDS)
    sequence: int | None = Field(
        default=None,
        ge=1,
        le=MAX_COUNT,
        exclude_if=lambda sequence: sequence is None,
        description="The report's number: higher in every report the device uploads "
        "(a counter in its cache, never below the upload's time in milliseconds); left "
        "out by older devices",
    )
    report_uploaded: bool | None = None
    report_error: str | None = None
    report_skipped: str | None = Field(
        default=None,
        description="Why the report was not uploaded although the store accepts writes: "
        "it says what the last one uploaded said, within the heartbeat",
    )
    warnings: list[str] = Field(
        default_factory=list, description="What the sync repaired in the cache, or could not write"
    )

    @property
    def served(self) -> int:
        """How many models are served (see ``SERVED_ACTIONS``)."""
        return sum(m.served for m in self.models)

    @property
    def exit_code(self) -> int:
        return 0 if self.served == len(self.models) and self.manifest.status != "rejected" else 1


REPORT_PAYLOAD_TYPE = "application/vnd.epfleet.device-report+json"
_ENVELOPE_START = b'{"payload"'


def encode_report(report: DeviceReport, signer: Signer | None = None) -> bytes:
    """The report as a device uploads it: compact JSON, signed in a DSSE envelope when
    ``signer`` (the device's enrolled key) is given, gzip-compressed (no time stamp in the
    gzip header: the same report gives the same bytes)."""
    data = report.model_dump_json(exclude=set(LOCAL_FIELDS)).encode()
    if signer is not None:
        from securesystemslib.dsse import Envelope

        envelope = Envelope(payload=data, payload_type=REPORT_PAYLOAD_TYPE, signatures={})
        envelope.sign(signer)
        data = json.dumps(envelope.to_dict(), separators=(",", ":")).encode()
    return gzip.compress(data, compresslevel=6, mtime=0)


def decode_report(data: bytes, limit: int) -> DeviceReport:
    """A stored report: gzip-compressed JSON or DSSE envelope, or plain JSON (older
    devices). ValueError when it inflates past ``limit`` bytes, is a damaged gzip stream
    or an envelope that is not a report's; pydantic's ValidationError when it is not a
    report. An envelope's signatures are kept, not verified (``signed_envelope``)."""
    if data.startswith(GZIP_MAGIC):
        data = inflate(data, limit)
    if not data.startswith(_ENVELOPE_START):
        return DeviceReport.model_validate_json(data)
    from securesystemslib.dsse import Envelope

    try:
        envelope = Envelope.from_dict(json.loads(data))
    except Exception as exc:  # securesystemslib raises its own errors for a bad envelope
        raise ValueError(f"not a DSSE envelope ({exc})") from None
    if envelope.payload_type != REPORT_PAYLOAD_TYPE:
        raise ValueError(f"an envelope of {envelope.payload_type!r}, not a device report")
    report = DeviceReport.model_validate_json(envelope.payload)
    report._envelope = envelope
    return report


def signed_envelope(report: DeviceReport) -> Envelope | None:
    """The DSSE envelope the report was read from (its signatures unverified), if any."""
    envelope: Envelope | None = report._envelope
    return envelope


def inflate(data: bytes, limit: int) -> bytes:
    """A gzip stream's content, holding at most ``limit`` + 1 bytes of it: a small body
    that would inflate to gigabytes (a gzip bomb) is refused, not held."""
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"not a valid gzip stream ({exc})") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise ValueError(f"inflates past the limit of {limit} bytes")
    if not inflater.eof:
        raise ValueError("a gzip stream cut short")
    return out


def content_digest(report: DeviceReport) -> str:
    """What the report says, as a sha256: which variant each model runs (by name, target,
    file, EP, verdict and precision), what failed or fell back and why, how the device
    judged each published variant, its EPs, hardware and runtime, its store, a manifest
    it rejected and its warnings. Left out: times, bytes moved, the manifest's generation
    and signed version, whether a served model's variant was kept, downloaded or built
    just now (the poll after a download says ``kept`` of the same variant), and the
    report's number. Two syncs that changed nothing have the same digest."""
    said: dict[str, Any] = report.model_dump(
        mode="json",
        exclude={*LOCAL_FIELDS, "generated_at", "seconds", "sequence", "manifest", "models"},
    )
    manifest = report.manifest
    if manifest.status == "rejected" or manifest.warning:
        said["manifest"] = [manifest.status, manifest.reason, manifest.warning, manifest.signed]
    said["models"] = [_model_content(model) for model in report.models]
    canonical = json.dumps(said, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def _model_content(model: ModelReport) -> list[Any]:
    served = model.served
    return [
        model.model,
        "served" if served else model.action,
        None if served else model.reason,
        model.variant,
        model.target,
        model.artifact_sha256,
        model.ep,
        model.verdict,
        model.precision,
        sorted((v.target, v.ep, v.verdict) for v in model.considered),
        # a stage move is news: the gate counts only reports made since its stage started
        None if model.rollout is None else _rollout_content(model.rollout),
    ]


def _rollout_content(rollout: RolloutSeen) -> list[Any]:
    said: list[Any] = [rollout.id, rollout.stage]
    if rollout.shadow is not None:  # (no shadow run: the digest of reports before them)
        said.append([rollout.shadow.candidate, rollout.shadow.within])
    return said


def signed_by(report: DeviceReport, key: DeviceKey) -> bool:
    """Whether the report was read from an envelope whose signature verifies with ``key``
    (an enrolled device's public key) over the very payload the report was parsed from."""
    envelope = signed_envelope(report)
    if envelope is None:
        return False
    from securesystemslib.signer import SSlibKey

    public = SSlibKey(key.keyid, key.keytype, key.scheme, {"public": key.public})
    try:
        envelope.verify([public], 1)
    except Exception:  # VerificationError, or a key securesystemslib cannot load
        return False
    return True
