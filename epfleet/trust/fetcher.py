"""ngclient's downloads from an epfleet store: ``epfleet-store:///<key>`` is the store's key.

Bodies stream under the store's transfer limits; a missing object is HTTP 404 for
ngclient, a store that cannot be reached ``Unreachable`` (a ``DownloadError``, as ngclient
expects).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator

from tuf.api import exceptions as tuf_errors
from tuf.ngclient.fetcher import FetcherInterface

from epfleet.errors import ObjectMissing, StoreError, TransferTooSlow, TransientStoreError
from epfleet.limits import TransferGuard
from epfleet.stores import Store

STORE_URL = "epfleet-store:///"


class Unreachable(tuf_errors.DownloadError):
    """A fetch found the store unreachable (a ``DownloadError``, as ngclient expects)."""


class StoreFetcher(FetcherInterface):
    """ngclient's downloads from an epfleet store: ``epfleet-store:///<key>`` is the store's
    ``<key>``. Bodies stream (ngclient stops reading past a file's signed or configured
    length) under the store's transfer limits (``EPFLEET_MIN_RATE``, the stall timeout); a
    missing object is HTTP 404 for ngclient, an unreachable store ``Unreachable``."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.bytes = 0
        """Body bytes fetched so far."""
        self.fetched: list[str] = []
        """The keys fetched so far, in order."""

    def _fetch(self, url: str) -> Iterator[bytes]:
        if not url.startswith(STORE_URL):
            raise tuf_errors.DownloadError(f"{url} is not a store URL ({STORE_URL}<key>)")
        key = url.removeprefix(STORE_URL)
        guard = TransferGuard(f"read of {key}", self.store.uri)
        chunks = self.store.read_range(key, 0)
        try:
            first = next(chunks, None)
        except StoreError as exc:
            raise self._error(key, exc) from exc
        self.fetched.append(key)
        return self._stream(chunks, first, key, guard)

    def _stream(
        self, chunks: Iterator[bytes], first: bytes | None, key: str, guard: TransferGuard
    ) -> Generator[bytes, None, None]:
        try:
            if first is None:
                return
            for chunk in _chain(first, chunks):
                self.bytes += len(chunk)
                guard.add(len(chunk))
                yield chunk
        except StoreError as exc:
            raise self._error(key, exc) from exc
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()  # ngclient stopped reading (past a length): the body is closed

    def _error(self, key: str, exc: StoreError) -> tuf_errors.DownloadError:
        """The failed read as ngclient expects it. A missing object is told by the read's
        own answer (``ObjectMissing``: S3's 404), not by asking again: every refresh
        probes for the next root version, and that object is missing nearly always."""
        if isinstance(exc, TransferTooSlow):
            return tuf_errors.SlowRetrievalError(str(exc))
        if isinstance(exc, TransientStoreError):
            return Unreachable(str(exc))
        if isinstance(exc, ObjectMissing):
            return tuf_errors.DownloadHTTPError(f"{self.store.uri}/{key} does not exist", 404)
        return tuf_errors.DownloadError(str(exc))


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    yield first
    yield from rest
