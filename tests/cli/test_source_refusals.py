"""A model's source is read safely: its main file and every external data file are opened
as regular files (never through a symbolic link) in directories inside the model's folder,
and nothing of the source is uploaded until all of it has passed its checks. A file that is
not ONNX is refused from its first bytes. Run through ``epfleet.cli.app.main`` in this
process (every case is refused while planning, before a Prefect API would start), on a
local store and on S3 (moto over HTTP)."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from epfleet.cli.app import main
from epfleet.fleet.planning.plan import plan_run
from epfleet.hashing import sha256_bytes, sha256_file
from epfleet.stores import open_store
from tests.support.hand_made_fleet import make_fleet
from tests.support.specs import CPU_TARGET, tiny_models, write_spec

pytestmark = pytest.mark.fast

SECRET = b"root:x:0:0:root:/root:/bin/bash\n"


@pytest.fixture(params=["local", "s3"])
def store_uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "store")
    return str(request.getfixturevalue("s3_store_uri"))


def save_with_external_data(path: Path, location: str = "w.bin") -> None:
    """y = x @ W, W (16 KiB) in the external data file ``location`` beside ``path``."""
    weights = numpy_helper.from_array(np.ones((64, 64), np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])],
        [weights],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (path.parent / location).parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model, str(path), save_as_external_data=True, location=location, size_threshold=0
    )


def secret_outside(tmp_path: Path) -> Path:
    outside = tmp_path / "elsewhere"
    outside.mkdir(exist_ok=True)
    (outside / "passwd").write_bytes(SECRET)
    return outside / "passwd"


def refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, source: str, uri: str) -> str:
    """epfleet compile of ``source`` on ``uri``: exit 2 and the error, and nothing staged."""
    spec = write_spec(tmp_path, [{"name": "m", "source": source}], [CPU_TARGET])
    code = main(["compile", str(spec), "--store", uri])
    err = "\n".join(
        line for line in capsys.readouterr().err.splitlines() if line.startswith("epfleet")
    )
    assert code == 2, err
    staged = open_store(uri).list_keys("")
    assert not [key for key in staged if key.startswith(("sources/", "files/"))], staged
    return err


def test_an_external_data_file_linked_to_a_host_file_is_refused_and_nothing_is_uploaded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, store_uri: str
) -> None:
    save_with_external_data(tmp_path / "linked" / "m.onnx")
    (tmp_path / "linked" / "w.bin").unlink()
    (tmp_path / "linked" / "w.bin").symlink_to(secret_outside(tmp_path))
    err = refused(capsys, tmp_path, "linked/m.onnx", store_uri)
    assert f"models[m].source: {tmp_path / 'linked' / 'w.bin'} is a symbolic link" in err
    assert sha256_bytes(SECRET) not in " ".join(open_store(store_uri).list_keys(""))


def test_an_external_data_file_in_a_linked_directory_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, store_uri: str
) -> None:
    save_with_external_data(tmp_path / "model" / "m.onnx", location="data/w.bin")
    os.rename(tmp_path / "model" / "data", tmp_path / "data-elsewhere")
    (tmp_path / "model" / "data").symlink_to(tmp_path / "data-elsewhere")
    err = refused(capsys, tmp_path, "model/m.onnx", store_uri)
    assert "models[m].source: data/w.bin lies in" in err
    assert "outside the model's folder" in err


def test_a_folders_main_file_linked_inside_the_folder_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, store_uri: str
) -> None:
    save_with_external_data(tmp_path / "folder" / "real.onnx")
    (tmp_path / "folder" / "model.onnx").symlink_to(tmp_path / "folder" / "real.onnx")
    err = refused(capsys, tmp_path, "folder", store_uri)
    assert f"{tmp_path / 'folder' / 'model.onnx'} is a symbolic link" in err


def test_a_file_that_is_not_onnx_is_refused_from_its_first_bytes(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, store_uri: str
) -> None:
    (tmp_path / "notes.onnx").write_bytes(SECRET)
    err = refused(capsys, tmp_path, "notes.onnx", store_uri)
    assert "models[m].source" in err and "notes.onnx is not an ONNX model: field" in err


def test_a_2_gb_sparse_file_is_refused_without_being_read(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, store_uri: str
) -> None:
    with open(tmp_path / "sparse.onnx", "wb") as sparse:
        sparse.truncate(2_100_000_000)
    tracemalloc.start()
    try:
        err = refused(capsys, tmp_path, "sparse.onnx", store_uri)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "sparse.onnx is not an ONNX model: no protobuf field at byte 0" in err
    assert peak < 100_000_000, f"{peak:,} bytes allocated refusing it"


def test_a_source_with_its_external_data_in_its_folder_is_staged_whole(
    tmp_path: Path, store_uri: str
) -> None:
    """The control: the same model with its data file in place plans and is uploaded."""
    save_with_external_data(tmp_path / "good" / "m.onnx")
    spec = write_spec(tmp_path, [{"name": "m", "source": "good/m.onnx"}], [CPU_TARGET])
    plan = plan_run(spec, store_uri)
    assert len(plan.to_compile) == 1
    data_sha256, _ = sha256_file(tmp_path / "good" / "w.bin")
    assert f"files/{data_sha256}" in open_store(store_uri).list_keys("files/")


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ({"source": "missing.onnx"}, "models[m].source"),
        ({"source": "notes.onnx"}, "is not an ONNX model"),
        ({"targets": [{"name": "t", "ep": "NopeExecutionProvider"}]}, "unknown execution"),
        ({"input_shapes": {"nope": [1, 3]}}, "input_shapes names 'nope'"),
        ({"samples": "notes.npz"}, "models[m].samples"),
    ],
    ids=["missing", "not-onnx", "unknown-ep", "no-such-input", "bad-samples"],
)
def test_a_refused_spec_leaves_no_store_behind(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    model_dir: Path,
    bad: dict[str, object],
    said: str,
) -> None:
    """A good model beside a bad one (or a bad target): the spec is refused before the good
    one is staged, and the new store's directory is never made (nor sources/, samples/),
    nor anything in the worker cache."""
    (tmp_path / "notes.onnx").write_bytes(SECRET)
    (tmp_path / "notes.npz").write_bytes(SECRET)
    cache = Path(os.environ["EPFLEET_CACHE"])
    before = sorted(cache.rglob("*"))
    good = tiny_models(model_dir)[0]
    targets = bad.pop("targets", [CPU_TARGET])
    models = [good, {**good, "name": "m", **bad}]
    spec = write_spec(tmp_path, models, targets)  # type: ignore[arg-type]
    store = tmp_path / "new-store"
    assert main(["compile", str(spec), "--store", str(store)]) == 2
    assert said in capsys.readouterr().err
    assert not store.exists()
    assert sorted(cache.rglob("*")) == before


def test_a_store_of_an_unknown_scheme_leaves_nothing_anywhere(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir)[:1], [CPU_TARGET])
    monkeypatch.chdir(tmp_path)
    cache = Path(os.environ["EPFLEET_CACHE"])
    before = sorted(tmp_path.rglob("*")), sorted(cache.rglob("*"))
    assert main(["compile", str(spec), "--store", "gs://bucket/fleet"]) == 2
    assert "unknown scheme 'gs'" in capsys.readouterr().err
    assert (sorted(tmp_path.rglob("*")), sorted(cache.rglob("*"))) == before


def test_a_source_missing_from_s3_leaves_nothing_in_the_worker_cache(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, model_dir: Path, s3_store_uri: str
) -> None:
    good = tiny_models(model_dir)[0]
    models = [good, {**good, "name": "m", "source": f"{s3_store_uri}/nowhere/m.onnx"}]
    spec = write_spec(tmp_path, models, [CPU_TARGET])  # type: ignore[arg-type]
    cache = Path(os.environ["EPFLEET_CACHE"])
    before = sorted(cache.rglob("*"))
    assert main(["compile", str(spec), "--store", str(tmp_path / "store")]) == 2
    assert "models[m].source" in capsys.readouterr().err
    assert sorted(cache.rglob("*")) == before
    assert not (tmp_path / "store").exists()


def test_a_sync_from_a_store_that_is_not_there_makes_no_cache(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    cache = tmp_path / "device"
    code = main(["sync", "--store", str(tmp_path / "nowhere"), "--cache", str(cache)])
    assert code == 2 and "does not exist" in capsys.readouterr().err
    assert not cache.exists()


@pytest.mark.parametrize(
    ("root", "said", "code"),
    [
        (None, "no trusted root to verify", 2),
        ("missing.json", "missing.json: cannot read it", 2),
        ("notes.json", "is not valid TUF root metadata", 2),
        ("other/root.json", "not signed by the trusted keys", 1),
    ],
)
def test_a_first_sync_with_its_trust_root_refused_makes_no_cache(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    root: str | None,
    said: str,
    code: int,
) -> None:
    """A signed store, and no root to trust it with, or one that cannot be read or is no
    root: refused (exit 2) before anything is made; another store's root: its metadata is
    rejected (exit 1, as for any sync) and the cache made for it removed. The right root
    then syncs."""
    fleet = make_fleet(str(tmp_path / "store"), tmp_path)
    (tmp_path / "notes.json").write_bytes(b'{"signed": {"_type": "root"}}')
    (tmp_path / "another").mkdir()  # another store's root: the store's metadata refuses it
    other = make_fleet(str(tmp_path / "other-store"), tmp_path / "another")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "root.json").write_bytes(other.root.read_bytes())
    cache = tmp_path / "device"
    argv = ["sync", "--store", fleet.uri, "--cache", str(cache), "--device-id", "dev-1"]
    given = ["--trust-root", str(tmp_path / root)] if root else []
    assert main([*argv, *given]) == code
    assert said in capsys.readouterr().err
    assert not cache.exists()
    assert main([*argv, "--trust-root", str(fleet.root)]) == 0
    assert (cache / "manifest.json").is_file()
