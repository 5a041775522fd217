"""Errors epfleet raises on purpose, each with a message that names the offending input.

The EP modules (``eps``) raise their own errors, ``eps.base.MissingExtraError`` and
``eps.base.NoDeviceError``; epfleet turns them into its own subclasses of those
with ``ep_errors()`` where an EP call's error leaves for the user or the report
(planning, the compile worker, the health check), so that a missing package is
bad input and a missing device fails the pair alone.
"""

from collections.abc import Iterator
from contextlib import contextmanager

from eps import base as eps_base


class EpfleetError(Exception):
    """Base class for errors epfleet reports to users."""


class BadInputError(EpfleetError):
    """The user's input (spec, URI, option) is wrong; nothing was compiled or published."""


class MissingExtraError(BadInputError, eps_base.MissingExtraError):
    """An execution provider's pip package is not installed."""


class CompileError(EpfleetError):
    """Compiling one model for one target failed."""


class NoDeviceError(CompileError, eps_base.NoDeviceError):
    """The EP is installed but enumerates no device on this worker."""


class WorkerCrashed(EpfleetError):
    """A worker process died in native code (a compile or a health check)."""


class HealthCheckError(EpfleetError):
    """A variant did not load or run on its EP here."""


class StoreError(EpfleetError):
    """A store operation failed for a reason that retrying will not fix."""


class StoreMissing(BadInputError, StoreError):
    """The store itself is not there (a bucket that does not exist): the store URI is
    wrong, whichever command and step met it first (one wording, exit 2)."""


class ObjectMissing(StoreError):
    """The store has no object at the key asked for: the answer to the read itself (S3's
    404), so that no second request is needed to tell a missing object from a failure."""


class TransientStoreError(StoreError):
    """A store operation failed for a reason that may go away (network, throttling, 5xx)."""


class PreconditionFailed(StoreError):
    """A conditional write lost a race: the object changed since it was read."""


class IntegrityError(StoreError):
    """Downloaded or stored bytes do not match the expected sha256 or size."""


@contextmanager
def ep_errors() -> Iterator[None]:
    """Run calls into an EP module, raising its errors as epfleet's, message unchanged."""
    try:
        yield
    except eps_base.MissingExtraError as exc:
        raise MissingExtraError(str(exc)) from exc
    except eps_base.NoDeviceError as exc:
        raise NoDeviceError(str(exc)) from exc


def summarize(exc: BaseException, limit: int) -> str:
    """An exception's message on one line, cut to ``limit`` characters (native EP errors
    can run to pages)."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
