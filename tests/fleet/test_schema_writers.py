"""Writers over a manifest of a newer schema: a
compile, a publish, ``trust refresh`` and gc by an older epfleet are refused with one line
naming both versions and the fix, and leave every byte of the store as it was; readers
(``manifest show``) still read it. Local directory stores; the signed one made by
``epfleet trust init`` and signed, as a newer publisher would, with its online key.
Run through ``epfleet.cli.app.main`` in this process: every case is refused before a
Prefect API would be needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.errors import BadInputError, StoreError
from epfleet.fleet.publishing.publish import read_in_force, update_manifest
from epfleet.formats.manifest import Manifest
from epfleet.formats.schema_version import SCHEMA_VERSION
from epfleet.lifecycle.gc import collect
from epfleet.stores import open_store
from epfleet.trust.keys import file_uri
from epfleet.trust.repository import publish_trust
from tests.support.specs import CPU_TARGET, tiny_models, write_spec
from tests.support.trust_helpers import make_trusted_store, online_key

pytestmark = pytest.mark.fast

REFUSAL = (
    f"the manifest declares schema 1.9, newer than this epfleet writes ({SCHEMA_VERSION}): "
    "upgrade epfleet on the compile host"
)


def newer_document() -> Manifest:
    """A manifest a newer publisher wrote (what this epfleet can hold of it)."""
    source = {"uri": "sources/a.onnx", "sha256": "a" * 64, "size": 1}
    manifest = Manifest.model_validate({"generation": 5, "models": {"m": {"source": source}}})
    return manifest.model_copy(update={"schema_version": "1.9"})


def store_bytes(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    err = capsys.readouterr().err.splitlines()
    # compile's first progress line ("epfleet: planning SPEC against STORE") is not an error
    said = [line for line in err if line.startswith("epfleet") and "planning " not in line[:18]]
    return code, "\n".join(said)


@pytest.fixture
def unsigned_newer(tmp_path: Path) -> Path:
    directory = tmp_path / "store"
    directory.mkdir()
    document = json.loads(newer_document().to_json())
    document["models"]["m"]["licence"] = "MIT"  # a field this epfleet does not know
    (directory / "manifest.json").write_text(json.dumps(document))
    return directory


@pytest.fixture
def signed_newer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "signed"
    directory.mkdir()
    keys = tmp_path / "keys"
    make_trusted_store(directory, keys)
    publish_trust(open_store(str(directory)), online_key(keys), lambda _: newer_document())
    (directory / "manifest.json").write_bytes(newer_document().to_json())
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", file_uri(keys / "online.pem"))
    return directory


def test_a_compile_over_a_newer_unsigned_store_is_refused_and_changes_nothing(
    capsys: pytest.CaptureFixture[str], unsigned_newer: Path, tmp_path: Path, model_dir: Path
) -> None:
    before = store_bytes(unsigned_newer)
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    code, err = run(capsys, "compile", str(spec), "--store", str(unsigned_newer))
    assert code == 2, err
    assert len(err.splitlines()) == 1 and REFUSAL in err, err
    assert store_bytes(unsigned_newer) == before


def test_a_publish_or_trust_init_over_a_newer_unsigned_store_is_refused(
    unsigned_newer: Path, tmp_path: Path
) -> None:
    before = store_bytes(unsigned_newer)
    store = open_store(str(unsigned_newer))
    taken = read_in_force(store).manifest  # a reader takes it, without the unknown key
    assert taken is not None and taken.schema_version == "1.9" and "m" in taken.models
    with pytest.raises(BadInputError, match="newer than this epfleet writes"):
        update_manifest(store, lambda current: current)
    with pytest.raises(BadInputError, match="newer than this epfleet writes"):
        collect(store, delete=True, grace_hours=0)
    with pytest.raises(StoreError, match="newer than this epfleet writes"):
        make_trusted_store(store, tmp_path / "keys")  # epfleet trust init
    assert store_bytes(unsigned_newer) == before


def test_writers_over_a_newer_signed_store_are_refused_and_change_nothing(
    capsys: pytest.CaptureFixture[str], signed_newer: Path, tmp_path: Path, model_dir: Path
) -> None:
    before = store_bytes(signed_newer)
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    for argv in (
        ["compile", str(spec), "--store", str(signed_newer)],
        ["trust", "refresh", "--store", str(signed_newer)],
        ["gc", "--store", str(signed_newer), "--delete", "--grace", "0"],
    ):
        code, err = run(capsys, *argv)
        assert code == 2, (argv, err)
        assert len(err.splitlines()) == 1 and REFUSAL in err, (argv, err)
        assert store_bytes(signed_newer) == before, argv
    store = open_store(str(signed_newer))
    with pytest.raises(BadInputError, match="newer than this epfleet writes"):
        update_manifest(store, lambda current: current)
    assert store_bytes(signed_newer) == before
    assert main(["manifest", "show", "--store", str(signed_newer), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)  # a reader reads it
    assert shown["schema_version"] == "1.9" and list(shown["models"]) == ["m"]
