"""What an operator sees when a run is refused: every check that can refuse a
compile (spec, EP packages, store, signer) runs before anything is staged or compiled,
with one line naming the fix; a sync against a store that is not there says so before
anything about trust roots; no command prints a traceback for bad input or a store that
cannot be reached. Run through ``epfleet.cli.app.main`` in this process (no Prefect
API: every case is refused before one would start), S3 on moto over HTTP."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.errors import MetadataRefused
from epfleet.fleet.planning.plan import plan_run
from epfleet.stores import open_store
from epfleet.trust.client import verify
from epfleet.trust.keys import file_uri
from epfleet.trust.repository import init_with_key_files
from tests.support.specs import CPU_TARGET, tiny_models, write_spec

pytestmark = pytest.mark.fast


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Exit code and epfleet's lines on stderr (the moto server in this process writes
    its own there); a traceback would be an exception raised out of main."""
    code = main(list(argv))
    err = capsys.readouterr().err.splitlines()
    return code, "\n".join(line for line in err if line.startswith("epfleet"))


@pytest.fixture
def signed_s3(s3_store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An S3 store after ``epfleet trust init`` with keys in tmp_path/keys, in a shell
    where EPFLEET_TRUST_SIGNER is not set (a new shell, as the issue found it)."""
    monkeypatch.delenv("EPFLEET_TRUST_SIGNER", raising=False)
    init_with_key_files(open_store(s3_store_uri), tmp_path / "keys", bins=16)
    return tmp_path / "keys"


def nothing_staged(store_uri: str) -> bool:
    return not any(k.startswith(("sources/", "variants/", "samples/")) for k in _keys(store_uri))


def _keys(store_uri: str) -> list[str]:
    return open_store(store_uri).list_keys("")


def without_progress(err: str) -> list[str]:
    """stderr's lines less compile's first progress line (``epfleet: planning SPEC against
    STORE``, printed before the spec is read): what remains is the error."""
    return [line for line in err.strip().splitlines() if not line.startswith("epfleet: planning ")]


@pytest.mark.parametrize(
    ("signer", "says"),
    [
        (None, "EPFLEET_TRUST_SIGNER is not set: set it to the online key's signer URI"),
        ("{keys}/online.pem", "is not a signer URI (EPFLEET_TRUST_SIGNER, --online-signer): "
         "write a key file as file2:{keys}/online.pem"),
        ("file2:{keys}/targets.pem", "holds key"),
        ("file2:{keys}/missing.pem", "cannot read private key {keys}/missing.pem"),
    ],
)  # fmt: skip
def test_a_signer_a_publish_would_refuse_is_refused_before_anything_compiles(
    capsys: pytest.CaptureFixture[str],
    signed_s3: Path,
    s3_store_uri: str,
    tmp_path: Path,
    model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    signer: str | None,
    says: str,
) -> None:
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    if signer is not None:
        monkeypatch.setenv("EPFLEET_TRUST_SIGNER", signer.format(keys=signed_s3))
    code, err = run(capsys, "compile", str(spec), "--store", s3_store_uri)
    assert code == 2, err
    line = "\n".join(without_progress(err))
    assert len(line.splitlines()) == 1, err  # one line, nothing compiled before it
    assert says.format(keys=signed_s3) in line
    assert nothing_staged(s3_store_uri)
    if signer and "targets" in signer:  # the key it holds is not the store's online key
        assert f"not {s3_store_uri}'s online key" in line


def test_the_online_key_signs(
    capsys: pytest.CaptureFixture[str],
    signed_s3: Path,
    s3_store_uri: str,
    tmp_path: Path,
    model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: with the signer trust init printed, the same run plans its pairs."""
    spec = write_spec(tmp_path, tiny_models(model_dir), [CPU_TARGET])
    monkeypatch.setenv("EPFLEET_TRUST_SIGNER", file_uri(signed_s3 / "online.pem"))
    plan = plan_run(spec, s3_store_uri)
    assert len(plan.to_compile) == 2 and not nothing_staged(s3_store_uri)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def unreachable(aws_env: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """An S3 endpoint nothing listens on, tried once."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    return "s3://fleet/x"


def test_sync_names_a_missing_local_store_before_trust(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "epfleet-stroe"
    code, err = run(capsys, "sync", "--store", str(missing), "--cache", str(tmp_path / "c"))
    assert code == 2, err
    assert f"store {missing.as_uri()} does not exist" in err
    assert "trust" not in err and "--allow-unsigned" not in err


def test_sync_names_a_missing_bucket_before_trust(
    capsys: pytest.CaptureFixture[str], aws_env: str, tmp_path: Path,
) -> None:  # fmt: skip
    code, err = run(capsys, "sync", "--store", "s3://no-such-bucket/f", "--cache", str(tmp_path))
    assert code == 2, err
    assert "bucket 'no-such-bucket' does not exist" in err
    assert "trusted root" not in err


def test_sync_names_an_unreachable_endpoint_before_trust(
    capsys: pytest.CaptureFixture[str], unreachable: str, tmp_path: Path,
) -> None:  # fmt: skip
    code, err = run(capsys, "sync", "--store", unreachable, "--cache", str(tmp_path / "c"))
    assert code == 1, err
    assert "cannot reach the S3 endpoint" in err and "trusted root" not in err


def test_sync_names_an_empty_s3_prefix_before_trust(
    capsys: pytest.CaptureFixture[str], s3_store_uri: str, tmp_path: Path,
) -> None:  # fmt: skip
    """A mistyped prefix in a bucket that exists: nothing is published there."""
    code, err = run(capsys, "sync", "--store", s3_store_uri, "--cache", str(tmp_path / "c"))
    assert code == 2, err
    assert f"store {s3_store_uri} has nothing published" in err and "check --store" in err
    assert "trusted root" not in err and "--allow-unsigned" not in err


def test_a_store_with_a_manifest_and_no_trusted_root_is_about_the_root(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The control: a store that has a manifest, and no root, is still about the root."""
    store = tmp_path / "store"
    store.mkdir()
    code, err = run(capsys, "sync", "--store", str(store), "--cache", str(tmp_path / "c"))
    assert code == 2 and "has nothing published" in err and "trusted root" not in err
    (store / "manifest.json").write_text("{}")
    code, err = run(capsys, "sync", "--store", str(store), "--cache", str(tmp_path / "c"))
    assert code == 2 and "no trusted root" in err


def test_a_provisioned_device_is_told_its_store_is_gone_not_to_run_trust_init(
    tmp_path: Path,
) -> None:
    """A device that trusts the store's root, synced against a store directory that is
    gone (mistyped, or moved): the refusal names the missing directory."""
    store = tmp_path / "store"
    root, _ = init_with_key_files(open_store(str(store)), tmp_path / "keys", bins=16)
    moved = tmp_path / "moved"
    store.rename(moved)
    trust_cache = tmp_path / "trust"
    trust_cache.mkdir()
    with pytest.raises(MetadataRefused) as refused:
        verify(open_store(str(store)), trust_cache, root.read_bytes(), None)
    assert f"store {store.as_uri()} does not exist (no directory {store})" in str(refused.value)
    assert "trust init" not in str(refused.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["compile", "{spec}", "--store", "{store}"],
        ["sync", "--store", "{store}", "--cache", "{tmp}/c"],
        ["manifest", "show", "--store", "{store}"],
        ["trust", "init", "--store", "{store}", "--keys", "{tmp}/keys"],
        ["gc", "--store", "{store}"],
    ],
)
def test_a_missing_bucket_is_one_line_and_exit_2_at_every_command(
    capsys: pytest.CaptureFixture[str],
    aws_env: str,
    fleet_spec: Path,
    tmp_path: Path,
    argv: list[str],
) -> None:
    store = "s3://no-such-bucket/f"
    filled = [a.format(spec=fleet_spec, store=store, tmp=tmp_path) for a in argv]
    code, err = run(capsys, *filled)
    assert code == 2, err
    endpoint = open_store(store).client.meta.endpoint_url  # type: ignore[attr-defined]
    assert without_progress(err) == [
        f"epfleet: error: store {store}: bucket 'no-such-bucket' does not exist at "
        f"{endpoint}; check the store URI and AWS_ENDPOINT_URL"
    ]
    assert not (tmp_path / "keys").exists()  # trust init wrote no key


@pytest.mark.parametrize(
    "argv",
    [
        ["compile", "{spec}", "--store", "{store}"],
        ["compile", "{spec}", "--store", "{store}", "--json", "--prune"],
        ["sync", "--store", "{store}", "--cache", "{tmp}/c", "--json"],
        ["sync", "--store", "{store}", "--cache", "{tmp}/c", "--allow-unsigned"],
        ["manifest", "show", "--store", "{store}"],
        ["manifest", "show", "--store", "{store}", "--json", "--costs"],
        ["gc", "--store", "{store}", "--delete", "--json"],
        ["retire", "--store", "{store}", "--model", "m"],
        ["trust", "status", "--store", "{store}"],
        ["trust", "refresh", "--store", "{store}"],
        ["watch", "{spec}", "--store", "{store}", "--dry-run"],
    ],
)
def test_no_traceback_for_an_unreachable_store(
    capsys: pytest.CaptureFixture[str], unreachable: str, fleet_spec: Path, tmp_path: Path,
    argv: list[str],
) -> None:  # fmt: skip
    filled = [a.format(spec=fleet_spec, store=unreachable, tmp=tmp_path) for a in argv]
    code, err = run(capsys, *filled)  # raising would be the traceback
    if "--allow-unsigned" in argv:  # offline: it keeps what it has, and says so
        assert code == 1 and "offline" in capsys.readouterr().out + err
        return
    assert code == 1, err
    assert "cannot reach the S3 endpoint" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["compile", "{spec}", "--store", "{file}/sub"],
        ["sync", "--store", "{file}/sub", "--cache", "{tmp}/c"],
        ["manifest", "show", "--store", "{file}/sub"],
        ["gc", "--store", "{file}/sub"],
        ["trust", "status", "--store", "{file}/sub"],
    ],
)
def test_a_store_under_a_file_is_bad_input(
    capsys: pytest.CaptureFixture[str], fleet_spec: Path, tmp_path: Path, argv: list[str]
) -> None:
    file = tmp_path / "a-file"
    file.write_text("not a directory")
    filled = [a.format(spec=fleet_spec, file=file, tmp=tmp_path) for a in argv]
    code, err = run(capsys, *filled)
    assert code == 2, err
    assert f"{file} is a file, not a directory" in err


def test_an_error_quoting_an_escape_code_prints_it_escaped(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, err = run(capsys, "manifest", "show", "--store", str(tmp_path / "no\x1b[2Jstore"))
    assert code == 2 and "no\\x1b[2Jstore" in err, err
    assert "\x1b" not in err
