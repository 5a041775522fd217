"""The `epfleet` command line in process: commands, help, version, options built from the
flows' pydantic models, and bad input refused with exit code 2 before anything runs."""

from __future__ import annotations

from typing import get_args

import pytest

from epfleet import __version__
from epfleet.cli.app import app, main
from epfleet.cli.exit_codes import EXIT_BAD_INPUT, EXIT_OK
from epfleet.cli.options import RunnerName
from epfleet.device.policy import SyncPolicy
from epfleet.fleet.runs.task_runners import TASK_RUNNERS

pytestmark = pytest.mark.fast

COMMANDS = [["compile"], ["manifest", "show"], ["manifest", "schema"], ["sync"], ["watch"]]
COMMANDS.append(["serve"])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == EXIT_OK and out.startswith(f"epfleet {__version__} (onnxruntime ")


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_command_has_help_with_examples_and_exit_codes(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(capsys, *command, "--help")
    assert code == EXIT_OK
    assert f"Usage: epfleet {' '.join(command)}" in out
    assert f"epfleet {' '.join(command)}" in out.split("For example:")[1]
    if command != ["manifest", "schema"]:
        assert "Exit codes: 0" in out


def test_top_level_help_lists_commands_exit_codes_and_where_the_environment_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--help")
    assert code == EXIT_OK
    for command in ("compile", "manifest", "sync", "watch", "serve", "--version"):
        assert command in out
    assert "Exit codes: 0 ok; 1" in out and "docs/reference/settings.md" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "a command is required"),
        (["nope"], "unknown command 'nope'"),
        (["synk"], "unknown command 'synk'; did you mean 'sync'?"),
        (["rollout", "stats"], "did you mean 'status'? (one of: status, advance, halt"),
        (["trust", "refesh"], "unknown command 'refesh'; did you mean 'refresh'? (one of: init"),
        (["manifest"], "manifest needs a command"),
        (["compile"], "SPEC requires an argument"),
        (["compile", "x.yaml", "--workers", "0"], "--workers must be from 1 to 64, got 0"),
        (["compile", "x.yaml", "--workers", "two"], "--workers"),
        (["compile", "x.yaml", "--task-runner", "ray"], 'Invalid value "ray" for --task-runner'),
        (["compile", "x.yaml", "--dask-address", "tcp://h:1"], "--dask-address needs"),
        (["manifest", "show", "--store", "ftp://h/x"], "unknown scheme 'ftp'"),
        (["sync", "--store", "s"], "--cache requires an argument"),
        (["sync", "--cache", "c", "--prefer", "npu,tpu"], "--prefer: Input should be"),
        (["sync", "--cache", "c", "--prefer", ","], "--prefer: Value error"),
        (["sync", "--cache", "c", "--models", "m"], "Did you mean --model?"),
    ],
)
def test_bad_input_exits_2_naming_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == EXIT_BAD_INPUT, err
    assert message in err and err.startswith("epfleet: error: ") and out == ""


def sync_policy(*argv: str) -> SyncPolicy:
    _, bound, *_ = app.parse_args(
        ["sync", "--cache", "c", *argv], exit_on_error=False, print_error=False
    )
    given = bound.arguments.get("policy")
    return SyncPolicy.model_validate(given.model_dump()) if given else SyncPolicy()


def test_sync_options_are_the_fields_of_the_flows_policy_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert sync_policy() == SyncPolicy()
    assert sync_policy(
        *("--model", "a", "--model", "b", "--no-recompile", "--prefer", "cpu, gpu", "--verify")
    ) == SyncPolicy(models=["a", "b"], recompile=False, prefer=["cpu", "gpu"], verify=True)
    assert sync_policy("--prefer", "gpu", "--prefer", "cpu").prefer == ["gpu", "cpu"]
    _, out, _ = run(capsys, "sync", "--help")
    for field in SyncPolicy.model_fields.values():  # a new field is an option with its text
        assert field.description and field.description.split()[0] in out


def test_the_task_runner_choices_are_the_runner_table() -> None:
    assert set(get_args(RunnerName)) == set(TASK_RUNNERS)


def test_manifest_show_without_a_manifest_is_bad_input(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(capsys, "manifest", "show", "--store", str(tmp_path))
    assert code == EXIT_BAD_INPUT and "no manifest at" in err
