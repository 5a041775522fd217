"""Compile worker processes.

Every compile runs in a separate process: an EP's native code that crashes
(a segfault in a vendor SDK) takes down one worker, not the flow, and the GIL
never serialises two compiles. Workers are reused across compiles, so ORT and
each plugin are imported and registered once per worker.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from epfleet.compiler import CompileJob, CompileOutput, compile_job
from epfleet.errors import CompileError


def _warm_up() -> None:
    # Vendor SDKs print banners from native code; keep stdout clean for --json callers.
    os.dup2(2, 1)
    import onnx  # noqa: F401
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # errors only: EP warnings would drown progress


class CompilePool:
    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._lock = threading.Lock()
        self._executor = self._new_executor()
        self._early: dict[str, tuple[ProcessPoolExecutor, Future[CompileOutput]]] = {}

    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_warm_up,
        )

    def prestart(
        self, job: CompileJob, fn: Callable[[CompileJob], CompileOutput] = compile_job
    ) -> None:
        """Start ``fn(job)`` now; a later ``run`` of the same job collects it. The CLI uses
        this to compile while Prefect's API is still starting."""
        with self._lock:
            key = job.model_dump_json()
            if key not in self._early:
                self._early[key] = (self._executor, self._executor.submit(fn, job))

    def run(
        self, job: CompileJob, fn: Callable[[CompileJob], CompileOutput] = compile_job
    ) -> CompileOutput:
        """Run ``fn(job)`` in a worker. A crashed worker breaks every job in flight, so
        each is tried once more on a fresh pool; a job that crashes twice is the culprit."""
        for attempt in range(2):
            with self._lock:
                executor, future = self._early.pop(job.model_dump_json(), (self._executor, None))
            try:
                return (future or executor.submit(fn, job)).result()
            except BrokenProcessPool:
                with self._lock:
                    if self._executor is executor:
                        self._executor = self._new_executor()
                if attempt == 1:
                    raise CompileError(
                        f"the compile process crashed while compiling {job.model!r} for "
                        f"{job.target!r} ({job.ep}); the EP's native code died, "
                        "see the worker's stderr"
                    ) from None
        raise AssertionError("unreachable")

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


_pools: dict[int, CompilePool] = {}
_pools_lock = threading.Lock()


def shared_pool(workers: int) -> CompilePool:
    """One pool per size per process, shared by the compile tasks of a flow run."""
    with _pools_lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = CompilePool(workers)
        return pool
