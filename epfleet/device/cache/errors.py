"""The errors a device cache raises of its own: busy, damaged (a full disk and a path that
cannot be written are ``epfleet.disk``'s)."""

from __future__ import annotations

from epfleet.errors import EpfleetError


class CacheBusy(EpfleetError):
    """Another sync holds the cache."""


class CacheDamaged(EpfleetError):
    """Something in the cache is in the way and epfleet will not remove it."""
