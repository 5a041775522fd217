"""Killable worker processes for running a model: one call at a time, with a time limit.

Running a variant means running an EP's native code on it. A partial QNN HTP graph
can abort the whole process (std::terminate), and a model with a huge ``Loop`` runs
for as long as it likes; neither may take the caller with it. Each worker is a
spawned process kept across calls (ORT and the EP plugin load once); a worker that
dies is reported as a crash, one that overruns its time limit is killed, and both
are replaced on the next call.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

Arg = TypeVar("Arg")
Result = TypeVar("Result")


class WorkerTimeout(Exception):
    """The call ran past its time limit; its worker was killed."""


class WorkerDied(Exception):
    """The worker process died during the call (native crash, abort, OOM kill)."""


def _serve(conn: Connection) -> None:
    os.dup2(2, 1)  # EP banners from native code must not reach a --json caller's stdout
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    while True:
        try:
            fn, arg = conn.recv()
        except EOFError:
            return
        try:
            conn.send((True, fn(arg)))
        except BaseException as exc:
            conn.send((False, exc))


class _Worker:
    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process: BaseProcess = context.Process(target=_serve, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def call(self, fn: Callable[[Any], Any], arg: Any, timeout: float) -> Any:
        self.conn.send((fn, arg))
        if not self.conn.poll(timeout):
            self.kill()
            raise WorkerTimeout(f"no answer within {timeout:g} s")
        try:
            ok, value = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise WorkerDied(self._death()) from None
        if not ok:
            raise value
        return value

    def _death(self) -> str:
        self.process.join(5)
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"killed by signal {-code}"
        return f"exit code {code}"

    @property
    def alive(self) -> bool:
        return self.process.is_alive()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()


class IsolatedWorkers:
    """Up to ``size`` workers shared by the threads of one process."""

    def __init__(self, size: int) -> None:
        self._idle: queue.LifoQueue[_Worker] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(size)
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()

    def call(self, fn: Callable[[Arg], Result], arg: Arg, timeout: float) -> Result:
        """``fn(arg)`` in a worker. Raises WorkerTimeout, WorkerDied, or what ``fn`` raised."""
        with self._slots:
            worker = self._take()
            healthy = False
            try:
                result: Result = worker.call(fn, arg, timeout)
                healthy = True
                return result
            except (WorkerTimeout, WorkerDied):
                raise
            except BaseException:
                healthy = worker.alive
                raise
            finally:
                if healthy:
                    self._idle.put(worker)
                else:
                    self._forget(worker)

    def _take(self) -> _Worker:
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                worker = _Worker()
                with self._lock:
                    self._all.add(worker)
                return worker
            if worker.alive:
                return worker
            self._forget(worker)

    def _forget(self, worker: _Worker) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)

    def shutdown(self) -> None:
        with self._lock:
            workers, self._all = list(self._all), set()
        for worker in workers:
            worker.kill()


_shared: IsolatedWorkers | None = None
_shared_lock = threading.Lock()


def shared_workers() -> IsolatedWorkers:
    """This process's workers for running models (as many as it has CPUs)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = IsolatedWorkers(max(1, os.cpu_count() or 1))
        return _shared
