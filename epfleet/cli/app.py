"""The ``epfleet`` command line: its app, its entry point ``main`` and its exit codes.

Commands ``compile`` (``epfleet.cli.compile``), ``manifest show|schema``
(``epfleet.cli.manifest``), ``sync`` (``epfleet.cli.sync``), ``watch`` and ``serve``
(``epfleet.cli.serve``), ``trust`` (``epfleet.cli.trust``), ``gc`` and ``retire``
(``epfleet.cli.store``), ``verify-model`` (``epfleet.cli.verify_model``), ``rollout``
(``epfleet.cli.rollout``), and ``--version``;
``epfleet COMMAND --help`` shows each with examples and exit codes (0 ok, 1 a pair or
model failed or the store failed, 2 bad input); an error is printed with its control
characters escaped (it may quote a name from a spec or the store). Options come from type
hints (cyclopts, ``epfleet.cli.options``). The flow files run by path (``python
flows/runtime_watch.py ...``) call ``main`` with their command. Ctrl-C (exit 130) is handled by
``epfleet.cli.interrupts``.

Commands are registered by name ("module:function", cyclopts' lazy commands): a command
line imports the module of the command it runs and no other, so that a device's
``epfleet sync`` or ``epfleet --version`` loads neither the compile side nor its options
(tests/cli/test_light_commands.py). ``epfleet --help`` lists every command with the first
line of its help, so it imports them all. Engine code, Prefect and the flows are imported
inside each command, never at module level: ``--help`` starts no Prefect, and the
module-level import graph has no cycle through this module (``tests/project/test_imports.py``).
A command that needs an extra this install lacks (``epfleet compile`` without ``host``, a
device install) exits 2 naming the extra to install (``epfleet.extras``).
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

from cyclopts import App, CycloptsError, Parameter

from epfleet import RECIPE_VERSION, __version__, ort_version
from epfleet.cli.exit_codes import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK
from epfleet.cli.interrupts import announce_stopped
from epfleet.cli.options import cli_error, default_text, did_you_mean, unknown_command
from epfleet.errors import BadInputError, EpfleetError
from epfleet.extras import missing_extra
from epfleet.text import output_width, printable_lines, wrap

APP_HELP = """Keep a fleet of devices supplied with ONNX models compiled for the
execution provider each device really has."""

APP_EPILOGUE = """For example:
  epfleet compile examples/fleet.yaml --store ./epfleet-store
  epfleet sync --store ./epfleet-store --cache ./epfleet-device
  epfleet COMMAND --help

Exit codes: 0 ok; 1 a model failed to compile or sync, or the store failed;
2 bad input; 130 interrupted (Ctrl-C). --store defaults to ./epfleet-store.
The EPFLEET_* environment variables: docs/reference/settings.md."""

COMMANDS = {
    "compile": "epfleet.cli.compile:compile_",
    "manifest": "epfleet.cli.manifest:manifest_app",
    "sync": "epfleet.cli.sync:sync",
    "watch": "epfleet.cli.serve:watch",
    "serve": "epfleet.cli.serve:serve",
    "gc": "epfleet.cli.store:gc",
    "retire": "epfleet.cli.store:retire",
    "trust": "epfleet.cli.trust:trust_app",
    "rollout": "epfleet.cli.rollout:rollout_app",
    "device": "epfleet.cli.device:device_app",
    "verify-model": "epfleet.cli.verify_model:verify_model",
}
"""Each command's name and where it is defined: a function (its docstring is its help,
``epfleet.cli.options.command_help``) or an ``App`` of subcommands named as the command."""

SUBCOMMAND_APPS = ("manifest", "trust", "rollout", "device")

app = App(
    name="epfleet",
    help=APP_HELP,
    help_epilogue=APP_EPILOGUE,
    help_format="plaintext",
    version=lambda: (
        f"epfleet {__version__} (onnxruntime {ort_version()}, compile recipe {RECIPE_VERSION}: "
        "a new recipe recompiles every variant)"
    ),
    default_parameter=Parameter(negative=(), show_default=default_text),
    suppress_keyboard_interrupt=False,  # main says "interrupted" (cyclopts exits silently)
)
for name, where in COMMANDS.items():
    if name in SUBCOMMAND_APPS:  # an App brings its own settings
        app.command(where, name=name)
    else:
        app.command(where, name=name, help_epilogue="")  # the app's examples are the app's


@app.default
def _no_command(*unknown: Annotated[str, Parameter(show=False)]) -> int:
    what = "a command is required"
    if unknown:
        what = f"unknown command {unknown[0]!r}{did_you_mean(unknown[0], COMMANDS)}"
    _error(f"epfleet: error: {what} (epfleet --help)")
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    """Run one command line; return its exit code."""
    tokens = sys.argv[1:] if argv is None else argv
    if tokens[:1] and tokens[0] in app.help_flags:
        app.resolved_commands()  # the list of commands shows each one's help: import them
    try:
        result = app(
            tokens,
            exit_on_error=False,
            print_error=False,
            result_action="return_value",
        )
    except CycloptsError as exc:
        message = unknown_command(exc) or cli_error(exc)
        _error(f"epfleet: error: {printable_lines(message)}")
        return EXIT_BAD_INPUT
    except BadInputError as exc:
        _error(f"epfleet: error: {printable_lines(str(exc))}")
        return EXIT_BAD_INPUT
    except EpfleetError as exc:
        _error(f"epfleet: {printable_lines(str(exc))}")
        return EXIT_FAILED
    except ModuleNotFoundError as exc:  # a command of an extra this install lacks
        missing = missing_extra(exc, command_named(tokens))
        if missing is None:
            raise
        _error(f"epfleet: error: {missing}")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # our handler's, or a Ctrl-C before it was installed
        announce_stopped()
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout's reader went away (| head): quiet, as other tools
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    return result if isinstance(result, int) else EXIT_OK


def _error(text: str) -> None:
    """Print an error on stderr, its lines wrapped to the terminal's width."""
    print(wrap(text, output_width(sys.stderr)), file=sys.stderr)


def command_named(tokens: list[str]) -> str:
    """``epfleet COMMAND [SUBCOMMAND]`` as the command line names it, options left out."""
    words = ["epfleet"]
    for token in tokens[:2]:
        if token.startswith("-") or (len(words) > 1 and words[1] not in SUBCOMMAND_APPS):
            break
        words.append(token)
    return " ".join(words)


if __name__ == "__main__":
    sys.exit(main())
