"""Killable worker processes for running a model: one call at a time, with a time limit.

Running a variant means running an EP's native code on it. A partial QNN HTP graph
can abort the whole process (std::terminate), and a model with a huge ``Loop`` runs
for as long as it likes; neither may take the caller with it. Each worker is a
spawned process kept across calls (ORT and the EP plugin load once); a worker that
dies is reported as a crash, one that overruns its time limit is killed, and both
are replaced on the next call.

Every worker of epfleet (these and ``epfleet.runtime.compile_pool``'s compile workers) is
started from
one long-lived thread (``worker_context``) and never takes a SIGINT: a Ctrl-C typed at a
terminal reaches the whole process group, and the workers leave it to their parent, which
kills them (``kill_workers``). That thread blocks SIGINT, so a worker starts (through
exec) with SIGINT blocked; a Ctrl-C during its start-up stays pending until
``worker_started`` ignores SIGINT, which discards it, and then unblocks it. On Linux each
worker also asks the kernel to kill it when the thread that started it ends
(``PR_SET_PDEATHSIG``), so a SIGKILL of the CLI leaves no worker behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import multiprocessing
import multiprocessing.context
import multiprocessing.util
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from epfleet.errors import WorkerDied, WorkerTimeout
from epfleet.runtime.native_output import filter_native_banners

Arg = TypeVar("Arg")
Result = TypeVar("Result")

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent(parent: int) -> None:
    """In a worker: on Linux, be SIGKILLed when the process that started it dies; exit
    now if it already has (``parent`` is its pid, taken before the start)."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no libc prctl: the parent's kill must do
            pass
    if os.getppid() != parent:
        os._exit(1)


def worker_started(parent: int) -> None:
    """The first thing a worker does: leave SIGINT to its parent, die with the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # discards a Ctrl-C pending since start-up
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    die_with_parent(parent)


def _start_with_sigint_blocked(start: Callable[[], None]) -> None:
    """In the spawner thread: start a worker that inherits a blocked SIGINT.

    The resource tracker is made sure of first: starting it unblocks SIGINT and SIGTERM
    in the calling thread (multiprocessing's own masking around its spawn). A start holds
    ``_starting`` until the new process has its start-up data and is one of
    multiprocessing's children, so ``kill_workers`` sees it; none begins once interrupted
    (a worker whose parent exits mid-start fails reading that data, with a traceback)."""
    from multiprocessing import resource_tracker

    with _starting:
        if interrupted():
            raise KeyboardInterrupt
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            start()
        finally:  # other processes started here (Prefect's API) keep their Ctrl-C
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


class _Spawner:
    """One daemon thread, alive as long as the process, that starts every worker.

    PR_SET_PDEATHSIG fires when the *thread* that started a process ends, and task
    threads end while the process lives on; this one does not."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="epfleet-spawner", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            fn, future = self._jobs.get()
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def run(self, fn: Callable[[], Result]) -> Result:
        if threading.current_thread() is self._thread:
            return fn()
        future: Future[Result] = Future()
        self._jobs.put((fn, future))
        return future.result()


_spawner: _Spawner | None = None
_spawner_lock = threading.Lock()


def spawn(fn: Callable[[], Result]) -> Result:
    """Run ``fn`` (which starts a process) in the spawner thread."""
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = _Spawner()
        spawner = _spawner
    return spawner.run(fn)


class _WorkerProcess(multiprocessing.context.SpawnProcess):
    def start(self) -> None:
        spawn(lambda: _start_with_sigint_blocked(super(_WorkerProcess, self).start))


class _WorkerContext(multiprocessing.context.SpawnContext):
    Process = _WorkerProcess


_context = _WorkerContext()


def worker_context() -> multiprocessing.context.SpawnContext:
    """The spawn context of epfleet's workers: started from the spawner thread (and so
    is multiprocessing's resource tracker, which ignores SIGINT itself)."""
    from multiprocessing import resource_tracker

    spawn(resource_tracker.ensure_running)
    return _context


_interrupted = threading.Event()
_starting = threading.Lock()


def interrupted() -> bool:
    """True once ``kill_workers`` ran: a worker that dies now was killed, not crashed."""
    return _interrupted.is_set()


def kill_workers() -> None:
    """SIGKILL every worker this process started (on Ctrl-C), also one starting now; none
    starts after. Safe in a signal handler (the main thread never starts a worker itself)."""
    _interrupted.set()
    started = _starting.acquire(timeout=5)  # a start takes milliseconds
    for _ in range(3):  # the set of children may change under us while a worker starts
        try:
            children = list(multiprocessing.process._children)  # type: ignore[attr-defined]
            break
        except RuntimeError:
            continue
    else:
        children = []
    for child in children:
        pid = getattr(child, "pid", None)
        if pid:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    if started:
        _starting.release()


def release_semaphores() -> None:
    """Unlink the pools' named semaphores now, as their finalizers would at a normal exit:
    before an ``os._exit`` (otherwise multiprocessing's resource tracker warns of leaked
    semaphores on stderr when it cleans them up)."""
    from multiprocessing.synchronize import SemLock

    with contextlib.suppress(Exception):
        registry = multiprocessing.util._finalizer_registry  # type: ignore[attr-defined]
        for finalizer in list(registry.values()):
            if getattr(finalizer, "_callback", None) is SemLock._cleanup:  # type: ignore[attr-defined]
                finalizer()


def enter_runtime(site: str | None) -> None:
    """In a fresh worker, before ONNX Runtime is imported: put a runtime environment's
    packages (``epfleet.runtime.environments``) first on the import path, so its
    onnxruntime and EP package are the ones this worker loads. None: the host's own."""
    if site is None:
        return
    loaded = sorted(name for name in sys.modules if name.split(".")[0].startswith("onnxruntime"))
    if loaded:
        raise RuntimeError(
            f"cannot enter the runtime at {site}: {loaded[0]} is loaded in this worker already"
        )
    sys.path.insert(0, site)
    importlib.invalidate_caches()


def _serve(conn: Connection, parent: int, site: str | None = None) -> None:
    worker_started(parent)
    enter_runtime(site)
    os.dup2(2, 1)  # EP banners from native code must not reach a --json caller's stdout
    filter_native_banners()  # QNN's ' # LIBNATIVE:' lines, on every load
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
    def __init__(self, site: str | None = None) -> None:
        context = worker_context()
        self.conn, child = context.Pipe()
        self.process: BaseProcess = context.Process(
            target=_serve, args=(child, os.getpid(), site), daemon=True
        )
        self.process.start()
        child.close()

    def call(self, fn: Callable[[Any], Any], arg: Any, timeout: float) -> Any:
        try:
            self.conn.send((fn, arg))
            if not self.conn.poll(timeout):
                self.kill()
                raise WorkerTimeout(f"no answer within {timeout:g} s")
            ok, value = self.conn.recv()
        except WorkerTimeout:
            raise
        except (EOFError, OSError):
            self.kill()
            raise WorkerDied(self._death()) from None
        except BaseException:  # KeyboardInterrupt: the call is still in the worker
            self.kill()
            raise
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

    def __init__(self, size: int, site: str | None = None) -> None:
        self.site = site
        """The runtime environment its workers load ONNX Runtime from (None: the host's)."""
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
                if interrupted():
                    raise KeyboardInterrupt from None
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
                worker = _Worker(self.site)
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


_shared: dict[str | None, IsolatedWorkers] = {}
_shared_lock = threading.Lock()


def shared_workers(site: str | None = None) -> IsolatedWorkers:
    """This process's workers for running models (as many as it has CPUs), in the runtime
    environment at ``site`` (None: the host's own onnxruntime)."""
    with _shared_lock:
        if site not in _shared:
            _shared[site] = IsolatedWorkers(max(1, os.cpu_count() or 1), site)
        return _shared[site]
