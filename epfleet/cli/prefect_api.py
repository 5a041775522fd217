"""Prefect's temporary API for ``epfleet compile``: started early and quiet, dying with us.

Without PREFECT_API_URL a flow run starts Prefect's temporary API server (a ``python -m
uvicorn`` subprocess). The compile command starts it only when a run needs it (a work pool,
Dask, ``--prefect temporary``; otherwise it keeps the run to be recorded later), while its
compiles already run,
keeps its INFO lines off the terminal, reports why it did not come up (then the command
compiles without Prefect), and on Linux makes it die when this process is killed.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

PREFECT_DEFAULTS: dict[str, str] = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
"""epfleet's defaults for Prefect's settings, by variable: what the environment (or
Prefect's profile) sets wins. Applied where epfleet runs Prefect (``prefect_defaults``)
and in the environment of the temporary API server it starts, never written to
``os.environ``."""


@contextlib.contextmanager
def prefect_defaults() -> Iterator[None]:
    """``PREFECT_DEFAULTS`` in force within: a scoped Prefect settings context (Prefect's
    ``temporary_settings``), which the API server Prefect starts meanwhile inherits too
    (it passes the current settings to its subprocess)."""
    from prefect.settings import temporary_settings

    with temporary_settings(set_defaults=dict(PREFECT_DEFAULTS)):
        yield


def api_url_named() -> bool:
    """PREFECT_API_URL names a Prefect server (the environment, or Prefect's profile or
    settings files, or a Prefect settings context in this process). Importing Prefect's
    settings costs a second or more, so that is done only when the variable is unset and
    one of those files mentions an API URL."""
    from pathlib import Path

    if os.environ.get("PREFECT_API_URL", "").strip():
        return True
    if "prefect.settings" in sys.modules:  # imported already: asking costs nothing
        return _settings_name_an_api()
    home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    profiles = os.environ.get("PREFECT_PROFILES_PATH") or home / "profiles.toml"
    files = {
        Path(profiles).expanduser(): "PREFECT_API_URL",
        Path(".env"): "PREFECT_API_URL",
        Path("prefect.toml"): "api",
        Path("pyproject.toml"): "tool.prefect",
    }
    mentioned = False
    for path, marker in files.items():
        try:
            mentioned = mentioned or marker in path.read_text(errors="replace")
        except OSError:
            continue
    return mentioned and _settings_name_an_api()


def _settings_name_an_api() -> bool:
    from prefect.settings import get_current_settings

    return bool(get_current_settings().api.url)


def start_temporary_api() -> str | None:
    """Start Prefect's temporary API now (none when PREFECT_API_URL names a server), while
    the compiles run: why it did not come up within its start-up time, or None. The flow
    run then uses this same server."""
    from prefect.settings import get_current_settings

    quiet_prefect_console()
    if get_current_settings().api.url:
        return None
    temporary_api_dies_with_us()
    from prefect.server.api.server import SubprocessASGIServer

    server = SubprocessASGIServer()
    failed: list[Exception] = []

    def start() -> None:
        try:
            server.start(timeout=_startup_timeout())
        except Exception as exc:  # Prefect's: a RuntimeError after its start-up timeout
            failed.append(exc)

    # Prefect waits out its whole timeout even for a server that exited at start-up (a
    # database it cannot open): its process is watched here, so that ends the wait.
    # In this context: Prefect hands the settings in force (prefect_defaults') to the server.
    context = contextvars.copy_context()
    starting = threading.Thread(
        target=context.run, args=(start,), name="epfleet-prefect-api", daemon=True
    )
    starting.start()
    exited: int | None = None
    failed_starts: set[int] = set()  # the processes that exited with uvicorn's code 3
    while starting.is_alive() and exited is None:
        starting.join(0.5)
        process = server.server_process
        code = process.poll() if process is not None else None
        if code == STARTUP_FAILED:
            failed_starts.add(id(process))
        if (code is not None and code != STARTUP_FAILED) or len(failed_starts) >= 2:
            exited = code
    if not failed and exited is None:
        return None
    if server.server_process is not None:
        server.server_process.kill()  # a slow one may still be starting
    first = (
        str(failed[0]).split(" stdout:")[0].strip().rstrip(".") or type(failed[0]).__name__
        if failed
        else f"its process exited with code {exited} at start-up"
    )
    logged = _temporary_api_error()
    return f"{first}: {logged}" if logged else first


def start_temporary_api_beside() -> Future[str | None]:
    """``start_temporary_api`` in a thread of its own, so the caller compiles meanwhile:
    its future is why the API did not come up, or None once it answers. The thread
    imports Prefect and starts it within ``prefect_defaults``."""
    started: Future[str | None] = Future()

    def start() -> None:
        try:
            with prefect_defaults():
                started.set_result(start_temporary_api())
        except BaseException as exc:  # told to whoever waits for it
            started.set_exception(exc)

    threading.Thread(target=start, name="epfleet-prefect-api-start", daemon=True).start()
    return started


def api_for_a_flow_run(without: str) -> None:
    """Prefect's API for a command that needs its flow run (``sync --flow``, ``watch``):
    the temporary one started as ``epfleet compile`` starts it (waited for, dying with
    us, its INFO lines and run errors off the terminal); EpfleetError naming ``without``,
    the way to do without it, when it does not start."""
    problem = start_temporary_api()
    if problem is not None:
        from epfleet.errors import EpfleetError

        raise EpfleetError(
            f"Prefect's temporary API did not start ({problem}): set PREFECT_API_URL to a "
            f"Prefect server, or {without}"
        )


STARTUP_FAILED = 3
"""uvicorn's exit code when the app's start-up fails: a port taken meanwhile (Prefect
starts it again on another port) or a server that cannot start at all (a database it
cannot open): a second such exit ends the wait."""


STARTUP_TIMEOUT_SECONDS = 180
"""How long ``epfleet compile`` waits for the temporary API unless
PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS is set. Prefect's default, 20 s, is
too short on a busy 2-core machine: the server's process imports ~5 s of CPU (its
FastAPI app and database models) and migrates a new database once (~5 s more), while
the compile workers take both cores. Measured on a 2-core machine: 6 s (11 s with a new
database) quiet, 27 s (42 s) beside two busy processes, 39 s (86 s) beside four.
Waiting longer costs nothing: the compiles run meanwhile, and the flow run collects them
once the API answers."""


def _startup_timeout() -> int:
    from prefect.settings import get_current_settings

    ephemeral = get_current_settings().server.ephemeral
    if "startup_timeout_seconds" in ephemeral.model_fields_set:
        return int(ephemeral.startup_timeout_seconds)
    return STARTUP_TIMEOUT_SECONDS


def quiet_prefect_console() -> None:
    """Keep Prefect's INFO lines (each task run's, the temporary server's) off the
    terminal, and its warnings in epfleet's one format (``epfleet: <message>``); a run's
    ERROR lines are left to the run's logs, since the command prints the error itself, on
    one line. All of them still reach the API's run logs."""
    import logging

    from prefect.logging.configuration import setup_logging
    from prefect.logging.handlers import PrefectConsoleHandler

    setup_logging()
    for logger in [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]:
        for handler in getattr(logger, "handlers", []):
            if isinstance(handler, PrefectConsoleHandler):
                handler.setLevel(logging.WARNING)
                handler.setFormatter(logging.Formatter("epfleet: %(message)s"))
                if not any(isinstance(f, _NoRunErrors) for f in handler.filters):
                    handler.addFilter(_NoRunErrors())


class _NoRunErrors:
    """Drops a flow or task run's ERROR records from the console: the command's own last
    line says what failed."""

    RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")

    def filter(self, record: object) -> bool:
        import logging

        assert isinstance(record, logging.LogRecord)
        return not (record.levelno >= logging.ERROR and record.name in self.RUN_LOGGERS)


_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "try: ctypes.CDLL(None).prctl(1, signal.SIGKILL, 0, 0, 0)\n"  # PR_SET_PDEATHSIG
    "except (OSError, AttributeError): pass\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(1)\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"  # a Ctrl-C is ours; we kill it
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})\n"  # one pending: discarded
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class _PopenDyingWithUs:
    """Stands in for the ``subprocess`` module in Prefect's server module: its Popen
    starts the temporary API through ``_DIE_WITH_PARENT``, from epfleet's spawner thread
    (PR_SET_PDEATHSIG follows the thread that started a process)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        from epfleet.runtime.workers import spawn

        wrapped = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *args]
        # epfleet's defaults in the server's own environment, not in ours.
        kwargs["env"] = {**PREFECT_DEFAULTS, **(kwargs.get("env") or os.environ)}
        if kwargs.get("stdout") is None and kwargs.get("stderr") is None:
            # Its log lines (a start-up traceback) go to a file, not into our output.
            kwargs["stdout"] = kwargs["stderr"] = _temporary_api_log()

        def start() -> subprocess.Popen[Any]:
            # Started with SIGINT blocked: a terminal's Ctrl-C while the stub imports
            # stays pending until it ignores SIGINT (else a KeyboardInterrupt traceback).
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                return subprocess.Popen(wrapped, **kwargs)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

        return spawn(start)


_api_log: Any = None


def _temporary_api_log() -> Any:
    global _api_log
    if _api_log is None:
        import tempfile

        _api_log = tempfile.TemporaryFile()  # noqa: SIM115 (read back on failure)
    return _api_log


def _temporary_api_error() -> str | None:
    """The last error line the temporary API logged, if any."""
    if _api_log is None:
        return None
    _api_log.seek(0)
    lines = _api_log.read()[-65536:].decode(errors="replace").splitlines()
    errors = [line.strip() for line in lines if "Error" in line and not line.startswith(" ")]
    return errors[-1] if errors else None


def temporary_api_dies_with_us() -> None:
    """On Linux, make Prefect's temporary API server (``SubprocessASGIServer`` runs
    ``python -m uvicorn`` with ``subprocess.Popen``) die when this process is killed.
    Best effort: skipped with a real API (PREFECT_API_URL) or where Prefect changed."""
    if not sys.platform.startswith("linux"):
        return
    from prefect.settings import get_current_settings

    if get_current_settings().api.url:
        return
    try:
        from prefect.server.api import server as prefect_server
    except ImportError:
        return
    if isinstance(getattr(prefect_server, "subprocess", None), type(subprocess)):
        prefect_server.subprocess = _PopenDyingWithUs()  # type: ignore[assignment]
