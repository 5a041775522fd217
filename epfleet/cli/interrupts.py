"""Ctrl-C of an ``epfleet`` command: kill every worker, print one line, exit 130.

A worker that dies then was killed, not crashed (``epfleet.runtime.workers.interrupted``). A
command that runs Prefect exits at once (``os._exit``): its flow engine, task threads and
temporary API would otherwise retry, rerun and print tracebacks for minutes. Nothing is
half-published that way: the manifest is replaced in one compare-and-swap (a rename or a
conditional PUT), so it is either the old one or the new one; temp files left behind are
removed by a later run. A plain ``epfleet sync`` unwinds instead (locks and temp files
released by their ``finally``), with a deadline. A second Ctrl-C exits at once.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

from epfleet.cli.exit_codes import EXIT_INTERRUPTED

_stopping = threading.Event()
_announced = threading.Lock()
_stop_message = "epfleet: interrupted"
UNWIND_SECONDS = 5.0


def announce_stopped() -> None:
    """Print the interrupted command's line (once, whoever prints it first)."""
    _announce(_stop_message)


def _announce(message: str) -> None:
    if _announced.acquire(blocking=False):
        os.write(2, f"{message}\n".encode())  # not print: the handler may interrupt a print


def _exit_interrupted(message: str) -> None:
    from epfleet.runtime.workers import release_semaphores

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
def interrupts(message: str, *, unwind: bool = False) -> Iterator[None]:
    """Handle Ctrl-C as above while the block runs (in the main thread only)."""
    global _stop_message
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if _stopping.is_set():
            _exit_interrupted(message)
        _stopping.set()
        from epfleet.runtime.workers import kill_workers

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
