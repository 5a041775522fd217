"""Functions that worker processes run in tests (importable by the spawned worker, which
cannot unpickle a test module's local functions): tests/runtime/test_progress_output.py,
test_compile.py, tests/fleet/test_verify.py, tests/device/test_deadlines.py.

They live here, not in the test modules, to keep each worker's start cheap: a function
from a test module makes the worker import that module, and with it conftest, moto and
boto3, about 2 s of CPU per worker started."""

from __future__ import annotations

import os
import signal
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from epfleet.runtime.compiler import CompileJob, CompileOutput


def write_like_qnn(_: object) -> str:
    """What QNN's libraries do at load, then a real error, at the fd level."""
    os.write(1, b" # LIBNATIVE: No alternate configuration present - using defaults.\n")
    os.write(2, b"real native error: something broke\n")
    os.write(2, b" # LIBNATIVE: config file detected - enabling thread local storage\n")
    return "done"


def write_then_die(_: object) -> None:
    """A real error written just before the process aborts in native code."""
    os.write(2, b"last words before the abort\n")
    os.abort()


def abort(_: object) -> None:
    """Stands in for an EP's std::terminate: no real EP crashes on demand."""
    os.kill(os.getpid(), signal.SIGABRT)


def kill_self(_: object) -> None:
    """Stands in for a worker the kernel kills (an OOM kill)."""
    os.kill(os.getpid(), signal.SIGKILL)


def double(value: int) -> int:
    return value * 2


def sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def abort_on_crash(word: str) -> str:
    """Stands in for native code that dies in a health check: no real EP crashes on demand."""
    if word == "crash":
        os.abort()
    return word.upper()


def crash_or_compile(job: CompileJob) -> CompileOutput:
    """Stands in for an EP whose native code segfaults: no real EP crashes on demand."""
    from epfleet.runtime.compiler import compile_job

    if job.request.model == "crash":
        time.sleep(0.5)  # let the innocent jobs get going on the pool first
        os.abort()
    return compile_job(job)
