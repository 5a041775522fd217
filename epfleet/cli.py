"""The ``epfleet`` command line: its app, entry point, exit codes and Ctrl-C handling.

Commands ``compile`` (``epfleet.cli_compile``), ``manifest show|schema``
(``epfleet.cli_manifest``), ``sync`` (``epfleet.cli_sync``), ``watch`` and ``serve``
(``epfleet.cli_serve``), ``trust`` (``epfleet.cli_trust``), ``gc`` and ``retire``
(``epfleet.cli_store``), and ``--version``; ``epfleet COMMAND --help`` shows each with
examples and exit codes (0 ok, 1 a pair or model failed or the store failed, 2 bad
input). Options come from type hints (cyclopts, ``epfleet.cli_options``). The flow
files run by path (``python flows/runtime_watch.py ...``) call ``main`` with their
command.

Engine code, Prefect and the flows are imported inside each command, never at module
level: ``--help`` starts no Prefect, and the module-level import graph has no cycle
through this module (``tests/test_imports.py``).
"""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from cyclopts import App, CycloptsError, Parameter

from epfleet import RECIPE_VERSION, __version__, ort_version
from epfleet.cli_compile import compile_
from epfleet.cli_manifest import manifest_app
from epfleet.cli_options import cli_error, default_text
from epfleet.cli_serve import serve, watch
from epfleet.cli_store import gc, retire
from epfleet.cli_sync import sync
from epfleet.cli_trust import trust_app
from epfleet.errors import BadInputError, EpfleetError
from epfleet.settings import describe

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_INTERRUPTED = 128 + signal.SIGINT  # 130, as a shell reports a Ctrl-C

APP_HELP = """Keep a fleet of devices supplied with ONNX models compiled for the
execution provider each device really has.

For example:
  epfleet compile examples/fleet.yaml --store ./epfleet-store
  epfleet sync --store ./epfleet-store --cache ./epfleet-device
  epfleet COMMAND --help

Exit codes: 0 ok; 1 a pair or a model failed, or the store failed; 2 bad input;
130 interrupted (Ctrl-C).
"""


def _environment() -> str:
    lines = ["Environment (an empty variable counts as unset):"]
    for name, text in describe():
        lines += [
            f"  {name}",
            *textwrap.wrap(text, 76, initial_indent="    ", subsequent_indent="    "),
        ]
    return "\n".join(lines)


app = App(
    name="epfleet",
    help=APP_HELP + "\n" + _environment(),
    help_format="plaintext",
    version=lambda: f"epfleet {__version__} (onnxruntime {ort_version()}, recipe {RECIPE_VERSION})",
    default_parameter=Parameter(negative=(), show_default=default_text),
    suppress_keyboard_interrupt=False,  # main says "interrupted" (cyclopts exits silently)
)
app.command(compile_, name="compile")
app.command(manifest_app)
app.command(sync)
app.command(watch)
app.command(serve)
app.command(trust_app)
app.command(gc)
app.command(retire)


@app.default
def _no_command(*unknown: str) -> int:
    what = f"unknown command {unknown[0]!r}" if unknown else "a command is required"
    print(f"epfleet: error: {what} (epfleet --help)", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    """Run one command line; return its exit code."""
    try:
        result = app(
            sys.argv[1:] if argv is None else argv,
            exit_on_error=False,
            print_error=False,
            result_action="return_value",
        )
    except CycloptsError as exc:
        print(f"epfleet: error: {cli_error(exc)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BadInputError as exc:
        print(f"epfleet: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except EpfleetError as exc:
        print(f"epfleet: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:  # our handler's, or a Ctrl-C before it was installed
        _announce(_stop_message)
        return EXIT_INTERRUPTED
    return result if isinstance(result, int) else EXIT_OK


# Ctrl-C (SIGINT) and what it does: kill every worker at once (a worker that dies then
# was killed, not crashed: epfleet.isolated.interrupted), print one line, exit 130. A
# command that runs Prefect exits at once (os._exit): its flow engine, task threads and
# temporary API would otherwise retry, rerun and print tracebacks for minutes. Nothing is
# half-published that way: the manifest is replaced in one compare-and-swap (a rename
# or a conditional PUT), so it is either the old one or the new one; temp files left
# behind are removed by a later run. A plain `epfleet sync` unwinds instead (locks and
# temp files released by their `finally`), with a deadline. A second Ctrl-C exits at once.
_stopping = threading.Event()
_announced = threading.Lock()
_stop_message = "epfleet: interrupted"
UNWIND_SECONDS = 5.0


def _announce(message: str) -> None:
    if _announced.acquire(blocking=False):
        os.write(2, f"{message}\n".encode())  # not print: the handler may interrupt a print


def _exit_interrupted(message: str) -> None:
    from epfleet.isolated import release_semaphores

    release_semaphores()
    _announce(message)
    os._exit(EXIT_INTERRUPTED)


def _kill_prefect_server() -> None:
    server = sys.modules.get("prefect.server.api.server")
    if server is None:
        return
    try:
        for instance in list(server.SubprocessASGIServer._instances.values()):
            process = instance.server_process
            if process is not None:
                process.kill()
    except Exception:  # best effort: it is Prefect's
        pass


@contextmanager
def _interrupts(message: str, *, unwind: bool = False) -> Iterator[None]:
    """Handle Ctrl-C as above while the block runs (in the main thread only)."""
    global _stop_message
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if _stopping.is_set():
            _exit_interrupted(message)
        _stopping.set()
        from epfleet.isolated import kill_workers

        kill_workers()
        _kill_prefect_server()
        if not unwind:
            _exit_interrupted(message)
        deadline = threading.Timer(UNWIND_SECONDS, _exit_interrupted, (message,))
        deadline.daemon = True
        deadline.start()
        raise KeyboardInterrupt

    _stop_message = message
    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    sys.exit(main())
