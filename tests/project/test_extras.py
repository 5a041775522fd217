"""A part of epfleet that is a pip extra, asked for where it is not installed: the store
backend or the command names the extra to install (``epfleet.extras``), exit code 2.

Here boto3 or PyYAML is hidden in this process (``sys.modules["boto3"] = None`` makes its
import fail); a venv without the extras: tests/project/test_device_venv.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from epfleet.cli.app import command_named, main
from epfleet.cli.exit_codes import EXIT_BAD_INPUT
from epfleet.errors import BadInputError, MissingExtraError
from epfleet.extras import missing_extra
from epfleet.stores import open_store
from tests.support.hand_made_fleet import make_fleet

pytestmark = pytest.mark.fast


@pytest.fixture
def no_boto3(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3 and botocore not installed, as far as imports from here on can tell; epfleet's
    S3 backend not loaded (its modules are put back afterwards)."""
    for name in [m for m in sys.modules if m.startswith(("boto3", "botocore"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "boto3", None)
    monkeypatch.setitem(sys.modules, "botocore", None)
    for name in [m for m in sys.modules if m.startswith("epfleet.stores.s3")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.usefixtures("no_boto3")
def test_an_s3_store_without_boto3_names_the_extra(tmp_path: Path) -> None:
    with pytest.raises(MissingExtraError, match=r'pip install "epfleet\[s3\]"') as raised:
        open_store("s3://bucket/fleet")
    assert "s3://bucket/fleet" in str(raised.value)
    assert open_store(str(tmp_path / "store")).uri == (tmp_path / "store").as_uri()


@pytest.mark.usefixtures("no_boto3")
def test_a_command_on_an_s3_store_without_boto3_exits_2_naming_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["sync", "--store", "s3://bucket/fleet", "--cache", str(tmp_path / "device")])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert err.startswith("epfleet: error: store s3://bucket/fleet") and 'epfleet[s3]"' in err
    assert not (tmp_path / "device").exists()


@pytest.fixture
def no_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    """PyYAML (the host extra's spec reader) not installed; the spec reader not loaded."""
    for name in [m for m in sys.modules if m.startswith(("yaml", "epfleet.formats.spec_file"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "yaml", None)


@pytest.mark.usefixtures("no_yaml")
def test_retiring_by_name_needs_no_spec_reader_and_by_spec_names_the_host_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = make_fleet(str(tmp_path / "store"), tmp_path)
    common = ["--store", fleet.uri, "--trust-root", str(fleet.root)]
    assert main(["retire", "--model", "m", "--dry-run", *common]) == 0
    assert "would retire model m" in capsys.readouterr().out
    (tmp_path / "fleet.yaml").write_text("models: []\n")
    code = main(["retire", "--spec", str(tmp_path / "fleet.yaml"), "--unlisted", *common])
    err = capsys.readouterr().err
    assert code == EXIT_BAD_INPUT, err
    assert err.startswith("epfleet: error: epfleet retire needs epfleet's 'host' extra"), err
    assert 'pip install "epfleet[host]"' in err


def test_an_unknown_scheme_is_not_an_extra() -> None:
    with pytest.raises(BadInputError, match=r"unknown scheme 'gs'; known: file://, s3://") as e:
        open_store("gs://bucket/fleet")
    assert not isinstance(e.value, MissingExtraError)


def test_only_a_missing_module_of_an_extra_is_named() -> None:
    prefect = missing_extra(ModuleNotFoundError(name="prefect.flows"), "epfleet compile")
    assert str(prefect) == (
        "epfleet compile needs epfleet's 'host' extra, which this install does not have "
        '(no prefect module): pip install "epfleet[host]"'
    )
    assert missing_extra(ModuleNotFoundError(name="numpy"), "epfleet sync") is None
    assert missing_extra(ModuleNotFoundError(), "epfleet sync") is None


@pytest.mark.parametrize(
    ("tokens", "named"),
    [
        (["compile", "fleet.yaml", "--store", "s"], "epfleet compile"),
        (["sync", "--flow"], "epfleet sync"),
        (["rollout", "advance", "m"], "epfleet rollout advance"),
        (["--store", "s"], "epfleet"),
    ],
)
def test_the_command_is_named_as_typed(tokens: list[str], named: str) -> None:
    assert command_named(tokens) == named
