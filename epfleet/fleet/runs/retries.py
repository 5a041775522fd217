"""Retries on the compile side: one layer per kind of fault, each configured once.

- **A transient HTTP fault** (a dropped connection, throttling, a 5xx) on one store
  request: botocore's ``standard`` retry mode, ``AWS_MAX_ATTEMPTS`` attempts (5 by
  default), configured in ``epfleet.stores.s3.client``; a download whose body breaks after the
  response began is re-requested by boto3's transfer manager (its
  ``num_download_attempts``), the one fault botocore does not see. The local store has
  no such faults.
- **A store still failing once its client gave up** (``TransientStoreError``) or **bytes
  that do not match their digest** (``IntegrityError``, a bad download): the Prefect task
  that hit it is retried, ``TASK_RETRIES`` times ``TASK_RETRY_DELAY`` seconds apart,
  through ``retry_transient_only`` (plan, compile, publish and watch tasks). A compile
  error, a failed verification or bad input fails the same way every time and is never
  retried; flows set no retries of their own.
- **A lost compare-and-swap race** on the manifest (``PreconditionFailed``): the publish
  loop re-reads, re-merges and writes again, up to ``PUBLISH_ATTEMPTS`` times
  (``epfleet.fleet.publishing.publish``). It retries nothing else, and no other layer retries it.
- **A busy Prefect API** (the 503 of a busy database, 429): Prefect's own client
  (``PREFECT_CLIENT_MAX_RETRIES``); waiting for a work pool's child run keeps polling
  through API errors until its deadline (``tasks.dispatch``), which is the wait itself,
  not another retry of a request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from epfleet.errors import IntegrityError, TransientStoreError

if TYPE_CHECKING:
    from prefect import Task
    from prefect.client.schemas.objects import TaskRun
    from prefect.states import State

TASK_RETRIES = 2
TASK_RETRY_DELAY = 2


def retry_transient_only(task: Task, task_run: TaskRun, state: State) -> bool:
    """Retry store hiccups; a compile error or bad input fails the same way every time."""
    try:
        state.result()
    except (TransientStoreError, IntegrityError):
        return True
    except Exception:
        return False
    return False
