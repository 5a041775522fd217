"""Multi-file sources and variants, with real compiles: an ONNX model with external data
and a GenAI-style model folder, compiled for the CPU EP and for QNN HTP (context beside
the model), published to a local store and to S3 (moto); refusals; gc of files/."""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from epfleet import RECIPE_VERSION
from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.errors import BadInputError, IntegrityError
from epfleet.fleet.build.staging import cache_dir, fetch_source, tidy_cache
from epfleet.fleet.build.variant import build_variant
from epfleet.fleet.planning.plan import plan_run
from epfleet.fleet.publishing.merge_rules import merge
from epfleet.fleet.publishing.publish import publish, read_manifest, update_manifest
from epfleet.fleet.publishing.rules import to_publish
from epfleet.fleet.runs.outcomes import PairOutcome, ok_outcome, outcome_of_failure
from epfleet.formats.keys import files_key, listing_key, signature_key
from epfleet.formats.manifest import (
    ArtifactRef,
    Manifest,
    ModelEntry,
    PackageFile,
    SourceEntry,
    VariantEntry,
)
from epfleet.hashing import sha256_bytes, sha256_file
from epfleet.lifecycle.costs import costs
from epfleet.lifecycle.gc import collect, kind_of, needed_keys, pinned_prefixes
from epfleet.runtime.requests import CompileRequest, fingerprinted
from epfleet.stores import MANIFEST_KEY, Store, open_store
from eps import cpu
from eps.base import Layout
from tests.support.specs import write_spec

pytestmark = pytest.mark.slow

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
SEED = "5eed" * 8

HTP = {
    "backend_type": "htp",
    "enable_htp_fp16_precision": "1",
    "htp_arch": "75",
    "soc_model": "57",
}
CPU = {"name": "cpu", "ep": "CPUExecutionProvider"}
SIDE_FILES = {
    "genai_config.json": b'{"model": {"decoder": {"filename": "model.onnx"}}}\n',
    "tokenizer.json": b'{"version": "1.0", "vocab": {"a": 0, "b": 1}}\n',
    "tokenizer/x.txt": b"nested sidecar\n",
}


def dense_model(seed: int = 0) -> onnx.ModelProto:
    """x[1, 64] -> relu(x @ W + B): 16 KiB of weights, which HTP compiles whole."""
    rng = np.random.default_rng(seed)
    weights = numpy_helper.from_array(rng.uniform(-1, 1, (64, 64)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.uniform(-1, 1, 64).astype(np.float32), "B")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "W"], ["y"]),
            helper.make_node("Add", ["y", "B"], ["z"]),
            helper.make_node("Relu", ["z"], ["out"]),
        ],
        "dense",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 64])],
        [weights, bias],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def save_split(path: Path, seed: int = 0, location: str | None = None) -> None:
    """The model at ``path`` with W (and not B) in the external data file ``location``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        dense_model(seed),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location or f"{path.name}.data",
        size_threshold=1024,
    )


def genai_folder(root: Path) -> Path:
    for path, data in SIDE_FILES.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    save_split(root / "model.onnx")
    return root


def compile_and_publish(spec: Path, store_uri: str) -> tuple[Manifest, list[PairOutcome]]:
    """A fleet run without Prefect: plan, build each pair, publish (as the CLI does)."""
    plan = plan_run(spec, store_uri)
    store = open_store(store_uri)
    outcomes = []
    for pair in plan.to_compile:
        try:
            outcomes.append(ok_outcome(pair.request, build_variant(pair.request, store, 1)))
        except Exception as exc:
            outcomes.append(outcome_of_failure(pair.request, exc))
    variants = {(m, t): entry for m, t, entry in to_publish(plan, outcomes)}
    publish(store, plan.sources, plan.published_sources, variants, plan.model_facts)
    manifest, _ = read_manifest(store)
    assert manifest is not None
    return manifest, outcomes


def download_variant(store: Store, manifest: Manifest, model: str, target: str, to: Path) -> Path:
    """The variant's files into ``to`` at their paths, each checked; its main file."""
    variant = manifest.models[model].variants[target]
    assert variant.artifact is not None
    main = to / variant.model_file
    for ref, path in [(variant.artifact, main), *((f, to / f.path) for f in variant.files)]:
        path.parent.mkdir(parents=True, exist_ok=True)
        store.download(ref.uri, path)
        assert sha256_file(path) == (ref.sha256, ref.size), ref.uri
    return main


def variants_of(manifest: Manifest, model: str, target: str) -> list[PackageFile]:
    return manifest.models[model].variants[target].files


def run(path: Path) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.linspace(-1, 1, 64, dtype=np.float32).reshape(1, 64)
    return session.run(None, {"x": x})[0]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_model_with_external_data_compiles_for_cpu_and_publishes_its_files(
    tmp_path: Path, where: str, request: pytest.FixtureRequest
) -> None:
    save_split(tmp_path / "src" / "dense.onnx")
    spec = write_spec(tmp_path, [{"name": "dense", "source": "src/dense.onnx"}], [CPU])
    uri = request.getfixturevalue("s3_store_uri") if where == "s3" else str(tmp_path / "store")
    manifest, outcomes = compile_and_publish(spec, uri)
    assert [o.result.status for o in outcomes] == ["ok"], outcomes[0].result.error
    store = open_store(uri)
    source = manifest.models["dense"].source
    data_sha, data_size = sha256_file(tmp_path / "src" / "dense.onnx.data")
    assert source.model_file == "model.onnx"
    assert [(f.path, f.uri, f.sha256, f.size) for f in source.files] == [
        ("dense.onnx.data", files_key(data_sha), data_sha, data_size)
    ]
    variant = manifest.models["dense"].variants["cpu"]
    assert variant.status == "ok" and variant.artifact is not None
    assert variant.source_sha256 == source.digest != source.sha256
    # The optimiser left the weights alone: the variant refers to the source's data file,
    # carried over, stored once.
    assert variant.files == source.files
    assert variant.verification is not None and variant.verification.status == "passed"
    for ref in [source, *source.files, variant.artifact, *variant.files]:
        assert store.size(ref.uri) == ref.size, ref.uri
    main = download_variant(store, manifest, "dense", "cpu", tmp_path / "device")
    graph = onnx.load(str(main), load_external_data=False)
    props = {p.key: p.value for p in graph.metadata_props}
    assert props["ep_compatibility_info.CPUExecutionProvider"] == variant.compatibility_string
    assert props["epfleet.source_sha256"] == source.digest
    assert any(  # the weights stayed outside the main file
        t.data_location == TensorProto.EXTERNAL for t in graph.graph.initializer
    )
    expected = run(tmp_path / "src" / "dense.onnx")
    np.testing.assert_allclose(run(main), expected, rtol=1e-5, atol=1e-6)

    # Planned again: up to date, nothing compiles.
    assert [p.action for p in plan_run(spec, uri).pairs] == ["skip"]


def test_cpu_build_writes_its_own_data_file_when_its_model_would_be_large(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_split(tmp_path / "src" / "model.onnx")
    layout = Layout(external_initializers="model.onnx.data")
    out = tmp_path / "out"
    out.mkdir()
    cpu.EP.build(tmp_path / "src" / "model.onnx", out / "model.onnx", {}, "cpu", "all", layout)
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False)
    assert [t.name for t in graph.graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx"]  # refers to the source's
    monkeypatch.setattr(cpu, "INLINE_MAX_BYTES", 0)
    (out / "model.onnx").unlink()
    cpu.EP.build(tmp_path / "src" / "model.onnx", out / "model.onnx", {}, "cpu", "all", layout)
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "model.onnx.data"]
    expected = run(tmp_path / "src" / "model.onnx")
    np.testing.assert_allclose(run(out / "model.onnx"), expected, rtol=1e-5, atol=1e-6)


def test_qnn_htp_context_beside_the_model(tmp_path: Path) -> None:
    save_split(tmp_path / "src" / "dense.onnx")
    target = {
        "name": "htp",
        "ep": "QNNExecutionProvider",
        "provider_options": HTP,
        "embed_context": False,
    }
    spec = write_spec(tmp_path, [{"name": "dense", "source": "src/dense.onnx"}], [target])
    uri = str(tmp_path / "store")
    manifest, outcomes = compile_and_publish(spec, uri)
    assert [o.result.status for o in outcomes] == ["ok"], outcomes[0].result.error
    variant = manifest.models["dense"].variants["htp"]
    assert variant.verification is not None and variant.verification.status == "passed"
    contexts = [f for f in variant.files if f.path.endswith(".bin")]
    assert len(contexts) == 1 and contexts[0].size > 0
    main = download_variant(open_store(uri), manifest, "dense", "htp", tmp_path / "device")
    nodes = onnx.load(str(main), load_external_data=False).graph.node
    refs = [
        (helper.get_attribute_value(a) for a in n.attribute if a.name == "ep_cache_context")
        for n in nodes
        if n.op_type == "EPContext"
    ]
    assert [next(r) for r in refs] == [contexts[0].path.encode()]


def test_a_genai_folder_carries_its_sidecars_into_every_variant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EPFLEET_EMBED_CONTEXT_MAX_BYTES", "1KiB")  # contexts beside the model
    genai_folder(tmp_path / "phi")
    htp = {"name": "htp", "ep": "QNNExecutionProvider", "provider_options": HTP}
    spec = write_spec(tmp_path, [{"name": "phi", "source": "phi"}], [CPU, htp])
    uri = str(tmp_path / "store")
    manifest, outcomes = compile_and_publish(spec, uri)
    assert [o.result.status for o in outcomes] == ["ok", "ok"], [o.result.error for o in outcomes]
    store = open_store(uri)
    source = manifest.models["phi"].source
    source_files = {f.path: f for f in source.files}
    assert set(source_files) == {*SIDE_FILES, "model.onnx.data"}
    for target in ("cpu", "htp"):
        variant = manifest.models["phi"].variants[target]
        listed = {f.path: f for f in variant.files}
        directory = tmp_path / "device" / target
        download_variant(store, manifest, "phi", target, directory)
        for path, data in SIDE_FILES.items():
            assert (directory / path).read_bytes() == data  # byte for byte
            assert listed[path].uri == source_files[path].uri  # stored once
    assert [f.path for f in variants_of(manifest, "phi", "htp") if f.path.endswith(".bin")]
    sidecar_keys = {f.uri for f in source.files if f.path in SIDE_FILES}
    stored = {o.key for o in store.list_objects("files/")}
    assert sidecar_keys <= stored
    assert len([k for k in stored if k in sidecar_keys]) == len(SIDE_FILES)
    # Costs: every file of the source and of each variant; the store's total once per key.
    data = costs(store, manifest)
    variants = manifest.models["phi"].variants
    assert data.models[0].source == source.total_size > source.size
    assert data.models[0].variants == {t: v.total_size for t, v in variants.items()}
    assert data.totals.referenced == sum(store.size(k) or 0 for k in needed_keys(manifest))


def test_a_source_file_named_like_a_file_the_ep_writes_fails_the_pair(tmp_path: Path) -> None:
    folder = genai_folder(tmp_path / "phi")
    (folder / "model_qnn.bin").write_bytes(b"not a context")
    target = {
        "name": "htp",
        "ep": "QNNExecutionProvider",
        "provider_options": HTP,
        "embed_context": False,
    }
    spec = write_spec(tmp_path, [{"name": "phi", "source": "phi"}], [target])
    manifest, outcomes = compile_and_publish(spec, str(tmp_path / "store"))
    assert [o.result.status for o in outcomes] == ["failed"]
    assert "wrote 'model_qnn.bin' for 'phi', which is also a file of its source" in str(
        outcomes[0].result.error
    )
    assert manifest.models["phi"].variants["htp"].status == "failed"


def test_refusals_name_what_is_wrong_and_publish_nothing(tmp_path: Path, s3_bucket: str) -> None:
    uri = str(tmp_path / "store")

    def refused(source: str, match: str, **model: str) -> None:
        spec = write_spec(tmp_path, [{"name": "m", "source": source, **model}], [CPU])
        with pytest.raises(BadInputError, match=match):
            plan_run(spec, uri)
        assert open_store(uri).size(MANIFEST_KEY) is None

    save_split(tmp_path / "gone" / "m.onnx")
    (tmp_path / "gone" / "m.onnx.data").unlink()
    refused("gone/m.onnx", r"models\[m\].*external data files are missing: m.onnx.data")

    two = tmp_path / "two"
    save_split(two / "a.onnx")
    save_split(two / "b.onnx", seed=1)
    refused("two", r"no model.onnx and 2 .onnx files \(a.onnx, b.onnx\); name the main one")
    refused("two", r"model_file 'c.onnx' is not in the folder", model_file="c.onnx")

    outside = tmp_path / "linked"
    genai_folder(outside)
    (tmp_path / "secret.txt").write_text("x")
    (outside / "secret.txt").symlink_to(tmp_path / "secret.txt")
    refused("linked", r"secret.txt is a symbolic link to .*secret.txt, outside the folder")

    odd = genai_folder(tmp_path / "odd")
    (odd / "my notes.txt").write_text("x")
    refused("odd", r"file names must be .*: my notes.txt")

    s3 = open_store(f"s3://{s3_bucket}/inputs")
    save_split(tmp_path / "s3src" / "model.onnx")
    s3.upload(
        "model.onnx",
        tmp_path / "s3src" / "model.onnx",
        sha256_file(tmp_path / "s3src" / "model.onnx")[0],
    )
    refused(
        f"s3://{s3_bucket}/inputs/model.onnx",
        r"keeps tensors in external data files; a source with external data must be a local",
    )


def test_gc_collects_unreferenced_files_and_keeps_referenced_and_pinned_ones(
    tmp_path: Path,
) -> None:
    save_split(tmp_path / "src" / "dense.onnx")
    spec = write_spec(tmp_path, [{"name": "dense", "source": "src/dense.onnx"}], [CPU])
    uri = str(tmp_path / "store")
    manifest, _ = compile_and_publish(spec, uri)
    store = open_store(uri)
    variant = manifest.models["dense"].variants["cpu"]
    assert variant.artifact is not None and variant.digest is not None
    listing = listing_key(variant.artifact.uri)
    assert json.loads(store.read(listing).data)[0]["path"] == "dense.onnx.data"  # type: ignore[union-attr]
    orphan = files_key("a" * 64)
    store.write(orphan, b"orphan")
    referenced = {f.uri for f in [*manifest.models["dense"].source.files, *variant.files]}

    later = datetime.now(timezone.utc) + timedelta(days=3)
    dry = collect(store, now=later)
    assert {c.key for c in dry.plan.candidates if c.kind == "file"} == {orphan}
    young = collect(store, delete=True)  # within the grace period: kept
    assert orphan not in young.removed and store.size(orphan) is not None
    done = collect(store, delete=True, now=later)
    assert orphan in done.removed and store.size(orphan) is None
    for key in [*referenced, listing]:
        assert store.size(key) is not None, key

    # A real device sync runs the variant; its report (uploaded now) names the main file.
    report = sync(uri, tmp_path / "device", SyncPolicy(recompile=False), device="dev-1")
    (ran,) = report.models
    assert ran.action == "downloaded" and report.report_uploaded
    assert ran.artifact_sha256 == variant.artifact.sha256
    # named from the set's digest, which no store key shows (the old name rule missed it)
    assert variant.digest != variant.artifact.sha256
    assert ran.variant == f"cpu-{variant.digest[:12]}"
    assert pinned_prefixes([report]) == {variant.artifact.uri.removesuffix("onnx"): "dev-1"}
    again = sync(uri, tmp_path / "device", SyncPolicy(recompile=False), device="dev-1")
    assert [(m.action, m.artifact_sha256) for m in again.models] == [
        ("kept", variant.artifact.sha256)
    ]

    # The manifest drops the model: gc keeps what the device runs while its report is recent.
    dropped = Manifest(generation=manifest.generation + 1, published_at=later - timedelta(days=2))
    update_manifest(store, lambda current: dropped)  # a publish (the store is signed)
    runs = {variant.artifact.uri, listing, *(f.uri for f in variant.files)}
    signature = signature_key(variant.artifact.uri)  # the variant's model signature goes with it
    runs |= {signature} if store.size(signature) is not None else set()
    assert variant.files and {f.uri for f in variant.files} <= referenced  # shared with source
    pinned = collect(store, delete=True, now=later)
    assert pinned.errors == [] and pinned.warnings == []
    kept = {k.key: k.reason for k in pinned.plan.kept}
    for key in runs:
        assert "device dev-1 reported" in kept[key], key
        assert store.size(key) is not None, key
    assert manifest.models["dense"].source.uri in pinned.removed  # the source is not pinned
    assert store.size(manifest.models["dense"].source.uri) is None

    # Once the report is older than the retention window, they go too.
    aged = collect(store, delete=True, now=later, retention_days=1)
    assert set(aged.removed) == runs
    for key in runs:
        assert store.size(key) is None, key
    assert not [o.key for o in store.list_objects("", hidden=True) if kind_of(o.key)]


def test_a_worker_fetches_a_source_set_whole_and_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    genai_folder(tmp_path / "phi")
    spec = write_spec(tmp_path, [{"name": "phi", "source": "phi"}], [CPU])
    uri = str(tmp_path / "store")
    request = plan_run(spec, uri).pairs[0].request
    store = open_store(uri)
    sidecar = next(f for f in request.source_files if f.path == "tokenizer/x.txt")
    store.write(sidecar.uri, b"tampered sidecar")
    with pytest.raises(
        IntegrityError, match=rf"{sidecar.uri} has sha256 .* expected {sidecar.sha256}"
    ):
        fetch_source(store, request)
    folder = cache_dir() / "sources" / request.source_sha256
    assert not folder.exists()
    assert not [p for p in (cache_dir() / "sources").iterdir() if p.is_dir()]
    store.upload(sidecar.uri, tmp_path / "phi" / "tokenizer" / "x.txt", sidecar.sha256)
    main = fetch_source(store, request)
    assert main == folder / "model.onnx"
    for f in request.source_files:
        assert sha256_file(folder / f.path) == (f.sha256, f.size)
    # The cache evicts a source set whole when over its bound (and not in use).
    monkeypatch.setenv("EPFLEET_CACHE_MAX_BYTES", "0")
    tidy_cache(now=time.time() + 7200)
    assert not folder.exists()


def test_single_file_pairs_keep_their_fingerprints() -> None:
    request = CompileRequest(
        model="m",
        target="t",
        ep="CPUExecutionProvider",
        device="cpu",
        provider_options={},
        input_shapes={"x": [1, 64]},
        source_key=f"sources/{'ab' * 32}.onnx",
        source_sha256="ab" * 32,
        source_size=10,
        fingerprint="",
    )
    before = {  # the payload of fingerprints published before multi-file layouts
        "recipe": RECIPE_VERSION,
        "source_sha256": "ab" * 32,
        "input_shapes": {"x": [1, 64]},
        "ep": "CPUExecutionProvider",
        "device": "cpu",
        "provider_options": {},
        "graph_optimization": "basic",
        "min_coverage": None,
        "verify": True,
        "tolerance": request.tolerance,
        "abs_tolerance": request.abs_tolerance,
        "samples": None,
        "ort_version": "1.32.0",
        "build": {"package": "onnxruntime"},
    }
    old = sha256_bytes(json.dumps(before, sort_keys=True).encode())
    identity = {"package": "onnxruntime"}
    assert fingerprinted(request, "1.32.0", identity).fingerprint == old
    for layout in ({"embed_context": False}, {"external_initializers": True}):
        changed = request.model_copy(update=layout)
        assert fingerprinted(changed, "1.32.0", identity).fingerprint != old


def test_a_rebuild_alike_keeps_the_published_files_only_while_all_are_stored() -> None:
    source = SourceEntry(uri=f"sources/{'1' * 64}.onnx", sha256="1" * 64, size=1)

    def build(digit: str) -> VariantEntry:
        sha = digit * 64
        return VariantEntry(
            ep="QNNExecutionProvider",
            device="npu",
            compatibility_string="v2:6",
            artifact=ArtifactRef(uri=f"variants/m/t/{sha}.onnx", sha256=sha, size=1),
            files=[PackageFile(path="model_qnn.bin", uri=files_key(sha), sha256=sha, size=2)],
            ort_version="1.32.0",
            compiled_at=datetime.now(timezone.utc),
            status="ok",
            source_sha256=source.sha256,
            fingerprint="fp",
        )

    published, rebuilt = build("2"), build("3")
    current = Manifest(models={"m": ModelEntry(source=source, variants={"t": published})})
    kept = merge(
        current,
        {"m": source},
        {"m": source},
        {("m", "t"): rebuilt},
        present=bool,
        now=NOW,
        seed=SEED,
    )
    assert kept.manifest is None  # the published build stays, its files with it
    gone = published.files[0].uri
    replaced = merge(
        current,
        {"m": source},
        {"m": source},
        {("m", "t"): rebuilt},
        present=lambda ref: ref.uri != gone,
        now=NOW,
        seed=SEED,
    )
    assert replaced.manifest is not None
    assert replaced.manifest.models["m"].variants["t"].files == rebuilt.files
