"""Where a flow's compile tasks run: one explicit name -> factory table.

- ``threads`` (default): task threads in the flow's process, each waiting on a compile
  worker process of its own machine.
- ``dask``: prefect-dask's ``DaskTaskRunner``, for fleets that outgrow one machine:
  tasks go to the Dask scheduler at ``address``, or to a local cluster of
  ``workers`` single-threaded worker processes when no address is given.

A spec runtime with ``dask_resource: true`` compiles only on Dask workers that advertise
the resource ``runtime-<name>`` (``unserved_resource`` says when none does).

A deployment picks its runner through its workers' environment
(``EPFLEET_TASK_RUNNER``, ``EPFLEET_DASK_ADDRESS``, e.g. job_variables.env in
``deployments/prefect.yaml``); the CLI through ``--task-runner`` and ``--dask-address``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from epfleet import MAX_WORKERS
from epfleet.errors import BadInputError, MissingExtraError
from epfleet.settings import settings

if TYPE_CHECKING:
    from prefect.task_runners import TaskRunner


def _threads(address: str | None, workers: int) -> TaskRunner[Any]:
    from prefect.task_runners import ThreadPoolTaskRunner

    if address:
        raise BadInputError("--dask-address needs --task-runner dask")
    # Task threads only wait on compile worker processes, whose number `workers` sets.
    return ThreadPoolTaskRunner(max_workers=MAX_WORKERS)


def _dask(address: str | None, workers: int) -> TaskRunner[Any]:
    try:
        import dask
    except ImportError:
        raise MissingExtraError(
            "task runner 'dask' needs prefect-dask: pip install 'epfleet[dask]'"
        ) from None
    # distributed logs ~70 INFO lines per run from the scheduler, nannies and workers. Its
    # logging is set up from Dask's config when distributed is first imported (below), so
    # the level goes into that config first, unless one is configured (QUIET_DASK...);
    # Dask's config, not this process's environment. The local cluster's worker processes
    # get the variable in their own environment (Nanny's env; as they did when this
    # process set it: without it their exit can take past the nanny's 4 s, "Worker
    # process still alive after 4.0 seconds, killing").
    if dask.config.get("logging.distributed", None) is None:
        dask.config.set({"logging.distributed": "warning"})
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise MissingExtraError(
            "task runner 'dask' needs prefect-dask: pip install 'epfleet[dask]'"
        ) from None
    # Compiles run in child processes of the Dask worker (a crash in an EP's native code
    # must not kill the worker), and daemonic processes may not have children.
    dask.config.set({"distributed.worker.daemon": False})
    if address:
        return DaskTaskRunner(address=address)
    cluster: dict[str, Any] = {"n_workers": workers, "threads_per_worker": 1, "processes": True}
    if QUIET_DASK not in os.environ:  # else they inherit the one given
        cluster["env"] = {QUIET_DASK: "warning"}
    return DaskTaskRunner(cluster_kwargs=cluster)


QUIET_DASK = "DASK_LOGGING__DISTRIBUTED"


# Prefect is imported only when a runner is made: the CLI answers an up-to-date fleet
# without it.
TASK_RUNNERS: dict[str, Callable[[str | None, int], TaskRunner[Any]]] = {
    "threads": _threads,
    "dask": _dask,
}


def task_runner(name: str, address: str | None = None, workers: int = 2) -> TaskRunner[Any]:
    try:
        factory = TASK_RUNNERS[name]
    except KeyError:
        raise BadInputError(
            f"unknown task runner {name!r}; known: threads (built in), dask (epfleet[dask])"
        ) from None
    return factory(address, workers)


def from_environment() -> TaskRunner[Any]:
    """The runner a deployment's workers ask for (threads when they ask for none)."""
    env = settings()  # EPFLEET_TASK_RUNNER, EPFLEET_DASK_ADDRESS, EPFLEET_DASK_WORKERS
    name, address, workers = env.task_runner, env.dask_address, env.dask_workers
    if address and name != "dask":
        raise BadInputError(
            f"EPFLEET_DASK_ADDRESS is set but EPFLEET_TASK_RUNNER is {name!r}: set it to dask"
        )
    try:
        return task_runner(name, address, workers)
    except BadInputError as exc:
        raise BadInputError(f"EPFLEET_TASK_RUNNER={name!r}: {exc}") from None


def dask_resources() -> DaskWorkers | None:
    """The resources the workers of the flow's Dask cluster advertise, and whether the
    cluster is the task runner's own local one; None when its tasks do not run on Dask."""
    from prefect.context import FlowRunContext

    runner = getattr(FlowRunContext.get(), "task_runner", None)
    if type(runner).__name__ != "DaskTaskRunner":
        return None
    own = getattr(runner, "address", None) is None  # a LocalCluster of this machine
    info = runner.client.scheduler_info(n_workers=-1)  # type: ignore[union-attr]
    names = {name for worker in info["workers"].values() for name in worker.get("resources", {})}
    return DaskWorkers(resources=frozenset(names), local=own)


@dataclass(frozen=True)
class DaskWorkers:
    """What a flow's Dask cluster offers: the resources its workers advertise, and whether
    it is the task runner's own local cluster (this machine)."""

    resources: frozenset[str]
    local: bool


def unserved_resource(resource: str | None, workers: DaskWorkers | None) -> str | None:
    """Why a compile pinned to Dask workers advertising ``resource`` cannot be submitted:
    none of the cluster's workers advertises it (it would wait forever). The task runner's
    own local cluster is this machine, which builds every runtime: it is never refused."""
    if resource is None or workers is None or workers.local or resource in workers.resources:
        return None
    return (
        f"no worker of the Dask cluster advertises resource {resource!r}, which the "
        f"runtime's compiles need: start one with dask worker ADDRESS --resources "
        f"'{resource}=1'"
    )
