"""Fleet compile steps that are not Prefect tasks: staging sources, planning, publishing.

The flow calls these from its tasks, and the CLI calls ``plan_run`` directly to
answer an up-to-date fleet without starting a flow run.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Literal

import onnx
from pydantic import BaseModel, Field, ValidationError

import eps
from epfleet import ort_version
from epfleet.compiler import CompileJob
from epfleet.errors import (
    BadInputError,
    EpfleetError,
    IntegrityError,
    PreconditionFailed,
    StoreError,
    ep_errors,
)
from epfleet.hashing import sha256_bytes, sha256_file
from epfleet.manifest import Manifest, SamplesRef, SourceEntry, VariantEntry, merge
from epfleet.plan import CompileRequest, PlannedPair, plan_pairs, samples_key, source_key
from epfleet.samples import GOLDEN_VERSION
from epfleet.shapes import prepare_model, uses_external_data
from epfleet.spec import FleetSpec, ModelSpec, TargetSpec, load_spec
from epfleet.stores import MANIFEST_KEY, Store, open_store, split_uri
from epfleet.stores.local import local_path
from epfleet.verify import GoldenJob, golden_for

DEFAULT_STORE = "./epfleet-store"
PUBLISH_ATTEMPTS = 20


def cache_dir() -> Path:
    """Worker-local scratch for fetched sources and fresh artifacts."""
    return Path(os.environ.get("EPFLEET_CACHE", Path.home() / ".cache" / "epfleet"))


class RunPlan(BaseModel):
    store: str
    sources: dict[str, SourceEntry]
    pairs: list[PlannedPair]
    generation: int
    published_sources: dict[str, SourceEntry | None] = Field(
        description="Each model's source entry in the manifest when this run planned"
    )
    samples: dict[str, SamplesRef | None] = Field(
        default_factory=dict, description="Each model's golden samples (verification)"
    )
    published_samples: dict[str, SamplesRef | None] = Field(default_factory=dict)

    @property
    def to_compile(self) -> list[PlannedPair]:
        return [p for p in self.pairs if p.action == "compile"]

    def report(
        self, results: dict[tuple[str, str], PairResult], generation: int, published: bool
    ) -> RunReport:
        """The run's report in spec order; pairs without a result were up to date."""
        ordered = [
            results.get((p.request.model, p.request.target))
            or PairResult.of(p.request, p.previous, "skipped", None)
            for p in self.pairs
        ]
        return RunReport(
            generation=generation,
            published=published,
            compiled=sum(r.status == "ok" for r in ordered),
            skipped=sum(r.status == "skipped" for r in ordered),
            failed=sum(r.status == "failed" for r in ordered),
            variants=ordered,
        )

    @property
    def is_noop(self) -> bool:
        """Nothing to compile and nothing new to publish: the fleet is up to date."""
        return (
            not self.to_compile
            and self.published_sources == self.sources
            and self.published_samples == self.samples
        )


class PairResult(BaseModel):
    model: str
    target: str
    ep: str
    status: Literal["ok", "skipped", "failed"]
    compatibility_string: str | None = None
    artifact_uri: str | None = None
    size: int | None = None
    seconds: float | None = None
    error: str | None = None
    coverage: float | None = None
    verification: Literal["passed", "failed", "unverified"] | None = None
    max_rel_error: float | None = None
    verification_seconds: float | None = None

    @classmethod
    def of(
        cls,
        pair: CompileRequest,
        entry: VariantEntry | None,
        status: Literal["ok", "skipped", "failed"],
        seconds: float | None,
    ) -> PairResult:
        artifact = entry.artifact if entry else None
        return cls(
            model=pair.model,
            target=pair.target,
            ep=pair.ep,
            status=status,
            compatibility_string=entry.compatibility_string if entry else None,
            artifact_uri=artifact.uri if artifact else None,
            size=artifact.size if artifact else None,
            seconds=seconds,
            error=entry.error if entry and status == "failed" else None,
            coverage=entry.coverage.fraction if entry and entry.coverage else None,
            verification=entry.verification.status if entry and entry.verification else None,
            max_rel_error=(
                entry.verification.max_rel_error if entry and entry.verification else None
            ),
            verification_seconds=(
                entry.verification.seconds if entry and entry.verification else None
            ),
        )


class RunReport(BaseModel):
    generation: int
    published: bool
    compiled: int
    skipped: int
    failed: int
    variants: list[PairResult]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0


# --- sources ---------------------------------------------------------------------------


def resolve_source(spec_path: Path, source: str) -> str:
    """A model's source as a URI or absolute path; relative paths are relative to the spec."""
    if "://" in source:
        return source
    return str((spec_path.parent / source).resolve())


@contextmanager
def local_source(uri: str) -> Iterator[Path]:
    """A local path holding the source: the file itself, or a temporary download."""
    if uri.startswith("file://") or "://" not in uri:
        path = local_path(uri)
        if not path.is_file():
            raise BadInputError(f"source {uri} does not exist")
        yield path
        return
    parent, key = split_uri(uri)
    downloads = cache_dir() / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads) as scratch:
        dest = Path(scratch) / Path(key).name
        try:
            open_store(parent).download(key, dest)
        except StoreError as exc:
            raise BadInputError(f"source {uri} cannot be fetched: {exc}") from None
        yield dest


def stage_source(
    model: ModelSpec, uri: str, static_eps: set[str], store: Store
) -> tuple[SourceEntry, onnx.ModelProto]:
    """Hash the source, check that its input_shapes apply (and leave every input static
    when an EP in ``static_eps`` needs that), and upload it content-addressed, once.
    Also returns the source with its shapes fixed."""
    with local_source(uri) as path:
        sha256, size = sha256_file(path)
        try:
            loaded = onnx.load(str(path), load_external_data=False)
        except Exception as exc:
            raise BadInputError(
                f"models[{model.name}].source {uri} is not an ONNX model: {exc}"
            ) from None
        if uses_external_data(loaded):
            raise BadInputError(
                f"models[{model.name}].source {uri} keeps tensors in external data files, "
                "which epfleet does not stage; save it as one file first "
                "(onnx.save(model, path, save_as_external_data=False), up to 2 GB)"
            )
        try:
            prepare_model(
                loaded, model.input_shapes, bool(static_eps), " and ".join(sorted(static_eps))
            )
        except ValueError as exc:
            raise BadInputError(f"models[{model.name}] ({uri}): {exc}") from None
        key = source_key(sha256)
        if store.size(key) != size:
            store.upload(key, path, sha256)
    entry = SourceEntry(uri=key, sha256=sha256, size=size, input_shapes=model.input_shapes)
    return entry, loaded


def stage_samples(
    model: ModelSpec,
    samples_uri: str | None,
    source: SourceEntry,
    prepared: onnx.ModelProto,
    published: SamplesRef | None,
    store: Store,
) -> SamplesRef:
    """The model's golden samples: the spec's sample inputs (or seeded generated ones) and
    the source's outputs for them on the CPU EP, uploaded content-addressed. Reused from
    the manifest while what made them is unchanged, so reference outputs do not drift
    with the machine or ORT version that plans. EpfleetError when the source does not
    run on the CPU EP; BadInputError for a samples file that does not fit the model."""
    with ExitStack() as stack:
        samples_path = stack.enter_context(local_source(samples_uri)) if samples_uri else None
        samples_sha = sha256_file(samples_path)[0] if samples_path else None
        basis = sha256_bytes(
            json.dumps([GOLDEN_VERSION, source.sha256, source.input_shapes, samples_sha]).encode()
        )
        if (
            published is not None
            and published.basis == basis
            and store.size(published.uri) == published.size
        ):
            return published
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=_scratch_root())))
        prepared_path, golden = scratch / "source.onnx", scratch / "golden.npz"
        onnx.save(prepared, str(prepared_path))
        job = GoldenJob(
            source_path=str(prepared_path),
            input_shapes=source.input_shapes,
            samples_path=str(samples_path) if samples_path else None,
            dest=str(golden),
        )
        try:
            count = golden_for(job)
        except BadInputError as exc:
            raise BadInputError(f"models[{model.name}].samples {samples_uri}: {exc}") from None
        sha256, size = sha256_file(golden)
        key = samples_key(sha256)
        if store.size(key) != size:
            store.upload(key, golden, sha256)
    return SamplesRef(uri=key, sha256=sha256, size=size, count=count, basis=basis)


def _scratch_root() -> Path:
    root = cache_dir() / "work"
    root.mkdir(parents=True, exist_ok=True)
    return root


def fetch_verified(store: Store, key: str, sha256: str, size: int) -> Path:
    """``key`` in this worker's content-addressed cache, downloaded and checked by sha256
    and size before it is used (a bad download never enters the cache)."""
    path = cache_dir() / "sources" / f"{sha256}{Path(key).suffix}"
    if path.exists() and path.stat().st_size == size:
        return path
    scratch = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        store.download(key, scratch)
        got = sha256_file(scratch)
        if got != (sha256, size):
            raise IntegrityError(
                f"{store.uri}/{key} has sha256 {got[0]} ({got[1]} bytes), "
                f"expected {sha256} ({size} bytes)"
            )
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)
    return path


def compile_job_for(request: CompileRequest, store: Store) -> CompileJob:
    """The job a compile worker runs for one planned pair, with the source cached locally."""
    source = fetch_verified(store, request.source_key, request.source_sha256, request.source_size)
    return CompileJob(request=request, source_path=str(source), workdir=str(cache_dir() / "work"))


# --- manifest --------------------------------------------------------------------------


def read_manifest(store: Store) -> tuple[Manifest | None, str | None]:
    found = store.read(MANIFEST_KEY)
    if found is None:
        return None, None
    try:
        return Manifest.from_json(found.data), found.etag
    except ValidationError as exc:
        raise StoreError(
            f"{store.uri}/{MANIFEST_KEY} fails validation, refusing to publish over it: "
            f"{exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}"
        ) from None


class Published(BaseModel):
    manifest: Manifest | None = Field(description="The manifest now in the store")
    published: bool = Field(description="Whether this call changed it")
    conflicts: list[str] = Field(
        default_factory=list, description="Models left alone: their source changed meanwhile"
    )


def publish(
    store: Store,
    sources: dict[str, SourceEntry],
    planned_on: dict[str, SourceEntry | None],
    variants: dict[tuple[str, str], VariantEntry],
    samples: dict[str, SamplesRef | None] | None = None,
) -> Published:
    """Read-modify-write the manifest with compare-and-swap, retrying lost races
    (see ``merge`` for what a run may change)."""
    for attempt in range(PUBLISH_ATTEMPTS):
        current, etag = read_manifest(store)
        merged = merge(
            current,
            sources,
            planned_on,
            variants,
            samples,
            present=lambda ref: store.size(ref.uri) == ref.size,
        )
        if merged.manifest is None:
            return Published(manifest=current, published=False, conflicts=merged.conflicts)
        data = merged.manifest.to_json()
        try:
            if etag is None:
                store.write(MANIFEST_KEY, data, if_none_match=True)
            else:
                store.write(MANIFEST_KEY, data, if_match=etag)
            return Published(manifest=merged.manifest, published=True, conflicts=merged.conflicts)
        except PreconditionFailed:
            time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
    raise StoreError(
        f"could not publish {store.uri}/{MANIFEST_KEY}: lost the race {PUBLISH_ATTEMPTS} times"
    )


# --- planning --------------------------------------------------------------------------


def _identity(target: TargetSpec) -> dict[str, str]:
    if target.work_pool:
        # Its pool decides (tasks.dispatch): this machine need not even have the package.
        return {"package": target.ep, "version": "decided on the pool", "pool": target.work_pool}
    with ep_errors():
        return eps.load(target.ep).build_identity()


def plan_run(
    spec_path: Path,
    store_uri: str,
    models: list[str] | None = None,
    targets: list[str] | None = None,
    force: bool = False,
) -> RunPlan:
    """Load and check the spec, stage the sources and decide which pairs to compile.
    Raises BadInputError before anything compiles."""
    spec: FleetSpec = load_spec(spec_path)
    pairs = spec.pairs(models, targets)
    if not pairs:
        raise BadInputError("the selected models and targets form no pair to compile")
    store = open_store(store_uri)
    identities = {target.ep: _identity(target) for _, target in pairs}
    static_eps: dict[str, set[str]] = {}
    for model, target in pairs:
        needs_static = eps.load(target.ep).requires_static_shapes
        static_eps.setdefault(model.name, set()).update([target.ep] if needs_static else [])
    manifest, _ = read_manifest(store)
    published = manifest.models if manifest else {}
    sources: dict[str, SourceEntry] = {}
    samples: dict[str, SamplesRef | None] = {}
    problems: dict[str, str] = {}
    for name, static in static_eps.items():
        model = spec.model(name)
        sources[name], prepared = stage_source(
            model, resolve_source(spec_path, model.source), static, store
        )
        before = published.get(name)
        try:
            samples[name] = stage_samples(
                model,
                resolve_source(spec_path, model.samples) if model.samples else None,
                sources[name],
                prepared,
                before.samples if before and before.source == sources[name] else None,
                store,
            )
        except BadInputError:
            raise
        except EpfleetError as exc:
            samples[name], problems[name] = None, f"no golden samples: {exc}"
    planned = plan_pairs(
        pairs, sources, samples, problems, manifest, ort_version(), identities, force, store.size
    )
    return RunPlan(
        store=store_uri,
        sources=sources,
        pairs=planned,
        generation=manifest.generation if manifest else 0,
        published_sources={
            name: published[name].source if name in published else None for name in sources
        },
        samples=samples,
        published_samples={
            name: published[name].samples if name in published else None for name in sources
        },
    )
