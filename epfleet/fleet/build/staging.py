"""Staging a run's inputs: sources and golden samples into the store, and into a worker's cache.

``stage_source`` and ``stage_samples`` run when a fleet run plans: they check the files
and upload them content-addressed, once, through ``HeldUploads``: nothing is uploaded
until every model of the spec has passed its checks. ``fetch_verified`` and
``compile_job_for`` run on the machine that compiles: a file enters its cache only once
checked by sha256 and size.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, suppress
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import onnx
from pydantic import ValidationError

from epfleet.errors import BadInputError, IntegrityError, StoreError
from epfleet.fleet.build.input_memory import check_input_memory
from epfleet.fleet.build.verify import GoldenJob, golden_for
from epfleet.formats.keys import files_key, samples_key, source_key
from epfleet.formats.manifest import MODEL_FILE, ArtifactRef, PackageFile, SamplesRef, SourceEntry
from epfleet.formats.spec import ModelSpec
from epfleet.hashing import sha256_bytes, sha256_file
from epfleet.runtime.compiler import CompileJob
from epfleet.runtime.environments import RuntimeEnvironment
from epfleet.runtime.filesets import (
    LocalSet,
    check_external_data,
    file_set,
    hash_in_set,
    link_or_copy,
    open_in_set,
)
from epfleet.runtime.onnx_files import onnx_problem
from epfleet.runtime.requests import CompileRequest, RuntimeRef
from epfleet.runtime.samples import GOLDEN_VERSION
from epfleet.runtime.shapes import prepare_model, uses_external_data
from epfleet.settings import settings
from epfleet.stores import Store, open_store, split_uri
from epfleet.stores.local import local_path


def cache_dir() -> Path:
    """Worker-local scratch for fetched sources and fresh artifacts."""
    return settings().cache  # EPFLEET_CACHE


_T = TypeVar("_T")


class HeldUploads:
    """A fleet run's uploads, held back until every model of its spec has passed its checks
    (``release``), and the scratch their files are in, kept until then. A spec refused at
    its last model so puts nothing in the store, not even a new store's directory; and the
    worker cache's folders made for it are removed again (``scratch``, ``keep``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._scratch = ExitStack()
        self._pending: dict[str, tuple[Path, str]] = {}
        root = cache_dir()
        self._made = [d for d in (root / "downloads", root / "work", root) if not d.exists()]

    def __enter__(self) -> HeldUploads:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._scratch.close()
        if exc is not None:
            for folder in self._made:  # innermost first; another run's files keep it
                with suppress(OSError):
                    folder.rmdir()

    def keep(self, context: AbstractContextManager[_T]) -> _T:
        """Enter ``context`` (a download's scratch) until the uploads are done."""
        return self._scratch.enter_context(context)

    def scratch(self) -> Path:
        """A new folder in the worker cache, removed when the uploads are done."""
        made = tempfile.TemporaryDirectory(dir=_scratch_root())
        return Path(self._scratch.enter_context(made))

    def add(self, ref: ArtifactRef | SourceEntry, local: Path) -> None:
        """Upload ``local`` under ``ref``'s content-addressed key at ``release``, unless
        the store holds it already."""
        if ref.uri not in self._pending and self.store.size(ref.uri) != ref.size:
            self._pending[ref.uri] = (local, ref.sha256)

    def release(self) -> None:
        """Upload what was held: every model has passed its checks."""
        for key, (local, sha256) in self._pending.items():
            self.store.upload(key, local, sha256)
        self._pending.clear()


TEMP_GRACE_SECONDS = 3600.0
"""Temp files and scratch in the worker cache older than this are a killed run's."""
IN_USE_SECONDS = 300.0
"""A cached file used more recently than this is never evicted (a concurrent run's)."""

# The worker cache: sources/<sha256>.<ext> (fetched sources and golden samples, with
# .<name>.*.part/.tmp while they download), sources/<digest>/ (a multi-file source's
# files), work/prepared/<key>.onnx or <key>/ (sources with their shapes fixed, beside
# links to their data files), work/variants/<model>.<target>.*/ (one compile's scratch),
# work/tmp*/ and downloads/tmp*/ (planning's scratch).
_KEPT = ("sources", "work/prepared")
_SCRATCH = ("work/variants", "downloads")


def _newest_mtime(path: Path) -> float:
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for parent, dirs, files in os.walk(path):
            for name in dirs + files:
                with suppress(OSError):
                    newest = max(newest, os.lstat(os.path.join(parent, name)).st_mtime)
    return newest


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def tidy_cache(now: float | None = None) -> None:
    """Remove what killed compiles left in the worker cache (temp files and scratch older
    than ``TEMP_GRACE_SECONDS``), then evict the least recently used sources and prepared
    sources until the cache's kept files fit ``EPFLEET_CACHE_MAX_BYTES``. Best effort:
    a file another process removes first is skipped."""
    root = cache_dir()
    if not root.is_dir():
        return
    env = settings()
    now = time.time() if now is None else now
    leftovers = [e for d in _KEPT for e in _entries(root / d) if e.name.startswith(".")]
    leftovers += [e for d in _SCRATCH for e in _entries(root / d)]
    leftovers += [e for e in _entries(root / "work") if e.name.startswith("tmp")]
    for entry in leftovers:
        try:
            if now - _newest_mtime(entry) > TEMP_GRACE_SECONDS:
                _remove(entry)
        except OSError:
            pass
    kept: list[tuple[float, int, Path]] = []
    for entry in (e for d in _KEPT for e in _entries(root / d)):
        try:
            stat = entry.lstat()
            if entry.name.startswith(".") or entry.is_symlink():
                continue
            if entry.is_file():
                kept.append((stat.st_mtime, stat.st_size, entry))
            elif entry.is_dir():  # a multi-file source; its mtime is touched when used
                kept.append((stat.st_mtime, _tree_size(entry), entry))
        except OSError:
            continue
    total = sum(size for _, size, _ in kept)
    for mtime, size, entry in sorted(kept):
        if total <= env.cache_max_bytes:
            break
        if now - mtime < IN_USE_SECONDS:
            continue
        _remove(entry)
        total -= size


def _tree_size(directory: Path) -> int:
    total = 0
    for parent, _, files in os.walk(directory):
        for name in files:
            with suppress(OSError):
                total += os.lstat(os.path.join(parent, name)).st_size
    return total


def _entries(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError:  # absent, or not a directory
        return []


def resolve_source(spec_path: Path, source: str) -> str:
    """A model's source as a URI or absolute path; relative paths are relative to the spec."""
    if "://" in source:
        return source
    return str((spec_path.parent / source).resolve())


def is_local(uri: str) -> bool:
    return uri.startswith("file://") or "://" not in uri


@contextmanager
def local_source(uri: str, field: str = "source", folders: bool = False) -> Iterator[Path]:
    """A local path holding the file at ``uri``: the file itself (or, with ``folders``, the
    folder), or a temporary download. Errors name ``field``, the spec field that gave it."""
    if is_local(uri):
        path = local_path(uri)
        if not (path.is_file() or (folders and path.is_dir())):
            raise BadInputError(f"{field} {uri} does not exist")
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
            raise BadInputError(f"{field} {uri} cannot be fetched: {exc}") from None
        yield dest


class PreparedSource:
    """A staged source's graph with its input shapes fixed (its weights left in their
    files), and where its external data files are (``root / location``)."""

    def __init__(self, model: onnx.ModelProto, root: Path | None, data_files: list[str]):
        self.model, self.root, self.data_files = model, root, data_files

    def save(self, directory: Path, name: str) -> Path:
        """The prepared graph at ``directory / name`` beside links to its data files."""
        for location in self.data_files:
            assert self.root is not None
            link_or_copy(self.root / location, directory / location)
        path = directory / name
        onnx.save(self.model, str(path))
        return path


def stage_source(
    model: ModelSpec, uri: str, static_eps: set[str], uploads: HeldUploads
) -> tuple[SourceEntry, PreparedSource]:
    """Check the source's files, hash them, check that its input_shapes apply (and leave
    every input static when an EP in ``static_eps`` needs that, and one sample of inputs
    fits in memory: ``check_input_memory``), and only then hold them to upload
    content-addressed, once (``uploads``): the main file under sources/, the others
    (external data, a folder's other files) under files/. Every file is read as a regular
    file in the model's folder, never through a symbolic link (``open_in_set``), and the
    main file must look like ONNX from its first bytes before it is parsed. Also returns
    the source with its shapes fixed."""
    where = f"models[{model.name}].source"
    path = uploads.keep(local_source(uri, where, folders=is_local(uri)))
    files = file_set(path, None, model.model_file, where) if path.is_dir() else None
    main = files or LocalSet(
        root=path.parent, model_file=MODEL_FILE, disk_names={MODEL_FILE: path.name}
    )
    loaded = _load_graph(main, where, uri)
    if not is_local(uri) and uses_external_data(loaded):
        raise BadInputError(
            f"{where} {uri} keeps tensors in external data files; a source with "
            "external data must be a local path or file:// URI (its files beside it)"
        )
    if files is None:
        files = file_set(path, loaded, model.model_file, where)
    data_files = check_external_data(files, loaded, where)
    try:
        prepare_model(
            loaded, model.input_shapes, bool(static_eps), " and ".join(sorted(static_eps))
        )
        check_input_memory(loaded)  # before the golden samples try to allocate them
    except ValueError as exc:
        raise BadInputError(f"models[{model.name}] ({uri}): {exc}") from None
    sha256, size = hash_in_set(files, files.model_file, where)
    others = []
    for other in files.others:
        other_sha256, other_size = hash_in_set(files, other, where)
        others.append(
            PackageFile(
                path=other, uri=files_key(other_sha256), sha256=other_sha256, size=other_size
            )
        )
    try:
        entry = SourceEntry(
            uri=source_key(sha256),
            sha256=sha256,
            size=size,
            model_file=files.model_file,
            files=others,
            input_shapes=model.input_shapes,
        )
    except ValidationError as exc:
        problem = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise BadInputError(f"{where} {uri}: {problem}") from None
    # Every file has passed its checks: nothing of a refused source reaches the store.
    uploads.add(entry, files.path_of(files.model_file))
    for file in others:
        uploads.add(file, files.path_of(file.path))
    return entry, PreparedSource(loaded, files.root if data_files else None, data_files)


def check_local_source(model: ModelSpec, uri: str) -> None:
    """Refuse a local source that is missing, or a file that does not look like ONNX from
    its first bytes, before any model of the spec is staged: a refused spec leaves nothing
    in the store (not even a new store's directory). Remote sources and folders are
    checked whole when staged."""
    if not is_local(uri):
        return
    where = f"models[{model.name}].source"
    path = local_path(uri)
    if path.is_dir():
        return
    if not path.is_file():
        raise BadInputError(f"{where} {uri} does not exist")
    with open(path, "rb") as file:
        problem = onnx_problem(file)
    if problem is not None:
        raise BadInputError(f"{where} {uri} is not an ONNX model: {problem}")


def _load_graph(main: LocalSet, where: str, uri: str) -> onnx.ModelProto:
    """The main file's graph, without its external data, once its first bytes say it is
    ONNX (``onnx_problem``): a file that is not is refused before it is read whole."""
    with open_in_set(main, main.model_file, where) as file:
        problem = onnx_problem(file)
        if problem is not None:
            raise BadInputError(f"{where} {uri} is not an ONNX model: {problem}")
        file.seek(0)
        try:
            return onnx.load_model_from_string(file.read())
        except Exception as exc:
            raise BadInputError(f"{where} {uri} is not an ONNX model: {exc}") from None


def stage_samples(
    model: ModelSpec,
    samples_uri: str | None,
    source: SourceEntry,
    prepared: PreparedSource,
    published: SamplesRef | None,
    uploads: HeldUploads,
    set_uris: dict[str, str] | None = None,
) -> SamplesRef:
    """The model's golden samples: the spec's sample inputs (or seeded generated ones) and
    the source's outputs for them on the CPU EP, held to upload content-addressed, with the
    further input sets of ``set_uris`` (by name: calibration, verification) the task metric
    is judged on. Reused from the manifest while what made them is unchanged, so reference
    outputs do not drift with the machine or ORT version that plans. EpfleetError when the
    source does not run on the CPU EP; BadInputError for a samples file that does not fit
    the model."""
    with ExitStack() as stack:
        samples_path = (
            stack.enter_context(local_source(samples_uri, f"models[{model.name}].samples"))
            if samples_uri
            else None
        )
        set_paths = {
            name: stack.enter_context(local_source(uri, f"models[{model.name}].{name}"))
            for name, uri in (set_uris or {}).items()
        }
        samples_sha = sha256_file(samples_path)[0] if samples_path else None
        made_of: list[object] = [GOLDEN_VERSION, source.digest, source.input_shapes, samples_sha]
        if set_paths:  # only then: goldens without sets keep their basis
            made_of.append({name: sha256_file(path)[0] for name, path in set_paths.items()})
        basis = sha256_bytes(json.dumps(made_of).encode())
        if (
            published is not None
            and published.basis == basis
            and uploads.store.size(published.uri) == published.size
        ):
            return published
        scratch = uploads.scratch()
        golden = scratch / "golden.npz"
        prepared_path = prepared.save(scratch, "source.onnx")
        job = GoldenJob(
            source_path=str(prepared_path),
            input_shapes=source.input_shapes,
            samples_path=str(samples_path) if samples_path else None,
            dest=str(golden),
            sets={name: str(path) for name, path in set_paths.items()},
            sets_dest=str(scratch / "input-sets.npz"),
        )
        try:
            count = golden_for(job)
        except BadInputError as exc:
            if set_uris:  # the error names its file
                raise BadInputError(f"models[{model.name}]: {exc}") from None
            raise BadInputError(f"models[{model.name}].samples {samples_uri}: {exc}") from None
        golden_ref = held_sample_file(golden, uploads)
        metric_inputs = None
        if (scratch / "input-sets.npz").exists():
            metric_inputs = held_sample_file(scratch / "input-sets.npz", uploads)
    return SamplesRef(
        uri=golden_ref.uri,
        sha256=golden_ref.sha256,
        size=golden_ref.size,
        count=count,
        basis=basis,
        metric_inputs=metric_inputs,
    )


def held_sample_file(path: Path, uploads: HeldUploads) -> ArtifactRef:
    """``path`` held to upload under samples/, content-addressed."""
    sha256, size = sha256_file(path)
    ref = ArtifactRef(uri=samples_key(sha256), sha256=sha256, size=size)
    uploads.add(ref, path)
    return ref


def _scratch_root() -> Path:
    root = cache_dir() / "work"
    root.mkdir(parents=True, exist_ok=True)
    return root


def fetch_verified(store: Store, key: str, sha256: str, size: int) -> Path:
    """``key`` in this worker's content-addressed cache, downloaded and checked by sha256
    and size before it is used (a bad download never enters the cache)."""
    path = cache_dir() / "sources" / f"{sha256}{Path(key).suffix}"
    if path.exists() and path.stat().st_size == size:
        with suppress(OSError):
            os.utime(path)  # recently used: evicted last (tidy_cache)
        return path
    scratch = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.part")
    try:
        _download_checked(store, key, sha256, size, scratch)
        os.replace(scratch, path)
    finally:
        scratch.unlink(missing_ok=True)
    return path


def _download_checked(store: Store, key: str, sha256: str, size: int, dest: Path) -> None:
    store.download(key, dest)
    got = sha256_file(dest)
    if got != (sha256, size):
        raise IntegrityError(
            f"{store.uri}/{key} has sha256 {got[0]} ({got[1]} bytes), "
            f"expected {sha256} ({size} bytes)"
        )


def fetch_source(store: Store, request: CompileRequest) -> Path:
    """The request's source in this worker's cache: its main file, in a directory (one per
    source digest) that holds its other files at their paths. Each file is checked by
    sha256 and size; the directory enters the cache whole, in one rename."""
    if not request.source_files:
        return fetch_verified(
            store, request.source_key, request.source_main_sha256, request.source_size
        )
    folder = cache_dir() / "sources" / request.source_sha256
    wanted = [(request.source_model_file, request.source_size)]
    wanted += [(f.path, f.size) for f in request.source_files]
    if _complete(folder, wanted):
        with suppress(OSError):
            os.utime(folder)  # recently used: evicted last (tidy_cache)
        return folder / request.source_model_file
    scratch = folder.with_name(f".{folder.name}.{os.getpid()}.{threading.get_ident()}.part")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        main = scratch / request.source_model_file
        main.parent.mkdir(parents=True)
        _download_checked(
            store, request.source_key, request.source_main_sha256, request.source_size, main
        )
        for file in request.source_files:
            (scratch / file.path).parent.mkdir(parents=True, exist_ok=True)
            _download_checked(store, file.uri, file.sha256, file.size, scratch / file.path)
        if folder.exists() and not _complete(folder, wanted):
            shutil.rmtree(folder, ignore_errors=True)  # a damaged copy
        try:
            os.rename(scratch, folder)
        except OSError:  # another worker fetched it first
            if not _complete(folder, wanted):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder / request.source_model_file


def _complete(folder: Path, wanted: list[tuple[str, int]]) -> bool:
    """Whether ``folder`` holds each (path, size) (its files were checked when they came)."""
    try:
        return all((folder / path).stat().st_size == size for path, size in wanted)
    except OSError:
        return False


def runtime_environment(runtime: RuntimeRef) -> RuntimeEnvironment:
    """The runtime's environment on this host, built into the worker cache the first time
    (``EPFLEET_RUNTIME_WHEELS``: from that wheel directory). Every machine that builds one
    (the compile host, a work pool's or a Dask cluster's workers, handed the requirements
    by a flow run's parameters) installs only what its own EPFLEET_RUNTIME_PACKAGES allows:
    BadInputError naming the runtime otherwise."""
    from epfleet.runtime.environments import (
        ENVIRONMENTS,
        allowed_packages,
        ensure_environment,
        refused_packages,
    )

    allowed = allowed_packages(settings().runtime_packages)
    refused = refused_packages(runtime.requirements, allowed)
    if refused:
        raise BadInputError(
            f"runtime {runtime.name!r}: {', '.join(refused)} is not onnxruntime or an EP "
            f"package (allowed on this machine: {', '.join(sorted(allowed))}); others need "
            "EPFLEET_RUNTIME_PACKAGES here"
        )
    return ensure_environment(
        runtime.name, runtime.requirements, cache_dir() / ENVIRONMENTS, settings().runtime_wheels
    )


def runtime_site(request: CompileRequest) -> str | None:
    """Where the pair's workers load ONNX Runtime from: its runtime environment, or None
    for the host's own."""
    return runtime_environment(request.runtime).site if request.runtime else None


def built_with(ep: str, runtime: RuntimeRef | None) -> tuple[str, dict[str, str]]:
    """The onnxruntime version and the EP's build identity a pair builds with: its runtime
    environment's (named, with the environment's key), or this host's. Raises
    MissingExtraError when this host lacks the EP's package (its module reads it)."""
    import eps
    from epfleet import ort_version

    identity = eps.load(ep).build_identity()
    if runtime is None:
        return ort_version(), identity
    environment = runtime_environment(runtime)
    version = environment.version_of(identity["package"])
    if version is None:
        raise BadInputError(
            f"runtime {runtime.name!r} installs no {identity['package']}, which {ep} needs: "
            f"add it to the runtime's requirements"
        )
    built = {
        **identity,
        "version": version,
        "runtime": runtime.name,
        "environment": environment.key,
    }
    return environment.onnxruntime, built


def compile_job_for(request: CompileRequest, store: Store) -> CompileJob:
    """The job a compile worker runs for one planned pair, with the source (and the
    calibration inputs of an integer precision) cached locally."""
    source = fetch_source(store, request)
    calibration = request.quantize.calibration if request.quantize else None
    calibration_path = (
        fetch_verified(store, calibration.uri, calibration.sha256, calibration.size)
        if calibration is not None and request.integer
        else None
    )
    return CompileJob(
        request=request,
        source_path=str(source),
        workdir=str(cache_dir() / "work"),
        calibration_path=str(calibration_path) if calibration_path else None,
    )
