"""Multi-file models published by hand for device tests: a small model with external data in
a GenAI-like folder, its CPU variant uploaded file by file, a device's sync of it and the
checks of what the cache holds."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import eps
from epfleet import ort_version
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport, ModelReport
from epfleet.formats.keys import files_key, source_key, variant_key
from epfleet.formats.manifest import (
    ArtifactRef,
    Manifest,
    ModelEntry,
    PackageFile,
    SourceEntry,
    VariantEntry,
)
from epfleet.hashing import sha256_file
from epfleet.stores import Store
from tests.support.trust_helpers import provisioned_root, publish_signed

CPU = "CPUExecutionProvider"
TARGET = "x86-cpu"
SIDECARS = {
    "genai_config.json": b'{"model": {"decoder": {"filename": "model.onnx"}}}\n',
    "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}\n',
    "tokenizer/vocab.txt": b"hello\nworld\n",
}


def weights(seed: int, rows: int = 64, cols: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)


def write_folder(
    folder: Path, w: np.ndarray, *, stamp: bool, extra: dict[str, bytes], main: str
) -> None:
    """``folder``: the main file ``main`` (Y = X @ W, W in ``main``.data beside it) and the
    sidecars; with ``stamp``, the CPU EP's compatibility string in its metadata (a CPU
    variant)."""
    folder.mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, w.shape[0]])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, w.shape[1]])],
        initializer=[numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = folder / main
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{path.name}.data",
        size_threshold=256,
    )
    if stamp:
        string = eps.load(CPU).generate_compatibility_string(path)
        assert string is not None
        model = onnx.load(str(path), load_external_data=False)
        helper.set_model_props(model, {f"ep_compatibility_info.{CPU}": string})
        onnx.save_model(model, str(path))  # the graph alone: its data file is unchanged
    for name, data in {**SIDECARS, **extra}.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def upload_set(
    store: Store, folder: Path, main_key: Callable[[str], str], model_file: str
) -> tuple[ArtifactRef, list[PackageFile]]:
    """The folder's files in the store under the contract's keys: the main file under
    ``main_key(sha256)``, the others under ``files/<sha256>``."""
    main = folder / model_file
    sha, size = sha256_file(main)
    store.upload(main_key(sha), main, sha)
    ref = ArtifactRef(uri=main_key(sha), sha256=sha, size=size)
    files = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p != main):
        digest, _ = sha256_file(path)
        store.upload(files_key(digest), path, digest)
        relative = path.relative_to(folder).as_posix()
        files.append(
            PackageFile(
                path=relative, uri=files_key(digest), sha256=digest, size=path.stat().st_size
            )
        )
    return ref, files


def publish(
    store: Store,
    work: Path,
    model: str,
    *,
    seed: int = 0,
    variant: bool = True,
    extra: dict[str, bytes] | None = None,
    model_file: str = "model.onnx",
) -> ModelEntry:
    """A model entry whose source and CPU variant are multi-file folders, uploaded."""
    w = weights(seed)
    source_dir, variant_dir = work / f"{model}-{seed}-src", work / f"{model}-{seed}-cpu"
    write_folder(source_dir, w, stamp=False, extra=extra or {}, main=model_file)
    main, files = upload_set(store, source_dir, source_key, model_file)
    source = SourceEntry(
        uri=main.uri, sha256=main.sha256, size=main.size, model_file=model_file, files=files
    )
    entry = ModelEntry(source=source)
    if variant:
        write_folder(variant_dir, w, stamp=True, extra=extra or {}, main=model_file)
        artifact, vfiles = upload_set(
            store, variant_dir, lambda s: variant_key(model, TARGET, s), model_file
        )
        string = eps.load(CPU).generate_compatibility_string(variant_dir / model_file)
        entry.variants[TARGET] = VariantEntry(
            ep=CPU,
            device="cpu",
            compatibility_string=string,
            artifact=artifact,
            model_file=model_file,
            files=vfiles,
            ort_version=ort_version(),
            compiled_at=datetime.now(timezone.utc),
            status="ok",
            source_sha256=source.digest,
            fingerprint=f"by-hand-{seed}",
        )
    return entry


def put_manifest(store: Store, models: dict[str, ModelEntry], generation: int) -> None:
    publish_signed(store, Manifest(generation=generation, models=models))


def run_sync(store: str, cache: Path, **policy: object) -> DeviceReport:
    return sync(
        store,
        cache,
        SyncPolicy(**policy),  # type: ignore[arg-type]
        device="test-device",
        trust_root=provisioned_root(store),
    )


def one(report: DeviceReport, model: str) -> ModelReport:
    return next(m for m in report.models if m.model == model)


def variant_dir(cache: Path, model: str, name: str) -> Path:
    return cache / "models" / model / name


def assert_same_files(folder: Path, installed: Path) -> None:
    """``installed`` holds exactly ``folder``'s files, byte for byte."""
    want = {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }
    got = {
        p.relative_to(installed).as_posix(): p.read_bytes()
        for p in installed.rglob("*")
        if p.is_file()
    }
    assert got == want


def assert_runs(cache: Path, model: str, variant: str, w: np.ndarray) -> None:
    """ORT's model package selects ``variant`` and runs it: Y = X @ W, from its data file."""
    context = ort.ModelPackageContext(str(cache))
    chosen = context.select_component(model, ort.ModelPackageOptions(ort.SessionOptions()))
    assert chosen.get_selected_variant_name() == variant
    session = chosen.create_session()
    x = np.arange(w.shape[0], dtype=np.float32)[None, :] / w.shape[0]
    [y] = session.run(None, {"X": x})
    np.testing.assert_allclose(y, x @ w, rtol=1e-4, atol=1e-4)


def no_leftovers(cache: Path) -> None:
    """No assembly directory and no partial download left behind."""
    scratch = cache / ".epfleet" / "scratch"
    assert not scratch.exists() or not any(scratch.iterdir())
    partial = cache / ".epfleet" / "partial"
    assert not partial.exists() or not any(partial.iterdir())
