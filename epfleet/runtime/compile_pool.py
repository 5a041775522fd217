"""Compile worker processes.

Every compile runs in a separate process: an EP's native code that crashes
(a segfault in a vendor SDK) takes down one worker, not the flow, and the GIL
never serialises two compiles. Workers are reused across compiles, so ORT and
each plugin are imported and registered once per worker.

A call with a ``timeout`` (the device's health checks and local builds) runs in a
killable worker instead (``epfleet.runtime.workers``): past its time limit the worker is
killed and replaced, and the call raises ``TimeLimitExceeded``. A process pool's
workers cannot be killed one at a time.
"""

from __future__ import annotations

import multiprocessing.util
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import TypeVar

from epfleet.errors import CompileError, TimeLimitExceeded, WorkerCrashed
from epfleet.runtime.compiler import CompileJob, CompileOutput, compile_job, discard
from epfleet.runtime.native_output import filter_native_banners
from epfleet.runtime.workers import (
    IsolatedWorkers,
    WorkerDied,
    WorkerTimeout,
    enter_runtime,
    interrupted,
    worker_context,
    worker_started,
)

Arg = TypeVar("Arg")
Result = TypeVar("Result")


def _warm_up(parent: int, site: str | None = None) -> None:
    worker_started(parent)  # SIGINT is the parent's to handle; die with the parent
    enter_runtime(site)  # a runtime environment's onnxruntime, before it is imported
    # Vendor SDKs print banners from native code; keep stdout clean for --json callers.
    os.dup2(2, 1)
    filter_native_banners()  # QNN's ' # LIBNATIVE:' lines, on every load
    import onnx  # noqa: F401
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # errors only: EP warnings would drown progress


class CompilePool:
    def __init__(self, workers: int, site: str | None = None) -> None:
        self.workers = workers
        self.site = site
        """The runtime environment its workers load ONNX Runtime from (None: the host's)."""
        self._lock = threading.Lock()
        self._executor = self._new_executor(workers, site)
        self._early: dict[str, Future[CompileOutput]] = {}
        self._killable: IsolatedWorkers | None = None
        # Shut the workers down before multiprocessing's own exit handlers (priority 10)
        # wait on them: in a Dask worker that wait hung until the nanny killed the worker,
        # leaving the compile processes orphaned.
        self._at_exit = multiprocessing.util.Finalize(None, self._shutdown_now, exitpriority=100)

    @staticmethod
    def _new_executor(workers: int, site: str | None) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(
            max_workers=workers,
            mp_context=worker_context(),
            initializer=_warm_up,
            initargs=(os.getpid(), site),
        )

    def prestart(
        self, job: CompileJob, fn: Callable[[CompileJob], CompileOutput] = compile_job
    ) -> Future[CompileOutput]:
        """Start ``fn(job)`` now, and return its future (to watch, not to wait on: a later
        ``run`` of the same job collects it). The CLI uses this to compile while Prefect's
        API is still starting."""
        key = job.model_dump_json()
        with self._lock:
            if key not in self._early:
                self._early[key] = self._executor.submit(fn, job)
            return self._early[key]

    def run(
        self,
        job: CompileJob,
        fn: Callable[[CompileJob], CompileOutput] = compile_job,
        timeout: float | None = None,
    ) -> CompileOutput:
        """Run ``fn(job)`` in a worker.

        A worker that dies breaks every job in flight on the pool, and nothing says
        which one killed it. So the pool is replaced, and each broken job is run once
        more alone in a worker of its own: only the job that kills that worker too is
        reported as the crash.

        With ``timeout`` the job runs in a killable worker, alone: TimeLimitExceeded past
        it, CompileError if the worker dies.
        """
        request = job.request
        if timeout is not None:
            doing = f"compiling {request.model!r} for {request.target!r} ({request.ep})"
            try:
                return self._call_killable(fn, job, doing, timeout)
            except WorkerCrashed:
                raise CompileError(
                    f"the compile process crashed while compiling {request.model!r} for "
                    f"{request.target!r} ({request.ep}): the EP's native code died "
                    "(its message, if any, is on the worker's stderr)"
                ) from None
        with self._lock:
            executor = self._executor
            future = self._early.pop(job.model_dump_json(), None) or executor.submit(fn, job)
        try:
            return future.result()
        except BrokenProcessPool:
            self._replace(executor)
            if interrupted():  # killed on Ctrl-C, not a crash to rerun
                raise KeyboardInterrupt from None
        alone = self._new_executor(1, self.site)
        try:
            return alone.submit(fn, job).result()
        except BrokenProcessPool:
            if interrupted():
                raise KeyboardInterrupt from None
            raise CompileError(
                f"the compile process crashed while compiling {request.model!r} for "
                f"{request.target!r} ({request.ep}): the EP's native code died "
                "(its message, if any, is on the worker's stderr)"
            ) from None
        finally:
            alone.shutdown(wait=False)

    def call(
        self, fn: Callable[[Arg], Result], arg: Arg, doing: str, timeout: float | None = None
    ) -> Result:
        """Run ``fn(arg)`` in a worker; WorkerCrashed names ``doing`` if the worker dies.
        With ``timeout``, in a killable worker: TimeLimitExceeded past it."""
        if timeout is not None:
            return self._call_killable(fn, arg, doing, timeout)
        with self._lock:
            executor = self._executor
        try:
            return executor.submit(fn, arg).result()
        except BrokenProcessPool:
            self._replace(executor)
            if interrupted():
                raise KeyboardInterrupt from None
            raise WorkerCrashed(
                f"the worker process crashed while {doing}: the EP's native code died "
                "(its message, if any, is on stderr)"
            ) from None

    def _call_killable(
        self, fn: Callable[[Arg], Result], arg: Arg, doing: str, timeout: float
    ) -> Result:
        with self._lock:
            if self._killable is None:
                self._killable = IsolatedWorkers(self.workers, self.site)
            workers = self._killable
        try:
            return workers.call(fn, arg, max(timeout, 0.0))
        except WorkerTimeout:
            raise TimeLimitExceeded(doing, timeout) from None
        except WorkerDied as exc:
            raise WorkerCrashed(
                f"the worker process crashed while {doing} ({exc}): the EP's native code "
                "died (its message, if any, is on stderr)"
            ) from None

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is broken:
                self._executor = self._new_executor(self.workers, self.site)
        broken.shutdown(wait=False)

    def drop_unclaimed(self) -> None:
        """Cancel prestarted jobs nobody collected and remove what they produced."""
        with self._lock:
            unclaimed, self._early = list(self._early.values()), {}
        for future in unclaimed:
            if not future.cancel() and future.exception() is None:
                discard(future.result())

    def shutdown(self) -> None:
        self._at_exit.cancel()  # releases this pool for the garbage collector
        self._shutdown_now()

    def _shutdown_now(self) -> None:
        if self._killable is not None:
            self._killable.shutdown()
        self._executor.shutdown(wait=True, cancel_futures=True)


_pools: dict[tuple[int, str | None], CompilePool] = {}
_pools_lock = threading.Lock()


def shared_pool(workers: int, site: str | None = None) -> CompilePool:
    """One pool per size and runtime environment (``site``; None: the host's onnxruntime)
    per process, shared by the compile tasks of a flow run."""
    with _pools_lock:
        pool = _pools.get((workers, site))
        if pool is None:
            pool = _pools[workers, site] = CompilePool(workers, site)
        return pool


_slots: dict[int, threading.BoundedSemaphore] = {}


def busy_slots(workers: int) -> threading.BoundedSemaphore:
    """``workers`` slots per process for the CPU-bound steps of a pair (its compile and its
    verification, which run in different worker processes): a pair holds one from its
    compile to its verdict, so at most ``workers`` of them are busy at once."""
    with _pools_lock:
        return _slots.setdefault(workers, threading.BoundedSemaphore(workers))
