"""The device cache, one unit: a directory that is itself an ONNX Runtime model package.

Its modules, by concern: ``device_cache`` (``DeviceCache``, what the sync calls),
``layout`` (the names of its paths), ``state`` (its record of truth), ``space`` (disk
space and partial downloads), ``lock`` (one sync at a time), ``nofollow`` (paths reached
without following a link), ``package`` (the ORT package manifest), ``repair`` (the state
rebuilt from what the cache holds) and ``errors``. Code outside this package imports
from here.
"""

from epfleet.device.cache.device_cache import DeviceCache
from epfleet.device.cache.layout import (
    DISK_MARGIN,
    LOCK_FILE,
    MODEL_FILE,
    STATE_DIR,
    STATE_FILE,
    local_target_name,
)
from epfleet.device.cache.state import CacheState, Installed, InstalledFile, ModelState, Origin
from epfleet.errors import CacheBusy, CacheDamaged

__all__ = [
    "DISK_MARGIN",
    "LOCK_FILE",
    "MODEL_FILE",
    "STATE_DIR",
    "STATE_FILE",
    "CacheBusy",
    "CacheDamaged",
    "CacheState",
    "DeviceCache",
    "Installed",
    "InstalledFile",
    "ModelState",
    "Origin",
    "local_target_name",
]
