"""The EPFLEET_* environment: one settings model, errors that name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from epfleet.errors import BadInputError
from epfleet.settings import Settings, describe, env_name, reset_settings, settings
from tests.support.paths import REPO

pytestmark = pytest.mark.fast

SETTINGS_PAGE = REPO / "docs" / "reference" / "settings.md"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in Settings.model_fields:
        monkeypatch.delenv(env_name(name), raising=False)
    return monkeypatch


def test_defaults_and_values(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    got = settings()
    assert got.cache == Path.home() / ".cache" / "epfleet"
    assert (got.device_id, got.task_runner, got.dask_address, got.dask_workers) == (
        None,
        "threads",
        None,
        2,
    )
    clean_env.setenv("EPFLEET_CACHE", str(tmp_path))
    clean_env.setenv("EPFLEET_DEVICE_ID", "line-3.cam_1")
    clean_env.setenv("EPFLEET_DASK_WORKERS", "4")
    clean_env.setenv("EPFLEET_DASK_ADDRESS", "")  # empty counts as unset
    got = settings()
    assert (got.cache, got.device_id, got.dask_workers, got.dask_address) == (
        tmp_path,
        "line-3.cam_1",
        4,
        None,
    )


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("EPFLEET_DASK_WORKERS", "two", "EPFLEET_DASK_WORKERS='two': Input should be a valid"),
        ("EPFLEET_DASK_WORKERS", "65", "EPFLEET_DASK_WORKERS='65': Input should be less"),
        ("EPFLEET_DEVICE_ID", "Line 3", "EPFLEET_DEVICE_ID='Line 3': String should match"),
    ],
)
def test_a_bad_value_names_the_variable(
    clean_env: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    clean_env.setenv(name, value)
    with pytest.raises(BadInputError, match=message):
        settings()


def test_every_variable_is_described_in_the_docs() -> None:
    page = SETTINGS_PAGE.read_text()
    for name, text in describe():
        assert name.startswith("EPFLEET_") and text, name
        assert f"`{name}`" in page, f"docs/reference/settings.md does not describe {name}"


def test_parsed_once_while_the_environment_stays(clean_env: pytest.MonkeyPatch) -> None:
    first = settings()
    assert settings() is first  # not parsed again
    clean_env.setenv("EPFLEET_DASK_WORKERS", "3")
    changed = settings()
    assert changed is not first and changed.dask_workers == 3
    assert settings() is changed
    clean_env.delenv("EPFLEET_DASK_WORKERS")
    assert settings().dask_workers == 2
    reset_settings()
    assert settings() is not first and settings() == first
    with pytest.raises(ValidationError):
        first.dask_workers = 5  # type: ignore[misc]  # shared: frozen
